"""The aggregation stage (engine/stages.py, engine/aggregation.py) under every synchronous
algorithm of the contract table, SyncProgram, the vectorized program and FedLAMA.

Two stages: a clip (`clip_stage(1.0)`, a client part: every model upload scaled to L2 norm
<= 1 by tree.clip_by_global_norm) and the coordinate median (robust/defences.py's, reading
the cohort's stack: the engine gathers the cohort's uploads across chunks). Checked:
- both against numpy on a tiny stack (padded rows holding garbage included);
- composition (`chain`, `aggregation.around`) and the refusals of an order that cannot run,
  one line each naming both members;
- no stage is exactly the algorithm's declaration (program state unchanged: no
  "aggregation" entry), and the stages really act (the clip bound binds, the median of two
  clients is their unweighted mean, of three it is not a mean);
- under every algorithm of registry.SPECS (those without a model displacement upload are
  refused with one line): a few rounds run, chunked rounds equal one chunk;
- 8 fake CPU devices equal 1 (one subprocess per mesh);
- a stage with state is checkpointed and restored exactly;
- FedLAMA with phi = 1 and a stage is SyncProgram with it, and FedLAMA with phi = 2 runs both.
The costly variants run in the default suite for a core of 3 algorithms and for every
algorithm under `-m slow`.
"""
import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import jax

if __name__ == "__main__":  # the 8-device subprocess: its CPU devices before any JAX operation
  jax.config.update("jax_num_cpu_devices", int(os.environ["FEDJAX_TEST_CPU_DEVICES"]))

# pylint: disable=wrong-import-position
import chex
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lama import checkpointing, compression, registry, training, tree
from fedjax_lama import config as config_lib
from fedjax_lama.engine import aggregation, sharding, stages
from fedjax_lama.engine import traffic as traffic_lib
from fedjax_lama.engine.algorithm import MODEL_UPLOAD
from fedjax_lama.errors import ConfigError
from fedjax_lama.programs.fedlama import FedLamaProgram
from fedjax_lama.programs.sync import SyncProgram
from fedjax_lama.robust import attacks, defences
from fedjax_lama.programs.vectorized import VectorizedSyncProgram
from tests import test_algorithm_contract as contract
from tests import test_sharding as helpers

MESH = sharding.client_mesh(jax.devices()[:1])
REPO = pathlib.Path(__file__).resolve().parent.parent
NAMES = sorted(registry.SPECS)
# The default suite runs the stages under FedAvg; every other algorithm (SCAFFOLD's rows and
# server state, FedPAQ's compressed upload, ...) runs under `-m slow`.
CORE = ("fedavg",)


def clip_stage(max_norm: float) -> stages.Stage:
  """Each client's value scaled to L2 norm at most `max_norm` (a client part alone)."""
  return stages.make(f"clip[{max_norm:g}]", client=lambda value, state, key:
                     tree.clip_by_global_norm(value, max_norm)[0])


def median_stage() -> stages.Stage:
  return defences.build("median", 0)


STAGES = {"clip": lambda: clip_stage(1.0), "median": median_stage}


def _core_first(names):
  return [n if n in CORE else pytest.param(n, marks=pytest.mark.slow) for n in names]


def _refused(name, fedlama=False) -> bool:
  """Algorithms that upload no model displacement for a run stage to wrap (FedADMM; FedSpeed
  with its "active" server average, which the contract's FedLAMA config selects)."""
  alg = training.build_algorithm(contract.config_for(name, fedlama),
                                 num_clients=helpers.NUM_CLIENTS)
  # Named like a flax model's layers: the personalization methods find their head by name.
  params = {f"Dense_{i}": {"kernel": jnp.zeros((3, 3)), "bias": jnp.zeros((3,))}
            for i in range(2)}
  row = alg.row_init(params) if alg.row_init is not None else {}
  uploads = traffic_lib.traffic(alg, alg.server.init(params, {}), row).upload_shapes
  return MODEL_UPLOAD not in uploads


def _refusal(name):
  return pytest.raises(ConfigError, match=r"aggregator .* cannot run config\.algorithm="
                                          rf"'{name}': it uploads no model displacement")


