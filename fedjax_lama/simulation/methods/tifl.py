"""TiFL: one tier per round, chosen by accuracy with credits.

Z. Chai, A. Ali, S. Zawad, S. Truex, A. Anwar, N. Baracaldo, Y. Zhou, H. Ludwig,
F. Yan, Y. Cheng, "TiFL: A Tier-based Federated Learning System", HPDC'20
(arXiv:2001.09249), Algorithm 2 and ChangeProbs, as summarised by FedAT (Chai et
al., SC'21, Sec. 2.1, 6).

Round r: at r = 0, I, 2I, ... the global model is evaluated on every alive
client (A^r, the pooled accuracy of each tier's alive clients; the collection
costs a raw model download to, and 8 bytes up from, every alive client). At
r = I, 2I, ... the probabilities become ChangeProbs(A^r) if the current tier
(the tier of round r - 1) did not improve over the last I rounds (option
`tifl_require_stagnation`). One u from stream TIFL (r) picks the first credited
tier whose cumulative (renormalised) probability exceeds u; its credits drop by
one and min(C, alive members) of it are sampled with SAMPLE (0, r). Aggregation
is FedAvg's. When no tier has credits left TiFL stops dispatching.

Probabilities are kept as exact fractions, so the tier choice has no rounding.
"""
import math
from fractions import Fraction
from typing import Optional, Sequence

from fedjax_lama.simulation import streams
from fedjax_lama.simulation.system_config import TIFL_PROB_RULES, TiFLConfig
from fedjax_lama.simulation.events import ACCURACY_PROBE, DOWN, UP
from fedjax_lama.simulation.methods.base import start_sync_round
from fedjax_lama.simulation.methods.sync_fedavg import SynchronousMethod
from fedjax_lama.simulation.streams import Stream

PROBE_UPLOAD_BYTES = 8  # correct count and test count as int32


def change_probs(accuracies: Sequence[float], eligible: Sequence[bool],
                 rule: str = "paper") -> list[Fraction]:
  """TiFL's ChangeProbs over the eligible (credited, alive) tiers.

  Eligible tiers are ranked by ascending accuracy (ties by tier index).
  "paper": rank i = 1..n gets (n - i) / (n (n - 1) / 2) (the most accurate gets
  0; n = 1 gets 1). "all_positive": i = 0..n-1 gets (n - i) / (n (n + 1) / 2).
  Ineligible tiers get 0.
  """
  if rule not in TIFL_PROB_RULES:
    raise ValueError(f"tifl_prob_rule must be one of {list(TIFL_PROB_RULES)}, got {rule!r}")
  tiers = [t for t in range(len(accuracies)) if eligible[t]]
  probs = [Fraction(0)] * len(accuracies)
  n = len(tiers)
  if n == 0:
    return probs
  ranked = sorted(tiers, key=lambda t: (accuracies[t], t))
  if rule == "paper":
    if n == 1:
      probs[ranked[0]] = Fraction(1)
      return probs
    denominator = n * (n - 1) // 2
    for i, t in enumerate(ranked, start=1):
      probs[t] = Fraction(n - i, denominator)
  else:
    denominator = n * (n + 1) // 2
    for i, t in enumerate(ranked):
      probs[t] = Fraction(n - i, denominator)
  return probs


def select_tier(probs: Sequence[Fraction], eligible: Sequence[bool], u: float) -> Optional[int]:
  """The first eligible tier whose cumulative renormalised probability exceeds u.

  Probabilities are restricted to the eligible tiers and renormalised; if they
  are all 0 there (possible under rule "paper" once credits run out), the
  eligible tiers are taken as equally likely (Decision). None if none is eligible.
  """
  tiers = [t for t in range(len(probs)) if eligible[t]]
  if not tiers:
    return None
  mass = {t: Fraction(probs[t]) for t in tiers}
  total = sum(mass.values())
  if total == 0:
    mass, total = {t: Fraction(1) for t in tiers}, Fraction(len(tiers))
  threshold = Fraction(u) * total  # compare sum(mass) / total > u without division
  cumulative = Fraction(0)
  for t in tiers:
    cumulative += mass[t]
    if cumulative > threshold:
      return t
  return tiers[-1]  # unreachable for u < 1


