"""FedSMOO: dynamic regularisation with a globally consistent sharpness-aware perturbation.

Y. Sun, L. Shen, S. Chen, L. Ding, D. Tao, "Dynamic Regularized Sharpness Aware
Minimization in Federated Learning: Approaching Global Consistency and Smooth Landscape",
ICML 2023 (arXiv 2305.11584).

Two duals per client, kept as its row (0 at start, untouched in rounds it skips):
g_hat_i, the dynamic regulariser's (FedDyn's, as in FedSpeed), and mu_i, the one that ties
the client's perturbation to the global perturbation s, which the server keeps (0 at start)
and sends with the model (2d down). Each local step, on one minibatch:
  g = grad F_i(y);  s_i = rho (g - mu_i - s) / ||g - mu_i - s||;  mu_i <- mu_i + s_i - s;
  g~ = grad F_i(y + s_i);  y <- y - lr (g~ - g_hat_i + (1/lam) (y - x)).
After K steps g_hat_i <- g_hat_i - (1/lam) (y_K - x) (FedSpeed's controller; lam is the
penalty lambda, FL-Simulator's `lamb` is 1/lam) and the client uploads y_K - x and
z_i = mu_i + s_{i,K} (its last perturbation) (2d up). The server sets
  x <- mean_S y_K - lam mean_j g_hat_j   (mean over all N clients, FedDyn's h),
  s <- rho z / ||z||,  z = mean_S z_i   (the consensus of the perturbations projected on the
                                        sphere of radius rho).

What could be checked: the paper's algorithm text was not available; its abstract confirms a
dynamic regulariser revised by a global SAM perturbation. The local rule above (s_i along
g - mu_i - s, mu_i <- mu_i + s_i - s) is as FL-Simulator implements it (its DRegSAM
optimizer). The server's s from z = mean_S (mu_i + s_{i,K}) is the full form that
FL-Simulator's server code says it simplifies by dropping s_{i,K}; it is this module's
default as the paper's reading, but the paper's text was not available to check it.
Options for FL-Simulator's reading:
- global_perturbation="dual_only": FL-Simulator's simplification, s <- rho mean_S mu_i /
  ||mean_S mu_i||, dropping the last local perturbation s_{i,K} (its code says so);
- perturb_eps: FL-Simulator divides by the norm + 1e-7 (both for s_i and s);
- clip_mode="reference": FL-Simulator clips g~ - g_hat_i - x/lam to global norm clip_norm and
  adds y/lam unclipped (its SGD's weight decay), as fedspeed.py's reference clip.
The regulariser and server are FedSpeed's server_average="all_clients" (fedspeed.py, which
this module builds on): rho = 0 is that FedSpeed with rho = 0 exactly, which is the
project's FedDyn with alpha = 1/lam.
"""
import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_lama.algorithms import fedspeed
from fedjax_lama.algorithms.common import Common, Spec, local_optimizer, require, require_one_of
from fedjax_lama.algorithms.fedsam import ascent, check_sam_options
from fedjax_lama.engine.algorithm import (Algorithm, LocalOptimizer, ServerRule, ServerState,
                                          corrected, upload)
from fedjax_lama.tree import global_norm


class PerturbationDual(NamedTuple):
  mu: object       # mu_i, updated every step
  last: object     # s_{i,k} of the latest step


def _keep_state() -> optax.GradientTransformation:
  """Passes updates through; its state (the perturbation dual) is written by the oracle."""
  return optax.GradientTransformation(
      lambda params: PerturbationDual(optax.tree.zeros_like(params),
                                      optax.tree.zeros_like(params)),
      lambda updates, state, params=None: (updates, state))


@dataclasses.dataclass(frozen=True)
class Hparams:
  rho: float = 0.1                         # perturbation radius (FL-Simulator's README value)
  lam: float = 10.0                        # prox weight 1/lam; FL-Simulator's lamb = 1/lam
  global_perturbation: str = "with_local"  # "with_local" (default) | "dual_only" (FL-Simulator)
  perturb_eps: float = 1e-12               # norm + perturb_eps; FL-Simulator: 1e-7
  clip_mode: str = "none"                  # "none" (default) | "reference" (FL-Simulator's clip)
  clip_norm: float = 10.0

  def __post_init__(self):
    check_sam_options(self)
    require(isinstance(self.lam, (int, float)) and not isinstance(self.lam, bool)
            and math.isfinite(self.lam) and self.lam > 0, "lam", self.lam,
            "a finite number > 0 (the penalty lambda; FL-Simulator's lamb is 1/lam)")
    require_one_of("global_perturbation", self.global_perturbation, ("with_local", "dual_only"))


