"""Convolution plans kept only to be measured against the library's "lax" and "patches".

`kernels_for(name)` gives a `fedjax_lama.kernels.Kernels` for every name in `PLANS`, to pass
as `models.get(..., kernels=...)`:

* "lax", "patches": the library's sets (`fedjax_lama.kernels.get`).
* "im2col": `im2col_conv` for every layer (to measure the patches plan's picks against).
* "winograd": `winograd_conv` for every 3x3 and 5x5 stride-1 layer, the patches plan for the
  others, on every platform (to measure it where the rule does not take it, on GPUs).
* "patches_cpu": the patches plan with its CPU-only picks (Winograd layers, im2col's
  written-out stride-1 gradient, the small dense kernels' gradient) taken on every platform:
  one A/B on a GPU says whether they pay there.
* "patches_xla": `lax.conv_general_dilated_patches` + matmul (its backward is a convolution
  again); "shifted_sum": a sum over kernel offsets of slice @ kernel[i, j]. Both were slower.

`standard_layout_conv` (a lax convolution whose gradients are written as forward
convolutions, which escape XLA:CPU's conv-in-loop trap) is timed per layer by
`benchmarks.conv.conv_layers`; it beat the patches on one machine and lost on another
(RULES.md). The plans other than "patches" and "patches_cpu" compute dense layers with
`jnp.dot` and max pools with the patches plan's pool, as they did in the library.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import functools

import jax
from jax import lax
import jax.numpy as jnp

from fedjax_lama import kernels
from fedjax_lama.kernels import conv as kconv
from fedjax_lama.kernels import dot as kdense
from fedjax_lama.kernels import pool as kpool
from fedjax_lama.kernels import shapes
from fedjax_lama.kernels import winograd

Array = jax.Array
Padding = shapes.Padding

PLANS = ("lax", "patches", "im2col", "winograd", "patches_cpu", "patches_xla", "shifted_sum")


def resolve(name: str) -> str:
  """`name` itself, or "auto" resolved as the library does; fails naming `PLANS`."""
  if name == "auto":
    return kernels.resolve(name)
  if name not in PLANS:
    raise ValueError(f"conv_impl={name!r} is not accepted; use 'auto' or one of "
                     f"{', '.join(repr(p) for p in PLANS)}")
  return name


def conv_shifted_sum(x: Array, kernel: Array, strides: Sequence[int] = (1, 1),
                     padding: Padding = "SAME") -> Array:
  """Convolution as a sum over kernel offsets of slice @ kernel[i, j]."""
  kh, kw, cin, cout = kernel.shape
  x, (ho, wo) = shapes.pad_input(x, (kh, kw), strides, padding)
  cols = shapes.window_slices(x, (kh, kw), strides, (ho, wo))
  w = kernel.reshape(kh * kw, cin, cout)
  return sum(jnp.einsum("nhwc,cf->nhwf", c, w[k]) for k, c in enumerate(cols))


def conv_patches_xla(x: Array, kernel: Array, strides: Sequence[int] = (1, 1),
                     padding: Padding = "SAME") -> Array:
  """Convolution via `lax.conv_general_dilated_patches` + matmul."""
  kh, kw, cin, cout = kernel.shape
  pads = shapes.pads(x.shape[1:3], (kh, kw), strides, padding)
  patches = lax.conv_general_dilated_patches(
      x, (kh, kw), tuple(strides), pads, dimension_numbers=kconv.DIMENSION_NUMBERS)
  # Patch channels come out ordered (cin, kh, kw).
  k = kernel.transpose(2, 0, 1, 3).reshape(cin * kh * kw, cout)
  return jnp.einsum("nhwp,pf->nhwf", patches, k)



def winograd_everywhere_conv(x: Array, kernel: Array, strides: Sequence[int] = (1, 1),
                             padding: Padding = "SAME", bias: Array | None = None) -> Array:
  """`winograd_conv` wherever it applies, the patches plan elsewhere."""
  if not winograd.winograd_applies(kernel.shape, strides):
    return kconv.patches_conv(x, kernel, strides, padding, bias)
  y = winograd.winograd_conv(x, kernel, strides, padding)
  return y if bias is None else y + bias


def _with_bias(conv_fn):
  """A (x, kernel, strides, padding) plan as a kernel set's conv (bias added after)."""
  def layer(x, kernel, strides=(1, 1), padding="SAME", bias=None):
    y = conv_fn(x, kernel, strides, padding)
    return y if bias is None else y + bias
  return layer


@functools.lru_cache(maxsize=None)
def kernels_for(name: str) -> kernels.Kernels:
  """The kernel set of plan `name` (one object per name, so models built twice are equal)."""
  name = resolve(name)
  if name in ("lax", "patches"):
    return kernels.get(name)
  if name == "patches_cpu":
    return dataclasses.replace(kernels.get("patches", "cpu"), name="patches_cpu")
  conv = {"im2col": kconv.im2col_conv,
          "winograd": winograd_everywhere_conv,
          "patches_xla": _with_bias(conv_patches_xla),
          "shifted_sum": _with_bias(conv_shifted_sum)}[name]
  return kernels.Kernels(name, conv, kdense.lax_dense, kpool.patches_max_pool)


def _forward_conv(x: Array, kernel: Array, strides, pads, lhs_dilation=(1, 1),
                  rhs_dilation=(1, 1)) -> Array:
  return lax.conv_general_dilated(x, kernel, tuple(strides), pads, lhs_dilation=lhs_dilation,
                                  rhs_dilation=rhs_dilation, dimension_numbers=kconv.DIMENSION_NUMBERS)


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
    return out, jax.tree.map(lambda _: True, out)
  return rule


@functools.lru_cache(maxsize=None)
def _standard_layout_conv_fn(strides: tuple, pads: tuple):
  """The custom-VJP convolution for one (strides, pads).

  Its forward and gradient functions are `custom_vmap`s: under `vmap` (several clients or
  runs at once) a lax convolution with a per-client kernel becomes a grouped convolution,
  which falls back into the trap (pfl_cnn 3.6x slower with the "vmap" client map); there
  they compute `im2col_conv` and its gradients instead, the plan the layer had before.
  """
  im2col = lambda x, k: kconv.im2col_conv(x, k, strides, pads)
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

  The conv-in-loop trap (`fedjax_lama.kernels.conv`) is in the gradients, not the forward
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
  pads = tuple(tuple(p) for p in shapes.pads(x.shape[1:3], kernel.shape[:2], strides, padding))
  return _standard_layout_conv_fn(tuple(strides), pads)(x, kernel)
