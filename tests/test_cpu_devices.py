"""One JAX device per CPU core, and which runs split their clients over them.

`sharding.use_cpu_device_per_core` sets the CPU device count before JAX starts (so its
checks run in subprocesses); `sharding.client_devices` picks a run's devices by the rule
measured on a 2-core box (`plan_lib.splits_cpu_cohort`); the scan map's groups follow the
run's mesh, not the process's device count; `sharding.call_devices` gives each call of the
simulated clock's trainer the devices that leave it unpadded. The platform plan routes each backend and reads the
client map from the environment only when asked.
"""
import json
import os
import pathlib
import subprocess
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lama import config as config_lib
from fedjax_lama import models, training
from fedjax_lama.errors import ConfigError
from fedjax_lama.engine import local, plan as plan_lib, sharding
from tests.conftest import shared_data_dir_or_skip

REPO = pathlib.Path(__file__).resolve().parent.parent


class FakeDevice(NamedTuple):
  id: int
  process_index: int
  platform: str


def _params(n):
  return {"w": np.zeros((n,), np.float32)}


def test_client_devices_splits_the_cpu_for_small_models_with_real_steps():
  cpu = [FakeDevice(i, i // 2, "cpu") for i in range(4)]  # 2 processes x 2 devices
  small = _params(sharding.CPU_SPLIT_MAX_PARAMS)
  large = _params(sharding.CPU_SPLIT_MAX_PARAMS + 1)
  big_step, tiny_step = sharding.CPU_SPLIT_MIN_STEP_BYTES, sharding.CPU_SPLIT_MIN_STEP_BYTES - 1
  assert sharding.client_devices(small, big_step, devices=cpu) == cpu
  assert sharding.client_devices(small, big_step, 6, devices=cpu) == cpu  # 2 divides 6
  # Otherwise one device per process: the first of each, in order; so too for a cohort
  # that the devices of a process do not divide (no padded client on shared cores).
  assert sharding.client_devices(large, big_step, devices=cpu) == [cpu[0], cpu[2]]
  assert sharding.client_devices(small, tiny_step, devices=cpu) == [cpu[0], cpu[2]]
  assert sharding.client_devices(small, big_step, 5, devices=cpu) == [cpu[0], cpu[2]]
  six = [FakeDevice(i, 0, "cpu") for i in range(6)]
  assert sharding.client_devices(small, big_step, 4, devices=six) == six[:2]
  gpu = [FakeDevice(i, 0, "gpu") for i in range(4)]  # accelerators: always every device
  assert sharding.client_devices(large, tiny_step, 5, devices=gpu) == gpu


class _MeshDevice:  # a fake device numpy keeps whole in a Mesh's device array
  def __init__(self, i, process_index, platform):
    self.id, self.process_index, self.platform = i, process_index, platform


def _padded_to_devices(num_jobs):
  return lambda mesh: sharding.padded_size(num_jobs, mesh)


def test_call_devices_take_no_more_devices_than_leave_the_call_unpadded():
  cpu = [_MeshDevice(i, i // 4, "cpu") for i in range(8)]  # 2 processes x 4 devices
  mesh = sharding.client_mesh(cpu)
  ids = lambda n: [d.id for d in sharding.call_devices(mesh, _padded_to_devices(n)).devices.flat]
  assert ids(8) == list(range(8))   # 4 per process: bucket 8, as on 1 per process
  assert ids(4) == [0, 1, 4, 5]     # 2 per process: bucket 4; 4 per process would pad to 8
  assert ids(3) == [0, 1, 4, 5]     # one padded job either way
  assert ids(6) == [0, 4]           # 2 per process pads 6 to 8: one device per process
  assert ids(1) == [0, 4]
  assert sharding.call_devices(mesh, _padded_to_devices(8)) is mesh
  gpu = sharding.client_mesh([_MeshDevice(i, 0, "gpu") for i in range(4)])
  assert sharding.call_devices(gpu, _padded_to_devices(1)) is gpu  # accelerators: every device


_CLOCK_TRAINER = """
import json
import jax
jax.config.update("jax_num_cpu_devices", 2)
import numpy as np
from fedjax_lama import federation, training
from fedjax_lama.data import datasets
from fedjax_lama.engine import sharding
from fedjax_lama.simulation.interfaces import TrainJob
from tests import test_fedat_engine as t
config, dataset = t.clock_config(), datasets.load_dataset("digits", data_dir="")
fed = federation.build_federation(training.partition_spec(config), dataset)
model, params, _ = training.build_model(config, dataset)
trainers = {n: t.engine_adapter.EngineTrainer(
    model, fed.dataset.train_x, fed.dataset.train_y, fed.client_train, seed=t.SEED,
    batch_size=t.BATCH, max_epochs=2, lr=3e-3, mesh=sharding.client_mesh(jax.devices()[:n]),
    call_size_multiple=4) for n in (1, 2)}
split = trainers[2]
narrowed = split._tables_on(split.call_mesh(1))
pointer = lambda a: a.addressable_data(0).unsafe_buffer_pointer()
out = {"devices": [split.call_mesh(n).size for n in (1, 2, 3, 4, 5)],
       "no_copy": [pointer(a) == pointer(b) for a, b in zip(split._tables, narrowed)],
       "narrowed_devices": [len(a.devices()) for a in narrowed], "calls": []}
for n in (1, 2, 3):
  jobs = [TrainJob(k, 0, t.perturbed(params, 0.05, k), params, 1 + k % 2, 0.4) for k in range(n)]
  got = [r.model for r in split.train(jobs)]
  want = [r.model for r in trainers[1].train(jobs)]
  diff = max(float(np.max(np.abs(a - b))) for g, w in zip(got, want)
             for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(w)))
  out["calls"].append([n, split.call_sizes[-1], diff])
print(json.dumps(out))
"""


@pytest.mark.slow
def test_clock_trainer_runs_each_call_on_the_devices_that_leave_it_unpadded():
  """Two CPU devices: a call of 1 job, which a second device would pad, runs on one device,
  reading the replicated tables without a copy; calls of 2 to 5 jobs (buckets 2, 4, 4, 8 on
  one device or two) on both; every call trains what a one-device trainer trains, to
  float32 rounding."""
  out = subprocess.run([sys.executable, "-c", _CLOCK_TRAINER], cwd=REPO, capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["devices"] == [1, 2, 2, 2, 2]
  assert result["no_copy"] == [True] * 4 and result["narrowed_devices"] == [1] * 4
  assert [(jobs, bucket) for jobs, bucket, _ in result["calls"]] == [(1, 1), (2, 2), (3, 4)]
  assert all(diff < 1e-5 for _, _, diff in result["calls"]), result


def test_scan_groups_follow_the_mesh_not_the_process():
  # A step that fills the budget alone: one client per device of the mesh it runs on.
  assert local.scan_group(8, 10**12, devices=1) == 1
  assert local.scan_group(8, 10**12, devices=2) == 2
  assert local.scan_group(6, 10**12, devices=4) == 2  # gcd(6, 4): what divides the cohort
  assert local.scan_group(8, 10**12) == np.gcd(8, jax.device_count())


@pytest.mark.parametrize("name,shape,split", [("mlp", (8, 8, 1), False),
                                               ("mnist_mlp", (28, 28, 1), True),
                                               ("mnist_cnn", (28, 28, 1), True)])
@pytest.mark.slow
def test_step_bytes_puts_the_measured_models_on_their_side(name, shape, split):
  """mlp on 8x8 digits lost with the split (0.86x to 0.89x); mnist_mlp (1.13x) and
  mnist_cnn (1.58x) gained."""
  model = models.get(name, num_classes=10)
  variables = model.init(jax.random.PRNGKey(0), jnp.zeros((1,) + shape), train=False)
  loss_fn = local.make_loss_fn(model, False)
  batch = lambda b: (jax.ShapeDtypeStruct((b,) + shape, jnp.float32),
                     jax.ShapeDtypeStruct((b,), jnp.int32))
  small = local.step_bytes(loss_fn, variables["params"], {}, *batch(32))
  large = local.step_bytes(loss_fn, variables["params"], {}, *batch(64))
  assert small < large
  assert (small >= sharding.CPU_SPLIT_MIN_STEP_BYTES) == split
  cpu = [FakeDevice(0, 0, "cpu"), FakeDevice(1, 0, "cpu")]
  assert len(sharding.client_devices(variables["params"], small, devices=cpu)) == (
      2 if split else 1)


_PROBE = """
import os, sys, jax
from fedjax_lama.engine import sharding
case = sys.argv[1]
if case == "fresh":
  print(sharding.use_cpu_device_per_core(3), jax.device_count())
elif case == "default":
  print(sharding.use_cpu_device_per_core(), jax.device_count(), len(os.sched_getaffinity(0)))
elif case == "forced":
  print(sharding.use_cpu_device_per_core(3), jax.device_count())
elif case == "late":
  jax.numpy.zeros(1).block_until_ready()
  try:
    sharding.use_cpu_device_per_core(3)
  except RuntimeError as e:
    print("RuntimeError", e)
"""


def _probe(case, **env):
  out = subprocess.run([sys.executable, "-c", _PROBE, case], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu", **env))
  assert out.returncode == 0, out.stderr[-2000:]
  return out.stdout.strip()


def test_use_cpu_device_per_core_sets_the_count_before_jax_starts():
  env = {"XLA_FLAGS": ""}
  assert _probe("fresh", **env) == "3 3"
  count, devices, cores = _probe("default", **env).split()
  assert count == devices == cores
  # A count the user chose is kept.
  assert _probe("forced", XLA_FLAGS="--xla_force_host_platform_device_count=2") == "2 2"
  late = _probe("late", **env)
  assert late.startswith("RuntimeError") and "before any JAX computation" in late


@pytest.mark.slow  # two CLI runs end to end (about 40 s)
def test_cli_splits_the_cpu_and_trains_as_one_device(tmp_path):
  """The CLI with two CPU devices splits mnist_cnn's clients over both (summary
  `client_devices`) and ends where the same run on one device ends."""
  config = tmp_path / "mnist_cnn_tiny.py"
  config.write_text(
      "from fedjax_lama.config import base_config\n\n"
      "def get_config():\n"
      "  c = base_config()\n"
      "  c.update(dict(dataset='mnist', model='mnist_cnn', partition='iid', num_clients=4,\n"
      "                rounds=2, local_steps=2, batch_size=32, eval_every=2,\n"
      f"                checkpoint_every=2, data_dir={shared_data_dir_or_skip()!r}))\n"
      "  return c\n")
  overrides = [f"--config={config}"]
  # Both runs at once: most of each is start-up (imports, MNIST, compiling), one core's work.
  # (Logs go to files: a full pipe would stall the run not yet waited for.)
  logs = {devices: tmp_path / f"cpu{devices}.log" for devices in (1, 2)}
  procs = {}
  for devices, log in logs.items():
    with log.open("w") as stderr:
      procs[devices] = subprocess.Popen(
          [sys.executable, "-m", "experiments.main", f"--cpu_devices={devices}",
           f"--workdir={tmp_path / f'cpu{devices}'}", *overrides], cwd=REPO,
          stdout=subprocess.DEVNULL, stderr=stderr,
          env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=""))
  runs = {}
  for devices, proc in procs.items():
    assert proc.wait(timeout=600) == 0, logs[devices].read_text()[-3000:]
    runs[devices] = json.loads((tmp_path / f"cpu{devices}" / "summary.json").read_text())
  assert runs[1]["client_devices"] == 1
  assert runs[2]["client_devices"] == 2
  np.testing.assert_allclose(runs[2]["final_test_loss"], runs[1]["final_test_loss"], rtol=1e-4)
  np.testing.assert_allclose(runs[2]["final_test_accuracy"], runs[1]["final_test_accuracy"],
                             atol=1e-3)


@pytest.mark.parametrize("backend,kernel_set,client_map,options,rule", [
    ("cpu", "patches", "scan", True, True), ("gpu", "patches", "vmap", False, False),
    ("tpu", "lax", "vmap", False, False)])
def test_the_platform_plan_routes_each_backend(backend, kernel_set, client_map, options, rule):
  plan = plan_lib.plan(backend, client_map="auto")
  assert (plan.platform, plan.kernels, plan.client_map) == (backend, kernel_set, client_map)
  assert (plan.jit_compiler_options() == plan_lib.CPU_TRAINING_COMPILER_OPTIONS) == options
  assert plan.jit_compiler_options() is None or options
  assert plan.cpu_device_rule == rule
  assert plan_lib.plan(backend, "lax", "vmap").kernels == "lax"


def test_the_client_map_comes_from_the_config_field_alone(monkeypatch):
  # The former FEDJAX_LAMA_CLIENT_MAP variable is ignored: config.engine.client_map decides.
  monkeypatch.setenv("FEDJAX_LAMA_CLIENT_MAP", "vmap")
  assert plan_lib.plan("cpu").client_map == "scan"
  assert local.resolve_client_map(platform="cpu") == "scan"
  assert training.platform_plan(config_lib.base_config()).client_map == (
      local.resolve_client_map())
  config = config_lib.base_config()
  config.engine.client_map = "vmap"
  assert training.platform_plan(config).client_map == "vmap"
  assert plan_lib.plan("cpu", client_map="vmap").client_map == "vmap"
  assert local.resolve_client_map("scan", platform="cpu") == "scan"  # a caller's choice wins
  with pytest.raises(ValueError, match="client_map='loop'"):
    plan_lib.plan("cpu", client_map="loop")
  config.engine.client_map = "loop"
  with pytest.raises(ConfigError, match=r"engine\.client_map.*'loop'"):
    config_lib.validate(config)
