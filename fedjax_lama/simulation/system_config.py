"""Typed configuration of the simulated system and of the methods on it.

Defaults are the setup of FedAT's experiments (Chai et al., SC'21, Sec. 6) for the
system, FedAT and its baselines. Every record is a frozen
dataclass validated on construction: a bad value raises ValueError naming the
field and what it accepts. Per-client values given as lists or numpy arrays are
stored as tuples, so configs are hashable, comparable and JSON-friendly
(`dataclasses.asdict`).
"""
import dataclasses
import math
from typing import Any, Optional, Union

import numpy as np

COMPUTE_KINDS = ("fixed", "uniform", "trace")
NETWORK_KINDS = ("none", "fixed", "uniform", "trace")
TIERINGS = ("profile", "parts")
CROSS_TIER_WEIGHTS = ("eq5", "uniform")
CROSS_TIER_SETS = ("all", "reported")
TIFL_PROB_RULES = ("paper", "all_positive")
STALENESS_FUNCTIONS = ("constant", "polynomial", "hinge")

# Chai et al., SC'21, Sec. 7: added delays of the five straggler parts, in seconds.
PAPER_STRAGGLER_RANGES = ((0.0, 0.0), (0.0, 5.0), (6.0, 10.0), (11.0, 15.0), (20.0, 30.0))

Scalar = Union[float, int]
PerClient = Union[Scalar, tuple]


# ----------------------------------------------------------------------------- helpers


def _freeze(value: Any) -> Any:
  """Lists / arrays -> nested tuples of floats; scalars -> float."""
  if isinstance(value, np.ndarray):
    value = value.tolist()
  if isinstance(value, (list, tuple)):
    return tuple(_freeze(v) for v in value)
  if isinstance(value, (bool, np.bool_)):
    raise ValueError(f"expected a number, got {value!r}")
  return float(value)


def _set(obj, name: str, value) -> None:
  object.__setattr__(obj, name, value)


def _choice(name: str, value, choices) -> None:
  if value not in choices:
    raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def _int(name: str, value, minimum: int, optional: bool = False) -> None:
  if optional and value is None:
    return
  ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= minimum
  if not ok:
    what = f"an int >= {minimum}" + (" or None" if optional else "")
    raise ValueError(f"{name} must be {what}, got {value!r}")


def _float(name: str, value, minimum: float = 0.0, strict: bool = False,
           allow_inf: bool = False, maximum: Optional[float] = None,
           optional: bool = False) -> None:
  if optional and value is None:
    return
  ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
  if ok:
    v = float(value)
    ok = not math.isnan(v) and (allow_inf or math.isfinite(v))
    ok = ok and (v > minimum if strict else v >= minimum)
    ok = ok and (maximum is None or v <= maximum)
  if not ok:
    rel = ">" if strict else ">="
    what = f"a number {rel} {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
    what += ("" if allow_inf else " (finite)") + (" or None" if optional else "")
    raise ValueError(f"{name} must be {what}, got {value!r}")


def _precision(name: str, value) -> None:
  if value is None:
    return
  # 10^p is exact in binary64 up to p = 22 (the polyline codec's limit).
  is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
  if not (is_int and 0 <= value <= 22):
    raise ValueError(f"{name} must be None (raw float32) or an int in 0..22, got {value!r}")


def _per_client_scalars(name: str, value, num_clients: int, strict: bool = False,
                        allow_inf: bool = False) -> None:
  """A scalar, or one value per client."""
  values = value if isinstance(value, tuple) else (value,)
  if isinstance(value, tuple) and len(value) != num_clients:
    raise ValueError(f"{name} must be a scalar or have num_clients={num_clients} values, "
                     f"got {len(value)}")
  for v in values:
    _float(name, v, strict=strict, allow_inf=allow_inf)


def _per_client_ranges(name: str, value, num_clients: int, strict: bool = False) -> None:
  """A (lo, hi) pair, or one (lo, hi) pair per client, with 0 <= lo <= hi (finite)."""
  accepted = f"a (lo, hi) pair or num_clients={num_clients} pairs"
  if not isinstance(value, tuple) or not value:
    raise ValueError(f"{name} must be {accepted}, got {value!r}")
  single = not isinstance(value[0], tuple)
  if single and len(value) != 2:
    raise ValueError(f"{name} must be {accepted}, got {value!r}")
  if not single and len(value) != num_clients:
    raise ValueError(f"{name} must be {accepted}, got {len(value)} pairs")
  for pair in ((value,) if single else value):
    if not isinstance(pair, tuple) or len(pair) != 2:
      raise ValueError(f"{name} must hold (lo, hi) pairs, got {pair!r}")
    _float(name, pair[0], strict=strict)
    _float(name, pair[1], strict=strict)
    if pair[0] > pair[1]:
      raise ValueError(f"{name} must have lo <= hi, got {pair!r}")


