"""FedNova (algorithms.md 5.4).

J. Wang, Q. Liu, H. Liang, G. Joshi, H. V. Poor, "Tackling the Objective
Inconsistency Problem in Heterogeneous Federated Optimization", NeurIPS 2020.

A client that ran tau_i steps of a linear local optimizer moved by
delta_i = -lr sum_k a_ik g_ik. FedAvg thereby weights clients by ||a_i||_1 (more
steps, more weight); FedNova uploads delta_i and the scalar ||a_i||_1 and the
server steps with tau_eff * sum_i p_i delta_i / ||a_i||_1, tau_eff = sum_i p_i ||a_i||_1.

||a_i||_1 = -e_tau / lr for the local optimizer run on a scalar from e_0 = 0 with every
gradient replaced by 1, keeping the terms that depend on the iterate (5.4, "general
rule"): m_k = rho m_{k-1} + 1 + mu e_k, e_{k+1} = e_k - lr m_k. Plain SGD gives tau,
heavy-ball rho gives [tau - rho (1 - rho^tau) / (1 - rho)] / (1 - rho), the proximal
pull gives (1 - (1 - lr mu)^tau) / (lr mu). Weight decay is treated as part of the
gradient. With equal step counts and plain SGD, FedNova is FedAvg (up to rounding).
"""
import dataclasses

import jax
import jax.numpy as jnp

from fedjax_lama.algorithms.common import (Common, Spec, fedavg_like, require, require_nonnegative,
                                           safe_positive, tree_map)
from fedjax_lama.algorithms.fedprox import proximal
from fedjax_lama.engine.algorithm import Algorithm, Reduction, ServerState, apply_server_tx, displacement


@dataclasses.dataclass(frozen=True)
class Hparams:
  mu: float = 0.0  # proximal local objective (FedProx clients), 0: none

  def __post_init__(self):
    require_nonnegative("mu", self.mu)


def accumulated_weight(steps: jax.Array, lr: jax.Array, momentum: float, mu: float) -> jax.Array:
  """||a||_1 of `steps` local steps at a constant rate `lr` (the general rule above)."""
  if not momentum and not mu:
    return steps

  def body(_, carry):
    e, m = carry
    m = momentum * m + 1.0 + mu * e
    return e - lr * m, m

  zero = jnp.zeros((), jnp.result_type(float))
  e, _ = jax.lax.fori_loop(0, steps.astype(jnp.int32), body, (zero, zero))
  return -e / lr


def build(hp: Hparams, common: Common) -> Algorithm:
  require(not common.nesterov, "nesterov", common.nesterov,
          "False with fednova (its ||a_i||_1 is for heavy-ball momentum)")
  momentum = common.local_momentum

  def finish(final, ctx, info):
    a = accumulated_weight(info.steps, info.lr, momentum, hp.mu)
    return {"delta": displacement(final, ctx), "a": a}, ctx.row

  def normalized(uploads, info):
    del info
    return tree_map(lambda d: d / safe_positive(uploads["a"]), uploads["delta"])

  def server_update(server: ServerState, agg) -> ServerState:
    step = tree_map(lambda d: agg["tau_eff"] * d, agg["delta"])
    return apply_server_tx(server_tx, server, step)

  server_tx = fedavg_like("fednova", common).server_tx
  return fedavg_like(
      "fednova", common, correct=proximal(hp.mu) if hp.mu else None, finish=finish,
      reductions={"delta": Reduction(normalized),
                  "tau_eff": Reduction(lambda uploads, info: uploads["a"])},
      server_tx=server_tx, server_update=server_update,
      layerwise="FedNova normalises a whole-model update by one scalar per client")


SPECS = (Spec("fednova", Hparams, build, "normalised averaging by ||a_i||_1 (d + 1 scalar up)"),)
