"""config.robust wired into runs: defences as the run's aggregation stage, attacks before them.

Programs are built from the config exactly as a run builds them (training.build_program ->
parts.program), on the tiny federation and model of tests/test_sharding.py; one run goes
through train_and_evaluate and its workdir, and the refusals through the command line.
"""
import json
import os

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fedjax_lama import training
from fedjax_lama.engine import aggregation, sharding, stages
from fedjax_lama.errors import ConfigError
from fedjax_lama.robust import attacks
from fedjax_lama.robust import robust_stage
from fedjax_lama.run import spec as spec_lib
from tests import test_aggregation_stage as aggregation_stage
from tests import test_algorithm_contract as contract
from tests import test_cli_errors as cli
from tests import test_sharding as helpers
from tests import test_training

MESH = sharding.client_mesh(jax.devices()[:1])
# Each defence with options its bound accepts on cohorts of 10 clients and f = 1.
DEFENCES = {
    "krum": {}, "multi_krum": {}, "bulyan": {"robust.f": 1}, "median": {},
    "trimmed_mean": {"robust.beta": 0.2}, "geometric_median": {},
    "centered_clipping": {"robust.radius": 0.5, "robust.momentum": 0.5},
    "norm_bounding": {"robust.bound": 0.5}, "meamed": {},
}
FAST = ("krum", "centered_clipping")


def _defences():
  return [d if d in FAST else pytest.param(d, marks=pytest.mark.slow) for d in DEFENCES]


def robust_config(defence="none", attack="none", **overrides):
  """helpers.tiny_config with config.robust set (10 of 40 clients per round)."""
  fields = {"active_ratio": 0.25, "robust.defence": defence, "robust.f": 1,
            "robust.attack": attack, **DEFENCES.get(defence, {})}
  if attack != "none":
    fields["robust.malicious_count"] = 8
  if attack == "backdoor":  # the tiny federation's 2x2 images take a 1-pixel trigger
    fields["robust.trigger_size"] = 1
  return helpers.tiny_config(**{**fields, **overrides})


def _server(program, state):
  return contract._server_and_rows(program, state)[0]  # pylint: disable=protected-access


def _bits(tree):
  return contract._bits(tree)  # pylint: disable=protected-access


def _short(**fields):
  """test_training.tiny_config cut to two rounds, each evaluated and checkpointed."""
  return test_training.tiny_config(rounds=2, eval_every=1, checkpoint_every=1, **fields)


def _flat(tree):
  return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(tree)])


# ---- the config section ---------------------------------------------------------------------
def test_no_section_and_none_build_no_stage():
  assert spec_lib.build_spec(helpers.tiny_config()).robust is None
  assert spec_lib.build_spec(robust_config("none")).robust is None
  program = helpers.build(robust_config("none"), MESH)
  assert program.opts.aggregator is None
  assert "aggregation" not in program.init_state()


def test_defence_none_is_the_default_run_bitwise(tmp_path):
  plain = _short()
  robust = _short(**{"robust.defence": "none", "robust.attack": "none"})
  a = training.train_and_evaluate(plain, str(tmp_path / "plain"))
  b = training.train_and_evaluate(robust, str(tmp_path / "robust"))
  drop = lambda d: {k: v for k, v in d.items() if "wall" not in k and "seconds" not in k}
  assert drop(a) == drop(b)
  assert (test_training._metrics(str(tmp_path / "plain"))  # pylint: disable=protected-access
          == test_training._metrics(str(tmp_path / "robust")))  # pylint: disable=protected-access


@pytest.mark.slow
def test_a_workdir_written_before_the_section_resumes(tmp_path):
  """An old workdir's config.json has no config.robust: resuming it is no change."""
  config = _short()
  straight = training.train_and_evaluate(config, str(tmp_path / "straight"))
  workdir = tmp_path / "old"
  training.train_and_evaluate(config, str(workdir), stop_after_round=0)
  old = json.loads((workdir / "config.json").read_text())
  old.pop("robust")
  (workdir / "config.json").write_text(json.dumps(old, indent=2, sort_keys=True) + "\n")
  resumed = training.train_and_evaluate(config, str(workdir))
  drop = lambda d: {k: v for k, v in d.items() if "wall" not in k and "seconds" not in k}
  assert drop(resumed) == drop(straight)


