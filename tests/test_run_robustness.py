"""Things a new user runs into: schedules in epoch mode, cut-short metrics files, options of
another model, unsupported combinations."""
import json
import pathlib
import os

import numpy as np
import pytest

from fedjax_lama import config as config_lib
from fedjax_lama import training
from fedjax_lama.run import parts as parts_lib, workdir as workdir_lib
from fedjax_lama.programs.round_program import LearningRate
from tests.test_training import _metrics, tiny_config


@pytest.mark.parametrize("steps_per_round", [3, 7])
def test_exponential_decay_once_per_round(steps_per_round):
  """Round r (steps [r S, (r + 1) S)) runs at lr * factor^r whatever S is, also in epoch
  mode, where S is E epochs of the largest client, not config.local_steps."""
  learning_rate = LearningRate(0.1, "exponential", decay_factor=0.5).build(100, steps_per_round)
  for r in range(4):
    for s in range(steps_per_round):
      assert float(learning_rate(r * steps_per_round + s)) == pytest.approx(0.1 * 0.5 ** r)


def test_exponential_decay_in_epoch_mode_end_to_end(tmp_path):
  """Epoch mode with local_steps left at 10 and rounds of a different length: the rate of
  each round follows the round index (the old code decayed every config.local_steps)."""
  c = tiny_config(local_epochs=1, local_steps=10, local_lr_decay="exponential",
                  local_lr_decay_factor=0.5, rounds=3)
  program = training.build_program(c, *_model_and_fed(c))
  assert program.num_steps != 10
  expected = c.local_lr * 0.5 ** np.arange(3)
  rates = [float(program.opts.learning_rate.build(3 * program.num_steps, program.num_steps)(
      r * program.num_steps)) for r in range(3)]
  np.testing.assert_allclose(rates, expected, rtol=1e-6)


def _model_and_fed(c):
  from fedjax_lama import data as fdata, federation  # pylint: disable=g-import-not-at-top
  from fedjax_lama.engine import sharding  # pylint: disable=g-import-not-at-top
  dataset = training.load_dataset(c, "")
  fed = federation.build_federation(training.partition_spec(c), dataset)
  model, params, model_state = training.build_model(c, dataset)
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
  dataset = training.load_dataset(c, "")
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


# ---- workdirs, checkpoints, extension, strict configs, API boundary (issue 45, items 4-7) ---


def _tree_files(folder: pathlib.Path) -> dict:
  return {str(p.relative_to(folder)): p.read_bytes()
          for p in sorted(folder.rglob("*")) if p.is_file()}


