"""FedAT and its baselines on the JAX engine and the run contract (issue 18).

The host-side simulation (fedjax_lama.simulation) with the real
engine behind it (simulation/engine_adapter.py, job_packing.py) and the run contract of
docs/design.md (simulation/clock_run.py, dispatched by training.train_and_evaluate).
Paper: FedAT, Chai et al., SC'21.

Small and fast: the built-in 8x8 digits, a 32-unit MLP, 10 clients.
"""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lama import federation, training
from fedjax_lama import data as fdata
from fedjax_lama import config as config_lib
from fedjax_lama.config import ConfigError, base_config
from fedjax_lama.engine import local
from fedjax_lama.simulation import clock_run, engine_adapter, job_packing
from fedjax_lama.simulation.interfaces import TrainJob

SEED = 0
BATCH = 16


def clock_config(**changes):
  """FedAT on digits: 10 clients in 5 tiers of 2, 2 clients per tier round, 40 s budget."""
  c = base_config()
  c.algorithm = "fedat"
  c.dataset, c.model = "digits", "mlp"
  c.model_options.hidden_sizes = (32,)
  c.partition, c.classes_per_client, c.num_clients = "class_cyclic", 2, 10
  c.local_test_fraction = 0.2
  c.local_epochs, c.local_steps, c.batch_size, c.local_lr = 1, 0, BATCH, 3e-3
  c.seed = SEED
  c.fedat.clients_per_round = 2
  c.active_ratio = 0.2  # FedAvg / FedProx on the clock: 2 clients per round
  c.system.compute_model.step_cost_s = 0.5
  c.system.num_unstable = 3
  c.system.dropout_horizon_s = 20.0
  c.system.max_virtual_time_s = 40.0
  c.system.eval_interval_s = 10.0
  c.system.call_size_multiple = 10  # at most 5 tiers x 2 jobs pending: one compiled shape
  c.checkpoint_every = 2
  for key, value in changes.items():
    section, _, field = key.rpartition(".")
    target = c
    for part in filter(None, section.split(".")):
      target = target[part]
    target[field] = value
  return c


def clock_setup():
  """The federation, model and w0 of clock_config() (what training builds)."""
  c = clock_config()
  dataset = fdata.load_dataset("digits", data_dir="")
  fed = federation.build_federation(training.partition_spec(c), dataset)
  model, params, _ = training.build_model(c, dataset)
  return fed, model, params


@pytest.fixture(scope="module")
def setup():
  return clock_setup()


def simulate(config, setup):
  fed, model, params = setup
  sim = clock_run.build_simulator(training.clock_options(config), fed, model, params)
  sim.run()
  return sim


def tree_equal(a, b) -> bool:
  return jax.tree.all(jax.tree.map(
      lambda x, y: np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(x, y), a, b))


def comparable(ticks):
  """Tick records without wall time and FedAT's per-tier counts (FedAvg has none)."""
  return [{k: (np.asarray(v).tolist() if isinstance(v, np.ndarray) else v)
           for k, v in t.items() if k not in ("wall_time", "tier_updates")} for t in ticks]


# ---- one tier: FedAT = FedAvg through the real engine -------------------------------------------
def test_fedat_with_one_tier_equals_fedavg_on_the_clock(setup):
  degenerate = {"system.straggler_ranges": ((0.0, 0.0),), "system.num_unstable": 0,
                "system.num_tiers": 1, "system.max_virtual_time_s": 12.0,
                "system.compute_model.step_cost_s": 0.2}
  fedat = simulate(clock_config(**degenerate, **{"fedat.lam": 0.0,
                                                 "fedat.compression_precision": None}), setup)
  fedavg = simulate(clock_config(**degenerate, algorithm="fedavg", **{"system.clock": True}),
                    setup)
  assert fedat.method.global_updates == fedavg.method.global_updates >= 4
  assert fedat.event_log == fedavg.event_log
  assert fedat.messages == fedavg.messages
  assert comparable(fedat.ticks) == comparable(fedavg.ticks)
  assert tree_equal(fedat.method.global_model(), fedavg.method.global_model())
  # ... and training happened: the model moved away from w0.
  assert not tree_equal(fedat.method.global_model(), setup[2])


