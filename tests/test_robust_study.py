"""experiments.robust_study: a --quick grid on the built-in digits writes its files with a
table of the grid's shape; the claims, the backdoor table and the flags' parsing on known
inputs."""
import json
import os

import pytest

from configs import default
from experiments import robust_study
from fedjax_lama.errors import ConfigError
from fedjax_lama.robust import robust_stage


def digits_base(**fields):
  """The default digits config with the study's robust settings, cut by --quick."""
  c = default.get_config()
  c.validation_fraction = 0.1
  c.robust.malicious_fraction = 0.2
  c.robust.beta = 0.2
  c.robust.scale = 4.0
  c = robust_study.quick(c)
  c.update_from_flattened_dict(fields)
  return c


def _table_rows(text: str, title: str) -> list:
  """The markdown rows (header first) of the table after `title`."""
  block = text.split(title)[1].strip().split("\n\n")[0]
  return [[c.strip() for c in line.strip("|").split("|")] for line in block.split("\n")
          if not line.startswith("|---")]


@pytest.mark.slow
def test_quick_grid_writes_the_files_and_a_table_of_the_grid(tmp_path):
  attacks = [robust_study.parse_attack(a) for a in ("none", "sign_flip")]
  study = robust_study.Study(digits_base(), ["none", "krum"], attacks, seeds=[0], lrs=[0.1])
  assert (study.f, study.own_f) == (3, {})  # cohorts of 15, 20 % malicious
  runs = str(tmp_path / "runs")
  lr, scores = study.tune(runs)
  assert (lr, scores) == (0.1, None)  # one rate is used as given
  results = study.run(runs, lr)
  out = str(tmp_path / "results" / "robust")
  text = robust_study.write(study, results, lr, scores, out, command="python -m x",
                            doc_dir=str(tmp_path / "docs"))
  assert open(out + ".md").read() == text + "\n"
  assert os.path.getsize(out + "_accuracy.png") > 0
  assert not os.path.exists(out + "_backdoor.png")  # no run reports a backdoor
  rows = _table_rows(text, "Final test accuracy (mean ± std over seeds):")
  assert rows[0] == ["defence \\ attack", "none", "sign_flip"]
  assert [r[0] for r in rows[1:]] == ["mean (none)", "krum"]
  assert all(len(r) == 3 and all("±" in c or c == "diverged" for c in r[1:]) for r in rows[1:])
  assert "![final test accuracy](../results/robust_accuracy.png)" in text
  assert "Command: `python -m x`" in text and "f=3" in text
  assert "- (a) krum without attack is below the mean" in text
  assert "- (b) the mean collapses under sign_flip" in text
  with open(out + ".json") as f:
    report = json.load(f)
  assert sorted(report["runs"]) == ["krum|none", "krum|sign_flip", "none|none",
                                    "none|sign_flip"]
  assert all(len(v) == 1 for v in report["runs"].values())
  # The malicious clients were drawn: the attacked cells saw attackers, the others none.
  metrics = os.path.join(study.workdir(runs, "krum", attacks[1], lr, 0), "metrics.jsonl")
  with open(metrics) as f:
    assert any(json.loads(line).get("aggregator_malicious", 0) > 0 for line in f)


def _values(**cells):
  """{(defence, attack): [per seed]} from keyword cells "defence__attack"."""
  return {tuple(k.split("__")): v for k, v in cells.items()}


def test_claims_on_known_numbers():
  attacks = [robust_study.parse_attack(a) for a in
             ("none", "sign_flip", "alie", "ipm", "ipm:epsilon=100")]
  values = _values(none__none=[0.80, 0.82], krum__none=[0.70, 0.71], median__none=[0.80, 0.81],
                   none__sign_flip=[0.10, None], krum__sign_flip=[0.69, 0.70],
                   median__sign_flip=[0.50, 0.52], krum__alie=[0.40, 0.42],
                   median__alie=[0.80, 0.81], krum__ipm=[0.70, 0.70],
                   krum__ipm_100=[0.10, 0.12], median__ipm_100=[0.60, 0.62])
  values = {(d, "ipm:epsilon=100" if a == "ipm_100" else a): v for (d, a), v in values.items()}
  lines = robust_study.claims(values, attacks)
  by = lambda prefix: [l for l in lines if l.lstrip().startswith(prefix)]
  krum_a, median_a = by("- (a)")
  assert "krum" in krum_a and "**holds**" in krum_a
  assert "median" in median_a and "**does not hold**" in median_a  # 0.805 against 0.81
  # A diverged run counts as 0: the mean's 0.05 is a collapse.
  assert "**holds**" in by("- (b)")[0] and "0.0500" in by("- (b)")[0]
  kept = {l.split()[1]: l for l in by("- krum keeps") + by("- median keeps")}
  assert "**holds**" in kept["krum"] and "**does not hold**" in kept["median"]
  alie = by("- (c)")
  assert len(alie) == 2  # no trimmed_mean cells
  assert "krum" in alie[0] and "**holds**" in alie[0]
  assert "median" in alie[1] and "**does not hold**" in alie[1]
  ipm = by("- (d)")  # the largest epsilon's column, not the default one
  assert all("ipm:epsilon=100" in l for l in ipm)
  assert "**holds**" in ipm[0] and "krum" in ipm[0]
  assert "**does not hold**" in ipm[1] and "median" in ipm[1]


