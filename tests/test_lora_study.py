"""The LoRA study (experiments/lora_study.py): its rows' settings and uplink sizes counted by
hand, the DP row's noise plan against the accountant, the report on made-up summaries, and
(slow, with the shared data) the --quick pipeline end to end, twice: the second call trains
nothing."""
import json
import math
import os

import jax
import jax.numpy as jnp
import pytest

from experiments import lora_study as ls
from experiments import personal_study as ps
from fedjax_lama import models, training
from fedjax_lama.algorithms import layer_partition
from fedjax_lama.config import validate
from fedjax_lama.errors import ConfigError
from fedjax_lama.models import lora
from fedjax_lama.privacy import accounting
from tests.conftest import shared_data_dir_or_skip

ROLES = 21


def _configs():
  base = ls.study_config()
  runs = ls.runs_for(base, ROLES)
  return base, {key: ps.run_config(base, run, 0.5, 1, 0, None) for key, run in runs.items()}


def test_rows_configure_their_methods():
  base, configs = _configs()
  assert {r.run for r in ls.ROWS} - {"base"} == set(configs)
  for c in configs.values():
    validate(c)
  assert "lora" not in configs["fedavg"].model_options and configs["fedavg"].trainable == ""
  for key, rank, trainable, algorithm in (
      ("lora4", 4, "", "fedavg"), ("lora16", 16, "", "fedavg"), ("ffa", 16, "lora_b", "fedavg"),
      ("local", 4, "lora", "fedper"), ("personal", 4, "lora,Dense_0", "lg_fedavg"),
      ("dp_ffa", 16, "lora_b", "fedavg")):
    c = configs[key]
    assert (c.model_options.lora.rank, c.model_options.lora.targets) == (rank, ls.TARGETS)
    assert (c.trainable, c.algorithm) == (trainable, algorithm), key
  assert configs["local"].fedper.personal_layers == "block_0,block_1"
  dp = configs["dp_ffa"]
  assert dp.privacy.enabled and dp.privacy.target_epsilon == 8.0
  assert (dp.weighting, dp.num_clients) == ("uniform", ROLES)
  assert [r.label for r in ls.select_rows(["ffa", "base"])] == ["base", "ffa"]
  with pytest.raises(ConfigError, match="--methods: 'lora8'.*accepted: base, local"):
    ls.select_rows(["lora8"])


def _uplink_floats(config) -> int:
  """Floats a client sends per round: the trainable set less the algorithm's personal layers
  (FedPer's named ones, LG-FedAvg's every top-level module but the head)."""
  options = dict(config.model_options)
  options["lora"] = dict(options["lora"]) if "lora" in options else None
  model = models.get(config.model, 81, **options)
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                             jnp.zeros((1, 80), jnp.int32))["params"])
  chosen = lora.trainable_set(shapes, config.trainable or ("lora" if options["lora"] else "*"))
  trainable, _ = chosen.split(shapes)
  personal = {"fedper": lambda p: layer_partition.names(config.fedper.personal_layers),
              "lg_fedavg": lambda p: layer_partition.every_layer_but_the_head(p, "x")}
  if config.algorithm not in personal:
    return chosen.size
  mask = layer_partition.select_names(trainable, personal[config.algorithm](trainable), "x", "")
  sizes = [math.prod(x.shape) for x in jax.tree.leaves(trainable)]
  return sum(s for s, m in zip(sizes, mask) if not m)


def test_uplink_per_client_counted_by_hand():
  """Width 64, 2 blocks, MLP 256: per block A has 64 r for each of the 4 attention
  projections and mlp_in, 256 r for mlp_out; B the same (outputs 64, 64, 64, 64, 256, 64)."""
  _, configs = _configs()
  per_rank = 2 * 2 * (5 * 64 + 256)  # A and B, two blocks
  up = {key: _uplink_floats(c) for key, c in configs.items()}
  assert up["lora4"] == 4 * per_rank and up["lora16"] == 16 * per_rank
  assert up["ffa"] == up["lora16"] // 2 == up["dp_ffa"]
  assert up["fedavg"] == 115_665  # configs/text_study.py's count of the transformer
  assert up["local"] == 0
  assert up["personal"] == 64 * 81 + 81  # the output layer only
  assert up["lora4"] < up["lora16"] < up["fedavg"]


def test_dp_plan_at_the_study_s_role_count():
  base = ls.study_config()
  size = 16 * 2 * (5 * 64 + 256)  # FFA-LoRA's B at r = 16
  plan = ls.dp_plan(base, ROLES, size)
  # sigma reaches epsilon 8 over the study's rounds of every role (the accountant's own
  # epsilon of that sigma), and a 1 % smaller one does not.
  sampling = accounting.SamplingOptions("fixed", ROLES, cohort_size=ROLES)
  assert accounting.epsilon(sampling, plan["sigma"], base.rounds, 1e-5).epsilon <= 8.0 + 1e-6
  assert accounting.epsilon(sampling, 0.99 * plan["sigma"], base.rounds, 1e-5).epsilon > 8.0
  assert plan["noise_norm_over_clip"] == pytest.approx(plan["sigma"] * math.sqrt(size) / ROLES)
  assert not plan["useful"] and plan["cohort_needed"] > 10 * ROLES
  # The cohort it names is enough at the same sigma (every client in every round), one
  # fewer is not.
  enough = ls.dp_plan(base, plan["cohort_needed"], size)
  assert enough["sigma"] == pytest.approx(plan["sigma"], rel=1e-4) and enough["useful"]
  assert not ls.dp_plan(base, plan["cohort_needed"] - 1, size)["useful"]
  text = ls.dp_text(plan)
  assert "not useful" in text and f"{plan['cohort_needed']:,} clients per round" in text


