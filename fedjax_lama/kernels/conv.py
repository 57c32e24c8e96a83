"""Convolution plans: `lax_conv` and the patches plan (`patches_conv`) with its picks.

Why a patches plan: on XLA:CPU a convolution inside a rolled `lax.scan` (how the engine runs
local training) trains 15-20x slower than in straight-line code. The forward convolution is
as fast in the loop as outside it; the gradient convolutions JAX emits, and the grouped
convolution `vmap` over per-client kernels makes, fall off the fast path. The patches plan
computes a layer from static slices and matmuls instead, whose gradients are pads, adds and
matmuls. On a GPU the grouped convolution is slow too (the engine trained 3x to 6x faster
with the patches plan on an H200). Every plan computes the same function to float32
rounding (Winograd: about 10x that, see `winograd.winograd_conv`).

Each rule below is the shape condition under which a pick measured faster; the measurements
(per layer and in the whole engine) are in benchmarks/conv/RULES.md.
"""

from __future__ import annotations

from collections.abc import Sequence
import functools

import jax
from jax import lax
import jax.numpy as jnp

from fedjax_lama.kernels import shapes
from fedjax_lama.kernels import winograd

Array = jax.Array
Padding = shapes.Padding
DIMENSION_NUMBERS = ("NHWC", "HWIO", "NHWC")

# channel_major_conv: for an image's 1 to 3 input channels into at most 10 output channels;
# wider outputs lost in the whole model (benchmarks/conv/RULES.md).
_CHANNEL_MAJOR_MAX_CIN = 3
_CHANNEL_MAJOR_MAX_COUT = 10
# row_shift_conv: stride 1 along H, at least 16 output rows and 8 input channels; with 13-14
# rows the kh - 1 extra rows it computes did not pay (benchmarks/conv/RULES.md).
_ROW_SHIFT_MIN_HEIGHT = 16
_ROW_SHIFT_MIN_CIN = 8
# im2col folds the bias into its matmul for patch widths K up to 128 and from 1024; folding
# K = 250 to 576 lost (benchmarks/conv/RULES.md).
_FOLD_BIAS_MAX_K = 128
_FOLD_BIAS_MIN_WIDE_K = 1024
# winograd_conv, on CPU: stride 1, >= 32 in and >= 64 out channels, outputs >= 16x16 (3x3) or
# >= 10x10 (5x5); GPUs keep their measured plan until it is measured there (RULES.md).
WINOGRAD_RULES = {3: (16, 32, 64), 5: (10, 32, 64)}  # kernel size: min output, cin, cout
_WINOGRAD_PLATFORMS = ("cpu",)


def lax_conv(x: Array, kernel: Array, strides: Sequence[int] = (1, 1),
             padding: Padding = "SAME", bias: Array | None = None) -> Array:
  """NHWC x HWIO `lax.conv_general_dilated`, plus a per-channel `bias` if given."""
  pads = shapes.pads(x.shape[1:3], kernel.shape[:2], strides, padding)
  y = lax.conv_general_dilated(x, kernel, tuple(strides), pads,
                               dimension_numbers=DIMENSION_NUMBERS)
  return y if bias is None else y + bias


def im2col_conv(x: Array, kernel: Array, strides: Sequence[int] = (1, 1),
                padding: Padding = "SAME", bias: Array | None = None,
                platform: str | None = None) -> Array:
  """NHWC x HWIO convolution as full im2col from static slices + one matmul.

  The patch channels are ordered (kh, kw, cin), the row-major flattening of
  an HWIO kernel, so the kernel needs no transpose. A `bias` is folded into the
  matmul (a ones column in the patches, the bias as the kernel's last row) for
  the patch widths where that measured faster (`_FOLD_BIAS_MAX_K`), and added
  after it otherwise. At stride 1 on CPU (`platform`, default JAX's default backend when
  traced; `_STRIDE1_PATCHES_PLATFORMS`) the patches' gradient is `_stride1_patches`'.
  """
  kh, kw, cin, cout = kernel.shape
  x, (ho, wo) = shapes.pad_input(x, (kh, kw), strides, padding)
  n, k = x.shape[0], kernel.reshape(kh * kw * cin, cout)
  ones = bias is not None and not _FOLD_BIAS_MAX_K < kh * kw * cin < _FOLD_BIAS_MIN_WIDE_K
  if ones:
    k, bias = jnp.concatenate([k, bias[None].astype(k.dtype)]), None
  if (tuple(strides) == (1, 1) and kh * kw > 1
      and shapes.on_platform(_STRIDE1_PATCHES_PLATFORMS, platform)):
    patches = _stride1_patches(x, (kh, kw), ones)
  else:
    patches = _patch_columns(x, (kh, kw), strides, (ho, wo), ones)
  y = jnp.dot(patches.reshape(n * ho * wo, k.shape[0]), k).reshape(n, ho, wo, cout)
  return y if bias is None else y + bias


