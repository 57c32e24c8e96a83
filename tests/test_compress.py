"""Compressors (FedPAQ's quantizer, Reisizadeh et al., AISTATS 2020; the compressor
interface of compression/core.py; a known answer) and FedPAQ runs."""
import itertools
import math
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lama import compression as compress
from fedjax_lama import config as config_lib
from fedjax_lama import training


def _enumerate(v, s):
  """Exact E[Q(v)] and E||Q(v) - v||^2 over the 2^d joint outcomes ."""
  v = np.asarray(v, np.float32)
  norm = float(np.linalg.norm(v))
  r = s * np.abs(v) / norm
  low = np.floor(r)
  p_up = r - low
  mean, mse = np.zeros(len(v)), 0.0
  for up in itertools.product([0, 1], repeat=len(v)):
    up = np.array(up)
    # u < p_up selects the upper level: pick u just below / at p_up.
    u = np.where(up == 1, 0.0, np.minimum(p_up, np.nextafter(np.float32(1), 0)))
    q = np.asarray(compress.dequantize(compress.quantize(jnp.asarray(v), s, jnp.asarray(u))))
    prob = float(np.prod(np.where(up == 1, p_up, 1 - p_up)))
    mean += prob * q
    mse += prob * float(np.sum((q - v) ** 2))
  return mean, mse


def test_known_answer_4_vector():
  """5.14: v = (0.1, -0.2, 0.2, 0.4), s = 4: outputs, expectation, variance, bits."""
  v = jnp.array([0.1, -0.2, 0.2, 0.4])
  lower = compress.dequantize(compress.quantize(v, 4, jnp.ones(4) * 0.999))
  upper = compress.dequantize(compress.quantize(v, 4, jnp.zeros(4)))
  np.testing.assert_allclose(lower, [0, -0.125, 0.125, 0.375], atol=1e-6)
  np.testing.assert_allclose(upper, [0.125, -0.25, 0.25, 0.5], atol=1e-6)
  mean, mse = _enumerate(v, 4)
  np.testing.assert_allclose(mean, v, atol=1e-6)
  assert mse == pytest.approx(0.0125, abs=1e-6)
  assert compress.qsgd(4).bits(v) == 48
  assert compress.qsgd(16).bits(v) == 56
  assert compress.identity().bits(v) == 128


def test_monte_carlo_unbiased_within_five_standard_errors():
  v = jnp.array([0.3, -1.2, 0.05, 0.0, 2.0, -0.7])
  s, n = 3, 100_000
  keys = jax.random.split(jax.random.PRNGKey(0), n)
  q = jax.vmap(lambda k: compress.qsgd(s).roundtrip(k, {"w": v})["w"])(keys)
  norm = float(jnp.linalg.norm(v))
  r = s * np.abs(np.asarray(v)) / norm
  frac = r - np.floor(r)
  var = (norm / s) ** 2 * frac * (1 - frac)  # per coordinate, exact (Reisizadeh et al., 2020)
  se = np.sqrt(var / n)
  err = np.abs(np.asarray(q.mean(0)) - np.asarray(v))
  assert np.all(err <= 5 * se + 1e-6), (err, se)
  mse = float(jnp.mean(jnp.sum((q - v) ** 2, axis=1)))
  d = v.size
  assert mse <= min(d / s**2, math.sqrt(d) / s) * float(jnp.sum(v**2))
  assert mse == pytest.approx(float(np.sum(var)), rel=0.05)


@pytest.mark.parametrize("s", [1, 2, 15, 16, 255])
@pytest.mark.parametrize("block", ["leaf", "global"])
def test_bits_formula(s, block):
  tree = {"a": jnp.zeros((3, 5)), "b": jnp.zeros(7), "c": jnp.zeros((2, 2, 2))}
  per_coord = 1 + math.ceil(math.log2(s + 1))
  expected = (3 * 32 + 30 * per_coord) if block == "leaf" else 32 + 30 * per_coord
  assert compress.qsgd(s, block).bits(tree) == expected
  if block == "leaf":
    np.testing.assert_array_equal(compress.leaf_bits(compress.qsgd(s), tree),
                                  [32 + 15 * per_coord, 32 + 7 * per_coord,
                                   32 + 8 * per_coord])


