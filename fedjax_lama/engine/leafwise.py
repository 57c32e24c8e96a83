"""Per-leaf selection for layer-wise schedules (fedjax_lama.fedlama): a state's new values
on the synchronised leaves, its old ones elsewhere."""
import jax
import jax.numpy as jnp

from fedjax_lama.tree import PyTree


def params_shaped_subtrees(tree: PyTree, params_def) -> tuple[list, object]:
  """Flattens `tree` with every params-shaped subtree as one leaf."""
  return jax.tree.flatten(
      tree, is_leaf=lambda node: jax.tree.structure(node) == params_def)


def non_leafwise_parts(tree: PyTree, params: PyTree) -> list[str]:
  """Paths of the array leaves of `tree` that are not inside a params-shaped subtree."""
  params_def = jax.tree.structure(params)
  flat, _ = jax.tree.flatten_with_path(
      tree, is_leaf=lambda node: jax.tree.structure(node) == params_def)
  return [jax.tree_util.keystr(path) for path, node in flat
          if jax.tree.structure(node) != params_def]


def select_leafwise(leaf_mask: PyTree, new: PyTree, old: PyTree, params_def) -> PyTree:
  """new where the (params-shaped) leaf mask is set, old elsewhere, for every params-shaped
  subtree of a state (server extras, optimizer states, rows). Leaves outside such subtrees
  must not exist (checked when a schedule is built, `non_leafwise_parts`)."""
  new_parts, treedef = params_shaped_subtrees(new, params_def)
  old_parts = treedef.flatten_up_to(old)
  mask_leaves = jax.tree.leaves(leaf_mask)
  out = []
  for n, o in zip(new_parts, old_parts):
    n_leaves, n_def = jax.tree.flatten(n)
    o_leaves = n_def.flatten_up_to(o)
    out.append(jax.tree.unflatten(n_def, [
        jnp.where(m, a, b) for m, a, b in zip(mask_leaves, n_leaves, o_leaves)]))
  return jax.tree.unflatten(treedef, out)
