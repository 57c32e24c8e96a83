"""What every round program shares: typed run options, packing, the learning rate, outputs.

A round program owns the jitted functions of one algorithm and exposes the small
interface the training loop drives:

    num_rounds, eval_every, init_state(), run_round(state, r) -> (state, RoundOutput),
    eval_params(state), local_steps_done(r), host_state(), load_host_state(d),
    summary(state, ledger), plot(workdir, ledger)

Programs take typed options (`RunOptions`), never a config: the training entry point
builds them.
"""
import dataclasses
from typing import Callable, NamedTuple, Optional

import jax
import numpy as np
import optax

from fedjax_lama import checkpointing, compression, errors
from fedjax_lama import data as fdata
from fedjax_lama import federation
from fedjax_lama.algorithms.common import ONE_STEP_KINDS
from fedjax_lama.engine import aggregation, client_store, evaluate, local, sharding
from fedjax_lama.engine import plan as plan_lib
from fedjax_lama.engine import stages
from fedjax_lama.engine import cohort as cohort_lib
from fedjax_lama.engine import traffic as traffic_lib
from fedjax_lama.engine.algorithm import report_model
from fedjax_lama.models import lora


class RoundOutput(NamedTuple):
  train_loss: float                # mean over the round's real examples
  train_count: float               # number of real examples trained on
  floats_up_per_layer: np.ndarray  # this round, summed over clients (params-shaped traffic)
  floats_down_per_layer: np.ndarray
  bytes: Optional[int]             # None: bits_up / 8 + 4 bytes per float down
  extra: dict                      # algorithm-specific metrics for metrics.jsonl
  bits_up: Optional[int] = None    # None: 32 bits per float up (no compressor)
  floats_up_other: int = 0         # traffic that is not params-shaped (FedNova's scalar)
  floats_down_other: int = 0


@dataclasses.dataclass(frozen=True)
class LearningRate:
  """The local learning rate as a function of the global local-step count.

  lr: the rate after warm-up; decay: how it decays over the run (config.local_lr_decay).
  """
  lr: float
  decay: str = "constant"           # constant | cosine | step | exponential
  warmup_steps: int = 0
  decay_steps: tuple = ()           # "step": boundaries in local steps
  decay_factor: float = 0.1         # "step": per boundary; "exponential": per ROUND

  def build(self, total_steps: int, steps_per_round: int) -> Callable:
    """steps_per_round: the static step axis of one round (a sub-round under FedLAMA), so
    that "exponential" decays once per round also in epoch mode (FL-Simulator's 0.998).
    Returns an optax schedule: step -> rate."""
    if self.decay == "constant":
      schedule = optax.constant_schedule(self.lr)
    elif self.decay == "cosine":
      schedule = optax.cosine_decay_schedule(self.lr, max(1, total_steps))
    elif self.decay == "step":
      schedule = optax.piecewise_constant_schedule(
          self.lr, {int(b): float(self.decay_factor) for b in self.decay_steps})
    else:
      schedule = optax.exponential_decay(self.lr, max(1, steps_per_round), self.decay_factor,
                                         staircase=True)
    if self.warmup_steps:
      warm = optax.linear_schedule(0.0, self.lr, self.warmup_steps)
      schedule = optax.join_schedules([warm, schedule], [self.warmup_steps])
    return schedule


# Local optimizer states across rounds (RunOptions.local_optimizer_state):
#   "reset": every client starts each round (each FedLAMA window) with a fresh state;
#   "carry": the state is kept from one round to the next (under the FedLAMA schedule, each
#            slot keeps its optimizer, as FedLAMA's reference code keeps one per worker).
LOCAL_OPTIMIZER_STATES = ("reset", "carry")


