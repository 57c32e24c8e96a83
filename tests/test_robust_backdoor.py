"""The backdoor attack of config.robust (Bagdasaryan, Veit, Hua, Estrin, Shmatikov, "How To
Backdoor Federated Learning", AISTATS 2020) and its success rate in the run's records.

Checked: the trigger and the triggered test set by hand; the poisoned examples (only the
malicious clients', exactly the configured share, inside the jitted local step); the boosted
upload against numpy; the success rate of a hand-built model; the refusals, one line each;
a backdoored run against an honest one; exact resume, chunking, the records of a run; and,
beside the backdoor, every defence on 8 CPU devices against 1 and the defences' scalars under
the FedLAMA schedule.
"""
import json
import os
import pathlib
import sys

import jax

if __name__ == "__main__":  # the 8-device subprocess: its CPU devices before any JAX operation
  jax.config.update("jax_num_cpu_devices", int(os.environ["FEDJAX_TEST_CPU_DEVICES"]))

# pylint: disable=wrong-import-position
import chex
import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lama import data as fdata
from fedjax_lama import federation, training
from fedjax_lama.engine import evaluate as evaluation
from fedjax_lama.engine import local, sharding, stages
from fedjax_lama.engine.algorithm import ClientContext, LocalState
from fedjax_lama.errors import ConfigError
from fedjax_lama.programs.round_program import RoundOutput
from fedjax_lama.robust import attacks, robust_stage
from fedjax_lama.run import records as records_lib
from fedjax_lama.run import spec as spec_lib
from tests import test_aggregation_stage as stage_tests
from tests import test_algorithm_contract as contract
from tests import test_cli_errors as cli
from tests import test_robust_runs as robust_runs
from tests import test_sharding as helpers
from tests import test_training

MESH = sharding.client_mesh(jax.devices()[:1])
REPO = pathlib.Path(__file__).resolve().parent.parent


def backdoor_config(**overrides):
  """robust_runs.robust_config under the backdoor (8 of 40 clients malicious, the tiny
  federation's 2x2 images take a 1-pixel trigger)."""
  return robust_runs.robust_config("none", "backdoor", **overrides)


def _spec(config) -> robust_stage.RobustSpec:
  return spec_lib.build_spec(config).robust


def image_federation(num_clients=8, size=6, seed=0):
  """size x size one-channel images of 3 classes (a random prototype each, plus noise), split
  IID into unequal clients; 400 test images."""
  rng = np.random.default_rng(seed)
  prototypes = rng.normal(size=(3, size, size, 1))

  def draw(n):
    y = rng.integers(0, 3, n).astype(np.int32)
    return (prototypes[y] + 0.5 * rng.normal(size=(n, size, size, 1))).astype(np.float32), y

  n = 40 * num_clients
  (x, y), (tx, ty) = draw(n), draw(400)
  ds = fdata.Dataset("synthetic", x, y, tx, ty, 3)
  cuts = np.sort(rng.choice(np.arange(1, n), num_clients - 1, replace=False))
  return federation.Federation(ds, [np.asarray(c, np.int64) for c in np.split(np.arange(n), cuts)],
                               None)


# ---- the trigger and the poisoned examples ------------------------------------------------------
def test_the_trigger_and_the_triggered_test_set_by_hand():
  train_x = np.zeros((2, 4, 4, 1), np.float32)
  train_x[1, 0, 0, 0] = 0.9  # the largest training input: the trigger's value
  test_x = np.full((3, 4, 4, 1), 0.25, np.float32)
  ds = fdata.Dataset("synthetic", train_x, np.array([0, 1]), test_x, np.array([1, 0, 2]), 3)
  backdoor = robust_stage.Backdoor(target_label=0, poison_fraction=0.5, trigger_size=2)
  trigger = backdoor.trigger(ds)
  assert trigger["value"] == pytest.approx(0.9)
  np.testing.assert_array_equal(trigger["pattern"], [[1, 0], [0, 1]])
  x, y = backdoor.test_set(ds)
  expected = np.full((4, 4), 0.25, np.float32)
  expected[1, 1] = expected[2, 2] = 0.9  # the 2x2 checkerboard one pixel from the corner
  assert x.shape == (2, 4, 4, 1)  # the test example of the target class is left out
  for image in x:
    np.testing.assert_array_equal(image[..., 0], expected)
  np.testing.assert_array_equal(y, [0, 0])


