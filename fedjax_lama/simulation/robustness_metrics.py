"""Robustness metrics of the FedAT paper (Chai et al., SC'21, Def. 3.1 and Sec. 7).

Per evaluation tick: pooled global accuracy, per-client accuracy, its mean and
population variance (ddof = 0: the K clients are the whole population), over
all K clients, departed ones included. Per run: best accuracy, mean variance
(also at the best tick and over the last 25 % of ticks), virtual time and bytes
(up, down, total) to a target accuracy, raw and smoothed by a trailing mean of
the last 5 ticks, and the improvement ratios of Table 1.
"""
import math
from typing import Mapping, Optional, Sequence

import numpy as np

MB = 1e6  # the paper's MB, read as 10^6 bytes
SMOOTHING_TICKS = 5


def accuracy_stats(correct: np.ndarray, count: np.ndarray) -> dict:
  """Accuracies of one evaluation.

  Clients without test examples (none in the paper's setup) have accuracy NaN
  and are left out of the mean and variance.

  Returns:
    dict with `accuracy` (pooled), `client_accuracy` (float64 [K]),
    `client_accuracy_mean` and `client_accuracy_var` (population variance).
  """
  correct = np.asarray(correct, np.int64)
  count = np.asarray(count, np.int64)
  if correct.shape != count.shape or correct.ndim != 1:
    raise ValueError(f"evaluate() must return two arrays of shape [K], got {correct.shape} "
                     f"and {count.shape}")
  total = int(count.sum())
  per_client = np.full(count.shape, np.nan)
  has_tests = count > 0
  per_client[has_tests] = correct[has_tests] / count[has_tests]
  valid = per_client[has_tests]
  return {
      "accuracy": int(correct.sum()) / total if total else math.nan,
      "client_accuracy": per_client,
      "client_accuracy_mean": float(valid.mean()) if valid.size else math.nan,
      "client_accuracy_var": float(valid.var()) if valid.size else math.nan,
  }


def trailing_mean(values: Sequence[float], window: int = SMOOTHING_TICKS) -> np.ndarray:
  """Mean of the last `window` values up to each position (fewer at the start)."""
  values = np.asarray(values, np.float64)
  csum = np.concatenate([[0.0], np.cumsum(values)])
  idx = np.arange(1, len(values) + 1)
  lo = np.maximum(idx - window, 0)
  return (csum[idx] - csum[lo]) / (idx - lo)


def _first_at_least(values: np.ndarray, target: float) -> Optional[int]:
  hits = np.flatnonzero(values >= target)
  return int(hits[0]) if hits.size else None


def summarize(ticks: Sequence[Mapping], target: Optional[float] = None) -> dict:
  """Per-run measures (FedAT Sec. 7) from the tick records of a run.

  Args:
    ticks: the run's tick records (Simulator.ticks), in time order.
    target: target accuracy, or None for no time/bytes-to-target measures.

  Returns:
    A flat dict of numbers (None where a target is not reached).
  """
  if not ticks:
    raise ValueError("summarize needs at least one tick record")
  times = np.asarray([t["virtual_time"] for t in ticks], np.float64)
  acc = np.asarray([t["accuracy"] for t in ticks], np.float64)
  var = np.asarray([t["client_accuracy_var"] for t in ticks], np.float64)
  up = np.asarray([t["bytes_up"] for t in ticks], np.int64)
  down = np.asarray([t["bytes_down"] for t in ticks], np.int64)
  best = int(np.argmax(acc))
  quarter = max(1, math.ceil(len(ticks) / 4))
  out = {
      "num_ticks": len(ticks),
      "best_accuracy": float(acc[best]),
      "best_accuracy_time": float(times[best]),
      "mean_variance": float(var.mean()),
      "variance_at_best": float(var[best]),
      "variance_last_quarter": float(var[-quarter:].mean()),
      "final_virtual_time": float(times[-1]),
      "final_bytes_up": int(up[-1]),
      "final_bytes_down": int(down[-1]),
  }
  if target is not None:
    out["target"] = float(target)
    for suffix, curve in (("", acc), ("_smoothed", trailing_mean(acc))):
      hit = _first_at_least(curve, target)
      out[f"time_to_target{suffix}"] = None if hit is None else float(times[hit])
      for name, value in (("", None if hit is None else int(up[hit] + down[hit])),
                          ("_up", None if hit is None else int(up[hit])),
                          ("_down", None if hit is None else int(down[hit]))):
        out[f"bytes_to_target{suffix}{name}"] = value
        out[f"mb_to_target{suffix}{name}"] = None if value is None else value / MB
  return out


def improvement(acc_fedat: float, acc_baseline: float) -> float:
  """impr = (acc_FedAT - acc_baseline) / acc_FedAT (FedAT Table 1's impr. rows)."""
  return (acc_fedat - acc_baseline) / acc_fedat


def improvements(acc_fedat: float, baselines: Mapping[str, float]) -> dict:
  """impr.(a) against the best baseline and impr.(b) against the worst."""
  best = max(baselines, key=lambda name: (baselines[name], name))
  worst = min(baselines, key=lambda name: (baselines[name], name))
  return {"best_baseline": best, "impr_a": improvement(acc_fedat, baselines[best]),
          "worst_baseline": worst, "impr_b": improvement(acc_fedat, baselines[worst])}


def ratio(value: Optional[float], reference: Optional[float]) -> Optional[float]:
  """value / reference (Norm. Var., time-to-target ratios); None if either is missing."""
  if value is None or reference is None or reference == 0:
    return None
  return value / reference
