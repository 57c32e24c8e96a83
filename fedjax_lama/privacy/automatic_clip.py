"""Automatic clipping: every update normalised, C u / (||u|| + gamma), instead of cut at C.

Bu, Wang, Zha, Karypis, "Automatic Clipping: Differentially Private Deep Learning Made
Easier and Stronger", NeurIPS 2023 (AUTO-S, Eq. 4: the per-sample factor 1 / (||g|| +
gamma), gamma = 0.01). Here the unit is one client's update and the factor is scaled by
the clip C, so every clipped update has norm C ||u|| / (||u|| + gamma) < C and the Gaussian
noise of DP-FedAvg, calibrated to C, covers it unchanged. Unlike the flat clip it rescales
every update, small ones upward: no update is "left unclipped", so adaptive clipping does not
apply (registered with adaptive=False).
"""
import jax

from fedjax_lama import tree

# The stability constant of AUTO-S (Bu et al.'s default): it bounds the factor for updates
# near zero and keeps the map continuous there.
GAMMA = 0.01


def clip(update, clip_norm, options=None):
  """(C u / (||u|| + GAMMA), ||u||) for one client's update u."""
  del options
  norm = tree.global_norm(update)
  scale = clip_norm / (norm + GAMMA)
  return jax.tree.map(lambda x: (x * scale).astype(x.dtype), update), norm
