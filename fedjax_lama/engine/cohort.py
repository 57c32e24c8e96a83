"""A packed cohort on device, and the rows of per-client state it reads and writes."""
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_lama.tree import PyTree


class Cohort(NamedTuple):
  """Device arrays of one packed cohort (see fedjax_lama.data.packing.CohortBatch)."""
  indices: jax.Array       # int32 [C, S, B]
  example_mask: jax.Array  # float32 [C, S, B]
  step_mask: jax.Array     # float32 [C, S]
  client_mask: jax.Array   # float32 [C]
  client_ids: jax.Array    # int32 [C]
  num_examples: jax.Array  # float32 [C]


def gather_rows(store: PyTree, client_ids: jax.Array) -> PyTree:
  return jax.tree.map(lambda a: a[client_ids], store)


def scatter_rows(store: PyTree, client_ids: jax.Array, client_mask: jax.Array,
                 rows: PyTree) -> PyTree:
  """Writes the rows of real clients; padded slots are dropped (index out of range)."""
  num = jax.tree.leaves(store)[0].shape[0]
  ids = jnp.where(client_mask > 0, client_ids, num)
  return jax.tree.map(lambda a, r: a.at[ids].set(r, mode="drop"), store, rows)