@pytest.mark.parametrize("field,value,names", [
    ("robust.defence", "krumm", ["config.robust.defence='krumm'", "'multi_krum'"]),
    ("robust.attack", "flip", ["config.robust.attack='flip'", "'sign_flip'"]),
    ("robust.f", -1, ["config.robust.f=-1"]),
    ("robust.beta", 0.6, ["config.robust.beta=0.6"]),
    ("robust.radius", -1.0, ["config.robust.radius=-1.0"]),
])
def test_bad_fields_are_refused_naming_them(field, value, names):
  defence = "trimmed_mean" if field == "robust.beta" else "centered_clipping"
  config = robust_config(defence, **{field: value})
  with pytest.raises(ConfigError) as e:
    spec_lib.build_spec(config)
  for name in names:
    assert name in str(e.value)
  assert "\n" not in str(e.value)


def test_an_attack_needs_exactly_one_count_of_attackers():
  config = robust_config("krum", "sign_flip", **{"robust.malicious_count": 0})
  with pytest.raises(ConfigError, match="exactly one of them"):
    spec_lib.build_spec(config)
  config = robust_config("krum", "sign_flip", **{"robust.malicious_fraction": 0.1})
  with pytest.raises(ConfigError, match="exactly one of them"):
    spec_lib.build_spec(config)


def test_preconditions_use_the_smallest_cohort():
  # 10 clients a round: Krum tolerates f <= 3 (n > 2f + 2), Bulyan f <= 1 (n >= 4f + 3).
  spec_lib.build_spec(robust_config("krum", **{"robust.f": 3}))
  with pytest.raises(ConfigError, match=r"config\.robust\.f=4 .* n > 2f \+ 2 .* n = 10"):
    spec_lib.build_spec(robust_config("krum", **{"robust.f": 4}))
  with pytest.raises(ConfigError, match=r"config\.robust\.f=2 .* n >= 4f \+ 3"):
    spec_lib.build_spec(robust_config("bulyan", **{"robust.f": 2}))
  # A Bernoulli draw can hold a single client, which no f >= 1 of Krum survives.
  with pytest.raises(ConfigError, match="bernoulli"):
    spec_lib.build_spec(robust_config("krum", client_sampling="bernoulli"))


@pytest.mark.parametrize("defence, attack", [("krum", "none"), ("none", "sign_flip"),
                                             ("none", "backdoor")])
def test_a_defence_or_an_attack_with_differential_privacy_is_refused(defence, attack):
  config = robust_config(defence, attack=attack)
  config.privacy.enabled = True
  with pytest.raises(ConfigError, match=rf"config\.robust\.defence='{defence}', "
                                        rf"config\.robust\.attack='{attack}' with "
                                        r"config\.privacy\.enabled=True"):
    spec_lib.robust_options(config, "synchronous")
  config.privacy.enabled = False
  assert spec_lib.robust_options(config, "synchronous").defence == defence


def test_the_simulated_clock_refuses_the_section():
  config = robust_config("median", algorithm="fedat")
  with pytest.raises(ConfigError, match="simulated clock"):
    spec_lib.build_spec(config)


# ---- defences in runs -------------------------------------------------------------------------
@pytest.mark.parametrize("defence", _defences())
def test_each_defence_chunked_equals_unchunked(defence):
  config = robust_config(defence, rounds=2)
  program = helpers.build(config, MESH)
  assert program.opts.aggregator is not None
  state, outs = helpers.run(program)
  whole = _server(program, state)
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(whole))
  chunked = helpers.build(robust_config(defence, rounds=2, **{"engine.clients_per_chunk": 3}),
                          MESH)
  assert chunked.chunk_size == 3
  state, chunked_outs = helpers.run(chunked)
  chex.assert_trees_all_close(_server(chunked, state), whole, rtol=1e-5, atol=1e-6)
  for a, b in zip(outs, chunked_outs):
    if "aggregator_kept" in a.extra:
      assert a.extra["aggregator_kept"] == b.extra["aggregator_kept"]


@pytest.mark.parametrize("defence", _defences())
def test_each_defence_resumes_bit_identically(defence, tmp_path):
  result = contract._run_resumed(robust_config(defence, "sign_flip"), tmp_path)  # pylint: disable=protected-access
  assert _bits(result["resumed"]) == _bits(result["straight"])


def test_centered_clipping_momentum_is_checkpointed(tmp_path):
  program = helpers.build(robust_config("centered_clipping", rounds=3), MESH)
  state = program.init_state()
  assert "aggregation" in state  # the centre of the clipping
  straight = state
  for r in range(3):
    straight, _ = program.run_round(straight, r)
  aggregation_stage.assert_resumes_after_round_zero(program, straight, tmp_path / "ckpt")


