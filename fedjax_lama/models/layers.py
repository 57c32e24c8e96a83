"""Layers shared by the model zoo: convolution, pooling and dropout with a CPU plan.

Why this module exists (architecture.md section 4, "the conv-in-loop trap"): on
XLA:CPU a `lax.conv` inside a rolled `lax.scan` trains 15-20x slower than in
straight-line code, and the simulator runs local training as a scan. Measured
closer (docs/performance.md), the forward convolution is as fast in the loop as
outside it; the gradient convolutions JAX emits (kernel gradient with batch and
features swapped, input gradient with an I/O-swapped kernel) and any grouped
convolution (what `vmap` over per-client kernels makes) are what fall off the
fast path. `Conv` therefore has several implementations
("plans") that share one parameter tree (`kernel` in HWIO, `bias`) and compute
the same function to float32 rounding (Winograd: about 10x that, `winograd_conv`):

* "lax": `lax.conv_general_dilated`; the plan for TPU (not measured there).
* "patches": the CPU and GPU plan, picked per layer by measured rules
  (`conv_patches`): mostly convolution from static slices + matmuls --
  `im2col_conv` (the kh*kw shifted slices concatenated on channels, one
  matmul with the HWIO kernel reshaped to (kh*kw*cin, cout)), `row_shift_conv`
  (slices along W only, one wider matmul, then a sum of row-shifted blocks) or
  `channel_major_conv` (the patch matrix one row per (channel, tap), for an
  image's 1 to 3 channels) -- whose gradients are pads, adds and matmuls.
  `standard_layout_conv` (a lax convolution whose gradients are written as
  forward convolutions, which is how they escape the trap: the trap is in the
  gradient convolutions JAX emits, not in the forward one) is kept to be
  measured (experiments/conv_layers.py); the rule picked it on the EPYC box
  and no longer does (see the comment above `_ROW_SHIFT_MIN_HEIGHT`).
  On CPU it takes `winograd_conv` (Winograd's F(4x4, 3x3) and F(2x2, 5x5): 4x and 2.8x
  fewer matmul FLOPs, about 10x the rounding of a direct convolution) for wide 3x3 and
  5x5 stride-1 layers on large enough maps.
* "im2col": `im2col_conv` for every layer (to measure "patches" against).
* "winograd": `winograd_conv` for every 3x3 and 5x5 stride-1 layer, "patches" for the
  others, on every platform (to measure it where the rule does not take it, on GPUs for one).
* "patches_cpu": "patches" with its CPU-only picks (Winograd layers, im2col's written-out
  stride-1 gradient, the small dense kernels' gradient) taken on every platform, each by
  its CPU rule: to measure on a GPU, in one A/B, whether they pay there.
* "patches_xla": `lax.conv_general_dilated_patches` + matmul (its backward is
  a convolution again) and "shifted_sum": a sum over kernel offsets of
  slice @ kernel[i, j]. Both exist to be measured (experiments/conv_plans.py);
  both were slower.

Max pooling follows the plan: `reduce_window` with "lax"; otherwise reshape + max (or
a max over strided slices) with its own gradient for non-overlapping windows
(`_block_max_pool`), which gained 1.7x (the reshape) and 1.1x (the gradient) on the
FedAT CNN in the engine on CPU.

Dropout follows it too: off "lax", a large mask's bits come from an unrolled Threefry
(`bernoulli`), the same bits as `jax.random.bernoulli`, whose CPU lowering is a rolled loop.
"""

from __future__ import annotations

from collections.abc import Sequence
import functools
import math
from typing import Any, Callable, Union

import flax.linen as nn
import jax
from jax import lax
import jax.numpy as jnp

Array = jax.Array
Initializer = Callable[..., Array]
Padding = Union[str, Sequence[tuple[int, int]]]

# Accepted by `Conv.conv_impl` / `conv` / `max_pool` (and "auto"). "lax" and
# "patches" are the supported plans; the others exist to be measured.
CONV_IMPLS = ("lax", "patches", "im2col", "winograd", "patches_cpu", "patches_xla",
              "shifted_sum")
# The plans that compute a layer as "patches" does ("patches_cpu": with the CPU-only picks
# taken on every platform, `_picks_platform`).
_PATCHES_PLANS = ("patches", "patches_cpu")
INIT_STYLES = ("keras", "torch", "torchvision", "flax")
_DN = ("NHWC", "HWIO", "NHWC")


def resolve_conv_impl(conv_impl: str, platform: str | None = None) -> str:
  """Maps "auto" to the measured best plan for the platform.

  "patches" on CPU (the conv-in-loop trap, architecture.md section 4) and on GPU, "lax"
  on TPU. On an H200 the engine trained 3.0x to 3.7x (FedAT's CNN) and 6.1x (ResNet20)
  faster with "patches" than with "lax" at 32 clients x 10 steps x batch 32. vmap over
  per-client kernels turns a lax convolution into one grouped convolution, while the
  patches plan is batched matmuls (docs/performance.md, "GPU: one NVIDIA H200"). TPU
  keeps "lax" until it is measured.

  Args:
    conv_impl: "auto" or one of `CONV_IMPLS`.
    platform: "cpu", "gpu", "tpu", ...; default `jax.default_backend()`.

  Returns:
    One of `CONV_IMPLS`.
  """
  if conv_impl == "auto":
    platform = platform or jax.default_backend()
    return "lax" if platform == "tpu" else "patches"
  if conv_impl not in CONV_IMPLS:
    raise ValueError(
        f"conv_impl={conv_impl!r} is not accepted; use 'auto' or one of "
        f"{', '.join(repr(c) for c in CONV_IMPLS)}")
  return conv_impl


