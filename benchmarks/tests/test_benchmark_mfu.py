"""The benchmark's FLOP figures and the engine's client maps. No timing thresholds:
only what the numbers are made of is checked, never how large a speed is."""
import dataclasses
import itertools
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from benchmarks import benchmark
from fedjax_lama import algorithms, models
from fedjax_lama.engine import (clients as clients_lib, cohort as cohort_lib, local,
                                plan as plan_lib, sync_round)

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = dict(clients=2, steps=2, batch=4, repeats=1, matmul_size=64)


def test_flops_per_sample_is_positive_and_one_count_for_every_plan():
  lax_count = benchmark.training_flops_per_sample("fedat_cnn", 8, conv_impl="lax")
  # About 26 MFLOP: 3 x the forward multiply-adds of conv 32/64/64 + dense 64/10, less the
  # input gradient of the first layer, plus elementwise work.
  assert 20e6 < lax_count < 32e6
  # The engine's plan computes the same useful work; its own count differs only by
  # elementwise bookkeeping (pads, concatenations count nothing, pooling differently).
  patches_count = benchmark.training_flops_per_sample("fedat_cnn", 8, conv_impl="patches")
  assert abs(patches_count - lax_count) <= 0.02 * lax_count
  # The per-sample count does not depend on the batch the step is compiled for.
  assert benchmark.training_flops_per_sample("fedat_cnn", 4) == pytest.approx(lax_count,
                                                                               rel=0.02)


@pytest.fixture(scope="module")
def tiny_runs():
  return {impl: benchmark.run("fedat_cnn", conv_impl=impl, central_impls=("engine",), **TINY)
          for impl in ("lax", "patches")}


@pytest.mark.parametrize("impl", ["lax", "patches"])
def test_json_has_the_mfu_figures(tiny_runs, impl):
  r = json.loads(json.dumps(tiny_runs[impl]))  # the JSON line round-trips
  for key in ("flops_per_sample", "engine_flops_per_s", "peak_flops_per_s", "mfu",
              "engine_samples_per_s", "loop_samples_per_s", "ratio", "central_samples_per_s",
              "engine_vs_central", "load_avg_before", "load_avg_after", "host_cpu",
              "host_cpu_count"):
    assert key in r, key
  assert r["host_cpu"] and r["host_cpu_count"] >= 1  # device_kind alone reads "cpu" on CPU
  assert not any("ceiling" in key for key in r)  # renamed: the centralized step is no limit
  assert r["engine_conv_impl"] == impl
  assert r["flops_per_sample"] > 0 and r["peak_flops_per_s"] > 0
  assert r["engine_flops_per_s"] == pytest.approx(r["flops_per_sample"] *
                                                  r["engine_samples_per_s"])
  assert r["mfu"] == pytest.approx(r["engine_flops_per_s"] / r["peak_flops_per_s"])
  assert r["loop_mfu"] == pytest.approx(r["flops_per_sample"] * r["loop_samples_per_s"] /
                                        r["peak_flops_per_s"])
  assert r["ratio"] == pytest.approx(r["engine_samples_per_s"] / r["loop_samples_per_s"])
  assert "engine" in benchmark.summary_line(r) and "MFU" in benchmark.summary_line(r)


def test_loop_and_engine_plans_share_the_flop_count(tiny_runs):
  """The count is of one un-vectorized lax step, whatever plan the engine runs."""
  assert tiny_runs["lax"]["flops_per_sample"] == tiny_runs["patches"]["flops_per_sample"]
  assert tiny_runs["lax"]["flops_per_sample"] == benchmark.training_flops_per_sample(
      "fedat_cnn", TINY["batch"])


def test_other_client_map_and_missing_peer_are_reported():
  r = benchmark.run("mlp", central_impls=(), compare_client_maps=True, peers=("fedjax",),
                    peers_path=os.environ.get("FEDJAX_LAMA_PEERS_PATH", ""), **TINY)
  other = "vmap" if r["engine_client_map"] == "scan" else "scan"
  assert r[f"engine_vs_engine_{other}"] == pytest.approx(
      r["engine_samples_per_s"] / r[f"engine_{other}_samples_per_s"])
  assert "central_samples_per_s" not in r
  if "fedjax_samples_per_s" in r:  # FedJAX installed: the same model, data and updates
    assert r["fedjax_max_param_diff"] < 1e-4
    assert r["engine_vs_fedjax"] == pytest.approx(r["engine_samples_per_s"] /
                                                  r["fedjax_samples_per_s"])
  else:
    assert "fedjax" in r["peers_skipped"]
  with pytest.raises(ValueError, match="unknown peer"):
    benchmark.run("mlp", central_impls=(), peers=("flower",), **TINY)


