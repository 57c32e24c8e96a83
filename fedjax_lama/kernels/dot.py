"""Dense products (x @ kernel): `lax_dense` (jnp.dot) and the patches plan's `patches_dense`."""

from __future__ import annotations

import math

import jax
from jax import lax
from jax.custom_derivatives import SymbolicZero
import jax.numpy as jnp

from fedjax_lama.kernels import shapes

Array = jax.Array

# A kernel of >= 4M elements (16 MB in float32, past a core's L2) on <= 32 rows: the large
# kernel as the products' left operand (`_wide_kernel_dot`); see benchmarks/conv/RULES.md.
_DENSE_T_MIN_KERNEL = 1 << 22
_DENSE_T_MAX_ROWS = 32
# On CPU, a kernel of <= 16,384 elements: its gradient as (dy^T x)^T (`_small_kernel_dot`);
# larger kernels lost in the whole engine (benchmarks/conv/RULES.md).
_DENSE_SMALL_MAX_KERNEL = 1 << 14
_DENSE_SMALL_PLATFORMS = ("cpu",)


def lax_dense(x: Array, kernel: Array) -> Array:
  """x @ kernel over x's last axis."""
  return jnp.dot(x, kernel)


def patches_dense(x: Array, kernel: Array, platform: str | None = None) -> Array:
  """x @ kernel over x's last axis, laid out for XLA:CPU where that measured faster.

  A kernel of at least `_DENSE_T_MIN_KERNEL` elements applied to at most `_DENSE_T_MAX_ROWS`
  rows goes through `_wide_kernel_dot`, and on CPU (`platform`, default JAX's default backend
  when traced) a kernel of at most `_DENSE_SMALL_MAX_KERNEL` elements through
  `_small_kernel_dot`; everything else is `jnp.dot`.
  """
  rows = math.prod(x.shape[:-1])
  flat = lambda: x.reshape(rows, x.shape[-1])
  unflat = lambda y: y.reshape(*x.shape[:-1], kernel.shape[1])
  if kernel.size >= _DENSE_T_MIN_KERNEL and rows <= _DENSE_T_MAX_ROWS:
    return unflat(_wide_kernel_dot(flat(), kernel))
  if (kernel.size <= _DENSE_SMALL_MAX_KERNEL
      and shapes.on_platform(_DENSE_SMALL_PLATFORMS, platform)):
    return unflat(_small_kernel_dot(flat(), kernel))
  return jnp.dot(x, kernel)


@jax.custom_vjp
def _small_kernel_dot(x: Array, kernel: Array) -> Array:
  """x [rows, in] @ kernel [in, out], the kernel's gradient computed as (dy^T x)^T.

  Why: autodiff's x^T dy contracts the row axis of both operands, a product XLA:CPU hands
  to Eigen; for the engine's clients mapped together (the 8x8 `mlp`: [8, 32, 64] and
  [8, 32, 128]) those batched Eigen products were the largest kind of operation in a round's
  trace. With dy^T materialised behind an optimization barrier, the
  product is a plain [out, rows] x [rows, in] one. The same values up to float32 rounding.
  """
  return x @ kernel


# Both products take symbolic zeros: a kernel that is not differentiated (a LoRA run's
# frozen base, models/lora.py) gets no gradient, and its input x is not kept for one.
# Without it the backward pass computed every frozen kernel's gradient for nothing, per
# client under the client vmap, behind optimization barriers XLA does not remove.
def _small_kernel_dot_fwd(x, kernel):
  x, kernel, wanted = x.value, kernel.value, kernel.perturbed
  return x @ kernel, (x if wanted else None, kernel)


def _small_kernel_dot_bwd(residuals, dy: Array):
  x, kernel = residuals
  if isinstance(dy, SymbolicZero):
    return None, None
  dkernel = None
  if x is not None:
    dkernel = lax.optimization_barrier(lax.optimization_barrier(dy.T) @ x).T
  return dy @ kernel.T, dkernel


_small_kernel_dot.defvjp(_small_kernel_dot_fwd, _small_kernel_dot_bwd, symbolic_zeros=True)


@jax.custom_vjp
def _wide_kernel_dot(x: Array, kernel: Array) -> Array:
  """x [rows, in] @ kernel [in, out] with the large kernel as the products' left operand.

  Why: with few rows XLA:CPU's x @ W repacks all of W every step, and dy @ W^T runs slowly
  too. Written as (W^T x^T)^T and (W dy^T)^T, with x^T and dy^T materialised by
  optimization barriers so XLA keeps these operand orders, the products ran 1.3x and 2x
  faster (benchmarks/conv/RULES.md). The kernel's gradient x^T dy is left as XLA makes it.
  """
  return _wide_product(x, kernel)


def _wide_product(x: Array, kernel: Array) -> Array:
  x_t = lax.optimization_barrier(x.T)
  return lax.dot_general(kernel, x_t, (((0,), (0,)), ((), ()))).T


def _wide_kernel_dot_fwd(x, kernel):
  wanted = kernel.perturbed
  x, kernel = x.value, kernel.value
  return _wide_product(x, kernel), (x if wanted else None, kernel)


def _wide_kernel_dot_bwd(residuals, dy: Array):
  x, kernel = residuals
  if isinstance(dy, SymbolicZero):
    return None, None
  dx = lax.optimization_barrier(kernel @ lax.optimization_barrier(dy.T)).T
  return dx, (x.T @ dy if x is not None else None)


_wide_kernel_dot.defvjp(_wide_kernel_dot_fwd, _wide_kernel_dot_bwd, symbolic_zeros=True)
