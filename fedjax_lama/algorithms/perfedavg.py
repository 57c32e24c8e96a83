"""Per-FedAvg: federated meta-learning of a model that one local step personalizes.

A. Fallah, A. Mokhtari, A. Ozdaglar, "Personalized Federated Learning with Theoretical
Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020 (arXiv 2002.07948),
Algorithm 1.

The objective is F(w) = mean_i f_i(w - alpha grad f_i(w)): the model
that one gradient step of size alpha on a client's own data turns into a good model for that
client. Each local step of client i, on the step's batch D, takes
  w~ = w - alpha grad f_i(w; D)                              (the inner, personalizing step),
  g  = (I - alpha H_i(w; D)) grad f_i(w~; D)                 (the meta-gradient),
  w  <- w - lr g                                             (the engine's step; beta = lr),
and the server averages the uploaded w_i - w^t (FedAvg). Variants:
- "fo" (Per-FedAvg (FO)): the Hessian term dropped, g = grad f_i(w~; D) (2 gradients a step);
- "hf" (Per-FedAvg (HF)): the Hessian-vector product H_i(w; D) grad f_i(w~; D) computed
  exactly, forward over reverse (jax.jvp of the gradient), where the paper approximates it by
  the finite difference of two gradients at w +- delta grad f_i(w~); the exact
  product is that difference's limit delta -> 0.
The paper draws D, D' and D'' (inner step, outer gradient, Hessian) independently; here all
three are the step's one batch (config.batch_size): the meta-gradient estimate is then
correlated across its parts, as in implementations that reuse a batch.

Personalization: the model Per-FedAvg serves client i is w - alpha grad f_i(w) on the
client's own training data at evaluation time, which the per-client evaluation computes as
local fine-tuning (one step, rate alpha) from the global model: this module has no
`Personalization` (it keeps no row), and its personalized metrics are the fine-tuned ones.
"""
import dataclasses
import math

import jax

from fedjax_lama.algorithms.common import (Common, Spec, local_optimizer, require,
                                           require_one_of, server_sgd)
from fedjax_lama.algorithms.personal import sgd_step
from fedjax_lama.engine.algorithm import Algorithm, server_opt

VARIANTS = ("fo", "hf")


@dataclasses.dataclass(frozen=True)
class Hparams:
  alpha: float = 0.01   # the personalizing step size (the inner step)
  variant: str = "fo"   # "fo" (first order) | "hf" (exact Hessian-vector product)

  def __post_init__(self):
    require(isinstance(self.alpha, (int, float)) and not isinstance(self.alpha, bool)
            and math.isfinite(self.alpha) and self.alpha > 0, "alpha", self.alpha,
            "a finite number > 0")
    require_one_of("variant", self.variant, VARIANTS)


def meta_gradient(value_and_grad, params, alpha: float, variant: str):
  """((loss, aux) at params, (I - alpha H) grad f(params - alpha grad f(params)))."""
  (loss, aux), g = value_and_grad(params)
  adapted = sgd_step(params, g, alpha)
  _, g_adapted = value_and_grad(adapted)
  if variant == "fo":
    return (loss, aux), g_adapted
  gradient = lambda p: value_and_grad(p)[1]
  _, hvp = jax.jvp(gradient, (params,), (g_adapted,))
  return (loss, aux), jax.tree.map(lambda a, h: (a - alpha * h).astype(a.dtype), g_adapted, hvp)


def build(hp: Hparams, common: Common) -> Algorithm:
  def grad(value_and_grad, params, ctx, opt_state):
    del ctx
    loss_aux, g = meta_gradient(value_and_grad, params, hp.alpha, hp.variant)
    return loss_aux, g, opt_state

  return Algorithm(local=local_optimizer(common), server=server_opt(server_sgd(common)),
                   grad=grad)


SPECS = (Spec("perfedavg", Hparams, build,
              "MAML-style meta-gradient through one local step of size alpha (FO, or HF with "
              "an exact Hessian-vector product)"),)
