"""FedLAMA as a round program: equivalences with FedAvg and its communication accounting."""
import json
import os

import numpy as np
import pytest

from configs import fedlama_digits
from fedjax_lama import training


def _config(**overrides):
  c = fedlama_digits.get_config()
  c.num_clients = 8
  c.active_ratio = 0.5
  c.local_momentum = 0.0
  c.fedlama.base_interval = 2
  c.fedlama.total_steps = 16
  c.eval_every = 1
  c.checkpoint_every = 100
  c.plots = False
  for k, v in overrides.items():
    if k.startswith("fedlama."):
      c.fedlama[k.split(".")[1]] = v
    else:
      c[k] = v
  return c


def _fedavg(interval, **overrides):
  c = _config(**overrides)
  c.algorithm = "fedavg"
  c.local_steps = interval
  c.rounds = c.fedlama.total_steps // interval
  return c


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _assert_same_run(a, b):
  ra, rb = _rows(a), _rows(b)
  assert [r["local_steps"] for r in ra] == [r["local_steps"] for r in rb]
  np.testing.assert_allclose([r["test_loss"] for r in ra], [r["test_loss"] for r in rb], rtol=2e-5)
  np.testing.assert_allclose([r["train_loss"] for r in ra], [r["train_loss"] for r in rb],
                             rtol=2e-5)
  assert [r["test_accuracy"] for r in ra] == [r["test_accuracy"] for r in rb]


@pytest.mark.parametrize("overrides", [pytest.param({}, marks=pytest.mark.slow),
                                       {"local_momentum": 0.9}])
def test_phi_one_is_fedavg_base_interval(tmp_path, overrides):
  """With local momentum too: the local optimizer starts afresh each round under both
  (config.local_optimizer_state="reset", the default)."""
  s = training.train_and_evaluate(_config(**{"fedlama.phi": 1, **overrides}), str(tmp_path / "l"))
  training.train_and_evaluate(_fedavg(2, **overrides), str(tmp_path / "a"))
  _assert_same_run(tmp_path / "l", tmp_path / "a")
  assert s["comm_ratio"] == pytest.approx(1.0)


@pytest.mark.slow
def test_carried_local_optimizer_state_keeps_each_slots_momentum(tmp_path):
  """"carry" keeps the momentum from one window to the next: with momentum it is another
  run than "reset" from the second window on, and the same one in the first window; without
  momentum there is no state to keep and the two are the same run."""
  for momentum in (0.9, 0.0):
    for rule in ("reset", "carry"):
      training.train_and_evaluate(
          _config(**{"fedlama.phi": 1, "local_momentum": momentum,
                     "local_optimizer_state": rule}), str(tmp_path / f"{rule}{momentum}"))
  reset, carry = _rows(tmp_path / "reset0.9"), _rows(tmp_path / "carry0.9")
  assert reset[0]["test_loss"] == carry[0]["test_loss"]
  assert reset[-1]["test_loss"] != carry[-1]["test_loss"]
  _assert_same_run(tmp_path / "reset0.0", tmp_path / "carry0.0")


@pytest.mark.slow
def test_all_layers_at_phi_is_fedavg_long_interval(tmp_path):
  s = training.train_and_evaluate(_config(**{"fedlama.phi": 4, "fedlama.fixed_multipliers": 4}),
                                  str(tmp_path / "l"))
  training.train_and_evaluate(_fedavg(8), str(tmp_path / "a"))
  _assert_same_run(tmp_path / "l", tmp_path / "a")
  assert s["comm_ratio"] == pytest.approx(0.25)


@pytest.mark.slow
def test_accelerate_with_phi_one_is_fedavg(tmp_path):
  training.train_and_evaluate(
      _config(**{"fedlama.phi": 1, "fedlama.interval_rule": "accelerate"}), str(tmp_path / "l"))
  training.train_and_evaluate(_fedavg(2), str(tmp_path / "a"))
  _assert_same_run(tmp_path / "l", tmp_path / "a")


def test_adaptive_run_accounts_per_layer(tmp_path):
  s = training.train_and_evaluate(_config(**{"fedlama.phi": 2}), str(tmp_path))
  sizes = np.array(s["fedlama_layer_sizes"])
  counts = np.array(s["fedlama_sync_counts"])
  windows = 16 // 4
  # Window 0 runs at the base interval; later windows sync each layer phi or 1 times.
  assert np.all(counts >= 2 + (windows - 1)) and np.all(counts <= 2 * windows)
  expected_ratio = float(np.sum(sizes * counts)) / (16 / 2 * sizes.sum())
  assert s["comm_ratio"] == pytest.approx(expected_ratio)
  assert 0.5 <= s["comm_ratio"] <= 1.0
  # Eq. 8 in floats: every synchronisation moves s_l floats per participating client each way.
  assert s["comm_floats_up"] == int(np.sum(sizes * counts)) * 4
  assert s["comm_floats_up"] == s["comm_floats_down"]
  rows = _rows(tmp_path)
  assert [r["local_steps"] for r in rows] == [4, 8, 12, 16]


def test_window_must_divide_total_steps(tmp_path):
  with pytest.raises(ValueError, match="total_steps"):
    training.train_and_evaluate(_config(**{"fedlama.phi": 3}), str(tmp_path))


@pytest.mark.slow
def test_fedprox_composes_with_fedlama(tmp_path):
  """AAAI Table 4a runs FedProx + FedLAMA: with mu = 0 it is plain FedLAMA, with mu > 0 it differs."""
  plain = training.train_and_evaluate(_config(), str(tmp_path / "plain"))
  prox0 = _config(**{"fedlama.local_algorithm": "fedprox"})
  prox0.fedprox.mu = 0.0
  training.train_and_evaluate(prox0, str(tmp_path / "prox0"))
  _assert_same_run(tmp_path / "plain", tmp_path / "prox0")
  prox = _config(**{"fedlama.local_algorithm": "fedprox"})
  prox.fedprox.mu = 1.0
  s = training.train_and_evaluate(prox, str(tmp_path / "prox"))
  assert s["final_test_loss"] != plain["final_test_loss"]


@pytest.mark.slow
def test_module_granularity_groups_kernel_and_bias(tmp_path):
  s = training.train_and_evaluate(_config(**{"fedlama.layer_granularity": "module"}), str(tmp_path))
  assert len(s["fedlama_layer_names"]) == 3  # three Dense modules of the MLP
  assert len(s["fedlama_sync_counts"]) == 3


def test_top_level_selector_export():
  import fedjax_lama
  out = fedjax_lama.select_intervals([3.0, 2.0, 2.0, 0.0625, 1.0, 24.0, 0.125, 1.5],
                                     [1280, 16, 4608, 20480, 32, 64, 432, 20], 2)
  np.testing.assert_array_equal(out, [1, 2, 1, 2, 2, 1, 2, 2])