def test_other_conv_plans_are_timed_beside_the_engines_and_checked_against_it():
  r = benchmark.run("fedat_cnn", conv_impl="patches", central_impls=(), loop=False,
                    compare_conv_impls=("lax", "patches", "auto"), **TINY)
  assert r["engine_conv_impl"] == "patches"
  assert r["engine_vs_engine_lax"] == pytest.approx(r["engine_samples_per_s"] /
                                                    r["engine_lax_samples_per_s"])
  # The same clients, data and parameters: only float rounding separates the two plans.
  assert 0 <= r["engine_lax_max_param_diff"] < 1e-4
  # The engine's own plan ("patches", and "auto" resolving to it off TPU) is not timed twice.
  assert "engine_patches_samples_per_s" not in r
  assert "engine/engine_lax" in benchmark.summary_line(r)


def test_matmul_plan_counts_two_n_cubed():
  run, flops = benchmark.matmul_plan(16)
  assert flops == 2 * 16 ** 3
  assert run().shape == (16, 16)


@pytest.mark.parametrize("name, clients", [("fedat_cnn", 5), ("mlp", 6)])
def test_scan_client_map_equals_vmap(name, clients):
  """The "scan" client map (groups of clients in a lax.scan) trains every client exactly as
  "vmap" does, to float32 rounding, whatever the group size; and so does each map when every
  client's start is copied C times (state_axes all 0) instead of shared (the round's own
  `fresh_states(..., batched=False)`)."""
  model = models.get(name, num_classes=10, kernels="patches")
  shape = benchmark.INPUT_SHAPES.get(name, (32, 32, 3))
  steps, batch = 2, 3
  n = clients * steps * batch
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(n,) + shape).astype(np.float32))
  y = jnp.asarray(rng.integers(0, 10, n).astype(np.int32))
  params = model.init(jax.random.PRNGKey(0), x[:1])["params"]
  alg = algorithms.build("fedavg")
  example_mask = np.ones((clients, steps, batch), np.float32)
  example_mask[1, 1, 2] = 0.0
  step_mask = np.ones((clients, steps), np.float32)
  step_mask[2, 1] = 0.0  # a padded step
  cohort = cohort_lib.Cohort(jnp.asarray(np.arange(n, dtype=np.int32).reshape(clients, steps,
                                                                              batch)),
                            jnp.asarray(example_mask), jnp.asarray(step_mask),
                            jnp.ones(clients), jnp.arange(clients, dtype=jnp.int32),
                            jnp.full((clients,), float(steps * batch)))
  server = alg.server.init(params, {})
  outs = {}
  shared_start = clients_lib.fresh_states, clients_lib.ClientPhase

  class CopiedStartPhase(clients_lib.ClientPhase):
    def __init__(self, *args, state_axes=None, **kwargs):
      del state_axes  # every field with the client axis (the default)
      super().__init__(*args, **kwargs)

  copied_start = (lambda *args, batched=True, **kwargs: shared_start[0](*args, **kwargs),
                  CopiedStartPhase)
  for client_map, budget, start in itertools.product(
      ("vmap", "scan"), (None, 0, 1 << 40), ("shared", "copied")):
    if (client_map == "vmap") != (budget is None):
      continue
    plan = plan_lib.plan(client_map=client_map)
    if budget is not None:  # 0: one client per group; huge: one group (vmap)
      plan = dataclasses.replace(plan, scan_group_bytes=budget)
    if start == "copied":
      clients_lib.fresh_states, clients_lib.ClientPhase = copied_start
    try:
      train_chunk, server_update = sync_round.make_round_fns(
          local.make_loss_fn(model, False), alg, optax.constant_schedule(0.1), seed=0,
          weighting="examples", local_steps=steps, population=clients, plan=plan)
      sums, _, stats = train_chunk(server, {}, x, y, cohort, 0)
      outs[(client_map, budget, start)] = (server_update(server, sums).params, stats)
    finally:
      clients_lib.fresh_states, clients_lib.ClientPhase = shared_start
  assert len(outs) == 6
  ref = jax.tree.leaves(outs[("vmap", None, "shared")])
  for key, out in outs.items():
    for a, b in zip(jax.tree.leaves(out), ref):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=str(key))


