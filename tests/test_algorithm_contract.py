"""The contract every registered algorithm keeps, driven by one table (and FedLAMA over each
layer-wise one).

For every algorithm of fedjax_lama.registry (new ones join automatically; the
traffic table below must then name them):
- a few rounds on a tiny federation run, and an interrupted-then-resumed run (orbax
  checkpoint, fresh program) ends with bit-identical parameters, server state and rows;
- nothing compiles after the first round;
- rows of clients never sampled are bit-for-bit unchanged, rows of sampled ones moved;
- communication per round is each algorithm's floats up and down per participant;
- padded clients, steps and examples change nothing (engine level);
- chunked rounds equal unchunked ones;
- 8 fake CPU devices equal 1 (one subprocess per mesh, all algorithms in it);
- the costliest of these (padding, chunking, FedLAMA at phi = 1 and its resume, 8 devices)
  for a core of algorithms in the default suite and for every algorithm under `-m slow`
  (CORE below);
- FedLAMA over the algorithm: phi = 1 is the algorithm itself (local momentum 0.9, the
  local optimizer's state started afresh each round under both), a phi = 2 run resumes
  exactly and compiles once; combinations that cannot work stop with a ConfigError naming
  both fields.

Every run here uses local momentum 0.9 (the algorithms whose local optimizer is adaptive
refuse SGD momentum and run without it).
"""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_lama import algorithms, checkpointing
from fedjax_lama import config as config_lib
from fedjax_lama import registry, training
from fedjax_lama.engine import cohort as cohort_lib, local, sharding, sync_round
from tests import test_sharding as helpers
from tests.conftest import counting_compilations

MESH = sharding.client_mesh(jax.devices()[:1])

# Non-trivial settings per algorithm (defaults otherwise), so every extra term is exercised.
HPARAMS = {
    "fedprox": {"mu": 0.1},
    "scaffold": {"option": "II"},
    "feddyn": {"alpha": 0.1},
    "fedcm": {"alpha": 0.5},
    "fedadmm": {"rho": 0.1},
    "fednova": {"mu": 0.05},
    "perfedavg": {"variant": "hf"},  # the Hessian-vector product under vmap, scan and sharding
}
COMMON = {"fedadam": {"server_lr": 0.03}, "fedyogi": {"server_lr": 0.03},
          "fedadagrad": {"server_lr": 0.03},
          # Adaptive local optimizers have their own first moment instead of SGD momentum
          # (they refuse config.local_momentum > 0).
          "fedams": {"local_momentum": 0.0, "local_lr": 0.01},
          "fedlamb": {"local_momentum": 0.0, "local_lr": 0.01}}

# Floats per participating client and round, in units of d (number of parameters),
# plus scalars: (up in d, up scalars, down in d). Bits of compressed uploads are checked
# separately (fedpaq, fedcom: 32 L + d (1 + ceil(log2(s + 1)))).
TRAFFIC = {
    "fedavg": (1, 0, 1), "fedprox": (1, 0, 1), "scaffold": (2, 0, 2), "fednova": (1, 1, 1),
    "fedavgm": (1, 0, 1), "fedadam": (1, 0, 1), "fedyogi": (1, 0, 1), "fedadagrad": (1, 0, 1),
    "feddyn": (1, 0, 1), "fedcm": (1, 0, 2), "fedadmm": (1, 0, 1), "fedsgd": (1, 0, 1),
    "fedpaq": (1, 0, 1), "fedcom": (1, 0, 1), "fedspeed": (1, 0, 1), "fedlamb": (2, 0, 2),
    "fedams": (2, 0, 2),
    "fedsam": (1, 0, 1), "mofedsam": (1, 0, 2), "fedsmoo": (2, 0, 2), "fedgamma": (2, 0, 2),
    "fedexp": (1, 1, 1),
    "ditto": (1, 0, 1), "apfl": (1, 0, 1), "pfedme": (1, 0, 1), "perfedavg": (1, 0, 1),
    # k = 2 cluster models down; the delta and the chosen cluster's index up.
    "hypcluster": (1, 1, 2),
}
QUANTIZED = {"fedpaq", "fedcom"}