def _summary(pooled, mean, up_bytes, personal=False):
  model = "personal" if personal else "global"
  s = {"final_test_accuracy": pooled, "comm_bits_up": 8 * up_bytes, "wall_seconds": 2.0}
  for m in {"global", model}:
    s.update({ps.metric(m, "weighted_mean"): pooled, ps.metric(m, "mean"): mean,
              ps.metric(m, "p10"): mean - 0.1, ps.metric(m, "worst"): mean - 0.2,
              ps.metric(m, "std"): 0.05})
  return s


RUNS = {"base": [_summary(0.30, 0.29, 0)],
        "local": [_summary(0.33, 0.34, 0, True), _summary(0.35, 0.36, 0, True)],
        "fedavg": [_summary(0.45, 0.44, 4e6), _summary(0.47, 0.46, 4e6)],
        "lora4": [_summary(0.40, 0.39, 3e5), _summary(0.42, 0.41, 3e5)],
        "lora16": [_summary(0.41, 0.40, 12e5), {"diverged": "loss nan"}],
        "ffa": [_summary(0.40, 0.40, 6e5), _summary(0.40, 0.40, 6e5)],
        "personal": [_summary(0.44, 0.46, 2e5, True), _summary(0.44, 0.46, 2e5, True)]}


def test_report_on_made_up_runs(tmp_path):
  base = ls.study_config()
  study = ps.Study(ls.NAME, base, [r for r in ls.ROWS if r.label not in ("base", "dp_ffa")],
                   [0, 1], [1.0], 0, 0, None, runs_by_key=ls.runs_for(base, ROLES))
  study.rows = list(ls.ROWS)
  plan = ls.dp_plan(base, ROLES, 18432)
  study.skipped["dp_ffa"] = "noise too large"
  res = {"lr": 1.0, "scores": {0.3: 0.2, 1.0: 0.3}, "others": {"lora4": (3.0, {3.0: 0.4})},
         "runs": RUNS, "notes": {"dp": plan, "clients": ROLES,
                                 "pretrain": {"final_test_accuracy": 0.45, "rounds": 60}}}
  out = str(tmp_path / "r")
  text = ls.write_report(study, res, out, "python -m experiments.lora_study")
  for ext in (".md", ".png", ".json"):
    assert os.path.getsize(out + ext) > 0
  lines = [l for l in text.splitlines() if l.startswith("| ")]
  assert len(lines) == 1 + len(ls.ROWS) and all(l.count("|") == 8 for l in lines)
  assert lines[1].startswith("| pretrained base, no federation | 0 | 0.0000 | 0.3000 ± 0.0000 |")
  assert "| FedAvg-LoRA, r = 4 | 300,000 | 0.0750 | 0.4100 ± 0.0100 | 0.4000 ± 0.0100 |" in text
  assert "| FedAvg-LoRA, r = 16 | 1,200,000 | 0.3000 | 0.4100 ± 0.0000 |" in text  # one seed
  assert "| DP FFA-LoRA, r = 16, ε = 8 | skipped: noise too large |" in text
  assert "personal LoRA above local-only LoRA: holds (pooled test accuracy 0.4400" in text
  assert "of every adapter row 3" in text and "not useful" in text
  with open(out + ".json") as f:
    report = json.load(f)[ls.NAME]
  assert report["notes"]["dp"]["cohort_needed"] == plan["cohort_needed"]
  assert report["stats"]["personal"]["pooled"] == pytest.approx([0.44, 0.0])


@pytest.mark.slow  # 8 programs compiled and trained: minutes on two shared cores
def test_quick_pipeline_end_to_end_then_nothing_trains(tmp_path, monkeypatch):
  data_dir = shared_data_dir_or_skip()
  runs_dir = str(tmp_path / "runs")
  base = ls.study_config(data_dir, rounds=1, quick=True)
  pretraining = ls.pretrain_config(data_dir, quick=True)
  pretraining.rounds = pretraining.eval_every = pretraining.checkpoint_every = 1

  def pipeline():
    return ls.run_study(base, pretraining, runs_dir, ls.ROWS, [0], [1.0], full_lrs=[1.0])

  study, res = pipeline()
  runs = res["runs"]
  up = {key: v[0]["comm_bits_up"] / 8 for key, v in runs.items()}
  clients = res["notes"]["clients"]
  assert up["base"] == up["local"] == 0
  assert 0 < up["lora4"] < up["lora16"] < up["fedavg"]
  assert up["ffa"] == up["lora16"] / 2
  assert up["personal"] == 4 * (16 * 81 + 81) * clients  # the quick width-16 output layer
  assert not res["notes"]["dp"]["useful"] and "dp_ffa" in study.skipped
  assert "dp_ffa" not in runs
  text = ls.write_report(study, res, str(tmp_path / "r"), "quick")
  rows = [l for l in text.splitlines() if l.startswith("| ")]
  assert [l.split(" | ")[0][2:] for l in rows[1:]] == [r.title for r in ls.ROWS]
  # Again: everything is read back, nothing trains or evaluates.
  monkeypatch.setattr(training, "train_many", lambda *a, **k: pytest.fail("trained again"))
  monkeypatch.setattr(ls, "evaluate_base", _read_only(ls.evaluate_base))
  _, again = pipeline()
  strip = lambda rs: [{k: v for k, v in r.items() if k != "records"} for r in rs]
  assert {k: strip(v) for k, v in again["runs"].items()} == {
      k: strip(v) for k, v in runs.items()}


def _read_only(evaluate_base):
  def read(config, workdir):
    assert os.path.exists(os.path.join(workdir, "summary.json")), "the base evaluated again"
    return evaluate_base(config, workdir)
  return read
