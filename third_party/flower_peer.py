"""Flower's server strategies driven on fixed client uploads, for equivalence checks.

Flower (flwr, https://flower.ai; Beutel et al., "Flower: A Friendly Federated Learning
Research Framework", arXiv:2007.14390) implements its server strategies (FedAvg, FedAvgM,
FedAdam, FedYogi, FedAdagrad) on numpy arrays: `Strategy.aggregate_fit(round, results,
failures)` takes each client's uploaded parameters and example count and returns the new
server parameters. This adapter calls exactly that, with no clients, network or PyTorch,
and reads the strategy's state (FedAvgM's momentum vector, FedOpt's m_t and v_t) after
each round.

Two conventions of Flower's FedOpt strategies differ from Reddi et al. ("Adaptive
Federated Optimization", ICLR 2021, Algorithm 2): the second moment starts at v = 0
(the paper: v_{-1} = tau^2), and FedAdam multiplies eta by the bias correction
sqrt(1 - beta2^(r+1)) / (1 - beta1^(r+1)) in round r (the paper has none). The strategies
run here as Flower ships them; our side takes Flower's reading with the algorithms'
`convention="flower"`. Flower is an optional dependency (requirements-peers.txt).
"""
from typing import Optional, Sequence

import numpy as np

STRATEGIES = ("fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad")


def _flwr():
  try:
    import flwr  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("Flower is not installed: pip install flwr==1.42.0 (requirements-peers.txt; "
                      "into a virtual environment of its own)") from e
  return flwr


def version() -> str:
  return _flwr().__version__


def make_strategy(name: str, initial: Sequence[np.ndarray], *, server_lr: float = 1.0,
                  momentum: float = 0.0, beta1: float = 0.9, beta2: float = 0.99,
                  tau: float = 1e-3):
  """Flower's strategy `name` starting from the arrays `initial`, every client sampled."""
  flwr = _flwr()
  strategy = flwr.server.strategy
  params = flwr.common.ndarrays_to_parameters([np.asarray(x) for x in initial])
  common = dict(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=1,
                min_available_clients=1)
  if name == "fedavg":
    return strategy.FedAvg(initial_parameters=params, **common)
  if name == "fedavgm":
    return strategy.FedAvgM(initial_parameters=params, server_learning_rate=server_lr,
                            server_momentum=momentum, **common)
  if name == "fedadam":
    return strategy.FedAdam(initial_parameters=params, eta=server_lr, beta_1=beta1,
                            beta_2=beta2, tau=tau, **common)
  if name == "fedyogi":
    return strategy.FedYogi(initial_parameters=params, eta=server_lr, beta_1=beta1,
                            beta_2=beta2, tau=tau, **common)
  if name == "fedadagrad":
    # Flower's FedAdagrad keeps m_t with beta_1 = 0 (plain Adagrad), as Reddi et al.'s defaults.
    return strategy.FedAdagrad(initial_parameters=params, eta=server_lr, tau=tau, **common)
  raise ValueError(f"strategy {name!r} is not driven here; accepted: {', '.join(STRATEGIES)}")


def _fit_results(uploads: Sequence[Sequence[np.ndarray]], num_examples: Sequence[int]):
  flwr = _flwr()
  c = flwr.common
  ok = c.Status(code=c.Code.OK, message="")
  # The client proxies are not read by aggregate_fit: None stands for each.
  return [(None, c.FitRes(status=ok, parameters=c.ndarrays_to_parameters(list(arrays)),
                          num_examples=int(n), metrics={}))
          for arrays, n in zip(uploads, num_examples, strict=True)]


