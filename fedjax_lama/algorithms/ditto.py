"""Ditto: a personal model per client, pulled toward the global model.

T. Li, S. Hu, A. Beirami, V. Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021 (arXiv 2012.04221), Algorithm 1.

The global model w is trained exactly as FedAvg trains it: K local SGD steps from the
downloaded w^t, the displacement uploaded, the server averaging (server_lr 1). Each
participating client k also keeps a personal model v_k (its row; w^0 at start) and, on the
same batches, takes steps on its personal objective
  h_k(v; w^t) = F_k(v) + lam/2 ||v - w^t||^2                     (its personal objective),
  v_k <- v_k - personal_lr (grad F_k(v_k) + lam (v_k - w^t)),     (Algorithm 1's v-update)
with w^t the global model the client downloaded this round. lam = 0 is local training alone,
lam -> infinity FedAvg's model. v_k is written back to the row at the end of the round and is
the model Ditto serves client k (`Personalization.serve`); clients that take no part keep
their row, and one that never took part is served the global model.

Options:
- lam: the pull toward the global model (the paper tunes it over {0.01, 0.1, 1, 2}).
- personal_lr: the personal model's step size (the paper uses the global model's rate: set it
  to config.local_lr; the local learning-rate schedule does not apply to it).
- personal_steps: the personal model takes a step on each of the round's first personal_steps
  local steps (the paper's s); 0 (default) on every local step.
The personal model shares the global model's BatchNorm statistics (it keeps none of its
own). It takes one more gradient per local step; nothing more travels: traffic is FedAvg's.
"""
import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_lama.algorithms import personal
from fedjax_lama.algorithms.common import (Common, Spec, local_optimizer, require,
                                           require_nonnegative, server_sgd)
from fedjax_lama.engine.algorithm import Algorithm, Personalization, server_opt, upload_delta


class PersonalState(NamedTuple):
  v: object           # the personal model v_k
  steps: jax.Array    # the personal steps taken this round (for personal_steps)


def _positive(value) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and value > 0)


@dataclasses.dataclass(frozen=True)
class Hparams:
  lam: float = 0.1            # lambda of h_k(v; w) = F_k(v) + lam/2 ||v - w||^2
  personal_lr: float = 0.1    # the personal step size (the built-in config's local_lr)
  personal_steps: int = 0     # personal steps per round, the first ones; 0: every local step

  def __post_init__(self):
    require_nonnegative("lam", self.lam)
    require(_positive(self.personal_lr), "personal_lr", self.personal_lr,
            "a finite number > 0")
    require(isinstance(self.personal_steps, int) and not isinstance(self.personal_steps, bool)
            and self.personal_steps >= 0, "personal_steps", self.personal_steps,
            "an integer >= 0 (0: every local step)")


def personal_gradient(grad_v, v, anchor, lam: float):
  """grad h_k(v; anchor) = grad F_k(v) + lam (v - anchor)."""
  if not lam:
    return grad_v
  return jax.tree.map(lambda g, p, a: g + lam * (p - a), grad_v, v, anchor)


def build(hp: Hparams, common: Common) -> Algorithm:
  local = personal.holding_optimizer(
      local_optimizer(common),
      lambda ctx: PersonalState(ctx.row["v"], jnp.zeros((), jnp.int32)))

  def grad(value_and_grad, params, ctx, opt_state):
    # The global model's gradient, as FedAvg takes it (the iterate's update is FedAvg's).
    (loss, aux), grads = value_and_grad(params)
    state = personal.held(opt_state)
    _, grad_v = value_and_grad(state.v)  # same batch, same dropout key
    v = personal.sgd_step(state.v, personal_gradient(grad_v, state.v, ctx.shared["params"],
                                                     hp.lam), hp.personal_lr)
    if hp.personal_steps:
      v = jax.tree.map(lambda new, old: jnp.where(state.steps < hp.personal_steps, new, old),
                       v, state.v)
    return (loss, aux), grads, personal.with_held(opt_state, PersonalState(v, state.steps + 1))

  def finish(final, ctx, info):
    uploads, _ = upload_delta(final, ctx, info)
    return uploads, {"v": personal.held(final.opt_state).v, "seen": personal.marked_seen(ctx.row)}

  def serve(server, row, loss_at):
    del loss_at
    return personal.own_if_seen(row, row["v"], server.params), server.model_state

  def row_init(params):
    return {"v": jax.tree.map(jnp.asarray, params), "seen": personal.unseen()}

  return Algorithm(local=local, server=server_opt(server_sgd(common)), grad=grad,
                   row_init=row_init, finish=finish, personal=Personalization(serve))


SPECS = (Spec("ditto", Hparams, build,
              "FedAvg's global model + a personal model v_k per client pulled toward it "
              "(lam/2 ||v - w||^2)",
              layerwise="each client's row holds a whole personal model, trained beside "
              "the global one"),)
