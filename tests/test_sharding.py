"""The client axis sharded over 8 (fake CPU) devices equals the single-device run.

The device count is fixed when jax starts, so each run is a subprocess
(`python -m tests.test_sharding OUT MESH_SIZE CASE...`, its CPU device count set
before any device exists). The 1-device and the 8-device runs go concurrently
under the same flags; each writes its final parameters, per-client rows, losses
and where the client-axis outputs live, and this process compares. Cohort
sizes 7, 8, 9 and 33 cover fewer clients than devices, exactly as many, one
more (padded to 16) and many (padded to 40). A slow test repeats FedAvg as 2
processes x 2 devices joined by jax.distributed (multi-host on one machine).
"""
import json
import os
import pathlib
import socket
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_lama import config as config_lib
from fedjax_lama import data as fdata
from fedjax_lama import federation, training
from fedjax_lama.algorithms import common
from fedjax_lama.engine import sharding
from fedjax_lama.engine.algorithm import Algorithm, displacement, server_opt
from fedjax_lama.programs import round_program as programs_common
from fedjax_lama.programs.sync import SyncProgram

REPO = pathlib.Path(__file__).resolve().parent.parent
COHORTS = (7, 8, 9, 33)
NUM_CLIENTS = 40


class TinyMLP(nn.Module):
  num_classes: int = 3

  @nn.compact
  def __call__(self, x, train=False):
    x = nn.relu(nn.Dense(8)(x.reshape((x.shape[0], -1))))
    return nn.Dense(self.num_classes)(x)


def tiny_config(**overrides):
  """A few rounds of a few local steps: shapes small enough to compile in well under a second."""
  c = config_lib.base_config()
  c.num_clients = NUM_CLIENTS
  c.local_steps = 2
  c.batch_size = 4
  c.rounds = 2
  c.local_lr = 0.2
  c.local_momentum = 0.5
  c.fedlama.base_interval = 1
  c.fedlama.phi = 2
  c.fedlama.total_steps = 4
  for k, v in overrides.items():
    target = c
    *parents, leaf = k.split(".")
    for p in parents:
      target = target[p]
    target[leaf] = v
  return c


def tiny_federation(num_clients=NUM_CLIENTS, seed=0):
  """Synthetic 2x2 'images' of 3 classes, split IID (unequal sizes keep weights non-trivial)."""
  rng = np.random.default_rng(seed)
  n = 12 * num_clients
  y = rng.integers(0, 3, n).astype(np.int32)
  x = (rng.normal(size=(n, 2, 2, 1)) + y[:, None, None, None]).astype(np.float32)
  ds = fdata.Dataset("synthetic", x, y, x[:50], y[:50], 3)
  cuts = np.sort(rng.choice(np.arange(1, n), num_clients - 1, replace=False))
  return federation.Federation(ds, [np.asarray(c, np.int64) for c in np.split(np.arange(n), cuts)],
                               None)


def row_algorithm():
  """FedAvg plus SCAFFOLD-like per-client rows that steer local steps and change every round."""

  def correct(grads, params, ctx):
    del params
    return jax.tree.map(lambda g, c: g + 0.1 * c, grads, ctx.row["c"])

  def row_init(params):
    return {"c": optax.tree.zeros_like(params), "n": jnp.zeros((), jnp.float32)}

  def finish(final, ctx, info):
    del info
    delta = displacement(final, ctx)
    c = jax.tree.map(lambda c, d: 0.5 * c - d, ctx.row["c"], delta)
    return {"delta": delta}, {"c": c, "n": ctx.row["n"] + 1}

  shared = common.Common(local_momentum=0.5)
  return Algorithm(local=common.local_optimizer(shared, correction=correct),
                   server=server_opt(common.server_sgd(shared)), row_init=row_init,
                   finish=finish)