# ---- the engine trainer ----------------------------------------------------------------------
def reference_job(model, fed, params, anchor, client, index, epochs, prox, lr):
  """One job as a Python loop of jitted steps (Chai et al., SC'21, Sec. 4.1)."""
  loss_fn = local.make_loss_fn(model, False)
  tx = engine_adapter.local_solver("adam")
  ds = fed.dataset
  rows = fed.client_train[client]
  n, n_max = len(rows), max(len(ix) for ix in fed.client_train)

  @jax.jit
  def step(p, opt, x, y, mask):
    g = jax.grad(lambda q: loss_fn(q, {}, x, y, mask, None)[0])(p)
    g = jax.tree.map(lambda gi, pi, ai: gi + prox * (pi - ai), g, p, anchor)
    u, opt = tx.update(g, opt, p)
    return jax.tree.map(lambda pi, ui: pi - lr * ui, p, u), opt

  p, opt, steps = params, tx.init(params), 0
  for e in range(epochs):
    order = np.asarray(job_packing.epoch_order(SEED, client, index, e, n, n_max))
    assert sorted(order[:n]) == list(range(n))  # a permutation of the client's examples
    for b in range(-(-n // BATCH)):
      pos = order[b * BATCH:(b + 1) * BATCH]
      mask = np.zeros(BATCH, np.float32)
      mask[:len(pos)] = 1.0
      pos = np.pad(pos, (0, BATCH - len(pos)))
      idx = rows[np.where(pos < n, pos, 0)]
      p, opt = step(p, opt, ds.train_x[idx], ds.train_y[idx].astype(np.int32), mask)
      steps += 1
  return p, steps


def perturbed(params, scale, seed):
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(treedef, [
      np.asarray(x + scale * jax.random.normal(k, x.shape)) for x, k in zip(leaves, keys)])


def make_trainer(setup, multiple=4):
  fed, model, _ = setup
  return engine_adapter.EngineTrainer(model, fed.dataset.train_x, fed.dataset.train_y,
                                      fed.client_train, seed=SEED, batch_size=BATCH,
                                      max_epochs=2, lr=3e-3, call_size_multiple=multiple)


def test_engine_trainer_equals_a_per_job_reference_loop(setup):
  fed, model, params = setup
  starts = [perturbed(params, 0.05, 1), perturbed(params, 0.05, 2), params]
  jobs = [TrainJob(3, 0, starts[0], starts[0], 2, 0.4),
          TrainJob(7, 5, starts[1], starts[1], 1, 0.0),
          TrainJob(3, 1, starts[2], starts[2], 1, 0.4)]
  results = make_trainer(setup).train(jobs)
  for job, result in zip(jobs, results):
    expected, steps = reference_job(model, fed, job.start_model, job.anchor, job.client_id,
                                    job.index, job.num_epochs, job.prox_coeff, 3e-3)
    assert result.num_steps == steps == job.num_epochs * -(-len(fed.client_train[job.client_id])
                                                           // BATCH)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6),
                 result.model, expected)
  # Different starts, epochs and indices give different models.
  assert not tree_equal(results[0].model, results[2].model)


@pytest.mark.slow
def test_padding_and_bucketing_do_not_change_results(setup):
  _, _, params = setup
  start = perturbed(params, 0.05, 3)
  job = TrainJob(2, 4, start, start, 2, 0.4)
  others = [TrainJob(k, 1, params, params, 1, 0.0) for k in (0, 5, 9)]
  trainer = make_trainer(setup, multiple=4)
  padded = trainer.train([job] + others[:2])[0].model       # 3 jobs + 1 padded slot
  with_others = trainer.train([job] + others)[0].model      # the same bucket of 4, other jobs
  assert tree_equal(padded, with_others)  # a job's result does not depend on its companions
  alone = trainer.train([job])[0].model                     # bucket 1: a power of two below 4
  bigger = trainer.train([job] + others + others)[0].model  # 7 jobs: bucket 8
  assert trainer.call_sizes == [4, 4, 1, 8]
  tens = make_trainer(setup, multiple=10)
  assert [tens.padded_size(n) for n in (1, 2, 3, 5, 9, 10, 11, 17)] == [1, 2, 4, 8, 10, 10, 16,
                                                                         20]
  unpadded = make_trainer(setup, multiple=1).train([job])[0].model  # no padding at all
  for other in (alone, bigger, unpadded):  # other shapes: equal up to float32 rounding
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                 padded, other)


def test_jax_algebra_keeps_a_single_tree_and_sums_in_float32():
  algebra = engine_adapter.JaxAlgebra()
  tree = {"w": np.array([1.5, -0.0], np.float32)}
  assert algebra.weighted_sum([tree], [1.0]) is tree
  tiers = [{"w": np.float32(v)} for v in (1, 2, 3, 4, 5)]
  # known answers in tests/test_fedat_engine.py: counts [10, 7, 5, 3, 1], literal reading -> 50/13.
  weights = [1 / 26, 3 / 26, 5 / 26, 7 / 26, 10 / 26]
  out = algebra.weighted_sum(tiers, weights)
  assert out["w"].dtype == jnp.float32
  np.testing.assert_allclose(float(out["w"]), 50 / 13, rtol=1e-6)


# ---- the run contract ------------------------------------------------------------------------
def records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory):
  """FedAT on the clock, one uninterrupted run: (its workdir, its summary)."""
  whole = str(tmp_path_factory.mktemp("clock") / "whole")
  return whole, training.train_and_evaluate(clock_config(), whole)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, whole_run):
  """The uninterrupted run, and the same run interrupted after tick 1, then resumed."""
  c = clock_config()
  whole, summary = whole_run
  split = str(tmp_path_factory.mktemp("clock") / "split")
  interrupted = training.train_and_evaluate(c, split, stop_after_round=1)
  resumed = training.train_and_evaluate(c, split)
  return whole, split, summary, interrupted, resumed


