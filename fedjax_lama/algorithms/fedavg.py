"""FedAvg and FedProx.

FedAvg: H. B. McMahan et al., "Communication-Efficient Learning of Deep Networks
from Decentralized Data", AISTATS 2017 (algorithms.md 5.1).
FedProx: T. Li et al., "Federated Optimization in Heterogeneous Networks",
MLSys 2020 (algorithms.md 5.2): FedAvg plus mu/2 ||y - x||^2 in the local loss.
"""
import jax
import optax

from fedjax_lama.algorithms.base import Algorithm
from fedjax_lama.engine.local import make_local_optimizer


def server_optimizer(server_lr: float = 1.0, server_momentum: float = 0.0) -> optax.GradientTransformation:
  """optax.sgd(1.0) on G = -mean(delta) is exactly FedAvg's x + mean(delta)."""
  return optax.sgd(server_lr, momentum=server_momentum or None)


def fedavg(local_momentum: float = 0.0, weight_decay: float = 0.0, server_lr: float = 1.0,
           server_momentum: float = 0.0, nesterov: bool = False, weight_decay_mask=None) -> Algorithm:
  return Algorithm(
      name="fedavg",
      local_tx=make_local_optimizer(local_momentum, nesterov, weight_decay, weight_decay_mask),
      server_tx=server_optimizer(server_lr, server_momentum))


def fedprox(mu: float, **fedavg_kwargs) -> Algorithm:
  """FedAvg whose local gradient gains mu * (y - x_global)."""
  if mu < 0:
    raise ValueError(f"fedprox.mu={mu}; accepted: >= 0")

  def proximal(grads, params, anchor, row):
    del row
    return jax.tree_util.tree_map(lambda g, p, a: g + mu * (p - a), grads, params, anchor)

  base = fedavg(**fedavg_kwargs)
  return Algorithm(name="fedprox", local_tx=base.local_tx, server_tx=base.server_tx,
                   correction=proximal if mu else None)
