"""User-level DP wired into runs: config.privacy -> the run's aggregation stage -> records.

Checked:
- a DP run's dp_epsilon after every evaluation (metrics.jsonl) and its summary equal
  accounting's figure for its (q, sigma, T), Poisson and fixed-size cohorts;
- sigma = 0 is exactly numpy's clip-then-sum over the expected cohort of the clients' deltas,
  the deltas recorded by the same program under a whole-cohort stage;
- chunked rounds equal one chunk, and a Poisson draw above the chunk capacity trains every
  sampled client;
- FedAvg, FedAvgM, FedAdam and FedProx accept DP;
- every refusal is one line naming the field.
Resuming (adaptive clipping included), compiling once, 8 devices and the refusals through the
command line, over every algorithm of the contract table: tests/test_privacy_contract.py.
"""
import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from fedjax_lama import compression, training
from fedjax_lama.engine import sharding, stages
from fedjax_lama.errors import ConfigError
from fedjax_lama.privacy import accounting, mechanisms
from fedjax_lama.privacy import dp_stage as privacy_stage
from fedjax_lama.privacy.dp_options import AdaptiveClipOptions, DpOptions, SamplingOptions
from fedjax_lama.programs.sync import SyncProgram
from fedjax_lama.robust import defences
from fedjax_lama.run import spec as spec_lib
from tests import test_algorithm_contract as contract
from tests import test_sharding as helpers
from tests.test_training import _metrics as _rows  # pylint: disable=protected-access
from tests.test_training import tiny_config

MESH = sharding.client_mesh(jax.devices()[:1])


def dp_config(sigma=2.0, adaptive=False, **overrides):
  """tiny_config (8 clients) with uniform weights, Poisson q = 0.5 and DP on."""
  c = tiny_config(**{"weighting": "uniform", "client_sampling": "bernoulli",
                     "active_ratio": 0.5, **overrides})
  c.privacy.enabled = True
  c.privacy.noise_multiplier = sigma
  c.privacy.clip_norm = 0.5
  if adaptive:
    c.privacy.adaptive.enabled = True
    c.privacy.adaptive.count_stddev = 2.0
  return c


def _summary(workdir):
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  summary.pop("wall_seconds")
  return summary


# ---- the reported guarantee --------------------------------------------------------------------
@pytest.mark.parametrize("sampling", ["bernoulli", "fixed"])
@pytest.mark.slow
def test_reported_epsilon_equals_accountings(tmp_path, sampling):
  c = dp_config(client_sampling=sampling)
  summary = training.train_and_evaluate(c, str(tmp_path))
  expected = (SamplingOptions("poisson", 8, rate=0.5) if sampling == "bernoulli"
              else SamplingOptions("fixed", 8, cohort_size=4))
  rows = _rows(tmp_path)
  assert [r["round"] for r in rows] == [2, 4]
  for r in rows:
    figure = accounting.epsilon(expected, 2.0, r["round"], 1e-5, "rdp").epsilon
    assert r["dp_epsilon"] == figure
  assert rows[0]["dp_epsilon"] < rows[1]["dp_epsilon"]
  privacy = summary["privacy"]
  assert privacy["epsilon"] == rows[-1]["dp_epsilon"]
  assert privacy["delta"] == 1e-5 and privacy["accountant"] == "rdp"
  assert privacy["library"] == "dp-accounting"
  assert privacy["library_version"] == accounting.LIBRARY_VERSION
  assert privacy["adjacency"] == ("add_or_remove_one" if sampling == "bernoulli"
                                  else "replace_one")
  assert privacy["sampling"] == ("poisson" if sampling == "bernoulli"
                                 else "fixed_size_without_replacement")
  assert _summary(tmp_path)["privacy"] == privacy


@pytest.mark.slow
def test_target_epsilon_is_calibrated_for_the_configured_rounds():
  c = dp_config()
  c.privacy.noise_multiplier = None
  c.privacy.target_epsilon = 3.0
  options = spec_lib.build_spec(c).records.privacy
  sampling = SamplingOptions("poisson", 8, rate=0.5)
  assert options.noise_multiplier == accounting.calibrate_noise_multiplier(
      sampling, 3.0, 1e-5, c.rounds, "rdp")
  assert accounting.epsilon(sampling, options.noise_multiplier, c.rounds, 1e-5).epsilon <= 3.0


def test_a_run_without_privacy_has_no_stage_and_no_epsilon():
  spec = spec_lib.build_spec(tiny_config())
  assert spec.options.aggregator is None and spec.records.privacy is None
  assert spec_lib.run_chain(spec, spec.federation.num_clients) is None


