"""Masked, weighted reductions over the client axis.

A round's aggregate is computed as (sum_i w_i x_i, sum_i w_i) pairs so that
chunks of clients -- and shards of the client axis -- can be accumulated in any
grouping and divided once at the end (architecture.md 2.2, "Chunking").
"""
import jax
import jax.numpy as jnp

from fedjax_lama.tree import PyTree


def client_weights(client_mask: jax.Array, num_examples: jax.Array, weighting: str) -> jax.Array:
  """w_i = client_mask * (n_i or 1): padded clients weigh exactly zero."""
  if weighting == "examples":
    return client_mask * num_examples
  if weighting == "uniform":
    return client_mask
  raise ValueError(f"weighting={weighting!r}; accepted: 'examples', 'uniform'")


def weighted_sum(stacked: PyTree, weights: jax.Array) -> PyTree:
  """sum_i w_i x_i over the leading client axis of every leaf.

  Zero weights are applied with `where` first, so a padded client holding NaN or
  inf contributes exactly nothing.
  """

  def leaf_sum(x):
    w = weights.reshape((-1,) + (1,) * (x.ndim - 1)).astype(x.dtype)
    return jnp.sum(jnp.where(w > 0, x * w, 0), axis=0)

  return jax.tree_util.tree_map(leaf_sum, stacked)


def weighted_mean(stacked: PyTree, weights: jax.Array) -> PyTree:
  total = jnp.sum(weights)
  safe = jnp.where(total > 0, total, 1.0)
  return jax.tree_util.tree_map(lambda s: s / safe, weighted_sum(stacked, weights))