def _per_client_traces(name: str, value, num_clients: int, entry_size: Optional[int]) -> None:
  """num_clients non-empty sequences of non-negative values (or of pairs)."""
  if len(value) != num_clients:
    raise ValueError(f"{name} must have one trace per client (num_clients={num_clients}), "
                     f"got {len(value)}")
  for trace in value:
    if not isinstance(trace, tuple) or not trace:
      raise ValueError(f"{name} must hold non-empty sequences, got {trace!r}")
    for entry in trace:
      if entry_size is None:
        _float(name, entry)
      else:
        if not isinstance(entry, tuple) or len(entry) != entry_size:
          raise ValueError(f"{name} entries must be (latency_s, bytes_per_s) pairs, got {entry!r}")
        _float(name, entry[0])
        _float(name, entry[1], strict=True, allow_inf=True)


# ----------------------------------------------------------------------------- system


@dataclasses.dataclass(frozen=True)
class ComputeModel:
  """Compute time of a job.

  Attributes:
    kind: "fixed" (tau = s_k x valid steps), "uniform" (per-step cost drawn per
      job from [lo_k, hi_k], stream COMPUTE (k, j)) or "trace" (job j of client
      k lasts trace_s[k][j mod len]; the number of steps is then ignored).
    step_cost_s: fixed: seconds per step, a scalar or one value per client.
    step_cost_range_s: uniform: a (lo, hi) pair or one pair per client.
    trace_s: trace: one non-empty sequence of job durations per client.
  """
  kind: str = "fixed"
  step_cost_s: PerClient = 0.05
  step_cost_range_s: tuple = (0.05, 0.05)
  trace_s: tuple = ()

  def __post_init__(self):
    _choice("compute_model.kind", self.kind, COMPUTE_KINDS)
    _set(self, "step_cost_s", _freeze(self.step_cost_s))
    _set(self, "step_cost_range_s", _freeze(self.step_cost_range_s))
    _set(self, "trace_s", _freeze(self.trace_s))

  def validate_for(self, num_clients: int) -> None:
    if self.kind == "fixed":
      _per_client_scalars("compute_model.step_cost_s", self.step_cost_s, num_clients)
    elif self.kind == "uniform":
      _per_client_ranges("compute_model.step_cost_range_s", self.step_cost_range_s, num_clients)
    else:
      _per_client_traces("compute_model.trace_s", self.trace_s, num_clients, None)


@dataclasses.dataclass(frozen=True)
class NetworkModel:
  """Transfer times of the download and the upload of a job.

  tau = latency + bytes / bandwidth, with bytes the actual message size.

  Attributes:
    kind: "none" (0 s), "fixed", "uniform" (latency and bandwidth drawn per job
      and direction from stream NETWORK (k, j, dir): latency first, then
      bandwidth) or "trace" ((latency, bandwidth) pairs indexed by j mod len).
    latency_down_s, latency_up_s: fixed: seconds, scalar or per client.
    bandwidth_down_bytes_per_s, bandwidth_up_bytes_per_s: fixed: bytes per
      second (> 0, may be inf), scalar or per client.
    latency_range_down_s, latency_range_up_s: uniform: (lo, hi) or per client.
    bandwidth_range_down_bytes_per_s, bandwidth_range_up_bytes_per_s: uniform:
      (lo, hi) with lo > 0, or per client.
    trace_down, trace_up: trace: per client, a non-empty sequence of
      (latency_s, bytes_per_s) pairs; an empty trace_up reuses trace_down.
  """
  kind: str = "none"
  latency_down_s: PerClient = 0.0
  latency_up_s: PerClient = 0.0
  bandwidth_down_bytes_per_s: PerClient = math.inf
  bandwidth_up_bytes_per_s: PerClient = math.inf
  latency_range_down_s: tuple = (0.0, 0.0)
  latency_range_up_s: tuple = (0.0, 0.0)
  bandwidth_range_down_bytes_per_s: tuple = (1e6, 1e6)
  bandwidth_range_up_bytes_per_s: tuple = (1e6, 1e6)
  trace_down: tuple = ()
  trace_up: tuple = ()

  def __post_init__(self):
    _choice("network_model.kind", self.kind, NETWORK_KINDS)
    for field in dataclasses.fields(self):
      if field.name != "kind":
        _set(self, field.name, _freeze(getattr(self, field.name)))

  def validate_for(self, num_clients: int) -> None:
    if self.kind == "fixed":
      for d in ("down", "up"):
        _per_client_scalars(f"network_model.latency_{d}_s", getattr(self, f"latency_{d}_s"),
                            num_clients)
        _per_client_scalars(f"network_model.bandwidth_{d}_bytes_per_s",
                            getattr(self, f"bandwidth_{d}_bytes_per_s"), num_clients,
                            strict=True, allow_inf=True)
    elif self.kind == "uniform":
      for d in ("down", "up"):
        _per_client_ranges(f"network_model.latency_range_{d}_s",
                           getattr(self, f"latency_range_{d}_s"), num_clients)
        _per_client_ranges(f"network_model.bandwidth_range_{d}_bytes_per_s",
                           getattr(self, f"bandwidth_range_{d}_bytes_per_s"), num_clients,
                           strict=True)
    elif self.kind == "trace":
      _per_client_traces("network_model.trace_down", self.trace_down, num_clients, 2)
      if self.trace_up:
        _per_client_traces("network_model.trace_up", self.trace_up, num_clients, 2)