def test_a_backdoor_metric_adds_its_table_and_heatmap(tmp_path):
  attacks = [robust_study.parse_attack(a) for a in ("none", "label_flip")]
  study = robust_study.Study(digits_base(), ["none", "median"], attacks, seeds=[0, 1],
                             lrs=[0.1])
  run = lambda acc, success: {"final_test_accuracy": acc, "wall_seconds": 1.0,
                              "final_backdoor_success": success, "backdoor_note": "x"}
  results = {(d, a.label): [run(0.7, 0.1 * i), {"diverged": "nan"}]
             for i, (d, a) in enumerate(study.cells())}
  # A cell whose runs measure no backdoor is "-" in its table, not a divergence.
  results[("none", "none")] = [{"final_test_accuracy": 0.8, "wall_seconds": 1.0}] * 2
  assert robust_study.backdoor_key(results) == "final_backdoor_success"
  out = str(tmp_path / "r")
  text = robust_study.write(study, results, 0.1, {0.1: 0.5}, out)
  assert os.path.getsize(out + "_backdoor.png") > 0
  rows = _table_rows(text, "`final_backdoor_success` of summary.json (mean ± std over "
                           "seeds):")
  assert rows[0] == ["defence \\ attack", "none", "label_flip"]
  assert rows[1] == ["mean (none)", "-", "0.1000 ± 0.0000 (1 diverged)"]
  assert rows[2] == ["median", "0.2000 ± 0.0000 (1 diverged)", "0.3000 ± 0.0000 (1 diverged)"]
  assert robust_study.backdoor_key({("none", "none"): [{"final_test_accuracy": 1.0}]}) is None


def test_every_defence_and_attack_by_default_and_bad_input_names_the_flag():
  assert robust_study.default_defences() == list(robust_stage.DEFENCES)
  assert robust_study.default_attacks()[:len(robust_stage.ATTACKS)] == list(
      robust_stage.ATTACKS)
  assert robust_study.parse_attack("ipm:epsilon=100") == robust_study.Attack(
      "ipm:epsilon=100", "ipm", {"epsilon": 100})
  assert robust_study.split_attacks("none; ipm:epsilon=1,z=2 ;") == ["none",
                                                                     "ipm:epsilon=1,z=2"]
  with pytest.raises(ConfigError, match="--attacks: 'foo'.*accepted: none, sign_flip"):
    robust_study.parse_attack("foo")
  with pytest.raises(ConfigError, match="'epsilon' in 'ipm:epsilon' is not KEY=VALUE"):
    robust_study.parse_attack("ipm:epsilon")
  with pytest.raises(ConfigError, match="--defences: 'mean' is not accepted"):
    robust_study.Study(digits_base(), ["mean"], [], [0], [0.1])
  assert robust_study.parse_shard("1/4") == (1, 4)
  with pytest.raises(ConfigError, match="--shard='4/4'"):
    robust_study.parse_shard("4/4")


def test_f_is_the_expected_attackers_and_bulyan_gets_its_own_when_its_bound_refuses():
  # Cohorts of 10 at 20 %: f = 2; Bulyan needs n >= 4f + 3 = 11, so it tolerates f = 1.
  base = digits_base(num_clients=20, active_ratio=0.5)
  assert robust_study.tolerated(base) == (2, {"bulyan": 1})
  study = robust_study.Study(base, ["bulyan", "krum"], [robust_study.parse_attack("ipm")],
                             [0], [0.1])
  assert study.config("bulyan", study.attacks[0], 0.1, 0).robust.f == 1
  assert study.config("krum", study.attacks[0], 0.1, 0).robust.f == 2
  with pytest.raises(ConfigError, match="malicious_fraction=0.5"):
    robust_study.tolerated(digits_base(**{"robust.malicious_fraction": 0.5}))
