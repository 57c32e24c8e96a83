"""FedLAMA: layer-wise adaptive aggregation intervals, as a round program.

S. Lee, T. Zhang, S. Avestimehr, "Layer-wise Adaptive Model Aggregation for
Scalable Federated Learning", AAAI 2023 (shared/seeds/001_fc2c573c21b85f9f.txt,
Algorithm 2); arXiv v1 (shared/seeds/000_d0c84dec6fe26f1e.txt, Algorithm 1).
Specification and decisions: algorithms.md 1.2.4 (one window step by step) and
1.4 (D1-D25).

One program "round" is one window of W = phi * unit local steps, run as ONE
jitted call: phi sub-rounds of `unit` steps of the vmapped local scan over the
slots, each followed by the layer-masked mean (sync mask r mod m_l == 0), then
the normalisation statistics, then the interval selection for the next window.
Slots (the vmapped client axis) keep their unsynchronised layers, optimiser
state and running statistics across sub-rounds.

Equivalences (tests): phi = 1 is FedAvg(tau'); fixed multipliers phi for every
layer is FedAvg(phi tau') -- the window's batches and keys are those of one
FedAvg round of W steps, because the window is packed as one span of W steps.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lama import compress, federation, layers, programs, rng
from fedjax_lama.config import ConfigError
from fedjax_lama.data import augment
from fedjax_lama.algorithms import interval_selection as sel
from fedjax_lama.engine import evaluate, layer_sync, local, reduce, round as round_lib, sharding
from fedjax_lama.tree import broadcast_clients


class FedLamaState(NamedTuple):
  slots: local.LocalState   # leaves [m, ...]
  global_params: object     # u
  global_stats: object      # global BatchNorm statistics
  discrepancy: jax.Array    # d [L]
  multipliers: jax.Array    # int32 [L], for the next window
  sync_counts: jax.Array    # int32 [L], c_l (Eq. 8)
  window: jax.Array         # int32, windows completed


class FedLamaProgram:
  """Windows of phi sub-rounds with layer-wise synchronisation (algorithms.md 1.2.4)."""

  def __init__(self, config, model, params, model_state, fed, mesh):
    f = config.fedlama
    self.config, self.fed, self.mesh = config, fed, mesh
    self.phi, self.rule = int(f.phi), f.interval_rule
    self.unit = sel.interval_unit(f.base_interval, self.phi, self.rule)
    self.window_steps = sel.window_length(f.base_interval, self.phi, self.rule)
    total = f.total_steps or config.rounds * self.window_steps
    if total % self.window_steps:
      raise ConfigError(
          f"config.fedlama.total_steps={total} is not accepted; accepted: a multiple of the "
          f"window length phi*unit={self.window_steps}")
    self.num_rounds = total // self.window_steps
    self.eval_every = config.eval_every
    self.spec = layers.layer_spec(params, f.layer_granularity)
    kernels_only = f.kernels_only if f.kernels_only is not None else self.rule == "code"
    self.kernel_mask = jnp.asarray(self.spec.is_kernel) if kernels_only else None
    self.base = jnp.asarray(sel.base_multipliers(len(self.spec.sizes), self.phi, self.rule),
                            jnp.int32)
    self.fixed = None
    if f.fixed_multipliers is not None:
      fixed = np.broadcast_to(np.asarray(f.fixed_multipliers, np.int32), self.base.shape)
      if not np.all((fixed == 1) | (fixed == self.phi)):
        raise ConfigError(
            f"config.fedlama.fixed_multipliers={f.fixed_multipliers!r} is not accepted; accepted: "
            f"1 or phi={self.phi} per layer ({len(self.spec.sizes)} layers)")
      self.fixed = jnp.asarray(fixed)
    self.has_state = bool(jax.tree_util.tree_leaves(model_state))
    self.algorithm = self._local_algorithm(config, params)
    self.num_slots = federation.cohort_size(config, fed.num_clients)
    self.slots_padded = sharding.padded_size(self.num_slots, mesh)
    self.params, self.model_state = params, model_state
    self.data_x = sharding.replicate(jnp.asarray(fed.dataset.train_x), mesh)
    self.data_y = sharding.replicate(jnp.asarray(fed.dataset.train_y, jnp.int32), mesh)
    self.eval_fn = evaluate.make_eval_fn(model, self.has_state)
    loss_fn = local.make_loss_fn(model, self.has_state, config.label_smoothing)
    schedule = programs.make_lr_schedule(config, total)
    self.client_train = local.vmap_clients(local.make_client_train(
        loss_fn, self.algorithm.local_tx, schedule, correction=self.algorithm.correction,
        augment=augment.from_config(config, fed.dataset), unroll=config.engine.unroll))
    # FedPAQ + FedLAMA (AAAI Table 4b): synchronised leaves travel as Q(x_i - u).
    self.compressor = compress.from_config(config)
    self.uplink_key = compress.base_key(config.seed)
    self.leaf_bits = compress.leaf_bits(self.compressor, params)
    # The slots are consumed by the window: donating them avoids a copy of m models.
    # Outputs keep the state's placement (slots split over clients, the rest replicated),
    # so window 2 reuses window 1's executable.
    replicated = sharding.replicated_sharding(mesh)
    state_shardings = FedLamaState(sharding.clients_sharding(mesh), *[replicated] * 6)
    self.window_fn = jax.jit(self._window, donate_argnums=(0,),
                             out_shardings=(state_shardings, replicated, replicated, replicated))

  @staticmethod
  def _local_algorithm(config, params):
    """The local optimiser FedLAMA schedules: FedAvg's SGD, or FedProx (AAAI Table 4a)."""
    name = config.fedlama.local_algorithm
    sub = config.copy_and_resolve_references()
    with sub.unlocked():
      sub.algorithm = name
    return programs.build_algorithm(sub, params)

  # ---- state ---------------------------------------------------------------------------
  def init_state(self) -> FedLamaState:
    m = self.slots_padded
    slots = local.LocalState(broadcast_clients(self.params, m),
                             broadcast_clients(self.model_state, m),
                             broadcast_clients(self.algorithm.local_tx.init(self.params), m))
    num_layers = len(self.spec.sizes)
    # Copies: the window donates its state, which must never delete self.params.
    own = lambda t: jax.tree_util.tree_map(jnp.copy, t)
    rest = sharding.replicate(own(
        (self.params, self.model_state, jnp.zeros(num_layers, jnp.float32),
         self.fixed if self.fixed is not None else self.base,
         jnp.zeros(num_layers, jnp.int32), jnp.zeros((), jnp.int32))), self.mesh)
    return FedLamaState(sharding.shard_clients(slots, self.mesh), *rest)

  # ---- one window, jitted ----------------------------------------------------------------
  def _window(self, state: FedLamaState, data_x, data_y, cohorts: round_lib.Cohort, window):
    """cohorts: leaves [phi, C, unit, ...] (client fields [phi, C])."""
    f = self.config.fedlama
    mult = state.multipliers
    intervals = (mult * self.unit).astype(jnp.float32)
    slots, u, d, counts = state.slots, state.global_params, state.discrepancy, state.sync_counts
    stats_sum = jnp.zeros(4)  # loss_sum, correct, count, unused
    key = rng.round_key(self.config.seed, rng.STREAM_TRAIN, window)
    for r in range(self.phi):  # static: phi sub-rounds, each a rolled scan inside
      c = jax.tree_util.tree_map(lambda a: a[r], cohorts)
      if f.opt_state_policy == "reset_on_sample" and (r == 0 or f.client_sampling == "round"):
        fresh = broadcast_clients(self.algorithm.local_tx.init(self.params), self.slots_padded)
        slots = slots._replace(opt_state=fresh)
      keys = rng.client_keys(key if f.client_sampling == "window" else
                             rng.round_key(self.config.seed, rng.STREAM_TRAIN,
                                           window * self.phi + r), c.client_ids)
      step0 = window * self.window_steps + r * self.unit
      key_offset = r * self.unit if f.client_sampling == "window" else 0
      slots, st = self.client_train(slots, u, {}, data_x, data_y, c.indices, c.example_mask,
                                    c.step_mask, keys, step0, key_offset)
      stats_sum = stats_sum + jnp.stack([jnp.sum(st.loss_sum), jnp.sum(st.correct),
                                         jnp.sum(st.count), 0.0])
      weights = reduce.client_weights(c.client_mask, c.num_examples, self.config.weighting)
      sync = jnp.mod(r + 1, mult) == 0
      sent = self._uplink(slots.params, u, sync, window * self.phi + r, c.client_ids)
      params, u, d = layer_sync.layer_masked_mean(sent, weights, sync, intervals, d, u,
                                                  self.spec.leaf_to_layer)
      counts = counts + sync.astype(jnp.int32)
      slots = slots._replace(params=params)
      if self.has_state and (f.bn_stats_sync == "round" or
                             (f.bn_stats_sync == "window" and r == self.phi - 1)):
        mean_stats = reduce.weighted_mean(slots.model_state, weights)
        slots = slots._replace(model_state=broadcast_clients(mean_stats, self.slots_padded))
    # After window-end averaging every slot holds the mean; with "never" slot 0's own
    # statistics are evaluated (D10).
    global_stats = jax.tree_util.tree_map(lambda s: s[0], slots.model_state)
    if self.fixed is not None:
      new_mult = self.fixed
    else:
      selected = sel.select_intervals(d, jnp.asarray(self.spec.sizes), self.phi, self.rule,
                                      self.kernel_mask)
      new_mult = jnp.where(window >= f.warmup_windows, selected, self.base).astype(jnp.int32)
    new_state = FedLamaState(slots, u, global_stats, d, new_mult, counts, state.window + 1)
    return new_state, stats_sum, mult, sync

  def _uplink(self, local_params, u, sync, sub_round, client_ids):
    """What the server receives of each slot's layers: x_i itself (identity), or for the
    layers due now u + Q(x_i - u) with per (sub-round, client, leaf) draws (algorithms.md
    5.12 "With FedLAMA"). The discrepancy d_l is then measured on what the server holds.
    Layers not due keep the slot's own copy (it is not sent)."""
    if self.compressor.name == "identity":
      return local_params
    deltas = jax.tree_util.tree_map(lambda x, g: x - g[None], local_params, u)
    decoded = compress.compress_clients(self.compressor, self.uplink_key, sub_round, client_ids,
                                        deltas)
    leaves, treedef = jax.tree_util.tree_flatten(local_params)
    out = [jnp.where(sync[layer], g[None] + q, x) for x, g, q, layer in zip(
        leaves, treedef.flatten_up_to(u), treedef.flatten_up_to(decoded),
        self.spec.leaf_to_layer)]
    return jax.tree_util.tree_unflatten(treedef, out)

  # ---- host side -------------------------------------------------------------------------
  def _pack_window(self, window: int) -> round_lib.Cohort:
    f = self.config.fedlama
    cfg, n = self.config, self.fed.num_clients
    if f.client_sampling == "window":
      ids = federation.sample_round(cfg, n, window)
      full = programs.pack(_steps_config(cfg, self.window_steps), self.fed, ids, window,
                           self.slots_padded, self.window_steps)
      idx = np.stack(np.split(full.indices, self.phi, axis=1))
      ex = np.stack(np.split(full.example_mask, self.phi, axis=1))
      sm = np.stack(np.split(full.step_mask, self.phi, axis=1))
      rep = lambda a: np.stack([a] * self.phi)
      return round_lib.Cohort(idx, ex, sm, rep(full.client_mask), rep(full.client_ids),
                              rep(full.num_examples))
    parts = []
    for r in range(self.phi):
      sub = window * self.phi + r
      ids = federation.sample_round(cfg, n, sub)
      parts.append(programs.pack(_steps_config(cfg, self.unit), self.fed, ids, sub,
                                 self.slots_padded, self.unit))
    return round_lib.Cohort(*[np.stack(x) for x in zip(*parts)])

  def run_round(self, state: FedLamaState, window: int):
    cohorts = self._pack_window(window)
    n_real = int(cohorts.client_mask[0].sum())
    cohorts = sharding.shard_clients(cohorts, self.mesh, axis=1)
    mult = np.asarray(state.multipliers)
    counts_before = np.asarray(state.sync_counts)
    state, stats, _, _ = self.window_fn(state, self.data_x, self.data_y, cohorts, window)
    stats = np.asarray(stats)
    synced = np.asarray(state.sync_counts) - counts_before  # per layer, this window
    per_layer = synced * self.spec.sizes * n_real
    # Per-layer floats into the ledger's per-leaf layout (tensor granularity: identical).
    leaf_floats = self._per_leaf(per_layer)
    relaxed = mult != np.asarray(self.base)
    total_steps = (window + 1) * self.window_steps
    comm_ratio = float(np.sum(self.spec.sizes * np.asarray(state.sync_counts))) / (
        total_steps / self.config.fedlama.base_interval * float(np.sum(self.spec.sizes)))
    # The curves the selection just walked (v1 Fig. 1 / AAAI Fig. 2), in walk order.
    curves = sel.selection_curves(np.asarray(state.discrepancy), self.spec.sizes, self.rule,
                                  self.kernel_mask)
    extra = {"clients": n_real, "fedlama_relaxed_layers": int(relaxed.sum()),
             "fedlama_discrepancy": np.asarray(state.discrepancy).tolist(),
             "fedlama_next_multipliers": np.asarray(state.multipliers).tolist(),
             "fedlama_curve_order": np.asarray(curves.order).tolist(),
             "fedlama_delta": np.asarray(curves.delta).tolist(),
             "fedlama_lambda": np.asarray(curves.lam).tolist(),
             "fedlama_relaxed_share": float(self.spec.sizes[relaxed].sum() / self.spec.sizes.sum()),
             "comm_ratio": comm_ratio,
             "bn_stat_floats": self._bn_floats(n_real)}
    loss = stats[0] / stats[2] if stats[2] else 0.0
    leaf_syncs = synced[self.spec.leaf_to_layer]
    bits_up = int(np.sum(leaf_syncs * self.leaf_bits)) * n_real
    return state, programs.RoundOutput(float(loss), float(stats[2]), leaf_floats, leaf_floats,
                                       None, extra, bits_up=bits_up)

  def _per_leaf(self, per_layer: np.ndarray) -> np.ndarray:
    """Splits per-unit floats over the unit's leaves in proportion to their sizes."""
    leaf_sizes = np.array([int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(self.params)])
    unit_sizes = self.spec.sizes[self.spec.leaf_to_layer]
    return per_layer[self.spec.leaf_to_layer] * leaf_sizes // np.maximum(unit_sizes, 1)

  def _bn_floats(self, n_real: int) -> int:
    f = self.config.fedlama
    if not self.has_state or f.bn_stats_sync == "never":
      return 0
    per = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(self.model_state))
    return 2 * per * n_real * (self.phi if f.bn_stats_sync == "round" else 1)

  def eval_params(self, state: FedLamaState):
    return state.global_params, state.global_stats

  def local_steps_done(self, window: int) -> int:
    return (window + 1) * self.window_steps

  def host_state(self) -> dict:
    return {}

  def load_host_state(self, d: dict) -> None:
    del d

  def summary(self, state: FedLamaState, ledger) -> dict:
    counts = np.asarray(state.sync_counts)
    self._final_counts = counts
    total_steps = int(np.asarray(state.window)) * self.window_steps
    c_total = float(np.sum(self.spec.sizes * counts))
    c_ref = total_steps / self.config.fedlama.base_interval * float(np.sum(self.spec.sizes))
    return {
        "comm_ratio": c_total / c_ref if c_ref else None,
        "fedlama_layer_names": list(self.spec.names),
        "fedlama_layer_sizes": self.spec.sizes.tolist(),
        "fedlama_sync_counts": counts.tolist(),
        "fedlama_comm_cost": c_total,
        "fedlama_final_multipliers": np.asarray(state.multipliers).tolist(),
        "fedlama_window_steps": self.window_steps,
    }

  def plot(self, workdir, ledger) -> None:
    del ledger
    plot_layer_comm(workdir, self.spec.sizes, self._final_counts)
    plot_selection_curves(workdir, self.rule)

  _final_counts = None