@dataclasses.dataclass(frozen=True)
class SystemConfig:
  """The simulated system and the run (Chai et al., SC'21, Sec. 6).

  Attributes:
    num_clients: K.
    compute_model, network_model: latency models.
    straggler_ranges: (lo, hi) added delay of each straggler part, seconds
      (the number of parts is its length). ((0, 0),) means no delay.
    num_unstable: clients that drop out for good.
    dropout_horizon_s: H of D_k = H u_k; None means max_virtual_time_s.
    num_tiers: M (tiers by profiled latency, as TiFL). With tiering "parts" it must equal
      the number of parts.
    tiering: "profile" (TiFL's profiling) or "parts" (the straggler parts).
    profile_rounds: latency draws per client when profiling.
    seed: the root seed s of every stream (simulation/streams.py).
    max_virtual_time_s: the virtual-time budget; later events never run.
    eval_interval_s: evaluation ticks at every multiple, 0..budget inclusive.
    max_clients_per_call: the most jobs in one trainer call.
    max_global_updates: optional extra stopping rule on the global counter.
    local_epochs: E (FedProx's upper bound).
    batch_size: B (steps per epoch S_k = ceil(n_k / B)).
  """
  num_clients: int = 100
  compute_model: ComputeModel = ComputeModel()
  network_model: NetworkModel = NetworkModel()
  straggler_ranges: tuple = PAPER_STRAGGLER_RANGES
  num_unstable: int = 10
  dropout_horizon_s: Optional[float] = None
  num_tiers: int = 5
  tiering: str = "profile"
  profile_rounds: int = 5
  seed: int = 0
  max_virtual_time_s: float = 20000.0
  eval_interval_s: float = 50.0
  max_clients_per_call: int = 128
  max_global_updates: Optional[int] = None
  local_epochs: int = 3
  batch_size: int = 10

  def __post_init__(self):
    _int("num_clients", self.num_clients, 1)
    if not isinstance(self.compute_model, ComputeModel):
      raise ValueError(f"compute_model must be a ComputeModel, got {self.compute_model!r}")
    if not isinstance(self.network_model, NetworkModel):
      raise ValueError(f"network_model must be a NetworkModel, got {self.network_model!r}")
    self.compute_model.validate_for(self.num_clients)
    self.network_model.validate_for(self.num_clients)
    try:
      ranges = _freeze(self.straggler_ranges)
    except (TypeError, ValueError):
      ranges = None
    if not ranges or any(not isinstance(r, tuple) or len(r) != 2 for r in ranges):
      raise ValueError("straggler_ranges must be a non-empty sequence of (lo, hi) pairs in "
                       f"seconds (((0, 0),) for no delay), got {self.straggler_ranges!r}")
    _set(self, "straggler_ranges", ranges)
    for lo, hi in ranges:
      _float("straggler_ranges", lo)
      _float("straggler_ranges", hi)
      if lo > hi:
        raise ValueError(f"straggler_ranges must have lo <= hi, got {(lo, hi)!r}")
    if len(ranges) > self.num_clients:
      raise ValueError(f"straggler_ranges has {len(ranges)} parts, more than num_clients="
                       f"{self.num_clients}")
    _int("num_unstable", self.num_unstable, 0)
    if self.num_unstable > self.num_clients:
      raise ValueError(f"num_unstable must be <= num_clients={self.num_clients}, "
                       f"got {self.num_unstable}")
    _float("dropout_horizon_s", self.dropout_horizon_s, optional=True)
    _int("num_tiers", self.num_tiers, 1)
    if self.num_tiers > self.num_clients:
      raise ValueError(f"num_tiers must be <= num_clients={self.num_clients}, "
                       f"got {self.num_tiers}")
    _choice("tiering", self.tiering, TIERINGS)
    if self.tiering == "parts" and self.num_tiers != len(ranges):
      raise ValueError(f"num_tiers must equal the number of straggler parts ({len(ranges)}) "
                       f"with tiering='parts', got {self.num_tiers}")
    _int("profile_rounds", self.profile_rounds, 1)
    _int("seed", self.seed, 0)
    _float("max_virtual_time_s", self.max_virtual_time_s)
    _float("eval_interval_s", self.eval_interval_s, strict=True)
    _int("max_clients_per_call", self.max_clients_per_call, 1)
    _int("max_global_updates", self.max_global_updates, 1, optional=True)
    _int("local_epochs", self.local_epochs, 1)
    _int("batch_size", self.batch_size, 1)

  @property
  def dropout_horizon(self) -> float:
    """H, the horizon of the unstable clients' drop-out times (defaults to the virtual-time
    budget)."""
    if self.dropout_horizon_s is None:
      return float(self.max_virtual_time_s)
    return float(self.dropout_horizon_s)