def initializers(style: str, fan_in: int) -> tuple[Initializer, Initializer]:
  """(kernel_init, bias_init) for an init style.

  "keras": Glorot-uniform kernels, zero biases (Keras/TF1 defaults; sections
  1.6.4-1.6.6, 3.6.4). "torch": PyTorch's Linear/Conv2d defaults, kernels and
  biases ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (section 4.5.3, init_style).
  "torchvision": kaiming-normal (fan_out, ReLU gain) kernels, as torchvision's
  ResNet sets for its convolutions (2.3), zero biases. "flax": LeCun-normal
  kernels, zero biases.
  """
  if style == "keras":
    return nn.initializers.glorot_uniform(), nn.initializers.zeros
  if style == "torch":
    bound = 1.0 / math.sqrt(fan_in)
    kernel = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")

    def bias(key, shape, dtype=jnp.float32):
      return jax.random.uniform(key, shape, dtype, -bound, bound)

    return kernel, bias
  if style == "torchvision":
    return (nn.initializers.variance_scaling(2.0, "fan_out", "normal"),
            nn.initializers.zeros)
  if style == "flax":
    return nn.initializers.lecun_normal(), nn.initializers.zeros
  raise ValueError(
      f"init_style={style!r} is not accepted; use one of "
      f"{', '.join(INIT_STYLES)}")


def _picks_platform(impl: str, platform: str | None = None) -> str | None:
  """The platform whose picks a patches plan takes: "cpu" under "patches_cpu", else
  `platform` (None: JAX's default backend when traced)."""
  return "cpu" if impl == "patches_cpu" else platform


def _platform_in(platforms: Sequence[str], platform: str | None) -> bool:
  """Whether `platform` (default: JAX's default backend, read when traced) is one of
  `platforms`, those where a measured pick of the patches plan applies."""
  return (platform or jax.default_backend()) in platforms


def _pads(spatial: Sequence[int], window: Sequence[int],
          strides: Sequence[int], padding: Padding) -> list[tuple[int, int]]:
  if isinstance(padding, str):
    return list(lax.padtype_to_pads(tuple(spatial), tuple(window),
                                    tuple(strides), padding.upper()))
  return [tuple(p) for p in padding]


def _window_slices(x: Array, window: Sequence[int], strides: Sequence[int],
                   out: Sequence[int]) -> list[Array]:
  """Static strided slices x[:, i::sh, j::sw, :] of output size, row-major."""
  (kh, kw), (sh, sw), (ho, wo) = window, strides, out
  return [x[:, i:i + (ho - 1) * sh + 1:sh, j:j + (wo - 1) * sw + 1:sw, :]
          for i in range(kh) for j in range(kw)]


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
  pads = _pads(x.shape[1:3], (kh, kw), strides, padding)
  if any(p != (0, 0) for p in pads):
    x = jnp.pad(x, ((0, 0), *pads, (0, 0)))
  ho = (x.shape[1] - kh) // strides[0] + 1
  wo = (x.shape[2] - kw) // strides[1] + 1
  n, k = x.shape[0], kernel.reshape(kh * kw * cin, cout)
  ones = bias is not None and not _FOLD_BIAS_MAX_K < kh * kw * cin < _FOLD_BIAS_MIN_WIDE_K
  if ones:
    k, bias = jnp.concatenate([k, bias[None].astype(k.dtype)]), None
  if (tuple(strides) == (1, 1) and kh * kw > 1
      and _platform_in(_STRIDE1_PATCHES_PLATFORMS, platform)):
    patches = _stride1_patches(x, (kh, kw), ones)
  else:
    patches = _patch_columns(x, (kh, kw), strides, (ho, wo), ones)
  y = jnp.dot(patches.reshape(n * ho * wo, k.shape[0]), k).reshape(n, ho, wo, cout)
  return y if bias is None else y + bias


# Where `im2col_conv` takes `_stride1_patches`: measured on CPU only; GPUs keep the gradient
# of the patches plan measured there until it is measured on one.
_STRIDE1_PATCHES_PLATFORMS = ("cpu",)