# ---- numpy references ------------------------------------------------------------------------
def _stack(seed=0, clients=5, garbage_rows=2):
  r = np.random.default_rng(seed)
  tree = {"w": r.normal(size=(clients + garbage_rows, 3, 2)).astype(np.float32) * 2,
          "b": r.normal(size=(clients + garbage_rows, 4)).astype(np.float32)}
  tree["w"][clients:] = np.nan  # padded rows: garbage that must never enter
  tree["b"][clients:] = 1e30
  mask = np.array([1.0] * clients + [0.0] * garbage_rows, np.float32)
  return tree, mask


def test_clip_norm_matches_numpy():
  values, _ = _stack(garbage_rows=0)
  values["b"][0] *= 1e-3  # one client already inside the ball: left as it is
  stage = clip_stage(1.0)
  keys = jax.random.split(jax.random.PRNGKey(0), 5)
  got = aggregation.apply_client(stage, (), keys, jax.tree.map(jnp.asarray, values))
  for i in range(5):
    norm = np.sqrt(sum(np.sum(np.square(v[i].astype(np.float64))) for v in values.values()))
    scale = min(1.0, 1.0 / norm)
    for k in values:
      np.testing.assert_allclose(got[k][i], values[k][i] * scale, rtol=1e-6, atol=1e-7)
    got_norm = np.sqrt(sum(np.sum(np.square(np.asarray(got[k][i], np.float64)))
                           for k in values))
    assert got_norm <= 1.0 + 1e-6
  assert np.linalg.norm(values["w"][1]) > 1.0, "the stack must exercise the clip"


@pytest.mark.parametrize("clients", [5, 4, 1])
def test_coordinate_median_matches_numpy_and_ignores_padded_rows(clients):
  values, mask = _stack(1, clients=clients)
  stack = stages.Stack(jax.tree.map(jnp.asarray, values), jnp.asarray(mask), jnp.asarray(mask))
  got, state, scalars = median_stage().server(stack, (), jax.random.PRNGKey(0))
  assert state == () and set(scalars) == {"valid"} and bool(scalars["valid"])
  for k in values:
    np.testing.assert_allclose(got[k], np.median(values[k][:clients], axis=0), rtol=1e-6)


def test_median_of_an_empty_cohort_is_zero():
  values, mask = _stack(2, clients=0)
  stack = stages.Stack(jax.tree.map(jnp.asarray, values), jnp.asarray(mask), jnp.asarray(mask))
  got, _, _ = median_stage().server(stack, (), jax.random.PRNGKey(0))
  for v in jax.tree.leaves(got):
    np.testing.assert_array_equal(v, 0.0)


def test_chain_clips_then_averages():
  values, mask = _stack(3, garbage_rows=0)
  weights = np.arange(1.0, 6.0, dtype=np.float32)
  stage = stages.chain(clip_stage(1.0), stages.mean())
  assert stage.consumes == stages.SUMS and stage.reduces
  assert stage.weights == stages.ROUND_WEIGHTS
  keys = jax.random.split(jax.random.PRNGKey(0), 5)
  clipped = aggregation.apply_client(stage, stage.init(None), keys,
                                     jax.tree.map(jnp.asarray, values))
  sums = stages.Sums(jax.tree.map(lambda v: jnp.tensordot(weights, v, axes=1), clipped),
                     jnp.sum(weights))
  got, _, _ = stage.server(sums, stage.init(None), jax.random.PRNGKey(1))
  ref = clip_stage(1.0)
  for k in values:
    want = sum(w * np.asarray(ref.client({kk: jnp.asarray(v[i]) for kk, v in values.items()},
                                         (), None)[k])
               for i, w in enumerate(weights)) / weights.sum()
    np.testing.assert_allclose(got[k], want, rtol=1e-5, atol=1e-6)
  # A reducer wraps nothing; a transform goes before the declared reducer.
  median = median_stage()
  assert aggregation.around(median, stages.mean()) == (median,)
  clip = clip_stage(1.0)
  assert aggregation.around(clip, stages.total())[1].weights == stages.PARTICIPANTS


def test_bad_compositions_are_refused_in_one_line():
  with pytest.raises(ConfigError, match=r"chain: stage 'mean' reduces .* not last"):
    stages.chain(stages.mean(), clip_stage(1.0))
  with pytest.raises(ConfigError, match=r"consumes='sideways'"):
    stages.make("x", consumes="sideways", server=lambda *a: a)


