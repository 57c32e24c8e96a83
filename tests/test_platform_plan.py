"""The run options carry the engine's platform plan down to every round: the training entry
point builds it once from config.engine (kernels, client_map), and each program, the
FedLAMA window and the simulated clock's trainer add the client axis and compile local
training as that plan says, not as a module global or the environment says."""
import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fedjax_lama import config as config_lib
from fedjax_lama import data as fdata
from fedjax_lama import models, training
from fedjax_lama.engine import local, plan as plan_lib, sharding
from fedjax_lama.errors import ConfigError
from fedjax_lama.programs.sync import SyncProgram
from tests import test_fedat_engine as clock_helpers
from tests import test_sharding as helpers

MESH = sharding.client_mesh(jax.devices()[:1])
UNKNOWN = "xla_fedjax_lama_probe_option"


@pytest.fixture
def recorded(monkeypatch):
  """The client maps `local.vmap_clients` and the plans `local.jit_training` were given."""
  seen = {"client_map": [], "plan": []}
  vmap_clients, jit_training = local.vmap_clients, local.jit_training

  def recording_vmap(*args, client_map=None, **kwargs):
    seen["client_map"].append(client_map)
    return vmap_clients(*args, client_map=client_map, **kwargs)

  def recording_jit(fn, plan=None, **kwargs):
    seen["plan"].append(plan)
    return jit_training(fn, plan=plan, **kwargs)

  monkeypatch.setattr(local, "vmap_clients", recording_vmap)
  monkeypatch.setattr(local, "jit_training", recording_jit)
  return seen


def test_the_plan_is_built_once_from_config_engine():
  plan = training.platform_plan(helpers.tiny_config(**{"engine.client_map": "vmap",
                                                       "engine.kernels": "lax"}))
  assert (plan.platform, plan.client_map, plan.kernels) == (jax.default_backend(), "vmap", "lax")
  # The model's layers take the plan's kernel set.
  config = helpers.tiny_config(model="mnist_cnn", **{"engine.kernels": "lax"})
  dataset = fdata.load_dataset("digits", data_dir="")
  options = training.model_options(config, dataset)
  assert options["kernels"] == "lax"
  default = training.platform_plan(helpers.tiny_config())
  assert default == plan_lib.plan(client_map="auto")
  # Resolved at build time: "auto" is the platform's map, never "auto" itself.
  assert default.client_map == ("scan" if jax.default_backend() == "cpu" else "vmap")


def test_config_rejects_an_unknown_client_map_naming_the_field():
  c = helpers.tiny_config(**{"engine.client_map": "loop"})
  with pytest.raises(ConfigError, match=r"engine\.client_map.*'loop'.*'auto', 'vmap', 'scan'"):
    config_lib.validate(c)


@pytest.mark.parametrize("algorithm", ["fedavg", "fedlama"])
@pytest.mark.parametrize("client_map", ["vmap", "scan"])
def test_config_client_map_reaches_the_round(recorded, algorithm, client_map):
  # The config's choice, carried by the run options, reaches every round.
  program = helpers.build(helpers.tiny_config(algorithm=algorithm,
                                              **{"engine.client_map": client_map}), MESH)
  assert recorded["client_map"] and set(recorded["client_map"]) == {client_map}
  assert recorded["plan"] and all(p == program.opts.platform for p in recorded["plan"])
  assert program.opts.platform.client_map == client_map


def _one_round(plan):
  config = helpers.tiny_config()
  fed = helpers.tiny_federation()
  model = helpers.TinyMLP()
  params = model.init(jax.random.PRNGKey(config.seed), fed.dataset.train_x[:1])["params"]
  opts = dataclasses.replace(training.run_options(config, fed), platform=plan)
  program = SyncProgram(opts, training.build_algorithm(config, fed.num_clients, 1.0),
                        model, params, {}, fed, MESH)
  state, _ = program.run_round(program.init_state(), 0)
  return [np.asarray(sharding.to_host(x)) for x in jax.tree.leaves(
      program.eval_params(state))]