def _final_params(workdir: pathlib.Path):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  step = max(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  return ocp.PyTreeCheckpointer().restore(str(workdir / "checkpoints" / str(step) / "state"))


def test_extended_run_equals_an_uninterrupted_run_and_flipped_bytes_are_caught(tmp_path):
  """4 rounds, then --config.rounds=6 on the same workdir: metrics, summary (wall time
  aside) and final parameters equal those of one 6-round run. The final per-client
  evaluation of round 4 (per_client_eval="final") is no longer the last one."""
  import jax  # pylint: disable=g-import-not-at-top
  four, six = tiny_config(rounds=4), tiny_config(rounds=6)
  assert four.per_client_eval == "final" and four.eval_every == 2
  short = training.train_and_evaluate(four, str(tmp_path / "extended"))
  assert any(k.startswith("client_") for k in short)
  extended = training.train_and_evaluate(six, str(tmp_path / "extended"))
  full = training.train_and_evaluate(six, str(tmp_path / "full"))
  assert _metrics(tmp_path / "extended") == _metrics(tmp_path / "full")
  rows = _metrics(tmp_path / "full")
  assert [r["round"] for r in rows] == [2, 4, 6]
  assert not any(k.startswith("client_") for k in rows[1])
  drop_wall = lambda s: {k: v for k, v in s.items() if k != "wall_seconds"}
  assert drop_wall(extended) == drop_wall(full)
  on_disk = json.loads((tmp_path / "extended" / "summary.json").read_text())
  assert drop_wall(on_disk) == drop_wall(json.loads((tmp_path / "full" / "summary.json").read_text()))
  a, b = _final_params(tmp_path / "extended"), _final_params(tmp_path / "full")
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

  # Flipped bytes in the latest checkpoint: the next run names the file, changes nothing.
  work = tmp_path / "extended"
  step_dir = max((p for p in (work / "checkpoints").iterdir() if p.name.isdigit()),
                 key=lambda p: int(p.name))
  victim = max((p for p in (step_dir / "state").rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_size)
  data = bytearray(victim.read_bytes())
  data[len(data) // 2] ^= 0xFF
  victim.write_bytes(bytes(data))
  before = _tree_files(work)
  with pytest.raises(training.TrainingError, match=str(victim.relative_to(work))):
    training.train_and_evaluate(tiny_config(rounds=8), str(work))
  assert _tree_files(work) == before


def test_extension_that_cannot_be_exact_is_refused_before_data(tmp_path):
  """What depends on the total number of rounds makes an extension differ from a longer
  run: a final evaluation off the evaluation cadence, a cosine decay of the learning rate. Only config.json
  is needed to refuse, so nothing is loaded or written."""
  cases = [(tiny_config(rounds=3, eval_every=2), "config.eval_every"),
           (tiny_config(rounds=4, local_lr_decay="cosine"), "cosine")]
  for i, (old, name) in enumerate(cases):
    work = tmp_path / str(i)
    work.mkdir()
    (work / "config.json").write_text(json.dumps(training.config_json(old)))
    before = _tree_files(work)
    longer = copy_config(old, rounds=old.rounds + 2)
    with pytest.raises(config_lib.ConfigError, match=name):
      training.train_and_evaluate(longer, str(work))
    assert _tree_files(work) == before
    shorter = copy_config(old, rounds=old.rounds - 1)  # never an extension
    with pytest.raises(config_lib.ConfigError, match=r"fields: rounds"):
      training.train_and_evaluate(shorter, str(work))


def copy_config(c, **overrides):
  c = c.copy_and_resolve_references()
  c.update_from_flattened_dict(overrides)
  return c


def test_workdir_on_a_full_filesystem_is_refused_before_data(tmp_path, monkeypatch):
  import collections  # pylint: disable=g-import-not-at-top
  usage = collections.namedtuple("usage", "total used free")
  monkeypatch.setattr(workdir_lib.shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 0))
  loaded = []
  monkeypatch.setattr(parts_lib, "prepare", lambda c: loaded.append(c))
  with pytest.raises(training.WorkdirError, match=f"{tmp_path / 'w'}.*full"):
    training.train_and_evaluate(tiny_config(), str(tmp_path / "w"))
  assert not loaded and not (tmp_path / "w").exists()


@pytest.mark.parametrize("workdir", ["", "afile", "afile/run"])
def test_workdir_that_is_not_a_directory_is_refused_before_data(tmp_path, monkeypatch, workdir):
  (tmp_path / "afile").write_text("mine\n")
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(parts_lib, "prepare", lambda c: pytest.fail("data loaded"))
  with pytest.raises(training.WorkdirError, match="empty" if not workdir else "afile"):
    training.train_and_evaluate(tiny_config(), workdir)
  assert (tmp_path / "afile").read_text() == "mine\n"


def test_unknown_fields_anywhere_name_the_closest_accepted(tmp_path):
  c = tiny_config()
  c.roundz = 5
  with pytest.raises(config_lib.ConfigError, match=r"config\.roundz is not a field; closest "
                     r"accepted: rounds"):
    training.train_and_evaluate(c, str(tmp_path / "w"))
  c = tiny_config()
  c.engine.unrol = 2
  with pytest.raises(config_lib.ConfigError, match=r"config\.engine\.unrol .*unroll"):
    config_lib.validate(c)
  c = tiny_config(dataset="sentiment140")
  c.dataset_options.vocab_sise = 10
  with pytest.raises(config_lib.ConfigError, match=r"config\.dataset_options\.vocab_sise .*"
                     r"config\.dataset='sentiment140'.*vocab_size"):
    config_lib.validate(c)
  assert not (tmp_path / "w").exists()


def test_fields_set_on_the_command_line_must_be_read_by_the_run():
  """One declared set of fields per mode and per algorithm: a config file may set every
  method's section (a study's config), a command line only what the chosen run reads."""
  study = tiny_config()
  study.fedprox.mu = 0.5  # a study's config sets the sections of the methods it compares
  study.fedlama.phi = 4
  config_lib.validate(study)
  config_lib.check_overrides(study, ["rounds", "local_lr", "seed"])
  refused = [("fedavg", "fedprox.mu", "config.algorithm='fedavg'"),
             ("fedasync", "fedlama.phi", "FedLAMA schedule"),
             ("fedat", "rounds", "synchronous rounds"),
             ("fedat", "client_sampling", "config.algorithm='fedat'"),
             ("fedavg", "system.local_optimizer", "simulated clock"),
             ("scaffold", "fedat", "config.algorithm=.scaffold.")]
  for algorithm, path, named in refused:
    c = tiny_config(algorithm=algorithm)
    with pytest.raises(config_lib.ConfigError, match=rf"config\.{path}\b.*{named}"):
      config_lib.check_overrides(c, [path])
  accepted = [("fedprox", "fedprox.mu"), ("fedat", "fedat"), ("fedat", "system.clock"),
              ("fedavg", "rounds")]
  for algorithm, path in accepted:
    config_lib.check_overrides(tiny_config(algorithm=algorithm), [path])
  config_lib.check_overrides(tiny_config(schedule="fedlama"), ["fedlama.phi"])
  clock_fedprox = tiny_config(algorithm="fedprox")
  clock_fedprox.system.clock = True
  config_lib.check_overrides(clock_fedprox, ["fedprox.mu", "active_ratio", "system.polyline_mode"])


def test_api_boundary_checks_name_the_argument():
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fedjax_lama import algorithms  # pylint: disable=g-import-not-at-top
  from fedjax_lama.algorithms import Common  # pylint: disable=g-import-not-at-top
  from fedjax_lama.fedlama.layer_sync import layer_masked_mean  # pylint: disable=g-import-not-at-top
  from fedjax_lama.fedlama.selection import select_intervals  # pylint: disable=g-import-not-at-top
  with pytest.raises(config_lib.ConfigError, match="ConfigDict.*dict"):
    training.train_and_evaluate(tiny_config().to_dict(), "/nonexistent/never_made")
  incomplete = tiny_config()
  del incomplete["rounds"]
  with pytest.raises(config_lib.ConfigError, match=r"config\.rounds is missing"):
    training.train_and_evaluate(incomplete, "/nonexistent/never_made")
  sizes = np.array([3, 5], np.int32)
  for bad, named in (([np.nan, 1.0], "nan"), ([-1.0, 1.0], "-1"), ([], "empty")):
    with pytest.raises(ValueError, match=f"discrepancy.*{named}|discrepancy is {named}"):
      select_intervals(np.array(bad, np.float32), sizes[:len(bad)], 2)
  stacked = {"w": jnp.ones((2, 3))}
  with pytest.raises(ValueError, match="weights sum to 0"):
    layer_masked_mean(stacked, np.zeros(2), np.array([True]), np.array([1]),
                      np.zeros(1, np.float32), {"w": jnp.zeros(3)}, np.array([0]))
  with pytest.raises(ValueError, match=r"server_lr=-1"):
    algorithms.build("fedavg", Common(server_lr=-1.0))
  with pytest.raises(ValueError, match="'fedlama' is an aggregation schedule"):
    algorithms.build("fedlama")
  with pytest.raises(ValueError, match="mu_typo"):
    algorithms.build("fedprox", mu_typo=0.1)


def test_one_data_dir_default_and_a_missing_data_error_that_says_only_what_to_do(
    tmp_path, monkeypatch):
  from fedjax_lama import data as fdata  # pylint: disable=g-import-not-at-top
  monkeypatch.delenv("FEDJAX_LAMA_DATA_DIR", raising=False)
  assert fdata.resolve_data_dir(None) == fdata.resolve_data_dir("") == "data"
  monkeypatch.setenv("FEDJAX_LAMA_DATA_DIR", str(tmp_path / "env"))
  assert fdata.resolve_data_dir("") == str(tmp_path / "env")
  assert fdata.resolve_data_dir("given") == "given"
  from experiments import reproduce  # pylint: disable=g-import-not-at-top
  assert "shared" not in pathlib.Path(reproduce.__file__).read_text().split(
      "def set_default_data_dir")[1].split("\ndef ")[0]
  with pytest.raises(fdata.DataError) as info:
    fdata.load_dataset("mnist", str(tmp_path / "nodata"))  # auto: files, then tfds
  message = str(info.value)
  assert "\n" not in message and str(tmp_path / "nodata") in message
  assert "train-images-idx3-ubyte.gz" in message and "BUILD.md" in message
  assert "prepared" not in message and "Underlying" not in message  # tfds's own words


def test_a_checkpoint_that_cannot_be_written_names_its_directory(tmp_path, monkeypatch):
  """A disk that fills during the run: orbax's OSError becomes one WorkdirError."""
  import errno  # pylint: disable=g-import-not-at-top
  from fedjax_lama import checkpointing  # pylint: disable=g-import-not-at-top
  ckpt = checkpointing.Checkpointer(str(tmp_path / "checkpoints"))
  state = {"w": np.arange(4, dtype=np.float32)}
  ckpt.save(0, state, {"round": 0})
  def full(*args, **kwargs):
    raise RuntimeError("orbax wraps it") from OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(ckpt._manager, "save", full)  # pylint: disable=protected-access
  with pytest.raises(training.WorkdirError, match=f"{tmp_path / 'checkpoints' / '1'}.*No space"):
    ckpt.save(1, state, {"round": 1})
  restored, meta = ckpt.restore(0, state)  # the checkpoint before it is intact
  np.testing.assert_array_equal(restored["w"], state["w"])
  assert meta == {"round": 0}
  ckpt.close()
