"""FedNova.

J. Wang, Q. Liu, H. Liang, G. Joshi, H. V. Poor, "Tackling the Objective
Inconsistency Problem in Heterogeneous Federated Optimization", NeurIPS 2020.

A client that ran tau_i steps of a linear local optimizer moved by
delta_i = -lr sum_k a_ik g_ik. FedAvg thereby weights clients by ||a_i||_1 (more
steps, more weight); FedNova uploads delta_i and the scalar ||a_i||_1 and the
server steps with tau_eff * sum_i p_i delta_i / ||a_i||_1, tau_eff = sum_i p_i ||a_i||_1.

||a_i||_1 is the engine's effective step (ClientInfo.effective_step, one definition
for every algorithm): -e_tau for the local optimizer run on a scalar from e_0 = 0 with
every gradient replaced by 1, keeping the terms that depend on the iterate (the paper's
general rule, Sec. 4): m_k = rho m_{k-1} + 1 + mu e_k, e_{k+1} = e_k - lr_k m_k, each
real step at its own rate. At a constant rate lr, plain SGD gives lr tau, heavy-ball rho
gives lr [tau - rho (1 - rho^tau) / (1 - rho)] / (1 - rho), the proximal pull alone
lr (1 - (1 - lr mu)^tau) / (lr mu). The paper's ||a_i||_1 is this divided by lr; the
server's tau_eff delta_i / ||a_i||_1 is the same with either unit. Weight decay is
treated as part of the gradient. With equal step counts and plain SGD, FedNova is
FedAvg (up to rounding).
"""
import dataclasses

import jax

from fedjax_lama.algorithms.common import (Common, Spec, local_optimizer, require_nonnegative,
                                           safe_positive, server_sgd)
from fedjax_lama.algorithms.fedprox import proximal
from fedjax_lama.engine.algorithm import (Algorithm, Reduction, ServerRule, ServerState,
                                          displacement, server_opt)


@dataclasses.dataclass(frozen=True)
class Hparams:
  mu: float = 0.0  # proximal local objective (FedProx clients), 0: none

  def __post_init__(self):
    require_nonnegative("mu", self.mu)


def build(hp: Hparams, common: Common) -> Algorithm:

  def finish(final, ctx, info):
    return {"delta": displacement(final, ctx), "a": info.effective_step}, ctx.row

  def normalized(uploads, info):
    del info
    return jax.tree.map(lambda d: d / safe_positive(uploads["a"]), uploads["delta"])

  server = server_opt(server_sgd(common))

  def server_update(state: ServerState, agg) -> ServerState:
    step = jax.tree.map(lambda d: agg["tau_eff"] * d, agg["delta"])
    return server.update(state, agg.replaced(delta=step))

  return Algorithm(
      # The proximal pull mu is part of the optimizer's linear rule (the paper's general rule).
      local=local_optimizer(common, pull=hp.mu, correction=proximal(hp.mu) if hp.mu else None),
      finish=finish,
      aggregate={"delta": Reduction(normalized),
                  "tau_eff": Reduction(lambda uploads, info: uploads["a"])},
      server=ServerRule(server.init, server_update))


SPECS = (Spec("fednova", Hparams, build, "normalised averaging by ||a_i||_1 (d + 1 scalar up)",
              layerwise="FedNova normalises a whole-model update by one scalar per client"),)