def _steps_config(config, steps):
  c = config.copy_and_resolve_references()
  with c.unlocked():
    c.local_steps, c.local_epochs = steps, 0
  return c


def plot_layer_comm(workdir, sizes, counts):
  """Per-layer sync counts and communicated floats (AAAI Figures 4 and 5)."""
  if counts is None:
    return
  import os  # pylint: disable=g-import-not-at-top
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  counts = np.asarray(counts)
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), dpi=100)
  axes[0].bar(np.arange(len(counts)), counts)
  axes[0].set_xlabel("layer")
  axes[0].set_ylabel("synchronisations c_l")
  axes[1].bar(np.arange(len(counts)), counts * np.asarray(sizes))
  axes[1].set_xlabel("layer")
  axes[1].set_ylabel("floats communicated s_l * c_l")
  axes[1].set_yscale("log")
  fig.tight_layout()
  fig.savefig(os.path.join(workdir, "fedlama_layer_comm.png"))
  plt.close(fig)


def plot_selection_curves(workdir, rule):
  """delta_k and 1 - lambda_k against k at the logged window ends (v1 Fig. 1, AAAI Fig. 2).

  For "aaai" the layers left of the crossing get the long interval."""
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return
  with open(path) as f:
    records = [r for r in map(json.loads, f) if r.get("fedlama_delta")]
  if not records:
    return
  picks = records if len(records) <= 4 else [records[i] for i in
                                             np.linspace(0, len(records) - 1, 4).astype(int)]
  fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
  for r in picks:
    k = np.arange(1, len(r["fedlama_delta"]) + 1)
    line, = ax.plot(k, r["fedlama_delta"], label=f"delta, step {r['local_steps']}")
    other = (np.asarray(r["fedlama_lambda"]) if rule in ("v1", "accelerate")
             else 1 - np.asarray(r["fedlama_lambda"]))
    ax.plot(k, other, "--", color=line.get_color(),
            label=("lambda" if rule in ("v1", "accelerate") else "1 - lambda") +
            f", step {r['local_steps']}")
  ax.set_xlabel("k (layers in the rule's order)")
  ax.set_ylabel("fraction")
  ax.set_title(f"FedLAMA selection curves (rule {rule!r})")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(workdir, "fedlama_curves.png"))
  plt.close(fig)
