"""User-level DP across the contract table (tests/test_algorithm_contract.py).

Every algorithm of the table is in exactly one of two groups, named below, so that a new
algorithm fails `test_every_algorithm_is_in_exactly_one_dp_group` until it is placed:
- DP_REFUSED: the server would see the clients through more than the noised mean of the
  model delta (another upload, another aggregate of the delta, or no delta at all); the run
  stops with one line naming what the noise would not cover.
- DP_ACCEPTED: with DP on (Poisson cohort q = 0.25, flat clip, sigma = 1; FedAvg also with
  adaptive clipping):
  - no compilation after the first round, and a run checkpointed after round 1 and resumed
    in a fresh state ends bit-identical to an uninterrupted one (the contract's
    `_run_resumed`);
  - through train_and_evaluate, interrupted and resumed = uninterrupted: every metrics.jsonl
    row (losses, accuracies, dp_epsilon, the clip) and summary.json (its privacy entry);
  - chunked rounds (a Poisson draw above the chunk capacity) equal one chunk;
  - 8 fake CPU devices equal 1 (tests/test_sharding.py's subprocesses, the clip included).
FedAvg (flat and adaptive) and FedAdam run in the default suite (8 devices: FedAvg adaptive
and FedAdam; train_and_evaluate: FedAvg adaptive), every other case under `-m slow`.
The refusals of the privacy options (and the refused algorithms) also go through
experiments/main.py: exit status 2 and exactly one `error:` line naming the fields (a
representative few by default); a delta above 1/N warns in one line.
"""
import re

import chex
import jax
import numpy as np
import pytest

from fedjax_lama import training
from fedjax_lama.engine import sharding
from fedjax_lama.errors import ConfigError
from fedjax_lama.privacy import mechanisms
from tests import test_algorithm_contract as contract
from tests import test_cli_errors as cli
from tests import test_privacy_runs as privacy_runs
from tests import test_sharding as helpers
from tests.test_batchnorm_policy import TinyBN
from tests.test_training import _metrics as _rows  # pylint: disable=protected-access

MESH = sharding.client_mesh(jax.devices()[:1])
SIGMA, CLIP = 1.0, 0.5

# What the noise would not cover, as the refusal names it.
DP_REFUSED = {
    "fedadmm": "uploads 'delta_x_hat' and no model delta",
    "fedams": "uploads 'v' besides the model delta",
    "fedcm": "reads 'D'",
    "feddyn": "reads 'alpha_delta'",
    "fedexp": "uploads 'sq_norm' besides the model delta",
    "fedgamma": "uploads 'dc' besides the model delta",
    "fedlamb": "uploads 'v' besides the model delta",
    "fednova": "uploads 'a' besides the model delta",
    "hypcluster": "uploads 'cluster' besides the model delta",
    "fedsmoo": "uploads 'z' besides the model delta",
    "fedspeed": "uploads 'x_hat_delta' and no model delta",  # its default "active" average
    "mofedsam": "reads 'D'",
    "scaffold": "uploads 'dc' besides the model delta",
}
DP_ACCEPTED = ("apfl", "ditto", "fedadagrad", "fedadam", "fedavg", "fedavgm", "fedbabu", "fedbn",
               "fedcom", "fedpaq", "fedper", "fedprox", "fedrep", "fedsam", "fedsgd", "fedyogi",
               "lg_fedavg", "perfedavg", "pfedme")
ADAPTIVE = "+adaptive"  # case suffix: adaptive clipping
CASES = list(DP_ACCEPTED) + ["fedavg" + ADAPTIVE]
CORE = ("fedavg", "fedavg" + ADAPTIVE, "fedadam")
# The costlier checks keep a smaller core: 8 devices compile every case twice in two
# subprocesses, and train_and_evaluate's records (dp_epsilon, the summary) are the same host
# code under every algorithm.
SHARDED_CORE = ("fedavg" + ADAPTIVE, "fedadam")
RECORDS_CORE = ()  # every case under -m slow; the rounds resume exactly in the default suite


def _core_first(cases, core=CORE):
  return contract._core_first(cases, core)  # pylint: disable=protected-access


