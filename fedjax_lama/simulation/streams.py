"""Named random streams of the simulation.

Every random quantity of a run comes from a host stream
`np.random.default_rng([seed, STREAM_ID, *index])` (a SeedSequence entropy list).
Only `Generator.random()` is used, and every derived choice is defined on those
uniform doubles: a random order is the stable argsort of uniform keys (ties by
id), and sampling m of n candidates takes the m candidates with the smallest
keys. Results therefore do not depend on numpy's `choice`/`permutation`.

Streams are indexed by what they belong to (a job's draws by (k, j), a round's
by (group, round)), never by a history of earlier draws, so the j-th job of
client k draws the same delay under every method, and resuming a run needs no
generator state.
"""
import enum
from typing import Sequence

import numpy as np


class Stream(enum.IntEnum):
  """Stream ids: one per source of randomness, fixed so runs stay comparable."""
  DATA = 1       # partition, 80/20 split (engine side)
  INIT = 2       # initial model (engine side, JAX)
  PARTS = 3      # straggler part of each client (Chai et al., SC'21, Sec. 6: five parts)
  UNSTABLE = 4   # unstable clients, then their drop-out times
  PROFILE = 5    # (k, r): profiling latencies (TiFL's tiering, Chai et al., HPDC'20)
  DELAY = 6      # (k, j): straggler delay
  COMPUTE = 7    # (k, j): per-step cost, compute model `uniform`
  NETWORK = 8    # (k, j, dir): network draws, network model `uniform`
  SAMPLE = 9     # (g, r): client sampling of round r of group g
  BATCH = 10     # (k, j, e): minibatch order (engine side, JAX)
  TIFL = 11      # (r): TiFL's tier choice (Chai et al., HPDC'20)
  PROX_E = 12    # (k, j): FedProx local epochs (Li et al., MLSys 2020)


# The `dir` index of stream NETWORK.
DOWN = 0
UP = 1
# A choice of this project (the paper is silent): TiFL's accuracy-collection downloads of round r
# use NETWORK at (k, r, PROBE_DOWN); the value 2 keeps them apart from job draws.
PROBE_DOWN = 2


def generator(seed: int, stream: Stream, *index: int) -> np.random.Generator:
  """The generator of one stream at one index; a pure function of its inputs."""
  return np.random.default_rng([int(seed), int(stream), *[int(i) for i in index]])


def uniform(seed: int, stream: Stream, *index: int) -> float:
  """The first uniform double in [0, 1) of a stream at an index."""
  return float(generator(seed, stream, *index).random())


def stable_order(keys: np.ndarray) -> np.ndarray:
  """Positions sorted by key, ties by position (a random order from uniform keys)."""
  return np.argsort(np.asarray(keys, np.float64), kind="stable")


def smallest_keys(candidates: Sequence[int], keys: np.ndarray, m: int) -> list[int]:
  """The m candidates with the smallest keys (ties by position), in key order.

  Args:
    candidates: ids, in increasing order (so that ties break by id).
    keys: one uniform key per candidate.
    m: how many to take (at most len(candidates)).
  """
  order = stable_order(keys)[:m]
  return [int(candidates[i]) for i in order]


def sample_clients(seed: int, group: int, round_index: int, candidates: Sequence[int],
                   m: int) -> list[int]:
  """Samples min(m, n) of n candidates without replacement (stream SAMPLE (g, r)).

  One key per candidate (candidates in increasing id order) is drawn; the chosen
  clients are returned in increasing id order, the order they are dispatched in.
  """
  candidates = sorted(int(c) for c in candidates)
  m = min(int(m), len(candidates))
  if m <= 0:
    return []
  keys = generator(seed, Stream.SAMPLE, group, round_index).random(len(candidates))
  return sorted(smallest_keys(candidates, keys, m))

