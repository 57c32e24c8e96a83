"""Client sampling per round, a pure function of (seed, round).

The cohort of round r is drawn from its own generator
`default_rng(SeedSequence([seed, STREAM, r]))`, so it never depends on earlier
rounds: a resumed run samples exactly the cohorts of an uninterrupted one
(uniform without replacement, keyed by seed and round), unlike fedjax's history-dependent
samplers.
"""

import math
import numbers

import numpy as np

from fedjax_lama.data import seeding


def _check_count(value, field: str, minimum: int) -> int:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise ValueError(f'{field} must be an int >= {minimum}, got {value!r}')
  if value < minimum:
    raise ValueError(f'{field} must be an int >= {minimum}, got {value}')
  return int(value)


def sample_clients(num_clients: int, cohort_size: int, seed: int,
                   round_idx: int) -> np.ndarray:
  """Uniform sample without replacement, int64 ids in draw order.

  Args:
    num_clients: population size N.
    cohort_size: m, 1 <= m <= N (e.g. round(active_ratio * N)).
    seed: run seed.
    round_idx: sampling event index (round, or window/sub-round flattened).
  """
  num_clients = _check_count(num_clients, 'num_clients', 1)
  cohort_size = _check_count(cohort_size, 'cohort_size', 1)
  round_idx = _check_count(round_idx, 'round_idx', 0)
  if cohort_size > num_clients:
    raise ValueError(
        f'cohort_size={cohort_size} exceeds num_clients={num_clients}')
  rng = seeding.make_rng(seed, seeding.SAMPLE_STREAM, round_idx)
  return rng.choice(num_clients, size=cohort_size, replace=False).astype(
      np.int64)


def sample_bernoulli(num_clients: int, probability: float, seed: int,
                     round_idx: int) -> np.ndarray:
  """Each client joins independently with `probability`.

  Returns:
    The sorted int64 ids of the clients that joined (possibly none).
  """
  num_clients = _check_count(num_clients, 'num_clients', 1)
  round_idx = _check_count(round_idx, 'round_idx', 0)
  if (isinstance(probability, bool) or
      not isinstance(probability, numbers.Real) or
      not math.isfinite(probability) or not 0 <= probability <= 1):
    raise ValueError(f'probability must be in [0, 1], got {probability!r}')
  rng = seeding.make_rng(seed, seeding.BERNOULLI_STREAM, round_idx)
  return np.flatnonzero(rng.random(num_clients) < probability).astype(np.int64)
