"""Numpy pytrees for the host-side simulator, and the default model algebra.

The simulator  is pure numpy + Python, so it cannot use
`jax.tree_util`. These helpers handle the containers models are made of here:
dicts (leaves in sorted-key order, as `jax.tree_util` flattens them), lists,
tuples and NamedTuples; `None` is an empty subtree. Everything else is a leaf.
"""
from typing import Any, Callable, Sequence

import numpy as np

PyTree = Any


def _is_namedtuple(x) -> bool:
  return isinstance(x, tuple) and hasattr(x, "_fields")


def tree_leaves(tree: PyTree) -> list:
  """Leaves in canonical order (dict keys sorted)."""
  if tree is None:
    return []
  if isinstance(tree, dict):
    return [leaf for key in sorted(tree) for leaf in tree_leaves(tree[key])]
  if isinstance(tree, (list, tuple)):
    return [leaf for child in tree for leaf in tree_leaves(child)]
  return [tree]


def tree_map(fn: Callable, tree: PyTree, *rest: PyTree) -> PyTree:
  """Applies `fn` to corresponding leaves of trees of the same structure."""
  if tree is None:
    return None
  if isinstance(tree, dict):
    return type(tree)((key, tree_map(fn, tree[key], *[r[key] for r in rest]))
                      for key in sorted(tree))
  if _is_namedtuple(tree):
    return type(tree)(*[tree_map(fn, c, *[r[i] for r in rest]) for i, c in enumerate(tree)])
  if isinstance(tree, (list, tuple)):
    return type(tree)(tree_map(fn, c, *[r[i] for r in rest]) for i, c in enumerate(tree))
  return fn(tree, *rest)


def num_parameters(tree: PyTree) -> int:
  """Number of scalars in a pytree."""
  return int(sum(np.size(leaf) for leaf in tree_leaves(tree)))


def trees_equal(a: PyTree, b: PyTree) -> bool:
  """Bitwise equality of two trees (same structure, shapes, dtypes and bytes)."""
  la, lb = tree_leaves(a), tree_leaves(b)
  if len(la) != len(lb):
    return False
  for x, y in zip(la, lb):
    x, y = np.asarray(x), np.asarray(y)
    if x.shape != y.shape or x.dtype != y.dtype or x.tobytes() != y.tobytes():
      return False
  return True


class NumpyAlgebra:
  """Default `ModelAlgebra`: weighted sums of numpy pytrees.

  Each leaf is accumulated in float64, term by term in the given order, starting
  from the first term (not from zeros, so that a single tree with weight 1.0
  comes back bit for bit, including the sign of zeros), then cast back to the
  dtype of the first tree's leaf.
  """

  def weighted_sum(self, trees: Sequence[PyTree], weights: Sequence[float]) -> PyTree:
    trees = list(trees)
    weights = [float(w) for w in weights]
    if not trees or len(trees) != len(weights):
      raise ValueError(f"weighted_sum needs as many weights as trees (>= 1), got "
                       f"{len(trees)} trees and {len(weights)} weights")

    def combine(first, *others):
      dtype = np.asarray(first).dtype
      acc = np.asarray(first, np.float64) * weights[0]
      for w, leaf in zip(weights[1:], others):
        acc = acc + np.asarray(leaf, np.float64) * w
      return acc.astype(dtype, copy=False)

    return tree_map(combine, trees[0], *trees[1:])
