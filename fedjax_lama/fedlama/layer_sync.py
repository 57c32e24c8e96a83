"""Weighted means over the client axis, whole-model and layer-masked.

`layer_masked_mean` is FedLAMA's aggregation primitive (Lee et al., AAAI 2023, Algorithm 2):
layers whose sync flag is set are averaged over the client (slot) axis and
their unit discrepancy d_l (Eq. 2) is measured; every other layer keeps each
client's copy bit for bit. With every flag set it equals FedAvg's
`reduce.weighted_mean` broadcast to all clients, bit for bit when both run the same
way (both jitted, or both op by op: XLA's fusion can change the last bit). FedAvg's
`weighted_mean` itself is engine/reduce.py's.

Conventions shared by both functions:
- `stacked` is a params pytree whose leaves have a leading client axis C
  (possibly sharded over devices). Only elementwise ops, `jnp.where`, row sums
  and dots over axis 0 (`reduce.client_sum`) are used, so jit/GSPMD turn the
  client-axis reductions into the only cross-device collectives; there is no Python loop over clients (only over
  leaves, which is static).
- `weights` [C] are >= 0 with a positive sum; they are normalised inside as
  sum_i w_i x_i / sum_i w_i ("divide once at the end"). Rows with weight 0
  (padded clients) are masked out before multiplying, so even NaN/inf garbage
  in them cannot leak into the mean or into d. After `layer_masked_mean` their
  rows of synced layers hold the mean like every other row; rows of unsynced
  layers are left as they were.
- Means and squared distances are accumulated in at least float32 and cast
  back to each leaf's dtype.
"""

from typing import Any, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lama import tree as tree_lib
from fedjax_lama.engine import reduce

PyTree = Any  # A params pytree; "stacked" means leaves carry a client axis.


_acc_dtype = reduce.acc_dtype


def _leaf_mean(x: jax.Array, w: jax.Array, total: jax.Array) -> jax.Array:
  """sum_i w_i x_i / sum_i w_i over axis 0, in the accumulation dtype."""
  acc = _acc_dtype(x.dtype)
  return reduce.client_sum(x.astype(acc), w.astype(acc)) / total.astype(acc)


def _leaf_sq_dist(x: jax.Array, mean: jax.Array, w: jax.Array,
                  total: jax.Array) -> jax.Array:
  """sum_i w_i ||mean - x_i||^2 / sum_i w_i, padded rows excluded."""
  acc = mean.dtype
  diff = x.astype(acc) - mean
  per_client = jnp.sum(jnp.square(diff), axis=tuple(range(1, x.ndim)))
  w = w.astype(acc)
  return jnp.sum(jnp.where(w > 0, w * per_client, 0)) / total.astype(acc)


_check_weights = reduce.check_client_weights


def _check_leaf_to_layer(leaf_to_layer: Any, num_leaves: int,
                         num_layers: int) -> np.ndarray:
  """leaf_to_layer must be static (numpy) and index into the L layers."""
  if isinstance(leaf_to_layer, jax.core.Tracer):
    raise ValueError(
        "leaf_to_layer must be a static numpy int array (e.g. "
        "LayerSpec.leaf_to_layer), not a traced value")
  l2l = np.asarray(leaf_to_layer)
  if (l2l.shape != (num_leaves,) or not np.issubdtype(l2l.dtype, np.integer)
      or (num_leaves and (l2l.min() < 0 or l2l.max() >= num_layers))):
    raise ValueError(
        f"leaf_to_layer must be an int array of shape ({num_leaves},) with "
        f"values in [0, {num_layers}); got shape {l2l.shape}, dtype "
        f"{l2l.dtype}")
  return l2l.astype(np.int64)


def _layer_sizes(leaves: list, l2l: np.ndarray, num_layers: int) -> np.ndarray:
  """s_l: scalars per layer of one client (leading axis excluded)."""
  sizes = np.zeros(num_layers, dtype=np.int64)
  np.add.at(sizes, l2l, tree_lib.leaf_sizes(leaves, batch_axes=1))
  return sizes