def _attack():
  return attacks.upload_attack("sign_flip", np.zeros(4, bool), {"scale": 1.0})


@pytest.mark.parametrize("members, first, second", [
    # An attack hands on the cohort's stack; the streaming mean reads running sums.
    (lambda: (_attack(), stages.mean()), "attack[sign_flip]", "mean"),
    # A clip of each client's upload cannot follow a stage that took the stack.
    (lambda: (_attack(), clip_stage(1.0), median_stage()), "attack[sign_flip]", "clip[1]"),
    # The stack is gone once the sums are taken.
    (lambda: (stages.make("noise", server=lambda s, st, k: (s, st, {}), consumes=stages.SUMS),
              median_stage()), "noise", "median"),
    # Nothing after a reducer.
    (lambda: (median_stage(), clip_stage(1.0)), "median", "clip[1]"),
    # The uplink codec decodes every upload before anything reads it.
    (lambda: (clip_stage(1.0), stages.uplink(compression.identity())), "clip[1]",
     "uplink[identity]"),
    # Sums of two weightings cannot be one stream.
    (lambda: (stages.make("noise", server=lambda s, st, k: (s, st, {}), consumes=stages.SUMS),
              stages.total()), "noise", "sum"),
])
def test_chain_refuses_an_order_that_cannot_run_naming_both(members, first, second):
  with pytest.raises(ConfigError) as e:
    stages.chain(*members())
  message = str(e.value)
  assert repr(first) in message and repr(second) in message and "\n" not in message
  assert message.startswith("chain: ")


def test_the_engine_refuses_a_run_stage_that_cannot_wrap_the_declared_mean():
  # An attack alone hands the stack on to the algorithm's streaming mean: refused when the
  # program is built, naming both.
  config = contract.config_for("fedavg", active_ratio=0.25, rounds=1)
  with pytest.raises(ConfigError, match=r"'mean' reads the running sums but "
                                        r"'attack\[sign_flip\]' hands on the cohort's stack"):
    build(config, attacks.upload_attack("sign_flip", np.zeros(helpers.NUM_CLIENTS, bool),
                                        {"scale": 1.0}))


def test_an_uplink_codec_first_is_carried_by_the_chain():
  codec = compression.qsgd(4, "leaf")
  chained = stages.chain(stages.uplink(codec), median_stage())
  assert chained.codec is codec and chained.consumes == stages.STACK
  assert chained.name == "median"  # its state and keys are the median's
  alone = stages.chain(stages.uplink(codec))
  assert alone.codec is codec and not alone.acts


def test_declared_reductions_never_drop_another_uploads_default():
  """An algorithm declaring some aggregates still averages every other upload."""
  alg = training.build_algorithm(contract.config_for("fednova"), num_clients=8)
  got = alg.aggregations_for(["delta", "a"])
  assert set(got) == {"delta", "tau_eff", "a"}
  assert got["delta"] is alg.aggregate["delta"] and got["tau_eff"] is alg.aggregate["tau_eff"]
  assert got["a"].stage.name == "mean"


@pytest.mark.parametrize("weighting", ["examples", "uniform"])
def test_the_server_update_sees_the_weighting_of_the_mean(weighting):
  alg = training.build_algorithm(contract.config_for("fedavg"), num_clients=8)
  sums = aggregation.ChunkSums({"delta": {"w": jnp.ones(2)}}, {}, jnp.asarray(4.0),
                               jnp.asarray(2.0))
  agg, state, scalars = aggregation.RoundAggregation(alg, weighting=weighting).finish(sums, 8)
  assert agg.weighting == weighting and state == {} and scalars == {}
  np.testing.assert_allclose(agg["delta"]["w"], [0.25, 0.25])


# ---- programs --------------------------------------------------------------------------------
def build(config, stage=None, mesh=MESH):
  """training.build_program with the run's aggregation stage set (RunOptions.aggregator)."""
  fed = helpers.tiny_federation()
  model = helpers.TinyMLP()
  params = model.init(jax.random.PRNGKey(config.seed), fed.dataset.train_x[:1])["params"]
  selection = config_lib.selection(config)
  algorithm = training.build_algorithm(config, fed.num_clients, float(np.mean(fed.client_sizes)))
  compressor = training.uplink_compressor(config)
  members = ([] if compression.is_identity(compressor) else [stages.uplink(compressor)])
  members += [stage] if stage is not None else []
  chain = stages.chain(*members) if members else None
  opts = dataclasses.replace(training.run_options(config, fed), aggregator=chain)
  if selection.fedlama is not None:
    return FedLamaProgram(opts, selection.fedlama, algorithm, model, params, {}, fed, mesh)
  return SyncProgram(opts, algorithm, model, params, {}, fed, mesh)


