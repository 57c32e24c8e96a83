"""Minibatches of a group of simulated jobs, from stream BATCH (streams.py).

FedAT (Chai et al., SC'21) trains E local epochs
of batch size B per job. The order is fixed so that runs compare across methods: epoch e of job
(k, j) visits the client's n_k training examples in the order of a stable argsort of
uniform keys drawn from the device stream BATCH at (k, j, e), of length N_max (the
largest n_k), padded positions getting key 2 so they sort last. Step b of epoch e uses
positions b B ... b B + B - 1 (a short last batch is kept, masked); a step with b >= S_k
or e >= the job's epochs is masked, so it leaves the client's whole state unchanged.

Unlike `fedjax_lama.data.packing.pack_cohort` (batches keyed by (seed, round, client)),
a job's batches depend only on (seed, k, j, e), so the j-th job of client k trains on the
same minibatches under every method, whichever jobs share its call. Everything here is
pure `jax.numpy` with static shapes, meant to run inside the jitted training call, so only
ids and counts cross the host boundary.

Device streams (simulation/streams.py): `fold_in(fold_in(key(s), STREAM_ID), i)` folded with each
index in turn. A choice of this project (the paper is silent): per-step model randomness (dropout;
FedAT's CNN has none) uses stream LOCAL_RNG = 13 at (k, j), then the step index (engine/local.py).
"""
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lama.data.packing import steps_per_epoch
from fedjax_lama.engine.cohort import Cohort
from fedjax_lama.simulation.streams import Stream

LOCAL_RNG_STREAM = 13  # model randomness of job (k, j); see the module docstring
_PAD_KEY = 2.0  # > every uniform in [0, 1): padded positions sort last


def client_row_table(client_indices: Sequence[np.ndarray]) -> np.ndarray:
  """int32 [K, N_max]: client k's rows of the training arrays, zero-padded."""
  n_max = max(1, max(len(ix) for ix in client_indices))
  table = np.zeros((len(client_indices), n_max), np.int32)
  for k, ix in enumerate(client_indices):
    table[k, :len(ix)] = ix
  return table


def stream_key(seed: int, stream: int, *index) -> jax.Array:
  """The device key of one stream at one index (indices may be traced)."""
  key = jax.random.fold_in(jax.random.key(seed), stream)
  for i in index:
    key = jax.random.fold_in(key, i)
  return key


def epoch_order(seed: int, client, job_index, epoch, num_examples, n_max: int) -> jax.Array:
  """Positions 0..N_max-1 in the visiting order of epoch e of job (k, j).

  The first n_k entries are a permutation of 0..n_k-1; padded positions follow.
  """
  keys = jax.random.uniform(stream_key(seed, int(Stream.BATCH), client, job_index, epoch),
                            (n_max,))
  keys = jnp.where(jnp.arange(n_max) < num_examples, keys, _PAD_KEY)
  return jnp.argsort(keys, stable=True).astype(jnp.int32)


def pack_jobs(row_table: jax.Array, client_sizes: jax.Array, seed: int, client_ids: jax.Array,
              job_indices: jax.Array, job_epochs: jax.Array, job_mask: jax.Array, *,
              batch_size: int, max_epochs: int) -> Cohort:
  """The packed cohort of a group of jobs (one slot per job; padded slots have mask 0).

  Args:
    row_table: int32 [K, N_max], `client_row_table` of the clients' training rows.
    client_sizes: int32 [K], n_k.
    seed: the run's root seed s.
    client_ids, job_indices, job_epochs: int32 [C]: k, j and E of each slot.
    job_mask: float32 [C]: 1 for a real job, 0 for a padded slot (it trains nothing).
    batch_size: B.
    max_epochs: the static epoch axis (E of the run; FedProx's jobs run 1..E).

  Returns:
    A Cohort with indices [C, max_epochs * S_max, B] and its masks; a job's valid steps
    are its first E_kj * S_max slots' steps b < S_k of each epoch.
  """
  n_max = row_table.shape[1]
  per_epoch = steps_per_epoch(n_max, batch_size)  # S_max = ceil(N_max / B)
  width = per_epoch * batch_size
  sizes = client_sizes[client_ids]                              # [C]
  epochs = jnp.arange(max_epochs)

  def one_job(k, j, n, num_epochs, real):
    orders = jax.vmap(lambda e: epoch_order(seed, k, j, e, n, n_max))(epochs)  # [E, N_max]
    orders = jnp.pad(orders, ((0, 0), (0, width - n_max)))                      # [E, S B]
    slot = jnp.arange(width)
    valid = (slot[None, :] < n) & (epochs[:, None] < num_epochs) & (real > 0)   # [E, S B]
    rows = jnp.where(valid, row_table[k][orders], 0)
    shape = (max_epochs * per_epoch, batch_size)
    return rows.reshape(shape), valid.reshape(shape).astype(jnp.float32)

  indices, example_mask = jax.vmap(one_job)(client_ids, job_indices, sizes, job_epochs,
                                            job_mask)
  step_mask = (jnp.max(example_mask, axis=2) > 0).astype(jnp.float32)
  return Cohort(indices.astype(jnp.int32), example_mask, step_mask,
                job_mask.astype(jnp.float32), client_ids.astype(jnp.int32),
                (sizes * (job_mask > 0)).astype(jnp.float32))