def _patch_columns(x: Array, window: tuple[int, int], strides: Sequence[int],
                   out: tuple[int, int], ones: bool) -> Array:
  """The patches [n, ho, wo, kh*kw*cin], channels ordered (kh, kw, cin), and a ones column
  last when `ones` (a folded bias)."""
  cols = _window_slices(x, window, strides, out)
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
  Measured in the whole engine, A/B in one process (docs/performance.md, "Twentieth
  session"): FedAT's CNN 1.12x (8 x 5 x 32) and 1.11x to 1.13x (32 x 10 x 32), cifar_lenet
  1.04x, mnist_cnn 1.03x, pfl_cnn 1.02x, resnet20 and wrn28_10 1.01x, resnet9 1.00x. The
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
  pads = _pads(x.shape[1:3], (kh, kw), strides, padding)
  if any(p != (0, 0) for p in pads):
    x = jnp.pad(x, ((0, 0), *pads, (0, 0)))
  n, hp, wp, _ = x.shape
  sw = strides[1]
  wo = (wp - kw) // sw + 1
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
  once. Measured in the whole engine on the Xeon box (ResNet20, 8 x 5 x 32, A/B in one
  process, docs/performance.md): 1.17x and 1.19x. The values are the same: every element
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
  pads = _pads(x.shape[1:3], (kh, kw), strides, padding)
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


# Winograd's minimal filtering F(m x m, r x r) (Lavin and Gray, "Fast Algorithms for
# Convolutional Neural Networks", CVPR 2016), keyed by (m, r): B^T (input tiles of
# a = m + r - 1), G (kernel) and A^T (output tiles of m x m), from the interpolation points
# 0, 1, -1 (a = 4) or 0, +-1, +-2 (a = 6) and infinity. F(4x4, 3x3) is the paper's section
# 4.2 table, also cuDNN's and oneDNN's. Every table is checked against a direct 1-D
# correlation (tests/test_models.py).
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
  FLOPs, for element-wise transforms over arrays 2.25x the input and output. On XLA:CPU
  it trained WRN-28-10's 32x32x160 layer 2.1x faster than the row shift
  (docs/performance.md, nineteenth session); on narrow or small maps the transforms cost
  more than the FLOPs saved (`_WINOGRAD_RULES` below).

  The price is precision: float32 rounding amplified by the transforms' coefficients (up to
  8). Against a float64 convolution, outputs and both gradients were off by 4e-6 to 8e-6 of
  their largest value with F(4x4, 3x3) and 3e-6 to 1e-5 with F(2x2, 5x5), against 3e-7 to
  1.1e-6 for F(2x2, 3x3), im2col, the row shift and lax itself in float32
  (docs/performance.md, nineteenth session).
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
  (top, bottom), (left, right) = _pads(x.shape[1:3], (kh, kw), strides, padding)
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


def _forward_conv(x: Array, kernel: Array, strides, pads, lhs_dilation=(1, 1),
                  rhs_dilation=(1, 1)) -> Array:
  return lax.conv_general_dilated(x, kernel, tuple(strides), pads, lhs_dilation=lhs_dilation,
                                  rhs_dilation=rhs_dilation, dimension_numbers=_DN)


def _standard_layout_grads(x: Array, kernel: Array, dy: Array, strides: tuple, pads: tuple):
  """(dx, dkernel) of a convolution, both as forward NHWC x HWIO convolutions."""
  kh, kw = kernel.shape[:2]
  (top, bottom), (left, right) = pads
  padded = (x.shape[1] + top + bottom, x.shape[2] + left + right)
  # Rows/columns of the padded input that no window reached (floor division by the stride).
  rest = [p - ((o - 1) * s + k) for p, o, s, k in zip(padded, dy.shape[1:3], strides, (kh, kw))]
  # Input gradient: the stride-dilated dy, padded by k - 1, against the flipped kernel with
  # its in/out channels swapped; then the padding is cut off.
  flipped = jnp.flip(kernel, (0, 1)).transpose(0, 1, 3, 2)
  dx = _forward_conv(dy, flipped, (1, 1), ((kh - 1, kh - 1 + rest[0]), (kw - 1, kw - 1 + rest[1])),
                     lhs_dilation=strides)
  dx = dx[:, top:top + x.shape[1], left:left + x.shape[2], :]
  # Kernel gradient: the padded input with channels as the batch and examples as the
  # features, against dy (spatial as the window, examples as in-features, dilated by the
  # stride); the first kh x kw outputs are the taps.
  xp = jnp.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
  dk = _forward_conv(xp.transpose(3, 1, 2, 0), dy.transpose(1, 2, 0, 3), (1, 1), "VALID",
                     rhs_dilation=strides)
  return dx, dk[:, :kh, :kw, :].transpose(1, 2, 0, 3)


def _vmap_rule(fn):
  """A custom_vmap rule that maps `fn` over the batched axis (unbatched inputs broadcast)."""
  def rule(axis_size, in_batched, *args):
    args = [a if batched else jnp.broadcast_to(a, (axis_size,) + a.shape)
            for a, batched in zip(args, in_batched)]
    out = jax.vmap(fn)(*args)
    return out, jax.tree_util.tree_map(lambda _: True, out)
  return rule


@functools.lru_cache(maxsize=None)
def _standard_layout_conv_fn(strides: tuple, pads: tuple):
  """The custom-VJP convolution for one (strides, pads).

  Its forward and gradient functions are `custom_vmap`s: under `vmap` (several clients or
  runs at once) a lax convolution with a per-client kernel becomes a grouped convolution,
  which falls back into the trap (pfl_cnn 3.6x slower with the "vmap" client map); there
  they compute `im2col_conv` and its gradients instead, the plan the layer had before.
  """
  im2col = lambda x, k: im2col_conv(x, k, strides, pads)
  forward = jax.custom_batching.custom_vmap(lambda x, k: _forward_conv(x, k, strides, pads))
  forward.def_vmap(_vmap_rule(im2col))
  grads = jax.custom_batching.custom_vmap(
      lambda x, k, dy: _standard_layout_grads(x, k, dy, strides, pads))
  grads.def_vmap(_vmap_rule(lambda x, k, dy: jax.vjp(im2col, x, k)[1](dy)))
  conv = jax.custom_vjp(lambda x, k: forward(x, k))
  conv.defvjp(lambda x, k: (forward(x, k), (x, k)), lambda res, dy: grads(*res, dy))
  return conv


