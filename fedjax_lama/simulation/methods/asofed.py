"""ASO-Fed as FedAT characterises it: the mean of one server copy per client.

Y. Chen, Y. Ning, M. Slawski, H. Rangwala, "Asynchronous Online Federated
Learning for Edge Devices with Non-IID Data", IEEE BigData 2020
(arXiv:1911.02134). FedAT (Chai et al., SC'21, Sec. 6) summarises it as: the
server keeps a copy of the weights per client and averages all copies. This is
what is implemented: c_k = w0 for every client; on a delivered
arrival c_k <- v_k-hat and w <- sum_k (n_k / N) c_k over all K clients (departed
clients keep their last copy), as one weighted sum; the client is re-dispatched
with w. ASO-Fed's online data, decay-corrected updates, dynamic step sizes and
feature-representation step are simplified away.
"""
import numpy as np

from fedjax_lama.simulation.system_config import ASOFedConfig
from fedjax_lama.simulation.interfaces import PyTree
from fedjax_lama.simulation.methods.base import Arrival, Method


class ASOFed(Method):
  """ASO-Fed (Chen et al., BigData 2020) per FedAT's description."""

  name = "asofed"
  citation = "Chen, Ning, Slawski, Rangwala, ASO-Fed, IEEE BigData 2020 (arXiv:1911.02134)"
  GROUP = 0
  config_type = ASOFedConfig

  def bind(self, sim) -> None:
    super().bind(sim)
    counts = np.asarray(sim.num_examples, np.float64)
    self.data_shares = (counts / counts.sum()).tolist()  # n_k / N over all K clients
    self.copies = [sim.initial_model] * sim.config.num_clients
    self.model = sim.initial_model
    self.updates = 0

  def _dispatch(self, clients) -> None:
    self.sim.broadcast(clients, self.model, (self.GROUP, self.updates),
                       precision=self.config.compression_precision, prox_coeff=self.config.lam)

  def on_start(self) -> None:
    self._dispatch(self.sim.alive_clients())

  def on_arrival(self, arrival: Arrival) -> None:
    self.copies[arrival.client] = arrival.model
    self.model = self.sim.algebra.weighted_sum(self.copies, self.data_shares)
    self.updates += 1
    if not self.sim.is_departed(arrival.client):
      self._dispatch([arrival.client])

  def global_model(self) -> PyTree:
    return self.model

  @property
  def global_updates(self) -> int:
    return self.updates

  def state_dict(self) -> dict:
    return {"copies": list(self.copies), "model": self.model, "updates": self.updates}

  def load_state_dict(self, state: dict) -> None:
    self.copies = list(state["copies"])
    self.model = state["model"]
    self.updates = int(state["updates"])
