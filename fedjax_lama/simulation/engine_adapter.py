"""The JAX engine behind the host-side simulation: trainer, evaluator, model algebra.

The simulator (loop.py) injects its numerics through the protocols of interfaces.py; this module
implements them on the same engine and algorithm interface as the synchronous methods
(docs/design.md), for FedAT (Chai et al., SC'21) and its baselines (Chai et al., SC'21, Sec. 6):

- `EngineTrainer`: each batch of TrainJobs is ONE vectorised engine call
  (`engine.clients.ClientPhase` with `shared_per_client=True`): start models and proximal
  anchors are stacked on the client axis, the axis is padded to a bucket (a power of two
  times the device count for small calls, else a multiple of `call_size_multiple` and of
  the device count; `padded_size`) and sharded over the devices of the "clients" mesh that
  leave it unpadded on CPU (`call_mesh`, `sharding.call_devices`), and
  a jitted `lax.scan` runs E_max * S_max masked steps (batches from stream
  BATCH, job_packing.py). The local solver is an `Algorithm`: Adam(eta,
  0.9, 0.999, 1e-7), fresh per job, with the proximal pull of FedProx
  (`algorithms.fedprox.proximal`) whose coefficient is read per job from the client's row,
  so FedAT's lambda, FedProx's mu and FedAsync's rho share one compiled program.
- `LocalTestEvaluator`: the global model on every client's local 20 % test split (Chai et al.,
  SC'21, Sec. 6), departed clients included; per-client correct counts and the pooled loss.
- `JaxAlgebra`: jitted float32 weighted sums (FedAT's Eq. 5); one tree with weight exactly 1.0
  comes back unchanged, so FedAT with one tier stays bitwise FedAvg (one tier: FedAT is FedAvg).

The message codec is `message_codecs.PolylineCodec` (Chai et al., SC'21, Sec. 4.3) or `message_codecs.RawCodec`.
"""
import functools
import math
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_lama.algorithms.common import Common, local_optimizer
from fedjax_lama.algorithms.fedprox import proximal
from fedjax_lama.engine import evaluate as evaluation
from fedjax_lama.engine import local, sharding
from fedjax_lama.engine import plan as plan_lib
from fedjax_lama.engine import clients as clients_lib
from fedjax_lama.engine.algorithm import Algorithm, ClientContext, LocalOptimizer, corrected
from fedjax_lama.simulation import job_packing
from fedjax_lama.simulation.interfaces import PyTree, TrainJob, TrainResult

LOCAL_OPTIMIZERS = ("adam", "sgd")
# The local solver: Keras' Adam constants, since the paper used TensorFlow.
ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.999, 1e-7


def local_solver(kind: str = "adam", momentum: float = 0.0) -> optax.GradientTransformation:
  """The direction of a local step; the engine moves the parameters by -lr times it.

  "adam": optax.scale_by_adam(0.9, 0.999, 1e-7); "sgd": the registry's
  local SGD with momentum (`algorithms.common.local_optimizer`).
  """
  if kind == "adam":
    return optax.scale_by_adam(b1=ADAM_B1, b2=ADAM_B2, eps=ADAM_EPS)
  if kind == "sgd":
    return local_optimizer(Common(local_momentum=momentum)).tx
  raise ValueError(f"local_optimizer must be one of {list(LOCAL_OPTIMIZERS)}, got {kind!r}")


def per_job_proximal(grads: PyTree, params: PyTree, ctx: ClientContext) -> PyTree:
  """g + c (v - anchor) with c = the job's prox coefficient (its row), anchor = its download."""
  return proximal(ctx.row["prox_coeff"])(grads, params, ctx)


def job_algorithm(local_tx: optax.GradientTransformation) -> Algorithm:
  """Local training of a simulated job as an engine Algorithm (only the local rule is used:
  the simulation's methods aggregate on the host, methods/)."""
  # No linear rule, so no effective step: the methods never divide by one.
  return Algorithm(local=LocalOptimizer(corrected(per_job_proximal, local_tx)))


def stack_trees(trees: Sequence[PyTree]) -> PyTree:
  """numpy leaves [len(trees), ...] (host arrays; one transfer per leaf when placed)."""
  return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *trees)


