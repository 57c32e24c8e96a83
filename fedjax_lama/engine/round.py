"""One synchronous round as two jitted calls: train a chunk of clients, update the server.

    sums, rows, stats = train_chunk(server, rows, data, cohort, key)   # per chunk
    server = server_update(server, sum of the chunks' sums)           # once

With one chunk (the default) a round is two dispatches whatever the number of
clients. Aggregates are (weighted sum, weight) pairs, so chunked, sharded and
single-call runs reduce the same quantities (architecture.md 2.2).
"""
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_lama import compress, rng
from fedjax_lama.algorithms.base import Algorithm
from fedjax_lama.engine import local, reduce
from fedjax_lama.tree import PyTree, broadcast_clients, tree_sub


class ServerState(NamedTuple):
  params: PyTree
  model_state: PyTree
  opt_state: PyTree


class Cohort(NamedTuple):
  """Device arrays of one packed cohort (see fedjax_lama.data.packing.CohortBatch)."""
  indices: jax.Array       # int32 [C, S, B]
  example_mask: jax.Array  # float32 [C, S, B]
  step_mask: jax.Array     # float32 [C, S]
  client_mask: jax.Array   # float32 [C]
  client_ids: jax.Array    # int32 [C]
  num_examples: jax.Array  # float32 [C]


class ChunkSums(NamedTuple):
  delta: PyTree        # sum_i w_i (y_i - x)
  model_state: PyTree  # sum_i w_i s_i
  weight: jax.Array    # sum_i w_i


class ClientStats(NamedTuple):
  loss_sum: jax.Array  # [C]
  correct: jax.Array   # [C]
  count: jax.Array     # [C]


def gather_rows(store: PyTree, client_ids: jax.Array) -> PyTree:
  return jax.tree_util.tree_map(lambda a: a[client_ids], store)


def scatter_rows(store: PyTree, client_ids: jax.Array, client_mask: jax.Array, rows: PyTree) -> PyTree:
  """Writes the rows of real clients; padded slots are dropped (index out of range)."""
  num = jax.tree_util.tree_leaves(store)[0].shape[0]
  ids = jnp.where(client_mask > 0, client_ids, num)
  return jax.tree_util.tree_map(lambda a, r: a.at[ids].set(r, mode="drop"), store, rows)


def make_round_fns(loss_fn: local.LossFn, algorithm: Algorithm, lr_schedule: Callable, *,
                   seed: int, weighting: str, local_steps: int, unroll=1,
                   augment: Optional[Callable] = None,
                   compressor: Optional[compress.Compressor] = None):
  """Returns (train_chunk, server_update), both jitted.

  compressor: applied to each client's update delta before aggregation (FedPAQ); None or
  the identity sends it as it is.
  """
  uplink_key = compress.base_key(seed)
  client_train = local.vmap_clients(local.make_client_train(
      loss_fn, algorithm.local_tx, lr_schedule, correction=algorithm.correction,
      augment=augment, unroll=unroll))

  def train_chunk(server: ServerState, rows, data_x, data_y, cohort: Cohort, round_idx):
    num = cohort.indices.shape[0]
    state = local.LocalState(
        broadcast_clients(server.params, num), broadcast_clients(server.model_state, num),
        broadcast_clients(algorithm.local_tx.init(server.params), num))
    keys = rng.client_keys(rng.round_key(seed, rng.STREAM_TRAIN, round_idx), cohort.client_ids)
    final, stats = client_train(state, server.params, rows, data_x, data_y, cohort.indices,
                                cohort.example_mask, cohort.step_mask, keys,
                                round_idx * local_steps, 0)
    weights = reduce.client_weights(cohort.client_mask, cohort.num_examples, weighting)
    deltas = jax.vmap(tree_sub, in_axes=(0, None))(final.params, server.params)
    if compressor is not None:
      deltas = compress.compress_clients(compressor, uplink_key, round_idx, cohort.client_ids,
                                         deltas)
    sums = ChunkSums(reduce.weighted_sum(deltas, weights),
                     reduce.weighted_sum(final.model_state, weights), jnp.sum(weights))
    new_rows = rows
    if algorithm.client_row_update is not None:
      new_rows = jax.vmap(algorithm.client_row_update, in_axes=(None, 0, 0))(
          server.params, final.params, rows)
    return sums, new_rows, ClientStats(stats.loss_sum, stats.correct, stats.count)

  def server_update(server: ServerState, sums: ChunkSums) -> ServerState:
    has = sums.weight > 0
    denom = jnp.where(has, sums.weight, 1.0)
    pseudo_grad = jax.tree_util.tree_map(lambda d: -d / denom, sums.delta)
    updates, opt_state = algorithm.server_tx.update(pseudo_grad, server.opt_state, server.params)
    params = optax.apply_updates(server.params, updates)
    model_state = jax.tree_util.tree_map(lambda s: s / denom, sums.model_state)
    new = ServerState(params, model_state, opt_state)
    # An empty cohort (Bernoulli sampling can draw none) leaves the server as it was.
    return jax.tree_util.tree_map(lambda a, b: jnp.where(has, a, b), new, server)

  return jax.jit(train_chunk), jax.jit(server_update)


def add_sums(a: ChunkSums, b: ChunkSums) -> ChunkSums:
  return jax.tree_util.tree_map(jnp.add, a, b)
