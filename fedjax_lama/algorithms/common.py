"""What every algorithm module shares: typed options, the local optimizer, checks.

A module registers its algorithms as `Spec(name, Hparams, build)`: `Hparams` is a
frozen dataclass of its hyper-parameters (the keys of config.<name>) that validates
itself; `build(hp, common) -> Algorithm` closes over them. What the run takes from an
algorithm beside its record (a default uplink compressor, FedSGD's one step per round, a
variant's name) is on its `Spec`. No module reads a ConfigDict: fedjax_lama.registry does.
"""
import dataclasses
import math
from typing import Any, Callable, Optional, Union

import jax
import jax.numpy as jnp
import optax

from fedjax_lama.engine.algorithm import Algorithm, Correction, LocalOptimizer, local_sgd
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

  def __post_init__(self):
    require(isinstance(self.local_momentum, (int, float)) and 0.0 <= self.local_momentum < 1.0,
            "local_momentum", self.local_momentum, "a momentum in [0, 1)")
    require_nonnegative("weight_decay", self.weight_decay)
    require(self.server_lr is None or (
        isinstance(self.server_lr, (int, float)) and not isinstance(self.server_lr, bool)
        and math.isfinite(self.server_lr) and self.server_lr > 0), "server_lr", self.server_lr,
            "None (the algorithm's default) or a finite number > 0")


def server_rate(common: Common, default: float = 1.0) -> float:
  """config.server_lr, or the algorithm's `default` when it is None."""
  return default if common.server_lr is None else float(common.server_lr)


# Local work presets (Spec.one_step): one local step per round, over a batch of
# config.batch_size ("minibatch") or over the client's whole data ("full_batch").
ONE_STEP_KINDS = ("minibatch", "full_batch")


@dataclasses.dataclass(frozen=True)
class Spec:
  """One registered algorithm: its config name, hyper-parameters and builder, and what the
  run takes from it beside the record.

  uplink: hp -> the uplink compressor the run uses unless config.compressor names one
    (FedPAQ's QSGD); None: the identity.
  one_step: hp -> None (the run's local steps or epochs) or a ONE_STEP_KINDS preset
    (FedSGD's one step per round), carried into the run options.
  variant: hp -> the name the run is reported under when it is not `name` (FedAdam in
    Flower's convention is "fedadam_flower"); None: `name`.
  layerwise: whether a layer-wise schedule (FedLAMA) may run it: True, or a string saying
    why not (its rules are not meaningful per layer), or hp -> one of those (SCAFFOLD's
    option I). A schedule also needs every upload, row and server-state entry shaped like
    the model, which the schedule checks on the built record.
  carry: whether the local optimizer's state may be carried across rounds
    (config.local_optimizer_state="carry", under a layer-wise schedule): True, or a string
    saying why not (FedRep's counts the head's steps from the start of each window).
  """
  name: str
  hparams: type
  build: Callable[[Any, Common], Algorithm]
  summary: str = ""
  uplink: Optional[Callable[[Any], Any]] = None
  one_step: Optional[Callable[[Any], Optional[str]]] = None
  variant: Optional[Callable[[Any], str]] = None
  layerwise: Union[bool, str, Callable[[Any], Union[bool, str]]] = True
  carry: Union[bool, str] = True

  def make(self, hp: Any, common: Common) -> Algorithm:
    """build(hp, common): the algorithm's record."""
    return self.build(hp, common)

  def run_name(self, hp: Any) -> str:
    """The name the run is reported under (`variant`, else the registry name)."""
    return self.name if self.variant is None else self.variant(hp)

  def layerwise_for(self, hp: Any) -> Union[bool, str]:
    """True when a layer-wise schedule may run the algorithm with `hp`, else why not."""
    return self.layerwise(hp) if callable(self.layerwise) else self.layerwise

  def one_step_kind(self, hp: Any) -> Optional[str]:
    kind = None if self.one_step is None else self.one_step(hp)
    if kind is not None and kind not in ONE_STEP_KINDS:
      raise ValueError(f"Spec({self.name!r}).one_step gave {kind!r}; accepted: None, "
                       f"{', '.join(map(repr, ONE_STEP_KINDS))}")
    return kind


@dataclasses.dataclass(frozen=True)
class NoHparams:
  """Algorithms without keys of their own."""


def local_optimizer(common: Common, pull: float = 0.0,
                    correction: Optional[Correction] = None) -> LocalOptimizer:
  """Local SGD from the shared options (config.local_momentum, nesterov, weight_decay) with
  the algorithm's gradient `correction` at the head of its chain: the optax transform and its
  linear rule, built together (engine.algorithm.local_sgd)."""
  return local_sgd(common.local_momentum, common.nesterov, common.weight_decay, pull=pull,
                   correction=correction)


def server_sgd(common: Common) -> optax.GradientTransformation:
  """optax.sgd(server_lr) on G = -mean(delta): with lr 1 exactly FedAvg's x + mean(delta)."""
  return optax.sgd(server_rate(common))


def safe_positive(x: jax.Array) -> jax.Array:
  """x where x > 0, else 1: divisors of clients that ran no step (their update is 0)."""
  return jnp.where(x > 0, x, 1.0)
