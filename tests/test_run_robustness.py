"""Things a new user runs into: schedules in epoch mode, cut-short metrics files, options of
another model, unsupported combinations (issue 15, item 5)."""
import json
import os

import numpy as np
import pytest

from fedjax_lama import config as config_lib
from fedjax_lama import training
from fedjax_lama.programs.round_program import LrSchedule
from tests.test_training import _metrics, tiny_config


@pytest.mark.parametrize("steps_per_round", [3, 7])
def test_exponential_schedule_decays_once_per_round(steps_per_round):
  """Round r (steps [r S, (r + 1) S)) runs at lr * factor^r whatever S is, also in epoch
  mode, where S is E epochs of the largest client, not config.local_steps."""
  schedule = LrSchedule(0.1, "exponential", decay_factor=0.5).build(100, steps_per_round)
  for r in range(4):
    for s in range(steps_per_round):
      assert float(schedule(r * steps_per_round + s)) == pytest.approx(0.1 * 0.5 ** r)


def test_exponential_schedule_in_epoch_mode_end_to_end(tmp_path):
  """Epoch mode with local_steps left at 10 and rounds of a different length: the rate of
  each round follows the round index (the old code decayed every config.local_steps)."""
  c = tiny_config(local_epochs=1, local_steps=10, local_lr_schedule="exponential",
                  local_lr_decay_factor=0.5, rounds=3)
  program = training.build_program(c, *_model_and_fed(c))
  assert program.num_steps != 10
  schedule = c.local_lr * 0.5 ** np.arange(3)
  rates = [float(program.opts.lr.build(3 * program.num_steps, program.num_steps)(
      r * program.num_steps)) for r in range(3)]
  np.testing.assert_allclose(rates, schedule, rtol=1e-6)


def _model_and_fed(c):
  from fedjax_lama import data as fdata, federation  # pylint: disable=g-import-not-at-top
  from fedjax_lama.engine import sharding  # pylint: disable=g-import-not-at-top
  dataset = training._load_dataset(c, "")  # pylint: disable=protected-access
  fed = federation.build_federation(training.partition_spec(c), dataset)
  model, params, model_state = training._build_model(c, dataset)  # pylint: disable=protected-access
  del fdata
  return model, params, model_state, fed, sharding.client_mesh()


def test_half_written_metrics_line_does_not_stop_the_resume(tmp_path):
  """A kill during a long append leaves a last line cut short: the records before it
  survive and the run resumes to the same metrics as an uninterrupted one."""
  full = tiny_config(checkpoint_every=1)
  training.train_and_evaluate(full, str(tmp_path / "full"))
  work = tmp_path / "cut"
  training.train_and_evaluate(full, str(work), stop_after_round=1)
  path = work / "metrics.jsonl"
  before = path.read_text()
  assert before.endswith("\n") and len(before.splitlines()) == 1
  path.write_text(before + '{"round": 4, "test_accur')  # the cut-short append
  training.train_and_evaluate(full, str(work))
  assert _metrics(work) == _metrics(tmp_path / "full")


def test_corrupt_metrics_line_in_the_middle_stops_with_its_file_and_line(tmp_path):
  c = tiny_config(checkpoint_every=1)
  training.train_and_evaluate(c, str(tmp_path), stop_after_round=2)
  path = tmp_path / "metrics.jsonl"
  lines = path.read_text().splitlines()
  path.write_text("not json\n" + "\n".join(lines) + "\n")
  with pytest.raises(training.TrainingError, match="metrics.jsonl line 1"):
    training.train_and_evaluate(c, str(tmp_path))
  assert path.read_text().startswith("not json\n")  # nothing in the workdir was lost


def test_options_of_another_model_name_config_model_options(tmp_path):
  c = tiny_config(model="resnet20")  # configs/default.py sets hidden_sizes for its MLP
  with pytest.raises(config_lib.ConfigError, match=r"config\.model_options.*resnet20"):
    training.train_and_evaluate(c, str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()
  with pytest.raises(config_lib.ConfigError, match=r"config\.model='resnet2'.*accepted"):
    training.train_and_evaluate(tiny_config(model="resnet2"), str(tmp_path / "w"))


def test_bernoulli_sampling_with_fedlama_is_refused_naming_the_field(tmp_path):
  from configs import fedlama_digits  # pylint: disable=g-import-not-at-top
  c = fedlama_digits.get_config()
  c.client_sampling = "bernoulli"
  c.active_ratio = 0.5
  with pytest.raises(config_lib.ConfigError, match=r"config\.client_sampling='bernoulli'.*fixed"):
    training.train_and_evaluate(c, str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()


def test_validation_split_is_held_out_of_training_and_reported(tmp_path):
  c = tiny_config(validation_fraction=0.2)
  summary = training.train_and_evaluate(c, str(tmp_path))
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert all("val_accuracy" in r and "test_accuracy" in r for r in rows)
  assert summary["best_val_accuracy"] == max(r["val_accuracy"] for r in rows)
  from fedjax_lama import data as fdata  # pylint: disable=g-import-not-at-top
  dataset = training._load_dataset(c, "")  # pylint: disable=protected-access
  trimmed, val = fdata.split_validation(dataset, 0.2, c.seed)
  assert len(val.y) == round(0.2 * len(dataset.train_y))
  assert len(trimmed.train_y) + len(val.y) == len(dataset.train_y)
  # No validation example is a training example (rows of the original split).
  rows_of = lambda x: {a.tobytes() for a in np.asarray(x).reshape(len(x), -1)}
  assert not rows_of(trimmed.train_x) & rows_of(val.x)


def test_tensorboard_events_are_written_beside_metrics(tmp_path):
  c = tiny_config(tensorboard=True)
  training.train_and_evaluate(c, str(tmp_path))
  events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
  assert events and all(e.stat().st_size > 0 for e in events)
  from tests.test_tensorboard import scalars_by_tag  # pylint: disable=g-import-not-at-top
  scalars = scalars_by_tag(tmp_path / "tensorboard")
  steps = [r["local_steps"] for r in map(json.loads,
                                         (tmp_path / "metrics.jsonl").read_text().splitlines())]
  assert [step for step, _ in scalars["test_accuracy"]] == steps
