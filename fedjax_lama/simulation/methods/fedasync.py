"""FedAsync: every arrival is mixed into the global model at once.

C. Xie, S. Koyejo, I. Gupta, "Asynchronous Federated Optimization",
arXiv:1903.03934: w_t = (1 - alpha_t) w_{t-1} + alpha_t x_new with
alpha_t = alpha * s(t - tau), tau the version the client started from and t the
version being produced (t - tau >= 1); staleness functions constant, polynomial
and hinge. As FedAT describes it (Chai et al., SC'21, Sec. 6) and as
this project reads it: every client is dispatched with w0 at time 0;
on each delivered arrival the server mixes, bumps its version counter and
re-dispatches that client (the only idle one) with the new model.
"""
from fedjax_lama.simulation.system_config import STALENESS_FUNCTIONS, FedAsyncConfig
from fedjax_lama.simulation.interfaces import PyTree
from fedjax_lama.simulation.methods.base import Arrival, Method


def staleness_weight(staleness: int, kind: str = "polynomial", poly_a: float = 0.5,
                     hinge_a: float = 10.0, hinge_b: float = 4.0) -> float:
  """s(t - tau) of FedAsync.

  Args:
    staleness: t - tau (>= 1 in this simulation: a fresh update has staleness 1).
    kind: "constant" (1), "polynomial" ((t - tau + 1)^-a) or "hinge" (1 if
      t - tau <= b, else 1 / (a (t - tau - b) + 1)).
  """
  if kind not in STALENESS_FUNCTIONS:
    raise ValueError(f"staleness must be one of {list(STALENESS_FUNCTIONS)}, got {kind!r}")
  if staleness < 0:
    raise ValueError(f"staleness t - tau must be >= 0, got {staleness}")
  if kind == "constant":
    return 1.0
  if kind == "polynomial":
    return float((staleness + 1) ** (-poly_a))
  if staleness <= hinge_b:
    return 1.0
  return 1.0 / (hinge_a * (staleness - hinge_b) + 1.0)


class FedAsync(Method):
  """FedAsync (Xie et al., arXiv:1903.03934) on the virtual clock."""

  name = "fedasync"
  citation = "Xie, Koyejo, Gupta, FedAsync, arXiv:1903.03934"
  GROUP = 0
  config_type = FedAsyncConfig

  def bind(self, sim) -> None:
    super().bind(sim)
    self.model = sim.initial_model
    self.version = 0

  def _dispatch(self, clients) -> None:
    # The context carries the version tau the clients start from.
    self.sim.broadcast(clients, self.model, (self.GROUP, self.version),
                       precision=self.config.compression_precision, prox_coeff=self.config.rho)

  def on_start(self) -> None:
    self._dispatch(self.sim.alive_clients())

  def mixing_weight(self, start_version: int) -> float:
    """alpha_t = alpha s(t - tau) for the update that produces version t = v + 1."""
    c = self.config
    staleness = self.version + 1 - start_version
    return c.alpha * staleness_weight(staleness, c.staleness, c.poly_a, c.hinge_a, c.hinge_b)

  def on_arrival(self, arrival: Arrival) -> None:
    alpha_t = self.mixing_weight(arrival.context[1])
    self.model = self.sim.algebra.weighted_sum([self.model, arrival.model],
                                               [1.0 - alpha_t, alpha_t])
    self.version += 1
    if not self.sim.is_departed(arrival.client):
      self._dispatch([arrival.client])

  def global_model(self) -> PyTree:
    return self.model

  @property
  def global_updates(self) -> int:
    return self.version

  def state_dict(self) -> dict:
    return {"model": self.model, "version": self.version}

  def load_state_dict(self, state: dict) -> None:
    self.model = state["model"]
    self.version = int(state["version"])
