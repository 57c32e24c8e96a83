"""The personalization study (experiments/personal_study.py): rows, claims and report on made-up
summaries, and a --quick run of the command line."""
import json
import os
import subprocess
import sys

import pytest

from configs import personal_femnist, personal_fmnist
from experiments import personal_study as ps
from experiments import sweep
from fedjax_lama.config import validate
from fedjax_lama.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROW = {r.label: r for r in ps.ROWS}


def _summary(personal_mean, personal_p10, global_mean, worst=0.1, std=0.2, global_p10=None,
             global_std=None):
  s = {"wall_seconds": 2.0, "records": [{"round": 1}]}
  for model, mean, p10, spread in (("personal", personal_mean, personal_p10, std),
                                   ("global", global_mean, global_p10, global_std)):
    if mean is None:
      continue
    s[ps.metric(model, "mean")] = mean
    s[ps.metric(model, "p10")] = p10 if p10 is not None else mean - 0.3
    s[ps.metric(model, "std")] = spread if spread is not None else std
    s[ps.metric(model, "worst")] = worst
  return s


def _stat(mean, std=0.0):
  return (mean, std)


def test_configs_validate_and_select_the_study_settings():
  for module in (personal_femnist, personal_fmnist):
    c = module.get_config()
    validate(c)
    assert c.local_test_fraction > 0 and c.validation_fraction > 0
    assert c.active_ratio == 1.0 and c.per_client_eval == "final"
  assert personal_femnist.get_config().partition == "natural"
  fmnist = personal_fmnist.get_config()
  assert (fmnist.partition, fmnist.classes_per_client) == ("shards", 2)


def test_rows_are_read_from_runs_and_bad_labels_name_the_flag():
  assert {r.run for r in ps.ROWS} <= set(ps.RUNS_BY_KEY)
  assert ps.select_rows([]) == list(ps.ROWS)
  assert [r.label for r in ps.select_rows(["ditto", "fedavg"])] == ["fedavg", "ditto"]
  with pytest.raises(ConfigError, match="--methods: 'fedprox'.*accepted: fedavg"):
    ps.select_rows(["fedprox"])


def test_missing_algorithms_and_fedbn_without_batchnorm_are_skipped(monkeypatch):
  base = ps.quick_config()
  runs, skipped = ps.runnable(ps.ROWS, base, ["fedavg", "ditto", "fedrep", "fedbn"])
  # FedBN and its FedAvg baseline train the MLP with BatchNorm (their overrides).
  assert [r.key for r in runs] == ["fedavg", "fedavg_ft_slow", "local", "ditto", "fedrep",
                                   "fedavg_bn", "fedbn"]
  assert set(skipped) == {"apfl", "pfedme", "perfedavg", "fedper", "lg_fedavg", "hypcluster"}
  assert "registry" in skipped["apfl"]
  # Without the override the MLP has no BatchNorm: the row is skipped, and says why.
  plain = ps.Run("fedbn", "fedbn", needs_batchnorm=True)
  monkeypatch.setitem(ps.RUNS_BY_KEY, "fedbn", plain)
  _, skipped = ps.runnable([ROW["fedbn"]], base, ["fedbn"])
  assert "no BatchNorm" in skipped["fedbn"]
  base.model = "resnet20"  # a model with BatchNorm of its own keeps the row
  base.model_options = type(base.model_options)()
  _, skipped = ps.runnable([ROW["fedbn"]], base, ["fedbn"])
  assert skipped == {}


def test_run_configs_fine_tune_only_where_asked_and_set_the_methods_rates():
  base = ps.quick_config()
  fedavg = ps.run_config(base, ps.RUNS_BY_KEY["fedavg"], 0.2, 3, finetune_steps=5,
                         finetune_lr=None)
  assert (fedavg.algorithm, fedavg.local_lr, fedavg.seed) == ("fedavg", 0.2, 3)
  assert (fedavg.finetune_steps, fedavg.finetune_lr) == (5, 0.2)
  slow = ps.run_config(base, ps.RUNS_BY_KEY["fedavg_ft_slow"], 0.2, 3, 5, None)
  assert (slow.algorithm, slow.finetune_lr) == ("fedavg", pytest.approx(0.02))
  local = ps.run_config(base, ps.RUNS_BY_KEY["local"], 0.2, 0, 5, 0.05)
  assert (local.algorithm, local.ditto.lam, local.ditto.personal_lr) == ("ditto", 0.0, 0.2)
  assert local.finetune_steps == 0  # the personal model is served as it is
  pfedme = ps.run_config(base, ps.RUNS_BY_KEY["pfedme"], 0.2, 0, 5, None)
  assert pfedme.pfedme.lam * pfedme.local_lr == pytest.approx(0.5)
  perfedavg = ps.run_config(base, ps.RUNS_BY_KEY["perfedavg"], 0.2, 0, 5, 0.05)
  assert (perfedavg.perfedavg.alpha, perfedavg.finetune_steps, perfedavg.finetune_lr) == (
      0.2, 5, 0.05)
  for c in (fedavg, slow, local, pfedme, perfedavg):
    validate(c)


