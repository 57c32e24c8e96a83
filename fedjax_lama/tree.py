"""Small pytree helpers used across the engine and algorithms."""
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any


def tree_size(tree: PyTree) -> int:
  """Number of scalars in a pytree."""
  return int(sum(np.prod(np.shape(x), dtype=np.int64) for x in jax.tree_util.tree_leaves(tree)))


def leaf_names(tree: PyTree) -> list[str]:
  """'/'-joined key paths of the leaves, in canonical (tree_leaves) order."""
  paths = jax.tree_util.tree_flatten_with_path(tree)[0]
  return ["/".join(_key_str(k) for k in path) for path, _ in paths]


def _key_str(k) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def leaf_sizes(tree: PyTree) -> np.ndarray:
  return np.array([int(np.prod(np.shape(x), dtype=np.int64)) for x in jax.tree_util.tree_leaves(tree)],
                  dtype=np.int64)


def tree_where(pred, on_true: PyTree, on_false: PyTree) -> PyTree:
  """Elementwise select of whole pytrees by a scalar predicate (exact no-op when false)."""
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def tree_add(a: PyTree, b: PyTree) -> PyTree:
  return jax.tree.map(jnp.add, a, b)


def tree_sub(a: PyTree, b: PyTree) -> PyTree:
  return jax.tree.map(jnp.subtract, a, b)


def tree_scale(tree: PyTree, s) -> PyTree:
  return jax.tree.map(lambda x: x * s, tree)


def tree_zeros_like(tree: PyTree) -> PyTree:
  return jax.tree.map(jnp.zeros_like, tree)


def broadcast_clients(tree: PyTree, num_clients: int) -> PyTree:
  """Stack `num_clients` copies of a pytree along a new leading axis."""
  return jax.tree.map(lambda x: jnp.broadcast_to(x, (num_clients,) + jnp.shape(x)), tree)


def tree_all_finite(tree: PyTree) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)
