"""The dense kernels against a numpy reference (values, gradients, under vmap) and the
patches plan's rule for them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lama import kernels
from fedjax_lama.kernels import dot


@pytest.mark.parametrize("layout", ["_wide_kernel_dot", "_small_kernel_dot"])
def test_dense_layouts_equal_a_numpy_reference_with_gradients_and_under_vmap(layout,
                                                                            monkeypatch):
  """`dense_dot`'s CPU layouts (a large kernel on few rows; a small kernel's gradient): the
  values of x @ W and the gradients dy W^T and x^T dy, written here in numpy, alone and per
  client under vmap. The wide layout's threshold is lowered so a small kernel takes it."""
  if layout == "_wide_kernel_dot":
    monkeypatch.setattr(dot, "_DENSE_T_MIN_KERNEL", 1)
  called = []
  real = getattr(dot, layout)
  monkeypatch.setattr(dot, layout, lambda *a: called.append(1) or real(*a))
  rng = np.random.default_rng(0)
  x = rng.normal(size=(3, 2, 5, 7)).astype(np.float32)  # clients, batch..., in
  w = rng.normal(size=(3, 7, 4)).astype(np.float32)
  dy = rng.normal(size=(3, 2, 5, 4)).astype(np.float32)

  def value_and_grads(x, w, dy):
    y, vjp = jax.vjp(lambda x, w: dot.patches_dense(x, w), x, w)
    return (y, *vjp(dy))

  program = str(jax.make_jaxpr(value_and_grads)(x[0], w[0], dy[0]))
  assert called and "optimization_barrier" in program  # the layout, not jnp.dot
  for got in (value_and_grads(x[0], w[0], dy[0]),
              [g[0] for g in jax.jit(jax.vmap(value_and_grads))(x, w, dy)]):
    y, gx, gw = got
    np.testing.assert_allclose(y, x[0] @ w[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gx, dy[0] @ w[0].T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw, x[0].reshape(-1, 7).T @ dy[0].reshape(-1, 4),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl,rows,kernel_in,expected", [
    ("patches", 32, 2048, True), ("patches", 33, 2048, False), ("patches", 32, 2047, False),
    ("lax", 32, 2048, False)])
def test_dense_dot_routes_by_measured_rule(impl, rows, kernel_in, expected, monkeypatch):
  """The layout of `_wide_kernel_dot` only under the CPU plan, for a kernel of at least
  4M elements on at most 32 rows; the lax plan is always jnp.dot."""
  called = []
  real = dot._wide_kernel_dot
  monkeypatch.setattr(dot, "_wide_kernel_dot", lambda *a: called.append(1) or real(*a))
  y = jax.eval_shape(lambda x, w: kernels.get(impl).dense(x, w),
                     jax.ShapeDtypeStruct((rows, kernel_in), jnp.float32),
                     jax.ShapeDtypeStruct((kernel_in, 2048), jnp.float32))
  assert y.shape == (rows, 2048)
  assert bool(called) == expected


@pytest.mark.parametrize("impl,kernel_in,platform,expected", [
    ("patches", 128, "cpu", True), ("patches", 129, "cpu", False),
    ("patches", 128, "gpu", False), ("lax", 128, "cpu", False)])
def test_dense_dot_takes_the_small_kernel_gradient_by_measured_rule(impl, kernel_in, platform,
                                                                    expected, monkeypatch):
  """`_small_kernel_dot` only under the patches plan on CPU, for a kernel of at most
  16,384 elements (here 128 x 128)."""
  called = []
  real = dot._small_kernel_dot
  monkeypatch.setattr(dot, "_small_kernel_dot", lambda *a: called.append(1) or real(*a))
  y = jax.eval_shape(lambda x, w: kernels.get(impl, platform).dense(x, w),
                     jax.ShapeDtypeStruct((4, 32, kernel_in), jnp.float32),
                     jax.ShapeDtypeStruct((kernel_in, 128), jnp.float32))
  assert y.shape == (4, 32, 128)
  assert bool(called) == expected

