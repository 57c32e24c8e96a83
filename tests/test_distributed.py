"""`python -m experiments.main --distributed` end to end: 2 local CPU processes equal 1.

Two processes join JAX's multi-process runtime through the command's own flags
(--coordinator_address, --num_processes, --process_id; gloo CPU collectives) and train the
default config (FedAvg, MLP, digits) on one shared workdir; a plain single-process run of
the same command trains it alone. Their metrics must agree to float32 tolerance, only
process 0 prints the summary, and the orbax checkpoints that both processes write together
must exist. Compilation dominates, so the run is small; it is marked slow anyway.
"""
import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
ARGS = ["--config=configs/default.py", "--config.rounds=3", "--config.eval_every=1",
        "--config.checkpoint_every=2", "--config.plots=False", "--config.num_clients=8",
        "--config.local_steps=3"]


def _env():
  # As tests/test_sharding.py: CPU only, the cheaper backend optimisation (compile time).
  return dict(os.environ, JAX_PLATFORMS="cpu",
              XLA_FLAGS="--xla_backend_optimization_level=0 "
                        "--xla_llvm_disable_expensive_passes=true",
              PYTHONPATH=os.pathsep.join([str(REPO)] + [
                  p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))


def _start(workdir, extra=()):
  return subprocess.Popen([sys.executable, "-m", "experiments.main", *ARGS, *extra,
                           f"--workdir={workdir}"], cwd=REPO, env=_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _records(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_processes_equal_one_process(tmp_path):
  with socket.socket() as sock:
    sock.bind(("localhost", 0))
    address = f"localhost:{sock.getsockname()[1]}"
  single = _start(tmp_path / "single")
  multi = [_start(tmp_path / "multi", ["--distributed", f"--coordinator_address={address}",
                                       "--num_processes=2", f"--process_id={i}"])
           for i in range(2)]
  outs = {}
  for name, proc in [("single", single), ("p0", multi[0]), ("p1", multi[1])]:
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, f"{name} failed:\n{err[-4000:]}"
    outs[name] = (out, err)
  # Both processes joined one runtime of 2 processes.
  assert "process 0 of 2" in outs["p0"][1] and "process 1 of 2" in outs["p1"][1]
  # Only process 0 prints the summary line (and writes the plain files).
  assert "final_test_accuracy=" in outs["p0"][0]
  assert "final_test_accuracy=" not in outs["p1"][0]

  one, two = _records(tmp_path / "single"), _records(tmp_path / "multi")
  assert [r["round"] for r in one] == [r["round"] for r in two] == [1, 2, 3]
  for a, b in zip(one, two):
    assert set(a) == set(b)
    for key in a:
      if key == "wall_seconds" or not isinstance(a[key], (int, float)):
        continue
      np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6, err_msg=key)
  assert one[-1]["train_loss"] < one[0]["train_loss"]  # it trained: the check is not vacuous
  summary = json.loads((tmp_path / "multi" / "summary.json").read_text())
  np.testing.assert_allclose(summary["final_test_accuracy"], one[-1]["test_accuracy"])
  # The collective checkpoints: round 2 (checkpoint_every) and the last round (index 2).
  assert {p.name for p in (tmp_path / "multi" / "checkpoints").iterdir()} >= {"1", "2"}


def test_address_flags_need_distributed(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "experiments.main", *ARGS, "--num_processes=2",
                         f"--workdir={tmp_path}"], cwd=REPO, env=_env(), capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode != 0
  assert "need --distributed" in proc.stderr
  assert not any(tmp_path.iterdir())