def _server(program, state):
  return contract._server_and_rows(program, state)  # pylint: disable=protected-access


def _update_norm(config, stage):
  program = build(config, stage)
  state = program.init_state()
  before = np.concatenate([np.ravel(x) for x in jax.tree.leaves(program.params)])
  state, _ = program.run_round(state, 0)
  after = np.concatenate([np.ravel(np.asarray(x))
                          for x in jax.tree.leaves(state["server"].params)])
  return float(np.linalg.norm(after - before))


def test_no_stage_is_the_declaration_and_the_clip_binds():
  config = contract.config_for("fedavg", active_ratio=0.25, local_lr=2.0)
  plain, clipped = _update_norm(config, None), _update_norm(config, clip_stage(1.0))
  assert plain > 1.5, "the run must move further than the clip allows"
  assert clipped <= 1.0 + 1e-5  # a weighted mean of vectors of norm <= 1 (server SGD at 1)
  assert "aggregation" not in build(config).init_state()
  # A stateless chain as the run's stage: the same clip, then the declared mean's equal.
  chained = _update_norm(config, stages.chain(clip_stage(1.0), stages.mean()))
  np.testing.assert_allclose(chained, clipped, rtol=1e-6)


def _cohort_config(name, clients, **overrides):
  return contract.config_for(name, active_ratio=clients / helpers.NUM_CLIENTS, rounds=2,
                             **overrides)


@pytest.mark.slow
def test_median_of_two_clients_is_their_unweighted_mean_and_of_three_is_not():
  two = _cohort_config("fedavg", 2)
  med, _ = helpers.run(build(two, median_stage()))
  uniform, _ = helpers.run(build(_cohort_config("fedavg", 2, weighting="uniform")))
  chex.assert_trees_all_close(med["server"].params, uniform["server"].params, rtol=1e-5,
                              atol=1e-6)
  three = _cohort_config("fedavg", 3)
  med, _ = helpers.run(build(three, median_stage()))
  uniform, _ = helpers.run(build(_cohort_config("fedavg", 3, weighting="uniform")))
  diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(
      jax.tree.leaves(med["server"].params),
      jax.tree.leaves(uniform["server"].params)))
  assert diff > 1e-4


@pytest.mark.parametrize("stage", sorted(STAGES))
@pytest.mark.parametrize("name", _core_first(NAMES))
def test_every_algorithm_runs_the_stage_chunked_as_unchunked(name, stage):
  config = contract.config_for(name, active_ratio=0.25, rounds=2)
  if _refused(name):
    with _refusal(name):
      build(config, STAGES[stage]())
    return
  program = build(config, STAGES[stage]())
  state, outs = helpers.run(program)
  whole = _server(program, state)
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(whole[0]))
  assert all(np.isfinite(o.train_loss) for o in outs)
  chunked = contract.config_for(name, active_ratio=0.25, rounds=2,
                                **{"engine.clients_per_chunk": 3})
  program = build(chunked, STAGES[stage]())
  assert program.chunk_size == 3  # 10 clients: chunks of 3, the last one padded
  state, _ = helpers.run(program)
  chex.assert_trees_all_close(_server(program, state), whole, rtol=1e-5, atol=1e-6)


# ---- a stage with state: checkpointed, restored exactly ---------------------------------------
def momentum_mean(beta: float = 0.5) -> stages.Stage:
  """A test reducer with server state: m <- beta m + mean; the aggregate is m."""
  def server(sums, m, key):
    del key
    mean = jax.tree.map(lambda s: s / jnp.where(sums.weight > 0, sums.weight, 1.0), sums.total)
    m = jax.tree.map(lambda a, b: beta * a + b, m, mean)
    return m, m, {"momentum_norm": tree.global_norm(m)}
  return stages.make("momentum_mean", init=lambda params: jax.tree.map(jnp.zeros_like, params),
                     server=server, consumes=stages.SUMS, reduces=True)


