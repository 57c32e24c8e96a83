"""Gaussian noise, adaptive clipping and user-level DP as an aggregation stage: pure jnp
functions over pytrees.

The mechanisms of central user-level DP, written so that they run inside one jitted,
vmapped round: the stage's client part (`user_level_dp(...).client`) maps one client's
upload to its clipped upload (a rule of privacy/clipping.py), the uploads are summed with
uniform weights (padded clients weigh zero), possibly in several chunks, and its server part
noises the sum once and divides it by the expected cohort size. Keys are always arguments;
nothing here draws hidden randomness.

References:
  McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language
  Models", ICLR 2018 (DP-FedAvg: flat and per-layer clipping, the fixed-denominator
  estimator, noise N(0, sigma^2 C^2) on the sum).
  Andrew, Thakkar, McMahan, Ramaswamy, "Differentially Private Learning with Adaptive
  Clipping", NeurIPS 2021 (Algorithm 1: C <- C exp(-eta (b - gamma)), b the noised fraction
  of clients whose update norm was at most C).
"""
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_lama.engine import stages
from fedjax_lama.privacy import clipping
from fedjax_lama.privacy.dp_options import DpOptions

PyTree = Any

# Keys of the server's release: one for the update noise, one for the count noise.
_UPDATE_NOISE = 0
_COUNT_NOISE = 1


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


STAGE_NAME = "user_level_dp"


def user_level_dp(options: DpOptions) -> stages.Stage:
  """DP-FedAvg's aggregation of the model update (McMahan et al., ICLR 2018) as a stage, with
  adaptive clipping if asked (Andrew et al., NeurIPS 2021):

      client(delta_i)  -> {"update": clip(delta_i), "unclipped": 1[||delta_i|| <= C]}, the
                          clip of config.privacy.clipping (privacy/clipping.py CLIPPINGS)
      consumes         the running sums with weights=PARTICIPANTS: the sum over the real
                       clients, over any number of chunks and shards
      server(sum)      (sum_i clip(delta_i) + N(0, sigma^2 C^2)) / (q N), noised once per
                       round, every round (`every_round`: the accountant counts a round that
                       drew nobody too); under adaptive clipping C moves toward the target
                       quantile

  The state is the current clip (DpState), kept in the program state under
  state["aggregation"] and checkpointed with it, so a resumed run continues the clip's path
  exactly. The client's key is unused (clipping is deterministic).
  """
  expected_cohort = options.sampling.expected_cohort
  sigma_update = options.update_noise_multiplier
  adaptive = options.adaptive
  rule = clipping.CLIPPINGS[options.clipping]

  def init(params) -> DpState:
    del params  # the state is the clip alone
    return DpState(clip_norm=jnp.asarray(options.clip_norm, jnp.float32))

  def client(upload: PyTree, state: DpState, key: jax.Array) -> dict:
    del key
    clipped, norm = rule.clip(upload, state.clip_norm, options)
    return {"update": clipped, "unclipped": (norm <= state.clip_norm).astype(jnp.float32)}

  def server(sums: stages.Sums, state: DpState, key: jax.Array) -> tuple:
    # sums.weight is the number of participants; the estimator divides by the expected
    # cohort instead (a fixed denominator bounds one client's effect by C / (q N)).
    summed = sums.total
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

  return stages.make(STAGE_NAME, init=init, client=client, server=server,
                     consumes=stages.SUMS, reduces=True, weights=stages.PARTICIPANTS,
                     every_round=True)
