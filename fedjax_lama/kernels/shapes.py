"""Shape helpers the kernels share: explicit padding and the static window slices."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Union

import jax
from jax import lax
import jax.numpy as jnp

Array = jax.Array
Padding = Union[str, Sequence[tuple[int, int]]]


def pads(spatial: Sequence[int], window: Sequence[int],
         strides: Sequence[int], padding: Padding) -> list[tuple[int, int]]:
  """Explicit (lo, hi) pads per spatial axis; "SAME" at stride 2 pads (0, 1) as TensorFlow."""
  if isinstance(padding, str):
    return list(lax.padtype_to_pads(tuple(spatial), tuple(window),
                                    tuple(strides), padding.upper()))
  return [tuple(p) for p in padding]


def pad_input(x: Array, window: Sequence[int], strides: Sequence[int],
              padding: Padding) -> tuple[Array, tuple[int, int]]:
  """x [N, H, W, C] padded for `padding`, and the (ho, wo) output size of a valid window."""
  (kh, kw) = window
  explicit = pads(x.shape[1:3], window, strides, padding)
  if any(p != (0, 0) for p in explicit):
    x = jnp.pad(x, ((0, 0), *explicit, (0, 0)))
  return x, ((x.shape[1] - kh) // strides[0] + 1, (x.shape[2] - kw) // strides[1] + 1)


def window_slices(x: Array, window: Sequence[int], strides: Sequence[int],
                  out: Sequence[int]) -> list[Array]:
  """Static strided slices x[:, i::sh, j::sw, :] of output size, row-major."""
  (kh, kw), (sh, sw), (ho, wo) = window, strides, out
  return [x[:, i:i + (ho - 1) * sh + 1:sh, j:j + (wo - 1) * sw + 1:sw, :]
          for i in range(kh) for j in range(kw)]


def on_platform(platforms: Sequence[str], platform: str | None) -> bool:
  """Whether `platform` (default: JAX's default backend, read when traced) is one of
  `platforms`, those where a measured pick applies."""
  return (platform or jax.default_backend()) in platforms