def _split(case):
  """(algorithm, adaptive clipping?) of a case."""
  return case.removesuffix(ADAPTIVE), case.endswith(ADAPTIVE)


def dp_config_for(name: str, adaptive: bool = False, **overrides):
  """The contract table's config of `name` (40 clients) with DP on: uniform weights, Poisson
  cohorts of q = 0.25 (expected 10 clients), clip 0.5, sigma 1; adaptive clipping if asked."""
  c = contract.config_for(name, **{"weighting": "uniform", "client_sampling": "bernoulli",
                                   "active_ratio": 0.25, **overrides})
  c.privacy.enabled = True
  c.privacy.noise_multiplier = SIGMA
  c.privacy.clip_norm = CLIP
  if adaptive:
    c.privacy.adaptive.enabled = True
    c.privacy.adaptive.count_stddev = 2.0  # above sigma / 2
  return c


def _build(config, model=None, model_state=None):
  fed = helpers.tiny_federation()
  model = model or helpers.TinyMLP()
  variables = model.init(jax.random.PRNGKey(config.seed), fed.dataset.train_x[:1])
  return training.build_program(config, model, variables["params"],
                                model_state or {}, fed, MESH)


# ---- the two groups ------------------------------------------------------------------------
def test_every_algorithm_is_in_exactly_one_dp_group():
  assert not set(DP_ACCEPTED) & set(DP_REFUSED)
  assert sorted(DP_ACCEPTED + tuple(DP_REFUSED)) == contract.NAMES, (
      "place every algorithm of the registry in DP_ACCEPTED or DP_REFUSED")


@pytest.mark.parametrize("name", DP_ACCEPTED)
def test_accepted_algorithms_build_with_the_dp_stage(name):
  program = _build(dp_config_for(name))
  assert program.opts.aggregator.name == mechanisms.STAGE_NAME
  assert program.opts.sampler.kind == "bernoulli"


@pytest.mark.parametrize("name", sorted(DP_REFUSED))
def test_refused_algorithms_name_what_the_noise_would_not_cover(name):
  with pytest.raises(ConfigError) as info:
    _build(dp_config_for(name))
  message = str(info.value)
  assert message.startswith(f"config.algorithm='{name}' is not accepted with "
                            "config.privacy.enabled=True: "), message
  assert DP_REFUSED[name] in message and "\n" not in message


def test_batchnorm_statistics_are_refused():
  """A synchronous round averages the running statistics with neither clip nor noise."""
  config = dp_config_for("fedavg")
  fed = helpers.tiny_federation()
  variables = TinyBN().init(jax.random.PRNGKey(0), fed.dataset.train_x[:2])
  with pytest.raises(ConfigError, match=r"^config\.model='.*' is not accepted with "
                                        r"config\.privacy\.enabled=True: its BatchNorm") as info:
    training.build_program(config, TinyBN(), variables["params"], variables["batch_stats"],
                           fed, MESH)
  assert "\n" not in str(info.value)


# ---- compiles once, resumes exactly, chunked, 8 devices --------------------------------------
@pytest.fixture(scope="module")
def dp_runs(tmp_path_factory):
  cache = {}

  def get(case):
    if case not in cache:
      name, adaptive = _split(case)
      config = dp_config_for(name, adaptive, rounds=3)
      cache[case] = contract._run_resumed(  # pylint: disable=protected-access
          config, tmp_path_factory.mktemp(name))
    return cache[case]

  return get


@pytest.mark.parametrize("case", _core_first(CASES))
def test_dp_round_compiles_once_and_resumes_exactly(dp_runs, case):
  run = dp_runs(case)
  bits = contract._bits  # pylint: disable=protected-access
  assert run["program"].opts.aggregator.name == mechanisms.STAGE_NAME
  assert run["compiles"] == [], f"recompiled after round 1: {run['compiles']}"
  assert bits(run["resumed"]) == bits(run["straight"]), "resumed run differs"
  server, _ = run["straight"]
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(server))
  clips = [out.extra["aggregator_dp/clip_norm"] for out in run["outs"]]
  if _split(case)[1]:
    assert clips[-1] != CLIP, "adaptive clipping must move the clip"
  else:
    assert clips == [CLIP] * len(clips)