# ----------------------------------------------------------------------------- methods


@dataclasses.dataclass(frozen=True)
class FedATConfig:
  """FedAT (Chai et al., SC'21, Sec. 4 and 6).

  Attributes:
    clients_per_round: clients sampled per tier round.
    lam: lambda of the local proximal term.
    cross_tier_weights: "eq5" (T_tier(M+1-m)/T) or "uniform" (ablation).
    cross_tier_set: "all" (literal Eq. 5, default) or "reported" (only tiers
      that have reported, renormalised).
    compression_precision: polyline precision of downloads and uploads; None =
      raw float32. (The polyline mode is the injected codec's setting.)
  """
  clients_per_round: int = 10
  lam: float = 0.4
  cross_tier_weights: str = "eq5"
  cross_tier_set: str = "all"
  compression_precision: Optional[int] = 4

  def __post_init__(self):
    _int("clients_per_round", self.clients_per_round, 1)
    _float("lam", self.lam)
    _choice("cross_tier_weights", self.cross_tier_weights, CROSS_TIER_WEIGHTS)
    _choice("cross_tier_set", self.cross_tier_set, CROSS_TIER_SETS)
    _precision("compression_precision", self.compression_precision)


@dataclasses.dataclass(frozen=True)
class FedAvgConfig:
  """FedAvg on the clock (McMahan et al., 2017)."""
  clients_per_round: int = 10
  compression_precision: Optional[int] = None

  def __post_init__(self):
    _int("clients_per_round", self.clients_per_round, 1)
    _precision("compression_precision", self.compression_precision)


@dataclasses.dataclass(frozen=True)
class FedProxConfig:
  """FedProx on the clock (Li et al., MLSys 2020).

  Attributes:
    mu: proximal coefficient (FedAT's lambda, 0.4, as the paper gives no mu).
    variable_epochs: job (k, j) runs 1 + floor(E u) epochs, u from PROX_E (k, j).
  """
  clients_per_round: int = 10
  mu: float = 0.4
  variable_epochs: bool = True
  compression_precision: Optional[int] = None

  def __post_init__(self):
    _int("clients_per_round", self.clients_per_round, 1)
    _float("mu", self.mu)
    if not isinstance(self.variable_epochs, bool):
      raise ValueError(f"variable_epochs must be True or False, got {self.variable_epochs!r}")
    _precision("compression_precision", self.compression_precision)


