"""End-to-end runs on tiny configs: outputs, determinism, exact resume, bad input."""
import json
import os

import numpy as np
import pytest

from configs import default
from fedjax_lama import training
from fedjax_lama.config import ConfigError


def tiny_config(**overrides):
  c = default.get_config()
  c.rounds = 4
  c.local_steps = 3
  c.num_clients = 8
  c.eval_every = 2
  c.checkpoint_every = 2
  c.plots = False
  c.update_from_flattened_dict(overrides)
  return c


def _metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  for r in rows:
    r.pop("wall_seconds")
  return rows


def test_run_writes_the_contract(tmp_path):
  c = tiny_config(plots=True)
  summary = training.train_and_evaluate(c, str(tmp_path))
  for name in ("config.json", "metrics.jsonl", "summary.json", "accuracy_vs_round.png",
               "accuracy_vs_comm.png"):
    assert (tmp_path / name).exists(), name
  rows = _metrics(tmp_path)
  assert [r["round"] for r in rows] == [2, 4]
  for key in ("local_steps", "test_accuracy", "test_loss", "train_loss", "comm_floats_up",
              "comm_floats_down", "comm_bytes"):
    assert key in rows[-1]
  for key in ("final_test_accuracy", "best_test_accuracy", "rounds", "local_steps",
              "comm_floats_up", "comm_floats_down", "comm_bytes", "wall_seconds",
              "client_train_accuracy_mean", "client_train_accuracy_var"):
    assert key in summary, key
  assert summary["local_steps"] == 12
  # FedAvg: every participant sends and receives the whole model once per round.
  assert summary["comm_floats_up"] == 4 * 8 * summary["num_parameters"]
  assert summary["comm_bytes"] == 4 * (summary["comm_floats_up"] + summary["comm_floats_down"])


@pytest.mark.slow
def test_same_seed_same_metrics(tmp_path):
  training.train_and_evaluate(tiny_config(), str(tmp_path / "a"))
  training.train_and_evaluate(tiny_config(), str(tmp_path / "b"))
  assert _metrics(tmp_path / "a") == _metrics(tmp_path / "b")
  different = tiny_config(seed=1)
  training.train_and_evaluate(different, str(tmp_path / "c"))
  assert _metrics(tmp_path / "a") != _metrics(tmp_path / "c")


@pytest.mark.parametrize("overrides", [{}, {"local_momentum": 0.9, "client_sampling": "bernoulli",
                                            "active_ratio": 0.5}])
def test_interrupted_run_resumes_exactly(tmp_path, overrides):
  c = tiny_config(rounds=6, checkpoint_every=2, **overrides)
  full = training.train_and_evaluate(c, str(tmp_path / "full"))
  out = training.train_and_evaluate(c, str(tmp_path / "cut"), stop_after_round=2)
  assert out == {"interrupted_after_round": 2}
  # Round 3 ran but was not checkpointed: it is redone, and its metrics line rewritten once.
  resumed = training.train_and_evaluate(c, str(tmp_path / "cut"))
  assert _metrics(tmp_path / "full") == _metrics(tmp_path / "cut")
  for key in ("final_test_accuracy", "comm_floats_up", "comm_bytes", "local_steps"):
    assert full[key] == resumed[key]


def test_resume_with_a_different_config_is_refused(tmp_path):
  training.train_and_evaluate(tiny_config(), str(tmp_path))
  before = (tmp_path / "metrics.jsonl").read_text()
  with pytest.raises(ConfigError, match="local_lr"):
    training.train_and_evaluate(tiny_config(local_lr=0.5), str(tmp_path))
  assert (tmp_path / "metrics.jsonl").read_text() == before


@pytest.mark.parametrize("field,value,match", [
    ("algorithm", "fedfoo", "config.algorithm='fedfoo'.*fedavg"),
    ("dataset", "imagenet", "config.dataset"),
    ("model", "transformer", "transformer"),
    ("partition", "zipf", "config.partition"),
    ("rounds", 0, "config.rounds"),
    ("local_steps", -1, "config.local_steps"),
    ("batch_size", 0, "config.batch_size"),
    ("num_clients", 0, "config.num_clients"),
    ("active_ratio", 0.0, "config.active_ratio.*\\(0, 1\\]"),
    ("active_ratio", 1.5, "config.active_ratio"),
    ("dirichlet_concentration", 0.0, "config.dirichlet_concentration"),
])
def test_bad_config_names_the_field(tmp_path, field, value, match):
  (tmp_path / "keep.txt").write_text("precious")
  with pytest.raises(ValueError, match=match):
    training.train_and_evaluate(tiny_config(**{field: value}), str(tmp_path))
  assert (tmp_path / "keep.txt").read_text() == "precious"
  assert not (tmp_path / "config.json").exists()


def test_too_many_classes_per_client(tmp_path):
  with pytest.raises(ConfigError, match="config.classes_per_client.*10"):
    training.train_and_evaluate(tiny_config(partition="shards", classes_per_client=11),
                                str(tmp_path))


def test_nan_loss_stops_with_a_message_and_keeps_the_checkpoint(tmp_path):
  c = tiny_config(rounds=6, local_lr=1e30)
  with pytest.raises(training.TrainingError, match="non-finite.*config.local_lr"):
    training.train_and_evaluate(c, str(tmp_path))
  assert (tmp_path / "config.json").exists()
