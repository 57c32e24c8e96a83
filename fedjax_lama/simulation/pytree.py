"""Bitwise equality of model pytrees, and the simulator's default model algebra.

The simulator's models are pytrees of numpy arrays (dicts, lists, tuples and NamedTuples;
`None` is an empty subtree); they are walked with `jax.tree.map` and `jax.tree.leaves`, which
leave numpy leaves as they are, and counted with `fedjax_lama.tree.tree_size`.
"""
from typing import Any, Sequence

import jax
import numpy as np

PyTree = Any


def trees_equal(a: PyTree, b: PyTree) -> bool:
  """Bitwise equality of two trees (same structure, shapes, dtypes and bytes)."""
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
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

    return jax.tree.map(combine, trees[0], *trees[1:])
