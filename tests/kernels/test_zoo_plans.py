"""The zoo under the "patches" kernel set equals it under "lax": outputs and gradients of
whole models, and the engine's shape jit(vmap(scan)) against a per-step loop (FedJAX's)."""

from jax import lax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_lama import models
from tests.test_models import CIFAR
from tests.test_models import _loss_and_grads
from tests.test_models import _numpy_variables
from tests.test_models import _sample


@pytest.mark.parametrize("name,with_grads", [
    ("fedat_cnn", False),
    pytest.param("fedat_cnn", True, marks=pytest.mark.slow),
    pytest.param("mnist_cnn", True, marks=pytest.mark.slow),
    pytest.param("resnet20", True, marks=pytest.mark.slow),
    pytest.param("leaf_cnn", False, marks=pytest.mark.slow),
    ("pfl_cnn", True),  # Winograd's F(4x4, 3x3) on its 28x28 32 -> 64 layer.
    pytest.param("resnet9", False, marks=pytest.mark.slow),
    pytest.param("resnet18_gn", False, marks=pytest.mark.slow),
    pytest.param("fedspeed_lenet", False, marks=pytest.mark.slow),
    ("mlp", True),  # `dense_dot`'s small-kernel gradient on CPU.
    ("mnist_mlp", True)])
@pytest.mark.slow
def test_patches_matches_lax_outputs_and_gradients(name, with_grads):
  x = _sample(name, batch=3)
  ref_model = models.get(name, 10, kernels="lax")
  variables = _numpy_variables(ref_model, x)
  train = "batch_stats" in variables  # Batch statistics in the forward pass.
  (ref_loss, ref_logits), ref_grads = _loss_and_grads(ref_model, variables, x,
                                                      train)
  model = models.get(name, 10, kernels="patches")
  (loss, logits), grads = _loss_and_grads(model, variables, x, train)
  np.testing.assert_allclose(logits, ref_logits, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  if with_grads:
    for g, r in zip(jax.tree.leaves(grads),
                    jax.tree.leaves(ref_grads)):
      np.testing.assert_allclose(g, r, rtol=1e-3,
                                 atol=1e-4 * float(jnp.max(jnp.abs(r))) + 1e-6)


@pytest.mark.slow
def test_vmapped_scan_with_patches_equals_per_step_loop_with_lax():
  """jit(vmap(scan)) under "patches" reproduces FedJAX's per-step loop."""
  clients, steps, batch, lr = 2, 3, 4, 0.05
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(clients, steps, batch) + CIFAR), jnp.float32)
  y = jnp.asarray(rng.integers(0, 10, size=(clients, steps, batch)))

  def sgd(model):
    def step(p, xy):
      g = jax.grad(lambda p: optax.softmax_cross_entropy_with_integer_labels(
          model.apply(p, xy[0]), xy[1]).mean())(p)
      return jax.tree.map(lambda a, b: a - lr * b, p, g), None
    return step

  lax_model = models.get("fedat_cnn", 10, kernels="lax")
  params = _numpy_variables(lax_model, x[0, 0])
  step = jax.jit(lambda p, xb, yb: sgd(lax_model)(p, (xb, yb))[0])
  expected = []
  for c in range(clients):
    p = params
    for k in range(steps):
      p = step(p, x[c, k], y[c, k])
    expected.append(p)
  expected = jax.tree.map(lambda *a: jnp.stack(a), *expected)

  local = lambda p, xs, ys: lax.scan(
      sgd(models.get("fedat_cnn", 10, kernels="patches")), p, (xs, ys))[0]
  got = jax.jit(jax.vmap(local, in_axes=(None, 0, 0)))(params, x, y)
  for g, e in zip(jax.tree.leaves(got),
                  jax.tree.leaves(expected)):
    np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)

