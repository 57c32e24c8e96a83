"""APFL: adaptive personalized federated learning, a learned mixture of a local and the
global model.

Y. Deng, M. M. Kamani, M. Mahdavi, "Adaptive Personalized Federated Learning",
arXiv 2003.13461, 2020, Algorithm 1.

Each client i keeps a local model v_i and a mixing weight alpha_i in [0, 1] (its row; v_i =
w^0 and alpha_i = `alpha` at start). Its personalized model is the mixture
  v_bar_i = alpha_i v_i + (1 - alpha_i) w
of v_i and the global model w. In a round the client starts the global model's local copy w
at the downloaded w^t and at each local step, on one minibatch xi, takes (all from the
values at the step's start)
  w     <- w - lr grad f_i(w; xi)                          (FedAvg's step; w goes up),
  v_i   <- v_i - personal_lr grad_v f_i(v_bar_i; xi),      grad_v = alpha_i grad f_i(v_bar_i),
  alpha <- alpha - alpha_lr <v_i - w, grad f_i(v_bar_i; xi)>,  then clipped to [0, 1]
(the paper's Algorithm 1, its gradient in alpha being the derivative of f_i(v_bar) in
alpha). The server averages the uploaded w - w^t (FedAvg). The model APFL serves client i is
alpha_i v_i + (1 - alpha_i) w with w the evaluated global model (`Personalization.serve`); a client
that never took part has no personal model yet and is served w.

Options (FedJAX 0.0.17's `fedjax.algorithms.apfl` takes the second reading of each):
- adapt_alpha: False keeps every alpha_i at `alpha` (alpha = 0 is FedAvg on the global
  model, the personal models then never move).
- personal_gradient: "chain" (default) steps v_i along alpha_i grad f_i(v_bar_i), the
  derivative in v_i of the paper's Algorithm 1; "mixture" along grad f_i(v_bar_i) itself
  (FedJAX).
- alpha_granularity: "model" (default), one alpha_i for the whole model (the paper);
  "leaf", one per parameter array, each stepped along its own array's inner product
  (FedJAX).
- personal_start: "initial" (default), v_i starts at w^0 (the paper initialises every v_i
  before round 0); "first_download", at the global model of the client's first round
  (FedJAX starts an unseen client's v_i at the current server model).
personal_lr and alpha_lr are constant (the run's local schedule does not apply to them;
FedJAX steps all three with its one client optimizer: give them config.local_lr). The
personalized model shares the global model's BatchNorm statistics. One more gradient per
local step; traffic is FedAvg's.
"""
import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_lama.algorithms import personal
from fedjax_lama.algorithms.common import (Common, Spec, local_optimizer, require,
                                           require_one_of, server_sgd)
from fedjax_lama.engine.algorithm import Algorithm, Personalization, server_opt, upload_delta


class PersonalState(NamedTuple):
  v: object       # the local model v_i
  alpha: object   # alpha_i, one scalar per parameter array (all equal for "model")


def _finite(value) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


@dataclasses.dataclass(frozen=True)
class Hparams:
  alpha: float = 0.5                  # alpha_i at start (the mixing weight of v_i)
  adapt_alpha: bool = True            # False: alpha_i stays at `alpha`
  personal_lr: float = 0.1            # step size of v_i (the built-in config's local_lr)
  alpha_lr: float = 0.1               # step size of alpha_i
  personal_gradient: str = "chain"    # "chain" (alpha grad f(v_bar)) | "mixture" (FedJAX)
  alpha_granularity: str = "model"    # "model" (one alpha_i) | "leaf" (FedJAX: one per array)
  personal_start: str = "initial"     # "initial" (w^0) | "first_download" (FedJAX)

  def __post_init__(self):
    require(_finite(self.alpha) and 0.0 <= self.alpha <= 1.0, "alpha", self.alpha,
            "a number in [0, 1]")
    require(isinstance(self.adapt_alpha, bool), "adapt_alpha", self.adapt_alpha,
            "True or False")
    require(_finite(self.personal_lr) and self.personal_lr > 0, "personal_lr",
            self.personal_lr, "a finite number > 0")
    require(_finite(self.alpha_lr) and self.alpha_lr > 0, "alpha_lr", self.alpha_lr,
            "a finite number > 0")
    require_one_of("personal_gradient", self.personal_gradient, ("chain", "mixture"))
    require_one_of("alpha_granularity", self.alpha_granularity, ("model", "leaf"))
    require_one_of("personal_start", self.personal_start, ("initial", "first_download"))


