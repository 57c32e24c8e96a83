"""Text through every family: the contract table's core on both language models, FedLAMA's
schedule, user-level DP, personalization, a robust defence and exact resume on text.

Two tiny character models, `lstm_lm` as the FedAvg paper's and LEAF's character LSTM (two
LSTM layers, no batch norm, no dropout; McMahan et al., AISTATS 2017) and `transformer_lm`
(one pre-LayerNorm block), train on two text tasks:

- a synthetic role-partitioned task built here (`text_federation`): every role speaks its
  own affine rule over a small vocabulary, windows predict every next token, one client per
  role. The program-level checks run on it (compiles once, chunked = unchunked, 8 CPU
  devices = 1, FedLAMA over the algorithm, a checkpoint resumed into a fresh state), as
  tests/test_algorithm_contract.py runs them on images;
- Shakespeare by role (`shakespeare_roles`) built from a play generated in
  tests/test_shakespeare_roles.py (no shared data needed), through `train_and_evaluate`:
  user-level DP over roles (DP-FedAvg, McMahan, Ramage, Talwar, Zhang, ICLR 2018),
  per-role fine-tuning, FedPer with the output layer `Dense_0` personal, Ditto, the
  coordinate median, and a run stopped after round k and resumed equal to the uninterrupted
  one (metrics and final parameters, bit for bit).

What is refused on text is refused with one ConfigError line, checked here.
The 8-device comparisons run in subprocesses (`python -m tests.test_text_families OUT MESH
CASE...`, through tests/test_sharding.py's worker).
"""
import os
import sys

import chex
import jax

if __name__ == "__main__":  # the 8-device worker: its CPU devices set before any device exists
  jax.config.update("jax_num_cpu_devices", int(os.environ["FEDJAX_TEST_CPU_DEVICES"]))
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fedjax_lama import config as config_lib
from fedjax_lama import data as fdata
from fedjax_lama import federation, models, training
from fedjax_lama.engine import sharding
from tests import test_algorithm_contract as contract
from tests import test_sharding as helpers
from tests.test_training import _metrics

MESH = sharding.client_mesh(jax.devices()[:1])
VOCAB, SEQ_LEN, NUM_ROLES = 11, 8, 12
# The tiny models: LEAF's character LSTM layout (embedding, two LSTM layers, a Dense output)
# and a one-block transformer; both name their output layer Dense_0.
MODEL_OPTIONS = {
    "lstm_lm": {"embed_size": 4, "hidden_size": 8, "num_layers": 2, "batch_norm": False,
                "dropout": 0.0},
    "transformer_lm": {"width": 16, "depth": 1, "heads": 2, "mlp_ratio": 2},
}
MODELS = tuple(MODEL_OPTIONS)
# The contract table's core (tests/test_algorithm_contract.py CORE) on text: FedAvg on both
# models in the default suite, the rest of the core with -m slow.
CORE = contract.CORE


# ---- the synthetic role-partitioned task ----------------------------------------------------
def text_federation(num_roles=NUM_ROLES, seed=0) -> federation.Federation:
  """Role r speaks x_{t+1} = (a_r x_t + b_r) mod V, with a random token 1 time in 8; its
  lines are cut into windows of SEQ_LEN tokens whose targets are the next tokens. Roles
  have 6 + (r mod 5) training windows (unequal weights) and 2 test windows each; the
  partition is natural (one client per role)."""
  rng = np.random.default_rng(seed)
  xs, ys, ids, test_x, test_y = [], [], [], [], []
  for r in range(num_roles):
    a, b = 1 + r % (VOCAB - 1), (3 * r + 1) % VOCAB
    n = 6 + r % 5 + 2
    text = [int(rng.integers(VOCAB))]
    for _ in range(n + SEQ_LEN):
      nxt = (a * text[-1] + b) % VOCAB
      text.append(int(rng.integers(VOCAB)) if rng.random() < 0.125 else nxt)
    text = np.asarray(text, np.int32)
    windows = np.stack([text[i:i + SEQ_LEN + 1] for i in range(n)])
    xs.append(windows[:-2, :-1])
    ys.append(windows[:-2, 1:])
    test_x.append(windows[-2:, :-1])
    test_y.append(windows[-2:, 1:])
    ids += [r] * (n - 2)
  ds = fdata.Dataset("text_roles", np.concatenate(xs), np.concatenate(ys),
                     np.concatenate(test_x), np.concatenate(test_y), VOCAB,
                     train_client_ids=np.asarray(ids, np.int32),
                     input_kind=fdata.INPUT_TOKENS)
  return federation.Federation(ds, fdata.natural(ds.train_client_ids), None)


