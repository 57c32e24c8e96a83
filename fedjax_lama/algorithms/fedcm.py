"""FedCM.

J. Xu, S. Wang, L. Wang, A. C.-C. Yao, "FedCM: Federated Learning with Client-level
Momentum", arXiv 2106.10874, 2021.

The server keeps D, the global momentum direction in gradient units (0 at start),
and sends it with the model (2d down). Clients step along alpha g + (1 - alpha) D and
upload delta (d up). The server steps with mean(delta) and sets
D <- -sum_i p_i delta_i / (client i's effective step), the mean direction in gradient
units (the paper divides by eta_l K, the plain-SGD step; the effective step,
ClientInfo.effective_step, is eta_l K_i for plain SGD and FedNova's ||a_i||_1 under local
momentum), normalised by the round that produced it so a learning-rate schedule cannot
mix rounds. alpha = 1 (not 0) with server_lr 1 is FedAvg exactly.
"""
import dataclasses

import jax
import optax

from fedjax_lama.algorithms.common import (Common, Spec, local_optimizer, require, safe_positive,
                                           server_sgd)
from fedjax_lama.engine.algorithm import (Algorithm, Reduction, ServerRule, ServerState,
                                          leafwise, server_opt, upload)


@dataclasses.dataclass(frozen=True)
class Hparams:
  alpha: float = 0.1

  def __post_init__(self):
    require(0.0 <= self.alpha <= 1.0, "alpha", self.alpha, "a number in [0, 1]")


def client_momentum(alpha: float):
  """The correction alpha g + (1 - alpha) D, D the downloaded direction; None at alpha = 1
  (the plain gradient)."""
  if alpha == 1:
    return None

  def correct(grads, params, ctx):
    del params
    return jax.tree.map(lambda g, d: alpha * g + (1 - alpha) * d, grads, ctx.shared["D"])

  return correct


def build(hp: Hparams, common: Common) -> Algorithm:
  server = server_opt(server_sgd(common))

  def direction(uploads, info):  # in gradient units; the server knows each client's steps and lr
    delta = uploads["delta"]
    return jax.tree.map(lambda d, s: -d / safe_positive(s), delta,
                        leafwise(info.effective_step, delta))

  def server_init(params, model_state):
    return server.init(params, model_state)._replace(extra={"D": optax.tree.zeros_like(params)})

  def server_update(state: ServerState, agg) -> ServerState:
    state = server.update(state, agg)  # x <- x + server_lr mean(delta)
    return state._replace(extra={"D": agg["D"]})

  return Algorithm(
      local=local_optimizer(common, correction=client_momentum(hp.alpha)),
      aggregate={"delta": upload("delta"), "D": Reduction(direction)},
      server=ServerRule(server_init, server_update, downloads=("params", "D")))


SPECS = (Spec("fedcm", Hparams, build, "client-level momentum D (2d down)"),)
