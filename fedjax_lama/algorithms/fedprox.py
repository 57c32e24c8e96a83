"""FedProx.

T. Li, A. K. Sahu, M. Zaheer, M. Sanjabi, A. Talwalkar, V. Smith, "Federated
Optimization in Heterogeneous Networks", MLSys 2020 (arXiv 1812.06127).

FedAvg whose local objective adds mu/2 ||y - x||^2: each step's gradient gains
mu (y - x), with x the downloaded model, fixed for the round (under FedLAMA, each
layer's last synchronised value). mu = 0 adds no term: FedAvg bit for bit.
"""
import dataclasses

import jax

from fedjax_lama.algorithms.common import (Common, Spec, local_optimizer, require_nonnegative,
                                           server_sgd)
from fedjax_lama.engine.algorithm import Algorithm, server_opt


@dataclasses.dataclass(frozen=True)
class Hparams:
  mu: float = 0.01

  def __post_init__(self):
    require_nonnegative("mu", self.mu)


def proximal(mu: float):
  """The correction g + mu (y - anchor), anchor = the downloaded model (the head of the
  local optimizer's chain)."""

  def correct(grads, params, ctx):
    return jax.tree.map(lambda g, p, a: g + mu * (p - a), grads, params, ctx.shared["params"])

  return correct


def build(hp: Hparams, common: Common) -> Algorithm:
  return Algorithm(local=local_optimizer(common, correction=proximal(hp.mu) if hp.mu else None),
                   server=server_opt(server_sgd(common)))


SPECS = (Spec("fedprox", Hparams, build, "FedAvg + proximal pull mu/2 ||y - x||^2"),)
