"""FedSAM: FedAvg whose clients take sharpness-aware (SAM) local steps.

Z. Qu, X. Li, R. Duan, Y. Liu, B. Tang, Z. Lu, "Generalized Federated Learning via
Sharpness Aware Minimization", ICML 2022; D. Caldarola, B. Caputo,
M. Ciccone, "Improving Generalization in Federated Learning by Seeking Flat Minima",
ECCV 2022. The local rule is SAM's (P. Foret, A. Kleiner, H. Mobahi, B. Neyshabur,
"Sharpness-Aware Minimization for Efficiently Improving Generalization", ICLR 2021).

Each local step takes two gradients on the same minibatch (and key): g at y, then
g~ = grad F_i(y + e) with e = rho g / ||g|| (one L2 norm over all leaves of the client's
gradient), and steps y <- y - lr g~ (weight decay, if any, at the unperturbed y). The
client uploads y_K - x and the server steps with their mean: FedAvg's server.

What could be checked: the papers' own algorithm text was not available. Their abstracts
confirm that clients run SAM as their local optimizer (Caldarola et al. also try ASAM and
stochastic weight averaging on the server, neither of which is here). The default
perturbation rho g / ||g||, one norm over the whole model, is SAM's rule and what the ESAM
optimizer of FL-Simulator (woodenchild95/FL-Simulator, the FedSpeed authors' simulator)
computes up to the 1e-7 below; that the FedSAM papers normalise exactly so and clip nothing
is assumed from SAM's rule, not checked against their text. FL-Simulator differs in two
places, each an option here:
- perturb_eps: FL-Simulator divides by ||g|| + 1e-7. The default 1e-12 only keeps a zero
  gradient from dividing 0 by 0.
- clip_mode="reference": FL-Simulator clips every method's final local direction (here g~)
  to global norm clip_norm (10) by PyTorch's clip_grad_norm_ formula before its SGD step
  adds weight decay; the default clips nothing.
rho = 0 skips the second gradient (a static branch): with clip_mode "none", FedAvg exactly.
"""
import dataclasses
import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from fedjax_lama.algorithms.common import (Common, Spec, local_optimizer, require,
                                           require_one_of, server_sgd)
from fedjax_lama.engine.algorithm import Algorithm, server_opt, single_gradient
from fedjax_lama.tree import TORCH_CLIP_EPS, clip_by_global_norm, global_norm

CLIP_MODES = ("none", "reference")


def _finite_number(value) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool) and
          math.isfinite(value))


def check_sam_options(hp) -> None:
  """The perturbation and clip options every sharpness-aware module shares."""
  require(_finite_number(hp.rho) and hp.rho >= 0, "rho", hp.rho, "a finite number >= 0")
  require(_finite_number(hp.perturb_eps) and hp.perturb_eps > 0, "perturb_eps", hp.perturb_eps,
          "a finite number > 0 (a zero gradient would divide 0 by 0)")
  require_one_of("clip_mode", hp.clip_mode, CLIP_MODES)
  require(_finite_number(hp.clip_norm) and hp.clip_norm > 0, "clip_norm", hp.clip_norm,
          "a finite number > 0")


def ascent(direction, rho: float, eps: float):
  """e = rho d / (||d|| + eps), one norm over all leaves; a constant for the second gradient
  (SAM differentiates the loss AT y + e, not through e)."""
  scale = rho / (global_norm(direction) + eps)
  return jax.lax.stop_gradient(jax.tree.map(lambda d: (scale * d).astype(d.dtype), direction))


def sam_gradient(value_and_grad, params, rho: float, eps: float,
                 direction: Optional[Callable] = None):
  """((loss, aux) at y, g at y, g~ at y + e, e) with e = ascent(direction(g)).

  `direction` maps g to the vector the ascent follows (g itself by default); loss and aux
  (e.g. normalisation statistics) are those at the unperturbed y.
  """
  (loss, aux), g = value_and_grad(params)
  e = ascent(g if direction is None else direction(g), rho, eps)
  _, g_sam = value_and_grad(jax.tree.map(jnp.add, params, e))  # same batch, same key
  return (loss, aux), g, g_sam, e


def sam_oracle(rho: float, eps: float):
  """A `grad` oracle returning SAM's g~ (the plain gradient when rho = 0, statically)."""

  def oracle(value_and_grad, params, ctx, opt_state):
    if rho == 0:
      return single_gradient(value_and_grad, params, ctx, opt_state)
    loss_aux, _, g_sam, _ = sam_gradient(value_and_grad, params, rho, eps)
    return loss_aux, g_sam, opt_state

  return oracle


def with_reference_clip(correct, clip_norm: float):
  """The correction `correct` (None: none) followed by FL-Simulator's clip of the whole local
  direction."""

  def clipped(grads, params, ctx):
    if correct is not None:
      grads = correct(grads, params, ctx)
    # PyTorch's clip_grad_norm_: scale by min(1, max_norm / (||g|| + 1e-6)).
    return clip_by_global_norm(grads, clip_norm, eps=TORCH_CLIP_EPS)[0]

  return clipped


@dataclasses.dataclass(frozen=True)
class Hparams:
  rho: float = 0.1             # perturbation radius (FL-Simulator's --rho default)
  perturb_eps: float = 1e-12   # ||g|| + perturb_eps; FL-Simulator: 1e-7
  clip_mode: str = "none"      # "none" (default, SAM's rule) | "reference" (FL-Simulator's clip)
  clip_norm: float = 10.0      # FL-Simulator's max_norm

  def __post_init__(self):
    check_sam_options(self)


def build(hp: Hparams, common: Common) -> Algorithm:
  clip = with_reference_clip(None, hp.clip_norm) if hp.clip_mode == "reference" else None
  return Algorithm(local=local_optimizer(common, correction=clip),
                   grad=sam_oracle(hp.rho, hp.perturb_eps), server=server_opt(server_sgd(common)))


SPECS = (Spec("fedsam", Hparams, build,
              "sharpness-aware local steps, FedAvg's server (d each way)"),)
