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

from fedjax_lama.errors import ConfigError

PyTree = Any


def leaf_paths(tree: PyTree) -> list[tuple[str, ...]]:
  """The key path of every leaf as a tuple of strings (dict key, attribute name or sequence
  index), in canonical (`jax.tree.leaves`) order."""
  flat, _ = jax.tree.flatten_with_path(tree)
  return [tuple(_key_str(k) for k in path) for path, _ in flat]


def leaf_dict(tree: PyTree) -> dict:
  """{key path (`leaf_paths`): leaf}, in canonical order."""
  flat, _ = jax.tree.flatten_with_path(tree)
  return {tuple(_key_str(k) for k in path): leaf for path, leaf in flat}


def _kind(leaf) -> str:
  """"float32[64, 256]": a leaf's dtype and shape (arrays and jax.ShapeDtypeStruct)."""
  return f"{np.dtype(leaf.dtype).name}{list(leaf.shape)}"


def check_fits(expected: dict, given: dict, what: str, head: str, hint: str = "") -> None:
  """`given` {path: array} has exactly the leaves of a model's `expected` {path: array},
  each of its shape and dtype; else one ConfigError, starting with `head` and ending with
  `hint`, naming the first `what` (e.g. "parameter") that differs."""
  for path, leaf in expected.items():
    name = "/".join(path)
    if path not in given:
      raise ConfigError(f"{head} has no {what} {name!r}, which the model has "
                        f"({_kind(leaf)}){hint}")
    have = given[path]
    if _kind(have) != _kind(leaf):
      raise ConfigError(f"{head}: {what} {name!r} is {_kind(have)} there; the model "
                        f"expects {_kind(leaf)}{hint}")
  for path in given:
    if path not in expected:
      raise ConfigError(f"{head} has the {what} {'/'.join(path)!r}, which the model does not "
                        f"have{hint}")


def with_leaves(tree: PyTree, given: PyTree, keep=lambda path: False,
                head: str = "the parameters", hint: str = "") -> PyTree:
  """`tree` whose leaves are `given`'s, as they are, but those whose key path `keep`
  selects (e.g. a model's LoRA adapters over a base checkpoint). `given` must hold exactly
  the other leaves, each of its shape and dtype; else one ConfigError (`check_fits`)."""
  fresh, values = leaf_dict(tree), leaf_dict(given)
  check_fits({p: x for p, x in fresh.items() if not keep(p)}, values, "parameter", head, hint)
  return jax.tree.unflatten(jax.tree.structure(tree),
                            [x if keep(p) else values[p] for p, x in fresh.items()])


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


def accumulation_dtype(dtype) -> jnp.dtype:
  """The dtype every norm of the library accumulates in: the leaf's, at least float32
  (bfloat16 and float16 leaves are squared and summed in float32; float64 stays float64)."""
  return jnp.promote_types(dtype, jnp.float32)


def global_sq_norm(tree: PyTree) -> jax.Array:
  """sum over every leaf of sum(x^2): the squared L2 norm of the whole tree, accumulated in
  `accumulation_dtype` (leaf by leaf, each leaf's sum first, in leaf order)."""
  return sum(jnp.sum(jnp.square(x.astype(accumulation_dtype(x.dtype))))
             for x in jax.tree.leaves(tree))


def global_norm(tree: PyTree) -> jax.Array:
  """||tree||_2 over every leaf (`global_sq_norm`'s square root): the one norm that DP's clip,
  the robust rules, FedSAM's ascent and FedSpeed's clip all use."""
  return jnp.sqrt(global_sq_norm(tree))


# PyTorch's clip_grad_norm_ divides by ||g|| + 1e-6 (FL-Simulator's FedSAM and FedSpeed clip).
TORCH_CLIP_EPS = 1e-6


def clip_scale(norm: jax.Array, max_norm, eps: float = 0.0) -> jax.Array:
  """min(1, max_norm / (norm + eps)): 1 for a zero norm (never 0 / 0: the denominator is at
  least the dtype's smallest normal number). eps = TORCH_CLIP_EPS is PyTorch's
  clip_grad_norm_."""
  return jnp.minimum(1.0, max_norm / jnp.maximum(norm + eps, jnp.finfo(norm.dtype).tiny))


def clip_by_global_norm(tree: PyTree, max_norm, eps: float = 0.0) -> tuple[PyTree, jax.Array]:
  """(tree * clip_scale(||tree||, max_norm, eps), ||tree||): the whole tree scaled so that its
  L2 norm is at most `max_norm`, each leaf cast back to its dtype.

  The clip of DP-FedAvg (McMahan, Ramage, Talwar, Zhang, ICLR 2018, flat clipping), of norm
  bounding against backdoors (Sun, Kairouz, Suresh, McMahan, 2019) and, with eps =
  TORCH_CLIP_EPS, PyTorch's clip_grad_norm_ as FL-Simulator's FedSAM and FedSpeed clip their
  local direction.
  """
  norm = global_norm(tree)
  scale = clip_scale(norm, max_norm, eps)
  return jax.tree.map(lambda x: (x * scale).astype(x.dtype), tree), norm


def tree_all_finite(tree: PyTree) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)