@pytest.mark.parametrize("case", _core_first(CASES))
def test_dp_chunked_rounds_equal_one_chunk(dp_runs, case):
  name, adaptive = _split(case)
  config = dp_config_for(name, adaptive, rounds=3, **{"engine.clients_per_chunk": 3})
  program = helpers.build(config, MESH)
  assert program.chunk_size == 3
  draws = [len(program.opts.sampler.sample(r)) for r in range(3)]
  assert max(draws) > program.chunk_size, "a draw must exceed the chunk capacity"
  state, outs = helpers.run(program)
  assert [o.extra["clients"] for o in outs] == draws
  chex.assert_trees_all_close(
      contract._server_and_rows(program, state),  # pylint: disable=protected-access
      dp_runs(case)["straight"], rtol=1e-5, atol=1e-6)


def _sharded_cases(cases):
  out = []
  for case in cases:
    name, adaptive = _split(case)
    out.append(f"{'dpadaptive' if adaptive else 'dp'}-{name}:9")
  return out


SHARDED_REST = [c for c in CASES if c not in SHARDED_CORE]


@pytest.fixture(scope="module")
def sharded_core(tmp_path_factory):
  return helpers.eight_devices_vs_one(tmp_path_factory.mktemp("dp8"),
                                      _sharded_cases(SHARDED_CORE))


@pytest.fixture(scope="module")
def sharded_rest(tmp_path_factory):
  return helpers.eight_devices_vs_one(tmp_path_factory.mktemp("dp8rest"),
                                      _sharded_cases(SHARDED_REST))


@pytest.mark.slow
@pytest.mark.parametrize("case", _sharded_cases(SHARDED_CORE))
def test_dp_eight_devices_equal_one(sharded_core, case):
  contract._check_sharded(sharded_core[case])  # pylint: disable=protected-access


@pytest.mark.slow
@pytest.mark.parametrize("case", _sharded_cases(SHARDED_REST))
def test_dp_eight_devices_equal_one_for_every_other_algorithm(sharded_rest, case):
  contract._check_sharded(sharded_rest[case])  # pylint: disable=protected-access


# ---- interrupted and resumed through train_and_evaluate --------------------------------------
@pytest.mark.parametrize("case", _core_first(CASES, RECORDS_CORE))
def test_dp_run_interrupted_and_resumed_writes_what_an_uninterrupted_run_writes(tmp_path, case):
  """metrics.jsonl (test losses and accuracies of the parameters, dp_epsilon, the clip) and
  summary.json, bit for bit; digits, 8 clients, q = 0.5, 4 rounds, interrupted after round 1."""
  name, adaptive = _split(case)
  c = contract.with_algorithm(privacy_runs.dp_config(adaptive=adaptive), name)
  whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
  training.train_and_evaluate(c, whole)
  assert training.train_and_evaluate(c, parts, stop_after_round=1) == {
      "interrupted_after_round": 1}
  training.train_and_evaluate(c, parts)
  rows = _rows(whole)
  assert rows == _rows(parts)
  assert [r["round"] for r in rows] == [2, 4]
  assert all(r["dp_epsilon"] > 0 for r in rows) and rows[0]["dp_epsilon"] < rows[1]["dp_epsilon"]
  clips = [r["aggregator_dp/clip_norm"] for r in rows]
  if adaptive:
    assert clips[-1] != 0.5, "adaptive clipping must move the clip"
  summary = privacy_runs._summary(whole)  # pylint: disable=protected-access
  assert summary == privacy_runs._summary(parts)  # pylint: disable=protected-access
  assert summary["privacy"]["epsilon"] == rows[-1]["dp_epsilon"]