@pytest.mark.parametrize("n,fraction,count", [
    (12, 0.3, 4), (10, 0.25, 3), (10, 0.5, 5), (3, 0.1, 1), (5, 1.0, 5), (0, 0.5, 0)])
def test_poisoned_count_rounds_half_up_and_keeps_one(n, fraction, count):
  assert robust_stage.Backdoor.poisoned_count(n, fraction) == count


def test_only_the_malicious_clients_examples_are_poisoned_in_the_share_asked():
  fed = helpers.tiny_federation()
  spec = _spec(backdoor_config(**{"robust.malicious_count": 5, "robust.poison_fraction": 0.3}))
  malicious = spec.malicious(fed.num_clients)
  rows = robust_stage.poisoned_rows(spec, fed)
  assert malicious.sum() == 5
  for client, held in enumerate(fed.client_train):
    expected = robust_stage.Backdoor.poisoned_count(len(held), 0.3) if malicious[client] else 0
    assert rows[held].sum() == expected
  assert rows.sum() == sum(robust_stage.Backdoor.poisoned_count(len(fed.client_train[c]), 0.3)
                           for c in np.flatnonzero(malicious))
  # A function of the seed: the same rows again, other rows under another seed.
  np.testing.assert_array_equal(robust_stage.poisoned_rows(spec, fed), rows)
  other = _spec(backdoor_config(seed=1, **{"robust.malicious_count": 5,
                                           "robust.poison_fraction": 0.3}))
  assert not np.array_equal(robust_stage.poisoned_rows(other, fed), rows)


def _triggered_per_client(spec, fed, client_ids):
  """How many examples each client trains on with the trigger and the target label, counted
  inside FedAvg's jitted local step (local.make_client_train) by a loss that reads its batch:
  each client runs one step over all its examples (padded to one shape, compiled once)."""
  backdoor = spec.backdoor
  opts = robust_stage.with_poison(spec, training.run_options(helpers.tiny_config(), fed), fed)
  value = backdoor.trigger(fed.dataset)["value"]

  def loss_fn(params, model_state, x, y, example_mask, key):
    del key
    hit = (x[:, 1, 1, 0] == value) & (y == backdoor.target_label)
    return 0.0 * params["w"], (model_state, jnp.sum(hit * example_mask))

  algorithm = training.build_algorithm(helpers.tiny_config(), fed.num_clients)
  train = jax.jit(local.make_client_train(loss_fn, algorithm, lambda s: 0.1,
                                          poison=opts.poison))
  params = {"w": jnp.zeros(())}
  state = LocalState(params, {}, algorithm.local.tx.init(params))
  x, y = jnp.asarray(fed.dataset.train_x), jnp.asarray(fed.dataset.train_y)
  counts, width = [], max(len(held) for _, held in client_ids)
  for client_id, held in client_ids:
    rows = np.zeros(width, np.int32)
    rows[:len(held)] = held
    real = (np.arange(width) < len(held)).astype(np.float32)
    batch = local.ClientBatch(jnp.asarray(rows)[None], jnp.asarray(real)[None], jnp.ones(1),
                              jax.random.PRNGKey(0))
    ctx = ClientContext({"params": params}, {}, jnp.float32(len(held)), jnp.int32(client_id))
    counts.append(int(train(state, ctx, x, y, batch, 0)[1].correct))
  return counts


def test_the_local_step_poisons_only_malicious_clients_exactly_the_chosen_examples():
  fed = helpers.tiny_federation()
  spec = _spec(backdoor_config(**{"robust.malicious_count": 5, "robust.poison_fraction": 0.5}))
  malicious = spec.malicious(fed.num_clients)
  rows = robust_stage.poisoned_rows(spec, fed)
  # Unpoisoned examples of the target class already carrying the trigger's value count too.
  value = spec.backdoor.trigger(fed.dataset)["value"]
  natural = (fed.dataset.train_x[:, 1, 1, 0] == value) & (fed.dataset.train_y == 0)
  cases = [(c, fed.client_train[c]) for c in range(fed.num_clients)]
  counts = _triggered_per_client(spec, fed, cases)
  for (client, held), count in zip(cases, counts):
    poisoned = rows[held] if malicious[client] else np.zeros(len(held), bool)
    assert count == np.sum(poisoned | natural[held]), client
    if malicious[client]:
      assert np.sum(poisoned) == robust_stage.Backdoor.poisoned_count(len(held), 0.5)
  # A malicious client's rows trained under an honest client's id carry no trigger.
  bad, good = np.flatnonzero(malicious)[0], np.flatnonzero(~malicious)[0]
  held = fed.client_train[bad]
  assert _triggered_per_client(spec, fed, [(good, held)]) == [int(np.sum(natural[held]))]


