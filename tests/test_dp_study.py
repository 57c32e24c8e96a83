"""The DP study (experiments/dp_study.py): its report from run summaries, and a --quick run."""
import json
import os
import subprocess
import sys

import pytest

from configs import dp_fmnist
from experiments import dp_study

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPSILONS = [1.0, 8.0, dp_study.INF]


def _summary(acc, sigma=None, epsilon=None, update_sigma=None):
  s = {"final_test_accuracy": acc, "wall_seconds": 1.0, "records": [{"round": 1}]}
  if sigma is not None:
    s["privacy"] = {"noise_multiplier": sigma, "epsilon": epsilon}
    if update_sigma is not None:
      s["privacy"]["update_noise_multiplier"] = update_sigma
  return s


def _results():
  """Two seeds per cell; accuracy rises with epsilon; one diverged seed at epsilon 1."""
  sigmas = {"1": 2.32, "8": 0.74, "inf": 0.0}
  methods = {}
  for m in dp_study.METHODS:
    per = {}
    for eps in EPSILONS:
      label = dp_study.eps_label(eps)
      sigma, reached = sigmas[label], (None if eps == dp_study.INF else eps)
      update = sigma * 1.01 if m.adaptive else None
      accs = {"1": (0.5, 0.7), "8": (0.7, 0.8), "inf": (0.8, 0.8)}[label]
      runs = [_summary(a, sigma, reached, update) for a in accs]
      if m.label == "dp_fedadam" and label == "1":
        runs[1] = {"diverged": "loss nan"}
      per[label] = {"lr": 0.1, "runs": runs}
    methods[m.label] = per
  return {"tuning": {n: {"lr": 0.1, "scores": {0.03: 0.6, 0.1: 0.7, 0.3: 0.65}}
                     for n in dp_study.REFERENCES},
          "references": {n: {"lr": 0.1, "runs": [_summary(0.82), _summary(0.84)]}
                         for n in dp_study.REFERENCES},
          "clips": {n: {"clip_norm": 0.5, "from": "calibration"} for n in dp_study.REFERENCES},
          "methods": methods}


def _table_rows(text):
  lines = [l for l in text.splitlines() if l.startswith("| ")]
  return [[c.strip() for c in l.strip("|").split("|")] for l in lines]


def test_report_has_a_row_per_method_and_a_column_per_epsilon(tmp_path):
  out = str(tmp_path / "dp")
  text = dp_study.write_report(dp_fmnist.get_config(), _results(), EPSILONS, [0, 1],
                               [0.03, 0.1, 0.3], 0, out, "python -m experiments.dp_study")
  for ext in (".md", ".json", ".png"):
    assert os.path.getsize(out + ext) > 0
  with open(out + ".md") as f:
    assert f.read() == text
  rows = _table_rows(text)
  assert rows[0] == ["row", "local lr", "ε = 1", "ε = 8", "ε = ∞ (no noise)"]
  by_name = {r[0]: r for r in rows[1:]}
  titles = [m.title for m in dp_study.METHODS] + [t for t, _ in dp_study.REFERENCES.values()]
  assert all(t in by_name for t in titles)
  assert by_name["DP-FedAvg, fixed clip"][2:] == ["0.6000 ± 0.1000", "0.7500 ± 0.0500",
                                                  "0.8000 ± 0.0000"]
  assert by_name["DP-FedAdam, fixed clip"][2] == "0.5000 ± 0.0000 (1 diverged)"
  assert by_name["FedAvg, no clip, no noise"][2:] == ["-", "-", "0.8300 ± 0.0100"]
  assert by_name["noise multiplier σ (calibrated)"][2:] == ["2.32", "0.74", "0"]
  # Andrew et al.'s update multiplier, read from the adaptive runs only.
  assert by_name["σ of the update, adaptive clip (Andrew et al., Thm. 1)"][2:] == [
      "2.343", "0.7474", "0"]
  assert by_name["noise std of the mean / C = σ / (qN), qN = 100"][2:] == [
      "0.0232", "0.0074", "0"]
  assert by_name["ε reached after 100 rounds (δ = 1e-05)"][2:] == ["1.000", "8.000", "∞"]
  assert "Command: `python -m experiments.dp_study`" in text
  # Linked from the report's own directory, where the figure is written beside it.
  link = os.path.basename(out + ".png")
  assert f"![final test accuracy against ε]({link})" in text
  assert dp_study.figure_link(os.path.join(REPO, "experiments/results/dp_fmnist.png")) == (
      "dp_fmnist.png")
  assert "DP-FedAvg, fixed clip: ε 1 0.6000, ε 8 0.7500, no noise 0.8000;" in text
  assert "FedAdam, no clip, no noise: 0.8300." in text
  with open(out + ".json") as f:
    saved = json.load(f)
  assert saved["epsilons"] == ["1", "8", "inf"]
  assert set(saved["methods"]) == {m.label for m in dp_study.METHODS}
  assert all("records" not in r for r in saved["methods"]["dp_fedavg_fixed"]["1"]["runs"])


