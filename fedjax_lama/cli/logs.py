"""Console output of the experiment commands (no JAX import, so --help stays fast)."""
import logging as std_logging
import sys

from absl import logging


def progress_only() -> None:
  """Progress lines from the "fedjax_lama" logger on stdout; orbax's absl chatter off."""
  logging.set_verbosity(logging.WARNING)
  logger = std_logging.getLogger("fedjax_lama")
  if not logger.handlers:
    handler = std_logging.StreamHandler(sys.stdout)
    handler.setFormatter(std_logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
  logger.setLevel(std_logging.INFO)
  logger.propagate = False
