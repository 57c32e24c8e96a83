"""Deterministic numpy stand-ins for the injected dependencies (tests, dry runs).

They follow the protocols of interfaces.py exactly, so a run with them has the
same timeline as a run with the JAX engine whenever message sizes do not feed
transfer times (network "none"): useful to check schedules, drop-outs
and byte counts of a configuration (Chai et al., SC'21, Sec. 6) without training.
"""
from typing import Optional, Sequence

import jax
import numpy as np

from fedjax_lama.simulation.message_codecs import raw_num_bytes, shape_metadata_bytes
from fedjax_lama.simulation.interfaces import PyTree, TrainJob, TrainResult
from fedjax_lama.simulation.latency import job_steps
from fedjax_lama.simulation.loop import Simulator
from fedjax_lama.tree import tree_size


class ShiftTrainer:
  """Moves every parameter by an amount that depends on the job only.

  v = start + 0.01 (k + 1) + 0.001 j + 0.0001 E - 0.01 prox, computed in the
  leaf's dtype; `scale = 0` gives an identity update. Records the size of every
  call and the (k, j) of every job it trains, in order.
  """

  def __init__(self, num_examples: Sequence[int], batch_size: int, scale: float = 1.0):
    self.num_examples = np.asarray(num_examples)
    self.batch_size = int(batch_size)
    self.scale = float(scale)
    self.call_sizes: list[int] = []
    self.trained: list[tuple[int, int]] = []

  def shift(self, job: TrainJob) -> float:
    return self.scale * (0.01 * (job.client_id + 1) + 0.001 * job.index + 0.0001 * job.num_epochs
                         - 0.01 * job.prox_coeff)

  def train(self, jobs: Sequence[TrainJob]) -> list[TrainResult]:
    self.call_sizes.append(len(jobs))
    results = []
    for job in jobs:
      self.trained.append((job.client_id, job.index))
      shift = self.shift(job)
      model = jax.tree.map(lambda x: (np.asarray(x) + np.asarray(shift, np.asarray(x).dtype)),
                       job.start_model)
      steps = job_steps(self.num_examples[job.client_id], self.batch_size, job.num_epochs)
      results.append(TrainResult(model, steps))
    return results


class SineEvaluator:
  """Per-client accuracies that depend smoothly on the model's parameter sum.

  P_k = (sin(s (k + 1)) + 1) / 2 with s the sum of all parameters, rounded down
  to whole test examples.
  """

  def __init__(self, test_counts: Sequence[int]):
    self.test_counts = np.asarray(test_counts, np.int64)
    self.calls = 0

  def evaluate(self, model: PyTree) -> tuple[np.ndarray, np.ndarray]:
    self.calls += 1
    total = float(sum(np.sum(np.asarray(leaf, np.float64)) for leaf in jax.tree.leaves(model)))
    frac = (np.sin(total * (np.arange(len(self.test_counts)) + 1)) + 1.0) / 2.0
    return np.floor(frac * self.test_counts).astype(np.int64), self.test_counts.copy()


class RoundingCodec:
  """A stand-in for the polyline codec: rounds to `precision` decimals.

  Decoded values are round(x 10^p) / 10^p (numpy's round-half-even, unlike
  polyline); the size is 2 bytes per parameter plus the polyline shape
  metadata, or 4 bytes per parameter raw (precision None).
  """

  def roundtrip(self, tree: PyTree, precision: Optional[int]) -> tuple[PyTree, int]:
    if precision is None:
      return tree, raw_num_bytes(tree)
    scale = 10.0 ** precision

    def one_leaf(x):
      x = np.asarray(x)
      return (np.round(x.astype(np.float64) * scale) / scale).astype(x.dtype)

    num_values = tree_size(tree)
    return jax.tree.map(one_leaf, tree), 2 * num_values + shape_metadata_bytes(tree)


def small_model() -> dict:
  """A 6-parameter float32 model (24 bytes raw)."""
  return {"b": np.zeros(2, np.float32), "w": np.arange(4, dtype=np.float32) * np.float32(0.1)}


def make_simulator(config, method, *, num_examples: Optional[Sequence[int]] = None,
                   test_counts: Optional[Sequence[int]] = None, initial_model=None,
                   trainer=None, evaluator=None, codec=None, algebra=None):
  """A Simulator with the stand-ins above (n_k = 400 and 100 test examples by default)."""
  num_clients = config.num_clients
  num_examples = np.full(num_clients, 400) if num_examples is None else np.asarray(num_examples)
  test_counts = np.full(num_clients, 100) if test_counts is None else np.asarray(test_counts)
  return Simulator(
      config, method, num_examples=num_examples,
      initial_model=small_model() if initial_model is None else initial_model,
      trainer=trainer if trainer is not None else ShiftTrainer(num_examples, config.batch_size),
      evaluator=evaluator if evaluator is not None else SineEvaluator(test_counts),
      codec=codec, algebra=algebra)