# ---- the refusals through the command line ---------------------------------------------------
ON = ["--config.privacy.enabled=True", "--config.weighting=uniform"]
SIGMA_ON = ON + ["--config.privacy.noise_multiplier=1.0"]
# (case id, arguments, what the one error line names). Each stops before any data is loaded,
# except the algorithm cases, which stop before training (the uploads are read off the model).
CLI_CASES = [
    ("fedlama_schedule", SIGMA_ON + ["--config.schedule=fedlama"],
     ["config.privacy.enabled=True", "config.schedule='fedlama'",
      "each synchronisation of a layer set is a separate release"]),
]
SLOW_CLI_CASES = [
    ("simulated_clock", ["--config=configs/fedat_fmnist.py", "--config.privacy.enabled=True",
                         "--config.privacy.noise_multiplier=1.0"],
     ["config.privacy.enabled=True", "simulated clock"]),
    ("examples_weighting", ["--config.privacy.enabled=True",
                            "--config.privacy.noise_multiplier=1.0"],
     ["config.weighting='examples'", "config.privacy.enabled=True", "accepted: 'uniform'"]),
    ("sigma_negative", ON + ["--config.privacy.noise_multiplier=-1.0"],
     ["config.privacy.noise_multiplier=-1.0", "accepted: a number >= 0"]),
    ("clip_zero", SIGMA_ON + ["--config.privacy.clip_norm=0"],
     ["config.privacy.clip_norm=0.0", "accepted: a number > 0"]),
    ("clip_negative", SIGMA_ON + ["--config.privacy.clip_norm=-1"],
     ["config.privacy.clip_norm=-1.0"]),
    ("delta_one", SIGMA_ON + ["--config.privacy.delta=1.0"],
     ["config.privacy.delta=1.0", "accepted: a number in (0, 1)"]),
    ("delta_zero", SIGMA_ON + ["--config.privacy.delta=0"], ["config.privacy.delta=0.0"]),
    ("rate_zero", SIGMA_ON + ["--config.client_sampling=bernoulli", "--config.active_ratio=0"],
     ["config.active_ratio=0.0", "(0, 1]"]),
    ("rate_above_one",
     SIGMA_ON + ["--config.client_sampling=bernoulli", "--config.active_ratio=1.5"],
     ["config.active_ratio=1.5", "(0, 1]"]),
    ("target_epsilon_unreachable", ON + ["--config.privacy.target_epsilon=1e-6"],
     ["config.privacy.target_epsilon=1e-06", "accepted: a value >="]),
    ("sigma_and_target_epsilon", SIGMA_ON + ["--config.privacy.target_epsilon=2.0"],
     ["config.privacy.noise_multiplier=1.0", "config.privacy.target_epsilon=2.0",
      "set exactly one"]),
    ("pld_with_fixed_cohorts", SIGMA_ON + ["--config.privacy.accountant=pld"],
     ["config.privacy.accountant='pld'", "privacy.sampling='fixed'"]),
    ("extra_upload", SIGMA_ON + ["--config.algorithm=scaffold"],
     ["config.algorithm='scaffold'", "'dc'"]),
    ("extra_aggregate", SIGMA_ON + ["--config.algorithm=feddyn"],
     ["config.algorithm='feddyn'", "'alpha_delta'"]),
]


@pytest.mark.parametrize("case_id,args,names", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_refuses_in_one_line(tmp_path, case_id, args, names):
  del case_id
  cli._check_case(tmp_path, args, names)  # pylint: disable=protected-access


@pytest.mark.slow
@pytest.mark.parametrize("case_id,args,names", SLOW_CLI_CASES,
                         ids=[c[0] for c in SLOW_CLI_CASES])
def test_cli_refuses_more_in_one_line(tmp_path, case_id, args, names):
  del case_id
  cli._check_case(tmp_path, args, names)  # pylint: disable=protected-access


@pytest.mark.slow
def test_cli_warns_in_one_line_of_a_delta_above_one_over_the_population(tmp_path):
  """delta = 0.5 > 1/32 is allowed with one warning line; the run then stops at its workdir,
  which holds another run."""
  output = cli._check_case(  # pylint: disable=protected-access
      tmp_path, SIGMA_ON + ["--config.privacy.delta=0.5", "--workdir={rundir}"],
      ["{rundir}", "fields: privacy, weighting"])
  warned = [line for line in output.splitlines() if "privacy.delta=0.5" in line]
  assert len(warned) == 1, output
  assert re.search(r"UserWarning: privacy\.delta=0\.5 is above 1/num_clients=0\.0312", warned[0])
