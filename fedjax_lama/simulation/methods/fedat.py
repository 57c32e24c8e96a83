"""FedAT: synchronous rounds inside tiers, asynchronous updates across tiers.

Z. Chai, Y. Chen, A. Anwar, L. Zhao, Y. Cheng, H. Rangwala, "FedAT: A
High-Performance and Communication-Efficient Federated Learning System with
Asynchronous Tiers", SC'21: Algorithm 2,
Eq. 3-5, Sec. 4.1-4.3.

- Intra-tier round (Sec. 4.1): sample C of the tier's alive clients (stream SAMPLE
  (m, r)), send the global model (encoded at `compression_precision`), clients
  minimise F_k + (lambda/2)||v - w-hat||^2, the round ends when every sampled
  client has arrived or departed; W_m <- n_k-weighted mean of the decoded
  uploads, T_m += 1, the global model is rebuilt with Eq. 5, and the tier starts
  its next round at once (Alg. 2: no cross-tier barrier).
- Cross-tier weights (Eq. 5): tier m gets T_tier(M+1-m) / T; computed from the
  integer counts in exact rational arithmetic, then converted to float64.
"""
from fractions import Fraction
from typing import Optional, Sequence

from fedjax_lama.simulation.system_config import CROSS_TIER_SETS, CROSS_TIER_WEIGHTS, FedATConfig
from fedjax_lama.simulation.interfaces import PyTree
from fedjax_lama.simulation.methods.base import (Arrival, Method, SyncRound, sample_weighted_mean,
                                                 start_sync_round)


def cross_tier_fractions(counts: Sequence[int], weights: str = "eq5",
                         tier_set: str = "all") -> Optional[list[Fraction]]:
  """Exact cross-tier weights (Chai et al., SC'21, Eq. 5; known answers in
  tests/test_simulation_methods.py).

  Args:
    counts: counts[m] = T_tier(m+1), the updates tier m+1 has made (index 0 =
      fastest tier); non-negative ints.
    weights: "eq5" (tier m gets the count of tier M+1-m) or "uniform".
    tier_set: "all" (every tier, the literal reading) or "reported" (only the
      tiers with a count > 0, the renormalised reading).

  Returns:
    M Fractions summing to 1, or None when no tier has reported (t = 0: the
    global model is then the initial model w0).
  """
  if weights not in CROSS_TIER_WEIGHTS:
    raise ValueError(f"cross_tier_weights must be one of {list(CROSS_TIER_WEIGHTS)}, "
                     f"got {weights!r}")
  if tier_set not in CROSS_TIER_SETS:
    raise ValueError(f"cross_tier_set must be one of {list(CROSS_TIER_SETS)}, got {tier_set!r}")
  counts = list(counts)
  if not counts or any(isinstance(c, bool) or int(c) != c or c < 0 for c in counts):
    raise ValueError(f"counts must be a non-empty list of non-negative ints, got {counts!r}")
  counts = [int(c) for c in counts]
  if sum(counts) == 0:
    return None
  num_tiers = len(counts)
  if tier_set == "all":
    tiers = list(range(num_tiers))
  else:
    tiers = [m for m in range(num_tiers) if counts[m] > 0]
  result = [Fraction(0)] * num_tiers
  if weights == "eq5":
    total = sum(counts[m] for m in tiers)
    for j, m in enumerate(tiers):  # the j-th fastest tier of the set gets the j-th slowest's count
      result[m] = Fraction(counts[tiers[len(tiers) - 1 - j]], total)
  else:
    for m in tiers:
      result[m] = Fraction(1, len(tiers))
  return result


def cross_tier_weights(counts: Sequence[int], weights: str = "eq5",
                       tier_set: str = "all") -> Optional[list[float]]:
  """`cross_tier_fractions` as float64 (each Fraction correctly rounded)."""
  exact = cross_tier_fractions(counts, weights, tier_set)
  return None if exact is None else [float(w) for w in exact]


