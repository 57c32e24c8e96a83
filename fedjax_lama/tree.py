"""Small pytree helpers used across the engine and algorithms: the leaves' key paths and
sizes (the one place that counts them), and what `optax.tree` does not offer.

Arithmetic on whole trees is `optax.tree` (add, sub, scale, zeros_like, ...) or
`jax.tree.map`. Note that `optax.tree.add` sums from a Python 0, which turns a -0.0 leaf into
+0.0: where the sign of zero matters, use `jax.tree.map(jnp.add, a, b)`.
"""
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any


def leaf_paths(tree: PyTree) -> list[tuple[str, ...]]:
  """The key path of every leaf as a tuple of strings (dict key, attribute name or sequence
  index), in canonical (`jax.tree.leaves`) order."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return [tuple(_key_str(k) for k in path) for path, _ in flat]


def leaf_names(tree: PyTree) -> list[str]:
  """'/'-joined key paths of the leaves, in canonical (`jax.tree.leaves`) order."""
  return ["/".join(path) for path in leaf_paths(tree)]


def _key_str(k) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def leaf_sizes(tree: PyTree, batch_axes: int = 0) -> np.ndarray:
  """Number of scalars of every leaf (int64), in canonical order; with `batch_axes` > 0 the
  leading axes are left out (per-client sizes of a tree stacked over clients)."""
  return np.array([np.prod(np.shape(x)[batch_axes:], dtype=np.int64)
                   for x in jax.tree.leaves(tree)], dtype=np.int64)


def tree_size(tree: PyTree) -> int:
  """Number of scalars in a pytree."""
  return int(leaf_sizes(tree).sum())


def tree_where(pred, on_true: PyTree, on_false: PyTree) -> PyTree:
  """Elementwise select of whole pytrees by a scalar predicate (exact no-op when false)."""
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def broadcast_clients(tree: PyTree, num_clients: int) -> PyTree:
  """Stack `num_clients` copies of a pytree along a new leading axis."""
  return jax.tree.map(lambda x: jnp.broadcast_to(x, (num_clients,) + jnp.shape(x)), tree)


def tree_all_finite(tree: PyTree) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)