def test_row_stats_read_the_served_model_over_seeds():
  runs = {"fedavg": [_summary(0.8, 0.6, 0.5), _summary(0.6, 0.4, 0.7)],
          "ditto": [_summary(0.9, 0.8, 0.5), {"diverged": "loss nan"}]}
  stats = ps.row_stats([ROW["fedavg"], ROW["fedavg_ft"], ROW["ditto"], ROW["apfl"]], runs)
  assert stats["fedavg"]["mean"] == pytest.approx((0.6, 0.1))  # the global model's
  assert stats["fedavg_ft"]["mean"] == pytest.approx((0.7, 0.1))
  assert stats["fedavg_ft"]["global_mean"] == pytest.approx((0.6, 0.1))
  assert stats["ditto"]["p10"] == pytest.approx((0.8, 0.0))  # the finished seed only
  assert "apfl" not in stats


def test_claims_on_made_up_numbers():
  stats = {"fedavg": {"mean": _stat(0.70, 0.01), "p10": _stat(0.40, 0.01),
                      "std": _stat(0.20, 0.01)},
           "fedavg_ft": {"mean": _stat(0.85, 0.01)},
           "ditto": {"mean": _stat(0.90, 0.01), "p10": _stat(0.70, 0.02),
                     "std": _stat(0.10, 0.01)},
           "fedrep": {"mean": _stat(0.705, 0.02)},
           "apfl": {"mean": _stat(0.60, 0.01)},
           "fedavg_bn": {"mean": _stat(0.65, 0.01)},
           "fedbn": {"mean": _stat(0.80, 0.02)}}
  ditto, fedrep, fedbn, above = ps.claims(stats)
  assert ditto.startswith("Ditto's fairness") and ": holds (" in ditto
  assert "FedRep above FedAvg" in fedrep and "holds within the seeds' spread" in fedrep
  assert "FedAvg + fine-tuning 0.8500" in fedrep
  assert "FedBN above FedAvg on the same model" in fedbn and ": holds (" in fedbn
  assert "0.8000 against 0.6500" in fedbn
  # FedAvg's rows of the global model (fedavg_bn) are not personalization rows.
  assert ("above by more than the seeds' spread: fedavg_ft 0.8500, ditto 0.9000, fedbn "
          "0.8000; not: fedrep 0.7050 (holds within the seeds' spread), apfl 0.6000.") in above
  # A lower spread but a lower 10th percentile: partly.
  stats["ditto"]["p10"] = _stat(0.30, 0.01)
  assert "partly holds" in ps.claims(stats)[0]
  stats["ditto"]["std"] = _stat(0.30, 0.01)
  assert "Ditto's fairness" in ps.claims(stats)[0] and "does not hold (" in ps.claims(stats)[0]
  assert "not measured" in ps.claims({"fedavg": stats["fedavg"]})[1]
  assert "not measured" in ps.claims({"fedavg": stats["fedavg"]})[2]
  assert ps.compare(None, _stat(0.5)) == "not measured"
  assert ps.compare(_stat(0.1), _stat(0.3), higher_is_better=False) == "holds"


def test_report_from_made_up_runs_has_a_row_per_method(tmp_path):
  study = ps.Study("digits", ps.quick_config(), ps.ROWS, [0, 1], [0.1], 0, 5, None)
  runs = {"fedavg": [_summary(0.8, 0.6, 0.5), _summary(0.8, 0.6, 0.5)],
          "local": [_summary(0.7, 0.5, 0.5)] * 2,
          "ditto": [_summary(0.9, 0.8, 0.5)] * 2}
  out = str(tmp_path / "results" / "personal")
  results = {"digits": {"lr": 0.1, "scores": {}, "runs": runs,
                        "others": {"fedavg_bn": (0.3, {0.1: 0.5, 0.3: 0.6})}}}
  text = ps.write_report({"digits": study}, results, out,
                         "python -m experiments.personal_study --quick")
  # The rows on the model with BatchNorm say their own rate and its scores.
  assert ("FedAvg and FedBN on the MLP with BatchNorm: local rate 0.3 (FedAvg's on that "
          "model, picked on the validation split: 0.1: 0.5000, 0.3: 0.6000).") in text
  for ext in (".md", ".png", ".json"):
    assert os.path.getsize(out + ext) > 0
  assert open(out + ".md").read() == text
  assert "![personalized accuracy per method](personal.png)" in text
  lines = [l for l in text.splitlines() if l.startswith("| ")]
  assert len(lines) == 1 + len(ps.ROWS) and all(l.count("|") == 7 for l in lines)
  assert lines[1].startswith("| FedAvg (global model) | 0.5000 ± 0.0000 |")
  assert "| APFL | diverged or not run |" in text or "| APFL | skipped:" in text
  with open(out + ".json") as f:
    report = json.load(f)
  assert report["digits"]["stats"]["ditto"]["mean"] == [0.9, 0.0]
  assert "records" not in report["digits"]["runs"]["fedavg"][0]
  assert report["digits"]["tuned_apart"]["fedavg_bn"]["lr"] == 0.3


