"""Errors of the data layer.

Data files are untrusted input: every reader turns a malformed, truncated or unsafe
file into a `DataError` that names the file, so a run stops with a message the user
can act on instead of a numpy traceback.
"""
from fedjax_lama.errors import DataError  # pylint: disable=unused-import