def build(config, mesh, fed=None, with_rows=False):
  fed = fed if fed is not None else tiny_federation()
  model = TinyMLP()
  params = model.init(jax.random.PRNGKey(config.seed), fed.dataset.train_x[:1])["params"]
  if with_rows:
    return SyncProgram(training.run_options(config, fed), row_algorithm(), model, params, {},
                       fed, mesh)
  return training.build_program(config, model, params, {}, fed, mesh)


def run(program, rounds=None):
  state = program.init_state()
  outs = []
  for r in range(rounds or program.num_rounds):
    state, out = program.run_round(state, r)
    outs.append(out)
  return state, outs


def _flat(tree):
  return [np.asarray(sharding.to_host(x)) for x in jax.tree.leaves(tree)]


def _spec(x):
  return str(x.sharding.spec) if hasattr(x.sharding, "spec") else type(x.sharding).__name__


def _case(kind, cohort, mesh):
  """Final parameters (and the placement of client-axis arrays) of one small run.

  kind: "fedavg" (per-client rows on device), "fedavg_host" (rows on host) or "fedlama".
  """
  ratio = cohort / NUM_CLIENTS
  if kind.startswith(("algo-", "lama-", "dp-", "dpadaptive-")):
    # The contract table (tests/test_algorithm_contract.py), with DP on for "dp-" and
    # "dpadaptive-" (tests/test_privacy_contract.py; the clip, the stage's state, compared too).
    from tests import test_algorithm_contract as contract  # pylint: disable=g-import-not-at-top
    name = kind.split("-", 1)[1]
    if kind.startswith("dp"):
      from tests import test_privacy_contract as dp  # pylint: disable=g-import-not-at-top
      config = dp.dp_config_for(name, kind.startswith("dpadaptive-"), active_ratio=ratio)
    else:
      config = contract.config_for(name, kind.startswith("lama-"), active_ratio=ratio,
                                   weighting="uniform")
    program = build(config, mesh)
    state, outs = run(program)
    server = state["fedlama"].server if kind.startswith("lama-") else state["server"]
    rows = program.store.to_numpy() if program.store is not None else {}
    stage = state.get("aggregation", {}) if kind.startswith("dp") else {}
    return _flat(server) + _flat(rows) + _flat(stage), [o.train_loss for o in outs], []
  if kind == "fedlama":
    program = build(tiny_config(algorithm="fedlama", active_ratio=ratio, weighting="uniform"),
                    mesh)
    state, outs = run(program)
    state = state["fedlama"]
    m = program.num_slots
    slots = jax.tree.map(lambda a: a[:m], state.slots.params)
    result = _flat(state.server.params) + _flat(slots)
    placed = {"slots_" + _spec(x) for x in jax.tree.leaves(state.slots)}
    placed |= {"global_" + _spec(x) for x in jax.tree.leaves(state.server.params)}
  else:
    config = tiny_config(active_ratio=ratio,
                         **{"engine.client_state_on_host": kind == "fedavg_host"})
    program = build(config, mesh, with_rows=True)
    state, outs = run(program)
    result = _flat(state["server"].params) + _flat(program.store.to_numpy())
    # The vmapped per-client outputs of one chunk, as the round produces them.
    packed = programs_common.pack(program.opts, program.fed, program.opts.sampler.sample(0), 0,
                                  program.chunk_size, program.num_steps)
    _, new_rows, stats = program.train_chunk(
        state["server"], program.store.gather(packed.client_ids), program.data_x,
        program.data_y, sharding.shard_clients(packed, mesh), 0)
    per_client = jax.tree.leaves((new_rows, stats))
    placed = {"vmapped_" + _spec(x) for x in per_client}
    placed |= {f"shard_rows_{x.addressable_shards[0].data.shape[0]}" for x in per_client}
    placed |= {"server_" + _spec(x) for x in jax.tree.leaves(state["server"])}
    if kind == "fedavg":
      placed |= {"store_" + _spec(x) for x in jax.tree.leaves(program.store.rows)}
  loss = [o.train_loss for o in outs]
  return result, loss, sorted(placed)


