"""The client axis sharded over a 1-D device mesh named "clients".

With one device every helper is a no-op placement, so single-device and
multi-device runs share one code path (architecture.md 2.2, "Sharding").
"""
import math
from typing import Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXIS = "clients"


def client_mesh(devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  devices = list(devices) if devices is not None else jax.devices()
  return Mesh(np.array(devices), (AXIS,))


def padded_size(num_clients: int, mesh: Mesh, multiple: int = 1) -> int:
  """Smallest cohort size >= num_clients divisible by the device count (and `multiple`)."""
  m = math.lcm(mesh.size, max(1, multiple))
  return max(m, -(-num_clients // m) * m)


def shard_clients(tree, mesh: Mesh):
  """Places arrays with a leading client axis split over the mesh."""
  sharding = NamedSharding(mesh, P(AXIS))
  return jax.tree_util.tree_map(lambda x: jax.device_put(x, sharding), tree)


def replicate(tree, mesh: Mesh):
  sharding = NamedSharding(mesh, P())
  return jax.tree_util.tree_map(lambda x: jax.device_put(x, sharding), tree)