@pytest.mark.slow
def test_interrupted_then_resumed_run_equals_uninterrupted(runs, setup):
  whole, split, summary, interrupted, resumed = runs
  assert interrupted == {"interrupted_after_tick": 1}
  strip = lambda rs: [{k: v for k, v in r.items() if k != "wall_seconds"} for r in rs]
  assert strip(records(whole)) == strip(records(split))
  assert len(records(whole)) == 5  # ticks at 0, 10, 20, 30, 40 s
  wall = ("wall_seconds", "wall_time")
  assert {k: v for k, v in summary.items() if k not in wall} == {
      k: v for k, v in resumed.items() if k not in wall}
  a, b = clock_run.latest_state(whole, setup[2]), clock_run.latest_state(split, setup[2])
  assert a["event_log"] == b["event_log"]
  assert tree_equal(a["method_state"]["model"], b["method_state"]["model"])
  assert tree_equal(a["method_state"]["tier_models"], b["method_state"]["tier_models"])


@pytest.mark.slow
def test_dropped_out_clients_never_report_again(whole_run, setup):
  state = clock_run.latest_state(whole_run[0], setup[2])
  log = state["event_log"]
  dropouts = {client: time for _, time, kind, client, _, _ in log if kind == "dropout"}
  assert len(dropouts) == 3 and all(t < 20.0 for t in dropouts.values())
  for client, gone in dropouts.items():
    later = [(time, kind) for _, time, kind, k, _, _ in log if k == client and time >= gone]
    assert later == [(gone, "dropout")]
  uploads = [(t, c) for t, d, _, c, _ in zip(*(state["messages"][k] for k in (
      "time", "direction", "bytes", "client", "kind"))) if d == 1]
  assert uploads and all(t < dropouts.get(c, np.inf) for t, c in uploads)


@pytest.mark.slow
def test_metrics_keys_summary_and_virtual_time_plot(runs):
  whole = runs[0]
  record = records(whole)[-1]
  for key in ("round", "virtual_time", "wall_seconds", "test_accuracy", "test_loss",
              "train_loss", "client_test_accuracy_mean", "client_test_accuracy_var",
              "client_test_accuracy", "bytes_up", "bytes_down", "comm_bytes", "comm_floats_up",
              "comm_floats_down", "global_updates", "tier_updates", "uploads", "downloads",
              "local_steps"):
    assert key in record, key
  assert record["virtual_time"] == 40.0 and len(record["client_test_accuracy"]) == 10
  assert record["comm_bytes"] == record["bytes_up"] + record["bytes_down"]
  # Precision 4 polyline messages are smaller than raw float32.
  assert record["bytes_up"] < 4 * record["comm_floats_up"]
  assert sum(record["tier_updates"]) == record["global_updates"] > 0
  with open(os.path.join(whole, "summary.json")) as f:
    summary = json.load(f)
  for key in ("best_accuracy", "mean_variance", "variance_at_best", "variance_last_quarter",
              "final_test_accuracy", "best_test_accuracy", "virtual_time", "stop_reason"):
    assert key in summary, key
  assert summary["stop_reason"] == "time_budget"
  for name in (clock_run.PLOT_FILE, "config.json"):
    assert os.path.getsize(os.path.join(whole, name)) > 0


def test_time_and_bytes_to_target_are_in_the_summary(tmp_path):
  c = clock_config(algorithm="fedprox", **{"system.clock": True, "system.num_unstable": 0,
                                           "system.max_virtual_time_s": 20.0,
                                           "system.target_accuracy": 0.01})
  summary = training.train_and_evaluate(c, str(tmp_path / "prox"))
  assert summary["method"] == "fedprox" and summary["time_to_target"] == 0.0
  assert summary["bytes_to_target"] == summary["bytes_to_target_down"] > 0


