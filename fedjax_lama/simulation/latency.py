"""Latency of a job: L = tau_down + tau_comp + delta + tau_up.

Compute models (fixed, uniform, trace), the straggler delay of the paper's setup (FedAT, Chai et al.
SC'21, Sec. 7 "Simulating Different Performance Tiers") and network models (none, fixed, uniform,
trace). Every draw of a job comes from its own indexed stream (streams.py), so the delay of job (k,
j) is the same under every method. Profiling (TiFL's tiering, Chai et al., HPDC'20) uses the same
formulas with the draws of stream PROFILE (k, r), taken from one generator in this order: download
(latency, bandwidth; network "uniform" only), per-step cost (compute "uniform" only), the delay's
uniform (always), upload (latency, bandwidth; "uniform" only).
"""
from typing import Callable, Optional, Sequence

import numpy as np

from fedjax_lama.data.packing import steps_per_epoch
from fedjax_lama.simulation import streams
from fedjax_lama.simulation.system_config import ComputeModel, NetworkModel, SystemConfig
from fedjax_lama.simulation.streams import Stream

Draw = Callable[[], float]


def job_steps(num_examples: int, batch_size: int, num_epochs: int) -> int:
  """Valid local steps of a job: E * S_k, S_k = ceil(n_k / B) (a short last batch is kept)."""
  return int(num_epochs) * steps_per_epoch(num_examples, batch_size)


def _scalars(value, num_clients: int) -> np.ndarray:
  return np.broadcast_to(np.asarray(value, np.float64), (num_clients,)).copy()


def _ranges(value, num_clients: int) -> np.ndarray:
  return np.broadcast_to(np.asarray(value, np.float64).reshape(-1, 2), (num_clients, 2)).copy()


def _in_range(lo: float, hi: float, u: float) -> float:
  """lo + (hi - lo) u: exactly lo when lo == hi."""
  return lo + (hi - lo) * u


class LatencyModel:
  """Draws the terms of a job's latency from the configured models.

  Args:
    config: the system configuration.
    parts: straggler part (0-based) of every client (Chai et al., SC'21, Sec. 6: five parts).
  """

  def __init__(self, config: SystemConfig, parts: Sequence[int]):
    self.seed = config.seed
    num_clients = config.num_clients
    self.compute: ComputeModel = config.compute_model
    self.network: NetworkModel = config.network_model
    ranges = np.asarray(config.straggler_ranges, np.float64)
    self.delay_range = ranges[np.asarray(parts, np.int64)]  # [K, 2]
    if self.compute.kind == "fixed":
      self.step_cost = _scalars(self.compute.step_cost_s, num_clients)
    elif self.compute.kind == "uniform":
      self.step_cost_range = _ranges(self.compute.step_cost_range_s, num_clients)
    net = self.network
    if net.kind == "fixed":
      self.latency = {d: _scalars(getattr(net, f"latency_{d}_s"), num_clients)
                      for d in ("down", "up")}
      self.bandwidth = {d: _scalars(getattr(net, f"bandwidth_{d}_bytes_per_s"), num_clients)
                        for d in ("down", "up")}
    elif net.kind == "uniform":
      self.latency_range = {d: _ranges(getattr(net, f"latency_range_{d}_s"), num_clients)
                            for d in ("down", "up")}
      self.bandwidth_range = {
          d: _ranges(getattr(net, f"bandwidth_range_{d}_bytes_per_s"), num_clients)
          for d in ("down", "up")}
    elif net.kind == "trace":
      self.trace = {"down": net.trace_down, "up": net.trace_up or net.trace_down}

  # --------------------------------------------------------------- one term, given draws

  def _compute(self, k: int, trace_index: int, steps: int, draw: Draw) -> float:
    kind = self.compute.kind
    if kind == "fixed":
      return float(self.step_cost[k] * steps)
    if kind == "uniform":
      lo, hi = self.step_cost_range[k]
      return float(_in_range(lo, hi, draw()) * steps)
    trace = self.compute.trace_s[k]
    return float(trace[trace_index % len(trace)])

  def _delay(self, k: int, draw: Draw) -> float:
    lo, hi = self.delay_range[k]
    return float(_in_range(lo, hi, draw()))

  def _network(self, direction: str, k: int, trace_index: int, num_bytes: int,
               draw: Optional[Draw]) -> float:
    kind = self.network.kind
    if kind == "none":
      return 0.0
    if kind == "fixed":
      latency, bandwidth = self.latency[direction][k], self.bandwidth[direction][k]
    elif kind == "uniform":
      lo, hi = self.latency_range[direction][k]
      latency = _in_range(lo, hi, draw())
      lo, hi = self.bandwidth_range[direction][k]
      bandwidth = _in_range(lo, hi, draw())
    else:
      trace = self.trace[direction][k]
      latency, bandwidth = trace[trace_index % len(trace)]
    return float(latency + num_bytes / bandwidth)

  # --------------------------------------------------------------- the terms of job (k, j)

  def _draws(self, stream: Stream, *index: int) -> Draw:
    """Successive uniforms of the generator of one stream at one index.

    The generator is only built on the first draw: most models draw nothing.
    """
    holder = []

    def draw() -> float:
      if not holder:
        holder.append(streams.generator(self.seed, stream, *index))
      return float(holder[0].random())

    return draw

  def download_time(self, k: int, j: int, num_bytes: int) -> float:
    """tau_down of job (k, j) for a download of `num_bytes` (stream NETWORK (k, j, 0))."""
    return self._network("down", k, j, num_bytes, self._draws(Stream.NETWORK, k, j, streams.DOWN))

  def compute_time(self, k: int, j: int, steps: int) -> float:
    """tau_comp of job (k, j) running `steps` valid steps (stream COMPUTE (k, j))."""
    return self._compute(k, j, steps, self._draws(Stream.COMPUTE, k, j))

  def delay(self, k: int, j: int) -> float:
    """Straggler delay of job (k, j) (stream DELAY (k, j)); exactly 0 in a (0, 0) part."""
    return self._delay(k, self._draws(Stream.DELAY, k, j))

  def upload_time(self, k: int, j: int, num_bytes: int) -> float:
    """tau_up of job (k, j) for an upload of `num_bytes` (stream NETWORK (k, j, 1))."""
    return self._network("up", k, j, num_bytes, self._draws(Stream.NETWORK, k, j, streams.UP))

  def probe_download_time(self, k: int, round_index: int, num_bytes: int) -> float:
    """TiFL's accuracy-collection download of round r (stream NETWORK (k, r, 2))."""
    return self._network("down", k, round_index, num_bytes,
                         self._draws(Stream.NETWORK, k, round_index, streams.PROBE_DOWN))

  # --------------------------------------------------------------- profiling (TiFL's tiering)

  def profile_latency(self, k: int, r: int, steps: int, num_bytes: int) -> float:
    """One profiling draw: the latency of a full job, stream PROFILE (k, r)."""
    draw = self._draws(Stream.PROFILE, k, r)
    tau_down = self._network("down", k, r, num_bytes, draw)
    tau_comp = self._compute(k, r, steps, draw)
    delta = self._delay(k, draw)
    tau_up = self._network("up", k, r, num_bytes, draw)
    return tau_down + tau_comp + delta + tau_up