def standard_layout_conv(x: Array, kernel: Array, strides: Sequence[int] = (1, 1),
                         padding: Padding = "SAME") -> Array:
  """`lax.conv_general_dilated` whose gradients are forward convolutions too.

  The conv-in-loop trap (module docstring) is in the gradients, not the forward
  pass: inside a rolled scan XLA:CPU runs a forward NHWC x HWIO convolution as
  fast as in straight-line code, but the convolutions JAX's transpose rules emit
  (the kernel gradient with batch and features swapped, the input gradient with
  an I/O-swapped kernel) leave the fast path: on leaf_cnn's 5x5 32->64 layer
  they ran 52x and 7x slower in a scan than outside it. This custom VJP writes
  both as forward convolutions in the standard layout, with explicit transposes
  and dilations, which stay on the fast path. Under `vmap` it computes
  `im2col_conv` instead (see `_standard_layout_conv_fn`). Forward-mode
  differentiation (jvp) of it is not defined; nothing in the simulator uses it.
  """
  pads = tuple(tuple(p) for p in _pads(x.shape[1:3], kernel.shape[:2], strides, padding))
  return _standard_layout_conv_fn(tuple(strides), pads)(x, kernel)


# Where the per-layer picks below paid off in the whole engine (jit(scan over
# clients(scan over steps)), 8 clients x 5 steps x batch 32, one core, old and new
# pick side by side in one process, scratch measurements; docs/performance.md).
# Timed layer by layer (forward and gradients in a scan), `channel_major_conv` beat
# `im2col_conv` on every layer with 1 or 3 input channels, by 1.03x to 3.7x; in
# the whole model it paid only for few output channels: cifar_lenet (5x5 3->6)
# 1.26x to 1.77x, mnist_cnn (5x5 1->10) 1.28x to 1.31x, but resnet20 (3x3 3->16) 0.94x, leaf_cnn
# (5x5 1->32) 0.96x, fedat_cnn and pfl_cnn (3x3 3->32) 0.93x and 0.89x,
# fedspeed_lenet (5x5 3->64) 0.86x.
_CHANNEL_MAJOR_MAX_CIN = 3
_CHANNEL_MAJOR_MAX_COUT = 10

# `standard_layout_conv` is no longer picked (2026-11-24, sixth session). On the
# EPYC box it had beaten the patches in three models: pfl_cnn (3x3 32->64 on
# 28x28 outputs) 1.13x to 1.16x, leaf_cnn (5x5 32->64 on 14x14) 1.07x and 1.08x,
# resnet9 (3x3 64->64 on 32x32) 1.06x. On the project's Xeon box (AVX-512) the
# same pick made pfl_cnn 2.1x and leaf_cnn 1.16x SLOWER than im2col in the whole
# engine (docs/performance.md, models table): the plan is kept to be measured
# (experiments/conv_layers.py), as a candidate for a per-machine choice.

# Where `row_shift_conv` beats `im2col_conv` on XLA:CPU: stride 1 along H, at least 16
# output rows (the kh - 1 extra rows it computes) and several input channels (3 make a
# K = 3*kw matmul). First measured inside jit(vmap(scan)) (fwd + bwd of one layer, 8 clients
# x batch 32): 32x32x16->16 by 1.4x, 16x16x32->32 by 1.3x, losing for 64 output channels.
# Since its row fold has its own gradient (`_row_fold`) it also wins for more output
# channels, measured in the whole engine on the Xeon box (8 x 5 x 32 unless noted, A/B in one
# process, two pairs each, docs/performance.md): pfl_cnn (3x3 32->64 on 28x28) 1.19x and
# 1.15x, resnet9 (64->64 on 32x32, 128->128 on 16x16) 1.15x and 1.12x, WRN-28-10 (160 and
# 320 channels on 32x32 and 16x16, 2 x 2 x 8) 1.08x and 1.12x; with 13 and 14 output rows it
# did not pay (FedAT's CNN 0.89x and 0.91x, leaf_cnn 1.00x and 1.01x).
_ROW_SHIFT_MIN_HEIGHT = 16
_ROW_SHIFT_MIN_CIN = 8

# im2col folds a convolution's bias into its matmul (a ones column in the patches, the bias
# as the kernel's last row: no add pass forward, no reduction for the bias gradient) for
# patch widths K = kh*kw*cin up to _FOLD_BIAS_MAX_K and from _FOLD_BIAS_MIN_WIDE_K.
# Measured in the whole engine on the Xeon box (A/B in one process, two pairs each,
# docs/performance.md): folding K = 25 to 75 gained 1.02x to 1.12x (FedAT's CNN 27-wide
# first layer 1.11x and 1.12x); folding K = 250 to 576 as well lost (FedAT's CNN 0.93x
# against the narrow fold alone, mnist_cnn 0.92x, pfl_cnn 0.97x); K = 800 (leaf_cnn) tied;
# K = 1600 (fedspeed_lenet's 5x5 64->64) gained 1.15x.
_FOLD_BIAS_MAX_K = 128
_FOLD_BIAS_MIN_WIDE_K = 1024

# Where `winograd_conv` beats the row shift and im2col, on CPU: stride-1 layers with at least
# 32 input and 64 output channels, 3x3 (F(4x4, 3x3)) with outputs of at least 16 x 16, 5x5
# (F(2x2, 5x5)) with outputs of at least 10 x 10. Timed layer by layer on the Zen 5 box
# (`experiments.conv_layers`, one SGD step in a scan, ms a step; docs/performance.md,
# nineteenth session): WRN-28-10's 160 -> 160 at 32x32 75 against the row shift's 156,
# 320 -> 320 at 16x16 73 against 145, ResNet-9's 64 -> 64 at 32x32 22 against 37, 128 -> 128
# at 16x16 16 against 25, pfl_cnn's 32 -> 64 at 28x28 8.9 against 12.4, fedspeed_lenet's 5x5
# 64 -> 64 at 10x10 7.2 against im2col's 13.6, leaf_cnn's 5x5 32 -> 64 at 14x14 9.4 against
# 12.2. 3x3 lost at 8x8 (640 -> 640: 133 against im2col's 114; 256 -> 256: 23 against 21),
# at 13x13 (FedAT's CNN, 4.1 against 3.3) and with 16 or 32 channels (ResNet20's 32x32x16: 3.3
# against 2.0). In the whole engine (A/B in one process): WRN-28-10 1.44x to 1.49x, ResNet-9
# 1.17x, pfl_cnn 1.12x to 1.50x, leaf_cnn 1.34x to 1.38x, fedspeed_lenet 1.75x to 1.80x.
# GPUs keep the plan measured there until this one is measured there too.
_WINOGRAD_RULES = {3: (16, 32, 64), 5: (10, 32, 64)}  # kernel size: min output, cin, cout
_WINOGRAD_PLATFORMS = ("cpu",)


