"""experiments.fedat_tables --finished_only: a report from the runs that have finished, with
the missing ones named and every row averaging the seeds it has (run directories written
here by hand, so nothing trains)."""
import json
import os

import pytest

from configs import fedat_fmnist
from experiments import fedat_tables


def write_run(root, setting, label, seed, accuracies, variance=0.01, upload_bytes=1000):
  workdir = os.path.join(root, "budget40", setting, label, f"seed{seed}")
  os.makedirs(workdir)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for i, acc in enumerate(accuracies):
      up = upload_bytes * (i + 1)
      f.write(json.dumps({"virtual_time": 10.0 * (i + 1), "test_accuracy": acc,
                          "client_test_accuracy_var": variance, "bytes_up": up,
                          "bytes_down": 2 * up, "uploads": i + 1}) + "\n")
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump({"best_test_accuracy": max(accuracies), "virtual_time": 10.0 * len(accuracies),
               "global_updates": len(accuracies), "comm_bytes": 3 * upload_bytes,
               "wall_seconds": 5.0}, f)


def test_finished_only_reports_finished_seeds_and_names_the_missing(tmp_path):
  root = str(tmp_path)
  write_run(root, "2", "FedAT", 0, [0.5, 0.8, 0.7])
  write_run(root, "2", "FedAT", 2, [0.4, 0.6, 0.9])
  write_run(root, "2", "FedAvg", 1, [0.3, 0.5, 0.6])
  study = fedat_tables.FedATStudy(fedat_fmnist.get_config(), ["2"], ["fedat", "fedavg"], [],
                                  [0, 1, 2], 40.0, 10.0, {"2": 0.75}, finished_only=True)
  results = study.run(root)
  assert [len(results["2"][label]) for label in ("FedAT", "FedAvg")] == [2, 1]
  assert study.missing == [("2", "FedAvg", 0), ("2", "FedAT", 1), ("2", "FedAvg", 2)]
  text = study.report(results)
  assert "--finished_only" in text
  # Best accuracy: FedAT's seeds 0.8 and 0.9 -> 0.850 ± 0.050; FedAvg's single seed 0.6 (one
  # run: no spread shown).
  assert "| FedAT | Accuracy | 0.850 ± 0.050 |" in text
  assert "| FedAvg | Accuracy | 0.600 |" in text
  # Target 0.75: FedAT reached it at 20 s and 30 s (both of its two runs), FedAvg never.
  assert "| FedAT | 25 ± 5 |" in text
  assert "| FedAvg | not reached |" in text
  assert "| 2 | FedAT | 2 |" in text and "| 2 | FedAvg | 1 |" in text
  assert ("Not finished, so not in the tables (3 runs): #class 2 FedAvg seed 0, 2; #class 2 "
          "FedAT seed 1.") in text


def test_a_partly_reached_target_counts_the_rows_own_runs(tmp_path):
  root = str(tmp_path)
  write_run(root, "2", "FedAT", 0, [0.5, 0.8])
  write_run(root, "2", "FedAT", 1, [0.5, 0.6])
  study = fedat_tables.FedATStudy(fedat_fmnist.get_config(), ["2"], ["fedat"], [], [0, 1, 2],
                                  40.0, 10.0, {"2": 0.75}, finished_only=True)
  text = study.report(study.run(root))
  assert "| FedAT | 20 (1/2) |" in text


def test_the_command_line_names_settings_that_have_no_run_yet(tmp_path):
  root = str(tmp_path)
  write_run(root, "2", "FedAT", 0, [0.5, 0.8])
  study = fedat_tables.FedATStudy(fedat_fmnist.get_config(), ["2", "8"], ["fedat"], [], [0],
                                  40.0, 10.0, {"2": 0.75}, finished_only=True)
  text = study.report(study.run(root))
  assert "--settings=2,8 " in text
  assert "| FedAT | Accuracy | 0.800 |" in text and "#class 8" not in text.split("## Runs")[0]


def test_a_setting_may_have_several_targets(tmp_path):
  root = str(tmp_path)
  write_run(root, "2", "FedAT", 0, [0.5, 0.8, 0.7], upload_bytes=1_000_000)
  write_run(root, "2", "FedAT-p6", 0, [0.3, 0.45, 0.5], upload_bytes=2_000_000)
  targets = fedat_tables.parse_targets(["2=0.79", "2=0.45"])
  assert targets == {"2": [0.79, 0.45]}
  study = fedat_tables.FedATStudy(fedat_fmnist.get_config(), ["2"], ["fedat"], ["4", "6"], [0],
                                  40.0, 10.0, targets, finished_only=True)
  text = study.report(study.run(root))
  table2 = text.split("## Table 2")[1].split("## Precision")[0]
  assert "target accuracy 0.79" in table2 and "target accuracy 0.45" in table2
  at_079, at_045 = table2.split("target accuracy 0.45")
  # 0.79: FedAT first reaches it at the second tick (20 s), with 2 MB up and 4 MB down.
  assert "| FedAT | 20 | not reached | 6.00 | 2.00 | 1041.54 |" in at_079
  # 0.45: FedAT's first tick already has 0.5, at 10 s.
  assert "| FedAT | 10 | 10 | 3.00 | 1.00 | - |" in at_045
  # The ablation has a column pair per target; precision 6 reaches 0.45 at 20 s with 4 MB up
  # (MB are 10**6 bytes, as the paper's) and never reaches 0.79.
  ablation = text.split("## Precision ablation")[1].split("## Where")[0]
  assert "MB up to 0.79 | virtual time to 0.79 (s) | MB up to 0.45 |" in ablation
  assert "| 6 | 0.500 | 0.01000 | 2000000 | 6.00 | not reached | not reached | 4.00 | 20 |" \
      in ablation