def run_rounds(name: str, initial: Sequence[np.ndarray],
               uploads_per_round: Sequence[Sequence[Sequence[np.ndarray]]],
               num_examples: Sequence[int], *, server_lr: float = 1.0, momentum: float = 0.0,
               beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3) -> list[dict]:
  """Runs Flower's strategy for len(uploads_per_round) rounds on fixed uploads.

  Args:
    name: one of STRATEGIES.
    initial: the initial server arrays.
    uploads_per_round: for each round, each client's uploaded arrays (its model after
      local training).
    num_examples: each client's example count (Flower weights its mean by them).
    server_lr, momentum, beta1, beta2, tau: the strategy's eta (FedAvgM's
      server_learning_rate), FedAvgM's momentum and FedOpt's beta_1, beta_2, tau.

  Returns:
    One dict per round: "params" (the server arrays), and the strategy's state:
    "momentum" (FedAvgM), "m" and "v" (FedOpt), as lists of arrays.
  """
  flwr = _flwr()
  strategy = make_strategy(name, initial, server_lr=server_lr, momentum=momentum, beta1=beta1,
                           beta2=beta2, tau=tau)
  history = []
  # Flower's server loop numbers its rounds from 1.
  for r, uploads in enumerate(uploads_per_round, start=1):
    params, _ = strategy.aggregate_fit(r, _fit_results(uploads, num_examples), [])
    record = {"params": flwr.common.parameters_to_ndarrays(params)}
    if name == "fedavgm":
      record["momentum"] = [np.array(x) for x in (strategy.momentum_vector or [])]
    elif name != "fedavg":
      record["m"] = [np.array(x) for x in strategy.m_t]
      record["v"] = [np.array(x) for x in strategy.v_t]
    history.append(record)
  return history


def largest_difference(a: Sequence[np.ndarray], b: Sequence[np.ndarray],
                       scale: Optional[float] = None) -> float:
  """max |a - b| over every array (divided by `scale` when given)."""
  diff = max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
             for x, y in zip(a, b, strict=True))
  return diff / scale if scale else diff


# Flower's robust aggregation functions (flwr.server.strategy.aggregate), driven on fixed
# uploads. `results` there is a list of (list of arrays, num_examples); the arrays here are
# whatever one client uploads (whole models in Flower's strategies; the comparisons feed the
# same arrays to both sides).
ROBUST_RULES = ("krum", "multi_krum", "bulyan", "median", "trimmed_mean")


def _aggregate_module():
  _flwr()
  import flwr.server.strategy.aggregate as aggregate  # pylint: disable=g-import-not-at-top
  return aggregate


def robust_aggregate(rule: str, uploads: Sequence[Sequence[np.ndarray]],
                     num_examples: Sequence[int], *, num_malicious: int = 0,
                     to_keep: int = 0, proportiontocut: float = 0.0) -> list[np.ndarray]:
  """Flower's robust aggregate of the clients' `uploads` (one list of arrays per client).

  Args:
    rule: one of ROBUST_RULES: "krum" is `aggregate_krum(..., to_keep=0)`, "multi_krum"
      `aggregate_krum(..., to_keep)` (to_keep > 0, the mean weighted by example counts),
      "bulyan" `aggregate_bulyan` with Krum (to_keep=0) as its selection rule, "median"
      `aggregate_median`, "trimmed_mean" `aggregate_trimmed_avg(..., proportiontocut)`.
    uploads: each client's arrays.
    num_examples: each client's example count (only Multi-Krum's mean reads them).
    num_malicious: f, for Krum, Multi-Krum and Bulyan.
    to_keep: m, Multi-Krum's number of selected clients.
    proportiontocut: the trimmed mean's fraction cut from each side.

  Returns:
    The aggregate, as a list of arrays in the uploads' order.
  """
  aggregate = _aggregate_module()
  # Flower's Bulyan pops its selections from the list it is given: each call gets a fresh one.
  results = [([np.asarray(x) for x in arrays], int(n))
             for arrays, n in zip(uploads, num_examples, strict=True)]
  if rule == "krum":
    return aggregate.aggregate_krum(results, num_malicious=num_malicious, to_keep=0)
  if rule == "multi_krum":
    if to_keep < 1:
      raise ValueError(f"multi_krum needs to_keep >= 1, got {to_keep}")
    return aggregate.aggregate_krum(results, num_malicious=num_malicious, to_keep=to_keep)
  if rule == "bulyan":
    return aggregate.aggregate_bulyan(results, num_malicious=num_malicious,
                                      aggregation_rule=aggregate.aggregate_krum, to_keep=0)
  if rule == "median":
    return aggregate.aggregate_median(results)
  if rule == "trimmed_mean":
    return aggregate.aggregate_trimmed_avg(results, proportiontocut=proportiontocut)
  raise ValueError(f"rule {rule!r} is not driven here; accepted: {', '.join(ROBUST_RULES)}")


