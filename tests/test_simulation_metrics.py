"""Robustness metrics of the FedAT paper (Chai et al., SC'21, metrics), on hand-computed inputs."""
import math

import numpy as np
import pytest

from fedjax_lama.simulation import robustness_metrics as metrics


def test_accuracy_stats_pooled_and_population_variance():
  stats = metrics.accuracy_stats(np.array([1, 3]), np.array([2, 4]))
  assert stats["accuracy"] == 4 / 6  # pooled: 4 correct of 6
  np.testing.assert_array_equal(stats["client_accuracy"], [0.5, 0.75])
  assert stats["client_accuracy_mean"] == 0.625
  assert stats["client_accuracy_var"] == 0.015625  # ((0.125)^2 + (0.125)^2) / 2, ddof = 0
  with pytest.raises(ValueError):
    metrics.accuracy_stats(np.array([1, 2]), np.array([3]))


def test_clients_without_test_examples_are_left_out_of_the_spread():
  stats = metrics.accuracy_stats(np.array([1, 0, 3]), np.array([2, 0, 4]))
  assert math.isnan(stats["client_accuracy"][1])
  assert stats["client_accuracy_mean"] == 0.625 and stats["client_accuracy_var"] == 0.015625


def make_ticks(acc, var, up, down, interval=50.0):
  rows = enumerate(zip(acc, var, up, down))
  return [{"virtual_time": interval * i, "accuracy": a, "client_accuracy_var": v,
           "bytes_up": u, "bytes_down": d} for i, (a, v, u, d) in rows]


def test_summary_hand_computed():
  acc = [0.1, 0.5, 0.3, 0.8, 0.7, 0.9]
  var = [0.04, 0.02, 0.03, 0.01, 0.02, 0.01]
  up = [0, 100, 200, 300, 400, 500]
  down = [10, 1000, 2000, 3000, 4000, 5000]
  ticks = make_ticks(acc, var, up, down)
  s = metrics.summarize(ticks, target=0.75)
  assert s["best_accuracy"] == 0.9 and s["best_accuracy_time"] == 250.0
  assert s["mean_variance"] == pytest.approx(0.13 / 6, abs=1e-15)
  assert s["variance_at_best"] == 0.01
  assert s["variance_last_quarter"] == pytest.approx(0.015, abs=1e-15)  # last ceil(6/4) = 2 ticks
  # Raw curve first reaches 0.75 at t = 150 (0.8).
  assert s["time_to_target"] == 150.0
  assert (s["bytes_to_target"], s["bytes_to_target_up"], s["bytes_to_target_down"]) == (
      3300, 300, 3000)
  assert s["mb_to_target"] == 3300 / 1e6
  # Trailing means of the last 5 ticks: 0.1, 0.3, 0.3, 0.425, 0.48, 0.64 -> never 0.75.
  np.testing.assert_allclose(metrics.trailing_mean(acc), [0.1, 0.3, 0.3, 0.425, 0.48, 0.64])
  assert s["time_to_target_smoothed"] is None and s["bytes_to_target_smoothed"] is None
  s = metrics.summarize(ticks, target=0.6)
  assert s["time_to_target"] == 150.0 and s["time_to_target_smoothed"] == 250.0
  assert s["bytes_to_target_smoothed"] == 5500
  assert "time_to_target" not in metrics.summarize(ticks)


def test_improvements_reproduce_table_one():
  # CIFAR-10 #class 2: FedAT 0.591, best baseline FedAvg 0.547, worst FedAsync 0.480.
  impr = metrics.improvements(0.591, {"tifl": 0.527, "fedavg": 0.547, "fedprox": 0.509,
                                      "fedasync": 0.480})
  assert impr["best_baseline"] == "fedavg" and impr["worst_baseline"] == "fedasync"
  assert math.floor(impr["impr_a"] * 10000) / 100 == 7.44
  assert math.floor(impr["impr_b"] * 10000) / 100 == 18.78
  assert metrics.ratio(0.0084, 0.0042) == 2.0 and metrics.ratio(None, 1.0) is None
