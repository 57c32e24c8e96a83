"""fedprox, scaffold and fednova beside FedLab's on identical inputs (slow; needs fedlab, torch).

    pip install --no-deps fedlab==1.3.0 ...   # requirements-peers.txt; in a venv of its own
    python -m pytest -q -n 0 -m slow tests/peers -s

Identical inputs, float64 on both sides: a 4-5-3 ReLU MLP (our model zoo's "mlp" with
hidden_sizes=(5,); torch's Linear-ReLU-Linear with the same initial weights, kernel =
weight^T), three clients with 2, 3 and 4 fixed batches of 4 examples (one local epoch, so
2, 3 and 4 plain-SGD steps at lr 0.1 on the mean cross-entropy), every client in every
round, five rounds. Our side runs the engine's round (engine/sync_round.py: the vmapped local
scan, the algorithm's finish, reductions and server update); FedLab's side runs its
serial client trainers and server handlers through the loop of its StandalonePipeline
(third_party/fedlab_peer.py). Compared after every round: the server parameters and the
algorithm's state (SCAFFOLD's server control variate c and every client's c_i; FedNova's
tau_eff, the normalisation its server step multiplies by, in local steps).

Conventions. FedLab 1.3.0 (the PyPI release) applies SCAFFOLD's correction g - c_i + c
and option II's c_i+ = c_i - c + (x - y) / (K lr) (Karimireddy et al., ICML 2020, Eq. 4),
and FedProx's mu/2 ||w - w^t||^2 (Li et al., MLSys 2020): our defaults. FedLab's FedProx
and SCAFFOLD servers average the clients uniformly, as both papers do for the sampled
clients; so does our `weighting="uniform"` (the engine's client weights). FedLab's
FedNova server sets p_i = 1/m ("we simply set it 1/m here"), where Wang et al. (NeurIPS
2020, Eq. 6-7) weight by data size p_i = n_i / n; our `weighting="uniform"` is FedLab's
reading and `weighting="examples"` the paper's, whose distance from FedLab is checked below.
"""
import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (FedLab's dependency; requirements-peers.txt)")
pytest.importorskip("fedlab", reason="FedLab is not installed: pip install --no-deps "
                    "fedlab==1.3.0 (requirements-peers.txt)")

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position
import optax  # pylint: disable=wrong-import-position

from fedjax_lama import algorithms  # pylint: disable=wrong-import-position
from fedjax_lama.algorithms.common import Common  # pylint: disable=wrong-import-position
from fedjax_lama.engine import local as local_lib  # pylint: disable=wrong-import-position
# pylint: disable-next=wrong-import-position
from fedjax_lama.engine import aggregation, cohort as cohort_lib, sync_round
from fedjax_lama.models import zoo  # pylint: disable=wrong-import-position
from third_party import fedlab_peer  # pylint: disable=wrong-import-position

pytestmark = pytest.mark.slow

ROUNDS, LR, BATCH = 5, 0.1, 4
D_IN, HIDDEN, CLASSES = 4, 5, 3
BATCHES_PER_CLIENT = (2, 3, 4)
N = len(BATCHES_PER_CLIENT)
SETTINGS = {  # name -> (our hyper-parameters, server_lr, FedLab's keyword arguments)
    "fedprox": ({"mu": 0.1}, 1.0, {"mu": 0.1}),
    "scaffold": ({"option": "II"}, 0.8, {"server_lr": 0.8}),
    "fednova": ({}, 1.0, {}),
}
# Torch parameter name -> our parameter path.
NAMES = {"0.weight": ("Dense_0", "kernel"), "0.bias": ("Dense_0", "bias"),
         "2.weight": ("Dense_1", "kernel"), "2.bias": ("Dense_1", "bias")}
# Largest |ours with the paper's p_i = n_i / n - FedLab's p_i = 1 / m| over FedNova's server
# parameters after ROUNDS rounds on the inputs below, measured with fedlab 1.3.0 and
# checked to 0.1%.
PAPER_VS_FEDLAB_FEDNOVA = 4.597e-2


def torch_model():
  return torch.nn.Sequential(torch.nn.Linear(D_IN, HIDDEN), torch.nn.ReLU(),
                             torch.nn.Linear(HIDDEN, CLASSES))


def inputs(seed=0):
  rng = np.random.default_rng(seed)
  initial = {"0.weight": rng.normal(scale=0.5, size=(HIDDEN, D_IN)),
             "0.bias": rng.normal(scale=0.1, size=HIDDEN),
             "2.weight": rng.normal(scale=0.5, size=(CLASSES, HIDDEN)),
             "2.bias": rng.normal(scale=0.1, size=CLASSES)}
  batches = [[(rng.normal(size=(BATCH, D_IN)), rng.integers(0, CLASSES, BATCH))
              for _ in range(n)] for n in BATCHES_PER_CLIENT]
  return initial, batches


def to_ours(named):
  """{torch name: array} -> our params tree (a torch weight is our kernel transposed)."""
  out = {"Dense_0": {}, "Dense_1": {}}
  for torch_name, (layer, leaf) in NAMES.items():
    out[layer][leaf] = np.asarray(named[torch_name]).T if leaf == "kernel" else \
        np.asarray(named[torch_name])
  return out


def to_torch_names(tree):
  return {torch_name: np.asarray(tree[layer][leaf]).T if leaf == "kernel" else
          np.asarray(tree[layer][leaf]) for torch_name, (layer, leaf) in NAMES.items()}


def ours(name, initial, batches, weighting="uniform") -> list[dict]:
  """Our algorithm through the engine's round on the same batches, float64."""
  hparams, server_lr, _ = SETTINGS[name]
  max_steps = max(BATCHES_PER_CLIENT)
  history = []
  with jax.enable_x64(True):
    alg = algorithms.build(name, Common(server_lr=server_lr, num_clients=N), **hparams)
    loss_fn = local_lib.make_loss_fn(zoo.get("mlp", CLASSES, hidden_sizes=(HIDDEN,)), False)
    train_chunk, server_update = sync_round.make_round_fns(
        loss_fn, alg, optax.constant_schedule(LR), seed=0, weighting=weighting,
        local_steps=max_steps, population=N)
    flat = [b for client in batches for b in client]
    data_x = jnp.asarray(np.concatenate([x for x, _ in flat]))
    data_y = jnp.asarray(np.concatenate([y for _, y in flat]), jnp.int32)
    first_row = np.cumsum((0,) + BATCHES_PER_CLIENT)[:-1] * BATCH
    indices = np.zeros((N, max_steps, BATCH), np.int32)
    step_mask = np.zeros((N, max_steps))
    for i, n in enumerate(BATCHES_PER_CLIENT):
      for k in range(n):
        indices[i, k] = first_row[i] + k * BATCH + np.arange(BATCH)
        step_mask[i, k] = 1.0
    ids = jnp.arange(N, dtype=jnp.int32)
    cohort = cohort_lib.Cohort(jnp.asarray(indices), jnp.ones(indices.shape),
                               jnp.asarray(step_mask), jnp.ones(N), ids,
                               jnp.asarray(np.array(BATCHES_PER_CLIENT, np.float64) * BATCH))
    params = jax.tree.map(jnp.asarray, to_ours(initial))
    server = alg.server.init(params, {})
    template = alg.row_init(params) if alg.row_init is not None else {}
    store = jax.tree.map(lambda r: jnp.stack([r] * N), template)
    for r in range(ROUNDS):
      rows = cohort_lib.gather_rows(store, ids) if template else {}
      sums, new_rows, _ = train_chunk(server, rows, data_x, data_y, cohort, r)
      if template:
        store = cohort_lib.scatter_rows(store, ids, jnp.ones(N), new_rows)
      server = server_update(server, sums)
      record = {"params": to_torch_names(server.params)}
      if name == "scaffold":
        record["c"] = to_torch_names(server.extra["c"])
        record["c_i"] = [to_torch_names(jax.tree.map(lambda a, i=i: a[i], store))
                         for i in range(N)]
      elif name == "fednova":
        # Our effective step has the learning rate inside (lr * steps for plain SGD).
        record["tau_eff"] = float(aggregation.aggregates(alg, sums, N)["tau_eff"]) / LR
      history.append(record)
  assert all(a.dtype == np.float64 for a in history[-1]["params"].values())
  return history


def largest(a, b) -> float:
  """max |a - b| over nested dicts/lists of arrays or numbers."""
  if isinstance(a, dict):
    assert a.keys() == b.keys(), (a.keys(), b.keys())
    return max(largest(a[k], b[k]) for k in a)
  if isinstance(a, list):
    return max(largest(x, y) for x, y in zip(a, b, strict=True))
  return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


@pytest.mark.parametrize("name", list(SETTINGS))
def test_equals_fedlab_on_identical_inputs(name):
  initial, batches = inputs()
  mine = ours(name, initial, batches)
  _, _, kwargs = SETTINGS[name]
  peer = fedlab_peer.run_rounds(name, torch_model, initial, batches, ROUNDS, lr=LR, **kwargs)
  worst = {}
  for a, b in zip(mine, peer, strict=True):
    for key in a:
      worst[key] = max(worst.get(key, 0.0), largest(a[key], b[key]))
  print(f"\n{name} vs FedLab {fedlab_peer.version()} {name}, {ROUNDS} rounds, float64: "
        "largest differences " + ", ".join(f"{k} {v:.3g}" for k, v in worst.items()))
  assert set(worst) == {"params"} | {"scaffold": {"c", "c_i"}, "fednova": {"tau_eff"}}.get(
      name, set())
  assert max(worst.values()) < 1e-13
  # The rounds moved the model and the state: the comparison is not of two copies of input.
  assert largest(mine[-1]["params"], initial) > 1e-2
  if name == "scaffold":
    assert largest(mine[-1]["c"], {k: 0 * v for k, v in initial.items()}) > 1e-3
  if name == "fednova":
    assert mine[-1]["tau_eff"] == pytest.approx(3.0)  # mean of 2, 3 and 4 steps


def test_fednova_papers_weights_distance_from_fedlab():
  initial, batches = inputs()
  paper = ours("fednova", initial, batches, weighting="examples")
  peer = fedlab_peer.run_rounds("fednova", torch_model, initial, batches, ROUNDS, lr=LR)
  distance = largest(paper[-1]["params"], peer[-1]["params"])
  print(f"\nfednova with Wang et al.'s p_i = n_i / n vs FedLab {fedlab_peer.version()}'s "
        f"p_i = 1 / m, after {ROUNDS} rounds: largest parameter difference {distance:.4g}")
  assert distance == pytest.approx(PAPER_VS_FEDLAB_FEDNOVA, rel=1e-3)