@dataclasses.dataclass(frozen=True)
class RunOptions:
  """Everything a round program needs to know about the run besides model and data."""
  seed: int
  rounds: int
  local_steps: int
  local_epochs: int
  batch_size: int
  weighting: str
  eval_every: int
  learning_rate: LearningRate
  sampler: federation.Sampler
  label_smoothing: float = 0.0
  unroll: int = 1
  clients_per_chunk: int = 0
  client_state_on_host: bool = False
  augment: Optional[Callable] = None
  # The engine's per-platform choices (kernels, client map, compiler options), built once by
  # the training entry point; None: `platform.plan()` of JAX's default backend.
  platform: Optional[plan_lib.PlatformPlan] = None
  # The algorithm's batching preset (its Spec's `one_step`, registry.run_facts): None, the
  # local steps or epochs above; "minibatch" or "full_batch", one local step per round on
  # one batch or on the client's whole data (FedSGD).
  one_step: Optional[str] = None
  # Local optimizer states across rounds (config.local_optimizer_state), LOCAL_OPTIMIZER_STATES.
  local_optimizer_state: str = "reset"
  # The name the run's algorithm is reported under, for messages (registry.run_facts).
  algorithm_name: str = "the algorithm"
  # The run's aggregation chain (run/spec.py `run_chain`, engine/stages.py): the uplink codec
  # of every upload, then DP's clip and noise or an upload attack and a defence around the
  # model upload's aggregate, for every synchronous algorithm and under the FedLAMA schedule;
  # None: each algorithm's declared aggregation alone.
  aggregator: Optional[stages.Stage] = None
  # A data attack on the clients' batches inside the jitted local step (the backdoor's trigger
  # on the malicious clients' examples, robust_stage.with_poison): poison(x, y, indices,
  # client_id) -> (x, y); None: the clients train on their data as it is.
  poison: Optional[Callable] = None
  # The trainable set (models/lora.py `trainable_set`: config.trainable, "lora" by default
  # under config.model_options.lora): the parameters the algorithm trains, aggregates and
  # sends; the rest is frozen, one copy per device (`ProgramBase`). "": every parameter.
  trainable: str = ""

  def __post_init__(self):
    if self.one_step is not None and self.one_step not in ONE_STEP_KINDS:
      raise ValueError(f"RunOptions.one_step={self.one_step!r}; accepted: None, "
                       f"{', '.join(map(repr, ONE_STEP_KINDS))}")
    if self.local_optimizer_state not in LOCAL_OPTIMIZER_STATES:
      raise ValueError(f"RunOptions.local_optimizer_state={self.local_optimizer_state!r}; "
                       f"accepted: {', '.join(map(repr, LOCAL_OPTIMIZER_STATES))}")


def platform_plan(opts: RunOptions) -> plan_lib.PlatformPlan:
  """The run's platform plan: `opts.platform`, or the default backend's."""
  return opts.platform if opts.platform is not None else plan_lib.plan()


def steps_per_round(opts: RunOptions, fed) -> int:
  """Static step-axis length: tau, E epochs of the largest client, or 1 (FedSGD)."""
  if opts.one_step is not None:
    return 1
  if opts.local_epochs > 0:
    largest = max(len(ix) for ix in fed.client_train)
    return opts.local_epochs * max(1, fdata.steps_per_epoch(largest, opts.batch_size))
  return opts.local_steps


def pack(opts: RunOptions, fed, ids, round_idx: int, num_clients_padded: int,
         num_steps: int) -> cohort_lib.Cohort:
  """The cohort's batches as index arrays and masks, padded to static shapes."""
  if opts.one_step == "full_batch":
    # One step over each client's whole data: one epoch with a batch of the largest client.
    batch, steps, epochs = max(len(ix) for ix in fed.client_train), None, 1
  elif opts.one_step == "minibatch":
    batch, steps, epochs = opts.batch_size, 1, None
  elif opts.local_epochs:
    batch, steps, epochs = opts.batch_size, None, opts.local_epochs
  else:
    batch, steps, epochs = opts.batch_size, opts.local_steps, None
  packed = fdata.pack_cohort(
      [fed.client_train[i] for i in ids], list(ids), batch_size=batch, num_steps=steps,
      num_epochs=epochs, seed=opts.seed, round_idx=round_idx, pad_clients_to=num_clients_padded,
      pad_steps_to=num_steps)
  return cohort_lib.Cohort(packed.indices.astype(np.int32), packed.example_mask.astype(np.float32),
                          packed.step_mask.astype(np.float32),
                          packed.client_mask.astype(np.float32),
                          packed.client_ids.astype(np.int32),
                          packed.num_examples.astype(np.float32))


def trainable_part(names: str, params) -> Optional[lora.TrainableSet]:
  """The trainable set `names` declares on `params` (models/lora.py `trainable_set`; a
  name that selects nothing stops with one line naming config.trainable and the model's
  layers); None when every parameter trains ("", or names that select every leaf)."""
  if not names:
    return None
  chosen = lora.trainable_set(params, names, field="config.trainable")
  return None if all(chosen.mask) else chosen


def with_steps(opts: RunOptions, steps: int) -> RunOptions:
  """The same run in steps mode with `steps` local steps (FedLAMA packs windows so)."""
  return dataclasses.replace(opts, local_steps=steps, local_epochs=0)


class Reporter:
  """An algorithm's `report` as the programs use it: the params the run evaluates, and the
  scalars each round's record gets (metrics.jsonl). The default report costs nothing: the
  server's params as they are, no scalars, no device call."""

  def __init__(self, report):
    self.default = report is report_model
    if not self.default:
      self._params = jax.jit(lambda server: report(server)[0])
      self._scalars = jax.jit(lambda server: report(server)[1])

  def eval_params(self, server):
    return server.params if self.default else self._params(server)

  def scalars(self, server) -> dict:
    """{name: float} of the server state (one device read), {} for the default report."""
    if self.default:
      return {}
    return {name: float(v) for name, v in jax.device_get(self._scalars(server)).items()}