# im2col's written-out stride-1 gradient: measured faster on CPU only, so GPUs keep autodiff's;
# see benchmarks/conv/RULES.md.
_STRIDE1_PATCHES_PLATFORMS = ("cpu",)


def _patch_columns(x: Array, window: tuple[int, int], strides: Sequence[int],
                   out: tuple[int, int], ones: bool) -> Array:
  """The patches [n, ho, wo, kh*kw*cin], channels ordered (kh, kw, cin), and a ones column
  last when `ones` (a folded bias)."""
  cols = shapes.window_slices(x, window, strides, out)
  if ones:
    cols.append(jnp.ones(cols[0].shape[:3] + (1,), x.dtype))
  return cols[0] if len(cols) == 1 else jnp.concatenate(cols, axis=-1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _stride1_patches(x: Array, window: tuple[int, int], ones: bool) -> Array:
  """`_patch_columns` at stride 1 of an (already padded) x, whose gradient adds each
  window offset's block of the cotangent into its region of dx in place.

  Why: autodiff's transpose of the concatenated slices is kh*kw zero-padded copies of the
  blocks, summed, and XLA:CPU fuses them with the cotangent's consumers (ReLU's mask, a
  max pool's tie count) into one loop that tests every pad for every element. In FedAT's
  CNN that loop was the largest operation after the matmuls (59 of 304 ms of a round's
  operations at 8 x 5 x 32). Here there is no pad: kh*kw scatter-adds of ho x wo blocks at
  static offsets, which XLA:CPU compiles to in-place dynamic-update-slices.
  FedAT's CNN trained 1.11x to 1.13x faster in the engine (benchmarks/conv/RULES.md). The
  values are the same up to the order of float32 additions.
  """
  kh, kw = window
  out = (x.shape[1] - kh + 1, x.shape[2] - kw + 1)
  return _patch_columns(x, window, (1, 1), out, ones)


def _stride1_patches_fwd(x: Array, window: tuple[int, int], ones: bool):
  return _stride1_patches(x, window, ones), None


def _stride1_patches_bwd(window: tuple[int, int], ones: bool, _, dpatches: Array):
  (kh, kw), (n, ho, wo, width) = window, dpatches.shape
  cin = (width - int(ones)) // (kh * kw)
  dx = jnp.zeros((n, ho + kh - 1, wo + kw - 1, cin), dpatches.dtype)
  for i in range(kh):
    for j in range(kw):
      block = dpatches[..., (i * kw + j) * cin:(i * kw + j + 1) * cin]
      dx = dx.at[:, i:i + ho, j:j + wo, :].add(block)
  return (dx,)


_stride1_patches.defvjp(_stride1_patches_fwd, _stride1_patches_bwd)



def row_shift_conv(x: Array, kernel: Array, strides: Sequence[int] = (1, 1),
                   padding: Padding = "SAME") -> Array:
  """Stride-1-in-H convolution: im2col along W only, then a sum of row shifts.

  q[n, r, w, (j, c)] = x[n, r, w*sw + j, c] for every (padded) row r is kw
  times the input instead of kh*kw times; one wide matmul
  z = q @ K[(j, c), (i, f)] gives every row's contribution to each kernel row
  i, and y[n, h] = sum_i z[n, h + i, :, i] adds contiguous row blocks. The
  price is computing z for all kh-1 extra rows of the padded input.
  """
  kh, kw, cin, cout = kernel.shape
  if strides[0] != 1:
    raise ValueError(f"row_shift_conv needs stride 1 along H; got {strides}")
  x, (_, wo) = shapes.pad_input(x, (kh, kw), strides, padding)
  n, hp, wp, _ = x.shape
  sw = strides[1]
  cols = [x[:, :, j:j + (wo - 1) * sw + 1:sw, :] for j in range(kw)]
  q = cols[0] if kw == 1 else jnp.concatenate(cols, axis=-1)
  k = kernel.transpose(1, 2, 0, 3).reshape(kw * cin, kh * cout)
  z = jnp.dot(q.reshape(n * hp * wo, kw * cin), k).reshape(n, hp, wo, kh, cout)
  return _row_fold(z, kh)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _row_fold(z: Array, kh: int) -> Array:
  """y[n, h] = sum_i z[n, h + i, :, i]: `row_shift_conv`'s sum of row-shifted blocks.

  Why a custom VJP: autodiff's cotangent of z is a sum of kh zero-padded copies of dy,
  and XLA:CPU fuses the producer of dy (in ResNet20, BatchNorm's and ReLU's backward) into
  each of the kh pads of that one fusion, its largest single operation in a trace (2 ms a
  step per 32x32x16 layer). Here it is one stack of kh row-shifted slices of dy padded
  once (ResNet20 trained 1.17x faster in the engine; benchmarks/conv/RULES.md). The values
  are the same: every element
  of the cotangent is one element of dy or zero either way.
  """
  ho = z.shape[1] - kh + 1
  return sum(z[:, i:i + ho, :, i, :] for i in range(kh))


def _row_fold_fwd(z: Array, kh: int):
  return _row_fold(z, kh), None


def _row_fold_bwd(kh: int, _, dy: Array):
  # kh is passed because dy, the folded output, no longer has the kernel-row axis.
  hp = dy.shape[1] + kh - 1
  padded = jnp.pad(dy, ((0, 0), (kh - 1, kh - 1), (0, 0), (0, 0)))
  return (jnp.stack([padded[:, kh - 1 - i:kh - 1 - i + hp] for i in range(kh)], axis=3),)


_row_fold.defvjp(_row_fold_fwd, _row_fold_bwd)


def channel_major_conv(x: Array, kernel: Array, strides: Sequence[int] = (1, 1),
                       padding: Padding = "SAME") -> Array:
  """im2col with a channel-major patch matrix P[(cin, kh, kw), (n, ho, wo)].

  With an image's 1 or 3 input channels, `im2col_conv`'s NHWC patches are a
  concatenation of kh*kw pieces of cin floats per pixel: a scattered copy, and
  a matmul whose rows are 3 * kh * kw short. Here the input is viewed as
  [cin, n, h, w]; every row of P is one shifted window of one channel plane
  (contiguous runs of wo floats), and y^T = kernel^T[cout, K] @ P has the long
  pixel axis as the matmul's width. The output is transposed back to NHWC.
  """
  kh, kw, cin, cout = kernel.shape
  pads = shapes.pads(x.shape[1:3], (kh, kw), strides, padding)
  xt = jnp.transpose(x, (3, 0, 1, 2))
  if any(p != (0, 0) for p in pads):
    xt = jnp.pad(xt, ((0, 0), (0, 0), *pads))
  n, hp, wp = xt.shape[1:]
  (sh, sw) = strides
  ho, wo = (hp - kh) // sh + 1, (wp - kw) // sw + 1
  taps = [xt[:, :, i:i + (ho - 1) * sh + 1:sh, j:j + (wo - 1) * sw + 1:sw]
          for i in range(kh) for j in range(kw)]
  patches = jnp.stack(taps, axis=1).reshape(cin * kh * kw, n * ho * wo)
  k = jnp.transpose(kernel, (3, 2, 0, 1)).reshape(cout, cin * kh * kw)
  return jnp.transpose((k @ patches).reshape(cout, n, ho, wo), (1, 2, 3, 0))



def _winograd_pays(kernel_shape: Sequence[int], strides: Sequence[int], out: Sequence[int],
                   platform: str | None) -> bool:
  kh, _, cin, cout = kernel_shape
  if (not shapes.on_platform(_WINOGRAD_PLATFORMS, platform) or kh not in WINOGRAD_RULES
      or not winograd.winograd_applies(kernel_shape, strides)):
    return False
  min_out, min_cin, min_cout = WINOGRAD_RULES[kh]
  return min(out) >= min_out and cin >= min_cin and cout >= min_cout


def patches_conv(x: Array, kernel: Array, strides: Sequence[int] = (1, 1),
                 padding: Padding = "SAME", bias: Array | None = None,
                 platform: str | None = None) -> Array:
  """The "patches" plan (CPU and GPU): a layer from static slices and matmuls.

  Picks per layer, by the rules at the top of this module: `channel_major_conv` for an
  image's few input channels into few output channels; on CPU, `winograd_conv` for wide 3x3
  and 5x5 stride-1 layers on large enough maps; `row_shift_conv` for stride 1 along H, a tall
  output and several input channels; otherwise `im2col_conv` (which makes a 1x1 convolution
  one matmul on a strided slice). `platform` (default: JAX's default backend when traced)
  decides whether the CPU-only picks apply.
  """
  kh, kw, cin, cout = kernel.shape
  pads = shapes.pads(x.shape[1:3], kernel.shape[:2], strides, padding)
  add_bias = lambda y: y if bias is None else y + bias
  if cin <= _CHANNEL_MAJOR_MAX_CIN and cout <= _CHANNEL_MAJOR_MAX_COUT and kh * kw > 1:
    return add_bias(channel_major_conv(x, kernel, strides, pads))
  ho = (x.shape[1] + sum(pads[0]) - kh) // strides[0] + 1
  wo = (x.shape[2] + sum(pads[1]) - kw) // strides[1] + 1
  if _winograd_pays(kernel.shape, strides, (ho, wo), platform):
    return add_bias(winograd.winograd_conv(x, kernel, strides, pads))
  if kh > 1 and strides[0] == 1 and ho >= _ROW_SHIFT_MIN_HEIGHT and cin >= _ROW_SHIFT_MIN_CIN:
    return add_bias(row_shift_conv(x, kernel, strides, pads))
  return im2col_conv(x, kernel, strides, pads, bias, platform)
