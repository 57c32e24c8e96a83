"""Layer bookkeeping over a flax params pytree (FedLAMA, Lee, Zhang, Avestimehr, AAAI 2023).

The papers relax every layer; the authors' code relaxes only tensors named "kernel", which
`is_kernel` lets the "code" rule follow.

FedLAMA synchronises "layers" (aggregation units) on their own schedules. A
unit is one params leaf ("tensor" granularity, the reference code's choice) or
all leaves of one flax module ("module" granularity). The canonical unit order
is the `jax.tree.leaves` order of params; a module is placed at its first
leaf. Everything here is static numpy metadata computed from shapes, so it also
works on `jax.eval_shape` outputs.
"""

import dataclasses
from typing import Any

import jax
import numpy as np

from fedjax_lama.tree import leaf_paths, leaf_sizes

GRANULARITIES = ("tensor", "module")
KERNEL_LEAF_NAME = "kernel"


@dataclasses.dataclass(frozen=True, eq=False)
class LayerSpec:
  """Static description of the aggregation units of a params pytree.

  Attributes:
    names: "/"-joined path of each unit (for "module" the parent path of its
      leaves; "" for leaves stored at the root of params).
    sizes: int64 [L], number of scalars per unit.
    is_kernel: bool [L], leaf named "kernel" or a group containing one.
    leaf_to_layer: int32 [num_leaves], the unit index of each leaf.
    granularity: "tensor" or "module".
  """
  names: tuple
  sizes: np.ndarray
  is_kernel: np.ndarray
  leaf_to_layer: np.ndarray
  granularity: str

  @property
  def num_layers(self) -> int:
    return len(self.names)

  @property
  def num_leaves(self) -> int:
    return int(self.leaf_to_layer.shape[0])


def _readonly(array: np.ndarray) -> np.ndarray:
  array.setflags(write=False)
  return array


def layer_spec(params: Any, granularity: str = "tensor") -> LayerSpec:
  """Units, sizes, kernel flags and the leaf -> unit map of `params`."""
  if granularity not in GRANULARITIES:
    raise ValueError(
        f"fedlama.layer_granularity must be one of {list(GRANULARITIES)}, "
        f"got {granularity!r}")
  paths = leaf_paths(params)
  if granularity == "tensor":
    unit_keys = paths
  else:
    unit_keys = [path[:-1] for path in paths]
  index = {}  # unit key -> unit index, in order of first leaf
  for key in unit_keys:
    index.setdefault(key, len(index))
  leaf_to_layer = np.array([index[k] for k in unit_keys], dtype=np.int32)
  num = len(index)
  sizes = np.zeros(num, dtype=np.int64)
  np.add.at(sizes, leaf_to_layer, leaf_sizes(params))
  is_kernel = np.zeros(num, dtype=np.bool_)
  for path, unit in zip(paths, leaf_to_layer):
    is_kernel[unit] |= bool(path) and path[-1] == KERNEL_LEAF_NAME
  return LayerSpec(
      names=tuple("/".join(k) for k in index),
      sizes=_readonly(sizes),
      is_kernel=_readonly(is_kernel),
      leaf_to_layer=_readonly(leaf_to_layer),
      granularity=granularity)


def per_leaf(spec: LayerSpec, vec: Any, params: Any) -> Any:
  """Pytree shaped like `params` whose leaf j holds vec[leaf_to_layer[j]].

  `vec` is a per-unit vector ([L], numpy or jax, possibly traced); the result
  holds scalars, e.g. a per-leaf sync mask or interval for `jnp.where`.
  """
  treedef = jax.tree.structure(params)
  if treedef.num_leaves != spec.num_leaves:
    raise ValueError(
        f"params has {treedef.num_leaves} leaves but the LayerSpec was built "
        f"for {spec.num_leaves}")
  if np.shape(vec) != (spec.num_layers,):
    raise ValueError(
        f"per-layer vector must have shape ({spec.num_layers},), got "
        f"{np.shape(vec)}")
  return jax.tree.unflatten(
      treedef, [vec[int(i)] for i in spec.leaf_to_layer])