@pytest.mark.parametrize("schedule", ["none", "fedlama"])
def test_stage_state_is_checkpointed_and_restored_exactly(tmp_path, schedule):
  config = contract.config_for("fedavg", schedule == "fedlama", active_ratio=0.25, rounds=3)
  program = build(config, momentum_mean())
  state = program.init_state()
  assert "aggregation" in state
  straight = state
  outs = []
  for r in range(3):
    straight, out = program.run_round(straight, r)
    outs.append(out)
  if schedule == "none":
    assert all(o.extra["aggregator_momentum_norm"] > 0 for o in outs)
  assert_resumes_after_round_zero(program, straight, tmp_path / "ckpt")


def assert_resumes_after_round_zero(program, straight, ckpt_dir, rounds=3):
  """Round 0, an orbax checkpoint and a restore, then the other rounds: bit for bit the
  `straight` state of `rounds` uninterrupted rounds, with stage state that moved."""
  state, _ = program.run_round(program.init_state(), 0)
  ckpt = checkpointing.Checkpointer(str(ckpt_dir))
  ckpt.save(0, state, {"round": 0})
  state, _ = ckpt.restore(0, program.init_state())
  ckpt.close()
  for r in range(1, rounds):
    state, _ = program.run_round(state, r)
  assert contract._bits(state) == contract._bits(straight)  # pylint: disable=protected-access
  assert contract._bits(state["aggregation"]) != contract._bits(  # pylint: disable=protected-access
      program.init_state()["aggregation"])


# ---- the vectorized program ------------------------------------------------------------------
@pytest.mark.parametrize("stage", ["clip", pytest.param("median", marks=pytest.mark.slow),
                                   pytest.param("momentum", marks=pytest.mark.slow)])
def test_vectorized_runs_with_a_stage_equal_sequential_runs(stage):
  make = {**STAGES, "momentum": momentum_mean}[stage]
  configs = [contract.config_for("fedavg", active_ratio=0.25, rounds=2, seed=s, local_lr=lr)
             for s, lr in ((0, 0.2), (1, 0.1))]
  feds = [helpers.tiny_federation(seed=c.seed) for c in configs]
  model = helpers.TinyMLP()
  params = [model.init(jax.random.PRNGKey(c.seed), f.dataset.train_x[:1])["params"]
            for c, f in zip(configs, feds)]
  opts = [dataclasses.replace(training.run_options(c, f), aggregator=make())
          for c, f in zip(configs, feds)]
  algorithm = training.build_algorithm(configs[0], feds[0].num_clients)
  sequential = []
  for o, p, f in zip(opts, params, feds):
    state, _ = helpers.run(SyncProgram(o, algorithm, model, p, {}, f, MESH))
    sequential.append(state)
  vec = VectorizedSyncProgram(opts, algorithm, model, params, [{}] * 2, feds, MESH)
  state, outs = helpers.run(vec)
  if stage == "momentum":
    assert all(o.extra["aggregator_momentum_norm"] > 0 for run_outs in outs for o in run_outs)
  for i, want in enumerate(sequential):
    got = vec.run_state(state, i)
    assert set(got) == set(want)
    chex.assert_trees_all_close(got, jax.tree.map(np.asarray, want), rtol=2e-5, atol=2e-6)


# ---- FedLAMA ---------------------------------------------------------------------------------
@pytest.mark.parametrize("stage", ["clip", pytest.param("median", marks=pytest.mark.slow)])
def test_fedlama_with_phi_one_and_a_stage_is_the_synchronous_run(stage):
  sync = contract.config_for("fedavg", active_ratio=0.25, rounds=3)
  lama = contract.config_for("fedavg", fedlama=True, active_ratio=0.25)
  lama.fedlama.phi = 1
  lama.fedlama.base_interval = lama.local_steps
  lama.fedlama.total_steps = 3 * lama.local_steps
  s_program, l_program = build(sync, STAGES[stage]()), build(lama, STAGES[stage]())
  s_server, _ = _server(s_program, helpers.run(s_program)[0])
  l_server, _ = _server(l_program, helpers.run(l_program)[0])
  chex.assert_trees_all_close(l_server.params, s_server.params, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("stage", sorted(STAGES))
@pytest.mark.parametrize("name", [n if n == "fedavg" else pytest.param(n, marks=pytest.mark.slow)
                                  for n in contract.LAYERWISE])
@pytest.mark.slow
def test_fedlama_runs_the_stage_per_synchronised_layer_set(name, stage):
  config = contract.config_for(name, fedlama=True, active_ratio=0.25)
  if _refused(name, fedlama=True):
    with _refusal(name):
      build(config, STAGES[stage]())
    return
  program = build(config, STAGES[stage]())
  state, outs = helpers.run(program)
  server, _ = _server(program, state)
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(server.params))


