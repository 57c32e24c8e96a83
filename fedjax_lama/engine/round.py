"""One synchronous round of any algorithm, as pieces every round program shares.

    sums, rows, stats = train_chunk(server, rows, data, cohort, round)   # per chunk
    server = server_update(server, sum of the chunks' sums)             # once

`ClientPhase` runs the vmapped local scan and the algorithm's `finish` for a
group of clients, and decodes their uploads; `reduce_uploads` turns the uploads
into the algorithm's aggregates as (weighted sum, weight) pairs, so chunked,
sharded and single-call runs reduce the same quantities;
`aggregates` divides once; the algorithm's server update runs last. The
layer-wise schedule (fedjax_lama.fedlama) uses the same pieces with per-leaf
masks (`select_leafwise`).
"""
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lama import compression, rng
from fedjax_lama.engine import local, reduce
from fedjax_lama.engine.plan import PlatformPlan
from fedjax_lama.engine.algorithm import (MEAN, Aggregates, Algorithm, ClientContext, ClientInfo,
                                          LocalState, ServerState)
from fedjax_lama.tree import PyTree, broadcast_clients


class Cohort(NamedTuple):
  """Device arrays of one packed cohort (see fedjax_lama.data.packing.CohortBatch)."""
  indices: jax.Array       # int32 [C, S, B]
  example_mask: jax.Array  # float32 [C, S, B]
  step_mask: jax.Array     # float32 [C, S]
  client_mask: jax.Array   # float32 [C]
  client_ids: jax.Array    # int32 [C]
  num_examples: jax.Array  # float32 [C]


class ChunkSums(NamedTuple):
  """A round's aggregates before division: add chunks, divide once (`aggregates`)."""
  values: dict          # name -> sum_i a_i f_i (a_i = w_i for MEAN, the client mask for SUM)
  model_state: PyTree   # sum_i w_i s_i (BatchNorm statistics)
  weight: jax.Array     # sum_i w_i
  participants: jax.Array  # sum_i client_mask_i


class ClientStats(NamedTuple):
  loss_sum: jax.Array  # [C]
  correct: jax.Array   # [C]
  count: jax.Array     # [C]


def gather_rows(store: PyTree, client_ids: jax.Array) -> PyTree:
  return jax.tree.map(lambda a: a[client_ids], store)


def scatter_rows(store: PyTree, client_ids: jax.Array, client_mask: jax.Array, rows: PyTree) -> PyTree:
  """Writes the rows of real clients; padded slots are dropped (index out of range)."""
  num = jax.tree_util.tree_leaves(store)[0].shape[0]
  ids = jnp.where(client_mask > 0, client_ids, num)
  return jax.tree.map(lambda a, r: a.at[ids].set(r, mode="drop"), store, rows)


def client_contexts(shared, rows, cohort: "Cohort") -> ClientContext:
  """The contexts of a cohort's clients (leaves [C, ...]; `shared` as given)."""
  return ClientContext(shared, rows, cohort.num_examples, cohort.client_ids)


def fresh_state_axes(algorithm: Algorithm, shared_per_client: bool = False) -> LocalState:
  """Which fields of `fresh_states(..., batched=False)` have the client axis (0) and which
  are one value for every client (None): `local.vmap_clients`'s `state_axes`."""
  per_client_opt = algorithm.local.init is not None or shared_per_client
  return LocalState(0 if shared_per_client else None, None, 0 if per_client_opt else None)


def fresh_states(algorithm: Algorithm, ctx: ClientContext, model_state, num: int,
                 shared_per_client: bool = False, batched: bool = True) -> LocalState:
  """Every client starts its round at the downloaded model with a fresh local optimizer
  (local optimizer state "reset", the only rule synchronous rounds run).

  batched=False leaves the fields every client shares without the client axis
  (`fresh_state_axes` says which), for a ClientPhase built with those `state_axes`.
  """
  axes = fresh_state_axes(algorithm, shared_per_client)
  if axes.opt_state == 0:
    opt = jax.vmap(algorithm.local.init_state,
                   in_axes=(local.context_axes(shared_per_client),))(ctx)
  else:  # the same fresh state for everyone: built once
    opt = algorithm.local.tx.init(ctx.shared["params"])
  state = LocalState(ctx.shared["params"], model_state, opt)
  if not batched:
    return state
  return LocalState(*(broadcast_clients(v, num) if a is None else v
                      for v, a in zip(state, axes)))