@pytest.mark.slow
def test_an_interrupted_run_resumes_from_its_workdir(tmp_path):
  """Centered clipping with momentum behind an attack, through train_and_evaluate."""
  fields = {"robust.defence": "centered_clipping", "robust.radius": 0.5,
            "robust.momentum": 0.5, "robust.attack": "ipm", "robust.malicious_count": 2,
            "robust.f": 1}
  config = _short(**fields)
  straight = training.train_and_evaluate(config, str(tmp_path / "straight"))
  workdir = str(tmp_path / "resumed")
  training.train_and_evaluate(config, workdir, stop_after_round=0)
  resumed = training.train_and_evaluate(config, workdir)
  drop = lambda d: {k: v for k, v in d.items() if "wall" not in k and "seconds" not in k}
  assert drop(resumed) == drop(straight)
  rows = test_training._metrics(workdir)  # pylint: disable=protected-access
  assert rows == test_training._metrics(str(tmp_path / "straight"))  # pylint: disable=protected-access
  assert all(r["aggregator_malicious"] >= 0 for r in rows if "aggregator_malicious" in r)


# ---- attacks ------------------------------------------------------------------------------------
@pytest.mark.parametrize("attack", ["alie", "label_flip", "backdoor"] + [
    pytest.param(a, marks=pytest.mark.slow) for a in ("sign_flip", "gaussian", "ipm")])
@pytest.mark.slow
def test_an_attack_without_defence_moves_the_model(attack):
  honest, _ = helpers.run(helpers.build(robust_config(rounds=1), MESH))
  program = helpers.build(robust_config("none", attack, rounds=1), MESH)
  attacked, outs = helpers.run(program)
  gap = np.linalg.norm(_flat(_server(program, attacked).params)
                       - _flat(honest["server"].params))
  assert gap > 1e-3
  if attack != "label_flip":
    assert outs[0].extra["aggregator_malicious"] > 0


def test_multi_krum_keeps_exactly_the_honest_clients():
  """8 clients all in every round, 2 of them malicious sending -10x their update: Multi-Krum
  with f = 2 averages n - f = 6 updates, and the honest six are nearest to each other."""
  fed = helpers.tiny_federation(num_clients=8)
  config = helpers.tiny_config(**{
      "num_clients": 8, "active_ratio": 1.0, "rounds": 2, "robust.defence": "multi_krum",
      "robust.f": 2, "robust.attack": "sign_flip", "robust.scale": 10.0,
      "robust.malicious_count": 2})
  program = helpers.build(config, MESH, fed=fed)
  _, outs = helpers.run(program)
  malicious = np.flatnonzero(attacks.malicious_clients(config.seed, 8, count=2)).tolist()
  honest = sorted(set(range(8)) - set(malicious))
  for out in outs:
    assert out.extra["aggregator_malicious"] == 2.0
    assert out.extra["aggregator_kept"] == honest


def test_krum_on_a_hand_checkable_stack_keeps_an_honest_client():
  """Four honest clients at 0, 1, 3, 4 on one axis; the malicious one (fixed by the seed)
  would send 2 and flips it to -2 * 5 = -10. Krum with f = 1 on n = 5 scores each row by
  its n - f - 2 = 2 nearest squared distances: 0 -> 1 + 9 = 10, 1 -> 1 + 4 = 5,
  3 -> 4 + 1 = 5, 4 -> 1 + 9 = 10, -10 -> 100 + 121 = 221; the first minimum is kept."""
  spec = robust_stage.RobustSpec("krum", 1, {}, "sign_flip", None, 1, {"scale": 5.0}, 0,
                                 "fixed", 1.0)
  malicious = int(np.flatnonzero(spec.malicious(10))[0])
  honest = [i for i in range(10) if i != malicious][:4]
  stage = robust_stage.build_stage(spec, 10)
  values = {"w": jnp.array([[0.0], [1.0], [3.0], [4.0], [2.0], [0.0]])}
  ids = jnp.array(honest + [malicious, 9], jnp.int32)  # the last row is padding
  mask = jnp.array([1, 1, 1, 1, 1, 0], jnp.float32)
  out, _, scalars = stage.server(stages.Stack(values, mask, mask, ids), stage.init(None),
                                 jax.random.PRNGKey(0))
  np.testing.assert_allclose(np.asarray(out["w"]), [1.0])
  assert aggregation.stage_metrics(jax.device_get(scalars))["aggregator_kept"] == [honest[1]]
  assert float(scalars["malicious"]) == 1.0