# ---- the boosted upload ------------------------------------------------------------------------
@pytest.mark.parametrize("boost,server_lr", [(3.0, None), (0.0, 0.5), (0.0, None)])
def test_the_malicious_rows_are_boosted_before_the_mean(boost, server_lr):
  spec = _spec(backdoor_config(server_lr=server_lr, **{"robust.boost": boost}))
  malicious = spec.malicious(40)
  bad, good = np.flatnonzero(malicious)[:2], np.flatnonzero(~malicious)[:3]
  ids = np.concatenate([bad, good, [0]]).astype(np.int32)  # the last row is padding
  mask = np.array([1, 1, 1, 1, 1, 0], np.float32)
  weights = np.array([3.0, 1.0, 2.0, 5.0, 4.0, 0.0], np.float32)
  rng = np.random.default_rng(0)
  values = {"w": rng.normal(size=(6, 3)).astype(np.float32),
            "b": rng.normal(size=(6,)).astype(np.float32)}
  values["w"][5] = np.nan  # padding's garbage never enters
  stage = robust_stage.build_stage(spec, 40)
  out, _, scalars = stage.server(
      stages.Stack(jax.tree.map(jnp.asarray, values), jnp.asarray(weights), jnp.asarray(mask),
                   jnp.asarray(ids)), stage.init(None), jax.random.PRNGKey(0))
  # numpy reference: gamma = the boost, or model replacement's n / (eta m) (n = 5 real
  # clients, m = 2 of them malicious).
  gamma = boost if boost > 0 else 5 / ((server_lr or 1.0) * 2)
  for name, v in values.items():
    sent = v.astype(np.float64).copy()
    sent[:2] *= gamma
    expected = np.einsum("c,c...->...", weights[:5], sent[:5]) / weights[:5].sum()
    np.testing.assert_allclose(np.asarray(out[name]), expected, rtol=1e-5, atol=1e-6)
  assert float(scalars["boost"]) == pytest.approx(gamma)
  assert float(scalars["malicious"]) == 2.0
  # model_replacement's gamma is the same n / (eta m).
  if boost == 0:
    ref = attacks.model_replacement({"w": jnp.ones(())}, 5, server_lr or 1.0, 2)["w"]
    assert float(ref) == pytest.approx(gamma)


# ---- the success rate ----------------------------------------------------------------------------
class _Fooled(nn.Module):
  """No parameters: class 0 (the target) when pixel (2, 2) holds the trigger's value 1 and
  pixel (0, 4) is positive, class 1 otherwise."""

  @nn.compact
  def __call__(self, x, train=False):
    fooled = (x[:, 2, 2, 0] == 1.0) & (x[:, 0, 4, 0] > 0)
    return jnp.stack([jnp.where(fooled, 1.0, 0.0), jnp.where(fooled, 0.0, 1.0),
                      jnp.zeros(x.shape[0])], axis=-1)


class _Ledger:
  def totals(self):
    return {}


class _Program:
  """What records.evaluate reads of a round program."""

  def __init__(self):
    self.eval_fn = evaluation.make_eval_fn(_Fooled(), False)

  def eval_params(self, state):
    del state
    return {}, {}

  def local_steps_done(self, round_idx):
    return round_idx