# Flower's central DP with server-side fixed clipping (flwr.server.strategy.
# DifferentialPrivacyServerSideFixedClipping around FedAvg), driven on fixed uploads. In each
# round it clips every upload's update y_i - x (x: the model it sent in configure_fit) to
# L2 norm C in float64, lets FedAvg average the clipped models weighted by example counts over
# the k clients that came, and adds N(0, (sigma C / m)^2) per coordinate, m its
# num_sampled_clients (supercore/differential_privacy.py compute_stdv).
class _NoClients:
  """The client manager FedAvg.configure_fit asks: `available` clients, none sampled (the
  uploads are handed to aggregate_fit directly)."""

  def __init__(self, available: int):
    self.available = available

  def num_available(self) -> int:
    return self.available

  def sample(self, num_clients, min_num_clients=None, criterion=None):
    del num_clients, min_num_clients, criterion
    return []


def dp_fixed_clipping_stddev(noise_multiplier: float, clip_norm: float,
                             num_sampled_clients: int) -> float:
  """Flower's noise stddev on the averaged model: sigma C / m."""
  _flwr()
  from flwr.supercore import differential_privacy  # pylint: disable=g-import-not-at-top
  return differential_privacy.compute_stdv(noise_multiplier, clip_norm, num_sampled_clients)


def run_dp_fixed_clipping(initial: Sequence[np.ndarray],
                          uploads_per_round: Sequence[Sequence[Sequence[np.ndarray]]],
                          num_examples_per_round: Sequence[Sequence[int]], *,
                          noise_multiplier: float, clip_norm: float,
                          num_sampled_clients: int, seed: int = 0) -> list[list[np.ndarray]]:
  """Runs DifferentialPrivacyServerSideFixedClipping(FedAvg) on fixed uploads.

  Every round calls the wrapper's configure_fit (which records the model the clients'
  updates are taken against) and then aggregate_fit with that round's uploads.

  Args:
    initial: the initial server arrays.
    uploads_per_round: for each round, the arrays of each client that came (its model after
      local training); a round may have fewer clients than num_sampled_clients.
    num_examples_per_round: for each round, each upload's example count (FedAvg's weights).
    noise_multiplier, clip_norm, num_sampled_clients: the wrapper's sigma, C and m.
    seed: numpy's global seed, which Flower's noise draws from (np.random.normal).

  Returns:
    The server arrays after each round.
  """
  flwr = _flwr()
  strategy = flwr.server.strategy
  inner = strategy.FedAvg(initial_parameters=flwr.common.ndarrays_to_parameters(
      [np.asarray(x) for x in initial]), fraction_fit=1.0, fraction_evaluate=0.0,
                          min_fit_clients=1, min_available_clients=1)
  dp = strategy.DifferentialPrivacyServerSideFixedClipping(
      inner, noise_multiplier=noise_multiplier, clipping_norm=clip_norm,
      num_sampled_clients=num_sampled_clients)
  np.random.seed(seed)
  params = dp.initialize_parameters(_NoClients(num_sampled_clients))
  history = []
  for r, (uploads, counts) in enumerate(zip(uploads_per_round, num_examples_per_round,
                                            strict=True), start=1):
    dp.configure_fit(r, params, _NoClients(num_sampled_clients))
    params, _ = dp.aggregate_fit(r, _fit_results(uploads, counts), [])
    history.append(flwr.common.parameters_to_ndarrays(params))
  return history
