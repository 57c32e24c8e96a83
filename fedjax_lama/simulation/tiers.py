"""Setup of the simulated system: straggler parts, unstable clients, tiers.

Implements FedAT's setup (Chai et al., SC'21, Sec. 6): the paper's five straggler parts,
10 unstable clients that drop out for good, and tiering by profiled latency (TiFL's
method, which FedAT adopts: Chai et al. SC'21, Sec. 2.1 and 4), in the setup order
PARTS, then UNSTABLE, then PROFILE (streams.py).
"""
import dataclasses
from typing import Sequence

import numpy as np

from fedjax_lama.simulation import streams
from fedjax_lama.simulation.system_config import SystemConfig
from fedjax_lama.simulation.latency import LatencyModel, job_steps
from fedjax_lama.simulation.streams import Stream


def split_sizes(n: int, num_groups: int) -> list[int]:
  """Sizes of `num_groups` consecutive groups of n items; the first n mod M get one more."""
  base, extra = divmod(int(n), int(num_groups))
  return [base + (1 if g < extra else 0) for g in range(num_groups)]


def groups_from_order(order: Sequence[int], num_groups: int) -> np.ndarray:
  """Group index of every item when `order` is cut into consecutive groups."""
  order = np.asarray(order, np.int64)
  group = np.empty(len(order), np.int64)
  start = 0
  for g, size in enumerate(split_sizes(len(order), num_groups)):
    group[order[start:start + size]] = g
    start += size
  return group


def assign_parts(seed: int, num_clients: int, num_parts: int) -> np.ndarray:
  """Straggler part (0-based) of every client: order by PARTS keys, cut (Chai et al., SC'21: five
  straggler parts)."""
  keys = streams.generator(seed, Stream.PARTS).random(num_clients)
  return groups_from_order(streams.stable_order(keys), num_parts)


def draw_dropout_times(seed: int, num_clients: int, num_unstable: int,
                       horizon: float) -> np.ndarray:
  """D_k of every client (+inf for stable ones), stream UNSTABLE .

  The unstable clients are those with the `num_unstable` smallest of K keys;
  the next `num_unstable` draws, times the horizon H, are their drop-out times,
  assigned in increasing client id.
  """
  gen = streams.generator(seed, Stream.UNSTABLE)
  keys = gen.random(num_clients)
  unstable = np.sort(streams.stable_order(keys)[:num_unstable])
  times = np.full(num_clients, np.inf)
  times[unstable] = horizon * gen.random(num_unstable)
  return times


def profile_latencies(latency: LatencyModel, config: SystemConfig,
                      num_examples: Sequence[int], model_bytes: int) -> np.ndarray:
  """Mean of `profile_rounds` full-job latency draws per client (tiering by profiled latency, as
  TiFL, Chai et al., HPDC'20).

  A profiling job runs all E * S_k steps and transfers the uncompressed model.
  """
  means = np.empty(config.num_clients)
  for k in range(config.num_clients):
    steps = job_steps(num_examples[k], config.batch_size, config.local_epochs)
    draws = [latency.profile_latency(k, r, steps, model_bytes)
             for r in range(config.profile_rounds)]
    means[k] = np.mean(np.asarray(draws, np.float64))
  return means


def tiers_from_latencies(latencies: np.ndarray, num_tiers: int) -> np.ndarray:
  """Tier (0 = fastest) of every client: sort by (latency, id), cut into M groups."""
  return groups_from_order(streams.stable_order(latencies), num_tiers)


@dataclasses.dataclass(frozen=True)
class SystemSetup:
  """Everything fixed for a run before virtual time 0.

  Attributes:
    parts: straggler part (0-based) of each client.
    dropout_times: D_k (+inf for stable clients).
    profiled_latency: mean profiled latency of each client (None with
      tiering "parts", which does not profile).
    tiers: tier (0-based, 0 = fastest) of each client.
  """
  parts: np.ndarray
  dropout_times: np.ndarray
  profiled_latency: object
  tiers: np.ndarray

  @property
  def num_tiers(self) -> int:
    return int(self.tiers.max()) + 1

  def tier_members(self, tier: int) -> list[int]:
    """Clients of one tier, in increasing id."""
    return [int(k) for k in np.flatnonzero(self.tiers == tier)]


def build_setup(config: SystemConfig, num_examples: Sequence[int],
                model_bytes: int) -> tuple[SystemSetup, LatencyModel]:
  """Setup steps 3-5: PARTS, UNSTABLE, PROFILE (steps 1-2, data and w0, are the engine's)."""
  parts = assign_parts(config.seed, config.num_clients, len(config.straggler_ranges))
  dropout = draw_dropout_times(config.seed, config.num_clients, config.num_unstable,
                               config.dropout_horizon)
  latency = LatencyModel(config, parts)
  if config.tiering == "parts":
    profiled, tiers = None, parts.copy()
  else:
    profiled = profile_latencies(latency, config, num_examples, model_bytes)
    tiers = tiers_from_latencies(profiled, config.num_tiers)
  return SystemSetup(parts, dropout, profiled, tiers), latency
