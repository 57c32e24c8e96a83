"""SCAFFOLD.

S. P. Karimireddy, S. Kale, M. Mohri, S. Reddi, S. Stich, A. T. Suresh, "SCAFFOLD:
Stochastic Controlled Averaging for Federated Learning", ICML 2020.

State: the server's control variate c and one row c_i per client, all 0 at start.
Client i receives x and c and steps along g - c_i + c. Its new control variate is
  option II (default): c_i+ = c_i - c + (x - y_K) / (its effective step)
  option I:            c_i+ = the minibatch gradient at x (its first step's gradient)
(Eq. 4, Algorithm 1). The paper's option II divides by K lr, its plain-SGD
steps; here the divisor is the client's effective step under its local optimizer
(ClientInfo.effective_step: K_i lr for plain SGD, about K_i lr / (1 - beta) under heavy-ball
momentum beta, FedNova's ||a_i||_1 of Wang et al. 2020), so that (x - y_K) / step is the
mean corrected gradient and c_i+ estimates the client's mean gradient with momentum too.
It uploads delta = y_K - x and dc = c_i+ - c_i. The server steps with mean(delta)
and sets c <- c + (1/N) sum_i dc_i over ALL N clients, which keeps c = mean_j c_j.
Traffic: 2d each way. control_variates=False keeps c = c_i = 0: FedAvg exactly.
"""
import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_lama.algorithms.common import (Common, Spec, local_optimizer, require_one_of,
                                           safe_positive, server_sgd)
from fedjax_lama.engine.algorithm import (SUM, Algorithm, ServerRule, ServerState, corrected,
                                          displacement, leafwise, server_opt, upload)


@dataclasses.dataclass(frozen=True)
class Hparams:
  option: str = "II"
  control_variates: bool = True

  def __post_init__(self):
    require_one_of("option", self.option, ("I", "II"))
    require_one_of("control_variates", self.control_variates, (True, False))


class FirstGradState(NamedTuple):
  first: object      # the first corrected gradient this transform saw
  seen: jnp.ndarray  # bool


def record_first_gradient() -> optax.GradientTransformation:
  """Passes updates through and keeps the first one (option I's gradient at x)."""

  def init(params):
    return FirstGradState(optax.tree.zeros_like(params), jnp.zeros((), bool))

  def update(updates, state, params=None):
    del params
    first = jax.tree.map(lambda f, u: jnp.where(state.seen, f, u), state.first, updates)
    return updates, FirstGradState(first, jnp.ones((), bool))

  return optax.GradientTransformation(init, update)


def control_variates(grads, params, ctx):
  """The correction g - c_i + c, with c_i the client's row and c the downloaded variate."""
  del params
  return jax.tree.map(lambda g, ci, c: g - ci + c, grads, ctx.row, ctx.shared["c"])


def build(hp: Hparams, common: Common) -> Algorithm:
  server = server_opt(server_sgd(common))
  if not hp.control_variates:
    return Algorithm(local=local_optimizer(common), server=server)
  if hp.option == "II":
    local = local_optimizer(common, correction=control_variates)
  else:
    # Option I records the first corrected gradient g(x) - c_i + c before any decay or
    # momentum; the pass-through leaves the linear rule unchanged.
    sgd = local_optimizer(common)
    local = dataclasses.replace(
        sgd, tx=corrected(control_variates, optax.chain(record_first_gradient(), sgd.tx)))

  def finish(final, ctx, info):
    c_i, c = ctx.row, ctx.shared["c"]
    if hp.option == "II":
      step_sizes = leafwise(info.effective_step, c_i)
      c_new = jax.tree.map(lambda ci, cc, x, y, s: ci - cc + (x - y) / safe_positive(s),
                           c_i, c, ctx.shared["params"], final.params, step_sizes)
    else:
      first = final.opt_state[0].first  # g(x) - c_i + c
      c_new = jax.tree.map(lambda g, ci, cc: g + ci - cc, first, c_i, c)
    dc = jax.tree.map(jnp.subtract, c_new, c_i)
    return {"delta": displacement(final, ctx), "dc": dc}, c_new

  def server_init(params, model_state):
    return server.init(params, model_state)._replace(extra={"c": optax.tree.zeros_like(params)})

  def server_update(state: ServerState, agg) -> ServerState:
    state = server.update(state, agg)  # x <- x + server_lr mean(delta)
    c = jax.tree.map(lambda c, s: c + s / agg.population, state.extra["c"], agg["dc"])
    return state._replace(extra={**state.extra, "c": c})

  return Algorithm(
      local=local, row_init=optax.tree.zeros_like, finish=finish,
      aggregate={"delta": upload("delta"), "dc": upload("dc", SUM)},
      server=ServerRule(server_init, server_update, downloads=("params", "c")))


def layerwise(hp: Hparams):
  return True if hp.option == "II" else (
      "option I's c_i is the gradient at the round's start model, which a layer-wise "
      "schedule does not have")


SPECS = (Spec("scaffold", Hparams, build, "control variates c, c_i (2d each way)",
              layerwise=layerwise),)
