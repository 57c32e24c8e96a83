"""Errors of the data layer.

Data files are untrusted input (architecture.md section 3): every reader turns a
malformed, truncated or unsafe file into a `DataError` that names the file, so a
run stops with a message the user can act on instead of a numpy traceback.
"""


class DataError(ValueError):
  """A dataset file is missing, malformed, truncated or unsafe to load."""
