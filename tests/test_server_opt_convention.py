"""The adaptive server optimizers' `convention` option against numpy references of both rules.

Reddi et al. (ICLR 2021, Algorithm 2), "paper": m = b1 m + (1 - b1) D, v from v_{-1} = tau^2,
x <- x + eta m / (sqrt(v) + tau), D = the round's mean delta.
Flower's FedAdam/FedYogi/FedAdagrad strategies (flwr's `aggregate_fit`), "flower": the same
moments from v = 0, and FedAdam's rate in Flower's round r = 1, 2, ...
eta_r = eta sqrt(1 - b2^(r + 1)) / (1 - b1^(r + 1)) (Flower raises beta to its round number
plus one); FedYogi's and FedAdagrad's rate is eta.
The references below are written from those rules, not from the code under test.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lama import algorithms
from fedjax_lama.algorithms.common import Common
from fedjax_lama.engine.algorithm import Aggregates
from fedjax_lama.errors import HparamError

ETA, B1, B2, TAU, ROUNDS = 0.1, 0.9, 0.99, 1e-3, 5


def deltas(seed=0):
  rng = np.random.default_rng(seed)
  return [rng.normal(scale=0.1, size=(3, 2)) for _ in range(ROUNDS)]


def reference(kind, convention, x0, ds):
  """Numpy: (params, m, v) after each round, m built from delta (m_delta = -m_G)."""
  m = np.zeros_like(x0)
  v = np.full_like(x0, TAU * TAU if convention == "paper" else 0.0)
  b1 = 0.0 if kind == "adagrad" else B1
  x, out = x0.copy(), []
  for r, d in enumerate(ds, start=1):
    m = b1 * m + (1 - b1) * d
    if kind == "adam":
      v = B2 * v + (1 - B2) * d * d
    elif kind == "yogi":
      v = v - (1 - B2) * d * d * np.sign(v - d * d)
    else:
      v = v + d * d
    eta = ETA
    if convention == "flower" and kind == "adam":
      eta = ETA * np.sqrt(1 - B2 ** (r + 1)) / (1 - B1 ** (r + 1))
    x = x + eta * m / (np.sqrt(v) + TAU)
    out.append((x.copy(), m.copy(), v.copy()))
  return out


def ours(kind, convention, x0, ds):
  hparams = {"tau": TAU, "convention": convention}
  if kind != "adagrad":
    hparams.update(beta1=B1, beta2=B2)
  out = []
  with jax.enable_x64(True):
    alg = algorithms.build("fed" + kind, Common(server_lr=ETA), **hparams)
    server = alg.server.init({"w": jnp.asarray(x0)}, {})
    for d in ds:
      server = alg.server.update(server, Aggregates({"delta": {"w": jnp.asarray(d)}},
                                                    jnp.asarray(2.0), 2))
      moments = server.opt_state if convention == "paper" or kind != "adam" \
          else server.opt_state[0]
      out.append((np.asarray(server.params["w"]), -np.asarray(moments.m["w"]),
                  np.asarray(moments.v["w"])))
  assert out[-1][0].dtype == np.float64
  return out


@pytest.mark.parametrize("convention", ["paper", "flower"])
@pytest.mark.parametrize("kind", ["adam", "yogi", "adagrad"])
def test_each_convention_equals_its_numpy_reference(kind, convention):
  x0 = np.random.default_rng(1).normal(size=(3, 2))
  ds = deltas()
  for r, (a, b) in enumerate(zip(ours(kind, convention, x0, ds), reference(kind, convention, x0,
                                                                         ds))):
    for name, x, y in zip(("params", "m", "v"), a, b):
      np.testing.assert_allclose(x, y, rtol=0, atol=1e-14, err_msg=f"round {r + 1} {name}")


@pytest.mark.parametrize("kind", ["adam", "yogi", "adagrad"])
def test_the_conventions_differ(kind):
  """Each reference would catch the other rule: they land apart after one round."""
  x0 = np.zeros((3, 2))
  ds = deltas()
  paper = ours(kind, "paper", x0, ds[:1])[0][0]
  flower = reference(kind, "flower", x0, ds[:1])[0][0]
  assert np.max(np.abs(paper - flower)) > 1e-5  # far above the references' 1e-14


def test_flower_fedadam_first_rate_is_bias_corrected():
  """Round 1 from v = 0 with one coordinate: x1 = eta_1 (1 - b1) d / (sqrt(1 - b2) |d| + tau)."""
  d = np.array([[0.5]])
  with jax.enable_x64(True):
    alg = algorithms.build("fedadam", Common(server_lr=ETA), beta1=B1, beta2=B2, tau=TAU,
                           convention="flower")
    server = alg.server.init({"w": jnp.zeros((1, 1))}, {})
    server = alg.server.update(server, Aggregates({"delta": {"w": jnp.asarray(d)}},
                                                  jnp.asarray(1.0), 1))
  eta1 = ETA * np.sqrt(1 - 0.99 ** 2) / (1 - 0.9 ** 2)  # 0.1 * 0.14107 / 0.19 = 0.074247
  expected = eta1 * 0.1 * 0.5 / (0.1 * 0.5 + TAU)
  assert float(server.params["w"][0, 0]) == pytest.approx(expected, rel=1e-12)
  assert expected == pytest.approx(0.0727902, rel=1e-5)  # 0.074246 x 0.05 / 0.051


def test_names_and_refusals():
  assert algorithms.run_name("fedadam") == "fedadam"
  assert algorithms.run_name("fedyogi", convention="flower") == "fedyogi_flower"
  with pytest.raises(HparamError, match=r"convention='reddi'.*'paper', 'flower'"):
    algorithms.build("fedadam", convention="reddi")
  with pytest.raises(HparamError, match=r"convention='flower'.*variant='optax'"):
    algorithms.build("fedadagrad", convention="flower", variant="optax")


def test_flower_convention_resumes_exactly_and_compiles_once(tmp_path):
  """Its state (the moments and FedAdam's step count) checkpoints and resumes bit for bit,
  through the contract table's run (tests/test_algorithm_contract.py)."""
  from tests import test_algorithm_contract as contract  # pylint: disable=g-import-not-at-top
  config = contract.config_for("fedadam", active_ratio=0.25, rounds=3)
  config.fedadam.convention = "flower"
  run = contract._run_resumed(config, tmp_path)  # pylint: disable=protected-access
  assert run["program"].opts.algorithm_name == "fedadam_flower"
  assert contract._bits(run["resumed"]) == contract._bits(run["straight"])  # pylint: disable=protected-access
  assert run["compiles"] == []
  count = run["resumed"][0].opt_state[1].count
  assert int(count) == 3  # three server updates counted for the bias-corrected rate


def test_fedlama_refuses_flowers_fedadam_whose_step_count_is_not_per_layer():
  from tests import test_algorithm_contract as contract  # pylint: disable=g-import-not-at-top
  from fedjax_lama import config as config_lib  # pylint: disable=g-import-not-at-top
  config = contract.config_for("fedadam", fedlama=True)
  config.fedadam.convention = "flower"
  with pytest.raises(config_lib.ConfigError, match=r"fedadam_flower.*not per layer.*count"):
    contract.helpers.build(config, contract.MESH)
