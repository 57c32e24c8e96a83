"""Algorithms by the lower-case name their paper uses (config.algorithm).

Each module cites its paper and registers `Spec(name, Hparams, build)`s in its SPECS; they
are collected here. fedjax_lama.registry maps a config to them; `build` builds one by name
from keyword hyper-parameters (outside the CLI). The interface they implement is
fedjax_lama.engine.algorithm.Algorithm.
"""
from typing import Optional

from fedjax_lama.algorithms import (fedadmm, fedavg, fedcm, feddyn, fedlamb, fednova, fedpaq,
                                    fedprox, fedsgd, fedspeed, scaffold, server_opt)
from fedjax_lama.algorithms import fedgamma, fedsam, fedsmoo, mofedsam
from fedjax_lama.algorithms.common import Common
from fedjax_lama.algorithms.common import local_optimizer
from fedjax_lama.algorithms.common import Spec
from fedjax_lama.engine.algorithm import Algorithm

_MODULES = (fedavg, fedprox, scaffold, fednova, server_opt, feddyn, fedcm, fedadmm, fedsgd,
            fedpaq, fedspeed, fedlamb, fedsam, mofedsam, fedsmoo, fedgamma)
SPECS = {spec.name: spec for module in _MODULES for spec in module.SPECS}


def names() -> list[str]:
  return sorted(SPECS)


def build(name: str, common: Optional[Common] = None, **hparams) -> Algorithm:
  """An algorithm by name with keyword hyper-parameters, for use outside the CLI:
  `build("scaffold", Common(local_momentum=0.9), option="II")`."""
  if name not in SPECS:
    raise ValueError(f"algorithm {name!r} is unknown; accepted: {', '.join(sorted(SPECS))}")
  spec = SPECS[name]
  return spec.make(spec.hparams(**hparams), common or Common())
