"""FedPAQ's stochastic quantizer (Reisizadeh et al., AISTATS 2020) on the compressor interface of
core.py.

QSGD quantizer (Alistarh et al., NeurIPS 2017), as FedPAQ uses it (Reisizadeh et al.,
AISTATS 2020; FedLAMA AAAI Table 4b, "compression level 16" = 16 levels). Per block v
(one pytree leaf with block="leaf", the whole update with block="global"):
nu = ||v||_2 rounded to float32 (the value sent), r_j = min(s, s |v_j| / nu),
L_j = floor(r_j) + [u_j < r_j - floor(r_j)], Q(v)_j = nu sign(v_j) L_j / s; Q(0) = 0.
Bits per block: 32 (the norm) + d_b * (1 sign bit + ceil(log2(s + 1)) level bits).

Randomness (5.10 pitfalls): one key per (round, client, leaf):
key = fold_in(fold_in(fold_in(base, round), client_id), leaf_index); with block="global"
leaf_index 0 draws the uniforms of the whole flattened update.
"""
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lama.compression.core import Compressor
from fedjax_lama.tree import leaf_sizes

BLOCKS = ("leaf", "global")


class QsgdPayload(NamedTuple):
  """One block: the float32 norm, signs as int8 (+1/-1, 0 where the level is 0) and levels."""
  norm: jax.Array
  signs: jax.Array
  levels: jax.Array
  scale_levels: int  # s, static


def quantize(v: jax.Array, s: int, u: jax.Array) -> QsgdPayload:
  """Stochastic uniform quantization of one block with given uniforms u ~ U[0, 1) (Reisizadeh et
  al., AISTATS 2020).

  Taking u as an argument makes the quantizer testable by enumeration.
  """
  v = jnp.asarray(v)
  acc = jnp.promote_types(v.dtype, jnp.float32)
  x = v.astype(acc)
  norm = jnp.sqrt(jnp.sum(jnp.square(x))).astype(jnp.float32)
  safe = jnp.where(norm > 0, norm, 1.0).astype(acc)
  r = jnp.minimum(s, s * jnp.abs(x) / safe)
  low = jnp.floor(r)
  level = low + (u < (r - low)).astype(acc)
  level = jnp.where(norm > 0, level, 0)
  level_dtype = jnp.uint8 if s < 256 else jnp.uint16
  signs = (jnp.sign(x) * (level > 0)).astype(jnp.int8)
  return QsgdPayload(norm, signs, level.astype(level_dtype), s)


def dequantize(p: QsgdPayload, dtype=jnp.float32) -> jax.Array:
  return (p.norm * p.signs.astype(jnp.float32) * p.levels.astype(jnp.float32)
          / p.scale_levels).astype(dtype)


def qsgd_block_bits(size: int, s: int) -> int:
  """32 bits of norm + per coordinate one sign bit and ceil(log2(s + 1)) level bits."""
  return 32 + int(size) * (1 + math.ceil(math.log2(s + 1)))


def _leaf_keys(key: jax.Array, n: int) -> list:
  return [jax.random.fold_in(key, i) for i in range(n)]


def qsgd(levels: int = 16, block: str = "leaf") -> Compressor:
  """FedPAQ's quantizer with `levels` s >= 1 per block; block "leaf" or "global"."""
  if not isinstance(levels, (int, np.integer)) or isinstance(levels, bool) or not (
      1 <= levels <= 65535):
    raise ValueError(f"compressor.levels must be an integer in [1, 65535], got {levels!r}")
  if block not in BLOCKS:
    raise ValueError(f"compressor.block must be one of {list(BLOCKS)}, got {block!r}")
  s = int(levels)

  def encode(key, update):
    leaves, treedef = jax.tree.flatten(update)
    if block == "global":
      flat = jnp.concatenate([jnp.ravel(x).astype(jnp.float32) for x in leaves])
      u = jax.random.uniform(jax.random.fold_in(key, 0), flat.shape)
      return (quantize(flat, s, u), treedef, [(x.shape, x.dtype) for x in leaves])
    payloads = [quantize(x, s, jax.random.uniform(k, x.shape))
                for x, k in zip(leaves, _leaf_keys(key, len(leaves)))]
    return (payloads, treedef, [(x.shape, x.dtype) for x in leaves])

  def decode(payload):
    body, treedef, meta = payload
    if block == "global":
      flat = dequantize(body)
      sizes = [int(np.prod(shape)) for shape, _ in meta]
      parts = jnp.split(flat, np.cumsum(sizes)[:-1]) if sizes else []
      return jax.tree.unflatten(
          treedef, [p.reshape(shape).astype(dtype) for p, (shape, dtype) in zip(parts, meta)])
    return jax.tree.unflatten(
        treedef, [dequantize(p, dtype) for p, (_, dtype) in zip(body, meta)])

  def bits(like):
    sizes = leaf_sizes(like).tolist()
    if block == "global":
      return qsgd_block_bits(sum(sizes), s)
    return sum(qsgd_block_bits(n, s) for n in sizes)

  return Compressor(f"qsgd{s}_{block}", encode, decode, bits, unbiased=True)


