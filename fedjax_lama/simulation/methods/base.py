"""What every method on the virtual clock shares (FedAT's baselines, Chai et al., SC'21, Sec. 6).

A method is a small class over the event loop: the loop calls its hooks
(`on_start` at virtual time 0, `on_arrival` for each delivered job, `on_dropout`
when a client departs, `on_tick` after each evaluation, `on_timer` for its own
wake-ups), and the method dispatches jobs through `sim.broadcast`. Dispatches
made inside a hook happen at the current virtual time, in the order issued.

The synchronous-round helpers implement the rules the synchronous baselines share: a round samples
from the clients that have not departed (stream SAMPLE (g, r)), waits for every
sampled client to arrive or depart, and aggregates the delivered models weighted
by n_k (FedAvg, McMahan et al. AISTATS 2017; FedAT's intra-tier round, Eq. 4).
"""
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np

from fedjax_lama.simulation import streams
from fedjax_lama.simulation.interfaces import PyTree


class Arrival(NamedTuple):
  """A delivered job, as a method's `on_arrival` receives it.

  Attributes:
    job_id: the simulator's id of the job.
    client: k.
    index: the participation index j of the job.
    context: the method's tag given at dispatch (ints).
    model: the decoded upload v_k-hat.
    num_examples: n_k.
    dispatch_time: when the job was dispatched.
    num_epochs: local epochs the job ran.
  """
  job_id: int
  client: int
  index: int
  context: tuple
  model: PyTree
  num_examples: int
  dispatch_time: float
  num_epochs: int


class Method:
  """Base class of the methods, the server-side drivers of runs on the simulated clock (what a
  program is to synchronous rounds); subclasses override the hooks they need."""

  name = "method"
  citation = ""
  config_type = None  # the method's config dataclass; its default is used when none is given

  def __init__(self, config=None):
    self.sim = None
    if self.config_type is not None:
      config = self.config_type() if config is None else config
      if not isinstance(config, self.config_type):
        raise ValueError(f"{self.name}: config must be a {self.config_type.__name__}, got "
                         f"{type(config).__name__}")
    self.config = config

  def bind(self, sim) -> None:
    """Called once by the Simulator, before virtual time 0."""
    self.sim = sim

  # hooks -----------------------------------------------------------------------------

  def on_start(self) -> None:
    raise NotImplementedError

  def on_arrival(self, arrival: Arrival) -> None:
    raise NotImplementedError

  def on_dropout(self, client: int) -> None:
    del client

  def on_tick(self, tick: int) -> None:
    del tick

  def on_timer(self, token: int) -> None:
    raise RuntimeError(f"{self.name} scheduled no timer (token {token})")

  # what the loop reads ---------------------------------------------------------------

  def global_model(self) -> PyTree:
    raise NotImplementedError

  @property
  def global_updates(self) -> int:
    raise NotImplementedError

  def tier_updates(self) -> Optional[list[int]]:
    """Per-tier update counts T_m (FedAT only)."""
    return None

  def state_dict(self) -> dict:
    raise NotImplementedError

  def load_state_dict(self, state: dict) -> None:
    raise NotImplementedError


class SyncRound:
  """One open synchronous round of one group of clients.

  The round is complete when every sampled client has arrived or departed.
  """

  def __init__(self, group: int, index: int, start_time: float, sampled: Sequence[int]):
    self.group = int(group)
    self.index = int(index)
    self.start_time = float(start_time)
    self.sampled = [int(k) for k in sampled]
    self.outstanding = set(self.sampled)
    self.delivered: dict[int, PyTree] = {}

  @property
  def complete(self) -> bool:
    return not self.outstanding

  def deliver(self, client: int, model: PyTree) -> None:
    if client not in self.outstanding:
      raise RuntimeError(f"client {client} is not awaited in round {self.index} of group "
                         f"{self.group}")
    self.outstanding.discard(client)
    self.delivered[client] = model

  def drop(self, client: int) -> bool:
    """Stops waiting for a departed client; True if it was awaited."""
    if client in self.outstanding:
      self.outstanding.discard(client)
      return True
    return False

  def to_state(self) -> dict:
    return {"group": self.group, "index": self.index, "start_time": self.start_time,
            "sampled": list(self.sampled), "outstanding": sorted(self.outstanding),
            "delivered": [[k, self.delivered[k]] for k in sorted(self.delivered)]}

  @classmethod
  def from_state(cls, state: Optional[dict]) -> Optional["SyncRound"]:
    if state is None:
      return None
    rnd = cls(state["group"], state["index"], state["start_time"], state["sampled"])
    rnd.outstanding = {int(k) for k in state["outstanding"]}
    rnd.delivered = {int(k): model for k, model in state["delivered"]}
    return rnd


def sample_weighted_mean(sim, delivered: dict) -> PyTree:
  """sum_k n_k v_k / sum_k n_k over the delivered clients, in increasing id.

  The canonical (id) order makes the floating-point sum independent of arrival
  ties, and identical for every method that uses it (FedAT = FedAvg).
  """
  clients = sorted(delivered)
  counts = np.asarray([sim.num_examples[k] for k in clients], np.float64)
  weights = counts / counts.sum()
  return sim.algebra.weighted_sum([delivered[k] for k in clients], weights.tolist())


def start_sync_round(sim, group: int, index: int, candidates: Sequence[int],
                     clients_per_round: int, model: PyTree, *, precision: Optional[int],
                     prox_coeff: float, num_epochs: Any = None) -> Optional[SyncRound]:
  """Samples min(C, alive candidates) clients and dispatches them with `model`.

  Returns None (and dispatches nothing) when no candidate is alive. Jobs are
  tagged with the context (group, round index).
  """
  alive = sim.alive_clients(candidates)
  if not alive:
    return None
  sampled = streams.sample_clients(sim.seed, group, index, alive, clients_per_round)
  sim.broadcast(sampled, model, (group, index), precision=precision, prox_coeff=prox_coeff,
                num_epochs=num_epochs)
  return SyncRound(group, index, sim.now, sampled)
