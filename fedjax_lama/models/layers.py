"""Layers shared by the model zoo: convolution and pooling with a CPU plan.

Why this module exists (architecture.md section 4, "the conv-in-loop trap"): on
XLA:CPU a `lax.conv` inside a rolled `lax.scan` runs 15-20x slower than in
straight-line code (under `vmap` it becomes a grouped convolution, and its
kernel gradient a naive loop nest), and the simulator runs local training as
`jit(vmap(scan(step)))`. `Conv` therefore has several implementations
("plans") that share one parameter tree (`kernel` in HWIO, `bias`) and compute
the same function to float32 rounding:

* "lax": `lax.conv_general_dilated`; the plan for GPU and TPU.
* "patches": convolution from static slices + matmuls only. Per layer it
  uses `im2col_conv` (the kh*kw shifted slices concatenated on channels, one
  matmul with the HWIO kernel reshaped to (kh*kw*cin, cout)) or, where it
  measured faster, `row_shift_conv` (slices along W only, one wider matmul,
  then a sum of row-shifted blocks). Under `vmap` over clients the matmuls
  become batched matmuls, and the gradients are pads, adds and matmuls: no
  transposed convolution anywhere. The plan for CPU.
* "im2col": `im2col_conv` for every layer (to measure "patches" against).
* "patches_xla": `lax.conv_general_dilated_patches` + matmul (its backward is
  a convolution again) and "shifted_sum": a sum over kernel offsets of
  slice @ kernel[i, j]. Both exist to be measured (experiments/conv_plans.py);
  both were slower.

Max pooling follows the plan: `reduce_window` with "lax"; reshape + max (or a
max over strided slices) otherwise, which gained 1.7x on the FedAT CNN in
`jit(vmap(scan))` on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
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
CONV_IMPLS = ("lax", "patches", "im2col", "patches_xla", "shifted_sum")
INIT_STYLES = ("keras", "torch", "torchvision", "flax")
_DN = ("NHWC", "HWIO", "NHWC")


def resolve_conv_impl(conv_impl: str, platform: str | None = None) -> str:
  """Maps "auto" to the measured best plan for the platform.

  "patches" on CPU (the conv-in-loop trap, architecture.md section 4), "lax" on
  GPU and TPU, where convolutions inside loops are library calls.

  Args:
    conv_impl: "auto" or one of `CONV_IMPLS`.
    platform: "cpu", "gpu", "tpu", ...; default `jax.default_backend()`.

  Returns:
    One of `CONV_IMPLS`.
  """
  if conv_impl == "auto":
    platform = platform or jax.default_backend()
    return "patches" if platform == "cpu" else "lax"
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
                padding: Padding = "SAME") -> Array:
  """NHWC x HWIO convolution as full im2col from static slices + one matmul.

  The patch channels are ordered (kh, kw, cin), the row-major flattening of
  an HWIO kernel, so the kernel needs no transpose.
  """
  kh, kw, cin, cout = kernel.shape
  pads = _pads(x.shape[1:3], (kh, kw), strides, padding)
  if any(p != (0, 0) for p in pads):
    x = jnp.pad(x, ((0, 0), *pads, (0, 0)))
  ho = (x.shape[1] - kh) // strides[0] + 1
  wo = (x.shape[2] - kw) // strides[1] + 1
  cols = _window_slices(x, (kh, kw), strides, (ho, wo))
  patches = cols[0] if len(cols) == 1 else jnp.concatenate(cols, axis=-1)
  n = x.shape[0]
  y = jnp.dot(patches.reshape(n * ho * wo, kh * kw * cin),
              kernel.reshape(kh * kw * cin, cout))
  return y.reshape(n, ho, wo, cout)


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
  ho, sw = hp - kh + 1, strides[1]
  wo = (wp - kw) // sw + 1
  cols = [x[:, :, j:j + (wo - 1) * sw + 1:sw, :] for j in range(kw)]
  q = cols[0] if kw == 1 else jnp.concatenate(cols, axis=-1)
  k = kernel.transpose(1, 2, 0, 3).reshape(kw * cin, kh * cout)
  z = jnp.dot(q.reshape(n * hp * wo, kw * cin), k).reshape(n, hp, wo, kh, cout)
  return sum(z[:, i:i + ho, :, i, :] for i in range(kh))


# Where `row_shift_conv` beat `im2col_conv` inside jit(vmap(scan)) on XLA:CPU
# (fwd + bwd of one layer, 8 clients x batch 32): 32x32x16->16 by 1.4x and
# 16x16x32->32 by 1.3x; it lost or tied for 3 input channels (K = 3*kw matmul),
# for 64 output channels and for maps under 16 rows (the kh - 1 extra rows).
_ROW_SHIFT_MIN_HEIGHT = 16
_ROW_SHIFT_MIN_CIN = 8
_ROW_SHIFT_MAX_COUT = 32


def conv_patches(x: Array, kernel: Array, strides: Sequence[int] = (1, 1),
                 padding: Padding = "SAME") -> Array:
  """The "patches" plan: convolution as slices + matmuls, no lax.conv.

  Picks per layer (measured on XLA:CPU; see `_ROW_SHIFT_*` and
  experiments/conv_plans.py): `row_shift_conv` for stride 1 along H, a tall
  output, several input and few output channels; otherwise `im2col_conv`
  (which makes a 1x1 convolution one matmul on a strided slice).
  """
  kh, _, cin, cout = kernel.shape
  pads = _pads(x.shape[1:3], kernel.shape[:2], strides, padding)
  ho = (x.shape[1] + sum(pads[0]) - kh) // strides[0] + 1
  if (kh > 1 and strides[0] == 1 and ho >= _ROW_SHIFT_MIN_HEIGHT
      and cin >= _ROW_SHIFT_MIN_CIN and cout <= _ROW_SHIFT_MAX_COUT):
    return row_shift_conv(x, kernel, strides, pads)
  return im2col_conv(x, kernel, strides, pads)


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
         padding: Padding = "SAME", impl: str = "lax") -> Array:
  """NHWC x HWIO 2-D convolution with the chosen plan (see module docstring)."""
  strides = tuple(strides)
  impl = resolve_conv_impl(impl)
  if impl == "lax":
    pads = _pads(x.shape[1:3], kernel.shape[:2], strides, padding)
    return lax.conv_general_dilated(x, kernel, strides, pads,
                                    dimension_numbers=_DN)
  if impl == "patches":
    return conv_patches(x, kernel, strides, padding)
  if impl == "im2col":
    return im2col_conv(x, kernel, strides, padding)
  if impl == "patches_xla":
    return conv_patches_xla(x, kernel, strides, padding)
  if impl == "shifted_sum":
    return conv_shifted_sum(x, kernel, strides, padding)
  raise AssertionError(impl)  # resolve_conv_impl accepted an unknown plan.


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
    n, c = x.shape[0], x.shape[3]
    x = x[:, :ho * kh, :wo * kw, :].reshape(n, ho, kh, wo, kw, c)
    return x.max(axis=(2, 4))
  cols = _window_slices(x, window, strides, (ho, wo))
  out = cols[0]
  for c in cols[1:]:
    out = jnp.maximum(out, c)
  return out


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
    y = conv(x, kernel, self.strides, self.padding, self.conv_impl)
    if self.use_bias:
      y = y + self.param("bias", bias_init, (self.features,))
    return y


class Dense(nn.Module):
  """Dense layer with `kernel` (in, out) and `bias` leaves and an init style."""
  features: int
  use_bias: bool = True
  init_style: str = "keras"

  @nn.compact
  def __call__(self, x: Array) -> Array:
    kernel_init, bias_init = initializers(self.init_style, x.shape[-1])
    kernel = self.param("kernel", kernel_init, (x.shape[-1], self.features))
    y = jnp.dot(x, kernel)
    if self.use_bias:
      y = y + self.param("bias", bias_init, (self.features,))
    return y