@pytest.mark.parametrize("item", ["2", "2=abc", "2=0", "2=1.5", "3=0.5", "idd=0.7"])
def test_bad_targets_are_refused_naming_the_flag(item):
  with pytest.raises(Exception, match="--targets"):
    fedat_tables.parse_targets([item])


def test_table_2_outcomes_are_checked_at_every_target(tmp_path):
  root = str(tmp_path)
  # Ticks at 10, 20, 30 s; bytes up at tick i are upload_bytes * i, down twice that.
  write_run(root, "2", "FedAT", 0, [0.5, 0.6, 0.7], upload_bytes=1_000_000)   # 0.45 at 10 s
  write_run(root, "2", "FedAvg", 0, [0.2, 0.3, 0.5], upload_bytes=100_000)    # 0.45 at 30 s
  write_run(root, "2", "TiFL", 0, [0.2, 0.3, 0.4], upload_bytes=100_000)      # never
  study = fedat_tables.FedATStudy(fedat_fmnist.get_config(), ["2"], ["fedat", "fedavg", "tifl"],
                                  [], [0], 40.0, 10.0, {"2": [0.79, 0.45]}, finished_only=True)
  text = study.report(study.run(root)).split("## Where the paper's ordering holds here")[1]
  assert ("- #class 2, target 0.79: no method reaches it, so FedAT's fewest bytes and earliest "
          "time do not hold.") in text
  # 0.45: FedAT 3 MB (1 up + 2 down) at 10 s; FedAvg 0.9 MB (0.3 up + 0.6 down) at 30 s.
  assert ("- #class 2, target 0.45: fewest MB up + down FedAvg (0.90) — FedAT fewest: does "
          "not hold; TiFL does not reach it, FedAT does: sooner holds; time to it FedAvg / "
          "FedAT = 3.00x (the paper: 5-6x on CIFAR-10) — sooner: holds.") in text


def test_an_included_report_json_adds_its_other_methods_rows(tmp_path):
  """A new method beside a committed study: the earlier report's JSON supplies the rows of the
  methods this command does not run, from the measures it stored (no records, no retraining)."""
  old, new = str(tmp_path / "old"), str(tmp_path / "new")
  write_run(old, "2", "FedAT", 0, [0.5, 0.8, 0.7], upload_bytes=1_000_000)
  write_run(old, "2", "FedAsync", 0, [0.3, 0.9, 0.6])
  earlier = fedat_tables.FedATStudy(fedat_fmnist.get_config(), ["2"], ["fedat", "fedasync"], [],
                                    [0], 40.0, 10.0, {"2": [0.75, 0.45]}, finished_only=True)
  path = str(tmp_path / "old.json")
  with open(path, "w") as f:
    json.dump({"budget_s": 40.0, "runs": earlier.raw(earlier.run(old))}, f)

  write_run(new, "2", "FedBuff", 0, [0.2, 0.4, 0.6])
  write_run(new, "2", "FedAsync", 0, [0.1, 0.1, 0.1])  # this command's own run wins
  study = fedat_tables.FedATStudy(fedat_fmnist.get_config(), ["2"], ["fedbuff", "fedasync"], [],
                                  [0], 40.0, 10.0, {"2": [0.75, 0.45]}, finished_only=True,
                                  include=path)
  text = study.report(study.run(new))
  assert f"--include={path}" in text
  assert "| FedBuff | Accuracy | 0.600 |" in text
  assert "| FedAT | Accuracy | 0.800 |" in text
  assert "| FedAsync | Accuracy | 0.100 |" in text      # not the included 0.9
  at_075, at_045 = text.split("## Table 2")[1].split("target accuracy 0.45")
  assert "| FedAT | 20 | not reached | 6.00 | 2.00 |" in at_075   # stored at both targets
  assert "| FedAT | 10 |" in at_045 and "| FedBuff | 30 |" in at_045

  # A JSON of an older format stored only the first target's measures: the other target's
  # rows say so instead of "not reached".
  with open(path) as f:
    stored = json.load(f)
  for runs in stored["runs"]["2"].values():
    for run in runs:
      del run["measures_at"]
  with open(path, "w") as f:
    json.dump(stored, f)
  text = study.report(study.run(new))
  assert "| FedAT | not stored in the included JSON |" in text.split("target accuracy 0.45")[1]


def test_an_included_json_of_another_budget_is_refused(tmp_path):
  path = tmp_path / "old.json"
  path.write_text(json.dumps({"budget_s": 200.0, "runs": {}}))
  study = fedat_tables.FedATStudy(fedat_fmnist.get_config(), ["2"], ["fedbuff"], [], [0], 40.0,
                                  10.0, {"2": 0.75}, finished_only=True, include=str(path))
  with pytest.raises(Exception, match="--include: .* 200 s .* --budget_s=40"):
    study.run(str(tmp_path))
