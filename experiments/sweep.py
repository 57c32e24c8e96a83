"""Sweeps shared by the result scripts: resumable runs, tuning on validation, tables.

Every run has its own workdir; a finished run (summary.json present for the same config) is
reused and an interrupted one resumes, so a killed sweep continues where it stopped.
Learning rates are picked on the validation split held out of the training data
(config.validation_fraction; the val_* metrics), never on the test set.
"""
import dataclasses
import json
import os
import platform
import time
from typing import Callable, Optional, Sequence

import numpy as np

from fedjax_lama import training
from fedjax_lama.config import ConfigError


def _load(workdir: str) -> dict:
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    summary["records"] = [json.loads(line) for line in f if line.strip()]
  return summary


# A run whose loss became non-finite is finished, not interrupted: its error is recorded here
# so that a rerun of the sweep reuses it instead of diverging again from the last checkpoint.
DIVERGED = "diverged.json"


def _recorded_divergence(config, workdir: str) -> Optional[training.DivergenceError]:
  path = os.path.join(workdir, DIVERGED)
  if not os.path.exists(path):
    return None
  training.check_workdir(workdir, config)  # the record belongs to this config
  try:
    with open(path) as f:
      message = str(json.load(f)["error"])
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ConfigError(
        f"{path} is not a divergence record ({e!r}); delete it to train the run again") from e
  return training.DivergenceError(f"{message} [recorded in {path}; delete it to train again]")


def _record_divergence(workdir: str, error: training.DivergenceError) -> None:
  with open(os.path.join(workdir, DIVERGED), "w") as f:
    json.dump({"error": str(error)}, f)


def _finished(workdir: str, rounds: Optional[int] = None) -> bool:
  """Whether the run in `workdir` finished (its summary.json exists) and, when `rounds` is
  given, ran at least that many rounds (a shorter finished run is extended, not reused)."""
  path = os.path.join(workdir, "summary.json")
  if not os.path.exists(path):
    return False
  if rounds is None:
    return True
  with open(path) as f:
    return int(json.load(f).get("rounds", 0)) >= rounds


def run(config, workdir: str) -> dict:
  """The summary of `config` in `workdir` (trains, resumes or reuses) and its records; a
  diverged run raises its DivergenceError, now and on every rerun."""
  outcome = run_group([config], [workdir])[0]
  if isinstance(outcome, training.DivergenceError):
    raise outcome
  return outcome


def run_group(configs, workdirs, extend: bool = False) -> list:
  """Like `run` for several runs; those still to train go through training.train_many, which
  trains runs differing only in seed and learning rate as one vectorized computation. A
  diverged run comes back as its DivergenceError (recorded, so a rerun does not retrain it).
  extend=True: a finished run of fewer rounds than its config's is extended to them (the
  engine resumes it exactly) instead of being reused as it is."""
  outcome, todo = {}, []
  for i, (c, w) in enumerate(zip(configs, workdirs)):
    if not _finished(w, c.rounds if extend else None):
      recorded = _recorded_divergence(c, w)
      if recorded is None:
        todo.append(i)
      else:
        outcome[i] = recorded
  if todo:
    done = training.train_many([configs[i] for i in todo], [workdirs[i] for i in todo])
    for i, r in zip(todo, done):
      if isinstance(r, training.DivergenceError):
        _record_divergence(workdirs[i], r)
        outcome[i] = r
  return [outcome[i] if i in outcome else _load(w) for i, w in enumerate(workdirs)]


def validation_score(summary: dict, last: int = 3) -> float:
  """Mean validation accuracy of the last `last` evaluations (less noisy than the final one)."""
  vals = [r["val_accuracy"] for r in summary["records"] if "val_accuracy" in r]
  if not vals:
    raise ValueError("the run has no val_accuracy: set config.validation_fraction > 0 to tune")
  return float(np.mean(vals[-last:]))


@dataclasses.dataclass
class Tuned:
  value: float                 # the chosen value
  scores: dict                 # value -> validation score (the tuning seed)


def tune(make_config: Callable[[float, int], object], values: Sequence[float], seed: int,
         workdir: Callable[[float, int], str]) -> Tuned:
  """The value (e.g. a learning rate) with the best validation score for `seed`.

  The values' runs train together when they can (run_group); a diverged run (non-finite
  loss) scores -inf instead of stopping the sweep.
  """
  results = run_group([make_config(v, seed) for v in values], [workdir(v, seed) for v in values])
  scores = {v: float("-inf") if isinstance(r, training.TrainingError) else validation_score(r)
            for v, r in zip(values, results)}
  best = max(scores, key=lambda v: scores[v])
  return Tuned(best, scores)


def tune_widening(make_config: Callable[[float, int], object], values: Sequence[float],
                  seed: int, workdir: Callable[[float, int], str],
                  grid: Sequence[float]) -> Tuned:
  """`tune` over `values`, widened one point of `grid` at a time while the pick sits at an
  edge of what has been tried and `grid` goes further that way: a pick at the edge of a small
  grid says the best value may lie beyond it. Runs already tried are reused, not retrained.
  With `grid` = `values` it is `tune` itself."""
  grid = sorted(grid)
  outside = [v for v in values if v not in grid]
  if outside:
    raise ValueError(f"tuning values {outside} are not points of the grid {grid} they widen in")
  tried = list(values)
  while True:
    result = tune(make_config, tried, seed, workdir)
    i = grid.index(result.value)
    if result.value == min(tried) and i > 0:
      tried.insert(0, grid[i - 1])
    elif result.value == max(tried) and i + 1 < len(grid):
      tried.append(grid[i + 1])
    else:
      return result


def mean_std(values) -> str:
  values = np.asarray([v for v in values if v is not None], float)
  if not len(values):
    return "n/a"
  return f"{values.mean():.4f} ± {values.std():.4f}"


def machine() -> str:
  import jax  # pylint: disable=g-import-not-at-top
  return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"jax {jax.__version__} on {jax.default_backend()}")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def plot_curves(path: str, curves: dict, xkey: str = "local_steps", ykey: str = "test_accuracy",
                xlabel: str = "local steps", title: str = "") -> None:
  """One line per label: the mean over seeds of ykey against xkey."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
  for label, runs in curves.items():
    xs = [r[xkey] for r in runs[0]]
    ys = np.mean([[r[ykey] for r in records] for records in runs], axis=0)
    ax.plot(xs, ys, label=label)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ykey.replace("_", " "))
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


class Timer:
  def __enter__(self):
    self.start = time.perf_counter()
    return self

  def __exit__(self, *exc):
    self.seconds = time.perf_counter() - self.start


def configured(base, overrides: Optional[dict] = None, **fields):
  """A copy of `base` with dotted overrides applied ("fedadam.tau": 1e-3, "local_lr": 0.1)."""
  c = base.copy_and_resolve_references()
  c.update_from_flattened_dict({**(overrides or {}), **fields})
  return c
