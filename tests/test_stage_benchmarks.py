"""Smoke runs of the aggregation-stage benchmarks (benchmarks/dp_speed.py, robust_cost.py):
each command runs end to end at tiny sizes (--quick, the 8x8 `mlp`) and prints the machine,
its ratio lines and its JSON. How large the figures are is never checked. Each compiles a
dozen small programs (about 15 s of CPU), hence the slow set."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
TINY = ["--quick", "--model=mlp", "--input_shape=8,8,1", "--cpu_devices=1"]


def _run(module: str, *flags: str) -> tuple[list, dict]:
  """(the printed lines, the closing JSON) of `python -m module flags`."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  done = subprocess.run([sys.executable, "-m", module, *TINY, *flags], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stdout.strip().splitlines()
  return lines, json.loads(lines[-1])


def _ratio_line(lines: list, name: str) -> str:
  found = [line for line in lines if line.strip().startswith(f"ratio {name} ")]
  assert len(found) == 1, (name, lines)
  return found[0]


@pytest.mark.slow
def test_dp_speed_prints_each_private_arm_against_fedavg():
  lines, result = _run("benchmarks.dp_speed")
  assert lines[0].startswith("machine: cpu") and "jax " in lines[0]
  for name in ("fixed_dp_flat/fixed_fedavg", "fixed_dp_adaptive/fixed_fedavg",
               "poisson_dp_flat/poisson_fedavg", "poisson_dp_adaptive/poisson_fedavg"):
    assert "(target <= 1.1)" in _ratio_line(lines, name)
    assert set(result["ratios"][name]) == {"best", "paired_median"}
  # Poisson cohorts' padding, and the private rounds against the usual fixed-cohort round.
  for name in ("poisson_fedavg", "poisson_dp_flat", "poisson_chunked_dp_flat"):
    assert "target" not in _ratio_line(lines, f"{name}/fixed_fedavg")
  slots = result["client_slots_per_round"]
  assert slots["poisson"] > slots["fixed"] and slots["poisson_chunked"] == 1  # --quick's chunk
  assert set(result["seconds_per_round"]) == {
      "poisson_chunked_dp_flat", *(f"{kind}_{arm}" for kind in ("fixed", "poisson")
                                   for arm in ("fedavg", "dp_flat", "dp_adaptive"))}


@pytest.mark.slow
def test_robust_cost_prints_round_and_rule_ratios_and_memory():
  lines, result = _run("benchmarks.robust_cost")
  assert lines[0].startswith("machine: cpu")
  [row] = result["cohorts"]
  assert (row["clients"], row["steps"], row["f"]) == (8, 1, 1)  # Bulyan's largest f at 8
  for name in ("krum", "bulyan", "median", "geometric_median"):
    _ratio_line(lines, f"{name}/mean")
    _ratio_line(lines, f"{name}_alone/{name}")
    assert row["memory"][name]["server_update"]["peak"] > 0
  _ratio_line(lines, "mean_chunked/mean")
  assert row["stack_bytes"] == 4 * 8 * row["model_size"]
  assert any(line.strip().startswith("memory: the stacked uploads") for line in lines)
