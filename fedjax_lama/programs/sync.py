"""Synchronous rounds of any algorithm: sample, train every client from the server, aggregate.

A round runs its cohort in chunks of `chunk_size` clients (RunOptions.clients_per_chunk,
default the whole static cohort), each chunk a fixed-shape packed cohort split over the
"clients" mesh axis. Per chunk the host makes O(1) dispatches whatever the number of
clients: one transfer of the packed arrays, the jitted chunk, one jitted accumulation
(plus one gather and one scatter when the algorithm keeps per-client rows); the round
ends with one server update and one device->host read of the loss. Sums are (weighted
sum, weight) pairs, so chunked and unchunked rounds reduce the same quantities
(docs/design.md, "The engine"). Jitted outputs keep the placement of their inputs
(server replicated, per-client arrays split over clients), so every round after the
first reuses the first round's executables.

With a chain that consumes the cohort's stack (RunOptions.aggregator: a coordinate median,
Krum, an upload attack) each chunk also returns its clients' values of the model upload's
aggregate, and the chunks' stacks are concatenated: the round holds C x d floats (C clients
of the round, d the model's size) until the server update; chains that consume running sums
(a clip, DP's noise, the mean) keep the (sum, weight) pairs only.

Per-client persistent state (algorithm.row_init) lives in a `client_store.ClientStore`,
on device or, with RunOptions.client_state_on_host, in host memory. `run_round`
consumes its `state`: the store is updated in place.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lama.engine import (aggregation, clients as clients_lib, local, sharding,
                                sync_round)
from fedjax_lama.engine.algorithm import Algorithm
from fedjax_lama.programs.round_program import (ProgramBase, RoundOutput, RunOptions, pack,
                                                steps_per_round)


class _RoundTotals(NamedTuple):
  """A round's running sums over its chunks, kept on device until the round ends."""
  sums: aggregation.ChunkSums
  loss_sum: jax.Array
  count: jax.Array


def _first_chunk(sums: aggregation.ChunkSums, stats: clients_lib.ClientStats) -> _RoundTotals:
  return _RoundTotals(sums, jnp.sum(stats.loss_sum), jnp.sum(stats.count))


def _add_chunk(totals: _RoundTotals, sums: aggregation.ChunkSums,
               stats: clients_lib.ClientStats) -> _RoundTotals:
  return _RoundTotals(aggregation.add_sums(totals.sums, sums),
                      totals.loss_sum + jnp.sum(stats.loss_sum),
                      totals.count + jnp.sum(stats.count))