def worker(out_path, mesh_size, cases, case=None):
  """Entry point of the subprocesses: every case ("fedavg:7", ...) on a mesh of the first
  `mesh_size` devices (0: all devices of all processes).

  FEDJAX_TEST_CPU_DEVICES sets the CPU devices of this process (before any device exists);
  with FEDJAX_TEST_NUM_PROCESSES > 1 it joins a multi-process run (gloo collectives).
  case(kind, cohort, mesh) -> (params, losses, placement) runs one case (default `_case`).
  """
  case = case or _case
  devices = int(os.environ["FEDJAX_TEST_CPU_DEVICES"])
  processes = int(os.environ.get("FEDJAX_TEST_NUM_PROCESSES", "1"))
  if jax.config.jax_num_cpu_devices != devices:  # unless the caller's module set it first
    jax.config.update("jax_num_cpu_devices", devices)
  if processes > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(os.environ["FEDJAX_TEST_COORDINATOR"], num_processes=processes,
                               process_id=int(os.environ["FEDJAX_TEST_PROCESS_ID"]))
  assert jax.device_count() == devices * processes, jax.devices()
  mesh = sharding.client_mesh(jax.devices()[:mesh_size] if mesh_size else None)
  report = {}
  for name in cases:
    kind, cohort = name.split(":")
    params, loss, placed = case(kind, int(cohort), mesh)
    report[name] = {"params": [p.tolist() for p in params], "loss": loss, "placed": placed}
  if jax.process_index() == 0:
    pathlib.Path(out_path).write_text(json.dumps(report))


