"""Per-client persistent state for thousands of clients, with bounded memory.

SCAFFOLD's control variates, FedDyn's linear terms, FedSpeed's corrections: one
row per client, a pytree whose leaves have a leading `num_clients` axis indexed
by client id (docs/design.md). A round only
touches its cohort: `gather(ids)` returns the cohort's rows on device, sharded
over the "clients" mesh axis like the packed cohort; `scatter(ids, mask, rows)`
writes back the rows of real clients (mask > 0). Every other row, padded slots'
included, stays bit-for-bit as it was.

Two placements, identical results:
* device (default): leaves [N', ...] sharded over the mesh, N' = N rounded up to
  a multiple of the device count, so each device holds N'/D rows. gather and
  scatter are jitted; scatter donates the store and updates it in place.
* host (`on_host=True`, config.engine.client_state_on_host): numpy leaves
  [N, ...] in host memory; only the cohort's C rows cross to the device and
  back, so device memory is O(C) rows, not O(N).

The store is mutable (in place on both placements): after `scatter`, arrays
previously returned by `rows` may be stale (host) or deleted (device, donated).
"""
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from fedjax_lama.engine import sharding
from fedjax_lama.tree import PyTree


class ClientStore:
  """Rows of per-client state; see the module docstring."""

  def __init__(self, rows: PyTree, mesh: Mesh, *, on_host: bool = False,
               num_clients: Optional[int] = None, copy: bool = True):
    """Adopts `rows` (leaves [N or N', ...], numpy or jax) into the chosen placement.

    num_clients: N, when `rows` carry device padding (e.g. restored from a checkpoint
      of a device store); default: the leading axis of the leaves.
    copy: on host, write into a private copy of `rows` (False: take them over as they
      are, writable numpy arrays, to avoid a second copy of N rows).
    """
    if not isinstance(on_host, bool):
      raise ValueError(f"config.engine.client_state_on_host={on_host!r} is not accepted; "
                       "accepted: True or False")
    leaves = jax.tree.leaves(rows)
    if not leaves:
      raise ValueError("ClientStore needs at least one array leaf; an algorithm without "
                       "per-client state should not build a store")
    lead = {np.shape(x)[0] if np.ndim(x) else None for x in leaves}
    if len(lead) != 1 or None in lead:
      raise ValueError(f"every leaf of the client rows needs the same leading client axis; "
                       f"got leading sizes {sorted(map(str, lead))}")
    self.mesh, self.on_host = mesh, on_host
    self.num_clients = int(num_clients if num_clients is not None else lead.pop())
    self._size = self.num_clients if on_host else sharding.padded_size(self.num_clients, mesh)
    self._clients = sharding.clients_sharding(mesh)
    self._gather = jax.jit(_gather_rows, out_shardings=self._clients)
    self._scatter = jax.jit(_scatter_rows, out_shardings=self._clients, donate_argnums=0)
    self._rows = None
    self.load(rows, copy=copy)

  @classmethod
  def create(cls, row: PyTree, num_clients: int, mesh: Mesh, *, on_host: bool = False):
    """A store whose N rows all start as `row` (one client's state, no client axis).

    The device placement builds the rows on device (no host copy of N rows).
    """
    if not isinstance(num_clients, int) or num_clients < 1:
      raise ValueError(f"num_clients={num_clients!r} is not accepted; accepted: an integer >= 1")
    if on_host:
      rows = jax.tree.map(
          lambda r: np.repeat(np.asarray(r)[None], num_clients, axis=0), row)
      return cls(rows, mesh, on_host=True, copy=False)
    size = sharding.padded_size(num_clients, mesh)
    broadcast = jax.jit(
        lambda r: jax.tree.map(lambda x: jnp.broadcast_to(x, (size,) + x.shape), r),
        out_shardings=sharding.clients_sharding(mesh))
    return cls(broadcast(sharding.replicate(row, mesh)), mesh, on_host=False,
               num_clients=num_clients)

  @property
  def rows(self) -> PyTree:
    """The stored pytree (for checkpoints): numpy [N, ...] on host, sharded [N', ...] on device."""
    return self._rows

  @property
  def nbytes(self) -> int:
    return int(sum(x.nbytes for x in jax.tree.leaves(self._rows)))

  def load(self, rows: PyTree, *, copy: bool = True) -> None:
    """Replaces the rows (e.g. with restored ones), moving them into this store's placement.

    copy: see `__init__`.
    """

    def fit(x):  # drop or add device padding rows beyond num_clients
      n = np.shape(x)[0]
      if n < self.num_clients:
        raise ValueError(f"client rows have {n} rows; this store holds {self.num_clients} "
                         "clients")
      if n == self._size:
        return x
      if n > self._size:
        return x[:self._size]
      pad = np.zeros((self._size - n,) + np.shape(x)[1:], x.dtype)
      return np.concatenate([sharding.to_host(x), pad])

    rows = jax.tree.map(fit, rows)
    if self.on_host:
      # Scatter writes into these arrays in place: a private, writable copy by default.
      self._rows = jax.tree.map(lambda x: _writable(sharding.to_host(x), copy), rows)
    else:
      self._rows = sharding.shard_clients(rows, self.mesh)

  def to_numpy(self) -> PyTree:
    """A numpy copy of the N real rows (tests, inspection)."""
    return jax.tree.map(
        lambda x: np.array(sharding.to_host(x)[:self.num_clients]), self._rows)

  def gather(self, ids) -> PyTree:
    """Rows of `ids` [C] (C a multiple of the device count) as device arrays split over clients.

    Ids of padded slots may be anything (they are clipped into range); the rows of
    real clients must be in [0, num_clients).
    """
    if self.on_host:
      idx = np.clip(np.asarray(sharding.to_host(ids), np.int64), 0, self.num_clients - 1)
      rows = jax.tree.map(lambda a: np.take(a, idx, axis=0), self._rows)
      return sharding.shard_clients(rows, self.mesh)
    ids = sharding.shard_clients(jnp.asarray(ids, jnp.int32), self.mesh)
    return self._gather(self._rows, ids, self.num_clients)

  def scatter(self, ids, mask, rows: PyTree) -> None:
    """Writes row i of `rows` to client ids[i] where mask[i] > 0; nothing else changes."""
    if self.on_host:
      ids = np.asarray(sharding.to_host(ids), np.int64)
      real = np.asarray(sharding.to_host(mask)) > 0
      target = ids[real]
      if target.size and (target.min() < 0 or target.max() >= self.num_clients):
        raise ValueError(f"client ids {target[(target < 0) | (target >= self.num_clients)]} "
                         f"are out of range; accepted: 0 <= id < {self.num_clients}")

      def write(a, r):
        a[target] = sharding.to_host(r)[real]

      jax.tree.map(write, self._rows, rows)
      return
    ids = sharding.shard_clients(jnp.asarray(ids, jnp.int32), self.mesh)
    mask = sharding.shard_clients(jnp.asarray(mask, jnp.float32), self.mesh)
    self._rows = self._scatter(self._rows, ids, mask, rows, self.num_clients)


def _writable(a: np.ndarray, copy: bool) -> np.ndarray:
  return np.array(a) if copy or not a.flags.writeable else a


def _gather_rows(store: PyTree, ids: jax.Array, num_clients: int) -> PyTree:
  ids = jnp.clip(ids, 0, num_clients - 1)
  return jax.tree.map(lambda a: a[ids], store)


def _scatter_rows(store: PyTree, ids: jax.Array, mask: jax.Array, rows: PyTree,
                  num_clients: int) -> PyTree:
  """Rows of padded slots (and ids out of range) are dropped: an index past the end."""
  size = jax.tree.leaves(store)[0].shape[0]
  valid = (mask > 0) & (ids >= 0) & (ids < num_clients)
  target = jnp.where(valid, ids, size)
  return jax.tree.map(lambda a, r: a.at[target].set(r, mode="drop"), store, rows)
