"""experiments.fedlamb_mnist: the verdict rule on hand-written numbers, the per-panel summary
against values worked out here, and one smoke panel end to end."""
import json
import os

import numpy as np
import pytest

from experiments import fedlamb_mnist


@pytest.mark.parametrize("lamb,other,expected", [
    ([0.5, 0.6, 0.7], [0.4, 0.5, 0.6], "holds"),
    ([0.5, 0.6, 0.7], [0.4, 0.5, 0.75], "leans (not in every seed)"),  # mean diff +0.05/3
    ([0.5, 0.6, 0.7], [0.4, 0.7, 0.8], "does not hold"),               # mean diff -0.2/3
    ([0.5, 0.6, 0.7], [0.5, 0.6, 0.7], "does not hold"),               # a tie is not a lead
    ([0.5], None, "holds (the baseline diverged)"),
    (None, [0.5], "does not hold (Fed-LAMB diverged)"),
])
def test_claim_verdict_rule(lamb, other, expected):
  as_array = lambda v: None if v is None else np.array(v)
  assert fedlamb_mnist.claim_verdict(as_array(lamb), as_array(other)) == expected


def _run(accuracies):
  records = [{"round": 0, "test_accuracy": 0.1}]  # an initial evaluation is not round 1
  records += [{"round": k + 1, "test_accuracy": a} for k, a in enumerate(accuracies)]
  return {"records": records, "final_test_accuracy": accuracies[-1]}


def test_panel_summary_numbers():
  curves = {  # two seeds of 10 rounds each
      "Fed-LAMB": [[.5, .6, .7, .8, .9, .9, .9, .9, .95, .96],
                   [.4, .6, .7, .8, .9, .9, .9, .9, .9, .9]],
      "Fed-AMS": [[.3, .5, .7, .8, .9, .9, .9, .9, .9, .97],
                  [.5, .6, .7, .8, .9, .9, .9, .9, .9, .9]],
      "Fed-SGD": [[.1, .2, .3, .4, .5, .6, .7, .8, .9, .95],
                  [.1, .2, .3, .4, .5, .6, .7, .8, .9, .91]],
  }
  results = {label: {"lr": 0.01, "runs": [_run(c) for c in cs]} for label, cs in curves.items()}
  results["Fed-SGD"]["runs"].append({"diverged": "nan loss"})
  summary = fedlamb_mnist.panel_summary(results, target=0.95, early_rounds=3)
  lamb, ams, sgd = (summary["methods"][k] for k in ("Fed-LAMB", "Fed-AMS", "Fed-SGD"))
  # Early scores over rounds 1-3, worked by hand: LAMB (.5+.6+.7)/3 = .6 and .5667;
  # AMS .5 and .6: LAMB leads in seed 0 only, and its mean (.5833) beats AMS's (.55).
  np.testing.assert_allclose(lamb["early_score"], [0.6, 1.7 / 3])
  np.testing.assert_allclose(ams["early_score"], [0.5, 0.6])
  assert summary["verdicts"]["Fed-AMS"] == "leans (not in every seed)"
  # One seed of Fed-SGD diverged: no paired score, so the claim holds against it.
  assert sgd["early_score"] is None and sgd["diverged"] == 1 and sgd["seeds"] == 3
  assert summary["verdicts"]["Fed-SGD"] == "holds (the baseline diverged)"
  assert lamb["at_round"] == {1: [.5, .4], 5: [.9, .9], 10: [.96, .9]}
  assert lamb["rounds_to_target"] == [9, None]
  assert ams["rounds_to_target"] == [10, None]
  assert sgd["rounds_to_target"] == [10, None]  # the second seed ends at 0.91
  np.testing.assert_allclose(lamb["mean_curve"][0], 0.45)
  np.testing.assert_allclose(lamb["std_curve"][0], 0.05)
  text = fedlamb_mnist.summary_markdown({"p": summary}, "small", 3, 60.0, {"p": "p.md"},
                                        "x.png")
  assert "| p | Fed-LAMB | 0.01 | 0.4500 ± 0.0500 |" in text
  assert "0.95: 9, >10" in text
  assert "Holds in 1 of 1 panels against Fed-AMS" not in text  # it leans there
  assert "Holds in 0 of 1 panels against Fed-AMS and in 1 of 1 against Fed-SGD" in text


def test_unknown_panel_is_refused_with_the_known_ones(tmp_path):
  with pytest.raises(Exception, match="f2-mnist-mlp-noniid-e1"):
    fedlamb_mnist.run(["no-such-panel"], "smoke", str(tmp_path), None,
                      str(tmp_path / "s.md"), 5)


@pytest.mark.slow
def test_smoke_panel_end_to_end(tmp_path):
  out, summary = str(tmp_path / "panels"), str(tmp_path / "summary" / "fedlamb_mnist_smoke.md")
  path = fedlamb_mnist.run(["f2-mnist-mlp-noniid-e1"], "smoke", out, str(tmp_path / "runs"),
                           summary, 5)
  text = open(path).read()
  for label in fedlamb_mnist.METHODS:
    assert f"| f2-mnist-mlp-noniid-e1 | {label} |" in text
  assert os.path.exists(os.path.join(out, "fedlamb_f2-mnist-mlp-noniid-e1_smoke.md"))
  assert os.path.exists(summary.replace(".md", ".png"))
  with open(summary.replace(".md", ".json")) as f:
    numbers = json.load(f)
  verdicts = numbers["f2-mnist-mlp-noniid-e1"]["verdicts"]
  assert set(verdicts) == {"Fed-AMS", "Fed-SGD"}
  assert os.path.isdir(tmp_path / "runs" / "fedlamb_f2-mnist-mlp-noniid-e1_smoke")