def _size(tree) -> int:
  return int(sum(np.size(x) for x in jax.tree.leaves(tree)))


def _keeps_on_clients(*layers):
  """The traffic of a method whose `layers` (of helpers.TinyMLP) never leave the clients:
  (floats up, scalars up, floats down) per participant, the other layers each way."""
  def floats(params):
    shared = _size(params) - sum(_size(params[layer]) for layer in layers)
    return shared, 0, shared
  return floats


# The personalization methods by layer partition, in floats (TinyMLP: Dense_0 then the head
# Dense_1; no normalization layer, so FedBN sends the whole model).
TRAFFIC.update({"fedper": _keeps_on_clients("Dense_1"), "fedrep": _keeps_on_clients("Dense_1"),
                "lg_fedavg": _keeps_on_clients("Dense_0"), "fedbn": (1, 0, 1),
                # FedBABU's head (Dense_1) never moves, so it never travels.
                "fedbabu": _keeps_on_clients("Dense_1")})

NAMES = sorted(registry.SPECS)

# The costliest checks (resume, padding, chunking, FedLAMA's resume, 8 devices) run in the
# default suite for a core that spans the engine's features -- no state, per-client rows and
# server state (SCAFFOLD), an adaptive local optimizer with its own server state (Fed-LAMB)
# -- and for every algorithm with `python -m pytest -m slow` (a server optimizer, FedAdam,
# two gradients per step, FedSpeed, a compressed upload, FedPAQ, and a context-dependent
# gradient, FedSMOO, among them; their own files check them in the default suite). 8
# devices: FedAvg and its FedLAMA schedule in the default suite.
CORE = ("fedavg", "scaffold", "fedlamb")
SHARDED_CORE = ("fedavg",)


def _core_first(names, core=CORE):
  """`names` as pytest parameters, those outside `core` marked slow."""
  return [n if n in core else pytest.param(n, marks=pytest.mark.slow) for n in names]


def _layerwise(name: str) -> bool:
  return algorithms.layerwise(name) is True


LAYERWISE = [n for n in NAMES if _layerwise(n)]
NOT_LAYERWISE = [n for n in NAMES if not _layerwise(n)]


def config_for(name: str, fedlama: bool = False, **overrides):
  """A tiny config of algorithm `name` (under the FedLAMA schedule if asked)."""
  c = helpers.tiny_config(**{"local_momentum": 0.9, **overrides})
  return with_algorithm(c, name, fedlama)


def with_algorithm(c, name: str, fedlama: bool = False):
  """`c` running algorithm `name` with the table's settings (HPARAMS, COMMON)."""
  c.algorithm = name
  for key, value in HPARAMS.get(name, {}).items():
    c[name][key] = value
  for key, value in COMMON.get(name, {}).items():
    c[key] = value
  if fedlama:
    c.schedule = "fedlama"
  return c


def _host(tree):
  return jax.tree.map(lambda x: np.asarray(sharding.to_host(x)), tree)


def _bits(tree):
  return [np.asarray(x).tobytes() for x in jax.tree.leaves(_host(tree))]


class _Compiles:
  """Counts XLA backend compilations while active."""

  def __init__(self):
    self.names = []

  def __call__(self, event, duration, **kwargs):
    del duration
    if event == "/jax/core/compile/backend_compile_duration":
      self.names.append(kwargs.get("fun_name", "?"))

  def __enter__(self):
    self._uncached = counting_compilations()
    self._uncached.__enter__()
    jax.monitoring.register_event_duration_secs_listener(self)
    return self

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_duration_listener(self)
    self._uncached.__exit__(*exc)


def _server_and_rows(program, state):
  server = state["fedlama"].server if "fedlama" in state else state["server"]
  rows = program.store.to_numpy() if program.store is not None else {}
  return _host(server), rows


def _run_resumed(config, tmp_path, rounds=3, stop_after=1):
  """`run_resumed` of the program `config` builds."""
  return run_resumed(helpers.build(config, MESH), tmp_path, rounds, stop_after)