def test_the_success_rate_of_a_hand_built_model():
  """Seven test images of 5x5 pixels, labels 0,1,2,1,2,0,1 (target 0): the five of classes 1
  and 2 are triggered (pixel (2, 2) set to the largest training input, 1) and the model says 0
  for those whose pixel (0, 4) is positive: three of them, so the success rate is 3 / 5."""
  test_y = np.array([0, 1, 2, 1, 2, 0, 1], np.int32)
  test_x = np.zeros((7, 5, 5, 1), np.float32)
  test_x[[0, 1, 2, 4], 0, 4, 0] = 1.0  # 1, 2, 4 are non-target: three fooled
  train_x = np.zeros((1, 5, 5, 1), np.float32)
  train_x[0, 4, 4, 0] = 1.0
  ds = fdata.Dataset("synthetic", train_x, np.zeros(1, np.int32), test_x, test_y, 3)
  fed = federation.Federation(ds, [np.arange(1)], None)
  backdoor = robust_stage.Backdoor(0, 0.5, 3)
  host = {"best_test_accuracy": None, "loss_sum": 0.0, "loss_count": 0.0}
  out = _round_output()
  record = records_lib.evaluate(4, _Program(), None, fed, 0, out, host, _Ledger(), 0.0,
                                per_client=False, backdoor_test=backdoor.test_set(ds))
  assert record["backdoor_accuracy"] == pytest.approx(3 / 5)
  # On the clean images (pixel (2, 2) is 0) the model says 1: right on the three of class 1.
  assert record["test_accuracy"] == pytest.approx(3 / 7)
  clean = records_lib.evaluate(4, _Program(), None, fed, 0, out, dict(host), _Ledger(), 0.0,
                               per_client=False)
  assert "backdoor_accuracy" not in clean


def _round_output():
  """An empty round's output (the record's training loss and extra fields)."""
  return RoundOutput(0.0, 0.0, np.zeros(0), np.zeros(0), None, {})


# ---- refusals ------------------------------------------------------------------------------------
@pytest.mark.parametrize("field,value,names", [
    ("robust.poison_fraction", 0.0, ["config.robust.poison_fraction=0.0", "(0, 1]"]),
    ("robust.poison_fraction", 1.5, ["config.robust.poison_fraction=1.5", "(0, 1]"]),
    ("robust.target_label", -1, ["config.robust.target_label=-1", "a class"]),
    ("robust.boost", -2.0, ["config.robust.boost=-2.0", ">= 0"]),
    ("robust.trigger_size", 0, ["config.robust.trigger_size=0", "an int >= 1"]),
    ("model", "lstm_lm", ["config.robust.attack='backdoor'", "config.model='lstm_lm'",
                          "image"]),
])
def test_bad_backdoor_fields_are_refused_before_any_data(field, value, names):
  with pytest.raises(ConfigError) as e:
    spec_lib.build_spec(backdoor_config(**{field: value}))
  for name in names:
    assert name in str(e.value)
  assert "\n" not in str(e.value)


def test_the_data_must_be_images_with_the_target_among_their_classes():
  fed = helpers.tiny_federation()
  program = lambda config, fed: helpers.build(config, MESH, fed=fed)
  with pytest.raises(ConfigError, match=r"config\.robust\.target_label=3 .*\[0, 3\)"):
    program(backdoor_config(**{"robust.target_label": 3}), fed)
  with pytest.raises(ConfigError, match=r"config\.robust\.trigger_size=2 .*\[1, 1\] .*2x2"):
    program(backdoor_config(**{"robust.trigger_size": 2}), fed)
  ds = fed.dataset
  tokens = federation.Federation(
      fdata.Dataset("shakespeare", ds.train_x.reshape(len(ds.train_x), -1).astype(np.int32),
                    ds.train_y, ds.test_x.reshape(len(ds.test_x), -1).astype(np.int32),
                    ds.test_y, 3, input_kind=fdata.INPUT_TOKENS), fed.client_train, None)
  with pytest.raises(ConfigError, match=r"config\.robust\.attack='backdoor' .*'tokens' inputs"):
    robust_stage.with_poison(_spec(backdoor_config()), None, tokens)


@pytest.mark.parametrize("args,names", [
    (["--config.robust.attack=backdoor", "--config.robust.malicious_count=2",
      "--config.robust.poison_fraction=1.5"], ["config.robust.poison_fraction=1.5", "(0, 1]"]),
    pytest.param(["--config.robust.attack=backdoor", "--config.robust.malicious_count=2",
                  "--config.robust.target_label=10"],
                 ["config.robust.target_label=10", "[0, 10)", "'digits'"],
                 marks=pytest.mark.slow),
    pytest.param(["--config=configs/shakespeare_lstm.py", "--config.robust.attack=backdoor",
                  "--config.robust.malicious_count=2"],
                 ["config.robust.attack='backdoor'", "config.model='lstm_lm'"],
                 marks=pytest.mark.slow),
], ids=["poison_fraction", "target_label", "text"])
def test_the_command_line_refuses_in_one_line(tmp_path, args, names):
  cli._check_case(tmp_path, args, names)  # pylint: disable=protected-access


