"""Clipping, Gaussian noise and adaptive clipping: pure jnp functions over pytrees.

The mechanisms of central user-level DP, written so that they run inside one jitted,
vmapped round: the per-client part (`user_level_dp(...).client`) maps one client's upload to
its clipped upload, the uploads are summed with uniform weights (padded clients weigh zero),
possibly in several chunks, and the server part (`user_level_dp(...).server`) noises the sum
once and divides it by the expected cohort size. Keys are always arguments; nothing here draws hidden randomness.

References:
  McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language
  Models", ICLR 2018 (DP-FedAvg: flat and per-layer clipping, the fixed-denominator
  estimator, noise N(0, sigma^2 C^2) on the sum).
  Andrew, Thakkar, McMahan, Ramaswamy, "Differentially Private Learning with Adaptive
  Clipping", NeurIPS 2021 (Algorithm 1: C <- C exp(-eta (b - gamma)), b the noised fraction
  of clients whose update norm was at most C).
"""
from typing import Any, NamedTuple, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lama.errors import HparamError
from fedjax_lama.privacy.dp_options import DpOptions

PyTree = Any

# Keys of the server's release: one for the update noise, one for the count noise.
_UPDATE_NOISE = 0
_COUNT_NOISE = 1


def global_norm(tree: PyTree) -> jax.Array:
  """L2 norm of the whole pytree, accumulated in float32."""
  leaves = jax.tree.leaves(tree)
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves))


def _scale_to(norm: jax.Array, clip: jax.Array) -> jax.Array:
  """min(1, clip / norm), 1 for a zero norm (never 0/0)."""
  return jnp.minimum(1.0, clip / jnp.maximum(norm, jnp.finfo(jnp.float32).tiny))


def clip_flat(update: PyTree, clip_norm) -> tuple:
  """Scales the whole update so that its L2 norm is at most `clip_norm`.

  Returns:
    (clipped update, the update's norm before clipping).
  """
  norm = global_norm(update)
  scale = _scale_to(norm, clip_norm)
  return jax.tree.map(lambda x: (x * scale).astype(x.dtype), update), norm


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


def clip_per_layer(update: PyTree, layer_clips: PyTree) -> tuple:
  """Clips each leaf to its own clip (a pytree of scalars shaped like `update`'s leaves).

  Returns:
    (clipped update, the pytree of per-leaf norms before clipping).
  """
  norms = jax.tree.map(global_norm, update)
  clipped = jax.tree.map(lambda x, n, c: (x * _scale_to(n, c)).astype(x.dtype), update, norms,
                         layer_clips)
  return clipped, norms


def add_gaussian_noise(tree: PyTree, stddev, key: jax.Array) -> PyTree:
  """tree + N(0, stddev^2) independently in every coordinate; leaf l draws from fold_in(key, l).

  A leaf's noise depends on its position only, so it does not change with the rest of the
  tree's shapes.
  """
  leaves, treedef = jax.tree.flatten(tree)
  noisy = [x + (stddev * jax.random.normal(jax.random.fold_in(key, i), x.shape, jnp.float32)
                ).astype(x.dtype) for i, x in enumerate(leaves)]
  return jax.tree.unflatten(treedef, noisy)


def noised_mean(update_sum: PyTree, key: jax.Array, noise_multiplier, clip_norm,
                expected_cohort) -> PyTree:
  """(sum_i clip(Delta_i) + N(0, sigma^2 C^2)) / expected cohort (DP-FedAvg's estimator)."""
  noisy = add_gaussian_noise(update_sum, noise_multiplier * clip_norm, key)
  return jax.tree.map(lambda x: x / jnp.asarray(expected_cohort, x.dtype), noisy)


def adaptive_clip_step(clip_norm, unclipped_count, key: jax.Array, *, expected_cohort,
                       target_quantile, learning_rate, count_stddev) -> tuple:
  """One geometric step of the clip toward the target quantile (Andrew et al., Algorithm 1).

  b = (sum_i 1[||Delta_i|| <= C] + N(0, sigma_b^2)) / expected cohort, then
  C <- C exp(-eta (b - gamma)): the clip shrinks while more than a fraction gamma of the
  clients are left unclipped, and grows otherwise.

  Returns:
    (next clip, the noised unclipped fraction b).
  """
  noise = count_stddev * jax.random.normal(key, (), jnp.float32)
  fraction = (jnp.asarray(unclipped_count, jnp.float32) + noise) / expected_cohort
  next_clip = clip_norm * jnp.exp(-learning_rate * (fraction - target_quantile))
  return next_clip, fraction


class DpState(NamedTuple):
  """The server's privacy state: the current clip (constant unless adaptive)."""
  clip_norm: jax.Array  # float32 scalar


class DpStage(NamedTuple):
  """A streaming aggregation stage.

  init() -> state; client(upload, state, key) -> upload, run per client inside the vmapped
  round; the engine sums the clients' outputs with uniform weights (mask), possibly over
  several chunks; server(sum, state, key) -> (value, state, scalars).
  """
  init: Any
  client: Any
  server: Any


def user_level_dp(options: DpOptions) -> DpStage:
  """DP-FedAvg's aggregation (McMahan et al., ICLR 2018), with adaptive clipping if asked.

  The client's output is {"update": clipped update, "unclipped": 1[norm <= C]}; the server
  receives its uniform-weight sum over the cohort and returns the noised mean update. The
  client's key is unused (clipping is deterministic) and kept for the stage's signature.
  """
  expected_cohort = options.sampling.expected_cohort
  sigma_update = options.update_noise_multiplier
  adaptive = options.adaptive

  def init() -> DpState:
    return DpState(clip_norm=jnp.asarray(options.clip_norm, jnp.float32))

  def client(upload: PyTree, state: DpState, key: jax.Array) -> dict:
    del key
    if options.clipping == "flat":
      clipped, norm = clip_flat(upload, state.clip_norm)
    else:
      layer_clips = layer_clip_norms(upload, state.clip_norm, options.layer_split)
      clipped, _ = clip_per_layer(upload, layer_clips)
      norm = global_norm(upload)
    return {"update": clipped, "unclipped": (norm <= state.clip_norm).astype(jnp.float32)}

  def server(summed: dict, state: DpState, key: jax.Array) -> tuple:
    value = noised_mean(summed["update"], jax.random.fold_in(key, _UPDATE_NOISE),
                        sigma_update, state.clip_norm, expected_cohort)
    scalars = {"dp/clip_norm": state.clip_norm}
    if adaptive is None:
      return value, state, scalars
    next_clip, fraction = adaptive_clip_step(
        state.clip_norm, summed["unclipped"], jax.random.fold_in(key, _COUNT_NOISE),
        expected_cohort=expected_cohort, target_quantile=adaptive.target_quantile,
        learning_rate=adaptive.learning_rate, count_stddev=adaptive.count_stddev)
    scalars["dp/unclipped_fraction"] = fraction
    return value, DpState(clip_norm=next_clip), scalars

  return DpStage(init, client, server)
