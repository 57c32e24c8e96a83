"""FedBuff: buffered asynchronous aggregation on the virtual clock.

J. Nguyen, K. Malik, H. Zhan, A. Yousefpour, M. Rabbat, M. Malek, D. Huba,
"Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022,
Algorithm 1. Up to `concurrency` clients train at once, each from the model it
downloaded. A client's update is Delta_i = w^(tau_i) - v_i (the server's model
of the version it downloaded minus its decoded upload), weighted by
s(t - tau_i), t the server's version when it arrives; s(tau) = 1 / sqrt(1 + tau)
in the paper. Every K arrivals the server steps

    w^(t+1) = w^t - eta_g (1/K) sum_i s(t_i - tau_i) Delta_i

and empties the buffer. After every arrival (and every departure of a client in
flight) the freed slots start new clients, sampled among the alive clients not
in flight (stream SAMPLE (0, d), d counting the draws), with the current model.

Exactness. The step is one weighted sum over the distinct models involved: the
current model, each downloaded version once, and the uploads in (client, job)
order. Its coefficients are summed in exact rational arithmetic, so a model
whose coefficient is exactly 0 drops out: with K = concurrency = every client,
eta_g = 1 and no staleness the first step is bit for bit FedAvg's n_k-weighted
mean (equal n_k), and with K = 1, a constant s and no staleness a step is bit for
bit FedAsync's (1 - alpha) w + alpha v.
"""
from fractions import Fraction

from fedjax_lama.simulation import streams
from fedjax_lama.simulation.system_config import FedBuffConfig
from fedjax_lama.simulation.interfaces import PyTree
from fedjax_lama.simulation.methods.base import Arrival, Method
from fedjax_lama.simulation.methods.fedasync import staleness_weight


class FedBuff(Method):
  """FedBuff (Nguyen et al., AISTATS 2022, Algorithm 1) on the virtual clock."""

  name = "fedbuff"
  citation = "Nguyen et al., FedBuff, AISTATS 2022 (Alg. 1)"
  GROUP = 0  # sampling group of the slot refills (stream SAMPLE (0, d))
  config_type = FedBuffConfig

  def bind(self, sim) -> None:
    super().bind(sim)
    self.version = 0                       # t: server updates so far
    self.models = {0: sim.initial_model}   # w^v of every version still referenced
    self.in_flight: dict[int, int] = {}    # client -> version it downloaded
    self.buffer: list[tuple] = []          # (client, job index, version, s, upload)
    self.draws = 0                         # d of stream SAMPLE (0, d)

  @property
  def model(self) -> PyTree:
    return self.models[self.version]

  # hooks ---------------------------------------------------------------------------

  def on_start(self) -> None:
    self._fill_slots()

  def on_arrival(self, arrival: Arrival) -> None:
    start_version = arrival.context[1]
    if self.in_flight.get(arrival.client) != start_version:
      raise RuntimeError(f"arrival of client {arrival.client} from version {start_version}, "
                         "which is not in flight")
    del self.in_flight[arrival.client]
    self.buffer.append((arrival.client, arrival.index, start_version,
                        self.staleness_weight(self.version - start_version), arrival.model))
    if len(self.buffer) == self.config.buffer_size:
      self._apply_buffer()
    self._fill_slots()

  def on_dropout(self, client: int) -> None:
    # A departed client's job never arrives (it is lost): free its slot at its departure.
    if self.in_flight.pop(client, None) is not None:
      self._fill_slots()

  # the algorithm -------------------------------------------------------------------

  def staleness_weight(self, staleness: int) -> float:
    """s(tau) of an update made `staleness` server updates ago (0 = fresh)."""
    c = self.config
    return staleness_weight(staleness, c.staleness, c.poly_a, c.hinge_a, c.hinge_b)

  def update_coefficients(self) -> tuple[list[int], list[Fraction], list[Fraction]]:
    """The buffer's step as exact coefficients: versions, their coefficients, the uploads'.

    w^(t+1) = sum_v a_v w^v + sum_i c_i v_i with c_i = eta_g s_i / K and
    a_v = [v = t] - sum of c_i over the updates downloaded at version v.
    """
    c = self.config
    rate = Fraction(c.server_lr) / c.buffer_size
    entries = sorted(self.buffer, key=lambda e: (e[0], e[1]))
    upload_coefs = [rate * Fraction(e[3]) for e in entries]
    version_coefs = {self.version: Fraction(1)}
    for entry, coef in zip(entries, upload_coefs):
      version_coefs[entry[2]] = version_coefs.get(entry[2], Fraction(0)) - coef
    versions = sorted(version_coefs)
    return versions, [version_coefs[v] for v in versions], upload_coefs

  def _apply_buffer(self) -> None:
    versions, version_coefs, upload_coefs = self.update_coefficients()
    entries = sorted(self.buffer, key=lambda e: (e[0], e[1]))
    terms = [(self.models[v], a) for v, a in zip(versions, version_coefs) if a != 0]
    terms += [(e[4], ci) for e, ci in zip(entries, upload_coefs) if ci != 0]
    trees, weights = [t for t, _ in terms], [float(w) for _, w in terms]
    new_model = self.sim.algebra.weighted_sum(trees, weights) if trees else self.model
    self.version += 1
    self.models[self.version] = new_model
    self.buffer = []
    self._forget_unused_versions()

  def _fill_slots(self) -> None:
    free = self.config.concurrency - len(self.in_flight)
    if free <= 0:
      return
    idle = [k for k in self.sim.alive_clients() if k not in self.in_flight]
    if not idle:
      return
    clients = streams.sample_clients(self.sim.seed, self.GROUP, self.draws, idle, free)
    self.draws += 1
    self.sim.broadcast(clients, self.model, (self.GROUP, self.version),
                       precision=self.config.compression_precision, prox_coeff=self.config.rho)
    for k in clients:
      self.in_flight[k] = self.version
    self._forget_unused_versions()

  def _forget_unused_versions(self) -> None:
    used = {self.version, *self.in_flight.values(), *(e[2] for e in self.buffer)}
    for v in [v for v in self.models if v not in used]:
      del self.models[v]

  # what the loop reads -------------------------------------------------------------

  def global_model(self) -> PyTree:
    return self.model

  @property
  def global_updates(self) -> int:
    return self.version

  def state_dict(self) -> dict:
    # "model" (the global model, also in "models") is what readers of a checkpoint look up.
    return {"version": self.version, "model": self.model,
            "models": [[v, self.models[v]] for v in sorted(self.models)],
            "in_flight": [[k, self.in_flight[k]] for k in sorted(self.in_flight)],
            "buffer": [[k, j, v, s, model] for k, j, v, s, model in self.buffer],
            "draws": self.draws}

  def load_state_dict(self, state: dict) -> None:
    self.version = int(state["version"])
    self.models = {int(v): model for v, model in state["models"]}
    self.in_flight = {int(k): int(v) for k, v in state["in_flight"]}
    self.buffer = [(int(k), int(j), int(v), float(s), model) for k, j, v, s, model in
                   state["buffer"]]
    self.draws = int(state["draws"])
