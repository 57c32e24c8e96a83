"""Divergence checks: a non-finite loss, metric or parameter, or a training loss grown past a
multiple of its starting value, stops a run with one line.

The line names where (round or clock tick), the quantity and its value, why it counts as
diverged, and what a rerun of the same command does: resume after the last checkpoint on disk
(the checks run before each checkpoint is written, so every checkpoint on disk holds what
passed them), or start afresh when no checkpoint exists yet.
"""
import math
from typing import Callable, Mapping, Optional

import jax
import jax.numpy as jnp

from fedjax_lama.errors import TrainingDiverged


@jax.jit
def _all_finite(tree) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def all_finite(tree) -> bool:
  """Whether every floating-point value of a pytree is finite: one jitted reduction, one
  scalar back to the host (cheap enough to run once per round)."""
  return bool(_all_finite(tree))


def first_non_finite(quantities: Mapping[str, Optional[float]]) -> Optional[str]:
  """The name of the first quantity that is a number and not finite (None values, e.g. a
  metric not measured at this point, are skipped)."""
  for name, value in quantities.items():
    if value is not None and not math.isfinite(float(value)):
      return name
  return None


def check(where: str, quantities: Mapping[str, Optional[float]], params,
          rerun: Callable[[], str], advice: str, error: type = TrainingDiverged) -> None:
  """Raises `error` (a TrainingDiverged) when a quantity or a parameter is not finite.

  where: "round 6" or "tick 3 (virtual time 30 s)".
  rerun: what a rerun does (`rerun_statement`); called only when the run diverged, so it
    may read the checkpoint directory.
  advice: which settings to change.
  """
  bad = first_non_finite(quantities)
  if bad is not None:
    what = f"{bad} is {float(quantities[bad])}"
  elif params is not None and not all_finite(params):
    what = "the model parameters hold non-finite values"
  else:
    return
  fail(where, what, rerun, advice, error)


def fail(where: str, what: str, rerun: Callable[[], str], advice: str,
         error: type = TrainingDiverged, why: str = "non-finite") -> None:
  """Raises `error` with the one-line message of `check` (`why`: what makes `what` a
  divergence)."""
  raise error(f"training diverged at {where}: {what} ({why}); {rerun()}; {advice}")


def grown_past(loss: Optional[float], start: Optional[float], limit: float) -> bool:
  """Whether `loss` exceeds `limit` times the starting loss `start` (limit 0: never; no
  starting loss yet: never). Both losses are means of non-negative per-example losses."""
  return bool(limit) and start is not None and loss is not None and loss > limit * start


def check_growth(where: str, loss: Optional[float], start: Optional[float], limit: float,
                 field: str, rerun: Callable[[], str], advice: str,
                 error: type = TrainingDiverged) -> None:
  """Raises `error` (the one line of `check`) when the training loss `loss` has grown past
  `limit` times `start`, the loss the run started at; `field` is the config field of `limit`,
  named with how to turn the check off."""
  if grown_past(loss, start, limit):
    fail(where, f"train_loss is {loss:.4g}", rerun, advice, error,
         why=f"above {field}={limit:g} times the starting train_loss {start:.4g}; "
             f"{field}=0 turns this check off")


def rerun_statement(last_checkpoint: Optional[str], directory: str) -> str:
  """What a rerun of the same command does, from the checkpoint actually on disk.

  last_checkpoint: e.g. "round 4" or "tick 2", or None when none is on disk yet.
  """
  if last_checkpoint is None:
    return (f"no checkpoint exists yet in {directory}, so a rerun starts from the beginning "
            "(and diverges again with the same settings)")
  return (f"a rerun resumes after {last_checkpoint}, the last checkpoint in {directory} "
          "(and diverges again with the same settings)")
