"""FedExP: FedAvg with a server step size set by extrapolation.

D. Jhunjhunwala, S. Wang, G. Joshi, "FedExP: Speeding Up Federated Averaging via
Extrapolation", ICLR 2023 (Algorithm 1).

Clients run FedAvg's local SGD and upload their displacement and its squared norm. In the
paper's sign convention a client's update is Delta_i = x - y_i (the model minus the local
model, a pseudo-gradient) and the server steps x <- x - eta_g mean Delta. This module
uploads delta_i = y_i - x = -Delta_i, the project's convention (engine/algorithm.py), so the
same step reads x <- x + eta_g mean delta. With M the round's participants,
  mean delta = (1/M) sum_i delta_i                       (uniform, whatever config.weighting)
  eta_g = max(1, sum_i ||delta_i||^2 / (2 M (||mean delta||^2 + eps)))
The squared norms are computed by each client (one scalar upload, summed by the server);
eps (the paper uses 1e-3) keeps the ratio finite when the mean is 0. eta_g = 1 is FedAvg's
step with uniform weights; FedExP takes a larger step when the clients' updates disagree
(sum ||delta_i||^2 large against ||mean delta||^2). eta_g is logged per round
("fedexp_eta_g" in metrics.jsonl). The paper reports the average of the last two iterates,
(x_t + x_{t-1}) / 2, because the extrapolated iterates oscillate;
`eval_average_last_two=True` evaluates that average (the server keeps x_{t-1}), off by
default. FedExP sets its own server step: config.server_lr must be left at None.
"""
import dataclasses

import jax
import jax.numpy as jnp
import optax

from fedjax_lama.algorithms.common import (Common, Spec, local_optimizer, require,
                                           require_one_of)
from fedjax_lama.engine.algorithm import (SUM, Algorithm, ServerRule, ServerState, displacement,
                                          server_opt, upload)


@dataclasses.dataclass(frozen=True)
class Hparams:
  eps: float = 1e-3                     # the paper's epsilon in eta_g's denominator
  eval_average_last_two: bool = False   # evaluate (x_t + x_{t-1}) / 2, the paper's reported iterate

  def __post_init__(self):
    require(isinstance(self.eps, (int, float)) and not isinstance(self.eps, bool)
            and self.eps > 0, "eps", self.eps, "a number > 0")
    require_one_of("eval_average_last_two", self.eval_average_last_two, (True, False))


def squared_norm(tree) -> jax.Array:
  """sum of squares over every leaf, accumulated in at least float32."""
  return sum(jnp.sum(jnp.square(x.astype(jnp.promote_types(x.dtype, jnp.float32))))
             for x in jax.tree.leaves(tree))


def finish(final, ctx, info):
  """Upload delta_i = y_i - x and its squared norm ||delta_i||^2 (one scalar)."""
  del info
  delta = displacement(final, ctx)
  return {"delta": delta, "sq_norm": squared_norm(delta)}, ctx.row


# Both aggregates are sums over the round's participants: the mean is uniform, 1/M.
AGGREGATE = {"delta": upload("delta", SUM), "sq_norm": upload("sq_norm", SUM)}


def server_step_size(sum_sq_norms, mean_delta, participants, eps):
  """eta_g = max(1, sum_i ||delta_i||^2 / (2 M (||mean delta||^2 + eps)))."""
  ratio = sum_sq_norms / (2.0 * participants * (squared_norm(mean_delta) + eps))
  return jnp.maximum(1.0, ratio)


def build(hp: Hparams, common: Common) -> Algorithm:
  require(common.server_lr is None, "server_lr", common.server_lr,
          "None (FedExP sets its own server step eta_g)")

  def server_init(params, model_state):
    extra = {"eta_g": jnp.ones((), jnp.float32)}
    if hp.eval_average_last_two:
      extra["previous"] = params  # x_{t-1}; x_{-1} = x_0
    # FedAvg's server state (the server optimizer's part stays unused) with FedExP's own.
    return server_opt().init(params, model_state)._replace(extra=extra)

  def server_update(server: ServerState, agg) -> ServerState:
    participants = jnp.maximum(agg.participants, 1.0)
    mean_delta = jax.tree.map(lambda s: s / participants, agg["delta"])
    eta_g = server_step_size(agg["sq_norm"], mean_delta, participants, hp.eps)
    params = jax.tree.map(lambda x, d: x + (eta_g * d).astype(x.dtype), server.params,
                          mean_delta)
    extra = {"eta_g": eta_g.astype(jnp.float32)}
    if hp.eval_average_last_two:
      extra["previous"] = server.params
    return server._replace(params=params, extra=extra)

  def report(server: ServerState):
    scalars = {"fedexp_eta_g": server.extra["eta_g"]}
    if hp.eval_average_last_two:  # the paper's reported iterate (x_t + x_{t-1}) / 2
      return optax.tree.scale(0.5, optax.tree.add(server.params,
                                                  server.extra["previous"])), scalars
    return server.params, scalars

  return Algorithm(local=local_optimizer(common), finish=finish, aggregate=AGGREGATE,
                   server=ServerRule(server_init, server_update, report=report))


SPECS = (Spec("fedexp", Hparams, build,
              "FedAvg with an extrapolated server step eta_g (d + 1 scalar up)",
              layerwise="eta_g is one step size computed from whole-model norms, not per layer"),)
