"""Progress lines of a run: one logger, one format, every phase.

Every phase of a run says when it starts (loading data, partitioning, compiling, training,
evaluating, writing the summary and plots), so a user never waits on a silent terminal.
The lines go through the standard "fedjax_lama" logger, which absl's logging shares
(`use_console` attaches a handler for command-line use); the library logs nothing else.
"""
import logging
import sys
import time
from typing import Optional

LOGGER_NAME = "fedjax_lama"
logger = logging.getLogger(LOGGER_NAME)


def use_console(stream=None) -> None:
  """Progress lines on `stream` (default stdout) with a time stamp, once per process."""
  if not any(getattr(h, "_fedjax_lama_console", False) for h in logger.handlers):
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    handler._fedjax_lama_console = True  # pylint: disable=protected-access
    logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  logger.propagate = False


def info(message: str, *args) -> None:
  logger.info(message, *args)


def warning(message: str, *args) -> None:
  logger.warning(message, *args)


class Phase:
  """Logs "<what> ..." on entry and "<what>: done in <s>s" on exit.

  with progress.Phase("loading data (mnist from data/)"):
    ...
  """

  def __init__(self, what: str):
    self.what = what

  def __enter__(self):
    info("%s ...", self.what)
    self.start = time.perf_counter()
    return self

  def __exit__(self, exc_type, exc, tb):
    if exc_type is None:
      info("%s: done in %.1fs", self.what, time.perf_counter() - self.start)
    return False


def eta_seconds(elapsed: float, done: int, remaining: int,
                eval_seconds: Optional[float] = None, remaining_evals: int = 0) -> float:
  """Time left: the mean time per unit of work so far times the units left, plus the
  evaluations still to come at the last evaluation's measured cost (the final evaluation
  with per-client accuracy can cost more than the rounds before it)."""
  per_unit = elapsed / done if done > 0 else 0.0
  return per_unit * remaining + (eval_seconds or 0.0) * remaining_evals