def mixture(alpha, v, w):
  """alpha v + (1 - alpha) w, with one alpha per parameter array."""
  return jax.tree.map(lambda a, p, q: a * p + (1 - a) * q, alpha, v, w)


def alpha_gradient(v, w, grad_mix, granularity: str):
  """d f(v_bar) / d alpha = <v - w, grad f(v_bar)>: per array ("leaf"), or summed over the
  model and given to every array ("model")."""
  per_leaf = jax.tree.map(lambda p, q, g: jnp.sum((p - q) * g).astype(g.dtype), v, w, grad_mix)
  if granularity == "leaf":
    return per_leaf
  total = sum(jax.tree.leaves(per_leaf))
  return jax.tree.map(lambda a: total.astype(a.dtype), per_leaf)


def build(hp: Hparams, common: Common) -> Algorithm:

  def held_init(ctx):
    v = ctx.row["v"]
    if hp.personal_start == "first_download":
      v = personal.own_if_seen(ctx.row, v, ctx.shared["params"])
    return PersonalState(v, ctx.row["alpha"])

  local = personal.holding_optimizer(local_optimizer(common), held_init)

  def grad(value_and_grad, params, ctx, opt_state):
    del ctx
    (loss, aux), grads = value_and_grad(params)  # the global model's step is FedAvg's
    state = personal.held(opt_state)
    _, grad_mix = value_and_grad(mixture(state.alpha, state.v, params))
    if hp.personal_gradient == "chain":
      grad_v = jax.tree.map(lambda a, g: a * g, state.alpha, grad_mix)
    else:
      grad_v = grad_mix
    v = personal.sgd_step(state.v, grad_v, hp.personal_lr)
    alpha = state.alpha
    if hp.adapt_alpha:
      step = alpha_gradient(state.v, params, grad_mix, hp.alpha_granularity)
      alpha = jax.tree.map(lambda a, g: jnp.clip(a - hp.alpha_lr * g, 0.0, 1.0).astype(a.dtype),
                           alpha, step)
    return (loss, aux), grads, personal.with_held(opt_state, PersonalState(v, alpha))

  def finish(final, ctx, info):
    uploads, _ = upload_delta(final, ctx, info)
    state = personal.held(final.opt_state)
    return uploads, {"v": state.v, "alpha": state.alpha, "seen": personal.marked_seen(ctx.row)}

  def serve(server, row, loss_at):
    del loss_at
    mixed = mixture(row["alpha"], row["v"], server.params)
    return personal.own_if_seen(row, mixed, server.params), server.model_state

  def row_init(params):
    return {"v": jax.tree.map(jnp.asarray, params),
            "alpha": jax.tree.map(lambda p: jnp.asarray(hp.alpha, jnp.result_type(p)), params),
            "seen": personal.unseen()}

  return Algorithm(local=local, server=server_opt(server_sgd(common)), grad=grad,
                   row_init=row_init, finish=finish, personal=Personalization(serve))


SPECS = (Spec("apfl", Hparams, build,
              "FedAvg's global model + a local model v_i and a learned mixing weight alpha_i "
              "per client (alpha v + (1 - alpha) w)",
              layerwise="each client's row holds a whole local model and its mixing "
              "weight, trained beside the global model"),)