@pytest.mark.slow
def test_quick_command_writes_the_files_and_the_table(tmp_path):
  """The command line end to end on digits (two seeds trained together, three rows)."""
  out = str(tmp_path / "report")
  subprocess.run([sys.executable, "-m", "experiments.personal_study", "--quick",
                  "--methods=fedavg,fedavg_ft,local,fedrep", f"--out={out}",
                  f"--runs_dir={tmp_path / 'runs'}"], cwd=REPO, check=True,
                 capture_output=True, text=True)
  for ext in (".md", ".png", ".json"):
    assert os.path.getsize(out + ext) > 0
  text = open(out + ".md").read()
  lines = [l for l in text.splitlines() if l.startswith("| ")]
  assert [l.split("|")[1].strip() for l in lines[1:]] == [
      "FedAvg (global model)", "FedAvg + fine-tuning", "local training only (Ditto, λ = 0)",
      "FedRep"]
  assert all(l.split("|")[2].count("±") == 1 for l in lines[1:4])
  with open(out + ".json") as f:
    report = json.load(f)["digits"]
  assert sorted(report["runs"]) == sorted(["fedavg", "local"] + (
      ["fedrep"] if "fedrep" not in report["skipped"] else []))
  assert all(len(v) == 2 for v in report["runs"].values())
  # The fine-tuned and the global model differ; the local row's global model is FedAvg's.
  assert report["stats"]["fedavg_ft"]["mean"] != report["stats"]["fedavg"]["mean"]
  assert report["stats"]["local"]["global_mean"] == report["stats"]["fedavg"]["mean"]


def test_the_batchnorm_rows_take_fedavg_s_rate_on_their_own_model(monkeypatch, tmp_path):
  """tune() picks a rate for each model (FedAvg's runs on it), train() runs each row at its
  model's rate; the tuning of the BatchNorm model trains the MLP with BatchNorm."""
  study = ps.Study("digits", ps.quick_config(), [ROW["fedavg"], ROW["fedbn"]], [0, 1],
                   [0.1, 0.3], 0, 5, None)
  tuned_configs = {}

  def fake_tune(config_for, lrs, seed, workdir_for, full_lrs):
    del full_lrs
    config = config_for(lrs[0], seed)
    tuned_configs[workdir_for(lrs[0], seed)] = config
    return sweep.Tuned(0.3 if config.model_options.get("batch_norm") else 0.1, {})

  trained = {}

  def fake_group(configs, workdirs):
    for c, w in zip(configs, workdirs):
      trained[w] = c.local_lr
    return [{} for _ in configs]

  monkeypatch.setattr(ps.sweep, "tune_widening", fake_tune)
  monkeypatch.setattr(ps.sweep, "run_group", fake_group)
  tuned = study.tune(str(tmp_path))
  assert {k: t.value for k, t in tuned.items()} == {"fedavg": 0.1, "fedavg_bn": 0.3}
  assert sorted(os.path.relpath(w, tmp_path).split(os.sep)[1] for w in tuned_configs) == [
      "fedavg", "fedavg_bn"]
  study.train(str(tmp_path), {k: t.value for k, t in tuned.items()})
  rates = {os.path.relpath(w, tmp_path).split(os.sep)[1]: lr for w, lr in trained.items()}
  assert rates == {"fedavg": 0.1, "fedbn": 0.3}


def test_the_reports_command_writes_this_machines_directories_as_placeholders(monkeypatch):
  monkeypatch.setattr(sys, "argv", [
      "x", "--data_dir=/home/me/data", "--runs_dir=/scratch/r", "--pretrained=/scratch/p",
      "--out=experiments/results/lora", "--lrs=0.1", "--quick"])
  assert ps.command_line("experiments.lora_study") == (
      "python -m experiments.lora_study --data_dir=DATA --runs_dir=RUNS "
      "--pretrained=PRETRAINED --out=experiments/results/lora --lrs=0.1 --quick")
