"""Round programs: how one algorithm turns the engine into rounds.

A program owns the jitted functions of its algorithm and exposes the small
interface the training loop drives (init_state, run_round, eval_params, ...).
The synchronous program serves FedAvg-family algorithms; FedLAMA's windowed
program lives in fedjax_lama.fedlama_program.
"""
import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_lama import algorithms, compress, federation
from fedjax_lama import config as config_lib
from fedjax_lama import data as fdata
from fedjax_lama.data import augment
from fedjax_lama.engine import client_store, evaluate, local, round as round_lib, sharding
from fedjax_lama.tree import leaf_sizes


class RoundOutput(NamedTuple):
  train_loss: float                # mean over the round's real examples
  train_count: float               # number of real examples trained on
  floats_up_per_layer: np.ndarray  # this round, summed over clients
  floats_down_per_layer: np.ndarray
  bytes: Optional[int]             # None: bits_up / 8 + 4 bytes per float down
  extra: dict                      # algorithm-specific metrics for metrics.jsonl
  bits_up: Optional[int] = None    # None: 32 bits per float up (no compressor)


def make_lr_schedule(config, total_steps: int):
  """Local learning rate as a function of the global local-step count."""
  lr = float(config.local_lr)
  kind = config.local_lr_schedule
  if kind == "constant":
    schedule = optax.constant_schedule(lr)
  elif kind == "cosine":
    schedule = optax.cosine_decay_schedule(lr, max(1, total_steps))
  elif kind == "step":
    schedule = optax.piecewise_constant_schedule(
        lr, {int(b): float(config.local_lr_decay_factor) for b in config.local_lr_decay_steps})
  else:  # "exponential": decay factor per round (FL-Simulator's 0.998)
    schedule = optax.exponential_decay(lr, max(1, config.local_steps), config.local_lr_decay_factor,
                                       staircase=True)
  if config.local_lr_warmup_steps:
    warm = optax.linear_schedule(0.0, lr, config.local_lr_warmup_steps)
    schedule = optax.join_schedules([warm, schedule], [config.local_lr_warmup_steps])
  return schedule


def build_algorithm(config, params) -> algorithms.Algorithm:
  common = dict(local_momentum=config.local_momentum, weight_decay=config.weight_decay,
                server_lr=config.server_lr, server_momentum=config.server_momentum)
  if config.algorithm == "fedprox":
    return algorithms.fedprox(config.fedprox.mu, **common)
  return algorithms.get(config.algorithm)(**common)


def steps_per_round(config, fed) -> int:
  """Static step-axis length: tau, or E epochs of the largest client (padded steps are masked)."""
  if config.local_epochs > 0:
    largest = max(len(ix) for ix in fed.client_train)
    return config.local_epochs * max(1, math.ceil(largest / config.batch_size))
  return config.local_steps


def pack(config, fed, ids, round_idx, num_clients_padded, num_steps) -> round_lib.Cohort:
  batch = fdata.pack_cohort(
      [fed.client_train[i] for i in ids], list(ids), batch_size=config.batch_size,
      num_steps=config.local_steps if config.local_epochs == 0 else None,
      num_epochs=config.local_epochs or None, seed=config.seed, round_idx=round_idx,
      pad_clients_to=num_clients_padded)
  pad = num_steps - batch.indices.shape[1]
  indices, example_mask, step_mask = batch.indices, batch.example_mask, batch.step_mask
  if pad > 0:
    indices = np.pad(indices, ((0, 0), (0, pad), (0, 0)))
    example_mask = np.pad(example_mask, ((0, 0), (0, pad), (0, 0)))
    step_mask = np.pad(step_mask, ((0, 0), (0, pad)))
  return round_lib.Cohort(indices.astype(np.int32), example_mask.astype(np.float32),
                          step_mask.astype(np.float32), batch.client_mask.astype(np.float32),
                          batch.client_ids.astype(np.int32), batch.num_examples.astype(np.float32))


class _RoundTotals(NamedTuple):
  """A round's running sums over its chunks, kept on device until the round ends."""
  sums: round_lib.ChunkSums
  loss_sum: jax.Array
  count: jax.Array


def _add_chunk(totals: _RoundTotals, sums: round_lib.ChunkSums,
               stats: round_lib.ClientStats) -> _RoundTotals:
  return _RoundTotals(round_lib.add_sums(totals.sums, sums),
                      totals.loss_sum + jnp.sum(stats.loss_sum),
                      totals.count + jnp.sum(stats.count))