def winograd_applies(kernel_shape: Sequence[int], strides: Sequence[int]) -> bool:
  """Whether `winograd_conv` (default tile) can compute a layer: stride 1, a square kernel
  with a table in `_WINOGRAD_TRANSFORMS` (3x3 and 5x5)."""
  kh, kw = kernel_shape[:2]
  return (kh == kw and (_winograd_default_tile(kh), kh) in _WINOGRAD_TRANSFORMS
          and tuple(strides) == (1, 1))


def _winograd_pays(kernel_shape: Sequence[int], strides: Sequence[int], out: Sequence[int],
                   platform: str | None) -> bool:
  kh, _, cin, cout = kernel_shape
  if (not _platform_in(_WINOGRAD_PLATFORMS, platform) or kh not in _WINOGRAD_RULES
      or not winograd_applies(kernel_shape, strides)):
    return False
  min_out, min_cin, min_cout = _WINOGRAD_RULES[kh]
  return min(out) >= min_out and cin >= min_cin and cout >= min_cout


def conv_patches(x: Array, kernel: Array, strides: Sequence[int] = (1, 1),
                 padding: Padding = "SAME", bias: Array | None = None,
                 platform: str | None = None) -> Array:
  """The "patches" plan, the CPU plan: slices + matmuls, or convolutions off the trap.

  Picks per layer (measured on XLA:CPU; see `_CHANNEL_MAJOR_MAX_CIN`, `_WINOGRAD_RULES`,
  `_ROW_SHIFT_*` and experiments/conv_plans.py):
  `channel_major_conv` for an image's few input channels into few output
  channels; on CPU, `winograd_conv` for wide 3x3 and 5x5 stride-1 layers on large
  enough maps (`_WINOGRAD_RULES`); `row_shift_conv` for stride 1 along H, a tall output
  and several input channels; otherwise `im2col_conv` (which makes a 1x1 convolution one
  matmul on a strided slice). `standard_layout_conv` is not picked (see the
  comment on it above `_ROW_SHIFT_MIN_HEIGHT`). `platform` (default: JAX's default
  backend when traced) decides whether the CPU-only picks apply.
  """
  kh, kw, cin, cout = kernel.shape
  pads = _pads(x.shape[1:3], kernel.shape[:2], strides, padding)
  add_bias = lambda y: y if bias is None else y + bias
  if cin <= _CHANNEL_MAJOR_MAX_CIN and cout <= _CHANNEL_MAJOR_MAX_COUT and kh * kw > 1:
    return add_bias(channel_major_conv(x, kernel, strides, pads))
  ho = (x.shape[1] + sum(pads[0]) - kh) // strides[0] + 1
  wo = (x.shape[2] + sum(pads[1]) - kw) // strides[1] + 1
  if _winograd_pays(kernel.shape, strides, (ho, wo), platform):
    return add_bias(winograd_conv(x, kernel, strides, pads))
  if kh > 1 and strides[0] == 1 and ho >= _ROW_SHIFT_MIN_HEIGHT and cin >= _ROW_SHIFT_MIN_CIN:
    return add_bias(row_shift_conv(x, kernel, strides, pads))
  return im2col_conv(x, kernel, strides, pads, bias, platform)


def conv_shifted_sum(x: Array, kernel: Array, strides: Sequence[int] = (1, 1),
                     padding: Padding = "SAME") -> Array:
  """Convolution as a sum over kernel offsets of slice @ kernel[i, j]."""
  kh, kw, cin, cout = kernel.shape
  pads = _pads(x.shape[1:3], (kh, kw), strides, padding)
  if any(p != (0, 0) for p in pads):
    x = jnp.pad(x, ((0, 0), *pads, (0, 0)))
  ho = (x.shape[1] - kh) // strides[0] + 1
  wo = (x.shape[2] - kw) // strides[1] + 1
  cols = _window_slices(x, (kh, kw), strides, (ho, wo))
  w = kernel.reshape(kh * kw, cin, cout)
  return sum(jnp.einsum("nhwc,cf->nhwf", c, w[k]) for k, c in enumerate(cols))


def conv_patches_xla(x: Array, kernel: Array, strides: Sequence[int] = (1, 1),
                     padding: Padding = "SAME") -> Array:
  """Convolution via `lax.conv_general_dilated_patches` + matmul."""
  kh, kw, cin, cout = kernel.shape
  pads = _pads(x.shape[1:3], (kh, kw), strides, padding)
  patches = lax.conv_general_dilated_patches(
      x, (kh, kw), tuple(strides), pads, dimension_numbers=_DN)
  # Patch channels come out ordered (cin, kh, kw).
  k = kernel.transpose(2, 0, 1, 3).reshape(cin * kh * kw, cout)
  return jnp.einsum("nhwp,pf->nhwf", patches, k)


