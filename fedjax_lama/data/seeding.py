"""Named random streams for the host-side (numpy) data layer.

Every random choice made on the host is drawn from
`np.random.default_rng(np.random.SeedSequence([seed, STREAM, *keys]))`, so it
is a pure function of the run seed, a per-purpose stream constant and explicit keys
(round, client id). Nothing depends on call history, which is what makes resumed
runs exact: randomness is derived from (seed, stream, indices), never threaded.
"""

import numbers

import numpy as np

# One constant per purpose, so that partitions, cohorts and batches drawn from
# the same run seed are independent. The values are arbitrary but frozen:
# changing one changes every experiment that uses it.
PARTITION_STREAM = 0x5041_5254  # "PART"
LOCAL_SPLIT_STREAM = 0x5350_4C54  # "SPLT"
WRITERS_STREAM = 0x5752_4954  # "WRIT"
SAMPLE_STREAM = 0x5341_4D50  # "SAMP"
BERNOULLI_STREAM = 0x4245_524E  # "BERN"
PACK_STREAM = 0x5041_434B  # "PACK"
FINETUNE_STREAM = 0x4649_4E45  # "FINE": local fine-tuning batches before evaluation


def check_seed(seed: int, field: str = 'seed') -> int:
  """Returns `seed` as an int, or raises ValueError naming `field`."""
  if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
    raise ValueError(f'{field} must be a non-negative int, got {seed!r}')
  if seed < 0:
    raise ValueError(f'{field} must be a non-negative int, got {seed}')
  return int(seed)


def make_rng(seed: int, stream: int, *keys: int) -> np.random.Generator:
  """A generator determined by (seed, stream, *keys) only."""
  entropy = [check_seed(seed), stream] + [int(k) for k in keys]
  return np.random.default_rng(np.random.SeedSequence(entropy))
