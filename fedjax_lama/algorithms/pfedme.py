"""pFedMe: personalized federated learning with Moreau envelopes.

C. T. Dinh, N. H. Tran, T. D. Nguyen, "Personalized Federated Learning with Moreau
Envelopes", NeurIPS 2020 (arXiv 2006.08848), Algorithm 1.

Client i minimises the Moreau envelope F_i(w) = min_theta f_i(theta) + lam/2 ||theta - w||^2
(the paper's bi-level problem); its personalized model is the minimiser theta_i(w). In a round the
client starts its local model w_i at the downloaded w^t, and at each local step, on one
minibatch D:
  theta <- theta - personal_lr (grad f_i(theta; D) + lam (theta - w_i)),  inner_steps times
          (the approximate solution theta~_i(w_i) of the inner problem),
  w_i   <- w_i - lr lam (w_i - theta)     (a step along grad F_i(w_i) = lam (w_i - theta~)).
theta starts the round at w^t and carries over the round's steps (warm-started, as the
authors' code does). The server sets w <- (1 - beta) w + beta mean_S w_i, i.e.
w + beta mean_S (w_i - w): beta is config.server_lr (default 1, FedAvg's average; the paper
also runs beta = 2). The model pFedMe serves client i is its last theta~_i, kept in its row
(`Personalization.serve`); a client that never took part is served the global model.

Options: lam (the paper's lambda, 15 in its MNIST runs), personal_lr (the inner step size,
constant: the local schedule applies to lr only), inner_steps (the paper's K). The loss the
run logs is f_i at theta at the start of each local step. The authors' code also adds an L2
term mu theta to the inner gradient (mu = 0 by default there): config.weight_decay applies
to w_i's steps instead. The personal model shares the global model's BatchNorm statistics.
Each local step takes inner_steps gradients; traffic is FedAvg's.
"""
import dataclasses
import math

import jax
import jax.numpy as jnp

from fedjax_lama.algorithms import personal
from fedjax_lama.algorithms.common import (Common, Spec, local_optimizer, require,
                                           server_sgd)
from fedjax_lama.engine.algorithm import Algorithm, Personalization, server_opt, upload_delta


def _positive(value) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and value > 0)


@dataclasses.dataclass(frozen=True)
class Hparams:
  lam: float = 15.0          # lambda of the Moreau envelope
  personal_lr: float = 0.01  # the inner step size on theta
  inner_steps: int = 5       # K: inner gradient steps on theta per local step

  def __post_init__(self):
    require(_positive(self.lam), "lam", self.lam, "a finite number > 0")
    require(_positive(self.personal_lr), "personal_lr", self.personal_lr,
            "a finite number > 0")
    require(isinstance(self.inner_steps, int) and not isinstance(self.inner_steps, bool)
            and self.inner_steps >= 1, "inner_steps", self.inner_steps, "an integer >= 1")


def inner_step(theta, grad_theta, w, lam: float, lr: float):
  """theta - lr (grad f(theta) + lam (theta - w))."""
  return jax.tree.map(lambda t, g, a: (t - lr * (g + lam * (t - a))).astype(t.dtype),
                      theta, grad_theta, w)


def build(hp: Hparams, common: Common) -> Algorithm:
  # theta starts every round at the downloaded model; the row only keeps the last one.
  local = personal.holding_optimizer(local_optimizer(common),
                                     lambda ctx: jax.tree.map(jnp.asarray, ctx.shared["params"]))

  def grad(value_and_grad, params, ctx, opt_state):
    del ctx
    theta = personal.held(opt_state)
    (loss, aux), grad_theta = value_and_grad(theta)
    theta = inner_step(theta, grad_theta, params, hp.lam, hp.personal_lr)

    def more(_, th):
      return inner_step(th, value_and_grad(th)[1], params, hp.lam, hp.personal_lr)

    theta = jax.lax.fori_loop(1, hp.inner_steps, more, theta)
    # grad F_i(w_i) = lam (w_i - theta~(w_i)); the engine steps w_i by -lr times it.
    grads = jax.tree.map(lambda w, t: lam_times(w - t), params, theta)
    return (loss, aux), grads, personal.with_held(opt_state, theta)

  def lam_times(x):
    return (hp.lam * x).astype(x.dtype)

  def finish(final, ctx, info):
    uploads, _ = upload_delta(final, ctx, info)
    return uploads, {"theta": personal.held(final.opt_state),
                     "seen": personal.marked_seen(ctx.row)}

  def serve(server, row, loss_at):
    del loss_at
    return personal.own_if_seen(row, row["theta"], server.params), server.model_state

  def row_init(params):
    return {"theta": jax.tree.map(jnp.asarray, params), "seen": personal.unseen()}

  return Algorithm(local=local, server=server_opt(server_sgd(common)), grad=grad,
                   row_init=row_init, finish=finish, personal=Personalization(serve))


SPECS = (Spec("pfedme", Hparams, build,
              "Moreau-envelope personalization: theta_i solved in inner steps, w_i stepped "
              "toward it, server beta-mixing (config.server_lr)",
              layerwise="each client's row holds a whole personal model, and theta is "
              "solved for the whole model at once"),)
