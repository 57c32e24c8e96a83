"""experiments.baselines_study (behind compare_algorithms) end to end on the built-in digits:
split, the report's rows, the server-rate sensitivity at its own seeds, and reuse on a rerun."""
import json
import os

import pytest

from experiments import baselines_study
from tests.test_training import tiny_config


def tiny_base():
  return tiny_config(rounds=3, local_steps=2, eval_every=1, checkpoint_every=3,
                     validation_fraction=0.1)


def _summaries(runs):
  return sorted(os.path.join(d, f) for d, _, fs in os.walk(runs) for f in fs
                if f == "summary.json")


@pytest.mark.slow
def test_compare_tunes_reports_sensitivity_and_reuses_runs(tmp_path):
  out, runs = str(tmp_path / "report"), str(tmp_path / "runs")
  args = dict(base=tiny_base(), algorithms=["fedavg", "fedadam"], lrs=[0.03, 0.3],
              seeds=[0, 1], tune_seed=0,
              overrides=baselines_study.parse_overrides("fedadam:server_lr=0.01"),
              server_lr_algorithms=["fedadam", "scaffold"], server_lrs=[0.01, 1.0],
              server_lr_seeds=[1], out=out, runs_dir=runs)
  text = baselines_study.compare(**args)
  assert open(out + ".md").read() == text + "\n"
  assert "| fedavg |" in text and "| fedadam |" in text
  # The overridden server rate is named in the row's note; FedAvg's note is empty.
  assert "overrides: server_lr=0.01 |" in text.split("| fedadam |")[1].split("\n")[0]
  assert text.split("| fedavg |")[1].split("\n")[0].endswith("| - |")
  assert "local rate; seed 1):" in text  # the sensitivity ran at --server_lr_seeds, not --seeds
  assert "fedadam_server_lr0.01" in text and "fedadam_server_lr1" in text
  assert "- fedadam sensitive to its server rate" in text
  # On a grid of two rates every pick is at an edge, and the report says so.
  edges = text.split("Picked at an edge of its grid")[1].split("\n")[0]
  assert "fedavg (0." in edges and "fedadam (0." in edges
  with open(out + ".json") as f:
    report = json.load(f)
  assert set(report["results"]) == {"fedavg", "fedadam"}
  # scaffold was not compared, so it has no sensitivity row.
  assert set(report["sensitivity"]) == {"fedadam_server_lr0.01", "fedadam_server_lr1"}
  for name, res in report["results"].items():
    assert res["lr"] in (0.03, 0.3)
    assert len(res["runs"]) == 2, name
  for res in report["sensitivity"].values():
    assert len(res["runs"]) == 1
  # 2 algorithms x (2 tuning rates + 1 more seed) + 2 sensitivity runs.
  summaries = _summaries(runs)
  assert len(summaries) == 2 * 3 + 2
  assert sorted(os.path.relpath(s, runs).split(os.sep)[-2] for s in summaries
                if "_server_lr" in s) == ["seed1", "seed1"]
  stamps = [os.path.getmtime(s) for s in summaries]
  again = baselines_study.compare(**args)
  assert [os.path.getmtime(s) for s in _summaries(runs)] == stamps
  assert again.split("Wall time")[1] == text.split("Wall time")[1]


def _res(*finals, diverged=0):
  return {"runs": [{"final_test_accuracy": a} for a in finals] + [{"diverged": 3}] * diverged}


def test_literature_checks_known_answers():
  results = {"fedavg": _res(0.70, 0.72), "scaffold": _res(0.80, 0.82),
             "feddyn": _res(0.60, 0.62, diverged=1)}
  sens = {"fedadam_server_lr0.01": _res(0.70), "fedadam_server_lr1": _res(diverged=1),
          "fedyogi_server_lr0.01": _res(0.70), "fedyogi_server_lr0.1": _res(0.72)}
  lines = baselines_study.literature_checks(results, sens)
  assert len(lines) == 4
  # scaffold: gap +0.10 against spreads 0.01 + 0.01.
  assert "scaffold ahead" in lines[0] and "**holds**" in lines[0] and "+0.1000" in lines[0]
  assert "feddyn ahead" in lines[1] and "**does not hold**" in lines[1]
  assert "1 of 3 seeds diverged" in lines[1]
  # A diverged server rate is the low end of the range: 0.70 - 0 > 0.05.
  assert "fedadam sensitive" in lines[2] and "**holds**" in lines[2] and "1: diverged" in lines[2]
  assert "from divergence up to 0.7000" in lines[2]
  # 0.02 apart: not sensitive.
  assert "fedyogi sensitive" in lines[3] and "**does not hold**" in lines[3]
  assert "range 0.0200" in lines[3]
  tie = baselines_study.literature_checks(
      {"fedavg": _res(0.70, 0.74), "scaffold": _res(0.71, 0.75)}, {})
  assert tie and "a tie within the seeds' spread" in tie[0]


def test_overrides_parse_and_bad_input_names_the_field():
  parsed = baselines_study.parse_overrides(
      "fedprox:fedprox.mu=0.01; fedspeed:fedspeed.server_average=all_clients,fedspeed.rho=0.1")
  assert parsed["fedprox"] == {"fedprox.mu": 0.01}
  assert parsed["fedspeed"] == {"fedspeed.server_average": "all_clients", "fedspeed.rho": 0.1}
  assert parsed["fedadam"] == {"server_lr": 0.03}  # the default stays unless overridden
  with pytest.raises(ValueError, match="unknown algorithm 'fedfoo'.*accepted: .*fedavg"):
    baselines_study.parse_overrides("fedfoo:mu=1")
  with pytest.raises(ValueError, match="'mu' .* is not KEY=VALUE"):
    baselines_study.parse_overrides("fedprox:mu")
