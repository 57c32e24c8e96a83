"""FedAvg and FedProx on the virtual clock, waiting for the slowest sampled client.

- FedAvg: H. B. McMahan et al., "Communication-Efficient Learning of Deep
  Networks from Decentralized Data", AISTATS 2017; as used by FedAT (Chai et
  al., SC'21, Sec. 3 Alg. 1, Sec. 6). A round lasts as long as its slowest sampled client.
- FedProx: T. Li et al., "Federated Optimization in Heterogeneous Networks",
  MLSys 2020 (arXiv:1812.06127): proximal term mu and
  variable local work E_kj = 1 + floor(E u), u from stream PROX_E (k, j).

A round samples min(C, alive) clients with stream SAMPLE (0, r), waits until
every sampled client has arrived or departed (so it lasts max over the sampled
clients of min(arrival, D_k)), replaces w by the n_k-weighted mean of the
delivered models (nothing changes if none was delivered), and the next round
starts at once. The global counter counts rounds with a delivered model.
"""
import math
from typing import Optional

from fedjax_lama.simulation import streams
from fedjax_lama.simulation.system_config import FedAvgConfig, FedProxConfig
from fedjax_lama.simulation.interfaces import PyTree
from fedjax_lama.simulation.methods.base import (Arrival, Method, SyncRound, sample_weighted_mean,
                                                 start_sync_round)
from fedjax_lama.simulation.streams import Stream


class SynchronousMethod(Method):
  """One group of clients (all of them), one synchronous round after another."""

  GROUP = 0  # sampling group of FedAvg/FedProx/TiFL (simulation/streams.py)

  def bind(self, sim) -> None:
    super().bind(sim)
    self.model = sim.initial_model
    self.round_index = 0
    self.updates = 0
    self.open_round: Optional[SyncRound] = None

  # what subclasses set ------------------------------------------------------------

  def _prox_coeff(self) -> float:
    return 0.0

  def _num_epochs(self):
    return None  # the config's local_epochs

  def _precision(self) -> Optional[int]:
    return self.config.compression_precision

  # hooks ---------------------------------------------------------------------------

  def on_start(self) -> None:
    self._start_round()

  def on_arrival(self, arrival: Arrival) -> None:
    group, index = arrival.context
    rnd = self.open_round
    if rnd is None or rnd.index != index or group != self.GROUP:
      raise RuntimeError(f"arrival of client {arrival.client} for round {index}, which is not open")
    rnd.deliver(arrival.client, arrival.model)
    if rnd.complete:
      self._finish_round()

  def on_dropout(self, client: int) -> None:
    rnd = self.open_round
    if rnd is not None and rnd.drop(client) and rnd.complete:
      self._finish_round()

  # rounds --------------------------------------------------------------------------

  def _start_round(self) -> None:
    self.open_round = start_sync_round(
        self.sim, self.GROUP, self.round_index, range(self.sim.config.num_clients),
        self.config.clients_per_round, self.model, precision=self._precision(),
        prox_coeff=self._prox_coeff(), num_epochs=self._num_epochs())

  def _finish_round(self) -> None:
    rnd = self.open_round
    if rnd.delivered:
      self.model = sample_weighted_mean(self.sim, rnd.delivered)
      self.updates += 1
    self.round_index += 1
    self._start_round()

  # what the loop reads -------------------------------------------------------------

  def global_model(self) -> PyTree:
    return self.model

  @property
  def global_updates(self) -> int:
    return self.updates

  def state_dict(self) -> dict:
    return {"model": self.model, "round_index": self.round_index, "updates": self.updates,
            "open_round": None if self.open_round is None else self.open_round.to_state()}

  def load_state_dict(self, state: dict) -> None:
    self.model = state["model"]
    self.round_index = int(state["round_index"])
    self.updates = int(state["updates"])
    self.open_round = SyncRound.from_state(state["open_round"])


class FedAvg(SynchronousMethod):
  """FedAvg (McMahan et al., AISTATS 2017): local objective F_k."""

  name = "fedavg"
  citation = "McMahan et al., FedAvg, AISTATS 2017"
  config_type = FedAvgConfig


def fedprox_epochs(seed: int, client: int, index: int, max_epochs: int) -> int:
  """E_kj = 1 + floor(E u), u from PROX_E (k, j): uniform on {1, ..., E}."""
  return 1 + int(math.floor(max_epochs * streams.uniform(seed, Stream.PROX_E, client, index)))


class FedProx(SynchronousMethod):
  """FedProx (Li et al., MLSys 2020): F_k + (mu/2)||v - w||^2, variable epochs."""

  name = "fedprox"
  citation = "Li et al., FedProx, MLSys 2020 (arXiv:1812.06127)"
  config_type = FedProxConfig

  def _prox_coeff(self) -> float:
    return self.config.mu

  def _num_epochs(self):
    if not self.config.variable_epochs:
      return None
    seed, max_epochs = self.sim.seed, self.sim.config.local_epochs
    return lambda client, index: fedprox_epochs(seed, client, index, max_epochs)