class SyncProgram(ProgramBase):
  """Rounds of one synchronous algorithm (see the module docstring)."""
  vectorizable = True

  def __init__(self, opts: RunOptions, algorithm: Algorithm, model, params, model_state, fed,
               mesh):
    if opts.local_optimizer_state != "reset":
      raise ValueError(f"local_optimizer_state={opts.local_optimizer_state!r} is not "
                       "accepted by synchronous rounds (every client starts afresh); accepted: "
                       "'reset' ('carry' runs under the FedLAMA schedule)")
    super().__init__(opts, algorithm, model, params, model_state, fed, mesh)
    self.num_steps = steps_per_round(opts, fed)
    self.num_rounds = opts.rounds
    learning_rate = opts.learning_rate.build(opts.rounds * self.num_steps, self.num_steps)
    train_chunk, server_update = sync_round.make_round_fns(
        self.loss_fn, algorithm, learning_rate, seed=opts.seed, weighting=opts.weighting,
        local_steps=self.num_steps, population=fed.num_clients, unroll=opts.unroll,
        augment=opts.augment, poison=opts.poison, client_devices=mesh.size, jit=False,
        plan=self.plan, aggregator=opts.aggregator, name=opts.algorithm_name)
    replicated = sharding.replicated_sharding(mesh)
    clients = sharding.clients_sharding(mesh)
    # The sums are replicated; a stack stays split over the clients' devices, where its rows
    # were computed (`_server_update`).
    sums_sharding = aggregation.ChunkSums(replicated, replicated, replicated, replicated,
                                          clients)
    self.train_chunk = local.jit_training(train_chunk, plan=self.plan,
                                          out_shardings=(sums_sharding, clients, clients))
    # Its outputs follow its inputs: replicated in, replicated out (`_server_update`).
    self.server_update = jax.jit(server_update)
    totals_sharding = _RoundTotals(sums_sharding, replicated, replicated)
    self._first_chunk = jax.jit(_first_chunk, out_shardings=totals_sharding)
    self._add_chunk = jax.jit(_add_chunk, out_shardings=totals_sharding)
    self.data_x = sharding.replicate(np.asarray(fed.dataset.train_x), mesh)
    self.data_y = sharding.replicate(np.asarray(fed.dataset.train_y, np.int32), mesh)
    cap = opts.clients_per_chunk or opts.sampler.max_cohort
    self.chunk_size = sharding.padded_size(cap, mesh)

  def init_state(self):
    server = self.algorithm.server.init(self.params, self.model_state)
    rows = {}
    if self.algorithm.row_init is not None:
      rows = self._new_store(self.algorithm.row_init(self.params))
    state = {"server": sharding.replicate(server, self.mesh), "rows": rows}
    agg_state = self._agg_init()
    if agg_state:  # only a stage with state adds to the checkpointed state
      state["aggregation"] = sharding.replicate(agg_state, self.mesh)
    return state

  def _agg_init(self) -> dict:
    return self.aggregation.init(self.params, self.traffic.upload_shapes)

  def run_round(self, state, round_idx: int):
    ids = self.opts.sampler.sample(round_idx)
    server = state["server"]
    store = self._adopt_rows(state["rows"])
    agg_state = state.get("aggregation", {})
    totals = None
    # A stage that releases every round (user-level DP's noise: the accountant counts every
    # round) runs on one chunk of padding when the draw is empty; otherwise the server stays
    # as it was.
    release_empty = self.aggregation.every_round
    for start in range(0, max(len(ids), int(release_empty)), self.chunk_size):
      group = ids[start:start + self.chunk_size]
      packed = pack(self.opts, self.fed, group, round_idx, self.chunk_size, self.num_steps)
      cohort = sharding.shard_clients(packed, self.mesh)
      rows = store.gather(packed.client_ids) if store is not None else {}
      # A stage's state and the frozen parameters are passed only when there are some (the
      # call is otherwise unchanged).
      with_state = (agg_state,) if agg_state else ()
      with_frozen = {"frozen": self.frozen} if self.frozen else {}
      sums, new_rows, stats = self.train_chunk(server, rows, self.data_x, self.data_y, cohort,
                                               round_idx, *with_state, **with_frozen)
      if store is not None:
        store.scatter(packed.client_ids, packed.client_mask, new_rows)
      totals = (self._first_chunk(sums, stats) if totals is None else
                self._add_chunk(totals, sums, stats))
    loss, count, scalars = 0.0, 0.0, {}
    if totals is not None:  # a Bernoulli draw can be empty: the server stays as it was
      server, agg_state, scalars = self._server_update(server, totals.sums, agg_state,
                                                       round_idx)
      loss, count = (float(v) for v in jax.device_get((totals.loss_sum, totals.count)))
    n = len(ids)
    extra = {"clients": n, **self.reporter.scalars(server)}
    extra.update(aggregation.stage_metrics(jax.device_get(scalars)))
    t = self.traffic
    out = RoundOutput(loss / count if count else 0.0, count, t.up_per_leaf * n,
                      t.down_per_leaf * n, None, extra,
                      bits_up=self.bits_up_per_client * n, floats_up_other=t.up_other * n,
                      floats_down_other=t.down_other * n)
    new_state = {"server": server, "rows": store.rows if store is not None else {}}
    if "aggregation" in state:
      new_state["aggregation"] = agg_state
    return new_state, out

  def _server_update(self, server, sums, agg_state, round_idx):
    """The round's server update. With the cohort's stack (a stage that reads it: a robust
    rule, an attack) it runs on the mesh's first device, after one copy of the stack's rows
    there, and its result is replicated back: replicated, every device would hold the whole
    stack and run the stage on all of it, the same work once per device (on two CPU devices
    sharing the cores, twice the stage's time; docs/performance.md, "Robust aggregation's
    cost"). One device computes the replicated program's numbers exactly."""
    if not sums.stacks or self.mesh.size == 1:
      return self.server_update(server, sums, agg_state, round_idx)
    first = self.mesh.devices.flat[0]
    out = self.server_update(*jax.device_put((server, sums, agg_state), first), round_idx)
    return sharding.replicate(out, self.mesh)

  def eval_params(self, state):
    server = state["server"]
    return self.whole(self.reporter.eval_params(server)), server.model_state

  def local_steps_done(self, round_idx: int) -> int:
    return (round_idx + 1) * self.num_steps

  def summary(self, state, ledger) -> dict:
    del state, ledger
    return {}

  def plot(self, workdir, ledger) -> None:
    pass