def text_model(name: str):
  return models.get(name, VOCAB, vocab_size=VOCAB, **MODEL_OPTIONS[name])


def build(config, model_name: str, mesh=MESH, fed=None):
  """The round program of `config` on the synthetic task with model `model_name`."""
  fed = fed if fed is not None else text_federation()
  model = text_model(model_name)
  params = model.init(jax.random.PRNGKey(config.seed),
                      jnp.asarray(fed.dataset.train_x[:1]))["params"]
  return training.build_program(config, model, params, {}, fed, mesh)


def text_config(name: str, fedlama: bool = False, **overrides):
  """The contract table's tiny config of algorithm `name` (tests/test_algorithm_contract.py)
  on the synthetic task's clients: a third of the roles per round, 3 rounds."""
  return contract.config_for(name, fedlama, **{"num_clients": NUM_ROLES, "active_ratio": 0.34,
                                               "rounds": 3, **overrides})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """(algorithm, model, fedlama) -> the contract's straight and resumed runs."""
  cache = {}

  def get(name, model_name, fedlama=False):
    key = name, model_name, fedlama
    if key not in cache:
      config = text_config(name, fedlama)
      if fedlama:
        config.fedlama.total_steps = 3 * config.fedlama.phi * config.fedlama.base_interval
      cache[key] = contract.run_resumed(build(config, model_name),
                                        tmp_path_factory.mktemp(f"{name}_{model_name}"))
    return cache[key]

  return get


def cases(names, fast):
  """(name, model) parameters; those outside `fast` (pairs) marked slow."""
  return [pytest.param(n, m, marks=() if (n, m) in fast else pytest.mark.slow)
          for n in names for m in MODELS]


def check_run(run):
  """A run of `runs`: resumed = straight bit for bit, no compilation after round 1, finite
  parameters that moved."""
  server, _ = run["straight"]
  assert contract._bits(run["resumed"]) == contract._bits(run["straight"]), "resumed differs"
  assert run["compiles"] == [], f"recompiled after round 1: {run['compiles']}"
  leaves = jax.tree.leaves(server.params)
  assert all(np.all(np.isfinite(x)) for x in leaves)
  start = jax.tree.leaves(run["program"].params)
  assert any(np.any(a != np.asarray(b)) for a, b in zip(leaves, start)), "nothing trained"
  return server


# lstm_lm's fast checks: Ditto below and the end-to-end resume.
@pytest.mark.parametrize("name,model_name", cases(CORE, fast={("fedavg", "transformer_lm")}))
def test_core_resumes_exactly_and_compiles_once(runs, name, model_name):
  check_run(runs(name, model_name))


@pytest.mark.parametrize("name,model_name", cases(CORE, fast={("fedavg", "transformer_lm")}))
def test_core_chunked_equals_one_chunk(runs, name, model_name):
  config = text_config(name, **{"engine.clients_per_chunk": 2})
  program = build(config, model_name)
  assert program.chunk_size == 2 and program.opts.sampler.max_cohort > 2
  state, _ = helpers.run(program)
  chex.assert_trees_all_close(contract._server_and_rows(program, state),
                              runs(name, model_name)["straight"], rtol=1e-5, atol=1e-6)