def build(hp: Hparams, common: Common) -> Algorithm:
  # FedSpeed without its own perturbation: the dynamic regulariser, controller and server.
  dyn_hp = fedspeed.Hparams(rho=0.0, lam=hp.lam, server_average="all_clients",
                            clip_mode=hp.clip_mode, clip_norm=hp.clip_norm)
  dyn = fedspeed.build(dyn_hp, common)
  sgd = local_optimizer(common)
  inner_tx = sgd.tx

  def inner(ctx):
    return ctx._replace(row=ctx.row["g_hat"])

  def local_init(ctx):
    params = ctx.shared["params"]
    return (PerturbationDual(ctx.row["mu"], optax.tree.zeros_like(params)),
            inner_tx.init(params))

  def perturbed_gradient(value_and_grad, params, ctx, opt_state):
    dual, rest = opt_state
    if hp.rho == 0:  # static: no second gradient, the duals stay where they are
      return value_and_grad(params) + (opt_state,)
    s = ctx.shared["s"]
    (loss, aux), g = value_and_grad(params)
    s_i = ascent(jax.tree.map(lambda a, m, ss: a - m - ss, g, dual.mu, s), hp.rho,
                 hp.perturb_eps)
    _, g_sam = value_and_grad(jax.tree.map(jnp.add, params, s_i))  # same batch, same key
    mu = jax.tree.map(lambda m, si, ss: m + si - ss, dual.mu, s_i, s)
    return (loss, aux), g_sam, (PerturbationDual(mu, s_i), rest)

  def finish(final, ctx, info):
    dual = final.opt_state[0]
    uploads, g_hat = dyn.finish(final, inner(ctx), info)
    z = dual.mu if hp.global_perturbation == "dual_only" else jax.tree.map(jnp.add, dual.mu,
                                                                            dual.last)
    return {**uploads, "z": z}, {"g_hat": g_hat, "mu": dual.mu}

  def server_update(server: ServerState, agg) -> ServerState:
    s = server.extra["s"]
    inner_server = dyn.server.update(server._replace(extra={"g_hat_mean":
                                                            server.extra["g_hat_mean"]}), agg)
    if hp.rho != 0:
      z = agg["z"]
      scale = hp.rho / (global_norm(z) + hp.perturb_eps)
      s = jax.tree.map(lambda v: (scale * v).astype(v.dtype), z)
    return inner_server._replace(extra={**inner_server.extra, "s": s})

  def server_init(params, model_state):
    state = dyn.server.init(params, model_state)
    return state._replace(extra={**state.extra, "s": optax.tree.zeros_like(params)})

  # FedSpeed's correction on the row's g_hat_i, then the pass-through that holds the dual
  # (it changes no direction: the linear rule is SGD's), then SGD.
  correct = fedspeed.correction(dyn_hp, controller=lambda ctx: ctx.row["g_hat"])
  local = LocalOptimizer(corrected(correct, optax.chain(_keep_state(), inner_tx)), sgd.rule,
                         init=local_init)
  return dataclasses.replace(
      dyn, local=local, grad=perturbed_gradient,
      row_init=lambda params: {"g_hat": optax.tree.zeros_like(params),
                               "mu": optax.tree.zeros_like(params)},
      finish=finish, aggregate={**dyn.aggregate, "z": upload("z")},
      server=ServerRule(server_init, server_update, downloads=("params", "s")))


SPECS = (Spec("fedsmoo", Hparams, build,
              "dynamic regulariser + global SAM perturbation s, per-client g_hat_i, mu_i "
              "(2d each way)",
              layerwise="the global perturbation s is normalised over all layers at once and "
              "each client's row holds two duals"),)
