"""Max pooling: `lax_max_pool` (reduce_window) and the patches plan's `patches_max_pool`."""

from __future__ import annotations

from collections.abc import Sequence
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_lama.kernels import shapes

Array = jax.Array
Padding = shapes.Padding


def _blocks(x: Array, window: tuple[int, int]) -> Array:
  """[n, h, w, c] -> [n, h // kh, kh, w // kw, kw, c]: each pooling window as two axes
  (the rows and columns past the last whole window cropped)."""
  (kh, kw), (n, h, w, c) = window, x.shape
  ho, wo = h // kh, w // kw
  return x[:, :ho * kh, :wo * kw, :].reshape(n, ho, kh, wo, kw, c)


def _window_taps(x: Array, window: tuple[int, int]) -> list[Array]:
  """The kh*kw [n, h // kh, w // kw, c] strided slices, one per position in the window."""
  (kh, kw), (h, w) = window, x.shape[1:3]
  ho, wo = h // kh, w // kw
  return [x[:, i:ho * kh:kh, j:wo * kw:kw, :] for i in range(kh) for j in range(kw)]


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _block_max_pool(x: Array, window: tuple[int, int]) -> Array:
  """Max over the non-overlapping windows tiling x (a last partial window dropped); ties
  share the gradient equally, JAX's own rule for `max` over the window axes.

  Why a custom VJP: JAX's rule counts the ties with a strided reduce_sum over the window
  axes. Here the backward counts them with elementwise compares of the kh*kw window slices
  and sends g / count to every maximum in one broadcast select. The forward is `max` over
  the window axes when the windows tile x exactly, and an elementwise max of the strided
  slices when they crop it (the slices read x in place; the reshape would copy the crop).
  The backward gained 1.04x to 1.10x in the engine on the zoo's pooling models on CPU, the
  slices forward a further 1.01x to 1.04x where a window crops (benchmarks/conv/RULES.md).
  """
  kh, kw = window
  if x.shape[1] % kh or x.shape[2] % kw:
    return functools.reduce(jnp.maximum, _window_taps(x, window))
  return _blocks(x, window).max(axis=(2, 4))


def _block_max_pool_fwd(x, window):
  y = _block_max_pool(x, window)
  return y, (x, y)


def _block_max_pool_bwd(window, residuals, g):
  x, y = residuals
  b = _blocks(x, window)
  count = sum((tap == y).astype(g.dtype) for tap in _window_taps(x, window))
  share = (g / count)[:, :, None, :, None, :]
  hit = b == y[:, :, None, :, None, :]
  dx = jnp.where(hit, share, jnp.zeros_like(share)).reshape(
      (x.shape[0], y.shape[1] * window[0], y.shape[2] * window[1], x.shape[3]))
  crop = (x.shape[1] - dx.shape[1], x.shape[2] - dx.shape[2])
  if any(crop):
    dx = jnp.pad(dx, ((0, 0), (0, crop[0]), (0, crop[1]), (0, 0)))
  return (dx,)


_block_max_pool.defvjp(_block_max_pool_fwd, _block_max_pool_bwd)

def lax_max_pool(x: Array, window: Sequence[int] = (2, 2),
                 strides: Sequence[int] | None = None, padding: Padding = "VALID") -> Array:
  """NHWC max pooling by `flax.linen.max_pool` (reduce_window)."""
  window = tuple(window)
  strides = tuple(strides) if strides is not None else window
  return nn.max_pool(x, window, strides,
                     padding=padding if isinstance(padding, str) else tuple(padding))


def patches_max_pool(x: Array, window: Sequence[int] = (2, 2),
                     strides: Sequence[int] | None = None, padding: Padding = "VALID") -> Array:
  """NHWC max pooling by reshape or strided slices + max: the patches plan's pool.

  reduce_window and its select-and-scatter gradient sit in the same CPU loop trap as
  convolutions; reshape + max is a plain reduction.
  """
  window = tuple(window)
  strides = tuple(strides) if strides is not None else window
  pads = shapes.pads(x.shape[1:3], window, strides, padding)
  if any(p != (0, 0) for p in pads):
    x = jnp.pad(x, ((0, 0), *pads, (0, 0)), constant_values=-jnp.inf)
  (kh, kw), (sh, sw) = window, strides
  ho = (x.shape[1] - kh) // sh + 1
  wo = (x.shape[2] - kw) // sw + 1
  if (kh, kw) == (sh, sw):
    return _block_max_pool(x, window)
  return functools.reduce(jnp.maximum, shapes.window_slices(x, window, strides, (ho, wo)))