def _spawn(out, mesh_size, cases, devices=8, processes=1, module="tests.test_sharding"):
  """Starts the worker of `module` (`processes` of them for a multi-process run)."""
  # The cheaper CPU backend optimisation only shortens compilation; every run uses it.
  env = dict(os.environ, JAX_PLATFORMS="cpu", FEDJAX_TEST_CPU_DEVICES=str(devices),
             FEDJAX_TEST_NUM_PROCESSES=str(processes),
             XLA_FLAGS=("--xla_backend_optimization_level=0 "
                        "--xla_llvm_disable_expensive_passes=true"),
             PYTHONPATH=os.pathsep.join([str(REPO)] + [
                 p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
  if processes > 1:
    with socket.socket() as sock:
      sock.bind(("localhost", 0))
      env["FEDJAX_TEST_COORDINATOR"] = f"localhost:{sock.getsockname()[1]}"
  return [subprocess.Popen(
      [sys.executable, "-m", module, str(out), str(mesh_size), *cases], cwd=REPO,
      env=dict(env, FEDJAX_TEST_PROCESS_ID=str(i)), stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE, text=True) for i in range(processes)]


def _compare(reference_procs, sharded_procs, out_dir, cases):
  """Waits for both runs; per case the max |difference| of every parameter and row."""
  for name, procs in (("1-device", reference_procs), ("sharded", sharded_procs)):
    for proc in procs:
      _, err = proc.communicate(timeout=900)
      assert proc.returncode == 0, f"{name} run failed:\n{err[-4000:]}"
  one, many = (json.loads((out_dir / f"{n}.json").read_text()) for n in ("one", "many"))
  report = {}
  for case in cases:
    a = [np.asarray(p, np.float32) for p in one[case]["params"]]
    b = [np.asarray(p, np.float32) for p in many[case]["params"]]
    report[case] = {
        "max_abs_diff": max(float(np.max(np.abs(x - y))) for x, y in zip(a, b)),
        "max_abs": max(float(np.max(np.abs(x))) for x in a),
        "loss_1": one[case]["loss"], "loss_many": many[case]["loss"],
        "placed": many[case]["placed"]}
  return report


def eight_devices_vs_one(out_dir, cases, module="tests.test_sharding"):
  """The cases on 1 device and on 8, as two concurrent subprocesses with identical flags
  (`module`'s worker runs them)."""
  return _compare(_spawn(out_dir / "one.json", 1, cases, module=module),
                  _spawn(out_dir / "many.json", 0, cases, module=module), out_dir, cases)


# The default run keeps to the padded cohorts (9 -> 16 and 33 -> 40 slots, a few seconds
# of compilation each); `-m slow` adds the other sizes, FedLAMA's included.
FAST = ["fedavg:9", "fedavg:33", "fedlama:9"]
SLOW = [f"{kind}:{c}" for kind in ("fedavg", "fedlama") for c in COHORTS
        if f"{kind}:{c}" not in FAST]


@pytest.fixture(scope="module")
def eight_device_report(tmp_path_factory):
  return eight_devices_vs_one(tmp_path_factory.mktemp("sharding"), FAST)


@pytest.fixture(scope="module")
def eight_device_report_slow(tmp_path_factory):
  return eight_devices_vs_one(tmp_path_factory.mktemp("sharding"), SLOW)


def _check_equal(r):
  assert r["max_abs"] > 0.05  # the parameters moved: the comparison is not vacuous
  assert r["max_abs_diff"] <= 1e-5 * max(1.0, r["max_abs"]), r
  np.testing.assert_allclose(r["loss_many"], r["loss_1"], rtol=1e-5)


def _check_placement(kind, cohort, placed, devices=8):
  placed = set(placed)
  if kind == "fedlama":
    assert {p for p in placed if p.startswith("slots_")} == {"slots_P('clients',)"}, placed
    assert {p for p in placed if p.startswith("global_")} == {"global_P()"}, placed
    return
  chunk = sharding.padded_size(cohort, _Devices(devices))
  # Per-client outputs of the vmapped chunk (and the device client store): split over the
  # devices, C/D rows each.
  assert {"vmapped_P('clients',)", f"shard_rows_{chunk // devices}"} <= placed, placed
  assert "vmapped_P()" not in placed
  if kind == "fedavg":
    assert {p for p in placed if p.startswith("store_")} == {"store_P('clients',)"}, placed
  # Server state: replicated.
  assert {p for p in placed if p.startswith("server_")} == {"server_P()"}


# The default suite keeps 8 devices = 1 through the contract table (test_algorithm_contract)
# and the aggregation stage; this report's placement checks run with -m slow.
@pytest.mark.slow
@pytest.mark.parametrize("case", FAST)
def test_eight_devices_equal_one_device(eight_device_report, case):
  kind, cohort = case.split(":")
  _check_equal(eight_device_report[case])
  _check_placement(kind, int(cohort), eight_device_report[case]["placed"])


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW)
def test_eight_devices_equal_one_device_more_cohorts(eight_device_report_slow, case):
  kind, cohort = case.split(":")
  _check_equal(eight_device_report_slow[case])
  _check_placement(kind, int(cohort), eight_device_report_slow[case]["placed"])


@pytest.mark.slow
def test_two_processes_equal_one_device(tmp_path):
  """Multi-host on one machine: 2 processes x 2 CPU devices (jax.distributed + gloo)."""
  cases = ["fedavg:9", "fedavg_host:9"]
  report = _compare(_spawn(tmp_path / "one.json", 1, cases),
                    _spawn(tmp_path / "many.json", 0, cases, devices=2, processes=2),
                    tmp_path, cases)
  for case in cases:
    _check_equal(report[case])
    _check_placement(case.split(":")[0], 9, report[case]["placed"], devices=4)


class _Devices:
  def __init__(self, size):
    self.size = size


def test_padded_size():
  assert sharding.padded_size(7, sharding.client_mesh(jax.devices()[:1])) == 7
  assert [sharding.padded_size(n, _Devices(8)) for n in (1, 7, 8, 9, 33)] == [8, 8, 8, 16, 40]
  assert sharding.padded_size(9, _Devices(8), multiple=3) == 24


if __name__ == "__main__":
  worker(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
