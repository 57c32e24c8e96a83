"""Clipping rules of user-level DP: each maps one client's update to one whose L2 norm is at
most the clip C, so that the noise calibrated to C covers any one client's contribution.

A rule is `clip(update, clip_norm, options) -> (clipped update, ||update||)`, a pure function
of one client's update (run inside the vmapped client computation), registered by its
config name (config.privacy.clipping) in CLIPPINGS with whether adaptive clipping may move
its C (Andrew et al.'s count "left unclipped", ||update|| <= C, is defined for a rule that
leaves the updates inside the ball unchanged). docs/stages.md shows one added in full.

References:
  McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language
  Models", ICLR 2018 (flat and per-layer clipping).
"""
from typing import Any, Callable, NamedTuple, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lama import tree
from fedjax_lama.errors import HparamError
from fedjax_lama.privacy import automatic_clip

PyTree = Any


def flat(update: PyTree, clip_norm, options=None) -> tuple[PyTree, jax.Array]:
  """The whole update scaled to L2 norm at most C: u min(1, C / ||u||) (one norm over every
  leaf, `tree.clip_by_global_norm`)."""
  del options
  return tree.clip_by_global_norm(update, clip_norm)


def layer_clip_norms(update: PyTree, clip_norm, split: Union[str, Sequence[float]]) -> PyTree:
  """The clip of every leaf under per-layer clipping, with sum_l C_l^2 = C^2.

  So the whole clipped update still has norm at most C and the noise calibrated to C covers it
  (McMahan et al., ICLR 2018, per-layer clipping). `split`: "equal" (C_l^2 = C^2 / L), "size"
  (C_l^2 = C^2 d_l / d) or explicit shares C_l^2 / C^2 in leaf order.
  """
  leaves, treedef = jax.tree.flatten(update)
  if split == "equal":
    shares = np.full(len(leaves), 1.0 / len(leaves))
  elif split == "size":
    sizes = np.array([np.size(x) for x in leaves], np.float64)
    shares = sizes / sizes.sum()
  else:
    shares = np.asarray(split, np.float64)
    if shares.shape != (len(leaves),):
      raise HparamError("privacy.layer_split", tuple(split),
                        f"one share per leaf of the update ({len(leaves)} leaves)")
  clip = jnp.asarray(clip_norm, jnp.float32)
  return jax.tree.unflatten(treedef, [clip * jnp.sqrt(jnp.float32(s)) for s in shares])


def per_layer(update: PyTree, clip_norm, options) -> tuple[PyTree, jax.Array]:
  """Each leaf clipped to its own C_l (`layer_clip_norms` of options.layer_split)."""
  clips = layer_clip_norms(update, clip_norm, options.layer_split)
  clipped = jax.tree.map(lambda x, c: tree.clip_by_global_norm(x, c)[0], update, clips)
  return clipped, tree.global_norm(update)


class ClipRule(NamedTuple):
  """A clipping rule as config.privacy.clipping names it."""
  clip: Callable[..., tuple[PyTree, jax.Array]]  # (update, C, DpOptions) -> (clipped, norm)
  adaptive: bool  # adaptive clipping may move C (the update is unchanged when ||u|| <= C)


# config.privacy.clipping -> its rule.
CLIPPINGS = {
    "flat": ClipRule(flat, adaptive=True),
    "per_layer": ClipRule(per_layer, adaptive=False),
    "automatic": ClipRule(automatic_clip.clip, adaptive=False),
}