def conv(x: Array, kernel: Array, strides: Sequence[int] = (1, 1),
         padding: Padding = "SAME", impl: str = "lax", bias: Array | None = None) -> Array:
  """NHWC x HWIO 2-D convolution with the chosen plan (see module docstring), plus a
  per-channel `bias` if one is given (which a plan may fold into its matmul)."""
  strides = tuple(strides)
  impl = resolve_conv_impl(impl)
  if (impl in _PATCHES_PLANS
      or (impl == "winograd" and not winograd_applies(kernel.shape, strides))):
    return conv_patches(x, kernel, strides, padding, bias, _picks_platform(impl))
  if impl == "im2col":
    return im2col_conv(x, kernel, strides, padding, bias)
  if impl == "winograd":
    y = winograd_conv(x, kernel, strides, padding)
  elif impl == "lax":
    pads = _pads(x.shape[1:3], kernel.shape[:2], strides, padding)
    y = lax.conv_general_dilated(x, kernel, strides, pads, dimension_numbers=_DN)
  elif impl == "patches_xla":
    y = conv_patches_xla(x, kernel, strides, padding)
  elif impl == "shifted_sum":
    y = conv_shifted_sum(x, kernel, strides, padding)
  else:
    raise AssertionError(impl)  # resolve_conv_impl accepted an unknown plan.
  return y if bias is None else y + bias


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
  Measured in the whole engine on XLA:CPU, A/B in one process (docs/performance.md): the
  backward gains 1.04x to 1.10x on the zoo's pooling models (pfl_cnn 1.00x to 1.08x,
  resnet9 1.00x); the slices forward gains a further 1.01x to 1.04x where a window crops
  (FedAT's CNN, 13x13 maps) and loses up to 1.34x where none does (mnist_cnn).
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


def max_pool(x: Array, window: Sequence[int] = (2, 2),
             strides: Sequence[int] | None = None, padding: Padding = "VALID",
             impl: str = "lax") -> Array:
  """NHWC max pooling; reduce_window for "lax", reshape/slices + max otherwise.

  reduce_window and its select-and-scatter gradient sit in the same CPU loop
  trap as convolutions; reshape + max is a plain reduction.
  """
  window = tuple(window)
  strides = tuple(strides) if strides is not None else window
  if resolve_conv_impl(impl) == "lax":
    if isinstance(padding, str):
      return nn.max_pool(x, window, strides, padding=padding)
    return nn.max_pool(x, window, strides, padding=tuple(padding))
  pads = _pads(x.shape[1:3], window, strides, padding)
  if any(p != (0, 0) for p in pads):
    x = jnp.pad(x, ((0, 0), *pads, (0, 0)), constant_values=-jnp.inf)
  (kh, kw), (sh, sw) = window, strides
  ho = (x.shape[1] - kh) // sh + 1
  wo = (x.shape[2] - kw) // sw + 1
  if (kh, kw) == (sh, sw):
    return _block_max_pool(x, window)
  return functools.reduce(jnp.maximum, _window_slices(x, window, strides, (ho, wo)))


class Conv(nn.Module):
  """2-D convolution, NHWC input, `kernel` HWIO and `bias` leaves.

  Every plan creates the same parameters, so a checkpoint or a FedLAMA kernel
  mask does not depend on `conv_impl`.

  Attributes:
    features: output channels.
    kernel_size: (kh, kw).
    strides: (sh, sw).
    padding: "SAME", "VALID" or explicit ((lo, hi), (lo, hi)); "SAME" with
      stride 2 pads (0, 1) like TensorFlow.
    use_bias: add a `bias` leaf.
    init_style: one of `INIT_STYLES` (see `initializers`).
    conv_impl: "auto" or one of `CONV_IMPLS`.
  """
  features: int
  kernel_size: tuple[int, int] = (3, 3)
  strides: tuple[int, int] = (1, 1)
  padding: Any = "SAME"
  use_bias: bool = True
  init_style: str = "keras"
  conv_impl: str = "lax"

  @nn.compact
  def __call__(self, x: Array) -> Array:
    kh, kw = self.kernel_size
    cin = x.shape[-1]
    kernel_init, bias_init = initializers(self.init_style, kh * kw * cin)
    kernel = self.param("kernel", kernel_init, (kh, kw, cin, self.features))
    bias = self.param("bias", bias_init, (self.features,)) if self.use_bias else None
    return conv(x, kernel, self.strides, self.padding, self.conv_impl, bias)


# `dense_dot` lays the products out itself, under the "patches" plan, for a kernel of at least
# this many elements (16 MB in float32; this box has 2 MB of L2 a core) on at most this many rows.
# Measured on the Xeon box (docs/performance.md, "Tenth session"), one SGD step of x @ W in
# a scan, this layout against jnp.dot: 3136 x 2048 1.24x (16 rows), 1.18x (32), 0.83x (64);
# 4096 x 4096 1.07x, 1.22x, 1.01x; every kernel of 2M elements or fewer at 32 rows 0.85x to
# 1.04x except 784 x 200 (1.20x, but 0.90x to 0.93x for mnist_mlp in the whole engine).
_DENSE_T_MIN_KERNEL = 1 << 22
_DENSE_T_MAX_ROWS = 32
# ... and on CPU it computes the gradient of a kernel of at most this many elements as
# (dy^T x)^T (`_small_kernel_dot`). Measured in the whole engine on the Zen 5 box, 8 x 5 x 32,
# A/B in one process (docs/performance.md, "Twentieth session"): the 8x8 `mlp` (kernels of
# 8,192 and 1,280 elements) 1.09x, 1.04x to 1.10x through experiments.benchmark; mnist_mlp
# (its 200 x 10 layer) 1.03x, fedat_cnn 1.01x, cifar_lenet 1.00x, mnist_cnn 0.98x. With every
# kernel up to 65,536 elements cifar_lenet ran 0.95x and fedat_cnn 0.97x; with mnist_mlp's
# 784 x 200 kernel too, mnist_mlp 0.76x.
_DENSE_SMALL_MAX_KERNEL = 1 << 14
_DENSE_SMALL_PLATFORMS = ("cpu",)


def dense_dot(x: Array, kernel: Array, impl: str = "lax", platform: str | None = None) -> Array:
  """x @ kernel over x's last axis, laid out for XLA:CPU where that measured faster.

  Under the "patches" plan (`resolve_conv_impl`), a kernel of at least
  `_DENSE_T_MIN_KERNEL` elements applied to at most `_DENSE_T_MAX_ROWS` rows goes through
  `_wide_kernel_dot`, and on CPU (`platform`, default JAX's default backend when traced;
  every platform under "patches_cpu") a kernel of at most `_DENSE_SMALL_MAX_KERNEL`
  elements through `_small_kernel_dot`; everything else is `jnp.dot`.
  """
  rows = math.prod(x.shape[:-1])
  flat = lambda: x.reshape(rows, x.shape[-1])
  unflat = lambda y: y.reshape(*x.shape[:-1], kernel.shape[1])
  impl = resolve_conv_impl(impl)
  if impl in _PATCHES_PLANS:
    if kernel.size >= _DENSE_T_MIN_KERNEL and rows <= _DENSE_T_MAX_ROWS:
      return unflat(_wide_kernel_dot(flat(), kernel))
    if (kernel.size <= _DENSE_SMALL_MAX_KERNEL
        and _platform_in(_DENSE_SMALL_PLATFORMS, _picks_platform(impl, platform))):
      return unflat(_small_kernel_dot(flat(), kernel))
  return jnp.dot(x, kernel)


@jax.custom_vjp
def _small_kernel_dot(x: Array, kernel: Array) -> Array:
  """x [rows, in] @ kernel [in, out], the kernel's gradient computed as (dy^T x)^T.

  Why: autodiff's x^T dy contracts the row axis of both operands, a product XLA:CPU hands
  to Eigen; for the engine's clients mapped together (the 8x8 `mlp`: [8, 32, 64] and
  [8, 32, 128]) those batched Eigen products were the largest kind of operation in a round's
  trace (0.28 of 0.87 ms). With dy^T materialised behind an optimization barrier, the
  product is a plain [out, rows] x [rows, in] one. The same values up to float32 rounding.
  """
  return x @ kernel


def _small_kernel_dot_fwd(x: Array, kernel: Array):
  return x @ kernel, (x, kernel)


def _small_kernel_dot_bwd(residuals, dy: Array):
  x, kernel = residuals
  dkernel = lax.optimization_barrier(lax.optimization_barrier(dy.T) @ x).T
  return dy @ kernel.T, dkernel


_small_kernel_dot.defvjp(_small_kernel_dot_fwd, _small_kernel_dot_bwd)


@jax.custom_vjp
def _wide_kernel_dot(x: Array, kernel: Array) -> Array:
  """x [rows, in] @ kernel [in, out] with the large kernel as the products' left operand.

  Why: with few rows XLA:CPU's x @ W repacks all of W every step (3.1 ms for a
  [32, 3136] x [3136, 2048] product on the Xeon box, 134 GFLOP/s) and dy @ W^T runs at
  240 GFLOP/s. Written as (W^T x^T)^T and (W dy^T)^T, with x^T and dy^T materialised by
  optimization barriers so XLA keeps these operand orders, the products took 2.3 and 1.2
  ms (176 and 335 GFLOP/s). The kernel's gradient x^T dy is left as XLA makes it.
  """
  return _wide_kernel_dot_fwd(x, kernel)[0]


def _wide_kernel_dot_fwd(x: Array, kernel: Array):
  x_t = lax.optimization_barrier(x.T)
  return lax.dot_general(kernel, x_t, (((0,), (0,)), ((), ()))).T, (x, kernel)


def _wide_kernel_dot_bwd(residuals, dy: Array):
  x, kernel = residuals
  dx = lax.optimization_barrier(kernel @ lax.optimization_barrier(dy.T)).T
  return dx, x.T @ dy


_wide_kernel_dot.defvjp(_wide_kernel_dot_fwd, _wide_kernel_dot_bwd)


class Dense(nn.Module):
  """Dense layer with `kernel` (in, out) and `bias` leaves and an init style; `impl` is
  the model's plan (`resolve_conv_impl`), which `dense_dot` follows."""
  features: int
  use_bias: bool = True
  init_style: str = "keras"
  impl: str = "lax"

  @nn.compact
  def __call__(self, x: Array) -> Array:
    kernel_init, bias_init = initializers(self.init_style, x.shape[-1])
    kernel = self.param("kernel", kernel_init, (x.shape[-1], self.features))
    y = dense_dot(x, kernel, self.impl)
    if self.use_bias:
      y = y + self.param("bias", bias_init, (self.features,))
    return y


# ---- dropout ------------------------------------------------------------------------------

# Threefry-2x32's rotations and key-schedule constant (Salmon et al. 2011), as JAX's
# `jax._src.random.threefry2x32` uses them: 5 groups of 4 rounds, a key injection after each.
_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_THREEFRY_PARITY = 0x1BD11BDA


def _threefry2x32(k1: Array, k2: Array, x1: Array, x2: Array) -> tuple[Array, Array]:
  """Threefry-2x32 of the counters (x1, x2) under the key (k1, k2), all uint32, unrolled."""
  ks = (k1, k2, k1 ^ k2 ^ jnp.uint32(_THREEFRY_PARITY))
  x1, x2 = x1 + ks[0], x2 + ks[1]
  for group in range(5):
    for rotation in _THREEFRY_ROTATIONS[group % 2]:
      x1 = x1 + x2
      x2 = x1 ^ ((x2 << jnp.uint32(rotation)) | (x2 >> jnp.uint32(32 - rotation)))
    x1 = x1 + ks[(group + 1) % 3]
    x2 = x2 + ks[(group + 2) % 3] + jnp.uint32(group + 1)
  return x1, x2


# `bernoulli` computes the bits itself from this many values. Measured in the whole engine
# on the Zen 5 box, A/B in one process, the same parameters bit for bit (docs/performance.md,
# eighteenth session): wrn28_10 (masks of 1.3M to 5.2M values) 1.01x and 1.02x; pfl_cnn
# (295k) 0.98x, noise; mnist_cnn (640 and 1,600) 0.83x to 0.88x, not profiled (in pfl_cnn's compiled
# step XLA:CPU had fused the unrolled rounds into the masks' consumers). Alone, one mask
# took 35 ms rolled and 4.6 ms unrolled at 5.2M values (the rolled loop's state leaves the
# cache), 1.7 and 0.8 ms at 1M, 0.47 and 0.28 ms at 295k.
_UNROLLED_BITS_MIN_SIZE = 1 << 20


def _unrolled_bits_apply(key: Array, shape: tuple[int, ...]) -> bool:
  """Whether `bernoulli` computes the bits itself: `_uniform_bits` gives JAX's own bits for
  `key` and `shape` (a Threefry key, JAX's partitionable bit layout, fewer than 2^32
  values, float32 uniforms: no x64), and the mask is large enough to gain from it."""
  # getattr: a JAX that renames these options gets JAX's own sampler, never other bits.
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    impl = str(jax.random.key_impl(key))
  else:
    impl = getattr(jax.config, "jax_default_prng_impl", "") if key.shape == (2,) else ""
  return ("threefry2x32" in impl and getattr(jax.config, "jax_threefry_partitionable", False)
          and not getattr(jax.config, "jax_enable_x64", True)
          and _UNROLLED_BITS_MIN_SIZE <= math.prod(shape) < 2 ** 32)


def _uniform_bits(key: Array, shape: tuple[int, ...]) -> Array:
  """`jax.random.bits(key, shape)` (uint32) for a Threefry key, computed unrolled: value i is
  the XOR of the two words of Threefry-2x32 of the counter (0, i), i the row-major index."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  index = lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)
  hi, lo = _threefry2x32(key[0], key[1], jnp.zeros_like(index), index)
  return hi ^ lo


def bernoulli(key: Array, p: float, shape: Sequence[int], impl: str = "lax") -> Array:
  """`jax.random.bernoulli(key, p, shape)`, the same values, faster on XLA:CPU off "lax".

  Why: JAX lowers Threefry on CPU as a rolled loop of 5 iterations (to keep compile times
  down), which writes and reads its two uint32 state arrays on every iteration; XLA fuses
  the unrolled rounds into one elementwise kernel instead. One WRN-28-10 dropout mask
  [32, 32, 32, 160] took 36 ms rolled and 1.9 ms unrolled on the Zen 5 box; the rolled
  masks were 3.5 % of its training step (docs/performance.md, eighteenth session). Under
  the "lax" plan, for masks under `_UNROLLED_BITS_MIN_SIZE` values, and wherever the
  unrolled bits would not be JAX's (see `_unrolled_bits_apply`), this is
  `jax.random.bernoulli` itself: the loop the engine is measured against keeps plain JAX.
  """
  shape = tuple(shape)
  if resolve_conv_impl(impl) == "lax" or not _unrolled_bits_apply(key, shape):
    return jax.random.bernoulli(key, p, shape)
  # jax.random.uniform's float32 in [0, 1): 23 random mantissa bits under exponent 0, less 1.
  one_to_two = lax.bitcast_convert_type(
      (_uniform_bits(key, shape) >> jnp.uint32(9)) | jnp.uint32(0x3F800000), jnp.float32)
  return one_to_two - jnp.float32(1.0) < jnp.float32(p)


class Dropout(nn.Dropout):
  """`flax.linen.Dropout` whose mask comes from `bernoulli` under the model's plan `impl`:
  the same mask bit for bit (the same name, so the same 'dropout' key), faster on CPU."""
  impl: str = "lax"

  @nn.compact
  def __call__(self, inputs: Array, deterministic: bool | None = None,
               rng: Array | None = None) -> Array:
    deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
    if self.rate == 0.0 or deterministic:
      return inputs
    if self.rate == 1.0:  # flax's guard against NaN gradients
      return jnp.zeros_like(inputs)
    keep_prob = 1.0 - self.rate
    if rng is None:
      rng = self.make_rng(self.rng_collection)
    shape = [1 if d in self.broadcast_dims else n for d, n in enumerate(inputs.shape)]
    mask = jnp.broadcast_to(bernoulli(rng, keep_prob, shape, self.impl), inputs.shape)
    return lax.select(mask, inputs / keep_prob, jnp.zeros_like(inputs))
