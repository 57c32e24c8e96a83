"""Errors a user causes, and the checks that raise them.

Every error here names what the user must change (a config field, a file, a path, an
argument). The command line prints any `FedjaxLamaError` as one "error: ..." line and
exits with status 2; anything else is a bug and keeps its traceback.
"""
import difflib
from typing import Any, Iterable


class FedjaxLamaError(Exception):
  """Base of every error the user can fix by changing their input."""


class ConfigError(FedjaxLamaError, ValueError):
  """A config field holds a value that is not accepted."""


class HparamError(FedjaxLamaError, ValueError):
  """A hyper-parameter value that is not accepted; the registry names the config field."""

  def __init__(self, field: str, value: Any, accepted: str):
    super().__init__(f"{field}={value!r} is not accepted; accepted: {accepted}")
    self.field, self.value, self.accepted = field, value, accepted


class DataError(FedjaxLamaError, ValueError):
  """A dataset file is missing, malformed, truncated or unsafe to load."""


class WorkdirError(FedjaxLamaError, OSError):
  """The workdir cannot hold the run: not a directory, empty, unwritable or full."""


class TrainingError(FedjaxLamaError, RuntimeError):
  """Training cannot continue (a workdir whose records or checkpoints cannot be trusted,
  a non-finite quantity)."""


class CheckpointError(TrainingError):
  """A checkpoint's bytes differ from those written, or it cannot be read back."""


def closest(name: str, accepted: Iterable[str], n: int = 3,
            where: str = "fedjax_lama.config.base_config()") -> str:
  """"closest accepted: a, b" for an unknown `name` (difflib), or every accepted name."""
  accepted = sorted(set(accepted))
  near = difflib.get_close_matches(name, accepted, n=n, cutoff=0.6)
  if near:
    return "closest accepted: " + ", ".join(near)
  if len(accepted) > 12:
    return f"no accepted name is close (there are {len(accepted)}; {where} lists them)"
  return "accepted: " + (", ".join(accepted) or "none")


def require(ok: bool, field: str, value: Any, accepted: str) -> None:
  if not ok:
    raise HparamError(field, value, accepted)


def require_one_of(field: str, value: Any, choices) -> None:
  require(value in choices, field, value, ", ".join(repr(c) for c in choices))


def require_nonnegative(field: str, value: Any) -> None:
  require(isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0,
          field, value, "a number >= 0")


class TrainingDiverged(TrainingError):
  """A training loss, an evaluation metric or a parameter became non-finite.

  The message names the round (or clock tick), the quantity, and the round a rerun of the
  same command resumes from: the last checkpoint on disk, or none yet. A user's settings
  cause it (a learning rate too large), so the command line prints it as one line.
  """
