"""What every algorithm module shares: typed options, the local optimizer, checks.

A module registers its algorithms as `Spec(name, Hparams, build)`: `Hparams` is a
frozen dataclass of its hyper-parameters (the keys of config.<name>) that validates
itself; `build(hp, common) -> Algorithm` closes over them. No module reads a
ConfigDict: fedjax_lama.registry does.
"""
import dataclasses
import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_lama.engine.algorithm import LOCAL_OPTIMIZER_STATES, Algorithm, LocalSGD
from fedjax_lama.errors import HparamError, require, require_nonnegative, require_one_of  # pylint: disable=unused-import


@dataclasses.dataclass(frozen=True)
class Common:
  """Options every algorithm reads (the shared config fields)."""
  local_momentum: float = 0.0
  nesterov: bool = False
  weight_decay: float = 0.0
  # None: the algorithm's own default (`server_rate`), 1.0 for all but the adaptive
  # server optimizers, whose rate Reddi et al. 2021 tune far below 1.
  server_lr: Optional[float] = None
  num_clients: int = 1                 # N of the federation (1/N global means)
  mean_client_examples: float = 1.0    # FedDyn's data-scaled alpha
  local_optimizer_state: str = "reset"  # engine.algorithm.LOCAL_OPTIMIZER_STATES

  def __post_init__(self):
    require(isinstance(self.local_momentum, (int, float)) and 0.0 <= self.local_momentum < 1.0,
            "local_momentum", self.local_momentum, "a momentum in [0, 1)")
    require_nonnegative("weight_decay", self.weight_decay)
    require(self.server_lr is None or (
        isinstance(self.server_lr, (int, float)) and not isinstance(self.server_lr, bool)
        and math.isfinite(self.server_lr) and self.server_lr > 0), "server_lr", self.server_lr,
            "None (the algorithm's default) or a finite number > 0")
    require_one_of("local_optimizer_state", self.local_optimizer_state, LOCAL_OPTIMIZER_STATES)


def server_rate(common: Common, default: float = 1.0) -> float:
  """config.server_lr, or the algorithm's `default` when it is None."""
  return default if common.server_lr is None else float(common.server_lr)


@dataclasses.dataclass(frozen=True)
class Spec:
  """One registered algorithm: its config name, hyper-parameters and builder."""
  name: str
  hparams: type
  build: Callable[[Any, Common], Algorithm]
  summary: str = ""

  def make(self, hp: Any, common: Common) -> Algorithm:
    """build(hp, common) with the options every algorithm shares applied."""
    return dataclasses.replace(self.build(hp, common),
                               local_optimizer_state=common.local_optimizer_state)


@dataclasses.dataclass(frozen=True)
class NoHparams:
  """Algorithms without keys of their own."""


def local_optimizer(common: Common, weight_decay_mask: Optional[Any] = None
                    ) -> optax.GradientTransformation:
  """Local SGD direction (decayed weights + momentum trace); the engine scales by -lr.

  The learning rate is applied outside the transform so that a schedule indexed by
  the global local-step count can be evaluated inside the scan without rebuilding
  the optimiser state.
  """
  parts = []
  if common.weight_decay:
    parts.append(optax.add_decayed_weights(common.weight_decay, mask=weight_decay_mask))
  if common.local_momentum:
    parts.append(optax.trace(decay=common.local_momentum, nesterov=common.nesterov))
  return optax.chain(*parts) if parts else optax.identity()


def local_sgd_rule(common: Common, pull: float = 0.0) -> LocalSGD:
  """`local_optimizer(common)` as the linear rule of the effective step (ClientInfo)."""
  return LocalSGD(float(common.local_momentum), bool(common.nesterov), float(pull))


def server_sgd(common: Common) -> optax.GradientTransformation:
  """optax.sgd(server_lr) on G = -mean(delta): with lr 1 exactly FedAvg's x + mean(delta)."""
  return optax.sgd(server_rate(common))


def fedavg_like(name: str, common: Common, **fields) -> Algorithm:
  """FedAvg's local SGD and server step, with some fields replaced."""
  fields.setdefault("local_tx", local_optimizer(common))
  fields.setdefault("local_sgd", local_sgd_rule(common))
  fields.setdefault("server_tx", server_sgd(common))
  return Algorithm(name, **fields)


def tree_map(fn, *trees):
  return jax.tree.map(fn, *trees)


def safe_positive(x: jax.Array) -> jax.Array:
  """x where x > 0, else 1: divisors of clients that ran no step (their update is 0)."""
  return jnp.where(x > 0, x, 1.0)