class TiFL(SynchronousMethod):
  """TiFL (Chai et al., HPDC'20) on the virtual clock."""

  name = "tifl"
  citation = "Chai et al., TiFL, HPDC'20 (Alg. 2, ChangeProbs)"
  config_type = TiFLConfig

  def bind(self, sim) -> None:
    super().bind(sim)
    self.num_tiers = sim.setup.num_tiers
    self.members = [sim.setup.tier_members(m) for m in range(self.num_tiers)]
    self.credits = [math.ceil(self.config.tifl_rounds / self.num_tiers)] * self.num_tiers
    self.probs = [Fraction(1, self.num_tiers)] * self.num_tiers
    self.accuracy_history: dict[int, list[float]] = {}
    self.current_tier: Optional[int] = None
    self.stopped = False

  # rounds --------------------------------------------------------------------------

  def _eligible(self) -> list[bool]:
    """Tiers with credits and at least one alive member."""
    return [self.credits[t] > 0 and bool(self.sim.alive_clients(self.members[t]))
            for t in range(self.num_tiers)]

  def _start_round(self) -> None:
    r, interval = self.round_index, self.config.tifl_interval
    if r % interval == 0:  # r = 0, I, 2I, ...: collect the tiers' accuracies first
      wait = self._collect_accuracies(r)
      if wait > 0:
        self.open_round = None
        self.sim.schedule_timer(self.sim.now + wait, r)
        return
    self._select_and_dispatch()

  def on_timer(self, token: int) -> None:
    if token != self.round_index:
      raise RuntimeError(f"TiFL timer for round {token} during round {self.round_index}")
    self._select_and_dispatch()

  def _select_and_dispatch(self) -> None:
    r, interval = self.round_index, self.config.tifl_interval
    eligible = self._eligible()
    if r % interval == 0 and r >= interval:
      latest, earlier = self.accuracy_history[r], self.accuracy_history[r - interval]
      cur = self.current_tier
      if not self.config.tifl_require_stagnation or latest[cur] <= earlier[cur]:
        self.probs = change_probs(latest, eligible, self.config.tifl_prob_rule)
    tier = select_tier(self.probs, eligible, streams.uniform(self.sim.seed, Stream.TIFL, r))
    if tier is None:  # no credits left anywhere: TiFL is done
      self.open_round, self.stopped = None, True
      return
    self.credits[tier] -= 1
    self.current_tier = tier
    self.open_round = start_sync_round(
        self.sim, self.GROUP, r, self.members[tier], self.config.clients_per_round, self.model,
        precision=self._precision(), prox_coeff=0.0)

  def _collect_accuracies(self, r: int) -> float:
    """Measures A^r on the alive clients, records its messages; returns its duration."""
    sim = self.sim
    alive = sim.alive_clients()
    correct, count = sim.evaluate(self.model)
    accuracies = []
    for t in range(self.num_tiers):
      members = [k for k in self.members[t] if not sim.is_departed(k)]
      tests = int(count[members].sum()) if members else 0
      accuracies.append(int(correct[members].sum()) / tests if tests else math.nan)
    self.accuracy_history[r] = accuracies
    wait = 0.0
    for k in alive:
      sim.record_message(DOWN, sim.raw_model_bytes, k, ACCURACY_PROBE)
      sim.record_message(UP, PROBE_UPLOAD_BYTES, k, ACCURACY_PROBE)
      wait = max(wait, sim.latency.probe_download_time(k, r, sim.raw_model_bytes))
    return wait

  # state ---------------------------------------------------------------------------

  def state_dict(self) -> dict:
    state = super().state_dict()
    state.update(
        credits=list(self.credits),
        probs=[[p.numerator, p.denominator] for p in self.probs],
        accuracy_history=[[r, list(a)] for r, a in sorted(self.accuracy_history.items())],
        current_tier=-1 if self.current_tier is None else self.current_tier,
        stopped=self.stopped)
    return state

  def load_state_dict(self, state: dict) -> None:
    super().load_state_dict(state)
    self.credits = [int(c) for c in state["credits"]]
    self.probs = [Fraction(int(n), int(d)) for n, d in state["probs"]]
    self.accuracy_history = {int(r): [float(x) for x in a] for r, a in state["accuracy_history"]}
    self.current_tier = None if state["current_tier"] < 0 else int(state["current_tier"])
    self.stopped = bool(state["stopped"])