class ClientPhase:
  """A group of clients' local training and finish, vectorized (callers jit).

    final, stats = phase.train(state, ctx, data_x, data_y, cohort, keys, step_offset, key_offset)
    info = phase.info(stats, cohort, step_offset)          # or a schedule's own per-leaf info
    uploads, rows = phase.finish(final, ctx, info, cohort.client_ids, compress_round)

  `uploads` are what the server decodes (the uplink compressor applied, keys per
  (compress_round, client id, upload, leaf)). `client_devices`: the devices the client axis
  is split over (the run's mesh size; default every device), `local.vmap_clients`.
  `plan`: the run's platform plan, whose client map and scan group bytes add the client
  axis (None: the default backend's choice); `client_map` says
  which map was taken ("vmap" or "scan").
  """

  def __init__(self, loss_fn: local.LossFn, algorithm: Algorithm, learning_rate: Callable, *,
               seed: int, unroll=1, augment: Optional[Callable] = None,
               compressor: Optional[compression.Compressor] = None,
               shared_per_client: bool = False, state_axes: Optional[LocalState] = None,
               client_devices: Optional[int] = None, plan: Optional[PlatformPlan] = None):
    self.algorithm, self.learning_rate = algorithm, learning_rate
    # The run's uplink compressor (registry.uplink_compressor); None: the identity.
    self.compressor = compressor
    self.client_map = local.resolve_client_map(plan.client_map if plan is not None else None)
    self._train = local.vmap_clients(
        local.make_client_train(loss_fn, algorithm, learning_rate, augment=augment, unroll=unroll),
        shared_per_client, client_map=self.client_map, state_axes=state_axes,
        devices=client_devices,
        scan_group_bytes=plan.scan_group_bytes if plan is not None else None)
    self._ctx_axes = local.context_axes(shared_per_client)
    self._uplink_key = compression.base_key(seed)

  def train(self, state: LocalState, ctx: ClientContext, data_x, data_y, cohort: "Cohort", keys,
            step_offset, key_offset=0, *, reduce_group: Optional[Callable] = None, extras=None):
    """(final, stats) stacked over the clients; with `reduce_group(final, stats, ctx,
    extras) -> (kept, sums)`, each group of clients is handed to it as it finishes and
    (kept stacked over the clients, sums added) is returned (`local.vmap_clients`)."""
    batch = local.ClientBatch(cohort.indices, cohort.example_mask, cohort.step_mask, keys)
    return self._train(state, ctx, data_x, data_y, batch, step_offset, key_offset,
                       reduce_group=reduce_group, extras=extras)

  def info(self, stats: local.StepStats, cohort: "Cohort", step_offset) -> ClientInfo:
    lr0 = jnp.broadcast_to(jnp.asarray(self.learning_rate(step_offset), jnp.result_type(float)),
                           cohort.client_ids.shape)
    return ClientInfo(stats.steps, stats.effective_step, lr0, cohort.num_examples,
                      cohort.client_ids)

  def finish(self, final: LocalState, ctx: ClientContext, info: ClientInfo, client_ids,
             compress_round) -> tuple[dict, PyTree]:
    uploads, rows = jax.vmap(self.algorithm.finish, in_axes=(0, self._ctx_axes, 0))(
        final, ctx, info)
    uploads = compression.compress_uploads(self.compressor, self._uplink_key, compress_round,
                                           client_ids, uploads)
    return uploads, rows


def client_stats(stats: local.StepStats) -> "ClientStats":
  return ClientStats(stats.loss_sum, stats.correct, stats.count)


def reduce_uploads(algorithm: Algorithm, uploads: dict, info: ClientInfo, model_state: PyTree,
                   weights: jax.Array, client_mask: jax.Array) -> ChunkSums:
  """The algorithm's reductions of a group's decoded uploads, as (sum, weight) pairs."""
  values = {}
  for name, red in algorithm.reductions_for(uploads).items():
    per_client = jax.vmap(red.fn)(uploads, info)
    values[name] = reduce.weighted_sum(per_client, weights if red.kind == MEAN else client_mask)
  return ChunkSums(values, reduce.weighted_sum(model_state, weights), jnp.sum(weights),
                   jnp.sum(client_mask))


