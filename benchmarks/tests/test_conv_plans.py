"""The measurement-only convolution plans (benchmarks/conv/plans.py) compute what lax does,
and "patches_cpu" takes exactly the CPU-only picks of the patches plan. Slow: they guard
measurement tools, not the library."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.conv import plans
from fedjax_lama import models
from fedjax_lama.kernels import conv as kconv
from fedjax_lama.kernels import dot as kdense
from fedjax_lama.kernels import winograd
from tests.kernels import test_conv
from tests.test_models import _sample

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("impl,cases", [
    ("im2col", test_conv.CONV_CASES),
    # Winograd on every 3x3 and 5x5 stride-1 case, the patches plan on the others.
    ("winograd", test_conv.CONV_CASES),
    ("patches_cpu", test_conv.CONV_CASES),
    ("standard_layout", test_conv.CONV_CASES),
    ("patches_xla", test_conv.CONV_CASES[:5] + test_conv.CONV_CASES[-3:]),
    ("shifted_sum", test_conv.CONV_CASES[:5] + test_conv.CONV_CASES[-3:])])
def test_measured_plans_equal_lax_conv(impl, cases, monkeypatch):
  """Each plan's convolution, input and kernel gradients equal lax's (the library's
  tolerances, tests/kernels/test_conv.py)."""
  layer = (plans.standard_layout_conv if impl == "standard_layout"
           else plans.kernels_for(impl).conv)
  # The library tests' helper, with "measured" as this plan (their lax reference kept).
  library_conv = test_conv._conv
  monkeypatch.setattr(test_conv, "_conv", lambda x, w, s=(1, 1), p="SAME", impl="lax":
                      layer(x, w, tuple(s), p) if impl == "measured" else
                      library_conv(x, w, s, p, impl))
  test_conv._assert_conv_plan_matches_lax("measured", cases, {})


@pytest.mark.parametrize("impl,backend,takes_picks", [
    ("patches", "gpu", False), ("patches_cpu", "gpu", True), ("patches", "cpu", True),
    ("patches_cpu", "cpu", True), ("lax", "cpu", False)])
def test_patches_cpu_takes_the_cpu_only_picks_on_every_platform(impl, backend, takes_picks,
                                                                 monkeypatch):
  """The "patches_cpu" measurement plan takes each CPU-only pick of "patches" (a Winograd
  layer, im2col's written-out stride-1 gradient, a small kernel's gradient) by its CPU rule
  on any backend, so one A/B on a GPU measures them there; "patches" on a GPU takes none."""
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  called = []
  for module, name in ((winograd, "winograd_conv"), (kconv, "_stride1_patches"),
                       (kdense, "_small_kernel_dot")):
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, _n=name, _f=real: called.append(_n) or _f(*a))
  ops = plans.kernels_for(impl)
  conv = lambda shape, cout: jax.eval_shape(
      lambda x: ops.conv(x, jnp.zeros((3, 3, shape[-1], cout))), jnp.zeros(shape))
  conv((1, 16, 16, 32), 64)  # wide enough for Winograd on CPU
  conv((1, 8, 8, 4), 8)  # im2col at stride 1
  jax.eval_shape(lambda x: ops.dense(x, jnp.zeros((32, 10))), jnp.zeros((4, 32)))
  assert called == (["winograd_conv", "_stride1_patches", "_small_kernel_dot"]
                    if takes_picks else [])


@pytest.mark.parametrize("name", ["fedat_cnn", "pfl_cnn", "mlp"])
def test_patches_cpu_on_cpu_is_the_patches_plan(name, monkeypatch):
  """On CPU "patches_cpu" traces to the very program of "patches" (a whole model's
  gradient), so its A/B against "patches" elsewhere isolates the CPU-only picks."""
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  programs = []
  for impl in ("patches", "patches_cpu"):
    model = models.get(name, 10, kernels=plans.kernels_for(impl))
    x = _sample(name)
    params = model.init(jax.random.PRNGKey(0), x)
    programs.append(str(jax.make_jaxpr(jax.grad(
        lambda p: jnp.sum(model.apply(p, x))))(params)))
  assert programs[0] == programs[1]



def test_standard_layout_conv_under_vmap_equals_lax_and_uses_no_convolution():
  """Several clients at once (vmap over per-client inputs and kernels): the same values and
  gradients as lax, computed by the im2col fallback -- no (grouped) convolution in the
  program, which is what XLA:CPU runs slowly inside loops."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 2, 9, 8, 3)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(2, 3, 3, 3, 4)) / 5.0, jnp.float32)

  def loss(conv):
    return lambda x, w: jnp.sum(jnp.sin(conv(x, w, (1, 1), ((1, 1), (0, 2)))))

  per_client = lambda conv: jax.vmap(jax.value_and_grad(loss(conv), argnums=(0, 1)))
  (v, (gx, gw)) = jax.jit(per_client(plans.standard_layout_conv))(x, w)
  (rv, (rgx, rgw)) = jax.jit(per_client(kconv.lax_conv))(x, w)
  for got, want in ((v, rv), (gx, rgx), (gw, rgw)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  program = str(jax.make_jaxpr(per_client(plans.standard_layout_conv))(x, w))
  assert "conv_general_dilated" not in program
  single = str(jax.make_jaxpr(jax.grad(loss(plans.standard_layout_conv), argnums=(0, 1)))(
      x[0], w[0]))
  assert single.count("conv_general_dilated") == 3  # forward, input and kernel gradients