def test_scan_group_sizes():
  assert local.resolve_client_map("auto", "cpu") == "scan"
  assert local.resolve_client_map("auto", "gpu") == "vmap"
  with pytest.raises(ValueError, match="client_map"):
    local.resolve_client_map("loop")
  devices = jax.device_count()
  # One client per device when a client's step alone fills the budget; the whole chunk when
  # all of them fit; in between the largest divisor that fits.
  assert local.scan_group(8 * devices, 10**12) == devices
  assert local.scan_group(8 * devices, 1, budget=100) == 8 * devices
  assert local.scan_group(12 * devices, 10, budget=45) == 4 * devices


def test_models_table_reports_the_loops_mfu_and_the_ceiling_it_sets():
  """The models table's ceiling column is 1 / loop MFU, and the rows whose ceiling is below
  1.5 are named (fake rows: only the arithmetic of the table is checked)."""
  from benchmarks import benchmark_tables  # pylint: disable=g-import-not-at-top

  def row(model, ratio, loop_mfu):
    return {"model": model, "clients": 8, "steps": 5, "batch": 32, "engine_conv_impl": "patches",
            "engine_client_map": "scan", "engine_samples_per_s": 100.0 * ratio,
            "loop_samples_per_s": 100.0, "ratio": ratio, "flops_per_sample": 1e6,
            "engine_flops_per_s": 1e8 * ratio, "peak_flops_per_s": 1e8 / loop_mfu,
            "mfu": ratio * loop_mfu, "loop_mfu": loop_mfu, "load_avg_before": [0.5],
            "load_avg_after": [0.7], "first_call_s": {"engine": 1.0}, "device_kind": "cpu",
            "platform": "cpu", "jax": jax.__version__}

  split = dict(row("small", 2.0, 0.1), engine_devices=2, cpu_devices=2)
  text = benchmark_tables.models_table([split, row("big", 1.1, 0.8)], "cmd")
  lines = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()
           if line.startswith("| small") or line.startswith("| big")}
  # The engine plan names the devices the clients were split over, of the process's.
  assert "| patches, scan, 2 of 2 |" in lines["small"]
  assert "| patches, scan, 1 of 1 |" in lines["big"]
  assert "| 0.100 | 10.00 |" in lines["small"]
  assert "| 0.800 | 1.25 |" in lines["big"]
  assert "Rows below the 1.5x target (engine/loop): big (1.10)." in text
  assert "stays below 1.5x the loop: big (1.25)." in text
  assert text.startswith("# Engine vs per-step loop and the hardware's limit, every image "
                         "model, CPU\n")
  assert "the FLOP/s of a 2048^3 float32 matmul" in text  # rows without the key: the default
  # A GPU table says so, and names the matmul its rows were timed against.
  gpu = [dict(r, platform="gpu", device_kind="NVIDIA H200", matmul_size=8192)
         for r in (split, row("big", 1.1, 0.8))]
  text = benchmark_tables.models_table(gpu, "cmd")
  assert text.splitlines()[0].endswith("every image model, GPU")
  assert "Machine: NVIDIA H200 (gpu)" in text
  assert "the FLOP/s of a 8192^3 float32 matmul" in text and "2048^3" not in text
  # The host's processor and cores come from the rows (rows of older JSON lack them).
  assert "; host ?, " in text
  text = benchmark_tables.models_table([dict(split, host_cpu="AMD EPYC", host_cpu_count=16)],
                                       "cmd")
  assert "jax " + jax.__version__ + "; host AMD EPYC, 16 CPU cores, shared" in text


def test_rounds_per_sample_reaches_the_minimum_sample_time():
  assert benchmark.rounds_per_sample(0.5, 0.2) == 1  # a slow round is timed alone
  assert benchmark.rounds_per_sample(0.2, 0.2) == 1
  assert benchmark.rounds_per_sample(0.001, 0.2) == 200
  assert benchmark.rounds_per_sample(0.03, 0.2) == 7  # ceil(6.67)
  assert benchmark.rounds_per_sample(0.001, 0.0) == 1  # 0: single calls, as before
  assert benchmark.rounds_per_sample(0.0, 0.2) >= 1


def test_time_averages_the_rounds_of_a_sample():
  calls = []
  assert benchmark.time_calls(lambda: calls.append(1) or jnp.zeros(()), rounds=5) >= 0
  assert len(calls) == 5


def test_json_reports_the_rounds_per_sample(tiny_runs):
  r = tiny_runs["patches"]
  assert r["min_sample_s"] == benchmark.MIN_SAMPLE_S
  assert set(r["rounds_per_sample"]) >= {"engine", "loop", "matmul"}
  assert all(isinstance(k, int) and k >= 1 for k in r["rounds_per_sample"].values())


