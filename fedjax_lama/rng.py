"""Derived randomness: seed -> stream -> round -> client id -> step.

Keys are never threaded through the computation; each one is a pure function of
its coordinates (docs/design.md, "Randomness"), so a client's randomness does not depend
on which other clients were sampled, on padding, on sharding or on chunking, and
a resumed run draws exactly what an uninterrupted one would.
"""
import jax
import jax.numpy as jnp
import numpy as np

# Stream ids keep independent uses of the same seed apart.
STREAM_INIT = 0
STREAM_TRAIN = 1
STREAM_EVAL = 2
STREAM_UPLINK = 3  # compressor draws (FedPAQ: one key per round, client id, leaf)
STREAM_AGGREGATE = 4  # aggregation stages (engine/aggregation.py): (round, client id), round


def root_key(seed: int) -> jax.Array:
  return jax.random.PRNGKey(seed)


def round_key(seed: int, stream: int, round_idx) -> jax.Array:
  """Key of one (stream, round); `round_idx` may be traced."""
  key = jax.random.fold_in(root_key(seed), stream)
  return jax.random.fold_in(key, round_idx)


def client_keys(key: jax.Array, client_ids: jax.Array) -> jax.Array:
  """One key per client id (vectorised fold_in)."""
  return jax.vmap(lambda c: jax.random.fold_in(key, c))(jnp.asarray(client_ids))


def step_keys(key: jax.Array, num_steps: int) -> jax.Array:
  return jax.vmap(lambda s: jax.random.fold_in(key, s))(jnp.arange(num_steps))


def numpy_rng(seed: int, *coords: int) -> np.random.Generator:
  """Host-side generator derived from (seed, coords...), independent of history."""
  return np.random.default_rng(np.random.SeedSequence([seed, *[int(c) for c in coords]]))
