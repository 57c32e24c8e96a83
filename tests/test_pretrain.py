"""Pretrain, then federate: experiments.pretrain, config.init_from and the merged export.

The checkpoints are read back here with orbax directly (not through the reader under test),
and the LoRA model's outputs are compared with the plain model's on the merged parameters.
"""
import functools
import hashlib
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import pretrain_milton
from experiments import export as export_cli
from experiments import pretrain as pretrain_cli
from fedjax_lama import checkpointing, metrics, models
from fedjax_lama.config import base_config
from fedjax_lama.data import gutenberg
from fedjax_lama.engine import evaluate as evaluation
from fedjax_lama.engine.algorithm import ServerState
from fedjax_lama.errors import ConfigError, DataError, WorkdirError
from fedjax_lama.models import lora as lora_lib
from fedjax_lama.run import parts as parts_lib, pretrained, spec as spec_lib
from fedjax_lama.training import train_and_evaluate
from fedjax_lama.tree import leaf_dict
from tests import test_text_families as text_families

TINY_TF = {"width": 16, "depth": 1, "heads": 2, "max_len": 12, "vocab_size": 81}
LORA = {"rank": 2, "alpha": 4.0, "targets": "*"}


# ---- helpers ---------------------------------------------------------------------------------
def _digits_config(**changes):
  """A one-client run on the built-in digits with a BatchNorm MLP (seconds on a CPU)."""
  c = base_config()
  c.dataset, c.model = "digits", "mlp"
  c.model_options = ml_collections.ConfigDict({"hidden_sizes": (16,), "batch_norm": True})
  c.partition, c.num_clients, c.min_client_size = "iid", 1, 0
  c.rounds, c.local_steps, c.batch_size, c.local_lr = 2, 5, 16, 0.1
  c.eval_every, c.checkpoint_every, c.plots, c.per_client_eval = 1, 1, False, "never"
  for key, value in changes.items():
    c[key] = value
  return c


