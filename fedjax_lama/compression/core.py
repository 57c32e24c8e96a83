"""The compressor interface and how the engine applies it to uploads.

A compressor is a bundle of pure, jit- and vmap-compatible functions over pytrees:

    encode(key, update) -> payload          decode(payload) -> update_hat
    roundtrip(key, update) -> update_hat    bits(update_like) -> int (static, from shapes)

`unbiased` says whether E[decode(encode(v))] == v. The compressors here are stateless
(no per-client residuals), so `cstate` of 5.12 is omitted.

What is compressed follows from an algorithm's declaration (engine/algorithm.py): every
upload whose leaves are not all scalars; scalar uploads (FedNova's ||a_i||_1) stay
32-bit. The engine applies a compressor as the uplink codec of the run's chain of stages
(engine/stages.py `uplink`, engine/aggregation.py `RoundAggregation.decode`). No algorithm
name appears here.
"""
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from fedjax_lama import rng
from fedjax_lama.tree import tree_size

PyTree = Any


class Compressor(NamedTuple):
  name: str
  encode: Callable[[jax.Array, PyTree], PyTree]
  decode: Callable[[PyTree], PyTree]
  bits: Callable[[PyTree], int]
  unbiased: bool

  def roundtrip(self, key: jax.Array, update: PyTree) -> PyTree:
    """decode(encode(key, update)): what the server reconstructs."""
    return self.decode(self.encode(key, update))


def float32_bits(like: PyTree) -> int:
  return 32 * tree_size(like)


def identity() -> Compressor:
  return Compressor("identity", encode=lambda key, update: update,
                    decode=lambda payload: payload, bits=float32_bits, unbiased=True)


def is_identity(compressor) -> bool:
  return compressor is None or compressor.name == "identity"


def leaf_bits(compressor: Compressor, like: PyTree) -> np.ndarray:
  """Bits of each leaf sent alone (block "leaf": additive over leaves, 5.12 "With FedLAMA")."""
  return np.array([compressor.bits(x) for x in jax.tree.leaves(like)], np.int64)


def base_key(seed: int) -> jax.Array:
  """Root of the compressor's draws; rounds, client ids and leaves are folded in."""
  return jax.random.fold_in(rng.root_key(seed), rng.STREAM_UPLINK)


def compress_clients(compressor: Compressor, base_key: jax.Array, round_idx,
                     client_ids: jax.Array, updates: PyTree) -> PyTree:
  """What the server decodes from every client's update (leaves [C, ...]).

  Keys per (round, client id, leaf): independent of the cohort's padding and order.
  """
  if is_identity(compressor):
    return updates
  round_key = jax.random.fold_in(base_key, round_idx)
  keys = jax.vmap(lambda c: jax.random.fold_in(round_key, c))(client_ids)
  return jax.vmap(compressor.roundtrip)(keys, updates)


def is_scalar_upload(value: PyTree) -> bool:
  """An upload whose leaves are all 0-d (per client): counted at 32 bits, never compressed."""
  return all(np.ndim(x) == 0 for x in jax.tree.leaves(value))