@dataclasses.dataclass(frozen=True)
class TiFLConfig:
  """TiFL (Chai et al., HPDC'20).

  Attributes:
    tifl_interval: I, rounds between accuracy collections / ChangeProbs.
    tifl_rounds: R; every tier starts with ceil(R / M) credits.
    tifl_require_stagnation: only change probabilities when the current tier's
      accuracy did not improve over the last I rounds.
    tifl_prob_rule: "paper" ((n - i) / (n (n - 1) / 2), i = 1..n) or
      "all_positive" ((n - i) / (n (n + 1) / 2), i = 0..n-1).
  """
  clients_per_round: int = 10
  tifl_interval: int = 10
  tifl_rounds: int = 2000
  tifl_require_stagnation: bool = True
  tifl_prob_rule: str = "paper"
  compression_precision: Optional[int] = None

  def __post_init__(self):
    _int("clients_per_round", self.clients_per_round, 1)
    _int("tifl_interval", self.tifl_interval, 1)
    _int("tifl_rounds", self.tifl_rounds, 1)
    if not isinstance(self.tifl_require_stagnation, bool):
      raise ValueError("tifl_require_stagnation must be True or False, got "
                       f"{self.tifl_require_stagnation!r}")
    _choice("tifl_prob_rule", self.tifl_prob_rule, TIFL_PROB_RULES)
    _precision("compression_precision", self.compression_precision)


@dataclasses.dataclass(frozen=True)
class FedAsyncConfig:
  """FedAsync (Xie, Koyejo, Gupta, 2019).

  Attributes:
    alpha: mixing weight alpha in (0, 1].
    staleness: "constant", "polynomial" ((d + 1)^-a) or "hinge".
    poly_a: a of the polynomial function (> 0).
    hinge_a, hinge_b: a (> 0) and b (>= 0) of the hinge function.
    rho: proximal coefficient of the local objective.
  """
  alpha: float = 0.6
  staleness: str = "polynomial"
  poly_a: float = 0.5
  hinge_a: float = 10.0
  hinge_b: float = 4.0
  rho: float = 0.005
  compression_precision: Optional[int] = None

  def __post_init__(self):
    _float("alpha", self.alpha, strict=True, maximum=1.0)
    _choice("staleness", self.staleness, STALENESS_FUNCTIONS)
    _float("poly_a", self.poly_a, strict=True)
    _float("hinge_a", self.hinge_a, strict=True)
    _float("hinge_b", self.hinge_b)
    _float("rho", self.rho)
    _precision("compression_precision", self.compression_precision)


@dataclasses.dataclass(frozen=True)
class ASOFedConfig:
  """ASO-Fed as FedAT characterises it (Chen et al., 2020)."""
  lam: float = 0.4
  compression_precision: Optional[int] = None

  def __post_init__(self):
    _float("lam", self.lam)
    _precision("compression_precision", self.compression_precision)


@dataclasses.dataclass(frozen=True)
class FedBuffConfig:
  """FedBuff (Nguyen et al., AISTATS 2022, Algorithm 1).

  K = 10 and s(tau) = 1 / sqrt(1 + tau) are the paper's; concurrency 100 lets every client
  of the default 100-client system train at once, and eta_g = 1 applies the buffer's mean
  as it is.

  Attributes:
    concurrency: clients training at once (fewer when fewer alive clients are
      idle); a freed slot starts a new client at once.
    buffer_size: K, client updates per server update.
    server_lr: eta_g of w <- w - eta_g * mean of the buffer's weighted updates.
    staleness: the weight s(tau) of an update made tau server updates ago:
      "polynomial" ((1 + tau)^-poly_a; the paper's 1 / sqrt(1 + tau) with
      poly_a = 0.5), "constant" (1) or "hinge" (1 up to tau = hinge_b, then
      1 / (hinge_a (tau - hinge_b) + 1)).
    rho: proximal coefficient of the local objective (the paper uses none: 0).
    compression_precision: polyline precision of the messages; None = raw float32.
  """
  concurrency: int = 100
  buffer_size: int = 10
  server_lr: float = 1.0
  staleness: str = "polynomial"
  poly_a: float = 0.5
  hinge_a: float = 10.0
  hinge_b: float = 4.0
  rho: float = 0.0
  compression_precision: Optional[int] = None

  def __post_init__(self):
    _int("concurrency", self.concurrency, 1)
    _int("buffer_size", self.buffer_size, 1)
    _float("server_lr", self.server_lr, strict=True)
    _choice("staleness", self.staleness, STALENESS_FUNCTIONS)
    _float("poly_a", self.poly_a, strict=True)
    _float("hinge_a", self.hinge_a, strict=True)
    _float("hinge_b", self.hinge_b)
    _float("rho", self.rho)
    _precision("compression_precision", self.compression_precision)
