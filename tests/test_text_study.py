"""The text study (experiments/text_study.py): its settings, runs, statistics, claims and report
on made-up summaries, and a --quick run of the command line (slow, with the shared data)."""
import json
import os
import subprocess
import sys

import pytest

from configs import text_study as text_config
from experiments import personal_study as ps
from experiments import text_study as ts
from fedjax_lama.config import validate
from fedjax_lama.errors import ConfigError
from tests.conftest import shared_data_dir_or_skip

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROW = {r.label: r for r in ts.ROWS}


@pytest.mark.parametrize("model", ["lstm", "transformer"])
def test_configs_validate_and_select_the_study_setting(model):
  c = text_config.get_config(model)
  validate(c)
  assert c.dataset == "shakespeare_roles" and c.partition == "natural"
  assert c.active_ratio == 1.0 and c.local_test_fraction > 0 and c.validation_fraction > 0
  assert c.dataset_options.stride == 80 and c.per_client_eval == "final"
  assert c.model == {"lstm": "lstm_lm", "transformer": "transformer_lm"}[model]
  with pytest.raises(ValueError, match="accepted: lstm, transformer"):
    text_config.get_config("gru")


def test_runs_set_each_method_s_fields():
  base = text_config.get_config("lstm")
  runs = ts.runs_for(base)
  assert {r.run for r in ts.ROWS} <= set(runs)
  config = lambda key, lr=0.5: ps.run_config(base, runs[key], lr, 2, 5, None)
  lama = config("fedlama")
  # FedLAMA over FedAvg at FedAvg's local-step budget: rounds / phi windows of tau' phi steps.
  assert (lama.algorithm, lama.schedule, lama.fedlama.base_interval, lama.fedlama.phi) == (
      "fedavg", "fedlama", base.local_steps, 2)
  assert lama.rounds * lama.fedlama.phi * lama.fedlama.base_interval == (
      base.rounds * base.local_steps)
  adam = config("fedadam")
  assert (adam.server_lr, adam.fedadam.tau) == (0.03, 1e-3)
  assert config("fedprox").fedprox.mu == 0.01
  ditto = config("ditto", 0.7)
  assert (ditto.ditto.personal_lr, ditto.ditto.lam, ditto.finetune_steps) == (0.7, 0.1, 0)
  fedavg = config("fedavg")
  assert (fedavg.finetune_steps, fedavg.finetune_lr, fedavg.seed) == (5, 0.5, 2)
  for key in runs:
    validate(config(key))
  odd = ps.sweep.configured(base, rounds=31)
  with pytest.raises(ConfigError, match="config.rounds=31 .*multiple of 2"):
    ts.runs_for(odd)


def test_rows_and_bad_labels_name_the_flag():
  assert [r.label for r in ts.select_rows([])] == list(ts.ROW_LABELS)
  assert [r.label for r in ts.select_rows(["ditto", "fedavg"])] == ["fedavg", "ditto"]
  with pytest.raises(ConfigError, match="--methods: 'apfl'.*accepted: fedavg, fedadam"):
    ts.select_rows(["apfl"])
  with pytest.raises(ConfigError, match="--models: 'gru'"):
    ts.model_config("gru")


def _summary(pooled, personal=None, global_mean=0.3, p10=0.2, uplink=100.0):
  s = {"final_test_accuracy": pooled, "comm_floats_up": uplink, "wall_seconds": 3.0,
       ps.metric("global", "mean"): global_mean, ps.metric("global", "p10"): p10,
       ps.metric("global", "worst"): 0.1, ps.metric("global", "std"): 0.05}
  if personal is not None:
    s.update({ps.metric("personal", "mean"): personal, ps.metric("personal", "p10"): p10 + 0.05,
              ps.metric("personal", "worst"): 0.15, ps.metric("personal", "std"): 0.04})
  return s


RUNS = {"fedavg": [_summary(0.40, 0.45, 0.38), _summary(0.42, 0.47, 0.40)],
        "fedadam": [_summary(0.44), _summary(0.46)],
        "scaffold": [_summary(0.405), _summary(0.425)],
        "fedprox": [_summary(0.39), _summary(0.37)],
        "fedlama": [_summary(0.41, uplink=60.0), _summary(0.41, uplink=60.0)],
        "ditto": [_summary(0.41, 0.50, 0.38), {"diverged": "loss nan"}]}