# ---- the stage on recorded uploads -------------------------------------------------------------
def _program(config, stage):
  fed = helpers.tiny_federation()
  model = helpers.TinyMLP()
  params = model.init(jax.random.PRNGKey(config.seed), fed.dataset.train_x[:1])["params"]
  algorithm = training.build_algorithm(config, fed.num_clients, float(np.mean(fed.client_sizes)))
  compressor = training.uplink_compressor(config)
  members = [] if compression.is_identity(compressor) else [stages.uplink(compressor)]
  members += [stage] if stage is not None else []
  opts = dataclasses.replace(training.run_options(config, fed),
                             aggregator=stages.chain(*members) if members else None)
  return SyncProgram(opts, algorithm, model, params, {}, fed, MESH)


def _recorded_deltas(config):
  """Round 0's per-client deltas [C, ...] and the client mask, from the same program with a
  whole-cohort stage (the engine stacks the model uploads for it)."""
  program = _program(config, defences.build("median", 0))
  state = program.init_state()
  ids = program.opts.sampler.sample(0)
  assert len(ids) <= program.chunk_size
  from fedjax_lama.programs.round_program import pack  # pylint: disable=g-import-not-at-top
  packed = pack(program.opts, program.fed, ids, 0, program.chunk_size, program.num_steps)
  cohort = sharding.shard_clients(packed, program.mesh)
  sums, _, _ = program.train_chunk(state["server"], {}, program.data_x, program.data_y, cohort,
                                   0)
  stack = sums.stacks["delta"]
  return jax.tree.map(np.asarray, stack.values), np.asarray(stack.mask), len(ids)


@pytest.mark.parametrize("sampling", ["bernoulli", "fixed"])
def test_sigma_zero_is_numpy_clip_then_sum_over_the_expected_cohort(sampling):
  config = contract.config_for("fedavg", weighting="uniform", client_sampling=sampling,
                               active_ratio=0.25, local_lr=1.0)
  deltas, mask, drawn = _recorded_deltas(config)
  assert drawn >= 2
  n = helpers.NUM_CLIENTS
  clip = 0.3
  options = DpOptions(0.0, clip, spec_lib.sampling_options(config))
  leaves, treedef = jax.tree.flatten(deltas)
  norms = np.sqrt(sum(np.sum(np.square(x.reshape(x.shape[0], -1).astype(np.float64)), axis=1)
                      for x in leaves))
  assert np.sum((norms > clip) & (mask > 0)) >= 1, "the clip must bind for some client"
  scale = np.minimum(1.0, clip / np.maximum(norms, 1e-30)) * mask
  expected_cohort = 0.25 * n
  expected = [np.tensordot(scale, x.astype(np.float64), axes=1) / expected_cohort
              for x in leaves]

  program = _program(config, mechanisms.user_level_dp(options))
  state = program.init_state()
  before = jax.tree.leaves(program.params)
  state, out = program.run_round(state, 0)
  assert out.extra["clients"] == drawn
  after = jax.tree.leaves(state["server"].params)  # FedAvg: server SGD at 1 on the aggregate
  for b, a, e in zip(before, after, expected):
    np.testing.assert_allclose(np.asarray(a) - np.asarray(b), e, rtol=2e-5, atol=2e-7)
  assert treedef == jax.tree.structure(state["server"].params)


# ---- chunks ------------------------------------------------------------------------
def _params_after(config, options, rounds=2):
  program = _program(config, mechanisms.user_level_dp(options))
  state, outs = helpers.run(program, rounds)
  return state["server"].params, outs, program


def test_chunked_equals_unchunked_and_a_large_draw_trains_every_sampled_client():
  base = dict(weighting="uniform", client_sampling="bernoulli", active_ratio=0.25)
  one = contract.config_for("fedavg", **base)
  chunked = contract.config_for("fedavg", **base, **{"engine.clients_per_chunk": 3})
  options = DpOptions(1.0, 0.5, spec_lib.sampling_options(one),
                      adaptive=AdaptiveClipOptions(count_stddev=2.0))
  p1, outs1, _ = _params_after(one, options)
  p2, outs2, program = _params_after(chunked, options)
  draws = [len(program.opts.sampler.sample(r)) for r in range(2)]
  assert max(draws) > program.chunk_size, "a draw must exceed the chunk capacity"
  assert [o.extra["clients"] for o in outs2] == draws
  assert [o.train_count for o in outs1] == [o.train_count for o in outs2]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), p1, p2)