# ---- FedLAMA's schedule -----------------------------------------------------------------------
@pytest.mark.parametrize("name,model_name", cases(("fedavg", "scaffold"),
                                                  fast={("fedavg", "transformer_lm")}))
def test_fedlama_schedule_is_layer_wise_on_text(runs, name, model_name):
  """FedLAMA over the algorithm (phi = 2) on the text models' layer names: it resumes
  exactly, compiles once, and after the first window synchronizes some layers less often
  than others (per layer: floats sent / (layer size x clients) = synchronizations)."""
  run = runs(name, model_name, fedlama=True)
  check_run(run)
  program = run["program"]
  names = program.spec.names
  assert len(names) == len(jax.tree.leaves(program.params))  # tensor granularity
  assert any(n.startswith(("OptimizedLSTMCell_1", "block_0/attention/")) for n in names)
  syncs = [np.asarray(o.floats_up_per_layer) / (program.spec.sizes * o.extra["clients"])
           for o in run["outs"]]
  assert len(set(syncs[0].tolist())) == 1  # the first window: every layer at the base interval
  assert any(len(set(s.tolist())) > 1 for s in syncs[1:]), syncs


# ---- user-level DP over roles, a robust defence, personalization ------------------------------
FAMILIES = {
    # DP-FedAvg (McMahan, Ramage, Talwar, Zhang, ICLR 2018): each role's update clipped to C,
    # Gaussian noise on the sum; clients weigh the same (a role's size is not released).
    "dp": ("fedavg", {"weighting": "uniform", "privacy.enabled": True,
                      "privacy.noise_multiplier": 0.3, "privacy.clip_norm": 0.5}),
    "median": ("fedavg", {"robust.defence": "median", "robust.f": 1}),
    # FedPer (Arivazhagan et al. 2019) with the output layer personal.
    "fedper": ("fedper", {"fedper.personal_layers": "Dense_0"}),
    "ditto": ("ditto", {}),
}


@pytest.fixture(scope="module")
def family_runs(tmp_path_factory):
  cache = {}

  def get(family, model_name):
    if (family, model_name) not in cache:
      name, overrides = FAMILIES[family]
      config = text_config(name, **overrides)
      config_lib.validate(config)
      cache[family, model_name] = contract.run_resumed(
          build(config, model_name), tmp_path_factory.mktemp(f"{family}_{model_name}"))
    return cache[family, model_name]

  return get