def add_sums(a: ChunkSums, b: ChunkSums) -> ChunkSums:
  return jax.tree.map(jnp.add, a, b)


def aggregates(algorithm: Algorithm, sums: ChunkSums, population: int) -> Aggregates:
  """Divides the MEAN reductions once by the summed weight; SUM ones stay sums."""
  denom = jnp.where(sums.weight > 0, sums.weight, 1.0)
  values = {}
  for name, red in algorithm.reductions_for(sums.values).items():
    v = sums.values[name]
    values[name] = jax.tree.map(lambda s: s / denom, v) if red.kind == MEAN else v
  return Aggregates(values, sums.participants, population)


def mean_model_state(sums: ChunkSums) -> PyTree:
  denom = jnp.where(sums.weight > 0, sums.weight, 1.0)
  return jax.tree.map(lambda s: s / denom, sums.model_state)


def make_round_fns(loss_fn: local.LossFn, algorithm: Algorithm, learning_rate: Callable, *,
                   seed: int, weighting: str, local_steps: int, population: int, unroll=1,
                   augment: Optional[Callable] = None,
                   compressor: Optional[compression.Compressor] = None, jit: bool = True,
                   client_devices: Optional[int] = None, plan: Optional[PlatformPlan] = None):
  """Returns (train_chunk, server_update), both jitted, for a synchronous round.

  local_steps: the static step axis of a round (the global step count of round r's first
  step is r * local_steps, for the learning rate). population: N, for the
  algorithms' 1/N global means. seed may be traced and the learning rate may close over traced
  values when jit=False (several runs vmapped over a run axis, programs/vectorized.py).
  client_devices: the size of the mesh the client axis is split over (default every device).
  plan: the run's platform plan (client map, scan groups, compiler options; None: the
  default backend's).
  """
  phase = ClientPhase(loss_fn, algorithm, learning_rate, seed=seed, unroll=unroll,
                      augment=augment, compressor=compressor,
                      state_axes=fresh_state_axes(algorithm), client_devices=client_devices,
                      plan=plan)

  def train_chunk(server: ServerState, rows, data_x, data_y, cohort: Cohort, round_idx):
    num = cohort.indices.shape[0]
    ctx = client_contexts(algorithm.shared(server), rows, cohort)
    state = fresh_states(algorithm, ctx, server.model_state, num, batched=False)
    keys = rng.client_keys(rng.round_key(seed, rng.STREAM_TRAIN, round_idx), cohort.client_ids)
    step_offset = round_idx * local_steps
    weights = reduce.client_weights(cohort.client_mask, cohort.num_examples, weighting)

    def finish_and_reduce(final, stats, ctx, extras):
      # One group of clients at a time: the round keeps their rows and statistics and
      # only the sums of their uploads, never every client's final model.
      group, group_weights = extras
      info = phase.info(stats, group, step_offset)
      uploads, rows = phase.finish(final, ctx, info, group.client_ids, round_idx)
      sums = reduce_uploads(algorithm, uploads, info, final.model_state, group_weights,
                            group.client_mask)
      return (rows, client_stats(stats)), sums

    per_client = cohort._replace(indices=None, example_mask=None, step_mask=None)
    (rows, stats), sums = phase.train(state, ctx, data_x, data_y, cohort, keys, step_offset,
                                      reduce_group=finish_and_reduce,
                                      extras=(per_client, weights))
    return sums, rows, stats

  def server_update(server: ServerState, sums: ChunkSums) -> ServerState:
    new = algorithm.update_server(server, aggregates(algorithm, sums, population))
    new = new._replace(model_state=mean_model_state(sums))
    # An empty cohort (Bernoulli sampling can draw none) leaves the server as it was.
    has = sums.weight > 0
    return jax.tree.map(lambda a, b: jnp.where(has, a, b), new, server)

  if not jit:
    return train_chunk, server_update
  return local.jit_training(train_chunk, plan=plan), jax.jit(server_update)


# ---- per-leaf selection (layer-wise schedules) -------------------------------------------------
def params_shaped_subtrees(tree: PyTree, params_def) -> tuple[list, object]:
  """Flattens `tree` with every params-shaped subtree as one leaf."""
  return jax.tree_util.tree_flatten(
      tree, is_leaf=lambda node: jax.tree_util.tree_structure(node) == params_def)