def test_label_flip_relabels_only_the_malicious_clients_examples():
  fed = helpers.tiny_federation(num_clients=8)
  spec = robust_stage.RobustSpec("none", 0, {}, "label_flip", None, 2, {}, 0, "fixed", 1.0)
  poisoned = robust_stage.poisoned(spec, fed)
  bad = spec.malicious(8)
  for i, rows in enumerate(fed.client_train):
    before, after = fed.dataset.train_y[rows], poisoned.dataset.train_y[rows]
    expected = 2 - before if bad[i] else before  # 3 classes: l -> 2 - l
    np.testing.assert_array_equal(after, expected)
  assert poisoned.dataset.train_y is not fed.dataset.train_y


# ---- the command line ---------------------------------------------------------------------------
@pytest.mark.parametrize("args,names", [
    (["--config.robust.defence=krum", "--config.robust.f=2", "--config.num_clients=6",
      "--config.active_ratio=1.0"], ["config.robust.f=2", "n > 2f + 2", "n = 6"]),
    (["--config.robust.defence=bulyan", "--config.robust.f=2", "--config.num_clients=10",
      "--config.active_ratio=1.0"], ["config.robust.f=2", "n >= 4f + 3", "n = 10"]),
], ids=["krum", "bulyan"])
@pytest.mark.slow
def test_the_command_line_refuses_a_broken_bound_in_one_line(tmp_path, args, names):
  cli._check_case(tmp_path, args, names)  # pylint: disable=protected-access


# ---- composition ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_fedlama_runs_a_defence_behind_an_attack():
  program = helpers.build(robust_config("median", "sign_flip", schedule="fedlama"), MESH)
  assert type(program).__name__ == "FedLamaProgram"
  state, outs = helpers.run(program)
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(_server(program, state)))
  assert all(np.isfinite(o.train_loss) for o in outs)


@pytest.mark.slow
def test_vectorized_runs_with_a_defence_equal_sequential_runs(tmp_path):
  configs = [_short(seed=s, **{"robust.defence": "multi_krum", "robust.f": 1})
             for s in (0, 1)]
  workdirs = [str(tmp_path / f"vec{s}") for s in (0, 1)]
  together = training.train_many(configs, workdirs)
  assert [o["vectorized_runs"] for o in together] == [2, 2]
  for config, workdir, summary in zip(configs, workdirs, together):
    alone = str(tmp_path / f"alone{config.seed}")
    single = training.train_and_evaluate(config, alone)
    assert single["final_test_accuracy"] == summary["final_test_accuracy"]
    kept = [r["aggregator_kept"] for r in test_training._metrics(workdir)  # pylint: disable=protected-access
            if "aggregator_kept" in r]
    assert kept and all(len(k) == 7 for k in kept)  # n - f of the 8 clients


@pytest.mark.slow
@pytest.mark.parametrize("attack", ["gaussian", "label_flip"])
def test_vectorized_runs_with_an_attack_equal_sequential_runs(attack, tmp_path):
  """Each seed draws its own attackers (the stage's state, or its relabelled data), yet the
  seeds train as one program and each equals its run alone."""
  fields = {"robust.attack": attack, "robust.malicious_count": 3, "robust.defence": "median",
            "robust.f": 1}
  configs = [_short(seed=s, **fields) for s in (0, 1)]
  workdirs = [str(tmp_path / f"vec{s}") for s in (0, 1)]
  together = training.train_many(configs, workdirs)
  assert [o["vectorized_runs"] for o in together] == [2, 2]
  malicious = [spec_lib.robust_options(c, "synchronous").malicious(c.num_clients) for c in configs]
  assert not np.array_equal(*malicious)  # the two seeds' attackers differ
  for config, workdir, summary in zip(configs, workdirs, together):
    alone = str(tmp_path / f"alone{config.seed}")
    single = training.train_and_evaluate(config, alone)
    assert single["final_test_accuracy"] == summary["final_test_accuracy"]
    # Every metric equal; the training loss to float rounding (the vectorized program
    # averages it in float32).
    rows, alone_rows = (test_training._metrics(w) for w in (workdir, alone))  # pylint: disable=protected-access
    losses = lambda rs: [r.pop("train_loss") for r in rs]
    np.testing.assert_allclose(losses(rows), losses(alone_rows), rtol=1e-5)
    assert rows == alone_rows
    assert any(r.get("aggregator_malicious", 0) > 0 for r in rows) or attack == "label_flip"