def _files(root) -> dict:
  """{relative path: sha256} of every file under root ({} if it does not exist)."""
  out = {}
  for folder, _, names in os.walk(root):
    for name in names:
      path = os.path.join(folder, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
  return out


def _read_server(workdir):
  """(step, server state) of a workdir's latest checkpoint, read with orbax directly."""
  step, state = text_families.final_state(workdir)
  return step, jax.tree.map(np.asarray, state["server"])


def _assert_same(a, b):
  """Same leaves under the same paths, bit for bit (values and dtypes)."""
  fa, fb = leaf_dict(a), leaf_dict(b)
  assert set(fa) == set(fb)
  for path in fa:
    x, y = np.asarray(fa[path]), np.asarray(fb[path])
    assert x.dtype == y.dtype and x.shape == y.shape, path
    assert np.array_equal(x.view(np.uint8), y.view(np.uint8)), path


def _tiny_lm(seed=0, lora=None, **changes):
  """(model, params, tokens) of a tiny transformer; one compiled init per model shape."""
  model, init, max_len = _built(None if lora is None else tuple(sorted(lora.items())),
                                tuple(sorted(changes.items())))
  x = jnp.asarray(np.random.default_rng(seed).integers(0, 81, (3, max_len)), jnp.int32)
  return model, init(jax.random.PRNGKey(seed), x)["params"], x


@functools.lru_cache(maxsize=None)
def _built(lora, changes):
  options = {**TINY_TF, **dict(changes)}
  model = models.get("transformer_lm", num_classes=81, lora=lora and dict(lora), **options)
  init = jax.jit(lambda key, x: model.init({"params": key, "dropout": key}, x, train=False))
  return model, init, options["max_len"]


def _trained_adapters(params, seed=0):
  """`params` with every B moved off zero, as training moves it."""
  rng = np.random.default_rng(seed)
  return jax.tree.map_with_path(
      lambda p, a: a + 0.05 * rng.standard_normal(a.shape).astype(a.dtype)
      if p[-1].key == "lora_b" else a, params)


def _write_run(workdir, params, model_options, model_state=None, step=3, **changes):
  """A workdir as a run writes it: config.json and one checkpoint of the server state."""
  os.makedirs(workdir)
  c = base_config()
  c.dataset, c.model = "milton", "transformer_lm"
  c.model_options = ml_collections.ConfigDict(model_options)
  for key, value in changes.items():
    c[key] = value
  metrics.write_json(os.path.join(workdir, "config.json"), spec_lib.config_json(c))
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"))
  ckpt.save(step, {"server": ServerState(params, model_state or {}, {}, {}), "rows": {}},
            {"round": step})
  ckpt.close()


def _one_line(err) -> str:
  message = str(err.value)
  assert "\n" not in message, message
  return message


# ---- init_from at the library level ------------------------------------------------------------
def test_initial_params_are_the_checkpoints_bit_for_bit(tmp_path):
  _, saved, _ = _tiny_lm(seed=1)
  _write_run(tmp_path / "pre", saved, TINY_TF)
  _, fresh, _ = _tiny_lm(seed=0)
  for path in (tmp_path / "pre", tmp_path / "pre" / "checkpoints" / "3"):
    loaded = pretrained.load(str(path))
    assert loaded.model == "transformer_lm"
    params, state = pretrained.initial_params(fresh, {}, loaded)
    _assert_same(params, saved)
    assert state == {}


def test_lora_model_takes_the_checkpoint_as_its_base(tmp_path):
  plain, saved, x = _tiny_lm(seed=1)
  _write_run(tmp_path / "pre", saved, TINY_TF)
  model, fresh, _ = _tiny_lm(seed=0, lora=LORA)
  params, _ = pretrained.initial_params(fresh, {}, pretrained.load(str(tmp_path / "pre")))
  _assert_same(lora_lib.base_of(params), saved)
  flat, fresh_flat = leaf_dict(params), leaf_dict(fresh)
  adapters = [p for p in flat if p[-1] in ("lora_a", "lora_b")]
  assert len(adapters) == 2 * 7  # query, key, value, out, mlp_in, mlp_out, Dense_0
  for path in adapters:  # fresh adapters: A as initialised, B = 0
    np.testing.assert_array_equal(flat[path], fresh_flat[path])
    if path[-1] == "lora_b":
      assert not np.any(flat[path])
  # B = 0: the LoRA model's first forward pass is the pretrained model's, bit for bit.
  np.testing.assert_array_equal(model.apply({"params": params}, x),
                                plain.apply({"params": saved}, x))


def test_a_lora_runs_whole_model_has_its_adapters_merged(tmp_path):
  _, params, _ = _tiny_lm(seed=1, lora=LORA)
  params = jax.tree.map(lambda a: a + 0.01, params)  # B != 0
  _write_run(tmp_path / "lora_run", params, {**TINY_TF, "lora": LORA})
  loaded = pretrained.whole(pretrained.load(str(tmp_path / "lora_run")))
  lora = lora_lib.LoRA.parse(LORA)
  a = params["block_0"]["mlp_in"]
  expected = np.asarray(a["kernel"]) + lora.scale * (np.asarray(a["lora_a"], np.float64)
                                                     @ np.asarray(a["lora_b"], np.float64))
  np.testing.assert_allclose(loaded.params["block_0"]["mlp_in"]["kernel"], expected,
                             rtol=1e-6, atol=1e-6)
  assert "lora_a" not in loaded.params["block_0"]["mlp_in"] and "lora" not in loaded.options


@pytest.mark.parametrize("changes, named", [
    ({"width": 32, "heads": 2}, "is float32[32, 81] there; the model expects float32[16, 81]"),
    ({"depth": 2}, "has the parameter 'block_1/attention/key/bias', which the model does not"),
])
def test_a_mismatch_stops_with_one_line_naming_the_parameter(tmp_path, changes, named):
  _, saved, _ = _tiny_lm(seed=1, **changes)
  _write_run(tmp_path / "pre", saved, {**TINY_TF, **changes})
  for lora in (None, LORA):
    _, fresh, _ = _tiny_lm(seed=0, lora=lora)
    with pytest.raises(ConfigError) as err:
      pretrained.initial_params(fresh, {}, pretrained.load(str(tmp_path / "pre")))
    message = _one_line(err)
    assert message.startswith(f"config.init_from={tmp_path / 'pre' / 'checkpoints' / '3'}")
    assert named in message and "'width': " in message


def test_the_model_missing_a_parameter_is_named(tmp_path):
  _, saved, _ = _tiny_lm(seed=1)
  _write_run(tmp_path / "pre", saved, TINY_TF)
  _, fresh, _ = _tiny_lm(seed=0, depth=2)
  with pytest.raises(ConfigError) as err:
    pretrained.initial_params(fresh, {}, pretrained.load(str(tmp_path / "pre")))
  assert "has no parameter 'block_1/attention/key/bias', which the model has" in _one_line(err)


def test_paths_that_hold_no_checkpoint_are_refused(tmp_path):
  (tmp_path / "empty").mkdir()
  (tmp_path / "stray.msgpack").write_bytes(b"not msgpack")
  for path, expected in ((tmp_path / "missing", ConfigError), (tmp_path / "empty", ConfigError),
                         (tmp_path / "stray.msgpack", DataError)):
    with pytest.raises(expected) as err:
      pretrained.load(str(path))
    assert str(path) in _one_line(err)


# ---- the merged export -----------------------------------------------------------------------
def test_merged_export_is_read_by_the_plain_model(tmp_path):
  lora = lora_lib.LoRA.parse(LORA)
  lora_model, params, x = _tiny_lm(seed=2, lora=LORA)
  params = _trained_adapters(params)
  info = {"model": "transformer_lm", "num_classes": 81, "options": TINY_TF,
          "input_shape": [TINY_TF["max_len"]], "input_dtype": "int32"}
  out = str(tmp_path / "merged.msgpack")
  pretrained.write_export(out, pretrained.export_variables(params, {}, lora), info)
  model, variables, _ = pretrained.read_export(out)
  assert model.dense.keywords["lora"] is None  # the zoo model without adapters
  np.testing.assert_allclose(model.apply(variables, x), lora_model.apply({"params": params}, x),
                             rtol=1e-5, atol=1e-5)
  # B = 0: the export is the base itself, and reads as the base model does.
  zero_b = jax.tree.map_with_path(
      lambda p, a: jnp.zeros_like(a) if p[-1].key == "lora_b" else a, params)
  out0 = str(tmp_path / "base.msgpack")
  pretrained.write_export(out0, pretrained.export_variables(zero_b, {}, lora), info)
  _, variables0, _ = pretrained.read_export(out0)
  _assert_same(variables0["params"], lora_lib.base_of(params))
  np.testing.assert_array_equal(model.apply(variables0, x),
                                lora_model.apply({"params": zero_b}, x))
  with pytest.raises(WorkdirError) as err:  # never overwritten unless asked
    pretrained.write_export(out0, pretrained.export_variables(params, {}, lora), info)
  assert "--overwrite" in _one_line(err)
  pretrained.write_export(out0, pretrained.export_variables(params, {}, lora), info,
                          overwrite=True)
  _, variables1, _ = pretrained.read_export(out0)
  _assert_same(variables1, variables)


# ---- pretrain, then federate (digits: seconds) --------------------------------------------------
@pytest.fixture(scope="module")
def digits_pretrained(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("pre") / "run")
  summary = pretrain_cli.pretrain(_digits_config(), workdir)
  return workdir, summary


def test_pretrain_refuses_more_than_one_client(tmp_path):
  for changes, field in (({"num_clients": 4}, "config.num_clients=4"),
                         ({"partition": "dirichlet"}, "config.partition='dirichlet'"),
                         ({"active_ratio": 0.5}, "config.active_ratio=0.5")):
    with pytest.raises(ConfigError) as err:
      pretrain_cli.pretrain(_digits_config(**changes), str(tmp_path / "w"))
    assert field in _one_line(err)
  assert not (tmp_path / "w").exists()


def test_federated_run_starts_from_the_pretrained_checkpoint(digits_pretrained, tmp_path):
  workdir, summary = digits_pretrained
  assert summary["rounds"] == 2
  step, server = _read_server(workdir)
  assert step == 1
  config = _digits_config(num_clients=4, partition="iid", init_from=workdir)
  parts = parts_lib.prepare(spec_lib.build_spec(config))
  _assert_same(parts.params, server["params"])
  _assert_same(parts.model_state, server["model_state"])  # BatchNorm statistics too
  # The same run from its export file, and the federated run itself.
  out = str(tmp_path / "digits.msgpack")
  info = export_cli.export(workdir, out)
  assert info["lora_merged"] is None and info["round"] == 2
  parts = parts_lib.prepare(spec_lib.build_spec(_digits_config(init_from=out)))
  _assert_same(parts.params, server["params"])
  fed = train_and_evaluate(config.copy_and_resolve_references(), str(tmp_path / "fed"))
  assert np.isfinite(fed["final_test_loss"])


def test_refused_start_loses_nothing(digits_pretrained, tmp_path):
  source, _ = digits_pretrained
  before_source = _files(source)
  target = tmp_path / "target"
  target.mkdir()
  (target / "notes.txt").write_text("keep me")
  before = _files(target)
  wider = _digits_config(init_from=source)
  wider.model_options.hidden_sizes = (32,)
  for workdir in (target, tmp_path / "new"):
    with pytest.raises(ConfigError) as err:
      train_and_evaluate(wider, str(workdir))
    assert "parameter 'BatchNorm_0/bias' is float32[16] there; the model expects float32[32]" in (
        _one_line(err))
  assert _files(target) == before and not (tmp_path / "new").exists()
  assert _files(source) == before_source


def test_export_of_a_run_refuses_to_overwrite(digits_pretrained, tmp_path):
  workdir, _ = digits_pretrained
  out = str(tmp_path / "model.msgpack")
  export_cli.export(workdir, out)
  first = _files(tmp_path)
  with pytest.raises(WorkdirError) as err:
    export_cli.export(workdir, out)
  assert "exists" in _one_line(err) and _files(tmp_path) == first
  model, variables, info = pretrained.read_export(out)
  assert info["options"] == {"hidden_sizes": [16], "batch_norm": True}
  _, server = _read_server(workdir)
  _assert_same(variables, {"params": server["params"], "batch_stats": server["model_state"]})
  export_cli.export(workdir, out, overwrite=True)
  with pytest.raises(WorkdirError):
    export_cli.export(str(tmp_path / "nowhere"), str(tmp_path / "x.msgpack"))


# ---- Milton (a small corpus written here): the transformer, pretrained then federated ------------
MILTON_TEXT = ("Of Mans First Disobedience, and the Fruit\nOf that Forbidden Tree, whose mortal "
               "tast\nBrought Death into the World, and all our woe,\nWith loss of Eden, till "
               "one greater Man\nRestore us, and regain the blissful Seat,\n") * 30


@pytest.fixture
def milton_dir(tmp_path, monkeypatch):
  folder = tmp_path / "data" / "shakespeare_gutenberg" / "milton"
  folder.mkdir(parents=True)
  raw = MILTON_TEXT.encode()
  (folder / "test_lost_gut.txt").write_bytes(raw)
  monkeypatch.setattr(gutenberg, "MILTON_FILES",
                      {"test_lost_gut.txt": hashlib.sha256(raw).hexdigest()})
  return str(tmp_path / "data")


@pytest.mark.slow
def test_pretrain_milton_lowers_the_loss_then_federates(milton_dir, tmp_path):
  config = pretrain_milton.get_config("tiny")
  config.data_dir = milton_dir
  workdir = str(tmp_path / "milton")
  spec = spec_lib.build_spec(config)
  parts = parts_lib.prepare(spec)
  eval_fn = evaluation.make_eval_fn(parts.model, False)
  ds = parts.fed.dataset
  untrained = evaluation.evaluate(eval_fn, parts.params, {}, ds.test_x, ds.test_y, 256).loss
  summary = pretrain_cli.pretrain(config, workdir)
  assert summary["final_test_loss"] < 0.8 * untrained
  assert summary["final_test_bits_per_token"] == pytest.approx(
      summary["final_test_loss"] / np.log(2))
  _, server = _read_server(workdir)  # the checkpoint holds the final model
  again = evaluation.evaluate(eval_fn, server["params"], {}, ds.test_x, ds.test_y, 256).loss
  assert again == pytest.approx(summary["final_test_loss"], rel=1e-5)
  # A federated run of the same transformer over two clients starts from it, bit for bit.
  fed = pretrain_milton.get_config("tiny")
  fed.data_dir, fed.num_clients, fed.rounds, fed.init_from = milton_dir, 2, 1, workdir
  fed_parts = parts_lib.prepare(spec_lib.build_spec(fed))
  _assert_same(fed_parts.params, server["params"])
  result = train_and_evaluate(fed, str(tmp_path / "fed"))
  assert np.isfinite(result["final_test_loss"])


def test_export_of_a_lora_run_is_merged(milton_dir, tmp_path):
  """experiments.export on a LoRA run's workdir (its layout written here as a run writes
  it): the file is the merged model, which the plain transformer reads."""
  lora_model, params, x = _tiny_lm(seed=3, lora=LORA)
  params = _trained_adapters(params, seed=1)
  _write_run(str(tmp_path / "run"), params, {**TINY_TF, "lora": LORA}, data_dir=milton_dir,
             partition="iid",
             dataset_options=ml_collections.ConfigDict({"seq_len": 12, "stride": 12}))
  out = str(tmp_path / "merged.msgpack")
  info = export_cli.export(str(tmp_path / "run"), out)
  assert info["lora_merged"]["rank"] == 2 and info["round"] == 4
  model, variables, info = pretrained.read_export(out)
  assert info["options"] == TINY_TF and model.dense.keywords["lora"] is None
  np.testing.assert_allclose(jax.jit(model.apply)(variables, x),
                             jax.jit(lora_model.apply)({"params": params}, x),
                             rtol=1e-5, atol=1e-5)


def test_export_of_a_lora_run_trained_by_the_engine(milton_dir, tmp_path):
  """A LoRA run's checkpoint holds its trainable set only (the adapters); the export derives
  the frozen base again from the run's config and merges: the plain model reading the file
  computes the LoRA model with the run's initial base and the checkpoint's adapters."""
  config = pretrain_milton.get_config("tiny")
  config.data_dir, config.num_clients, config.rounds = milton_dir, 2, 1
  config.model_options.lora = LORA
  workdir = str(tmp_path / "lora_run")
  train_and_evaluate(config, workdir)
  _, server = _read_server(workdir)
  assert {p[-1] for p in leaf_dict(server["params"])} <= {"lora_a", "lora_b"}
  start = parts_lib.prepare(spec_lib.build_spec(config))
  part = lora_lib.trainable_set(start.params, "lora")
  trained = part.merge(server["params"], part.split(start.params)[1])
  out = str(tmp_path / "merged.msgpack")
  info = export_cli.export(workdir, out)
  assert info["lora_merged"]["rank"] == LORA["rank"]
  model, variables, _ = pretrained.read_export(out)
  x = jnp.asarray(np.asarray(start.fed.dataset.test_x[:4]), jnp.int32)
  np.testing.assert_allclose(jax.jit(model.apply)(variables, x),
                             jax.jit(start.model.apply)({"params": trained}, x),
                             rtol=1e-5, atol=1e-5)
  # The base is derived again from the run's config.json: one that derives another base (a
  # changed seed) is refused with one line naming the checkpoint, and nothing is written.
  path = os.path.join(workdir, "config.json")
  with open(path) as f:
    given = json.load(f)
  with open(path, "w") as f:
    json.dump({**given, "seed": given["seed"] + 1}, f)
  with pytest.raises(DataError) as err:
    export_cli.export(workdir, str(tmp_path / "again.msgpack"))
  assert "are not the ones it trained on" in _one_line(err)
  assert not os.path.exists(str(tmp_path / "again.msgpack"))
