"""Cohorts the privacy accountant can rely on, and their chunks over a fixed capacity.

Poisson sampling (each client joins independently with probability q) is what the
amplification of `PoissonSampledDpEvent` assumes: the cohort's size varies from round to
round, so a round runs over a fixed capacity with a client mask, and a draw larger than the
capacity runs as extra chunks. Dropping the overflow would make a client's inclusion depend
on the others' and break the accounting. Fixed-size cohorts (uniform without replacement) are
drawn by `fedjax_lama.data.sample_clients` and accounted as such (replace-one adjacency).

Both are pure functions of (seed, round): the cohort of round r never depends on earlier
rounds, so a resumed run samples exactly the cohorts of an uninterrupted one. Poisson cohorts
are those of the federation's "bernoulli" sampler (the same stream), so a run sampled with it
is the run the accountant describes.
"""
from typing import List, NamedTuple

import numpy as np

from fedjax_lama.data import sampling as data_sampling
from fedjax_lama.errors import require
from fedjax_lama.privacy.dp_options import SamplingOptions


def poisson_cohort(num_clients: int, rate: float, seed: int, round_idx: int) -> np.ndarray:
  """Sorted int64 ids of the clients that joined round `round_idx`, each with probability q.

  May be empty: a round whose draw is empty still releases its noise (the accountant counts
  every round).
  """
  require(isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0 < rate <= 1,
          "privacy.rate", rate, "a sampling rate q in (0, 1]")
  return data_sampling.sample_bernoulli(num_clients, float(rate), seed, round_idx)


def sample_cohort(options: SamplingOptions, seed: int, round_idx: int) -> np.ndarray:
  """The int64 ids of round `round_idx`'s cohort under `options` (Poisson or fixed-size)."""
  if options.kind == "poisson":
    return poisson_cohort(options.num_clients, options.rate, seed, round_idx)
  return data_sampling.sample_clients(options.num_clients, options.cohort_size, seed, round_idx)


class CohortChunk(NamedTuple):
  """One capacity-sized block of a cohort: ids (padding rows hold id 0) and their mask."""
  client_ids: np.ndarray  # int64 [capacity]
  mask: np.ndarray        # float32 [capacity]: 1 for a sampled client, 0 for padding


def cohort_chunks(client_ids: np.ndarray, capacity: int) -> List[CohortChunk]:
  """Splits a draw into ceil(n / capacity) chunks (at least one) covering each id once.

  Every chunk has the same static shape, so one compiled round runs them all; the engine
  sums the chunks' masked uploads and releases the noised sum once.
  """
  require(isinstance(capacity, (int, np.integer)) and capacity >= 1, "capacity", capacity,
          "an int >= 1")
  ids = np.asarray(client_ids, np.int64).reshape(-1)
  num_chunks = max(1, -(-len(ids) // capacity))
  padded = np.zeros(num_chunks * capacity, np.int64)
  padded[:len(ids)] = ids
  mask = np.zeros(num_chunks * capacity, np.float32)
  mask[:len(ids)] = 1
  return [CohortChunk(padded[c * capacity:(c + 1) * capacity],
                      mask[c * capacity:(c + 1) * capacity]) for c in range(num_chunks)]


def poisson_capacity(num_clients: int, rate: float, std_devs: float = 4.0) -> int:
  """A capacity that holds a Poisson draw in one chunk except in rare rounds.

  The mean plus `std_devs` binomial standard deviations, at most N: larger draws are not
  dropped, they run as extra chunks (`cohort_chunks`).
  """
  mean = num_clients * rate
  std = np.sqrt(num_clients * rate * (1 - rate))
  return int(min(num_clients, max(1, np.ceil(mean + std_devs * std))))
