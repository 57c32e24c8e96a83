"""Our server rules beside Flower's strategies on identical inputs (slow; needs flwr).

    pip install flwr==1.42.0   # requirements-peers.txt; into a virtual environment of its own
    python -m pytest -q -n 0 -m slow tests/peers -s

Identical inputs, float64 on both sides: the same initial arrays and, in every round,
the same fixed client uploads (each client's model after local training) with unequal
example counts. Our side applies the algorithm's server update to
delta = sum_i p_i (y_i - x), p_i = n_i / sum n (the engine's round mean); Flower's
strategy gets the uploads through `aggregate_fit` (third_party/flower_peer.py).
Compared after every round: the server parameters and the algorithm's state (FedAvgM's
momentum; the first and second moments of FedAdam, FedYogi and FedAdagrad; our m is
built from the pseudo-gradient -delta, Flower's from delta, so m_ours = -m_flower).

Conventions. Reddi et al. (ICLR 2021, Algorithm 2) start v at tau^2 and apply no bias
correction; Flower starts v at 0 and bias-corrects FedAdam's eta. Flower's strategies run
unmodified; our FedAdam, FedYogi and FedAdagrad take Flower's reading with
`convention="flower"`, and the distance of our default (the paper's convention) from
Flower is stated as a checked number below.
"""
import numpy as np
import pytest

flwr = pytest.importorskip(
    "flwr",
    reason="Flower (flwr) is not installed: pip install flwr==1.42.0 (requirements-peers.txt)")

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position

from fedjax_lama import algorithms  # pylint: disable=wrong-import-position
from fedjax_lama.algorithms.common import Common  # pylint: disable=wrong-import-position
from fedjax_lama.engine.algorithm import Aggregates  # pylint: disable=wrong-import-position
from third_party import flower_peer  # pylint: disable=wrong-import-position

pytestmark = pytest.mark.slow

ROUNDS = 5
NUM_EXAMPLES = (30, 50, 20, 100)
SHAPES = {"kernel": (6, 4), "bias": (4,)}  # Flower's list order: kernel, bias
SETTINGS = {  # name -> (our hyper-parameters, server_lr, Flower's keyword arguments)
    "fedavg": ({}, 1.0, {}),
    "fedavgm": ({"momentum": 0.9}, 0.7, {"momentum": 0.9}),
    "fedadam": ({"beta1": 0.9, "beta2": 0.99, "tau": 1e-3, "convention": "flower"}, 0.1,
                {"beta1": 0.9, "beta2": 0.99, "tau": 1e-3}),
    "fedyogi": ({"beta1": 0.9, "beta2": 0.99, "tau": 1e-3, "convention": "flower"}, 0.1,
                {"beta1": 0.9, "beta2": 0.99, "tau": 1e-3}),
    "fedadagrad": ({"tau": 1e-3, "convention": "flower"}, 0.1, {"tau": 1e-3}),
}
# Largest |ours (Reddi et al.'s convention) - Flower's own convention| over the server
# parameters after ROUNDS rounds, on the inputs below. FedAvg and FedAvgM have no
# convention to differ in (Flower's first momentum is the first pseudo-gradient, as
# optax's trace started at 0).
# Measured with flwr 1.42.0 (requirements-peers.txt) and checked to 0.1%: FedAdam's gap is
# mostly the bias correction (eta x 0.74 in round 1), FedYogi's and FedAdagrad's the v = 0 start.
PAPER_VS_FLOWER_CONVENTION = {"fedadam": 9.288e-2, "fedyogi": 1.568e-2, "fedadagrad": 7.579e-3}


def inputs(seed: int = 0):
  rng = np.random.default_rng(seed)
  initial = [rng.normal(size=SHAPES[k]) for k in ("kernel", "bias")]
  uploads = [[[x + 0.1 * rng.normal(size=x.shape) for x in initial] for _ in NUM_EXAMPLES]
             for _ in range(ROUNDS)]
  return initial, uploads


