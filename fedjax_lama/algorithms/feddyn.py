"""FedDyn.

D. A. E. Acar, Y. Zhao, R. Matas, M. Mattina, P. Whatmough, V. Saligrama, "Federated
Learning Based on Dynamic Regularization", ICLR 2021.

Client i keeps lambda_i (the paper's stored gradient of L_i, 0 at start) and
minimises f_i(y) - <lambda_i, y> + alpha/2 ||y - x||^2: steps along
g - lambda_i + alpha (y - x); then lambda_i <- lambda_i - alpha (y_K - x). It uploads
delta = y_K - x (d floats; lambda_i never leaves the client). The server keeps
h = mean_j lambda_j over all N clients: h <- h - (1/N) sum_i alpha_i delta_i, and
broadcasts the corrected model x <- x + mean(delta) - h / alpha. State is stored
unscaled, so alpha = 0 leaves lambda and h at 0 and skips h / alpha: FedAvg exactly.
`alpha_scaling="data"` uses alpha_i = alpha * mean_n / n_i per client (the official
code's alpha_coef_adpt).
"""
import dataclasses

import jax
import jax.numpy as jnp
import optax

from fedjax_lama.algorithms.common import (Common, Spec, local_optimizer, require_nonnegative,
                                           require_one_of, server_sgd)
from fedjax_lama.engine.algorithm import (SUM, Algorithm, Reduction, ServerRule, ServerState,
                                          displacement, server_opt, upload)


@dataclasses.dataclass(frozen=True)
class Hparams:
  alpha: float = 0.1
  alpha_scaling: str = "none"

  def __post_init__(self):
    require_nonnegative("alpha", self.alpha)
    require_one_of("alpha_scaling", self.alpha_scaling, ("none", "data"))


def build(hp: Hparams, common: Common) -> Algorithm:
  server = server_opt(server_sgd(common))
  if not hp.alpha:
    return Algorithm(local=local_optimizer(common), server=server)

  def client_alpha(num_examples):
    if hp.alpha_scaling == "data":
      return hp.alpha * common.mean_client_examples / jnp.maximum(num_examples, 1.0)
    return hp.alpha

  def correct(grads, params, ctx):
    a = client_alpha(ctx.num_examples)
    return jax.tree.map(lambda g, lam, p, x: g - lam + a * (p - x), grads, ctx.row, params,
                        ctx.shared["params"])

  def finish(final, ctx, info):
    del info
    delta = displacement(final, ctx)
    a = client_alpha(ctx.num_examples)
    return {"delta": delta}, jax.tree.map(lambda lam, d: lam - a * d, ctx.row, delta)

  def scaled_delta(uploads, info):  # the server knows n_i, hence alpha_i
    a = client_alpha(info.num_examples)
    return jax.tree.map(lambda d: a * d, uploads["delta"])

  def server_init(params, model_state):
    return server.init(params, model_state)._replace(extra={"h": optax.tree.zeros_like(params)})

  def server_update(state: ServerState, agg) -> ServerState:
    h = jax.tree.map(lambda h, s: h - s / agg.population, state.extra["h"], agg["alpha_delta"])
    state = server.update(state, agg)  # x <- x + server_lr mean(delta)
    params = jax.tree.map(lambda x, hh: x - hh / hp.alpha, state.params, h)
    return state._replace(params=params, extra={"h": h})

  return Algorithm(
      local=local_optimizer(common, correction=correct),
      row_init=optax.tree.zeros_like, finish=finish,
      aggregate={"delta": upload("delta"), "alpha_delta": Reduction(scaled_delta, SUM)},
      server=ServerRule(server_init, server_update))


SPECS = (Spec("feddyn", Hparams, build, "dynamic regularization, server h (d each way)"),)