# ---- 8 devices -------------------------------------------------------------------------------
def _cases(names):
  return [f"{n}:{s}" for n in names if not _refused(n) for s in sorted(STAGES)]


def worker(out_path, mesh_size, cases):
  """Subprocess entry: every case ("fedavg:clip") on a mesh of the first `mesh_size` devices
  (0: all of them); FEDJAX_TEST_CPU_DEVICES set this process's CPU devices (on import)."""
  assert jax.device_count() == int(os.environ["FEDJAX_TEST_CPU_DEVICES"]), jax.devices()
  mesh = sharding.client_mesh(jax.devices()[:mesh_size] if mesh_size else None)
  report = {}
  for case in cases:
    name, stage = case.split(":")
    config = contract.config_for(name, active_ratio=9 / helpers.NUM_CLIENTS,
                                 weighting="uniform")
    program = build(config, STAGES[stage](), mesh)
    state, outs = helpers.run(program)
    server, rows = _server(program, state)
    report[case] = {"params": [np.asarray(p).tolist() for p in
                               jax.tree.leaves((server, rows))],
                    "loss": [o.train_loss for o in outs]}
  pathlib.Path(out_path).write_text(json.dumps(report))


def _spawn(out, mesh_size, cases, module="tests.test_aggregation_stage"):
  env = dict(os.environ, JAX_PLATFORMS="cpu", FEDJAX_TEST_CPU_DEVICES="8",
             XLA_FLAGS=("--xla_backend_optimization_level=0 "
                        "--xla_llvm_disable_expensive_passes=true"),
             PYTHONPATH=os.pathsep.join([str(REPO)] + [
                 p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
  return subprocess.Popen(
      [sys.executable, "-m", module, str(out), str(mesh_size), *cases],
      cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def eight_vs_one(out_dir, cases, module="tests.test_aggregation_stage"):
  """`module`'s cases (its __main__ writes them) on 1 and on 8 CPU devices, two subprocesses:
  the two reports (one, many)."""
  procs = {"one": _spawn(out_dir / "one.json", 1, cases, module),
           "many": _spawn(out_dir / "many.json", 0, cases, module)}
  for label, proc in procs.items():
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, f"{label} run failed:\n{err[-4000:]}"
  return tuple(json.loads((out_dir / f"{n}.json").read_text()) for n in ("one", "many"))


def check_eight_equal_one(one, many, case):
  a = [np.asarray(p, np.float32) for p in one[case]["params"]]
  b = [np.asarray(p, np.float32) for p in many[case]["params"]]
  scale = max(float(np.max(np.abs(x))) for x in a)
  assert scale > 0.01
  assert max(float(np.max(np.abs(x - y))) for x, y in zip(a, b)) <= 1e-5 * max(1.0, scale)
  np.testing.assert_allclose(many[case]["loss"], one[case]["loss"], rtol=1e-5)


@pytest.fixture(scope="module")
def eight_core(tmp_path_factory):
  return eight_vs_one(tmp_path_factory.mktemp("agg8"), _cases(CORE))


@pytest.fixture(scope="module")
def eight_rest(tmp_path_factory):
  return eight_vs_one(tmp_path_factory.mktemp("agg8rest"),
                       _cases([n for n in NAMES if n not in CORE]))


@pytest.mark.slow
@pytest.mark.parametrize("case", _cases(CORE))
def test_eight_devices_equal_one(eight_core, case):
  check_eight_equal_one(*eight_core, case)


@pytest.mark.slow
@pytest.mark.parametrize("case", _cases([n for n in NAMES if n not in CORE]))
def test_eight_devices_equal_one_for_every_other_algorithm(eight_rest, case):
  check_eight_equal_one(*eight_rest, case)


if __name__ == "__main__":
  worker(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
