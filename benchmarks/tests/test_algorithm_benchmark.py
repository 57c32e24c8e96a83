"""The algorithm benchmark's cost analysis: a sharpness-aware step is two gradients."""
import pytest

from benchmarks import algorithm_benchmark


def test_fedsam_training_call_counts_twice_fedavgs_operations():
  r = algorithm_benchmark.run(model="fedat_cnn", clients=2, steps=1, batch=8,
                              algorithms=("fedsam",), fedlama_over=(), repeats=1,
                              cost_analysis=True)
  # FedSAM's local step takes FedAvg's gradient and one more at the perturbed point; the
  # rest (a norm, the perturbation, the masked update) is elementwise and negligible.
  assert r["cost_ratios"]["fedsam/fedavg"]["flops"] == pytest.approx(2.0, abs=0.02)
  assert r["cost_ratios"]["fedsam/fedavg"]["bytes"] > 1.0
  assert set(r["ratios"]) == {"fedsam/fedavg"}