def test_models_table_names_the_rounds_per_sample():
  from benchmarks import benchmark_tables  # pylint: disable=g-import-not-at-top
  row = {"model": "m", "clients": 8, "steps": 5, "batch": 32, "engine_conv_impl": "patches",
         "engine_client_map": "scan", "engine_samples_per_s": 200.0, "loop_samples_per_s": 100.0,
         "ratio": 2.0, "flops_per_sample": 1e6, "engine_flops_per_s": 2e8,
         "peak_flops_per_s": 1e9, "mfu": 0.2, "loop_mfu": 0.1, "load_avg_before": [0.5],
         "load_avg_after": [0.7], "first_call_s": {"engine": 1.0}, "device_kind": "cpu",
         "platform": "cpu", "jax": jax.__version__, "min_sample_s": 0.2,
         "rounds_per_sample": {"engine": 40, "loop": 25, "matmul": 3}}
  text = benchmark_tables.models_table([row], "cmd")
  assert "rounds lasting at least 0.2 s" in text
  assert "| 40 / 25 |" in text
  old = {k: v for k, v in row.items() if k not in ("min_sample_s", "rounds_per_sample")}
  assert "a plan's timed sample is one round:" in benchmark_tables.models_table([old], "cmd")
  assert "rounds per sample" not in benchmark_tables.markdown([old])


def test_central_flag_rejects_an_unknown_plan_before_running_anything():
  proc = subprocess.run([sys.executable, "-m", "benchmarks.benchmark", "--central=lax,fast"],
                        capture_output=True, text=True, timeout=120,
                        cwd=REPO)
  assert proc.returncode != 0
  assert "--central: fast not accepted" in proc.stderr
  assert "lax, engine" in proc.stderr


def test_models_table_times_wrn_at_the_issues_size_with_its_own_options(monkeypatch):
  """--models_table runs every row at 8 x 5 x 32, WRN-28-10 included; TABLE_ROW_OPTIONS
  replaces only the options it names (fake benchmark.run: no training), and the table names
  the rows timed with fewer rounds."""
  from benchmarks import benchmark_grid, benchmark_tables  # pylint: disable=g-import-not-at-top
  calls = {}

  def fake_run(name, **options):
    calls[name] = options
    return {"model": name, "clients": options["clients"], "steps": options["steps"],
            "batch": options["batch"], "repeats": options["repeats"], "ratio": 2.0,
            "mfu": 0.2, "load_avg_before": [0.5]}

  monkeypatch.setattr(benchmark, "run", fake_run)
  rows = benchmark_grid.throughput(
      ["resnet20", "wrn28_10"], [8], [5], 32, 3, "auto", central_impls=("engine",),
      compare_client_maps=True, row_options=benchmark_grid.TABLE_ROW_OPTIONS, matmul_size=8192)
  assert [(r["clients"], r["steps"], r["batch"]) for r in rows] == [(8, 5, 32)] * 2
  # The peak's matmul size reaches every row (a GPU needs 8192^3 to be timed at all).
  assert calls["resnet20"]["matmul_size"] == calls["wrn28_10"]["matmul_size"] == 8192
  assert calls["resnet20"]["repeats"] == 3 and calls["resnet20"]["compare_client_maps"]
  assert calls["resnet20"]["central_impls"] == ("engine",)
  assert calls["wrn28_10"]["repeats"] == 1 and not calls["wrn28_10"]["compare_client_maps"]
  assert calls["wrn28_10"]["central_impls"] == ()
  assert benchmark_grid.TABLE_SIZE == (8, 5, 32)

  def row(model, repeats):
    return {"model": model, "clients": 8, "steps": 5, "batch": 32, "repeats": repeats,
            "engine_conv_impl": "patches", "engine_client_map": "scan",
            "engine_samples_per_s": 200.0, "loop_samples_per_s": 100.0, "ratio": 2.0,
            "flops_per_sample": 1e6, "engine_flops_per_s": 2e8, "peak_flops_per_s": 1e9,
            "mfu": 0.2, "loop_mfu": 0.1, "load_avg_before": [0.5], "load_avg_after": [0.7],
            "first_call_s": {"engine": 1.0}, "device_kind": "cpu", "platform": "cpu",
            "jax": jax.__version__}

  text = benchmark_tables.models_table([row("a", 3), row("b", 3), row("wrn28_10", 1)], "cmd")
  assert "Timed rounds per plan: 3, except wrn28_10 (1)" in text
  assert "Timed rounds per plan" not in benchmark_tables.models_table([row("a", 3)], "cmd")
