"""The personal-state scale benchmark's smoke run: every figure is printed, and what stays on
the device does not grow with the number of clients."""
import json

from benchmarks import personal_scale


def test_quick_run_prints_every_figure_and_device_state_is_flat_in_n(capsys):
  personal_scale.run([200, 800], cohort=16, repeats=1)
  lines = capsys.readouterr().out.strip().splitlines()
  result, larger = json.loads(lines[-1])["personal_scale"]
  assert result["clients"] == 200
  # Ditto's row: one model's floats and a flag per client, float32 (16*16 + 16 + 16*4 + 4
  # weights, 1 flag).
  assert result["host_store_mb"] * 2**20 == 200 * (16 * 16 + 16 + 16 * 4 + 4 + 1) * 4
  for key in ("fedavg_round_s", "personal_round_s", "per_client_eval_s", "peak_host_mb"):
    assert result[key] > 0, key
  assert 0.0 <= result["personal_mean_accuracy"] <= 1.0
  assert any(line.startswith("N=    200:") for line in lines)
  # The rows live on the host: the device keeps the same bytes (the server's model and its
  # state) at 4x the clients, and the training arrays grow 4x beside them.
  for key in ("fedavg_device_state_mb", "personal_device_state_mb"):
    assert 0 < result[key] == larger[key] < result["host_store_mb"], key
  assert larger["device_data_mb"] == 4 * result["device_data_mb"]
