"""Algorithms by the lower-case name their paper uses (config.algorithm).

Each module cites its paper and registers `Spec(name, Hparams, build)`s in its SPECS; they
are collected here. fedjax_lama.registry maps a config to them; `build` builds one by name
from keyword hyper-parameters (outside the CLI). The interface they implement is
fedjax_lama.engine.algorithm.Algorithm.
"""
import dataclasses
import math
from typing import Optional

from fedjax_lama.algorithms import (fedadmm, fedavg, fedcm, feddyn, fedlamb, fednova, fedpaq,
                                    fedprox, fedsgd, fedspeed, scaffold, server_opt)
from fedjax_lama.algorithms import fedexp, fedgamma, fedsam, fedsmoo, mofedsam
from fedjax_lama.algorithms import apfl, ditto, hypcluster, perfedavg, pfedme
from fedjax_lama.algorithms import fedbabu, layer_partition
from fedjax_lama.algorithms.common import Common
from fedjax_lama.algorithms.common import local_optimizer
from fedjax_lama.algorithms.common import Spec
from fedjax_lama.engine.algorithm import Algorithm

_MODULES = (fedavg, fedprox, scaffold, fednova, server_opt, feddyn, fedcm, fedadmm, fedsgd,
            fedpaq, fedspeed, fedlamb, fedsam, mofedsam, fedsmoo, fedgamma, fedexp, ditto, apfl,
            pfedme, perfedavg, layer_partition, fedbabu, hypcluster)
SPECS = {spec.name: spec for module in _MODULES for spec in module.SPECS}


def names() -> list[str]:
  return sorted(SPECS)


def build(name: str, common: Optional[Common] = None, **hparams) -> Algorithm:
  """An algorithm by name with keyword hyper-parameters, for use outside the CLI:
  `build("scaffold", Common(local_momentum=0.9), option="II")`."""
  spec, hp = _spec_and_hparams(name, hparams)
  common = common or Common()
  if not isinstance(common, Common):
    raise ValueError(f"common must be a fedjax_lama.algorithms.Common, got {type(common).__name__}")
  _check_common(common)
  return spec.make(hp, common)


def layerwise(name: str, **hparams):
  """True when a layer-wise schedule (FedLAMA) may run `name` with these hyper-parameters,
  else the reason it may not (Spec.layerwise): `layerwise("fednova")` is a sentence."""
  spec, hp = _spec_and_hparams(name, hparams)
  return spec.layerwise_for(hp)


def run_name(name: str, **hparams) -> str:
  """The name a run of `name` with these hyper-parameters is reported under (Spec.run_name):
  `run_name("fedadam", convention="flower") == "fedadam_flower"`."""
  spec, hp = _spec_and_hparams(name, hparams)
  return spec.run_name(hp)


def _spec_and_hparams(name: str, hparams: dict):
  if name == "fedlama":
    raise ValueError("name='fedlama' is an aggregation schedule over a layer-wise algorithm, "
                     "not an algorithm: build its base here (e.g. 'fedavg') and run it with "
                     "config.schedule='fedlama' (fedjax_lama.fedlama)")
  if name not in SPECS:
    raise ValueError(f"name={name!r} is not an algorithm; accepted: {', '.join(sorted(SPECS))}")
  spec = SPECS[name]
  fields = {f.name for f in dataclasses.fields(spec.hparams)}
  unknown = sorted(set(hparams) - fields)
  if unknown:
    raise ValueError(f"{unknown[0]}={hparams[unknown[0]]!r} is not a hyper-parameter of "
                     f"{name!r}; accepted: {', '.join(sorted(fields)) or 'none'}")
  return spec, spec.hparams(**hparams)


def _check_common(common: Common) -> None:
  """The shared options' ranges (the registry checks the config fields they come from)."""
  def finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
  if common.server_lr is not None and not (finite(common.server_lr) and common.server_lr > 0):
    raise ValueError(f"common.server_lr={common.server_lr!r} is not accepted; accepted: None "
                     "(the algorithm's own rate) or a finite number > 0")
  if not (finite(common.local_momentum) and 0 <= common.local_momentum < 1):
    raise ValueError(f"common.local_momentum={common.local_momentum!r} is not accepted; "
                     "accepted: a momentum in [0, 1)")
  if not (finite(common.weight_decay) and common.weight_decay >= 0):
    raise ValueError(f"common.weight_decay={common.weight_decay!r} is not accepted; accepted: "
                     "a number >= 0")