def run_resumed(program, tmp_path, rounds=3, stop_after=1):
  """Rounds straight through (counting compilations after round 1), then the same run
  checkpointed after `stop_after` rounds and resumed from the checkpoint into a new state:
  "straight" and "resumed" are (server state, rows) on the host.

  One program serves both runs (its jitted functions compile once): init_state() starts a
  new store and state, as a new process would, and restoring hands the checkpoint's rows
  to it."""
  state = program.init_state()
  initial_rows = program.store.to_numpy() if program.store is not None else {}
  outs, sampled = [], set()
  with _Compiles() as later:
    for r in range(rounds):
      if r == 1:
        later.names.clear()
      state, out = program.run_round(state, r)
      outs.append(out)
  straight = _server_and_rows(program, state)
  later_compiles = list(later.names)
  for r in range(rounds):
    sampled |= set(np.asarray(program.opts.sampler.sample(r)).tolist())

  state = program.init_state()
  for r in range(stop_after):
    state, _ = program.run_round(state, r)
  ckpt = checkpointing.Checkpointer(str(tmp_path / "ckpt"))
  ckpt.save(stop_after - 1, state, {"round": stop_after - 1})
  state, _ = ckpt.restore(stop_after - 1, program.init_state())
  ckpt.close()
  for r in range(stop_after, rounds):
    state, _ = program.run_round(state, r)
  return {"straight": straight, "resumed": _server_and_rows(program, state), "outs": outs,
          "compiles": later_compiles, "initial_rows": initial_rows, "sampled": sorted(sampled),
          "program": program}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  cache = {}

  def get(name, fedlama=False):
    if (name, fedlama) not in cache:
      config = config_for(name, fedlama, active_ratio=0.25, rounds=3)
      if fedlama:
        config.fedlama.total_steps = 3 * config.fedlama.phi * config.fedlama.base_interval
      cache[name, fedlama] = _run_resumed(config, tmp_path_factory.mktemp(name))
    return cache[name, fedlama]

  return get


@pytest.mark.parametrize("name", _core_first(NAMES))
def test_resume_compiles_rows_and_traffic(runs, name):
  run = runs(name)
  server, rows = run["straight"]
  assert _bits(run["resumed"]) == _bits(run["straight"]), "resumed run differs"
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(server))
  assert run["compiles"] == [], f"recompiled after round 1: {run['compiles']}"
  if rows:
    never = np.setdiff1d(np.arange(helpers.NUM_CLIENTS), run["sampled"])
    assert len(never) > 0
    pick = lambda tree, ids: jax.tree.map(lambda a: a[ids], tree)
    assert _bits(pick(rows, never)) == _bits(pick(run["initial_rows"], never))
    assert _bits(pick(rows, run["sampled"])) != _bits(pick(run["initial_rows"], run["sampled"]))
  # The traffic per participant of TRAFFIC.
  program = run["program"]
  d = sum(np.size(x) for x in jax.tree.leaves(program.params))
  if callable(TRAFFIC[name]):  # floats, not multiples of d
    up, up_scalars, down = TRAFFIC[name](program.params)
    assert 0 < up < d and 0 < down < d
    for out in run["outs"]:
      m = out.extra["clients"]
      assert int(out.floats_up_per_layer.sum()) + out.floats_up_other == m * (up + up_scalars)
      assert int(out.floats_down_per_layer.sum()) + out.floats_down_other == m * down
      assert out.bits_up == m * 32 * (up + up_scalars)
    return
  up_d, up_scalars, down_d = TRAFFIC[name]
  for out in run["outs"]:
    m = out.extra["clients"]
    assert int(out.floats_up_per_layer.sum()) + out.floats_up_other == m * (up_d * d + up_scalars)
    assert int(out.floats_down_per_layer.sum()) + out.floats_down_other == m * down_d * d
    leaves = len(jax.tree.leaves(program.params))
    per_float = 1 + int(np.ceil(np.log2(16 + 1))) if name in QUANTIZED else 32
    scalar_bits = 32 * up_scalars
    header = 32 * leaves if name in QUANTIZED else 0
    assert out.bits_up == m * (up_d * (header + d * per_float) + scalar_bits)


