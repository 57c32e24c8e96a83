"""Server optimizers: FedAvgM, FedAdam, FedYogi, FedAdagrad.

FedAvgM: T.-M. H. Hsu, H. Qi, M. Brown, "Measuring the Effects of Non-Identical Data
Distribution for Federated Visual Classification", arXiv 1909.06335, 2019.
FedAdam, FedYogi, FedAdagrad: S. J. Reddi, Z. Charles, M. Zaheer, Z. Garrett, K. Rush,
J. Konecny, S. Kumar, H. B. McMahan, "Adaptive Federated Optimization", ICLR 2021.

All four are FedAvg clients with another server optimizer on G = -mean(delta). Reddi
et al.'s updates differ from optax's adam/yogi/adagrad (no bias correction, v starts at
tau^2, tau outside the root; Reddi et al.'s Algorithm 2), so they are written here as optax
transforms on G:
  m = b1 m + (1 - b1) G
  v = v + G^2 (adagrad) | v - (1 - b2) G^2 sign(v - G^2) (yogi) | b2 v + (1 - b2) G^2 (adam)
  u = -server_lr m / (sqrt(v) + tau),  x <- x + u
which is x + server_lr m_delta / (sqrt(v) + tau) with m_delta built from delta = -G.
`variant="optax"` runs optax's own transforms for comparison; those runs are named
"<name>_optax" (the Spec's `variant`) so they are never reported as Reddi et al.'s algorithm.

`convention` picks whose reading of Algorithm 2 runs (variant "reddi" only):
  "paper" (default): Reddi et al.'s, as above: v starts at v_{-1} = tau^2, and the rate
    is server_lr in every round.
  "flower": Flower's FedAdam/FedYogi/FedAdagrad strategies (flwr, `aggregate_fit`): v
    starts at 0, and FedAdam's rate in the t-th server update (t = 1, 2, ...) is
    bias-corrected, server_lr * sqrt(1 - beta2^(t+1)) / (1 - beta1^(t+1)) -- Flower
    passes its 1-based round number r = t and raises beta to r + 1. FedYogi and
    FedAdagrad keep the constant rate. Those runs are named "<name>_flower".
The two readings differ most in the first rounds (FedAdam's first rate is 0.74 server_lr
at beta1 = 0.9, beta2 = 0.99; v = 0 makes the first step about server_lr per coordinate).
"""
import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_lama.algorithms.common import (Common, Spec, local_optimizer, require, require_one_of,
                                           server_rate)
from fedjax_lama.engine.algorithm import Algorithm, server_opt


class ReddiState(NamedTuple):
  m: object  # params-shaped
  v: object  # params-shaped


CONVENTIONS = ("paper", "flower")


def reddi(kind: str, learning_rate: float, beta1: float, beta2: float, tau: float,
          convention: str = "paper") -> optax.GradientTransformation:
  """Reddi et al.'s server update of kind 'adam' | 'yogi' | 'adagrad' on G (Algorithm 2),
  in Reddi et al.'s convention or Flower's (see the module docstring)."""
  if convention == "flower" and kind == "adam":
    # optax's count starts at 0 in the first update: Flower's exponent r + 1 is count + 2.
    def bias_corrected_rate(count):
      t = count + 2
      return learning_rate * jnp.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)

    return optax.chain(moments(kind, beta1, beta2, tau, initial_v=0.0),
                       optax.scale_by_schedule(bias_corrected_rate))
  # Paper, and Flower's FedYogi/FedAdagrad: a constant rate, applied inside the transform
  # (its state stays the ReddiState of earlier checkpoints).
  initial_v = tau * tau if convention == "paper" else 0.0
  return moments(kind, beta1, beta2, tau, initial_v, learning_rate)


def moments(kind: str, beta1: float, beta2: float, tau: float, initial_v: float,
            learning_rate: float = 1.0) -> optax.GradientTransformation:
  """-learning_rate m / (sqrt(v) + tau) on G, the moments of `kind` from m = 0, v = initial_v."""

  def init(params):
    return ReddiState(optax.tree.zeros_like(params),
                      jax.tree.map(lambda p: jnp.full_like(p, initial_v), params))

  def second_moment(v, g2):
    if kind == "adagrad":
      return v + g2
    if kind == "yogi":
      return v - (1 - beta2) * g2 * jnp.sign(v - g2)
    return beta2 * v + (1 - beta2) * g2

  def update(grads, state, params=None):
    del params
    m = jax.tree.map(lambda m, g: beta1 * m + (1 - beta1) * g, state.m, grads)
    v = jax.tree.map(lambda v, g: second_moment(v, g * g), state.v, grads)
    updates = jax.tree.map(lambda m, v: -learning_rate * m / (jnp.sqrt(v) + tau), m, v)
    return updates, ReddiState(m, v)

  return optax.GradientTransformation(init, update)


