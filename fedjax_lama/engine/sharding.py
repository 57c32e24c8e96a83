"""The client axis sharded over a 1-D device mesh named "clients".

Arrays with a leading client axis (packed cohorts, per-client rows, FedLAMA's
slots) are split over the mesh; server state and the training arrays are
replicated. With one device every helper is a no-op placement, so single-device
and multi-device runs share one code path.

Multi-host: `jax.devices()` lists the devices of every process, so
`client_mesh()` spans all hosts. Every host packs the same cohort (sampling and
packing are pure functions of (seed, round)), and `shard_clients` /
`replicate` build each global array from that host-local copy with
`jax.make_array_from_callback`, each process filling only the shards of its own
devices. `to_host` brings a global array back to every host.
"""
import math
import os
import re
from typing import Callable, Optional, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedjax_lama.engine import plan as plan_lib
from fedjax_lama.tree import PyTree, tree_size

AXIS = "clients"

# The CPU device split's thresholds (`platform.splits_cpu_cohort`).
CPU_SPLIT_MAX_PARAMS = plan_lib.CPU_SPLIT_MAX_PARAMS
CPU_SPLIT_MIN_STEP_BYTES = plan_lib.CPU_SPLIT_MIN_STEP_BYTES


def client_mesh(devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """A 1-D mesh named "clients" over `devices` (default: every device of every host)."""
  devices = list(devices) if devices is not None else jax.devices()
  return Mesh(np.array(devices), (AXIS,))


def use_cpu_device_per_core(cores: Optional[int] = None) -> int:
  """Makes the CPU backend one JAX device per core (`jax_num_cpu_devices`); returns the count.

  Call it before any JAX computation (the entry points do, first thing). `cores`: default the
  cores this process may run on. A count the user already chose (`jax_num_cpu_devices`, or
  `--xla_force_host_platform_device_count` in XLA_FLAGS) is left as it is.
  """
  chosen = jax.config.jax_num_cpu_devices
  forced = re.search(r"--xla_force_host_platform_device_count=(\d+)",
                     os.environ.get("XLA_FLAGS", ""))
  if chosen > 0 or forced:
    return chosen if chosen > 0 else int(forced.group(1))
  cores = cores or len(os.sched_getaffinity(0))
  try:
    jax.config.update("jax_num_cpu_devices", cores)
  except RuntimeError as e:
    raise RuntimeError("use_cpu_device_per_core() must run before any JAX computation (right "
                       "after `import jax`); this process already has its devices") from e
  return cores


def client_devices(params: PyTree, step_bytes: int, cohort: Optional[int] = None,
                   devices: Optional[Sequence[jax.Device]] = None) -> list:
  """The devices a run's clients are split over (its `client_mesh`).

  Every device (default `jax.devices()`), except CPU devices where the model has more than
  CPU_SPLIT_MAX_PARAMS parameters or a local step computes fewer than
  CPU_SPLIT_MIN_STEP_BYTES bytes of values (`step_bytes`, from `local.step_bytes`;
  `platform.splits_cpu_cohort`): those run on one device per process, every core on each
  client in turn. A split CPU takes, per process, as many devices as divide `cohort`
  (the clients of one call), since a padded client would cost the shared cores real work.
  """
  devices = list(devices) if devices is not None else jax.devices()
  if not plan_lib.plan(devices[0].platform).cpu_device_rule:
    return devices
  split = plan_lib.splits_cpu_cohort(tree_size(params), step_bytes)
  per_process = min(map(len, _by_process(devices))) if split else 1
  if cohort:
    per_process = math.gcd(per_process, cohort)
  return _first_of_each_process(devices, per_process)


def call_devices(mesh: Mesh, bucket: Callable[[Mesh], int]) -> Mesh:
  """The devices of `mesh` that one call of varying size runs on (the simulated clock's).

  `bucket(m)`: the call's padded client count on mesh m. Accelerators: the whole mesh. On
  CPU a process's devices share its cores, so a padded client costs real work: the call
  takes the most devices per process whose bucket is no larger than on one device per
  process. Measured (FedAT's jobs, 480 examples x 3 epochs of batch 10, 2 cores, 2 devices
  against 1): 10 jobs 1.58x, 3 jobs (bucket 4 either way) 1.53x, 1 job padded to 2 0.87x.
  """
  devices = list(mesh.devices.flat)
  if devices[0].platform != "cpu":
    return mesh
  per_process = mesh.size // len(_by_process(devices))
  meshes = {n: mesh if n == per_process else client_mesh(_first_of_each_process(devices, n))
            for n in range(1, per_process + 1) if per_process % n == 0}
  fewest = bucket(meshes[1])
  return meshes[max(n for n, m in meshes.items() if bucket(m) <= fewest)]


def _by_process(devices: Sequence[jax.Device]) -> list:
  """`devices` grouped by process, in order."""
  by_process = {}
  for d in devices:
    by_process.setdefault(d.process_index, []).append(d)
  return list(by_process.values())


def _first_of_each_process(devices: Sequence[jax.Device], per_process: int) -> list:
  return [d for own in _by_process(devices) for d in own[:per_process]]


def padded_size(num_clients: int, mesh: Mesh, multiple: int = 1) -> int:
  """Smallest cohort size >= num_clients divisible by the device count (and `multiple`)."""
  m = math.lcm(mesh.size, max(1, multiple))
  return max(m, -(-num_clients // m) * m)


def clients_sharding(mesh: Mesh, axis: int = 0) -> NamedSharding:
  """Splits array axis `axis` (the client axis) over the mesh; other axes are whole."""
  return NamedSharding(mesh, P(*([None] * axis), AXIS))


def replicated_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def put(x, sharding: NamedSharding) -> jax.Array:
  """Places one array; host data must be the same global value on every process.

  Single process: `jax.device_put`. Multi-process (the sharding names devices of
  other hosts): every host holds the full value, and each one fills the shards
  of its own devices, which is what `make_array_from_callback` does.
  """
  if isinstance(x, jax.Array) and x.sharding == sharding:
    return x
  if sharding.is_fully_addressable:
    return jax.device_put(x, sharding)
  host = to_host(x) if isinstance(x, jax.Array) else np.asarray(x)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def shard_clients(tree: PyTree, mesh: Mesh, axis: int = 0) -> PyTree:
  """Places arrays with a client axis (`axis`, default leading) split over the mesh.

  The client axis must be a multiple of the device count (see `padded_size`).
  """
  sharding = clients_sharding(mesh, axis)
  for leaf in jax.tree.leaves(tree):
    if np.shape(leaf)[axis] % mesh.size:
      raise ValueError(f"client axis {axis} of an array of shape {np.shape(leaf)} is not a "
                       f"multiple of the {mesh.size} devices of the mesh; pad the cohort to "
                       f"sharding.padded_size(...)")
  return _put_tree(tree, sharding)


def _put_tree(tree: PyTree, sharding: NamedSharding) -> PyTree:
  if sharding.is_fully_addressable:
    return jax.device_put(tree, sharding)  # one call: the transfers are batched
  return jax.tree.map(lambda x: put(x, sharding), tree)


def replicate(tree: PyTree, mesh: Mesh) -> PyTree:
  """Places a full copy of every array on every device of the mesh."""
  return _put_tree(tree, replicated_sharding(mesh))


def narrow(tree: PyTree, mesh: Mesh) -> PyTree:
  """Arrays replicated over a mesh, replicated over `mesh` (a sub-mesh of it) without a
  copy: each keeps its buffers on the sub-mesh's devices."""
  sharding = replicated_sharding(mesh)

  def one(x):
    buffers = {shard.device: shard.data for shard in x.addressable_shards}
    return jax.make_array_from_single_device_arrays(
        x.shape, sharding, [buffers[d] for d in mesh.local_devices])

  return jax.tree.map(one, tree)


def shardings_of(tree: PyTree) -> PyTree:
  """The sharding of every leaf: `out_shardings` that keep a state where it was placed.

  A jitted round whose outputs carry the placement of its inputs sees the same
  input types every round, so it compiles once (tests/test_compilation.py).
  """
  return jax.tree.map(lambda x: x.sharding, tree)


def to_host(x) -> np.ndarray:
  """The full value of an array as numpy, on every process (an all-gather across hosts)."""
  if not isinstance(x, jax.Array) or x.is_fully_addressable:
    return np.asarray(x)
  if x.sharding.is_fully_replicated:
    return np.asarray(x.addressable_data(0))
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))