@pytest.mark.parametrize("name", _core_first(LAYERWISE))
def test_fedlama_over_the_algorithm_resumes_and_compiles_once(runs, name):
  run = runs(name, fedlama=True)
  assert _bits(run["resumed"]) == _bits(run["straight"])
  assert run["compiles"] == [], f"recompiled after window 1: {run['compiles']}"
  entry = TRAFFIC[name]
  up_d, _, down_d = entry(run["program"].params) if callable(entry) else entry
  for out in run["outs"]:
    # Each synchronisation moves the due leaves of every model-shaped message.
    assert int(out.floats_up_per_layer.sum()) * down_d == int(
        out.floats_down_per_layer.sum()) * up_d


@pytest.mark.parametrize("name", _core_first(LAYERWISE))
def test_fedlama_with_phi_one_is_the_algorithm(runs, name):
  """With local momentum 0.9 (0 for the adaptive local optimizers, which refuse it)."""
  lama = config_for(name, fedlama=True, active_ratio=0.25)
  assert lama.local_momentum == COMMON.get(name, {}).get("local_momentum", 0.9)
  assert lama.local_optimizer_state == "reset"  # the default, with and without the schedule
  lama.fedlama.phi = 1
  lama.fedlama.base_interval = lama.local_steps
  lama.fedlama.total_steps = 3 * lama.local_steps
  program = helpers.build(lama, MESH)
  s_server, s_rows = runs(name)["straight"]
  l_server, l_rows = _server_and_rows(program, helpers.run(program)[0])
  chex.assert_trees_all_close((l_server.params, l_server.opt_state, l_server.extra, l_rows),
                              (s_server.params, s_server.opt_state, s_server.extra, s_rows),
                              rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", NAMES)
def test_carried_local_optimizer_state_needs_the_schedule(name):
  """Synchronous rounds start every local optimizer afresh: "carry" without the FedLAMA
  schedule is refused naming both fields."""
  c = config_for(name)
  c.local_optimizer_state = "carry"
  with pytest.raises(config_lib.ConfigError,
                     match=r"config\.local_optimizer_state='carry'.*config\.schedule='none'"):
    config_lib.validate(c)


@pytest.mark.parametrize("name", NOT_LAYERWISE)
def test_fedlama_refuses_what_cannot_work_naming_both_fields(name):
  c = config_for(name, fedlama=True)
  with pytest.raises(config_lib.ConfigError, match=r"config\.schedule.*config\.algorithm"):
    config_lib.validate(c)


def test_fedlama_refuses_server_state_that_is_not_per_layer():
  c = config_for("fedadam", fedlama=True)
  c.fedadam.variant = "optax"  # optax.adam keeps one step counter for the whole model
  with pytest.raises(config_lib.ConfigError, match=r"config\.schedule.*config\.algorithm"):
    helpers.build(c, MESH)


def test_fedlama_refuses_per_client_state_with_per_sub_round_sampling():
  c = config_for("scaffold", fedlama=True)
  c.fedlama.client_sampling = "round"
  with pytest.raises(config_lib.ConfigError, match=r"fedlama\.client_sampling.*scaffold"):
    helpers.build(c, MESH)


# ---- padding and chunking -------------------------------------------------------------------
C, S, B, NDATA = 4, 3, 4, 60


def _engine_round(alg, cohorts, population=8):
  """Two rounds of the bare engine (make_round_fns) on a tiny MLP; returns server and rows."""
  model = helpers.TinyMLP()
  r = np.random.default_rng(0)
  data_x = jnp.asarray(r.normal(size=(NDATA, 2, 2, 1)).astype(np.float32))
  data_y = jnp.asarray(r.integers(0, 3, NDATA).astype(np.int32))
  params = model.init(jax.random.PRNGKey(0), data_x[:1])["params"]
  train_chunk, server_update = sync_round.make_round_fns(
      local.make_loss_fn(model, False), alg, optax.constant_schedule(0.1), seed=3,
      weighting="examples", local_steps=cohorts[0].indices.shape[1], population=population)
  server = alg.server.init(params, {})
  template = alg.row_init(params) if alg.row_init is not None else {}
  store = jax.tree.map(lambda x: jnp.stack([x] * population), template)
  for rnd, cohort in enumerate(cohorts):
    rows = cohort_lib.gather_rows(store, cohort.client_ids % population) if template else {}
    sums, new_rows, _ = train_chunk(server, rows, data_x, data_y, cohort, rnd)
    if template:
      store = cohort_lib.scatter_rows(store, cohort.client_ids, cohort.client_mask, new_rows)
    server = server_update(server, sums)
  return _host(server), _host(store)


def _cohort(idx, example_mask=None, step_mask=None, client_mask=None, ids=None, sizes=None):
  c, s, b = idx.shape
  return cohort_lib.Cohort(
      jnp.asarray(idx, jnp.int32),
      jnp.asarray(np.ones((c, s, b)) if example_mask is None else example_mask, jnp.float32),
      jnp.asarray(np.ones((c, s)) if step_mask is None else step_mask, jnp.float32),
      jnp.asarray(np.ones(c) if client_mask is None else client_mask, jnp.float32),
      jnp.asarray(np.arange(c) if ids is None else ids, jnp.int32),
      jnp.asarray(np.arange(10.0, 10.0 + c) if sizes is None else sizes, jnp.float32))


def _padded_variant():
  """The base cohort, and the same clients with 2 padded clients, 2 padded steps and 3 padded
  examples per batch added (garbage indices under zero masks)."""
  r = np.random.default_rng(1)
  idx = r.integers(0, NDATA, size=(C, S, B))
  padded = r.integers(0, NDATA, size=(C + 2, S + 2, B + 3))
  padded[:C, :S, :B] = idx
  example_mask = np.zeros((C + 2, S + 2, B + 3))
  example_mask[:C, :S, :B] = 1
  step_mask = np.zeros((C + 2, S + 2))
  step_mask[:C, :S] = 1
  sizes = np.arange(10.0, 10.0 + C)
  base = _cohort(idx, sizes=sizes)
  return base, _cohort(padded, example_mask, step_mask, client_mask=[1] * C + [0, 0],
                       ids=[0, 1, 2, 3, 5, 6], sizes=np.concatenate([sizes, [7.0, 9.0]]))


@pytest.mark.parametrize("name", _core_first(NAMES))
def test_padded_clients_steps_and_examples_change_nothing(name):
  alg = training.build_algorithm(config_for(name), num_clients=8)
  base, padded = _padded_variant()
  want = _engine_round(alg, [base, base])
  got = _engine_round(alg, [padded, padded])
  chex.assert_trees_all_close(got, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", _core_first(NAMES))
def test_chunked_rounds_equal_one_chunk(runs, name):
  config = config_for(name, active_ratio=0.25, rounds=3, **{"engine.clients_per_chunk": 3})
  program = helpers.build(config, MESH)
  assert program.chunk_size == 3
  state, _ = helpers.run(program)
  chex.assert_trees_all_close(_server_and_rows(program, state), runs(name)["straight"],
                              rtol=1e-5, atol=1e-6)


# ---- 8 devices ------------------------------------------------------------------------------
def _sharded_cases(names):
  return [f"algo-{n}:9" for n in names] + [f"lama-{n}:9" for n in LAYERWISE if n in names]


SHARDED_REST = [n for n in NAMES if n not in SHARDED_CORE]


@pytest.fixture(scope="module")
def sharded_core(tmp_path_factory):
  return helpers.eight_devices_vs_one(tmp_path_factory.mktemp("contract"),
                                      _sharded_cases(SHARDED_CORE))


@pytest.fixture(scope="module")
def sharded_rest(tmp_path_factory):
  return helpers.eight_devices_vs_one(tmp_path_factory.mktemp("contract_rest"),
                                      _sharded_cases(SHARDED_REST))


def _check_sharded(r):
  assert r["max_abs"] > 0.01
  assert r["max_abs_diff"] <= 1e-5 * max(1.0, r["max_abs"]), r
  np.testing.assert_allclose(r["loss_many"], r["loss_1"], rtol=1e-5)


@pytest.mark.parametrize("case", _sharded_cases(SHARDED_CORE))
def test_eight_devices_equal_one(sharded_core, case):
  _check_sharded(sharded_core[case])


@pytest.mark.slow
@pytest.mark.parametrize("case", _sharded_cases(SHARDED_REST))
def test_eight_devices_equal_one_for_every_other_algorithm(sharded_rest, case):
  _check_sharded(sharded_rest[case])