# ---- algorithms ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["fedavg", "fedavgm", "fedadam", "fedprox"])
@pytest.mark.slow
def test_algorithms_that_upload_the_delta_alone_accept_dp(name):
  config = contract.config_for(name, weighting="uniform", client_sampling="bernoulli",
                               active_ratio=0.25, num_clients=helpers.NUM_CLIENTS)
  config.privacy.enabled = True
  config.privacy.noise_multiplier = 1.0
  fed = helpers.tiny_federation()
  model = helpers.TinyMLP()
  params = model.init(jax.random.PRNGKey(0), fed.dataset.train_x[:1])["params"]
  program = training.build_program(config, model, params, {}, fed, MESH)
  assert program.opts.aggregator.name == mechanisms.STAGE_NAME
  state, outs = helpers.run(program, 2)
  assert "aggregation" in state and all(np.isfinite(o.train_loss) for o in outs)
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(state["server"].params))


def test_per_layer_shares_need_one_per_leaf():
  config = contract.config_for("fedavg", weighting="uniform", num_clients=helpers.NUM_CLIENTS)
  config.privacy.enabled = True
  config.privacy.noise_multiplier = 1.0
  config.privacy.clipping = "per_layer"
  config.privacy.layer_split = "0.5,0.5"  # TinyMLP has four leaves
  fed = helpers.tiny_federation()
  model = helpers.TinyMLP()
  params = model.init(jax.random.PRNGKey(0), fed.dataset.train_x[:1])["params"]
  with pytest.raises(ConfigError, match=r"config\.privacy\.layer_split='0\.5,0\.5' .*4 leaves"):
    training.build_program(config, model, params, {}, fed, MESH)
  config.privacy.layer_split = "0.25,0.25,0.25,0.25"
  assert training.build_program(config, model, params, {}, fed, MESH).opts.aggregator


@pytest.mark.parametrize("name,extra", [("scaffold", "'dc'"), ("fednova", "'a'"),
                                        ("fedlamb", "'v'"), ("fedexp", "'sq_norm'")])
def test_algorithms_with_more_uploads_are_refused_naming_them(name, extra):
  config = contract.config_for(name, weighting="uniform", num_clients=helpers.NUM_CLIENTS)
  config.privacy.enabled = True
  config.privacy.noise_multiplier = 1.0
  fed = helpers.tiny_federation()
  model = helpers.TinyMLP()
  params = model.init(jax.random.PRNGKey(0), fed.dataset.train_x[:1])["params"]
  with pytest.raises(ConfigError, match=rf"config.algorithm='{name}' .*uploads .*{extra}"):
    training.build_program(config, model, params, {}, fed, MESH)


# ---- refusals -----------------------------------------------------------------------------------
REFUSALS = [
    ({"weighting": "examples"}, r"config\.weighting='examples'.*accepted: 'uniform'"),
    ({"schedule": "fedlama"}, r"config\.schedule='fedlama'"),
    ({"privacy.noise_multiplier": -1.0}, r"config\.privacy\.noise_multiplier=-1\.0"),
    ({"privacy.clip_norm": 0.0}, r"config\.privacy\.clip_norm=0\.0"),
    ({"privacy.delta": 1.0}, r"config\.privacy\.delta=1\.0"),
    ({"privacy.accountant": "pld", "client_sampling": "fixed"}, r"config\.privacy\.accountant"),
    ({"privacy.target_epsilon": 2.0}, r"set exactly one of them"),
    ({"privacy.clipping": "per_layer", "privacy.layer_split": "a,b"},
     r"config\.privacy\.layer_split='a,b'"),
]


@pytest.mark.parametrize("overrides,message", REFUSALS, ids=[m for _, m in REFUSALS])
def test_refusals_name_the_field(overrides, message):
  c = dp_config()
  c.update_from_flattened_dict(overrides)
  with pytest.raises(ConfigError, match=message) as info:
    spec_lib.build_spec(c)
  assert "\n" not in str(info.value)


def test_dp_on_the_simulated_clock_is_refused():
  # build_spec passes the run's mode; a clock config valid in every other respect gets here.
  with pytest.raises(ConfigError, match=r"config\.privacy\.enabled=True .*simulated clock"):
    spec_lib.privacy_options(dp_config(), "clock")


def test_sigma_zero_reports_no_epsilon():
  c = dp_config(sigma=0.0)
  options = spec_lib.build_spec(c).records.privacy
  assert privacy_stage.epsilon_after(options, 3) is None
  assert privacy_stage.epsilon_after(dataclasses.replace(options, noise_multiplier=1.0), 3) > 0