class SyncProgram:
  """FedAvg-family rounds: sample, train every client from the server model, average.

  A round runs its cohort in chunks of `chunk_size` clients (config.engine.clients_per_chunk,
  default the whole static cohort), each chunk a fixed-shape packed cohort split over the
  "clients" mesh axis. Per chunk the host makes O(1) dispatches whatever the number of
  clients: one transfer of the packed arrays, the jitted chunk, one jitted accumulation
  (plus one gather and one scatter when the algorithm keeps per-client rows); the round
  ends with one server update and one device->host read of the loss. Sums are (weighted
  sum, weight) pairs, so chunked and unchunked rounds reduce the same quantities
  (architecture.md 2.2, "Chunking"). Jitted outputs keep the placement of their inputs
  (server replicated, per-client arrays split over clients), so every round after the
  first reuses the first round's executables.

  Per-client persistent state (algorithm.client_row_init) lives in a
  `client_store.ClientStore`, on device or, with config.engine.client_state_on_host, in
  host memory. `run_round` consumes its `state`: the store is updated in place.
  """

  def __init__(self, config, model, params, model_state, fed, mesh,
               algorithm: Optional[algorithms.Algorithm] = None):
    """algorithm: overrides the one named by config.algorithm (tests, custom algorithms)."""
    self.config, self.fed, self.mesh = config, fed, mesh
    self.algorithm = algorithm if algorithm is not None else build_algorithm(config, params)
    self.compressor = compress.from_config(config)
    self.leaf_bits = compress.leaf_bits(self.compressor, params)
    self.on_host = config.engine.get("client_state_on_host", False)
    if not isinstance(self.on_host, bool):
      raise config_lib.ConfigError(
          f"config.engine.client_state_on_host={self.on_host!r} is not accepted; accepted: "
          "True or False")
    has_state = bool(jax.tree_util.tree_leaves(model_state))
    self.num_steps = steps_per_round(config, fed)
    self.num_rounds = config.rounds
    self.eval_every = config.eval_every
    loss_fn = local.make_loss_fn(model, has_state, config.label_smoothing)
    schedule = make_lr_schedule(config, config.rounds * self.num_steps)
    train_chunk, server_update = round_lib.make_round_fns(
        loss_fn, self.algorithm, schedule, seed=config.seed, weighting=config.weighting,
        local_steps=self.num_steps, unroll=config.engine.unroll, compressor=self.compressor,
        augment=augment.from_config(config, fed.dataset))
    replicated = sharding.replicated_sharding(mesh)
    clients = sharding.clients_sharding(mesh)
    self.train_chunk = jax.jit(train_chunk, out_shardings=(replicated, clients, clients))
    self.server_update = jax.jit(server_update, out_shardings=replicated)
    self._add_chunk = jax.jit(_add_chunk, out_shardings=replicated)
    self.eval_fn = evaluate.make_eval_fn(model, has_state)
    self.params, self.model_state = params, model_state
    self.data_x = sharding.replicate(np.asarray(fed.dataset.train_x), mesh)
    self.data_y = sharding.replicate(np.asarray(fed.dataset.train_y, np.int32), mesh)
    cap = config.engine.clients_per_chunk or federation.max_cohort(config, fed.num_clients)
    self.chunk_size = sharding.padded_size(cap, mesh)
    self.sizes = leaf_sizes(params)
    zeros = lambda t: jax.tree_util.tree_map(lambda x: np.zeros(np.shape(x), np.float32), t)
    self._zero_totals = sharding.replicate(_RoundTotals(
        round_lib.ChunkSums(zeros(params), zeros(model_state), np.float32(0)),
        np.float32(0), np.float32(0)), mesh)
    self.store: Optional[client_store.ClientStore] = None

  def init_state(self):
    server = round_lib.ServerState(self.params, self.model_state,
                                   self.algorithm.server_tx.init(self.params))
    rows = {}
    if self.algorithm.client_row_init is not None:
      self.store = client_store.ClientStore.create(
          self.algorithm.client_row_init(self.params), self.fed.num_clients, self.mesh,
          on_host=self.on_host)
      rows = self.store.rows
    return {"server": sharding.replicate(server, self.mesh), "rows": rows}

  def _adopt_rows(self, rows):
    """The store behind `rows`: ours, or a new one for rows restored from a checkpoint."""
    if self.algorithm.client_row_init is None:
      return None
    if self.store is None or rows is not self.store.rows:
      self.store = None  # drop the old rows before adopting the new ones
      # The state hands its rows over (no second copy of N rows on host).
      self.store = client_store.ClientStore(rows, self.mesh, on_host=self.on_host,
                                            num_clients=self.fed.num_clients, copy=False)
    return self.store

  def run_round(self, state, round_idx: int):
    ids = federation.sample_round(self.config, self.fed.num_clients, round_idx)
    server = state["server"]
    store = self._adopt_rows(state["rows"])
    totals = self._zero_totals
    for start in range(0, len(ids), self.chunk_size):
      group = ids[start:start + self.chunk_size]
      packed = pack(self.config, self.fed, group, round_idx, self.chunk_size, self.num_steps)
      cohort = sharding.shard_clients(packed, self.mesh)
      rows = store.gather(packed.client_ids) if store is not None else {}
      sums, new_rows, stats = self.train_chunk(server, rows, self.data_x, self.data_y, cohort,
                                               round_idx)
      if store is not None:
        store.scatter(packed.client_ids, packed.client_mask, new_rows)
      totals = self._add_chunk(totals, sums, stats)
    if len(ids):
      server = self.server_update(server, totals.sums)
    loss, count = (float(v) for v in jax.device_get((totals.loss_sum, totals.count)))
    n = len(ids)
    up = self.sizes * n * self.algorithm.floats_up_per_model
    down = self.sizes * n * self.algorithm.floats_down_per_model
    bits_up = int(self.leaf_bits.sum()) * n * self.algorithm.floats_up_per_model
    out = RoundOutput(loss / count if count else 0.0, count, up, down, None,
                      {"clients": n}, bits_up=int(bits_up))
    return {"server": server, "rows": store.rows if store is not None else {}}, out

  def eval_params(self, state):
    return state["server"].params, state["server"].model_state

  def local_steps_done(self, round_idx: int) -> int:
    return (round_idx + 1) * self.num_steps

  def host_state(self) -> dict:
    return {}

  def load_host_state(self, d: dict) -> None:
    del d

  def summary(self, state, ledger) -> dict:
    return {}

  def plot(self, workdir, ledger) -> None:
    pass


def build(config, model, params, model_state, fed, mesh):
  if config.algorithm == "fedlama":
    from fedjax_lama import fedlama_program  # pylint: disable=g-import-not-at-top
    return fedlama_program.FedLamaProgram(config, model, params, model_state, fed, mesh)
  return SyncProgram(config, model, params, model_state, fed, mesh)