def _differs(a, b):
  return any(np.any(np.asarray(x) != np.asarray(y))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("family,model_name", cases(
    FAMILIES, fast={("dp", "transformer_lm"), ("median", "transformer_lm"),
                    ("fedper", "transformer_lm"),
                    ("ditto", "lstm_lm")}))
def test_family_runs_resumes_exactly_and_compiles_once(runs, family_runs, family, model_name):
  run = family_runs(family, model_name)
  server = check_run(run)
  program = run["program"]
  if family in ("dp", "median"):  # the stage changed what FedAvg's server applies
    assert _differs(server.params, runs("fedavg", model_name)["straight"][0].params)
  if family == "fedper":  # the output layer never travels and the server's copy never moves
    up, _, down = contract._keeps_on_clients("Dense_0")(program.params)
    for out in run["outs"]:
      m = out.extra["clients"]
      assert int(out.floats_up_per_layer.sum()) + out.floats_up_other == m * up
      assert int(out.floats_down_per_layer.sum()) + out.floats_down_other == m * down
    assert not _differs(server.params["Dense_0"], program.params["Dense_0"])
    assert _differs(server.params[next(k for k in server.params if k != "Dense_0")],
                    program.params[next(k for k in program.params if k != "Dense_0")])
  if family in ("fedper", "ditto"):  # the sampled roles' personal rows moved
    _, rows = run["straight"]
    sampled = run["sampled"]
    pick = lambda tree: jax.tree.map(lambda a: a[sampled], tree)
    assert _differs(pick(rows), pick(run["initial_rows"]))


@pytest.mark.parametrize("model_name", MODELS)
def test_the_output_layer_is_the_default_head(model_name):
  """Both models' output layer is their one top-level Dense module: FedPer's and FedRep's
  default personal layer, LG-FedAvg's one shared layer."""
  from fedjax_lama.algorithms import layer_partition  # pylint: disable=g-import-not-at-top
  params = text_model(model_name).init(jax.random.PRNGKey(0),
                                       jnp.zeros((1, SEQ_LEN), jnp.int32))["params"]
  assert layer_partition.classifier_head(params, "config.fedper.personal_layers") == ("Dense_0",)


# ---- 8 devices = 1 ----------------------------------------------------------------------------
SHARDED = [f"{family}-{name}-{model}:5" for model in MODELS
           for family, name in (("algo", "fedavg"), ("algo", "scaffold"), ("lama", "fedavg"),
                                ("dp", "fedavg"), ("fedper", "fedper"), ("ditto", "ditto"),
                                ("median", "fedavg"))]


def sharded_case(kind: str, cohort: int, mesh):
  """One case of the 8-device comparison on the synthetic task (the worker's `case`):
  "<family>-<algorithm>-<model>" with `cohort` roles per round, clients weighed alike."""
  family, name, model_name = kind.split("-")
  overrides = FAMILIES[family][1] if family in FAMILIES else {}
  config = text_config(name, family == "lama", **{"active_ratio": cohort / NUM_ROLES,
                                                  "weighting": "uniform", **overrides})
  program = build(config, model_name, mesh)
  state, outs = helpers.run(program)
  server, rows = contract._server_and_rows(program, state)
  flat = [np.asarray(x) for x in jax.tree.leaves((server, rows))]
  return flat, [o.train_loss for o in outs], []


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
  return helpers.eight_devices_vs_one(tmp_path_factory.mktemp("text_sharded"), SHARDED,
                                      module="tests.test_text_families")


@pytest.mark.slow
@pytest.mark.parametrize("case", SHARDED)
def test_eight_devices_equal_one(sharded, case):
  """5 roles per round over 8 devices (padded to 8) equal the 1-device run."""
  contract._check_sharded(sharded[case])


# ---- end to end on Shakespeare by role ----------------------------------------------------------
def roles_config(tmp_path, model_name, **overrides):
  """A tiny run on a generated play of 6 roles (tests/test_shakespeare_roles.py), windows of
  8 characters predicting every next one, each role's last windows its test windows."""
  c = config_lib.base_config()
  c.dataset, c.model, c.partition = "shakespeare_roles", model_name, "natural"
  c.data_dir = str(tmp_path / "data")
  c.dataset_options = ml_collections.ConfigDict({"seq_len": SEQ_LEN, "split": "sample"})
  c.model_options = ml_collections.ConfigDict(MODEL_OPTIONS[model_name])
  c.num_clients, c.active_ratio = 6, 0.5
  c.rounds, c.local_steps, c.batch_size, c.local_lr = 4, 2, 4, 0.5
  c.eval_every, c.checkpoint_every, c.eval_batch_size = 2, 2, 64
  c.plots = False
  c.update_from_flattened_dict(overrides)
  return c


@pytest.fixture
def play(tmp_path, monkeypatch):
  from tests import test_shakespeare_roles as roles  # pylint: disable=g-import-not-at-top
  roles._write_corpus(tmp_path / "data", monkeypatch,
                      plays={"gen_gut.txt": roles._generated_play(num_roles=6)})
  return tmp_path


def final_state(workdir):
  """The last checkpoint's saved state, as numpy arrays (orbax, no template)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  manager = ocp.CheckpointManager(os.path.join(workdir, "checkpoints"),
                                  item_names=("state", "meta"))
  step = manager.latest_step()
  restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  manager.close()
  return step, restored["state"]


@pytest.mark.parametrize("model_name", [
    pytest.param("lstm_lm", marks=pytest.mark.slow),
    pytest.param("transformer_lm", marks=pytest.mark.slow)])
def test_stopped_and_resumed_run_equals_the_uninterrupted_one(play, model_name):
  """Per-role fine-tuning (2 steps on each role's own training windows before its personal
  evaluation) in the records; the run stopped after round 2 and resumed gives the same
  metrics lines, summary and final parameters, bit for bit."""
  c = roles_config(play, model_name, finetune_steps=2, local_test_fraction=0.25,
                   per_client_eval="final")
  full = training.train_and_evaluate(c, str(play / "full"))
  assert training.train_and_evaluate(c, str(play / "cut"), stop_after_round=1) == {
      "interrupted_after_round": 1}
  resumed = training.train_and_evaluate(c, str(play / "cut"))
  assert _metrics(play / "full") == _metrics(play / "cut")
  full.pop("wall_seconds"), resumed.pop("wall_seconds")
  assert full == resumed
  assert "client_test_accuracy/personal/mean" in full  # the fine-tuned per-role accuracy
  step_full, state_full = final_state(play / "full")
  step_cut, state_cut = final_state(play / "cut")
  assert step_full == step_cut == c.rounds - 1
  assert contract._bits(state_full) == contract._bits(state_cut)


def test_natural_partition_progress_line_counts_roles(play, monkeypatch):
  """The progress line gives the natural partition's clients (one per role), not
  config.num_clients."""
  from fedjax_lama import progress  # pylint: disable=g-import-not-at-top
  from fedjax_lama.run import parts, spec  # pylint: disable=g-import-not-at-top
  lines = []
  monkeypatch.setattr(progress, "info", lambda message, *args: lines.append(message % args))
  c = roles_config(play, "lstm_lm", num_clients=100)
  prepared = parts.prepare(spec.build_spec(c))
  roles = len(np.unique(prepared.fed.dataset.train_client_ids))
  assert prepared.fed.num_clients == roles < 100
  assert f"partitioning into {roles} clients (natural) ..." in lines, lines


# ---- what is refused on text, in one line -------------------------------------------------------
def _one_line(err) -> str:
  message = str(err.value)
  assert "\n" not in message, message
  return message


@pytest.mark.parametrize("model_name", MODELS)
def test_backdoor_is_refused_on_text(play, model_name):
  """The backdoor's trigger is a pixel pattern: refused for both text models before any
  data is read."""
  c = roles_config(play, model_name, **{"robust.attack": "backdoor",
                                        "robust.malicious_count": 1})
  with pytest.raises(config_lib.ConfigError) as err:
    training.train_and_evaluate(c, str(play / "w"))
  assert (f"config.robust.attack='backdoor' is not accepted with config.model={model_name!r}"
          in _one_line(err))
  assert not (play / "w").exists()


@pytest.mark.parametrize("model_name", MODELS)
def test_label_flipping_is_refused_on_next_token_targets(model_name):
  config = text_config("fedavg", **{"robust.attack": "label_flip", "robust.malicious_count": 1})
  with pytest.raises(config_lib.ConfigError) as err:
    build(config, model_name)
  assert ("config.robust.attack='label_flip' needs one class label per example, but "
          f"config.dataset has targets of shape ({SEQ_LEN},) per example" in _one_line(err))


def test_dp_refuses_the_lstm_with_batch_norm(play):
  """lstm_lm's default batch norm keeps running statistics, averaged without clip or noise:
  DP refuses it in one line (LEAF's LSTM, batch_norm=False, runs: the DP runs above)."""
  c = roles_config(play, "lstm_lm", weighting="uniform", **{
      "model_options.batch_norm": True, "privacy.enabled": True,
      "privacy.noise_multiplier": 0.3})
  with pytest.raises(config_lib.ConfigError) as err:
    training.train_and_evaluate(c, str(play / "w"))
  assert ("config.model='lstm_lm' is not accepted with config.privacy.enabled=True: its "
          "BatchNorm running statistics" in _one_line(err))


if __name__ == "__main__":
  helpers.worker(sys.argv[1], int(sys.argv[2]), sys.argv[3:], case=sharded_case)