def optax_server(kind: str, learning_rate: float, beta1: float, beta2: float,
                 tau: float) -> optax.GradientTransformation:
  if kind == "adam":
    return optax.adam(learning_rate, b1=beta1, b2=beta2, eps=tau)
  if kind == "yogi":
    return optax.yogi(learning_rate, b1=beta1, b2=beta2, eps=tau)
  return optax.adagrad(learning_rate, eps=tau)


@dataclasses.dataclass(frozen=True)
class AdaptiveHparams:
  beta1: float = 0.9
  beta2: float = 0.99
  tau: float = 1e-3
  variant: str = "reddi"
  convention: str = "paper"  # whose reading of Algorithm 2: CONVENTIONS, module docstring

  def __post_init__(self):
    for field in ("beta1", "beta2"):
      value = getattr(self, field)
      require(0.0 <= value < 1.0, field, value, "a number in [0, 1)")
    require(self.tau > 0, "tau", self.tau, "a number > 0")
    require_one_of("variant", self.variant, ("reddi", "optax"))
    require_one_of("convention", self.convention, CONVENTIONS)
    require(self.convention == "paper" or self.variant == "reddi", "convention",
            self.convention, "'paper' with variant='optax' (optax's transforms have their own)")


@dataclasses.dataclass(frozen=True)
class AdagradHparams(AdaptiveHparams):
  beta1: float = 0.0  # plain Adagrad (Reddi et al.'s FedAdagrad keeps no first moment)


# Server rates when config.server_lr is None. The 1.0 of the other algorithms leaves these at
# chance: their step is about server_lr per coordinate whatever the size of G. Reddi et al.
# 2021 tune the server rate on a log grid with tau = 1e-3; rates of 1e-2..1e-1 train
# configs/default.py with local momentum 0.9 (tests/test_default_training.py).
DEFAULT_SERVER_LR = {"adam": 0.01, "yogi": 0.01, "adagrad": 0.1}


def adaptive(kind: str):
  """The builder of FedAdam, FedYogi or FedAdagrad: FedAvg's clients, Reddi et al.'s server."""

  def build(hp: AdaptiveHparams, common: Common) -> Algorithm:
    rate = server_rate(common, DEFAULT_SERVER_LR[kind])
    if hp.variant == "optax":
      server_tx = optax_server(kind, rate, hp.beta1, hp.beta2, hp.tau)
    else:
      server_tx = reddi(kind, rate, hp.beta1, hp.beta2, hp.tau, hp.convention)
    return Algorithm(local=local_optimizer(common), server=server_opt(server_tx))

  return build


def variant_name(name: str):
  """hp -> the name a run is reported under: "<name>_optax" for optax's transforms,
  "<name>_flower" in Flower's convention, else `name`."""

  def run_name(hp: AdaptiveHparams) -> str:
    if hp.variant == "optax":
      return f"{name}_optax"
    return name if hp.convention == "paper" else f"{name}_{hp.convention}"

  return run_name


@dataclasses.dataclass(frozen=True)
class MomentumHparams:
  momentum: float = 0.9

  def __post_init__(self):
    require(0.0 <= self.momentum < 1.0, "momentum", self.momentum, "a number in [0, 1)")


def build_fedavgm(hp: MomentumHparams, common: Common) -> Algorithm:
  """v <- b v + G, x <- x - server_lr v: optax.sgd with momentum (b = 0: FedAvg exactly)."""
  return Algorithm(local=local_optimizer(common), server=server_opt(
      optax.sgd(server_rate(common), momentum=hp.momentum or None)))


SPECS = (
    Spec("fedavgm", MomentumHparams, build_fedavgm, "server momentum"),
    Spec("fedadam", AdaptiveHparams, adaptive("adam"), "server Adam (Reddi et al.)",
         variant=variant_name("fedadam")),
    Spec("fedyogi", AdaptiveHparams, adaptive("yogi"), "server Yogi (Reddi et al.)",
         variant=variant_name("fedyogi")),
    Spec("fedadagrad", AdagradHparams, adaptive("adagrad"), "server Adagrad (Reddi et al.)",
         variant=variant_name("fedadagrad")),
)
