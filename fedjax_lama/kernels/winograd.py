"""Winograd's minimal filtering F(4x4, 3x3) and F(2x2, 5x5), with written-out transposes.

Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", CVPR 2016. The patches
plan takes `winograd_conv` on CPU for wide stride-1 3x3 and 5x5 layers (`conv.WINOGRAD_RULES`).
"""

from __future__ import annotations

from collections.abc import Sequence
import functools

import jax
import jax.numpy as jnp

from fedjax_lama.kernels import shapes

Array = jax.Array
Padding = shapes.Padding


# Winograd's minimal filtering F(m x m, r x r) (Lavin and Gray, "Fast Algorithms for
# Convolutional Neural Networks", CVPR 2016), keyed by (m, r): B^T (input tiles of
# a = m + r - 1), G (kernel) and A^T (output tiles of m x m), from the interpolation points
# 0, 1, -1 (a = 4) or 0, +-1, +-2 (a = 6) and infinity. F(4x4, 3x3) is the paper's section
# 4.2 table, also cuDNN's and oneDNN's. Every table is checked against a direct 1-D
# correlation (tests/kernels/test_winograd.py).
# B^T for 6-point tiles (points 0, +-1, +-2, infinity), shared by F(4x4, 3x3) and F(2x2, 5x5).
_WINOGRAD_B6_T = ((4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0),
                  (0, -2, -1, 2, 1, 0), (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1))
_WINOGRAD_TRANSFORMS = {
    (2, 3): (((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)),
             ((1, 0, 0), (1 / 2, 1 / 2, 1 / 2), (1 / 2, -1 / 2, 1 / 2), (0, 0, 1)),
             ((1, 1, 1, 0), (0, 1, -1, -1))),
    (4, 3): (_WINOGRAD_B6_T,
             ((1 / 4, 0, 0), (-1 / 6, -1 / 6, -1 / 6), (-1 / 6, 1 / 6, -1 / 6),
              (1 / 24, 1 / 12, 1 / 6), (1 / 24, -1 / 12, 1 / 6), (0, 0, 1)),
             ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0),
              (0, 1, -1, 8, -8, 1))),
    (2, 5): (_WINOGRAD_B6_T,
             ((1 / 4, 0, 0, 0, 0), (-1 / 6, -1 / 6, -1 / 6, -1 / 6, -1 / 6),
              (-1 / 6, 1 / 6, -1 / 6, 1 / 6, -1 / 6), (1 / 24, 1 / 12, 1 / 6, 1 / 3, 2 / 3),
              (1 / 24, -1 / 12, 1 / 6, -1 / 3, 2 / 3), (0, 0, 0, 0, 1)),
             ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 1))),
}


def _combination(coefficients: Sequence[float], arrays: Sequence[Array]) -> Array:
  """sum_i coefficients[i] * arrays[i], skipping zeros (the transforms are sparse)."""
  terms = [a if c == 1 else -a if c == -1 else a * c
           for c, a in zip(coefficients, arrays) if c != 0]
  return functools.reduce(lambda u, v: u + v, terms)


def _column(matrix, j: int) -> tuple:
  return tuple(row[j] for row in matrix)