# ---- runs ----------------------------------------------------------------------------------------
def _backdoor_rate(program, state, fed, backdoor):
  params, model_state = program.eval_params(state)
  return evaluation.evaluate(program.eval_fn, params, model_state,
                             *backdoor.test_set(fed.dataset)).accuracy


def _accuracy(program, state, fed):
  params, model_state = program.eval_params(state)
  return evaluation.evaluate(program.eval_fn, params, model_state, fed.dataset.test_x,
                             fed.dataset.test_y).accuracy


@pytest.mark.slow
def test_a_backdoored_run_succeeds_where_an_honest_run_does_not():
  """One of 8 clients (every round all 8) poisons half its examples and boosts its update by
  n / eta = 8: without a defence the triggered test images go to the target class; the
  honest run's model sends few of them there, and both learn the main task."""
  fed = image_federation()
  fields = {"num_clients": 8, "active_ratio": 1.0, "rounds": 6, "local_steps": 10,
            "batch_size": 8, "robust.malicious_count": 1, "robust.trigger_size": 3}
  config = backdoor_config(**fields)
  backdoor = _spec(config).backdoor
  attacked = helpers.build(config, MESH, fed=fed)
  honest = helpers.build(helpers.tiny_config(**{k: v for k, v in fields.items()
                                                if not k.startswith("robust.")}), MESH, fed=fed)
  a_state, _ = helpers.run(attacked)
  h_state, _ = helpers.run(honest)
  a_rate = _backdoor_rate(attacked, a_state, fed, backdoor)
  h_rate = _backdoor_rate(honest, h_state, fed, backdoor)
  assert a_rate >= 0.9 and h_rate <= 0.5 and a_rate - h_rate >= 0.5, (a_rate, h_rate)
  assert _accuracy(honest, h_state, fed) >= 0.8
  assert _accuracy(attacked, a_state, fed) >= 0.8  # replaced by a model still good at the task


def test_a_backdoored_run_resumes_bit_identically(tmp_path):
  result = contract._run_resumed(backdoor_config(), tmp_path)  # pylint: disable=protected-access
  assert robust_runs._bits(result["resumed"]) == robust_runs._bits(result["straight"])  # pylint: disable=protected-access


@pytest.mark.slow
def test_a_backdoored_run_chunked_equals_unchunked():
  program = helpers.build(backdoor_config(rounds=2), MESH)
  state, outs = helpers.run(program)
  chunked = helpers.build(backdoor_config(rounds=2, **{"engine.clients_per_chunk": 3}), MESH)
  assert chunked.chunk_size == 3
  c_state, c_outs = helpers.run(chunked)
  chex.assert_trees_all_close(robust_runs._server(chunked, c_state),  # pylint: disable=protected-access
                              robust_runs._server(program, state), rtol=1e-5, atol=1e-6)  # pylint: disable=protected-access
  for a, b in zip(outs, c_outs):
    assert a.extra["aggregator_malicious"] == b.extra["aggregator_malicious"]
    assert a.extra["aggregator_boost"] == b.extra["aggregator_boost"] == 10.0  # n / 1
  assert any(o.extra["aggregator_malicious"] > 0 for o in outs)


@pytest.mark.slow
def test_the_records_carry_the_success_rate_and_resume_exactly(tmp_path):
  fields = {"robust.attack": "backdoor", "robust.malicious_count": 2,
            "robust.defence": "median"}
  config = test_training.tiny_config(rounds=3, eval_every=1, checkpoint_every=1, **fields)
  straight = training.train_and_evaluate(config, str(tmp_path / "straight"))
  workdir = str(tmp_path / "resumed")
  training.train_and_evaluate(config, workdir, stop_after_round=0)
  resumed = training.train_and_evaluate(config, workdir)
  drop = lambda d: {k: v for k, v in d.items() if "wall" not in k and "seconds" not in k}
  assert drop(resumed) == drop(straight)
  rows = test_training._metrics(workdir)  # pylint: disable=protected-access
  assert rows == test_training._metrics(str(tmp_path / "straight"))  # pylint: disable=protected-access
  assert [r["round"] for r in rows] == [1, 2, 3]
  rates = [r["backdoor_accuracy"] for r in rows]
  assert all(0.0 <= r <= 1.0 for r in rates)
  assert straight["final_backdoor_accuracy"] == rates[-1]
  assert straight["best_backdoor_accuracy"] == max(rates)
  summary = json.loads(pathlib.Path(workdir, "summary.json").read_text())
  assert summary["final_backdoor_accuracy"] == rates[-1]
  plain = test_training.tiny_config(rounds=1, eval_every=1)
  assert "final_backdoor_accuracy" not in training.train_and_evaluate(plain,
                                                                     str(tmp_path / "plain"))


