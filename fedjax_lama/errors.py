"""Errors that name what the user must change, and the checks that raise them."""
from typing import Any


class ConfigError(ValueError):
  """A config field holds a value that is not accepted."""


class HparamError(ValueError):
  """A hyper-parameter value that is not accepted; the registry names the config field."""

  def __init__(self, field: str, value: Any, accepted: str):
    super().__init__(f"{field}={value!r} is not accepted; accepted: {accepted}")
    self.field, self.value, self.accepted = field, value, accepted


def require(ok: bool, field: str, value: Any, accepted: str) -> None:
  if not ok:
    raise HparamError(field, value, accepted)


def require_one_of(field: str, value: Any, choices) -> None:
  require(value in choices, field, value, ", ".join(repr(c) for c in choices))


def require_nonnegative(field: str, value: Any) -> None:
  require(isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0,
          field, value, "a number >= 0")


class TrainingDiverged(RuntimeError):
  """A training loss, an evaluation metric or a parameter became non-finite.

  The message names the round (or clock tick), the quantity, and the round a rerun of the
  same command resumes from: the last checkpoint on disk, or none yet. A user's settings
  cause it (a learning rate too large), so the command line prints it as one line.
  """
