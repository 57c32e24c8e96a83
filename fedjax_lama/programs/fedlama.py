"""FedLAMA's round program: layer-wise adaptive aggregation intervals, as a schedule over any
algorithm (its pieces, the interval selection, the layer discrepancy and the layer units, are
in fedjax_lama/fedlama/).

S. Lee, T. Zhang, S. Avestimehr, "Layer-wise Adaptive Model Aggregation for
Scalable Federated Learning", AAAI 2023 (Algorithm 2); arXiv v1 (Algorithm 1).

One program "round" is one window of W = phi * unit local steps, run as ONE
jitted call: phi sub-rounds of `unit` steps of the vmapped local scan over the
slots (engine/clients.py's ClientPhase), each followed by a layer-masked round of
the base algorithm: the layers due now (sync mask r mod m_l == 0) are uploaded,
aggregated and put through the algorithm's server update, and only those layers
of the server state, the clients' rows and the slots' models take the new values
(`select_leafwise`); every other layer keeps each slot's own copy bit for bit. Then
the normalisation statistics, then the interval selection for the next window.
Slots keep their unsynchronised layers and running statistics across sub-rounds.
The local optimizer's state follows RunOptions.local_optimizer_state
(config.local_optimizer_state): "reset", the rule of synchronous rounds, starts it afresh whenever clients are sampled (each window,
or each sub-round with fedlama.client_sampling="round") and keeps it through the
window's sub-rounds; "carry" keeps each slot's state for the whole run, as the
reference code keeps one optimizer per worker. The base algorithm sees, per leaf, the
steps and the effective step (ClientInfo) since that leaf's last synchronisation, and
its anchor is the leaf's last synchronised value (the server's params). This needs an
algorithm whose uploads, rows and server state are per leaf (`Algorithm.layerwise`).
An algorithm with personal layers (`Algorithm.exchanged`: FedPer, FedRep, LG-FedAvg) has its
window's clients start from their own layers (`Algorithm.start`), never synchronises or
counts the personal leaves, takes its rows (the personal layers) whole at every sub-round,
and selects intervals over the shared layers alone.

Equivalences (tests): phi = 1 is the base algorithm at tau' (with local momentum too,
under "reset"); fixed multipliers phi for every layer is the base algorithm at phi tau'
-- the window's batches and keys are those of one round of W steps, because the window
is packed as one span of W steps.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lama import compression, plots, rng
from fedjax_lama.engine import (aggregation, clients as clients_lib, cohort as cohort_lib,
                                leafwise, local, reduce, sharding,
                                traffic as traffic_lib)
from fedjax_lama.engine.algorithm import (MODEL_UPLOAD, Algorithm, ClientContext, LocalState,
                                          ServerState)
from fedjax_lama.errors import ConfigError
from fedjax_lama.fedlama import layer_sync, layer_units as layers, selection as sel
from fedjax_lama.fedlama.options import FedLamaOptions
from fedjax_lama.programs.round_program import (ProgramBase, RoundOutput, RunOptions, pack,
                                                with_steps)
from fedjax_lama.tree import broadcast_clients, tree_size


class FedLamaState(NamedTuple):
  slots: LocalState         # leaves [m, ...]
  server: ServerState       # params = u (last synchronised values), model_state = global stats
  discrepancy: jax.Array    # d [L]
  multipliers: jax.Array    # int32 [L], for the next window
  sync_counts: jax.Array    # int32 [L], c_l (Eq. 8)
  window: jax.Array         # int32, windows completed
  since_steps: jax.Array    # float32 [m, L]: each slot's steps since each layer's last sync
  since_step_size: jax.Array  # [m, L]: their effective step (ClientInfo.effective_step)
  since_momentum: jax.Array   # [m, L]: the unit momentum since then (local.StepStats)


def check_composable(algorithm: Algorithm, server: ServerState, row, traffic,
                     algorithm_name: str = "the algorithm") -> None:
  """Refuses algorithms whose state or messages are not per leaf (ConfigError)."""
  params = server.params
  params_def = jax.tree.structure(params)
  problems = []
  # An algorithm with personal layers (Algorithm.exchanged) keeps them in its rows, which
  # never synchronise: they are written whole at every sub-round.
  states = (("server state", (server.opt_state, server.extra)),)
  if algorithm.exchanged is None:
    states += (("client row", row),)
  for what, tree in states:
    parts = leafwise.non_leafwise_parts(tree, params)
    if parts:
      problems.append(f"its {what} has entries that are not per layer ({', '.join(parts[:3])})")
  for name, shape in traffic.upload_shapes.items():
    if jax.tree.structure(shape) != params_def:
      problems.append(f"its upload {name!r} is not shaped like the model")
  shared = algorithm.shared(server)
  for name in shared:
    if jax.tree.structure(shared[name]) != params_def:
      problems.append(f"its download {name!r} is not shaped like the model")
  if problems:
    raise ConfigError(f"config.schedule='fedlama' cannot run config.algorithm="
                      f"{algorithm_name!r}: {'; '.join(problems)}")


class FedLamaProgram(ProgramBase):
  """Windows of phi sub-rounds with layer-wise synchronisation (see the module docstring)."""

  def __init__(self, opts: RunOptions, fl: FedLamaOptions, algorithm: Algorithm, model, params,
               model_state, fed, mesh):
    self.fl = fl
    if opts.sampler.kind != "fixed":
      raise ConfigError(
          f"config.client_sampling={opts.sampler.kind!r} is not accepted with the fedlama "
          "schedule (a window trains a fixed number of slots); accepted: 'fixed'")
    if opts.local_epochs:
      raise ConfigError(
          f"config.local_epochs={opts.local_epochs} is not accepted with the fedlama schedule "
          "(intervals are counted in local steps: config.fedlama.base_interval); accepted: 0")
    super().__init__(opts, algorithm, model, params, model_state, fed, mesh)
    params = self.params  # the trainable set: the layers the schedule synchronises
    self.phi, self.rule = int(fl.phi), fl.interval_rule
    self.unit = sel.interval_unit(fl.base_interval, self.phi, self.rule)
    self.window_steps = sel.window_length(fl.base_interval, self.phi, self.rule)
    total = fl.total_steps or opts.rounds * self.window_steps
    if total % self.window_steps:
      raise ConfigError(
          f"config.fedlama.total_steps={total} is not accepted; accepted: a multiple of the "
          f"window length phi*unit={self.window_steps}")
    self.num_rounds = total // self.window_steps
    self.spec = layers.layer_spec(params, fl.layer_granularity)
    kernels_only = fl.kernels_only if fl.kernels_only is not None else self.rule == "code"
    self.kernel_mask = jnp.asarray(self.spec.is_kernel) if kernels_only else None
    self.base = jnp.asarray(sel.base_multipliers(len(self.spec.sizes), self.phi, self.rule),
                            jnp.int32)
    self.fixed = None
    if fl.fixed_multipliers is not None:
      fixed = np.broadcast_to(np.asarray(fl.fixed_multipliers, np.int32), self.base.shape)
      if not np.all((fixed == 1) | (fixed == self.phi)):
        raise ConfigError(
            f"config.fedlama.fixed_multipliers={fl.fixed_multipliers!r} is not accepted; "
            f"accepted: 1 or phi={self.phi} per layer ({len(self.spec.sizes)} layers)")
      self.fixed = jnp.asarray(fixed)
    if algorithm.local.rule is not None and algorithm.local.rule.pull:
      raise ConfigError(f"config.schedule='fedlama' cannot run config.algorithm="
                        f"{opts.algorithm_name!r} with a proximal pull in its effective step")
    server = algorithm.server.init(params, model_state)
    check_composable(algorithm, server, self.row_template, self.traffic, opts.algorithm_name)
    # Personal layers (Algorithm.exchanged) never synchronise: FedLAMA schedules the layers
    # whose every leaf is shared, and the rows hold the personal ones whole.
    self.shared_leaf = traffic_lib.exchanged_leaves(algorithm, params)
    shared_layer = np.ones(self.spec.num_layers, bool)
    np.logical_and.at(shared_layer, self.spec.leaf_to_layer, self.shared_leaf)
    self.shared_layer = shared_layer  # every leaf shared: the selection may relax it
    # Some leaf shared: its synchronisations move floats (a module with a personal tensor
    # synchronises its shared ones at the base interval).
    self.synced_layer = np.zeros(self.spec.num_layers, bool)
    np.logical_or.at(self.synced_layer, self.spec.leaf_to_layer, self.shared_leaf)
    self.whole_rows = algorithm.exchanged is not None
    if (self.row_template or algorithm.start is not None) and fl.client_sampling != "window":
      raise ConfigError(
          f"config.fedlama.client_sampling={fl.client_sampling!r} is not accepted with "
          f"config.algorithm={opts.algorithm_name!r}, which keeps per-client state; accepted: "
          "'window' (one cohort per window)")
    self.params_def = jax.tree.structure(params)
    self.num_slots = opts.sampler.cohort_size
    self.slots_padded = sharding.padded_size(self.num_slots, mesh)
    self.data_x = sharding.replicate(jnp.asarray(fed.dataset.train_x), mesh)
    self.data_y = sharding.replicate(jnp.asarray(fed.dataset.train_y, jnp.int32), mesh)
    # A sub-round is one round of the base algorithm: "exponential" decays per sub-round.
    self.learning_rate = opts.learning_rate.build(total, self.unit)
    self.phase = clients_lib.ClientPhase(self.loss_fn, algorithm, self.learning_rate,
                                         unroll=opts.unroll, augment=opts.augment,
                                         poison=opts.poison, client_devices=mesh.size,
                                         plan=self.plan)
    # Bits of each leaf of one client's uploads (block "leaf": additive over leaves, 5.12).
    self.leaf_bits = sum(compression.leaf_bits(self.compressor, self.traffic.upload_shapes[n])
                         for n in self.traffic.vector_uploads)
    # The slots are consumed by the window: donating them avoids a copy of m models.
    # Outputs keep the state's placement (slots split over clients, the rest replicated),
    # so window 2 reuses window 1's executable.
    replicated = sharding.replicated_sharding(mesh)
    clients = sharding.clients_sharding(mesh)
    state_shardings = FedLamaState(clients, *[replicated] * 5, clients, clients, clients)
    self.window_fn = local.jit_training(
        self._window, plan=self.plan, donate_argnums=(0,),
        out_shardings=(state_shardings, clients, replicated, replicated, replicated,
                       replicated, replicated))

  # ---- state ---------------------------------------------------------------------------
  def _fresh_opt_states(self, ctx: ClientContext):
    local_opt = self.algorithm.local
    if local_opt.init is None:
      return broadcast_clients(local_opt.tx.init(ctx.shared["params"]), self.slots_padded)
    return jax.vmap(local_opt.init_state, in_axes=(local.context_axes(),))(ctx)

  def init_state(self):
    m = self.slots_padded
    server = self.algorithm.server.init(self.params, self.model_state)
    template = ClientContext(self.algorithm.shared(server),
                             broadcast_clients(self.row_template, m), jnp.zeros(m), jnp.zeros(m, jnp.int32))
    slots = LocalState(broadcast_clients(self.params, m), broadcast_clients(self.model_state, m),
                       self._fresh_opt_states(template))
    num_layers = len(self.spec.sizes)
    # Copies: the window donates its state, which must never delete self.params.
    own = lambda t: jax.tree.map(jnp.copy, t)
    rest = sharding.replicate(own(
        (server, jnp.zeros(num_layers, jnp.float32),
         self.fixed if self.fixed is not None else self.base,
         jnp.zeros(num_layers, jnp.int32), jnp.zeros((), jnp.int32))), self.mesh)
    since = sharding.shard_clients(jnp.zeros((m, num_layers), jnp.float32), self.mesh)
    float_since = jnp.zeros((m, num_layers), jnp.result_type(float))
    state = FedLamaState(sharding.shard_clients(own(slots), self.mesh), *rest, since,
                         sharding.shard_clients(float_since, self.mesh),
                         sharding.shard_clients(jnp.copy(float_since), self.mesh))
    rows = {}
    if self.algorithm.row_init is not None:
      rows = self._new_store(self.row_template)
    out = {"fedlama": state, "rows": rows}
    agg_state = self.aggregation.init(self.params, self.traffic.upload_shapes)
    if agg_state:  # only a stage with state adds to the checkpointed state
      out["aggregation"] = sharding.replicate(agg_state, self.mesh)
    return out

  # ---- one window, jitted ----------------------------------------------------------------
  def _per_leaf(self, per_layer: jax.Array) -> object:
    """[..., L] per layer -> params-shaped pytree of [...] per leaf."""
    leaves = [per_layer[..., int(layer)] for layer in self.spec.leaf_to_layer]
    return jax.tree.unflatten(self.params_def, leaves)

  def _window(self, state: FedLamaState, rows, agg_state, data_x, data_y,
              cohorts: cohort_lib.Cohort, window, frozen):
    """cohorts: leaves [phi, C, unit, ...] (client fields [phi, C]). agg_state: the run
    stage's state, updated at every sub-round that synchronises some layer. frozen: the
    parameters outside the trainable set (ProgramBase), broadcast to every slot."""
    fl, alg = self.fl, self.algorithm
    mult = state.multipliers
    intervals = (mult * self.unit).astype(jnp.float32)
    slots, server, d, counts = state.slots, state.server, state.discrepancy, state.sync_counts
    since_steps, since_size, since_m = (state.since_steps, state.since_step_size,
                                        state.since_momentum)
    stats_sum = jnp.zeros(4)  # loss_sum, correct, count, unused
    window_scalars = {}  # the run stage's scalars of the window's last sub-round
    key = rng.round_key(self.opts.seed, rng.STREAM_TRAIN, window)
    for r in range(self.phi):  # static: phi sub-rounds, each a rolled scan inside
      c = jax.tree.map(lambda a: a[r], cohorts)
      sub_round = window * self.phi + r
      ctx = ClientContext(alg.shared(server), rows, c.num_examples, c.client_ids)
      if (self.opts.local_optimizer_state == "reset" and
          (r == 0 or fl.client_sampling == "round")):
        slots = slots._replace(opt_state=self._fresh_opt_states(ctx))
        since_m = jnp.zeros_like(since_m)  # no earlier gradient continues through momentum
      keys = rng.client_keys(key if fl.client_sampling == "window" else
                             rng.round_key(self.opts.seed, rng.STREAM_TRAIN, sub_round),
                             c.client_ids)
      step0 = window * self.window_steps + r * self.unit
      key_offset = r * self.unit if fl.client_sampling == "window" else 0
      # The window's first sub-round begins the clients' round: a personalized start
      # (Algorithm.start) puts their own layers in (every layer synchronised at the last
      # window's end, so the others are the server's).
      slots, st = self.phase.train(slots, ctx, data_x, data_y, c, keys, step0, key_offset,
                                   begins=r == 0, frozen=frozen)
      stats_sum = stats_sum + jnp.stack([jnp.sum(st.loss_sum), jnp.sum(st.correct),
                                         jnp.sum(st.count), 0.0])
      since_steps = since_steps + st.steps[:, None]
      if alg.local.rule is not None:
        # Each layer's effective step since its last sync continues from the unit momentum
        # accumulated since then (local.StepStats).
        since_size = since_size + st.effective_step[:, None] + st.carry_gain[:, None] * since_m
        since_m = st.unit_momentum[:, None] + st.unit_decay[:, None] * since_m
        step_size = self._per_leaf(since_size)
      else:  # no effective step (nan, as in synchronous rounds); the state stays finite
        step_size = self._per_leaf(jnp.full_like(since_size, jnp.nan))
      info = self.phase.info(st, c, step0)._replace(
          steps=self._per_leaf(since_steps), effective_step=step_size)
      uploads, new_rows = self.phase.finish(slots, ctx, info)
      agg = self.aggregation
      uploads = agg.decode(uploads, c.client_ids, sub_round)
      weights = reduce.client_weights(c.client_mask, c.num_examples, self.opts.weighting)
      sync = jnp.mod(r + 1, mult) == 0
      sync_leaf = self._per_leaf(sync)
      if not self.shared_leaf.all():  # personal leaves never synchronise
        sync_leaf = jax.tree.unflatten(self.params_def, [
            jnp.logical_and(m, bool(s)) for m, s in
            zip(jax.tree.leaves(sync_leaf), self.shared_leaf)])
      if MODEL_UPLOAD in uploads:
        moved = uploads[MODEL_UPLOAD]
      else:
        moved = jax.vmap(lambda p: jax.tree.map(jnp.subtract, p, server.params))(
            slots.params)
      d = layer_sync.layer_discrepancy(moved, weights, sync, intervals, d,
                                       self.spec.leaf_to_layer)
      # The run's stage sees the leaves synchronised now (the others as zeros; their
      # aggregates are discarded below); the discrepancy above measured the decoded uploads.
      uploads = agg.on_clients(uploads, c.client_ids, sub_round, agg_state,
                               leaf_mask=sync_leaf if agg.stage is not None else None)
      sums = agg.reduce(uploads, info, slots.model_state, weights, c.client_mask, agg_state,
                        sub_round)
      aggregates, new_agg_state, scalars = agg.finish(sums, self.fed.num_clients, agg_state,
                                                      sub_round)
      if r == self.phi - 1:
        # Multipliers are 1 or phi, so the last sub-round synchronises every layer: its
        # stage saw whole uploads, as a synchronous round's does. Earlier sub-rounds see
        # only the layers of multiplier 1 (zeros elsewhere): their scalars are not recorded.
        window_scalars = scalars
      agg_state = jax.tree.map(lambda a, b: jnp.where(jnp.any(sync), a, b), new_agg_state,
                               agg_state)
      new_server = alg.server.update(server, aggregates)
      server = leafwise.select_leafwise(sync_leaf, new_server._replace(
          model_state=server.model_state), server, self.params_def)
      if self.whole_rows:
        rows = new_rows
      else:
        rows = leafwise.select_leafwise(sync_leaf, new_rows, rows, self.params_def)
      counts = counts + (sync & self.synced_layer).astype(jnp.int32)
      params = jax.tree.map(lambda m, u, x: jnp.where(m, u[None], x), sync_leaf,
                                      server.params, slots.params)
      slots = slots._replace(params=params)
      since_steps = jnp.where(sync[None, :], 0.0, since_steps)
      since_size = jnp.where(sync[None, :], 0.0, since_size)
      since_m = jnp.where(sync[None, :], 0.0, since_m)
      if self.has_state and (fl.bn_stats_sync == "round" or
                             (fl.bn_stats_sync == "window" and r == self.phi - 1)):
        mean_stats = reduce.weighted_mean(slots.model_state, weights)
        slots = slots._replace(model_state=broadcast_clients(mean_stats, self.slots_padded))
    # After window-end averaging every slot holds the mean; with "never" slot 0's own
    # statistics are evaluated.
    server = server._replace(
        model_state=jax.tree.map(lambda s: s[0], slots.model_state))
    if self.fixed is not None:
      new_mult = self.fixed
    else:
      selected = self._select(d)
      new_mult = jnp.where(window >= fl.warmup_windows, selected, self.base).astype(jnp.int32)
    new_state = FedLamaState(slots, server, d, new_mult, counts, state.window + 1,
                             since_steps, since_size, since_m)
    return new_state, rows, agg_state, stats_sum, mult, sync, window_scalars

  def _select(self, d):
    """The next multipliers of the shared layers (Algorithm 1 over them alone); personal
    layers keep the base multiplier and never synchronise."""
    if self.shared_layer.all():
      return sel.select_intervals(d, jnp.asarray(self.spec.sizes), self.phi, self.rule,
                                  self.kernel_mask)
    idx = np.flatnonzero(self.shared_layer)
    if idx.size == 0:
      return self.base
    kernel_mask = None if self.kernel_mask is None else self.kernel_mask[idx]
    chosen = sel.select_intervals(d[idx], jnp.asarray(self.spec.sizes[idx]), self.phi,
                                  self.rule, kernel_mask)
    return self.base.at[idx].set(chosen)

  # ---- host side -------------------------------------------------------------------------
  def _pack_window(self, window: int) -> cohort_lib.Cohort:
    fl, opts = self.fl, self.opts
    if fl.client_sampling == "window":
      ids = opts.sampler.sample(window)
      full = pack(with_steps(opts, self.window_steps), self.fed, ids, window, self.slots_padded,
                  self.window_steps)
      idx = np.stack(np.split(full.indices, self.phi, axis=1))
      ex = np.stack(np.split(full.example_mask, self.phi, axis=1))
      sm = np.stack(np.split(full.step_mask, self.phi, axis=1))
      rep = lambda a: np.stack([a] * self.phi)
      return cohort_lib.Cohort(idx, ex, sm, rep(full.client_mask), rep(full.client_ids),
                              rep(full.num_examples))
    parts = []
    for r in range(self.phi):
      sub = window * self.phi + r
      ids = opts.sampler.sample(sub)
      parts.append(pack(with_steps(opts, self.unit), self.fed, ids, sub, self.slots_padded,
                        self.unit))
    return cohort_lib.Cohort(*[np.stack(x) for x in zip(*parts)])

  def run_round(self, state, window: int):
    cohorts = self._pack_window(window)
    n_real = int(cohorts.client_mask[0].sum())
    store = self._adopt_rows(state["rows"])
    ids, mask = cohorts.client_ids[0], cohorts.client_mask[0]
    rows = store.gather(ids) if store is not None else {}
    cohorts = sharding.shard_clients(cohorts, self.mesh, axis=1)
    fstate = state["fedlama"]
    mult = np.asarray(fstate.multipliers)
    counts_before = np.asarray(fstate.sync_counts)
    agg_state = state.get("aggregation", {})
    fstate, rows, agg_state, stats, _, _, scalars = self.window_fn(
        fstate, rows, agg_state, self.data_x, self.data_y, cohorts, window, self.frozen)
    if store is not None:
      store.scatter(ids, mask, rows)
    stats = np.asarray(stats)
    synced = np.asarray(fstate.sync_counts) - counts_before  # per layer, this window
    leaf_syncs = synced[self.spec.leaf_to_layer]
    up = leaf_syncs * self.traffic.up_per_leaf * n_real
    down = leaf_syncs * self.traffic.down_per_leaf * n_real
    relaxed = mult != np.asarray(self.base)
    total_steps = (window + 1) * self.window_steps
    comm_ratio = float(np.sum(self.spec.sizes * np.asarray(fstate.sync_counts))) / (
        total_steps / self.fl.base_interval * float(np.sum(self.spec.sizes)))
    # The curves the selection just walked (v1 Fig. 1 / AAAI Fig. 2), in walk order.
    # A diverged window's discrepancies are not finite: the run's divergence check stops it
    # after this window, so its curves are drawn from a finite stand-in.
    discrepancy = np.asarray(fstate.discrepancy)
    curves = sel.selection_curves(np.where(np.isfinite(discrepancy), discrepancy, 0.0),
                                  self.spec.sizes, self.rule, self.kernel_mask)
    extra = {"clients": n_real, **self.reporter.scalars(fstate.server),
             "fedlama_relaxed_layers": int(relaxed.sum()),
             "fedlama_discrepancy": np.asarray(fstate.discrepancy).tolist(),
             "fedlama_next_multipliers": np.asarray(fstate.multipliers).tolist(),
             "fedlama_curve_order": np.asarray(curves.order).tolist(),
             "fedlama_delta": np.asarray(curves.delta).tolist(),
             "fedlama_lambda": np.asarray(curves.lam).tolist(),
             "fedlama_relaxed_share": float(self.spec.sizes[relaxed].sum() / self.spec.sizes.sum()),
             "comm_ratio": comm_ratio,
             "bn_stat_floats": self._bn_floats(n_real)}
    # The run stage's scalars (aggregator_kept, aggregator_malicious, ...) of the window's
    # last sub-round, where every layer synchronises.
    extra.update(aggregation.stage_metrics(jax.device_get(scalars)))
    loss = stats[0] / stats[2] if stats[2] else 0.0
    bits_up = int(np.sum(leaf_syncs * self.leaf_bits)) * n_real
    new_state = {"fedlama": fstate, "rows": store.rows if store is not None else {}}
    if "aggregation" in state:
      new_state["aggregation"] = agg_state
    return new_state, RoundOutput(float(loss), float(stats[2]), up, down, None, extra,
                              bits_up=bits_up)

  def _bn_floats(self, n_real: int) -> int:
    fl = self.fl
    if not self.has_state or fl.bn_stats_sync == "never":
      return 0
    per = tree_size(self.model_state)
    return 2 * per * n_real * (self.phi if fl.bn_stats_sync == "round" else 1)

  def eval_params(self, state):
    server = state["fedlama"].server
    return self.whole(self.reporter.eval_params(server)), server.model_state

  def server_state(self, state):
    return state["fedlama"].server

  def local_steps_done(self, window: int) -> int:
    return (window + 1) * self.window_steps

  def summary(self, state, ledger) -> dict:
    del ledger
    fstate = state["fedlama"]
    counts = np.asarray(fstate.sync_counts)
    self._final_counts = counts
    total_steps = int(np.asarray(fstate.window)) * self.window_steps
    c_total = float(np.sum(self.spec.sizes * counts))
    c_ref = total_steps / self.fl.base_interval * float(np.sum(self.spec.sizes))
    return {
        "comm_ratio": c_total / c_ref if c_ref else None,
        "fedlama_layer_names": list(self.spec.names),
        "fedlama_layer_sizes": self.spec.sizes.tolist(),
        "fedlama_sync_counts": counts.tolist(),
        "fedlama_comm_cost": c_total,
        "fedlama_final_multipliers": np.asarray(fstate.multipliers).tolist(),
        "fedlama_window_steps": self.window_steps,
    }

  def plot(self, workdir, ledger) -> None:
    del ledger
    plots.fedlama_plots(workdir, list(self.spec.names), self.spec.sizes, self._final_counts,
                        self.rule)

  _final_counts = None