class ProgramBase:
  """What every round program shares, built by one constructor: the run's options,
  algorithm, federation and mesh; the trainable set and the frozen rest of the model's
  parameters (`opts.trainable`): `params` are the trainable set, which the algorithm
  trains, aggregates and sends (its "params" everywhere: server optimizers, control
  variates, rows, DP, defences, codecs, FedLAMA's layers), and `frozen` the rest,
  replicated once per device and handed to the jitted training as an argument, never
  per client (`whole(params)` puts them back together for evaluation); the model's loss
  and evaluation; the algorithm's report
  (`Reporter`), traffic and per-client row template; the aggregation of its uploads with the
  run's chain (`RoundAggregation`, which refuses an algorithm the chain cannot wrap before any
  training) and the chain's uplink codec with the bits one client sends; the per-client store
  of its rows; and empty host state by default.

  `vectorizable`: whether several runs of the program may train as one vectorized program
  (programs/vectorized.py, run/many.py).
  """
  store: Optional[client_store.ClientStore] = None
  vectorizable = False

  def __init__(self, opts: RunOptions, algorithm, model, params, model_state, fed, mesh):
    self.opts, self.algorithm, self.fed, self.mesh = opts, algorithm, fed, mesh
    self.trainable = trainable_part(opts.trainable, params)
    frozen = {}
    if self.trainable is not None:
      params, frozen = self.trainable.split(params)
    self.frozen = sharding.replicate(frozen, mesh) if frozen else {}
    self.params, self.model_state = params, model_state
    self.has_state = bool(jax.tree.leaves(model_state))
    self.plan = platform_plan(opts)
    self.eval_every = opts.eval_every
    self.reporter = Reporter(algorithm.server.report)
    # Also fine-tunes personal models before evaluation.
    self.loss_fn = local.make_loss_fn(
        model, self.has_state, opts.label_smoothing,
        merge=self.trainable.merge if self.trainable is not None else None)
    self.eval_fn = evaluate.make_eval_fn(model, self.has_state)
    self.row_template = algorithm.row_init(params) if algorithm.row_init is not None else {}
    self.traffic = traffic_lib.traffic(algorithm, algorithm.server.init(params, model_state),
                                       self.row_template)
    self.aggregation = aggregation.RoundAggregation(algorithm, opts.aggregator, seed=opts.seed,
                                                    weighting=opts.weighting,
                                                    name=opts.algorithm_name)
    self.aggregation.resolve(self.traffic.upload_shapes)
    codec = self.aggregation.codec
    self.compressor = codec if codec is not None else compression.identity()
    self.bits_up_per_client = traffic_lib.uplink_bits(self.traffic, self.compressor)

  def whole(self, params):
    """The model's parameters: the trainable set `params` with the frozen rest (no copy)."""
    if self.trainable is None:
      return params
    return self.trainable.merge(params, self.frozen)

  def _new_store(self, row_template):
    """A store whose rows all start as the template; its rows for the initial state ({},
    and no store, for a template without leaves: a personalization method with nothing
    personal on this model)."""
    if not jax.tree.leaves(row_template):
      self.store = None
      return {}
    self.store = client_store.ClientStore.create(
        row_template, self.fed.num_clients, self.mesh, on_host=self.opts.client_state_on_host)
    return self.store.rows

  def _adopt_rows(self, rows) -> Optional[client_store.ClientStore]:
    """The store behind `rows`: ours, or a new one for rows restored from a checkpoint."""
    if self.algorithm.row_init is None or not jax.tree.leaves(rows):
      return None
    if self.store is None or rows is not self.store.rows:
      self.store = None  # drop the old rows before adopting the new ones
      # The state hands its rows over (no second copy of N rows on host).
      self.store = client_store.ClientStore(rows, self.mesh,
                                            on_host=self.opts.client_state_on_host,
                                            num_clients=self.fed.num_clients, copy=False)
    return self.store

  def rows_store(self, state) -> Optional[client_store.ClientStore]:
    """The store of `state`'s per-client rows (None when the algorithm keeps none), for
    evaluating each client's personal model (run/records.py)."""
    return self._adopt_rows(state["rows"])

  def server_state(self, state):
    """The ServerState of `state`, which per-client evaluation hands the algorithm's serve."""
    return state["server"]

  # A checkpoint holds the trainable set; the frozen rest is derived again from the config
  # (the model's initialisation from config.seed) when a run resumes. Its digest, written
  # beside the checkpoint, says whether it is the one the run trained on.
  FROZEN_DIGEST = checkpointing.FROZEN_DIGEST

  def frozen_digest(self) -> str:
    if getattr(self, "_frozen_digest", None) is None:
      self._frozen_digest = checkpointing.tree_digest(self.frozen)
    return self._frozen_digest

  def host_state(self) -> dict:
    return {self.FROZEN_DIGEST: self.frozen_digest()} if self.frozen else {}

  def load_host_state(self, d: dict) -> None:
    given = d.get(self.FROZEN_DIGEST)
    if given is not None and given != self.frozen_digest():
      raise errors.ConfigError(
          "the checkpoint's frozen parameters (the base under the trainable set, "
          "config.trainable) are not the ones this config derives (config.seed, the model "
          "and its options); accepted: the config the run was started with")