def layer_masked_mean(
    stacked: PyTree,
    weights: Any,
    sync_mask: Any,
    intervals: Any,
    prev_discrepancy: Any,
    prev_global: PyTree,
    leaf_to_layer: np.ndarray,
) -> Tuple[PyTree, PyTree, jax.Array]:
  """Layer-masked aggregation with discrepancy measurement (Lee et al., AAAI 2023, Algorithm 2).

  Args:
    stacked: params pytree, leaves [C, ...] (the clients' local copies x^i).
    weights: [C], >= 0 with a positive sum (0 for padded clients).
    sync_mask: bool [L], which layers synchronise now.
    intervals: [L], tau_l in local steps: the interval that has just elapsed
      for each layer (used only for synced layers).
    prev_discrepancy: float [L], d from the previous synchronisations.
    prev_global: params pytree without the client axis, u (last synced values).
    leaf_to_layer: static numpy int [num_leaves], the unit of each leaf in
      tree_util leaf order (`layers.LayerSpec.leaf_to_layer`).

  Returns:
    (new_stacked, new_global, discrepancy). For a synced layer l:
    u_l = weighted mean, every client's copy (padded rows included) becomes
    u_l, and d_l = sum_i w_i ||u_l - x_l^i||^2 / (sum_i w_i * tau_l * s_l),
    measured before the copies are overwritten, summed over all leaves of the
    unit. For an unsynced layer: copies untouched bit for bit,
    u_l = prev_global, d_l = prev_discrepancy[l]. The discrepancy has the
    dtype of prev_discrepancy.
  """
  leaves, treedef = jax.tree.flatten(stacked)
  try:
    g_leaves = treedef.flatten_up_to(prev_global)
  except (ValueError, TypeError) as e:
    raise ValueError(
        "prev_global must have the tree structure of stacked (without the "
        f"client axis): {e}") from e
  mask = jnp.asarray(sync_mask, dtype=bool)
  prev_d = jnp.asarray(prev_discrepancy)
  tau = jnp.asarray(intervals)
  num_layers = mask.shape[0] if mask.ndim == 1 else -1
  if mask.ndim != 1 or tau.shape != mask.shape or prev_d.shape != mask.shape:
    raise ValueError(
        "sync_mask, intervals and prev_discrepancy must all have shape (L,); "
        f"got {mask.shape}, {tau.shape}, {prev_d.shape}")
  l2l = _check_leaf_to_layer(leaf_to_layer, len(leaves), num_layers)
  w = _check_weights(weights, leaves)
  total = jnp.sum(w)
  if not isinstance(total, jax.core.Tracer) and not float(total) > 0:
    raise ValueError(f"weights sum to {float(total)}; accepted: weights >= 0 with a positive "
                     "sum (at least one client with weight > 0)")

  new_x, new_u, sq = [], [], []
  for x, u, layer in zip(leaves, g_leaves, l2l):
    mean = _leaf_mean(x, w, total)
    sq.append(_leaf_sq_dist(x, mean, w, total))
    sync = mask[layer]
    new_x.append(jnp.where(sync, mean.astype(x.dtype)[None], x))
    new_u.append(jnp.where(sync, mean.astype(u.dtype), u))

  d = _per_layer_discrepancy(sq, l2l, leaves, mask, tau, prev_d)
  return (jax.tree.unflatten(treedef, new_x),
          jax.tree.unflatten(treedef, new_u), d)


def _per_layer_discrepancy(sq: list, l2l: np.ndarray, leaves: list, mask, tau, prev_d):
  """Sums the per-leaf squared distances into units and divides by tau_l * s_l."""
  num_layers = mask.shape[0]
  acc = _acc_dtype(prev_d.dtype)
  sizes = np.maximum(_layer_sizes(leaves, l2l, num_layers), 1)
  sq_layer = jnp.zeros((num_layers,), acc)
  if leaves:
    sq_layer = sq_layer.at[l2l].add(jnp.stack(sq).astype(acc))
  fresh = sq_layer / (tau.astype(acc) * jnp.asarray(sizes, dtype=acc))
  return jnp.where(mask, fresh.astype(prev_d.dtype), prev_d)


def layer_discrepancy(stacked: PyTree, weights: Any, sync_mask: Any, intervals: Any,
                      prev_discrepancy: Any, leaf_to_layer: np.ndarray) -> jax.Array:
  """d_l of Eq. 2 for the synced layers, prev_discrepancy for the others.

  d_l = sum_i w_i ||x_l^i - mean_l||^2 / (sum_i w_i * tau_l * s_l), measured on any
  per-client quantity that differs from the clients' models by a common offset (the
  models themselves, or their displacements y_i - u from the last synchronised value,
  which is what an algorithm uploads). Same conventions as `layer_masked_mean`.
  """
  leaves = jax.tree.leaves(stacked)
  mask = jnp.asarray(sync_mask, dtype=bool)
  prev_d = jnp.asarray(prev_discrepancy)
  tau = jnp.asarray(intervals)
  num_layers = mask.shape[0]
  l2l = _check_leaf_to_layer(leaf_to_layer, len(leaves), num_layers)
  w = _check_weights(weights, leaves)
  total = jnp.sum(w)
  sq = [_leaf_sq_dist(x, _leaf_mean(x, w, total), w, total) for x in leaves]
  return _per_layer_discrepancy(sq, l2l, leaves, mask, tau, prev_d)