# ---- the defences' scalars under the FedLAMA schedule ----------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("phi", [1, 2])
def test_fedlama_records_the_defence_scalars_of_the_window(phi):
  """Multi-Krum (f = 2) behind 2 clients sending -10x their update, all 8 clients in every
  sub-round: the window's last sub-round synchronises every layer and keeps the honest six,
  as a synchronous round does (robust_runs.test_multi_krum_keeps_exactly_the_honest_clients)."""
  fed = helpers.tiny_federation(num_clients=8)
  config = helpers.tiny_config(**{
      "num_clients": 8, "active_ratio": 1.0, "rounds": 2, "robust.defence": "multi_krum",
      "robust.f": 2, "robust.attack": "sign_flip", "robust.scale": 10.0,
      "robust.malicious_count": 2, "schedule": "fedlama", "fedlama.phi": phi})
  program = helpers.build(config, MESH, fed=fed)
  assert type(program).__name__ == "FedLamaProgram"
  _, outs = helpers.run(program)
  malicious = np.flatnonzero(attacks.malicious_clients(config.seed, 8, count=2)).tolist()
  honest = sorted(set(range(8)) - set(malicious))
  for out in outs:
    assert out.extra["aggregator_malicious"] == 2.0
    assert out.extra["aggregator_kept"] == honest
    assert out.extra["aggregator_valid"] == 1.0


# ---- every defence: 8 devices equal 1 ----------------------------------------------------------------
# FedAvg with each defence (no attack), and Krum behind the backdoor (its trigger and boost on
# a cohort of 10 padded to 16 over 8 devices); the default suite runs DEFAULT_CASES, the rest
# under -m slow.
DEFAULT_CASES = ("krum+backdoor",)
CASES = tuple(robust_runs.DEFENCES) + ("krum+backdoor",)


def _case_config(case: str):
  defence, _, attack = case.partition("+")
  return robust_runs.robust_config(defence, attack or "none", weighting="uniform")


def worker(out_path, mesh_size, cases):
  """Subprocess entry: every case on a mesh of the first `mesh_size` devices (0: all 8)."""
  assert jax.device_count() == int(os.environ["FEDJAX_TEST_CPU_DEVICES"]), jax.devices()
  mesh = sharding.client_mesh(jax.devices()[:mesh_size] if mesh_size else None)
  report = {}
  for case in cases:
    program = helpers.build(_case_config(case), mesh)
    state, outs = helpers.run(program)
    server = robust_runs._server(program, state)  # pylint: disable=protected-access
    report[case] = {"params": [np.asarray(p).tolist() for p in
                               jax.tree.leaves(server.params)],
                    "loss": [o.train_loss for o in outs],
                    "extra": [{k: v for k, v in o.extra.items() if k.startswith("aggregator_")}
                              for o in outs]}
  pathlib.Path(out_path).write_text(json.dumps(report))


MODULE = "tests.test_robust_backdoor"  # its __main__ runs the 8-device cases


def _check_eight(one, many, case):
  stage_tests.check_eight_equal_one(one, many, case)
  assert many[case]["extra"] == one[case]["extra"]  # the clients kept, the count of attackers


@pytest.fixture(scope="module")
def eight_default(tmp_path_factory):
  return stage_tests.eight_vs_one(tmp_path_factory.mktemp("robust8"), DEFAULT_CASES, MODULE)


@pytest.fixture(scope="module")
def eight_rest(tmp_path_factory):
  return stage_tests.eight_vs_one(tmp_path_factory.mktemp("robust8rest"),
                                  [c for c in CASES if c not in DEFAULT_CASES], MODULE)


@pytest.mark.slow
@pytest.mark.parametrize("case", DEFAULT_CASES)
def test_eight_devices_equal_one(eight_default, case):
  _check_eight(*eight_default, case)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CASES if c not in DEFAULT_CASES])
def test_eight_devices_equal_one_for_every_other_defence(eight_rest, case):
  _check_eight(*eight_rest, case)


if __name__ == "__main__":
  worker(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
