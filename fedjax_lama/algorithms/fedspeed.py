"""FedSpeed.

Y. Sun, L. Shen, T. Huang, L. Ding, D. Tao, "FedSpeed: Larger Local Interval, Less
Communication Round, and Higher Generalization Accuracy", ICLR 2023 (arXiv 2302.10429).

Each local step takes two gradients on the same minibatch (and key): g1 at y and g2 at
y + rho g1 / (||g1|| + eps) (one global L2 norm per client; `rho_normalize=False` is
the slides' unnormalised line 8), mixes them into (1 - alpha) g1 + alpha g2 and steps
along  g~ - g_hat_i + (1/lam) (y - x)  (line 11; weight decay is added afterwards by the
local optimizer, at the unperturbed y). After K steps the client's controller
g_hat_i <- g_hat_i - (1/lam) (y_K - x) (line 13; no lr, no K) is kept as its row, 0 at
start, untouched in rounds it skips. `lam` is the slides' lambda; the reference code's
`lamb` is 1/lam: lamb = 0.1 is lam = 10.

server_average="active" (the slides, line 16): the client uploads x_hat - x with
x_hat = y_K - lam g_hat_new (= y_K + h_i) and x <- mean_S x_hat.
server_average="all_clients" (the reference code): the client uploads y_K - x and
the server keeps mean_j g_hat_j over all N clients (FedDyn's h, updated by the SUM of
(1/lam) delta_i and 1/N), x <- mean_S y_K - lam mean_j g_hat_j = mean_S y_K + mean_j h_j.
Either way one model goes down and one comes up. prox_correction=False drops the
controller and the prox term and uploads y_K - x (FedAvg's server). clip_mode="reference"
clips g~ - g_hat_i - x / lam by its global norm (PyTorch's clip_grad_norm_ formula) and
adds (1/lam) y unclipped, as the reference code does.
"""
import dataclasses
import math

import jax
import jax.numpy as jnp
import optax

from fedjax_lama.algorithms.common import (Common, Spec, local_optimizer, require,
                                           require_one_of, server_sgd)
from fedjax_lama.engine.algorithm import (SUM, Algorithm, Reduction, ServerRule, ServerState,
                                          displacement, server_opt, upload)
from fedjax_lama.tree import TORCH_CLIP_EPS, clip_by_global_norm, global_norm


def _positive(value) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool) and
          math.isfinite(value) and value > 0)


@dataclasses.dataclass(frozen=True)
class Hparams:
  rho: float = 0.1                 # perturbation radius (rho_0 of the ablations when normalised)
  rho_normalize: bool = True       # divide by ||g1|| + perturb_eps (the reference code)
  perturb_eps: float = 1e-7
  alpha: float = 1.0               # weight of g2; the reference code uses g2 alone
  lam: float = 10.0                # the slides' lambda (prox weight 1/lam); code's lamb = 1/lam
  prox_correction: bool = True     # its own switch: a huge lam is not "off" (1/lam stays > 0)
  server_average: str = "active"   # "active" (slides) | "all_clients" (reference code)
  clip_mode: str = "none"          # "none" | "reference" (the reference code's clip order)
  clip_norm: float = 10.0

  def __post_init__(self):
    require(self.rho == 0 or _positive(self.rho), "rho", self.rho, "a finite number >= 0")
    require_one_of("rho_normalize", self.rho_normalize, (True, False))
    require(_positive(self.perturb_eps), "perturb_eps", self.perturb_eps,
            "a finite number > 0 (a zero gradient would divide 0 by 0)")
    require(isinstance(self.alpha, (int, float)) and not isinstance(self.alpha, bool)
            and 0.0 <= self.alpha <= 1.0, "alpha", self.alpha, "a number in [0, 1]")
    require(_positive(self.lam), "lam", self.lam, "a finite number > 0 (the slides' lambda; "
            "the reference code's lamb is 1/lam)")
    require_one_of("prox_correction", self.prox_correction, (True, False))
    require_one_of("server_average", self.server_average, ("active", "all_clients"))
    require_one_of("clip_mode", self.clip_mode, ("none", "reference"))
    require(_positive(self.clip_norm), "clip_norm", self.clip_norm, "a finite number > 0")