def _tile_spans(m: int, r: int) -> int:
  """How many tile strides past the last tile its overlap reaches: ceil((r - 1) / m)."""
  return -(-(r - 1) // m)


def _tile_overlap_sum(parts: Sequence[Array], m: int, spans: int, axis: int) -> Array:
  """The transpose of cutting overlapping tiles along `axis`: parts[b] holds offset b of every
  tile (tiles every m positions); returns [..., tiles + spans, m, ...], where offset b of tile
  t lands on position m * (t + b // m) + b % m."""
  phases = []
  for phase in range(m):
    terms = []
    for b in range(phase, len(parts), m):
      widths = [(0, 0)] * parts[b].ndim
      widths[axis] = (b // m, spans - b // m)
      terms.append(jnp.pad(parts[b], widths))
    phases.append(functools.reduce(lambda u, v: u + v, terms))
  return jnp.stack(phases, axis=axis + 1)


def _winograd_tiles_fwd_impl(xp: Array, m: int, r: int) -> Array:
  """B^T d B of every a x a input tile (a = m + r - 1, tiles every m positions).

  xp [n, m * (th + s), m * (tw + s), c] -> [a, a, n, th, tw, c], s = `_tile_spans(m, r)`.
  The rows are transformed first (each row offset b is a slice of xp viewed as
  [n, th + s, m, ...]), then the columns: two passes of at most a terms each, no gather."""
  bt, a, s = _WINOGRAD_TRANSFORMS[m, r][0], m + r - 1, _tile_spans(m, r)
  n, hp, wp, c = xp.shape
  th, tw = hp // m - s, wp // m - s
  x6 = xp.reshape(n, th + s, m, wp, c)
  rows = [x6[:, b // m:b // m + th, b % m] for b in range(a)]
  tiles = []
  for xi in range(a):
    t6 = _combination(bt[xi], rows).reshape(n, th, tw + s, m, c)
    cols = [t6[:, :, b // m:b // m + tw, b % m] for b in range(a)]
    tiles.append(jnp.stack([_combination(bt[nu], cols) for nu in range(a)]))
  return jnp.stack(tiles)


def _winograd_tiles_transpose(dv: Array, m: int, r: int) -> Array:
  """The transpose of `_winograd_tiles_fwd_impl`, written out: B dV B^T summed back over
  the overlapping tiles."""
  bt, a, s = _WINOGRAD_TRANSFORMS[m, r][0], m + r - 1, _tile_spans(m, r)
  _, _, n, th, tw, c = dv.shape
  drows = []
  for xi in range(a):
    cols = [_combination(_column(bt, b), [dv[xi, nu] for nu in range(a)]) for b in range(a)]
    drows.append(_tile_overlap_sum(cols, m, s, 2).reshape(n, th, m * (tw + s), c))
  rows = [_combination(_column(bt, b), drows) for b in range(a)]
  return _tile_overlap_sum(rows, m, s, 1).reshape(n, m * (th + s), m * (tw + s), c)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _winograd_tiles(xp: Array, m: int, r: int) -> Array:
  """`_winograd_tiles_fwd_impl` with its transpose as the gradient.

  Why a custom VJP: autodiff's transpose of the tile slices is one zero-padded copy per
  (tile row, tile column) offset, summed: XLA:CPU fused the a^2 pads into one kernel that
  tests every pad for every element (F(4x4, 3x3)'s output-side transpose, built the same
  way, took 530 ms a step on WRN-28-10's 32x32x160 layer against 13 ms for its matmul).
  Written out, each output element sums at most `_tile_spans` + 1 shifted terms a pass."""
  return _winograd_tiles_fwd_impl(xp, m, r)


_winograd_tiles.defvjp(lambda xp, m, r: (_winograd_tiles_fwd_impl(xp, m, r), None),
                       lambda m, r, _, dv: (_winograd_tiles_transpose(dv, m, r),))


def _winograd_untile_fwd_impl(mt: Array, m: int, r: int) -> Array:
  """A^T M A of every tile: [a, a, n, th, tw, f] -> [n, m * th, m * tw, f]."""
  at, a = _WINOGRAD_TRANSFORMS[m, r][2], m + r - 1
  _, _, n, th, tw, f = mt.shape
  rows = [_combination(at[i], [mt[xi] for xi in range(a)]) for i in range(m)]
  y = jnp.stack([jnp.stack([_combination(at[j], [row[nu] for nu in range(a)]) for j in range(m)],
                           axis=3) for row in rows], axis=2)
  return y.reshape(n, m * th, m * tw, f)


def _winograd_untile_transpose(dy: Array, m: int, r: int) -> Array:
  at, a = _WINOGRAD_TRANSFORMS[m, r][2], m + r - 1
  n, h, w, f = dy.shape
  d6 = dy.reshape(n, h // m, m, w // m, m, f)
  drows = [[_combination(_column(at, nu), [d6[:, :, i, :, j] for j in range(m)])
            for nu in range(a)] for i in range(m)]
  return jnp.stack([jnp.stack([_combination(_column(at, xi), [drows[i][nu] for i in range(m)])
                               for nu in range(a)]) for xi in range(a)])


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _winograd_untile(mt: Array, m: int, r: int) -> Array:
  """`_winograd_untile_fwd_impl` with its transpose as the gradient (see `_winograd_tiles`)."""
  return _winograd_untile_fwd_impl(mt, m, r)


_winograd_untile.defvjp(lambda mt, m, r: (_winograd_untile_fwd_impl(mt, m, r), None),
                        lambda m, r, _, dy: (_winograd_untile_transpose(dy, m, r),))


def _winograd_default_tile(kernel_size: int) -> int:
  return 4 if kernel_size == 3 else 2


def winograd_conv(x: Array, kernel: Array, strides: Sequence[int] = (1, 1),
                  padding: Padding = "SAME", tile: int | None = None) -> Array:
  """A stride-1 r x r convolution by Winograd's minimal filtering F(tile x tile, r x r).

  The input is cut into overlapping a x a tiles (a = tile + r - 1) every `tile` positions
  and transformed (B^T d B), the kernel too (G g G^T); then a^2 independent matmuls
  [tiles, cin] x [cin, cout] and the output transform A^T M A. The default tile is 4 for
  3x3 kernels and 2 for 5x5 (the tables in `_WINOGRAD_TRANSFORMS`). F(4x4, 3x3) needs 36
  multiplications per 16 outputs and input channel where im2col needs 144: 4x fewer matmul
  FLOPs, for element-wise transforms over arrays 2.25x the input and output. On narrow or
  small maps the transforms cost more than the FLOPs saved (the rule in `conv.WINOGRAD_RULES`;
  benchmarks/conv/RULES.md).

  The price is precision: float32 rounding amplified by the transforms' coefficients (up to
  8). Against a float64 convolution, outputs and both gradients were off by 4e-6 to 8e-6 of
  their largest value with F(4x4, 3x3) and 3e-6 to 1e-5 with F(2x2, 5x5), against 3e-7 to
  1.1e-6 for F(2x2, 3x3), im2col, the row shift and lax itself in float32.
  """
  kh, kw, cin, cout = kernel.shape
  tile = _winograd_default_tile(kh) if tile is None else tile
  if kh != kw or (tile, kh) not in _WINOGRAD_TRANSFORMS or tuple(strides) != (1, 1):
    raise ValueError(
        f"winograd_conv needs stride 1 and a (tile, kernel size) of "
        f"{', '.join(map(str, _WINOGRAD_TRANSFORMS))}; got tile={tile}, kernel "
        f"{kernel.shape[:2]}, strides {tuple(strides)}")
  _, g, _ = _WINOGRAD_TRANSFORMS[tile, kh]
  a, spans = tile + kh - 1, _tile_spans(tile, kh)
  (top, bottom), (left, right) = shapes.pads(x.shape[1:3], (kh, kw), strides, padding)
  n, h, w, _ = x.shape
  ho, wo = h + top + bottom - kh + 1, w + left + right - kw + 1
  th, tw = -(-ho // tile), -(-wo // tile)
  # Zeros past the last tile's overlap make the padded map a whole number of tile strides.
  xp = jnp.pad(x, ((0, 0), (top, tile * (th + spans) - h - top),
                   (left, tile * (tw + spans) - w - left), (0, 0)))
  v = _winograd_tiles(xp, tile, kh).reshape(a * a, n * th * tw, cin)
  gm = jnp.asarray(g, kernel.dtype)
  u = jnp.einsum("ai,ijcf,bj->abcf", gm, kernel, gm).reshape(a * a, cin, cout)
  mt = jnp.einsum("tkc,tcf->tkf", v, u).reshape(a, a, n, th, tw, cout)
  return _winograd_untile(mt, tile, kh)[:, :ho, :wo]



def winograd_applies(kernel_shape: Sequence[int], strides: Sequence[int]) -> bool:
  """Whether `winograd_conv` (default tile) can compute a layer: stride 1, a square kernel
  with a table in `_WINOGRAD_TRANSFORMS` (3x3 and 5x5)."""
  kh, kw = kernel_shape[:2]
  return (kh == kw and (_winograd_default_tile(kh), kh) in _WINOGRAD_TRANSFORMS
          and tuple(strides) == (1, 1))