def non_leafwise_parts(tree: PyTree, params: PyTree) -> list[str]:
  """Paths of the array leaves of `tree` that are not inside a params-shaped subtree."""
  params_def = jax.tree_util.tree_structure(params)
  flat, _ = jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda node: jax.tree_util.tree_structure(node) == params_def)
  return [jax.tree_util.keystr(path) for path, node in flat
          if jax.tree_util.tree_structure(node) != params_def]


def select_leafwise(leaf_mask: PyTree, new: PyTree, old: PyTree, params_def) -> PyTree:
  """new where the (params-shaped) leaf mask is set, old elsewhere, for every params-shaped
  subtree of a state (server extras, optimizer states, rows). Leaves outside such subtrees
  must not exist (checked when a schedule is built, `non_leafwise_parts`)."""
  new_parts, treedef = params_shaped_subtrees(new, params_def)
  old_parts = treedef.flatten_up_to(old)
  mask_leaves = jax.tree_util.tree_leaves(leaf_mask)
  out = []
  for n, o in zip(new_parts, old_parts):
    n_leaves, n_def = jax.tree_util.tree_flatten(n)
    o_leaves = n_def.flatten_up_to(o)
    out.append(jax.tree_util.tree_unflatten(n_def, [
        jnp.where(m, a, b) for m, a, b in zip(mask_leaves, n_leaves, o_leaves)]))
  return jax.tree_util.tree_unflatten(treedef, out)


# ---- static description of an algorithm's traffic ---------------------------------------------
class Traffic(NamedTuple):
  """Per participating client and round, from the algorithm's declaration."""
  up_per_leaf: np.ndarray    # floats of params-shaped uploads, per params leaf
  up_other: int              # floats of other uploads (scalars: FedNova's ||a_i||_1)
  down_per_leaf: np.ndarray  # floats of params-shaped downloads, per params leaf
  down_other: int
  vector_uploads: tuple      # names of the compressible uploads
  scalar_floats: int         # floats of all-scalar uploads (32 bits each, never compressed)
  upload_shapes: dict        # name -> ShapeDtypeStruct pytree (one client)


def _size(tree) -> int:
  return int(sum(np.prod(np.shape(x), dtype=np.int64) for x in jax.tree_util.tree_leaves(tree)))


def traffic(algorithm: Algorithm, server: ServerState, row: PyTree) -> Traffic:
  """What one client sends and receives, from the shapes of `finish` and the downloads."""
  shared = algorithm.shared(server)
  f32 = jax.ShapeDtypeStruct((), jnp.float32)
  i32 = jax.ShapeDtypeStruct((), jnp.int32)
  ctx = ClientContext(shared, row, f32, i32)
  info = ClientInfo(f32, f32, f32, f32, i32)

  def one_client(ctx, info):
    state = LocalState(ctx.shared["params"], server.model_state, algorithm.local.init_state(ctx))
    return algorithm.finish(state, ctx, info)

  uploads, _ = jax.eval_shape(one_client, ctx, info)
  params_def = jax.tree_util.tree_structure(server.params)
  leaf_sizes = np.array([np.prod(np.shape(x), dtype=np.int64)
                         for x in jax.tree_util.tree_leaves(server.params)], np.int64)

  def split(trees):
    per_leaf, other = np.zeros_like(leaf_sizes), 0
    for tree in trees:
      if jax.tree_util.tree_structure(tree) == params_def:
        per_leaf = per_leaf + leaf_sizes
      else:
        other += _size(tree)
    return per_leaf, other

  up_leaf, up_other = split(uploads.values())
  down_leaf, down_other = split(shared.values())
  scalars = tuple(n for n, v in uploads.items() if compression.is_scalar_upload(v))
  return Traffic(up_leaf, up_other, down_leaf, down_other,
                 tuple(n for n in uploads if n not in scalars),
                 sum(_size(uploads[n]) for n in scalars), uploads)


def uplink_bits(traffic_: Traffic, compressor: Optional[compression.Compressor]) -> int:
  """Bits one client sends per round: compressed vector uploads + 32 per scalar."""
  comp = compressor if compressor is not None else compression.identity()
  return int(sum(comp.bits(traffic_.upload_shapes[n]) for n in traffic_.vector_uploads)
             + 32 * traffic_.scalar_floats)