def correction(hp: Hparams, controller=lambda ctx: ctx.row):
  """The local correction g~ - g_hat_i + (1/lam) (y - x) (line 11), with the reference code's
  clip when asked; None without a prox correction or a clip. `controller(ctx)` is g_hat_i
  (the client's row)."""
  inv_lam = 1.0 / hp.lam

  def clip(tree):  # PyTorch's clip_grad_norm_, as the reference code clips
    return clip_by_global_norm(tree, hp.clip_norm, eps=TORCH_CLIP_EPS)[0]

  def correct(grads, params, ctx):
    x, g_hat = ctx.shared["params"], controller(ctx)
    if not hp.prox_correction:  # only reached in reference clip mode: its FedAvg clips g~
      return clip(grads)
    if hp.clip_mode == "reference":  # clip g~ - g_hat - x/lam, then add y/lam unclipped
      clipped = clip(jax.tree.map(lambda g, c, xx: g - c - inv_lam * xx, grads, g_hat, x))
      return jax.tree.map(lambda u, y: u + inv_lam * y, clipped, params)
    # The same arithmetic as FedDyn's correction with alpha = 1/lam.
    return jax.tree.map(lambda g, c, y, xx: g - c + inv_lam * (y - xx), grads, g_hat, params,
                        x)

  if not hp.prox_correction and hp.clip_mode != "reference":
    return None
  return correct


def build(hp: Hparams, common: Common) -> Algorithm:
  inv_lam, lam, alpha = 1.0 / hp.lam, hp.lam, hp.alpha

  def quasi_gradient(value_and_grad, params, ctx, opt_state):
    del ctx  # the perturbation follows the plain local gradient
    (loss, aux), g1 = value_and_grad(params)
    if hp.rho == 0 or alpha == 0:  # static: g2 is never computed, g~ = g1 exactly
      return (loss, aux), g1, opt_state
    scale = hp.rho / (global_norm(g1) + hp.perturb_eps) if hp.rho_normalize else hp.rho
    # The offset is a constant: g2 is the plain gradient AT y + e, not through e.
    offset = jax.lax.stop_gradient(jax.tree.map(lambda g: (scale * g).astype(g.dtype), g1))
    _, g2 = value_and_grad(jax.tree.map(jnp.add, params, offset))  # same batch, same key
    if alpha == 1:
      return (loss, aux), g2, opt_state
    # loss and aux (normalisation statistics) are those at the unperturbed iterate.
    return (loss, aux), jax.tree.map(lambda a, b: (1 - alpha) * a + alpha * b, g1, g2), opt_state

  local = local_optimizer(common, correction=correction(hp))
  server = server_opt(server_sgd(common))
  if not hp.prox_correction:  # a SAM-type local step with FedAvg's upload and server
    return Algorithm(local=local, grad=quasi_gradient, server=server)

  def finish(final, ctx, info):
    del info
    delta = displacement(final, ctx)
    g_hat = jax.tree.map(lambda c, d: c - inv_lam * d, ctx.row, delta)  # line 13, new controller
    if hp.server_average == "active":  # line 14 with the NEW controller (not the previous round's)
      return {"x_hat_delta": jax.tree.map(lambda d, c: d - lam * c, delta, g_hat)}, g_hat
    return {"delta": delta}, g_hat

  if hp.server_average == "active":
    # x_hat - x = (y_K - x) + h_i is not the model's displacement: not named "delta".
    return Algorithm(
        local=local, grad=quasi_gradient, row_init=optax.tree.zeros_like, finish=finish,
        server=server_opt(server_sgd(common), upload="x_hat_delta"))

  def server_init(params, model_state):
    return server.init(params, model_state)._replace(
        extra={"g_hat_mean": optax.tree.zeros_like(params)})

  def server_update(state: ServerState, agg) -> ServerState:
    # g_hat_mean = mean_j g_hat_j over all N clients, never-sampled ones at 0; FedDyn's h.
    g_mean = jax.tree.map(lambda m, s: m - s / agg.population, state.extra["g_hat_mean"],
                          agg["scaled_delta"])
    state = server.update(state, agg)  # x <- x + server_lr mean(delta)
    # x - lam * g_hat_mean = x + mean_j h_j, divided as FedDyn does so the two agree bitwise.
    params = jax.tree.map(lambda xx, m: xx - m / inv_lam, state.params, g_mean)
    return state._replace(params=params, extra={"g_hat_mean": g_mean})

  return Algorithm(
      local=local, grad=quasi_gradient, row_init=optax.tree.zeros_like, finish=finish,
      aggregate={"delta": upload("delta"), "scaled_delta": Reduction(
          lambda uploads, info: jax.tree.map(lambda d: inv_lam * d, uploads["delta"]), SUM)},
      server=ServerRule(server_init, server_update))


SPECS = (Spec("fedspeed", Hparams, build,
              "perturbed quasi-gradient + prox-correction, per-client g_hat_i (d each way)"),)