# ---- bad input stops before the workdir exists -----------------------------------------------
@pytest.mark.parametrize("changes, field", [
    ({"system.num_tiers": 0}, "config.system.num_tiers"),
    ({"system.compute_model.kind": "gpu"}, "config.system.compute_model.kind"),
    ({"system.compute_model.step_cost_s": (0.1, 0.2)}, "config.system.compute_model.step_cost_s"),
    ({"system.network_model.kind": "fixed",
      "system.network_model.bandwidth_up_bytes_per_s": -1.0},
     "config.system.network_model.bandwidth_up_bytes_per_s"),
    ({"system.straggler_ranges": ((5.0, 1.0),)}, "config.system.straggler_ranges"),
    ({"system.max_virtual_time_s": -1.0}, "config.system.max_virtual_time_s"),
    ({"system.local_optimizer": "lamb"}, "config.system.local_optimizer"),
    ({"system.polyline_mode": "zigzag"}, "config.system.polyline_mode"),
    ({"system.target_accuracy": 1.5}, "config.system.target_accuracy"),
    ({"system.call_size_multiple": 0}, "config.system.call_size_multiple"),
    ({"fedat.lam": -0.4}, "config.fedat.lam"),
    ({"fedat.cross_tier_weights": "rank"}, "config.fedat.cross_tier_weights"),
    ({"fedat.compression_precision": 99}, "config.fedat.compression_precision"),
    ({"algorithm": "fedasync", "fedasync.alpha": 2.0}, "config.fedasync.alpha"),
    ({"algorithm": "tifl", "tifl.tifl_prob_rule": "x"}, "config.tifl.tifl_prob_rule"),
    ({"algorithm": "asofed", "asofed.lam": -1.0}, "config.asofed.lam"),
    ({"algorithm": "fedprox", "system.clock": True,
      "system.baseline_compression_precision": -1},
     "config.system.baseline_compression_precision"),
    ({"algorithm": "scaffold", "system.clock": True}, "config.algorithm"),
    ({"local_epochs": 0, "local_steps": 10}, "config.local_epochs"),
    ({"local_test_fraction": 0.0}, "config.local_test_fraction"),
    ({"local_momentum": 0.9}, "config.local_momentum"),
])
def test_bad_clock_config_stops_before_the_workdir_exists(tmp_path, changes, field):
  workdir = tmp_path / "run"
  with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
    training.train_and_evaluate(clock_config(**changes), str(workdir))
  assert not workdir.exists()


def test_unknown_fields_and_names_list_what_is_accepted(tmp_path):
  c = clock_config()
  c.system.unlikely_field = 1
  with pytest.raises(ConfigError, match=r"config\.system\.unlikely_field is not a field"):
    training.train_and_evaluate(c, str(tmp_path / "a"))
  with pytest.raises(ConfigError, match="accepted: .*'fedat', 'tifl', 'fedasync', 'asofed'"):
    training.train_and_evaluate(clock_config(algorithm="fedatt"), str(tmp_path / "b"))
  assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_run_started_before_the_clock_sections_existed_still_resumes(tmp_path):
  """config.json of an older run lacks config.system / .fedat / ...: no change at defaults."""
  c = base_config()
  old = training.config_json(c)
  for name in config_lib.clock_sections():
    del old[name]
  (tmp_path / "config.json").write_text(json.dumps(old))
  training.check_workdir(str(tmp_path), c)
  c.system.num_tiers = 3  # a changed value is a different run
  with pytest.raises(ConfigError, match="fields: system"):
    training.check_workdir(str(tmp_path), c)


def test_a_run_started_before_an_option_was_added_to_its_section_still_resumes(tmp_path):
  """config.json of an older run lacks an option added later inside an existing section
  (fedadam.convention): no change while the option keeps its default; any other value, or a
  changed existing option, is a different run."""
  c = base_config()
  old = training.config_json(c)
  for name in ("fedadam", "fedyogi", "fedadagrad"):
    del old[name]["convention"]
  (tmp_path / "config.json").write_text(json.dumps(old))
  training.check_workdir(str(tmp_path), c)
  c.fedadam.convention = "flower"
  with pytest.raises(ConfigError, match="fields: fedadam\\)"):
    training.check_workdir(str(tmp_path), c)
  c.fedadam.convention = "paper"
  c.fedyogi.beta1 = 0.5
  with pytest.raises(ConfigError, match="fields: fedyogi\\)"):
    training.check_workdir(str(tmp_path), c)