def test_vmap_and_scan_plans_train_the_same_round(recorded, monkeypatch):
  """A scan plan of one client per group (scan_group_bytes 0) against a vmap plan: the same
  round to float32 rounding, and the scan really ran groups of one client."""
  widths = []
  scan_group = local.scan_group

  def recording_group(*args, **kwargs):
    widths.append(scan_group(*args, **kwargs))
    return widths[-1]

  monkeypatch.setattr(local, "scan_group", recording_group)
  base = plan_lib.plan()
  by_vmap = _one_round(dataclasses.replace(base, client_map="vmap"))
  assert not widths  # the vmap map never groups
  by_scan = _one_round(dataclasses.replace(base, client_map="scan", scan_group_bytes=0))
  assert widths and set(widths) == {1}
  assert recorded["client_map"] == ["vmap", "scan"]
  for a, b in zip(by_vmap, by_scan, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _bad_plan():
  return dataclasses.replace(plan_lib.plan(), compiler_options=((UNKNOWN, True),))


def test_the_run_options_plan_compiler_options_reach_the_compiler():
  """An option XLA does not know, in the RunOptions' plan only (the module's options
  untouched), stops the round with XLA's own error: the round compiled with the plan."""
  with pytest.raises(Exception, match=f"No such compile option: '{UNKNOWN}'"):
    _one_round(_bad_plan())


def test_the_clock_trainer_compiles_with_its_plan():
  fed, model, params = setup = clock_helpers.clock_setup()
  trainer = clock_helpers.engine_adapter.EngineTrainer(
      model, fed.dataset.train_x, fed.dataset.train_y, fed.client_train,
      seed=clock_helpers.SEED, batch_size=clock_helpers.BATCH, max_epochs=1, lr=3e-3,
      call_size_multiple=4, plan=_bad_plan())
  assert trainer.plan.compiler_options == ((UNKNOWN, True),)
  del setup
  with pytest.raises(Exception, match=f"No such compile option: '{UNKNOWN}'"):
    trainer.train([clock_helpers.TrainJob(0, 0, params, params, 1, 0.0)])


def test_a_rematerialising_model_gets_the_remat_plan():
  config = helpers.tiny_config()
  assert training.platform_plan(config) == plan_lib.plan()
  config.model_options = ml_collections.ConfigDict({"remat": True})
  assert training.platform_plan(config) == plan_lib.plan(remat=True)
  if jax.default_backend() == "cpu":
    assert dict(plan_lib.plan(remat=True).compiler_options) == {
        **plan_lib.CPU_TRAINING_COMPILER_OPTIONS, **plan_lib.CPU_REMAT_COMPILER_OPTIONS}


def _transformer_step(remat: bool, plan):
  """(compiled temporary bytes, gradient) of one loss gradient of a 4-block transformer_lm,
  compiled by `local.jit_training` with `plan`."""
  model = models.get("transformer_lm", 81, width=32, depth=4, heads=2, max_len=12, remat=remat)
  x = jnp.asarray(np.random.default_rng(0).integers(0, 81, (4, 12)), jnp.int32)
  params = model.init(jax.random.PRNGKey(0), x)["params"]
  loss = local.make_loss_fn(model, False)
  grad = local.jit_training(jax.grad(lambda p: loss(p, {}, x, x, jnp.ones(4), None)[0]),
                            plan=plan)
  return grad.lower(params).compile().memory_analysis().temp_size_in_bytes, grad(params)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the remat options are CPU's")
def test_the_remat_plan_makes_remat_keep_fewer_values():
  """Each block under jax.checkpoint, compiled with the remat plan, keeps at most 0.6 of
  the plain model's temporary bytes (about 0.4 here: the backward pass recomputes one
  block at a time), for the same gradient. XLA:CPU's usual passes drop the barriers that
  hold each recomputation back, and then it kept as many bytes as the plain model."""
  plain_bytes, plain_grad = _transformer_step(False, plan_lib.plan())
  remat_bytes, remat_grad = _transformer_step(True, plan_lib.plan(remat=True))
  assert remat_bytes <= 0.6 * plain_bytes, (remat_bytes, plain_bytes)
  for a, b in zip(jax.tree.leaves(plain_grad), jax.tree.leaves(remat_grad), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