def test_a_workdir_from_before_the_privacy_section_still_resumes(tmp_path):
  c = tiny_config()
  old = dict(spec_lib.build_spec(c).records.config_json)
  del old["privacy"]  # config.json written before config.privacy existed
  (tmp_path / "config.json").write_text(json.dumps(old))
  assert training.check_workdir(str(tmp_path), c) is None
  c.privacy.enabled = True
  c.privacy.noise_multiplier = 1.0
  c.weighting = "uniform"
  with pytest.raises(ConfigError, match=r"different config \(fields: privacy, weighting\)"):
    training.check_workdir(str(tmp_path), c)


@pytest.mark.slow
def test_a_run_calibrated_to_a_target_epsilon_is_not_extended(tmp_path):
  c = dp_config()
  c.privacy.noise_multiplier = None
  c.privacy.target_epsilon = 3.0
  (tmp_path / "config.json").write_text(
      json.dumps(spec_lib.build_spec(c).records.config_json))
  c.rounds = 8
  with pytest.raises(ConfigError, match=r"config\.privacy\.target_epsilon=3\.0 calibrated"):
    training.check_workdir(str(tmp_path), c)
  fixed = dp_config()  # a fixed sigma extends as any run
  (tmp_path / "config.json").write_text(
      json.dumps(spec_lib.build_spec(fixed).records.config_json))
  fixed.rounds = 8
  assert training.check_workdir(str(tmp_path), fixed) == 4


def test_privacy_fields_set_while_privacy_is_off_are_refused():
  from fedjax_lama import config as config_lib  # pylint: disable=g-import-not-at-top
  off = tiny_config()
  with pytest.raises(ConfigError, match=r"config\.privacy\.noise_multiplier has no effect "
                                        r"while config\.privacy\.enabled=False"):
    config_lib.check_overrides(off, ["privacy.noise_multiplier"])
  config_lib.check_overrides(off, ["privacy.enabled"])
  on = dp_config()
  config_lib.check_overrides(on, ["privacy.enabled", "privacy.noise_multiplier",
                                  "privacy.adaptive.enabled"])
  with pytest.raises(ConfigError, match=r"config\.privacy\.adaptive\.target_quantile has no "
                                        r"effect while config\.privacy\.adaptive\.enabled"):
    config_lib.check_overrides(on, ["privacy.adaptive.target_quantile"])


def test_per_layer_clipping_bounds_every_layer():
  config = contract.config_for("fedavg", weighting="uniform", client_sampling="fixed",
                               active_ratio=0.25, local_lr=1.0)
  options = DpOptions(0.0, 0.3, spec_lib.sampling_options(config),
                      clipping="per_layer", layer_split="size")

  def moves(stage):
    program = _program(config, stage)
    state, _ = helpers.run(program, 1)
    return [float(np.linalg.norm(np.asarray(a) - np.asarray(b))) for a, b in zip(
        jax.tree.leaves(state["server"].params), jax.tree.leaves(program.params))]

  leaves = jax.tree.leaves(_program(config, None).params)
  total = sum(np.size(x) for x in leaves)
  layer_clips = [0.3 * np.sqrt(np.size(x) / total) for x in leaves]  # C_l^2 = C^2 d_l / d
  clipped, plain = moves(mechanisms.user_level_dp(options)), moves(None)
  assert any(p > c for p, c in zip(plain, layer_clips)), "the clip must bind for some layer"
  # The mean of m updates whose leaf l is clipped to C_l moves leaf l by at most C_l.
  for move, clip in zip(clipped, layer_clips):
    assert move <= clip * (1 + 1e-5)


@pytest.mark.slow
def test_vectorized_dp_runs_write_what_sequential_runs_write(tmp_path):
  configs = [dp_config(adaptive=True, seed=s, client_sampling="fixed") for s in (0, 1)]
  vec_dirs = [str(tmp_path / f"vec{i}") for i in range(2)]
  summaries = training.train_many(configs, vec_dirs)
  assert all(s["vectorized_runs"] == 2 for s in summaries)
  for i, c in enumerate(configs):
    training.train_and_evaluate(c, str(tmp_path / f"seq{i}"))
    vec, seq = _rows(vec_dirs[i]), _rows(tmp_path / f"seq{i}")
    assert [r["dp_epsilon"] for r in vec] == [r["dp_epsilon"] for r in seq]
    for key in ("test_loss", "train_loss", "aggregator_dp/clip_norm",
                "aggregator_dp/unclipped_fraction"):
      np.testing.assert_allclose([r[key] for r in vec], [r[key] for r in seq], rtol=1e-4,
                                 err_msg=key)
    assert summaries[i]["privacy"] == _summary(tmp_path / f"seq{i}")["privacy"]