def test_epsilons_parse_inf_and_refuse_the_rest():
  assert dp_study.parse_epsilons(["1", "8", "inf", "Infinity"]) == [1.0, 8.0, dp_study.INF,
                                                                     dp_study.INF]
  for bad in ("0", "-1", "many"):
    with pytest.raises(ValueError, match=r"--epsilons: .* numbers > 0 or 'inf'"):
      dp_study.parse_epsilons([bad])


def test_command_hides_the_data_and_runs_directories():
  command = dp_study._command  # pylint: disable=protected-access
  assert command(["dp_study.py", "--config.data_dir=/x/data", "--runs_dir=/tmp/a/dp_runs",
                  "--seeds=0"]) == (
      "python -m experiments.dp_study --config.data_dir=DATA --runs_dir=RUNS/dp_runs --seeds=0")


def test_private_config_calibrates_or_switches_noise_off():
  base = dp_fmnist.get_config()
  fixed, adaptive, _ = dp_study.METHODS
  c = dp_study.private_config(base, fixed, 4.0, 0.3, 2)
  assert (c.privacy.enabled, c.privacy.target_epsilon, c.privacy.noise_multiplier) == (
      True, 4.0, None)
  assert (c.local_lr, c.seed, c.privacy.adaptive.enabled) == (0.3, 2, False)
  c = dp_study.private_config(base, adaptive, dp_study.INF, 0.3, 0)
  assert (c.privacy.noise_multiplier, c.privacy.target_epsilon) == (0.0, None)
  assert c.privacy.adaptive.enabled and c.privacy.adaptive.target_quantile == 0.5
  ref = dp_study.reference_config(base, "fedadam", 0.1, 1)
  assert (ref.algorithm, ref.server_lr, ref.privacy.enabled) == (
      "fedadam", dp_study.FEDADAM_SERVER_LR, False)
  assert base.privacy.enabled is False  # the base is copied, never changed


@pytest.mark.slow
def test_quick_run_writes_the_report(tmp_path):
  out = tmp_path / "report"
  subprocess.run([sys.executable, "-m", "experiments.dp_study", "--quick",
                  f"--runs_dir={tmp_path / 'runs'}", f"--out={out}"], cwd=REPO, check=True,
                 capture_output=True)
  text = (tmp_path / "report.md").read_text()
  assert (tmp_path / "report.png").stat().st_size > 0
  rows = _table_rows(text)
  assert rows[0] == ["row", "local lr", "ε = 4", "ε = ∞ (no noise)"]
  assert [r[0] for r in rows[1:6]] == [m.title for m in dp_study.METHODS] + [
      t for t, _ in dp_study.REFERENCES.values()]
  assert all("±" in cell for r in rows[1:4] for cell in r[2:])
  saved = json.loads((tmp_path / "report.json").read_text())
  runs = saved["methods"]["dp_fedavg_fixed"]["4"]["runs"]
  assert [r["privacy"]["epsilon"] for r in runs] == pytest.approx([4.0, 4.0], rel=1e-3)
  assert all(r["vectorized_runs"] == 2 for r in runs)  # the seeds trained together
  assert saved["methods"]["dp_fedavg_fixed"]["inf"]["runs"][0]["privacy"]["epsilon"] is None