@pytest.mark.parametrize("block", ["leaf", "global"])
@pytest.mark.slow
def test_lattice_levels_and_zero_block(block):
  tree = {"w": jax.random.normal(jax.random.PRNGKey(1), (4, 6)), "z": jnp.zeros(5)}
  s = 5
  comp = compress.qsgd(s, block)
  payload = comp.encode(jax.random.PRNGKey(2), tree)
  out = comp.decode(payload)
  assert jax.tree.structure(out) == jax.tree.structure(tree)
  if block == "leaf":
    for p in payload[0]:
      assert int(jnp.max(p.levels)) <= s
    norm = float(jnp.linalg.norm(tree["w"]))
    steps = np.asarray(out["w"]) * s / norm
    np.testing.assert_allclose(steps, np.round(steps), atol=1e-4)
    np.testing.assert_array_equal(out["z"], 0)
  assert comp.bits(tree) == compress.qsgd(s, block).bits(jax.tree.map(jnp.zeros_like,
                                                                               tree))


def test_bad_levels_and_block_rejected():
  with pytest.raises(ValueError, match="levels"):
    compress.qsgd(0)
  with pytest.raises(ValueError, match="block"):
    compress.qsgd(4, "row")


def test_draws_depend_only_on_round_client_and_leaf():
  """Reordering or padding the cohort does not change a client's decoded update."""
  comp = compress.qsgd(4)
  key = compress.base_key(0)
  ups = {"w": jax.random.normal(jax.random.PRNGKey(3), (3, 10))}
  a = compress.compress_clients(comp, key, 7, jnp.array([5, 9, 2]), ups)
  perm = jnp.array([2, 0, 1])
  b = compress.compress_clients(comp, key, 7, jnp.array([2, 5, 9]),
                                jax.tree.map(lambda x: x[perm], ups))
  np.testing.assert_array_equal(np.asarray(a["w"])[perm], b["w"])
  c = compress.compress_clients(comp, key, 8, jnp.array([5, 9, 2]), ups)
  assert not np.array_equal(a["w"], c["w"])


def _digits(**overrides):
  c = config_lib.base_config()
  c.num_clients, c.rounds, c.local_steps, c.plots = 8, 3, 3, False
  c.weighting = "uniform"
  c.update_from_flattened_dict(overrides)
  return c


_RUNS = {}


def _run(c):
  """Runs are shared between tests (each costs a compile)."""
  key = c.to_json()
  if key not in _RUNS:
    _RUNS[key] = _train(c)
  return _RUNS[key]


def _train(c):
  with tempfile.TemporaryDirectory() as d:
    s = training.train_and_evaluate(c, d)
    with open(f"{d}/metrics.jsonl") as f:
      lines = f.read()
  return s, lines


def test_fedpaq_with_identity_equals_fedavg():
  s_avg, m_avg = _run(_digits(algorithm="fedavg"))
  s_paq, m_paq = _run(_digits(**{"algorithm": "fedpaq", "compressor.name": "identity"}))
  assert s_avg["final_test_loss"] == s_paq["final_test_loss"]
  assert s_avg["comm_bits_up"] == s_paq["comm_bits_up"] == 32 * s_avg["comm_floats_up"]


def test_fedpaq_quantizes_and_counts_bits():
  s_avg, _ = _run(_digits(algorithm="fedavg"))
  s_paq, _ = _run(_digits(algorithm="fedpaq"))
  assert s_paq["final_test_loss"] != s_avg["final_test_loss"]
  assert s_paq["comm_floats_up"] == s_avg["comm_floats_up"]
  # 16 levels: 6 bits per coordinate plus 32 per leaf, per client and round.
  params = s_avg["num_parameters"]
  leaves = len(s_avg["comm_floats_up_per_layer"])
  clients_rounds = s_avg["comm_floats_up"] // params
  assert s_paq["comm_bits_up"] == clients_rounds * (6 * params + 32 * leaves)


def test_fedlama_phi1_with_qsgd_equals_fedpaq():
  """FedPAQ + FedLAMA with phi = 1 is FedPAQ(tau'): same draws, same model."""
  s_paq, _ = _run(_digits(algorithm="fedpaq"))
  s_lama, _ = _run(_digits(**{"algorithm": "fedlama", "fedlama.phi": 1,
                              "fedlama.base_interval": 3, "fedlama.total_steps": 9,
                              "compressor.name": "qsgd"}))
  assert s_lama["final_test_loss"] == pytest.approx(s_paq["final_test_loss"], rel=1e-5)
  assert s_lama["comm_bits_up"] == s_paq["comm_bits_up"]


def test_fedlama_rejects_global_block():
  c = _digits(**{"algorithm": "fedlama", "compressor.name": "qsgd",
                 "compressor.block": "global"})
  with pytest.raises(config_lib.ConfigError, match="compressor.block"):
    config_lib.validate(c)