class EngineTrainer:
  """`interfaces.Trainer` on the engine: one vectorised call per batch of jobs.

  Args:
    model: the flax module (no BatchNorm statistics: models travel as params only).
    train_x, train_y: the training arrays (device-resident, replicated).
    client_train: per client, its rows of the training arrays (n_k = their number).
    seed: the run's root seed (stream BATCH and LOCAL_RNG keys).
    batch_size: B.
    max_epochs: E of the run (the static epoch axis; FedProx's jobs run 1..E).
    lr: the local learning rate eta (constant).
    local_tx: the local solver (`local_solver`).
    mesh: the "clients" mesh (default: every device); each call runs on the part of it
      that `call_mesh` picks.
    call_size_multiple: the client axis is padded to a multiple of this (and of the
      device count), or to a smaller power of two times the device count (`padded_size`),
      so a run compiles once per bucket, not once per call size.
    augment, unroll, label_smoothing: as for the synchronous programs.
    plan: the run's platform plan (`engine.plan`; None: the default backend's).

  Counters (host totals, restored on resume): `loss_sum`, `example_count` (training
  loss over every real example of every trained job), `local_steps`, `num_calls`;
  `call_sizes` records the padded size of every call.
  """

  def __init__(self, model, train_x, train_y, client_train: Sequence[np.ndarray], *,
               seed: int, batch_size: int, max_epochs: int, lr: float,
               local_tx: Optional[optax.GradientTransformation] = None, mesh=None,
               call_size_multiple: int = 1, augment: Optional[Callable] = None,
               unroll: int = 1, label_smoothing: float = 0.0,
               plan: Optional[plan_lib.PlatformPlan] = None):
    self.mesh = mesh if mesh is not None else sharding.client_mesh()
    self.plan = plan if plan is not None else plan_lib.plan()
    self.seed, self.batch_size, self.max_epochs = int(seed), int(batch_size), int(max_epochs)
    self.call_size_multiple = int(call_size_multiple)
    self.client_sizes = np.array([len(ix) for ix in client_train], np.int32)
    self.algorithm = job_algorithm(local_tx if local_tx is not None else local_solver())
    loss_fn = local.make_loss_fn(model, False, label_smoothing)
    # One phase per call mesh: the scan map's group width follows the devices of the call.
    self._phase = functools.cache(lambda devices: clients_lib.ClientPhase(
        loss_fn, self.algorithm, lambda step: lr, unroll=unroll, augment=augment,
        shared_per_client=True, client_devices=devices, plan=self.plan))
    # The tables every call reads: row_table, sizes_table, data_x, data_y.
    self._tables = sharding.replicate(
        (job_packing.client_row_table(client_train), self.client_sizes, np.asarray(train_x),
         np.asarray(train_y, np.int32)), self.mesh)
    # The same buffers, on the devices of a call's mesh (`call_mesh`).
    self._tables_on = functools.cache(lambda mesh: sharding.narrow(self._tables, mesh))
    self._call = local.jit_training(self._train_call, plan=self.plan, static_argnums=0)
    self.loss_sum, self.example_count, self.local_steps, self.num_calls = 0.0, 0.0, 0, 0
    self.call_sizes: list[int] = []

  # ---- the jitted call ------------------------------------------------------------------
  def _train_call(self, devices, start, anchor, prox, client_ids, job_indices, job_epochs,
                  job_mask, row_table, sizes_table, data_x, data_y):
    cohort = job_packing.pack_jobs(row_table, sizes_table, self.seed, client_ids, job_indices,
                                   job_epochs, job_mask, batch_size=self.batch_size,
                                   max_epochs=self.max_epochs)
    ctx = ClientContext({"params": anchor}, {"prox_coeff": prox}, cohort.num_examples,
                        cohort.client_ids)
    num = client_ids.shape[0]
    state = clients_lib.fresh_states(self.algorithm, ctx, {}, num, shared_per_client=True)
    state = state._replace(params=start)
    keys = jax.vmap(lambda k, j: job_packing.stream_key(
        self.seed, job_packing.LOCAL_RNG_STREAM, k, j))(client_ids, job_indices)
    final, stats = self._phase(devices).train(state, ctx, data_x, data_y, cohort, keys, 0)
    return final.params, stats

  def padded_size(self, num_jobs: int, mesh=None) -> int:
    """The bucket of a call of `num_jobs` jobs on `mesh` (default: the trainer's): the
    device count times a power of two while that is smaller than the next multiple of
    `call_size_multiple` and of the device count, else that multiple.

    Asynchronous methods (FedAsync, ASO-Fed) train one or a few jobs per call; padding each
    of them to `call_size_multiple` clients made every update cost that many clients'
    training. Powers of two add at most log2(call_size_multiple) compiled shapes.
    """
    mesh = mesh if mesh is not None else self.mesh
    multiple = sharding.padded_size(num_jobs, mesh, self.call_size_multiple)
    power = mesh.size
    while power < num_jobs:
      power *= 2
    return min(multiple, power)

  def call_mesh(self, num_jobs: int):
    """The devices a call of `num_jobs` jobs runs on (`sharding.call_devices`: on CPU no
    more than leave its bucket as small as on one device per process)."""
    return sharding.call_devices(self.mesh, lambda mesh: self.padded_size(num_jobs, mesh))

  # ---- interfaces.Trainer -----------------------------------------------------------------
  def train(self, jobs: Sequence[TrainJob]) -> list[TrainResult]:
    jobs = list(jobs)
    if any(j.num_epochs > self.max_epochs for j in jobs):
      raise ValueError(f"a job asks for more than the run's {self.max_epochs} local epochs")
    mesh = self.call_mesh(len(jobs))
    num, size = len(jobs), self.padded_size(len(jobs), mesh)
    pad = size - num
    starts = [j.start_model for j in jobs] + [jobs[0].start_model] * pad
    start = stack_trees(starts)
    if all(j.anchor is j.start_model for j in jobs):
      anchor = start
    else:
      anchor = stack_trees([j.anchor for j in jobs] + [jobs[0].anchor] * pad)
    column = lambda values, dtype: np.asarray(list(values) + [0] * pad, dtype)
    per_job = (start, anchor,
               column((j.prox_coeff for j in jobs), np.float32),
               column((j.client_id for j in jobs), np.int32),
               column((j.index for j in jobs), np.int32),
               column((j.num_epochs for j in jobs), np.int32),
               column([1.0] * num, np.float32))
    per_job = sharding.shard_clients(per_job, mesh)
    params, stats = self._call(mesh.size, *per_job, *self._tables_on(mesh))
    params, stats = jax.device_get((params, stats))
    steps = np.rint(np.asarray(stats.steps, np.float64)).astype(np.int64)
    self.loss_sum += float(np.sum(np.asarray(stats.loss_sum, np.float64)[:num]))
    self.example_count += float(np.sum(np.asarray(stats.count, np.float64)[:num]))
    self.local_steps += int(steps[:num].sum())
    self.num_calls += 1
    self.call_sizes.append(size)
    return [TrainResult(jax.tree.map(lambda a, i=i: np.array(a[i]), params),
                        int(steps[i])) for i in range(num)]

  # ---- resume ---------------------------------------------------------------------------
  def state_dict(self) -> dict:
    return {"loss_sum": self.loss_sum, "example_count": self.example_count,
            "local_steps": self.local_steps, "num_calls": self.num_calls}

  def load_state_dict(self, state: dict) -> None:
    self.loss_sum = float(state["loss_sum"])
    self.example_count = float(state["example_count"])
    self.local_steps = int(state["local_steps"])
    self.num_calls = int(state["num_calls"])


