"""The attacks' known answers on tiny stacks, with the formulas written here from the papers."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fedjax_lama import robust
from fedjax_lama.errors import HparamError

# Three honest clients, one malicious slot (3) and one padded slot (4) holding NaN.
STACK = {"w": jnp.array([[1.0, 2.0], [3.0, 2.0], [5.0, 8.0], [100.0, -100.0],
                         [np.nan, np.nan]])}
HONEST = jnp.array([1, 1, 1, 0, 0.])
MALICIOUS = jnp.array([0, 0, 0, 1, 0.])


def test_malicious_clients_fixed_by_seed():
  first = robust.malicious_clients(7, 20, fraction=0.25)
  assert first.dtype == bool and first.shape == (20,) and first.sum() == 5  # floor(0.25 * 20)
  np.testing.assert_array_equal(first, robust.malicious_clients(7, 20, count=5))
  np.testing.assert_array_equal(first, robust.malicious_clients(7, 20, fraction=0.25))
  others = [robust.malicious_clients(seed, 20, count=5) for seed in range(8, 12)]
  assert any((other != first).any() for other in others)
  assert robust.malicious_clients(0, 7, fraction=0.3).sum() == math.floor(0.3 * 7)
  assert not robust.malicious_clients(0, 7, count=0).any()
  with pytest.raises(HparamError, match="fraction/count"):
    robust.malicious_clients(0, 10, fraction=0.1, count=1)
  with pytest.raises(HparamError, match="count"):
    robust.malicious_clients(0, 10, count=11)


def test_substitute_replaces_only_malicious_rows():
  sent = {"w": jnp.array([-1.0, -2.0])}
  out = robust.substitute(STACK, MALICIOUS, sent)["w"]
  np.testing.assert_array_equal(out[:3], STACK["w"][:3])
  np.testing.assert_array_equal(out[3], [-1.0, -2.0])
  assert np.isnan(out[4]).all()
  rows = {"w": -STACK["w"]}
  np.testing.assert_array_equal(robust.substitute(STACK, MALICIOUS, rows)["w"][3], [-100, 100])


def test_sign_flip():
  out = robust.sign_flip({"w": jnp.array([1.0, -2.0])}, scale=3.0)
  np.testing.assert_array_equal(out["w"], [-3.0, 6.0])


def test_gaussian_noise_is_a_function_of_its_key():
  like = {"a": jnp.zeros((100, 100)), "b": jnp.zeros(3)}
  key = jax.random.PRNGKey(4)
  first = robust.gaussian_noise(key, like, std=2.0, mean=1.0)
  again = robust.gaussian_noise(key, like, std=2.0, mean=1.0)
  other = robust.gaussian_noise(jax.random.PRNGKey(5), like, std=2.0, mean=1.0)
  np.testing.assert_array_equal(first["a"], again["a"])
  assert not np.array_equal(first["a"], other["a"])
  assert not np.array_equal(first["a"][0, :3], first["b"])  # leaves draw apart
  assert float(jnp.mean(first["a"])) == pytest.approx(1.0, abs=0.06)
  assert float(jnp.std(first["a"])) == pytest.approx(2.0, abs=0.06)


@pytest.mark.parametrize("n,f", [(50, 12), (50, 24), (20, 5), (11, 2)])
def test_little_is_enough_z_formula(n, f):
  # Baruch et al. 2019: s = floor(n/2 + 1) - f; z = Phi^-1((n - s) / n).
  s = math.floor(n / 2 + 1) - f
  assert robust.little_is_enough_z(n, f) == pytest.approx(stats.norm.ppf((n - s) / n), abs=1e-9)


def test_little_is_enough_z_by_hand_and_refusals():
  # n = 50, f = 12: s = 26 - 12 = 14, Phi^-1(36/50 = 0.72) = 0.5828.
  assert robust.little_is_enough_z(50, 12) == pytest.approx(0.58284, abs=1e-5)
  with pytest.raises(HparamError, match="num_byzantine"):
    robust.little_is_enough_z(10, 6)  # s = 0


def test_little_is_enough_on_the_honest_rows():
  # Honest rows (1, 2), (3, 2), (5, 8): mean (3, 4), sample std (2, sqrt(12)).
  out = jax.jit(robust.little_is_enough)(STACK, HONEST, 1.5)["w"]
  np.testing.assert_allclose(out, [3 - 1.5 * 2, 4 - 1.5 * math.sqrt(12)], rtol=1e-6)


def test_inner_product_manipulation():
  out = jax.jit(robust.inner_product_manipulation)(STACK, HONEST, 0.5)["w"]
  np.testing.assert_allclose(out, [-1.5, -2.0], rtol=1e-6)
  # Its inner product with the honest mean is -epsilon ||mean||^2.
  assert float(out @ jnp.array([3.0, 4.0])) == pytest.approx(-0.5 * 25)


def test_flip_labels():
  labels = jnp.array([0, 1, 9, 4])
  np.testing.assert_array_equal(robust.flip_labels(labels, 10), [9, 8, 0, 5])
  permutation = [1, 2, 3, 4, 5, 6, 7, 8, 9, 0]
  np.testing.assert_array_equal(robust.flip_labels(labels, 10, permutation=permutation),
                                [1, 2, 0, 5])
  np.testing.assert_array_equal(robust.flip_labels(labels, 10, target=7), [7, 7, 7, 7])
  np.testing.assert_array_equal(robust.flip_labels(labels, 10, target=7, source=1),
                                [0, 7, 9, 4])
  assert robust.flip_labels(labels, 10).dtype == labels.dtype
  with pytest.raises(HparamError, match="permutation"):
    robust.flip_labels(labels, 10, permutation=[0, 0, 1, 2, 3, 4, 5, 6, 7, 8])
  with pytest.raises(HparamError, match="target"):
    robust.flip_labels(labels, 10, target=10)


def test_pixel_trigger_stamps_the_pattern():
  images = jnp.full((2, 5, 5, 2), 0.5)
  out = robust.pixel_trigger(images, value=1.0, offset=1)
  expected = np.full((5, 5), 0.5)
  expected[1, 1] = expected[1, 3] = expected[2, 2] = expected[3, 1] = expected[3, 3] = 1.0
  for i in range(2):
    for c in range(2):
      np.testing.assert_array_equal(out[i, :, :, c], expected)
  with pytest.raises(HparamError, match="offset"):
    robust.pixel_trigger(images, offset=3)


def test_backdoor_examples_poison_only_the_chosen():
  images = jnp.zeros((3, 4, 4, 1))
  labels = jnp.array([2, 5, 6])
  out_images, out_labels = robust.backdoor_examples(
      images, labels, jnp.array([True, False, True]), 0, pattern=np.ones((1, 1)), offset=0)
  np.testing.assert_array_equal(out_labels, [0, 5, 0])
  assert float(out_images[0, 0, 0, 0]) == 1.0 and float(out_images[2, 0, 0, 0]) == 1.0
  assert float(jnp.sum(out_images)) == 2.0


def test_model_replacement_replaces_the_global_model():
  # Bagdasaryan et al. 2020 (model replacement): G + eta/n * gamma (X - G) = X with
  # gamma = n / eta, when the other n - 1 updates cancel.
  global_model, backdoored = jnp.array([1.0, 2.0]), jnp.array([4.0, -1.0])
  n, eta = 10, 0.5
  sent = robust.model_replacement({"w": backdoored - global_model}, n, eta)["w"]
  np.testing.assert_allclose(sent, 20 * (backdoored - global_model))
  np.testing.assert_allclose(global_model + eta / n * sent, backdoored, rtol=1e-6)