def test_stats_and_claims_on_made_up_runs():
  stats = ts.row_stats(ts.ROWS, RUNS)
  assert stats["fedavg"]["pooled"] == pytest.approx((0.41, 0.01))
  assert stats["fedavg"]["mean"] == pytest.approx((0.39, 0.01))  # the global model's
  assert stats["fedavg_ft"]["mean"] == pytest.approx((0.46, 0.01))
  assert stats["fedlama"]["uplink"] == pytest.approx(0.6)
  assert stats["ditto"]["mean"] == pytest.approx((0.50, 0.0))  # the finished seed only
  adam, scaffold, prox, lama, ft, ditto = ts.claims(stats)
  assert adam.startswith("FedAdam above FedAvg") and ": holds (" in adam
  assert "holds within the seeds' spread" in scaffold
  assert "does not hold" in prox and "0.3800 against 0.4100" in prox
  assert ": holds (" in lama and "uplink 0.600 of FedAvg's" in lama
  assert ": holds (" in ft and ": holds (" in ditto
  # FedLAMA below FedAvg beyond the spread and no cheaper: does not hold.
  stats["fedlama"].update(pooled=(0.30, 0.01), uplink=1.0)
  assert "does not hold" in ts.claims(stats)[3]
  assert all("not measured" in line for line in ts.claims({}))


def test_report_files_and_table(tmp_path):
  study = ts.make_study("lstm", text_config.get_config("lstm"), ts.ROWS, [0, 1], [1.0], 0, 5,
                        None)
  out = str(tmp_path / "results" / "text")
  text = ts.write_report({"lstm": study}, {"lstm": {"lr": 1.0, "scores": {0.3: 0.2, 1.0: 0.3},
                                                    "runs": RUNS}}, out,
                         "python -m experiments.text_study")
  for ext in (".md", ".png", ".json"):
    assert os.path.getsize(out + ext) > 0
  assert open(out + ".md").read() == text
  lines = [l for l in text.splitlines() if l.startswith("| ")]
  assert len(lines) == 1 + len(ts.ROWS) and all(l.count("|") == 7 for l in lines)
  assert lines[1].startswith("| FedAvg (global model) | 0.4100 ± 0.0100 | 0.3900 ± 0.0100 |")
  assert "| FedAvg + fine-tuning | (its global model: FedAvg's) | 0.4600 ± 0.0100 |" in text
  assert "0.3: 0.2000, 1: 0.3000" in text
  with open(out + ".json") as f:
    report = json.load(f)["lstm"]
  assert report["stats"]["fedlama"]["uplink"] == pytest.approx(0.6)
  assert "records" not in report["runs"]["fedavg"][0]


@pytest.mark.slow
def test_quick_command_writes_the_report(tmp_path):
  """The command line end to end on a few roles: both models, two seeds, three rows. 4
  rounds, not --quick's 2: FedLAMA first lengthens a layer's interval after phi = 2 rounds of
  its base interval (one round here), so its uplink can fall below FedAvg's from round 3."""
  data_dir = shared_data_dir_or_skip()
  out = str(tmp_path / "report")
  subprocess.run([sys.executable, "-m", "experiments.text_study", "--quick", "--rounds=4",
                  f"--data_dir={data_dir}", "--methods=fedavg,fedlama,fedavg_ft",
                  f"--out={out}", f"--runs_dir={tmp_path / 'runs'}"], cwd=REPO, check=True,
                 capture_output=True, text=True)
  with open(out + ".json") as f:
    report = json.load(f)
  assert sorted(report) == ["lstm", "transformer"]
  for model in report.values():
    assert sorted(model["runs"]) == ["fedavg", "fedlama"]
    assert all(len(v) == 2 for v in model["runs"].values())
    assert model["stats"]["fedlama"]["uplink"] < 1.0
  # Fine-tuning changes the served models. Checked on the transformer: --quick's 8-unit LSTM
  # predicts the most frequent character before and after its 5 steps (the same accuracy).
  stats = report["transformer"]["stats"]
  assert stats["fedavg_ft"]["mean"] != stats["fedavg"]["mean"]
