"""Console output of the experiment commands (no JAX import, so --help stays fast)."""
from absl import logging

from fedjax_lama import progress


def progress_only() -> None:
  """Progress lines of the library (fedjax_lama.progress) on stdout; orbax's absl chatter off."""
  logging.set_verbosity(logging.WARNING)
  progress.use_console()