class LocalTestEvaluator:
  """`interfaces.Evaluator`: a model on every client's local test split (Chai et al., SC'21,
  metrics).

  Args:
    model: the flax module.
    x, y: the arrays the split indexes (the training arrays for the local 80/20 split).
    client_test: per client, its test rows of x / y (all K clients, departed ones too).
    batch_size: evaluation batch (the last one is padded and masked: one compiled shape).

  `last_loss` is the pooled mean test loss of the latest call.
  """

  def __init__(self, model, x, y, client_test: Sequence[np.ndarray], batch_size: int = 1000):
    rows = [np.asarray(ix, np.int64) for ix in client_test]
    all_rows = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    self.owner = np.repeat(np.arange(len(rows)), [len(ix) for ix in rows])
    self.counts = np.array([len(ix) for ix in rows], np.int64)
    self.x, self.y = np.asarray(x)[all_rows], np.asarray(y)[all_rows]
    self.batch_size = int(batch_size)
    self.eval_fn = evaluation.make_eval_fn(model, False)
    self.last_loss = math.nan

  def evaluate(self, model: PyTree) -> tuple[np.ndarray, np.ndarray]:
    res = evaluation.evaluate(self.eval_fn, model, {}, self.x, self.y, self.batch_size)
    self.last_loss = float(res.loss)
    correct = np.bincount(self.owner, weights=res.correct.astype(np.float64),
                          minlength=len(self.counts))
    return np.rint(correct).astype(np.int64), self.counts.copy()


def _weighted_sum(trees: tuple, weights: jax.Array) -> PyTree:
  """sum_i w_i t_i leaf by leaf, left to right, in each leaf's dtype."""

  def combine(*leaves):
    acc = leaves[0] * weights[0].astype(leaves[0].dtype)
    for i, leaf in enumerate(leaves[1:], 1):
      acc = acc + leaf * weights[i].astype(leaf.dtype)
    return acc

  return jax.tree.map(combine, *trees)


class JaxAlgebra:
  """`interfaces.ModelAlgebra`: jitted float32 weighted sums of models (Chai et al., SC'21, Eq. 5,
  and the baselines).

  Weights (float64 on the host, exact for Eq. 5) are cast to the leaves' dtype. A single tree with
  weight exactly 1.0 is returned as it is (one tier: FedAT is FedAvg). One compilation per number of
  trees.
  """

  def __init__(self):
    self._sum = jax.jit(_weighted_sum)

  def weighted_sum(self, trees: Sequence[PyTree], weights: Sequence[float]) -> PyTree:
    trees, weights = list(trees), [float(w) for w in weights]
    if not trees or len(trees) != len(weights):
      raise ValueError(f"weighted_sum needs as many weights as trees (>= 1), got "
                       f"{len(trees)} trees and {len(weights)} weights")
    if len(trees) == 1 and weights[0] == 1.0:
      return trees[0]
    return self._sum(tuple(trees), jnp.asarray(weights, jnp.float32))
