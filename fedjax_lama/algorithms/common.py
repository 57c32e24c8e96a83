"""What every algorithm module shares: typed options, the local optimizer, checks.

A module registers its algorithms as `Spec(name, Hparams, build)`: `Hparams` is a
frozen dataclass of its hyper-parameters (the keys of config.<name>, algorithms.md
5.13) that validates itself; `build(hp, common) -> Algorithm` closes over them.
No module reads a ConfigDict: fedjax_lama.registry does.
"""
import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_lama.engine.algorithm import Algorithm
from fedjax_lama.errors import HparamError, require, require_nonnegative, require_one_of  # pylint: disable=unused-import


@dataclasses.dataclass(frozen=True)
class Common:
  """Options every algorithm reads (the shared config fields, algorithms.md 5.13)."""
  local_momentum: float = 0.0
  nesterov: bool = False
  weight_decay: float = 0.0
  server_lr: float = 1.0
  num_clients: int = 1                 # N of the federation (1/N global means)
  mean_client_examples: float = 1.0    # FedDyn's data-scaled alpha


@dataclasses.dataclass(frozen=True)
class Spec:
  """One registered algorithm: its config name, hyper-parameters and builder."""
  name: str
  hparams: type
  build: Callable[[Any, Common], Algorithm]
  summary: str = ""


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


def server_sgd(common: Common) -> optax.GradientTransformation:
  """optax.sgd(server_lr) on G = -mean(delta): with lr 1 exactly FedAvg's x + mean(delta)."""
  return optax.sgd(common.server_lr)


def fedavg_like(name: str, common: Common, **fields) -> Algorithm:
  """FedAvg's local SGD and server step, with some fields replaced."""
  fields.setdefault("local_tx", local_optimizer(common))
  fields.setdefault("server_tx", server_sgd(common))
  return Algorithm(name, **fields)


def tree_map(fn, *trees):
  return jax.tree_util.tree_map(fn, *trees)


def safe_positive(x: jax.Array) -> jax.Array:
  """x where x > 0, else 1: divisors of clients that ran no step (their update is 0)."""
  return jnp.where(x > 0, x, 1.0)