class FedAT(Method):
  """FedAT on the virtual clock (Chai et al., SC'21, Algorithm 2)."""

  name = "fedat"
  citation = "Chai et al., FedAT, SC'21 (Alg. 2, Eq. 3-5)"
  config_type = FedATConfig

  def bind(self, sim) -> None:
    super().bind(sim)
    self.num_tiers = sim.setup.num_tiers
    self.members = [sim.setup.tier_members(m) for m in range(self.num_tiers)]
    self.tier_models: list[PyTree] = [sim.initial_model] * self.num_tiers  # W_m
    self.counts = [0] * self.num_tiers                                    # T_m
    self.round_index = [0] * self.num_tiers
    self.open_rounds: list[Optional[SyncRound]] = [None] * self.num_tiers
    self.retired = [False] * self.num_tiers
    self.model = sim.initial_model                                        # w

  # hooks ---------------------------------------------------------------------------

  def on_start(self) -> None:
    for m in range(self.num_tiers):  # tiers dispatched in order 1..M (Sec. 4.2)
      self._start_round(m)

  def on_arrival(self, arrival: Arrival) -> None:
    tier, index = arrival.context
    rnd = self.open_rounds[tier]
    if rnd is None or rnd.index != index:
      raise RuntimeError(f"arrival of client {arrival.client} for tier {tier} round {index}, "
                         "which is not open")
    rnd.deliver(arrival.client, arrival.model)
    if rnd.complete:
      self._finish_round(tier)

  def on_dropout(self, client: int) -> None:
    tier = int(self.sim.setup.tiers[client])
    rnd = self.open_rounds[tier]
    if rnd is not None and rnd.drop(client) and rnd.complete:
      self._finish_round(tier)

  # rounds --------------------------------------------------------------------------

  def _start_round(self, tier: int) -> None:
    rnd = start_sync_round(self.sim, tier, self.round_index[tier], self.members[tier],
                           self.config.clients_per_round, self.model,
                           precision=self.config.compression_precision,
                           prox_coeff=self.config.lam)
    self.open_rounds[tier] = rnd
    if rnd is None:  # no alive member: the tier keeps W_m and T_m for Eq. 5
      self.retired[tier] = True

  def _finish_round(self, tier: int) -> None:
    rnd = self.open_rounds[tier]
    if rnd.delivered:
      self.tier_models[tier] = sample_weighted_mean(self.sim, rnd.delivered)
      self.counts[tier] += 1
      self.model = self._combine()
    self.round_index[tier] += 1
    self._start_round(tier)

  def _combine(self) -> PyTree:
    """The global model of Eq. 5 (Alg. 2's WeightedAverage) from every tier's latest model."""
    weights = cross_tier_weights(self.counts, self.config.cross_tier_weights,
                                 self.config.cross_tier_set)
    if weights is None:
      return self.sim.initial_model
    return self.sim.algebra.weighted_sum(self.tier_models, weights)

  # what the loop reads -------------------------------------------------------------

  def global_model(self) -> PyTree:
    return self.model

  @property
  def global_updates(self) -> int:
    return sum(self.counts)

  def tier_updates(self) -> list[int]:
    return list(self.counts)

  def state_dict(self) -> dict:
    return {"tier_models": list(self.tier_models), "counts": list(self.counts),
            "round_index": list(self.round_index), "retired": list(self.retired),
            "open_rounds": [None if r is None else r.to_state() for r in self.open_rounds],
            "model": self.model}

  def load_state_dict(self, state: dict) -> None:
    self.tier_models = list(state["tier_models"])
    self.counts = [int(c) for c in state["counts"]]
    self.round_index = [int(r) for r in state["round_index"]]
    self.retired = [bool(r) for r in state["retired"]]
    self.open_rounds = [SyncRound.from_state(r) for r in state["open_rounds"]]
    self.model = state["model"]