def ours(name: str, initial, uploads_per_round, convention=None) -> list[dict]:
  """Our algorithm's server update on the same uploads, in float64 (FedAdam, FedYogi and
  FedAdagrad in `convention` when given, else in SETTINGS' Flower convention)."""
  hparams, server_lr, _ = SETTINGS[name]
  if convention is not None:
    hparams = {**hparams, "convention": convention}
  p = np.asarray(NUM_EXAMPLES, np.float64) / np.sum(NUM_EXAMPLES)
  history = []
  with jax.enable_x64(True):
    algorithm = algorithms.build(name, Common(server_lr=server_lr), **hparams)
    server = algorithm.server.init({"kernel": jnp.asarray(initial[0]),
                                    "bias": jnp.asarray(initial[1])}, {})
    for uploads in uploads_per_round:
      x = server.params
      delta = {key: sum(p_i * (jnp.asarray(upload[i]) - x[key])
                        for p_i, upload in zip(p, uploads))
               for i, key in enumerate(("kernel", "bias"))}
      server = algorithm.server.update(
          server, Aggregates({"delta": delta}, jnp.asarray(len(uploads), jnp.float32),
                             len(uploads)))
      record = {"params": [np.asarray(server.params[k]) for k in ("kernel", "bias")]}
      opt_state = server.opt_state
      if name == "fedavgm":
        trace = opt_state[0].trace  # optax.sgd with momentum: (TraceState, ScaleByLr)
        record["momentum"] = [np.asarray(trace[k]) for k in ("kernel", "bias")]
      elif name != "fedavg":
        # Flower's FedAdam chains the moments with the bias-corrected rate's step count.
        moments = opt_state if hasattr(opt_state, "m") else opt_state[0]
        record["m"] = [-np.asarray(moments.m[k]) for k in ("kernel", "bias")]
        record["v"] = [np.asarray(moments.v[k]) for k in ("kernel", "bias")]
      history.append(record)
  for record in history:
    for arrays in record.values():
      assert all(a.dtype == np.float64 for a in arrays)
  return history


def peer_kwargs(name):
  hparams, server_lr, kwargs = SETTINGS[name]
  del hparams
  return dict(server_lr=server_lr, **kwargs)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_server_rule_equals_flowers_strategy_in_flowers_convention(name):
  initial, uploads = inputs()
  mine = ours(name, initial, uploads)
  peer = flower_peer.run_rounds(name, initial, uploads, NUM_EXAMPLES, **peer_kwargs(name))
  largest = {}
  for r, (a, b) in enumerate(zip(mine, peer, strict=True)):
    assert a.keys() == b.keys(), (r, a.keys(), b.keys())
    for key in a:
      largest[key] = max(largest.get(key, 0.0), flower_peer.largest_difference(a[key], b[key]))
  print(f"\n{name} vs Flower {flower_peer.version()} {name}, {ROUNDS} rounds, float64: "
        "largest differences " + ", ".join(f"{k} {v:.3g}" for k, v in largest.items()))
  assert set(largest) == ({"params"} | {"fedavg": set(), "fedavgm": {"momentum"}}.get(
      name, {"m", "v"}))
  assert max(largest.values()) < 1e-13
  # The rounds moved the model: the comparison is not between two copies of the input.
  assert flower_peer.largest_difference(mine[-1]["params"], initial) > 1e-2


@pytest.mark.parametrize("name", list(PAPER_VS_FLOWER_CONVENTION))
def test_distance_of_the_papers_convention_from_flowers(name):
  initial, uploads = inputs()
  mine = ours(name, initial, uploads, convention="paper")
  peer = flower_peer.run_rounds(name, initial, uploads, NUM_EXAMPLES, **peer_kwargs(name))
  distance = flower_peer.largest_difference(mine[-1]["params"], peer[-1]["params"])
  print(f"\n{name}: Reddi et al.'s convention vs Flower {flower_peer.version()}'s own, after "
        f"{ROUNDS} rounds: largest parameter difference {distance:.3g}")
  assert distance == pytest.approx(PAPER_VS_FLOWER_CONVENTION[name], rel=1e-3)
