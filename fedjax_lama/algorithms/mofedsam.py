"""MoFedSAM: FedSAM with client-level momentum.

Z. Qu, X. Li, R. Duan, Y. Liu, B. Tang, Z. Lu, "Generalized Federated Learning via
Sharpness Aware Minimization", ICML 2022 (MoFedSAM).

The momentum is FedCM's (J. Xu, S. Wang, L. Wang, A. C.-C. Yao, 2021), which this module
builds on: the server keeps D, last round's mean displacement in gradient units
(D = -mean_S (y_K - x) / (the client's sum of step sizes), 0 at start) and sends it with
the model (2d down). Each local step takes SAM's two gradients on one minibatch, g at y
and g~ at y + rho g / ||g|| (fedsam.py), and steps along alpha g~ + (1 - alpha) D: the
perturbation follows the plain local gradient, the momentum enters the descent only.
The client uploads y_K - x (d up); the server steps with their mean (server_lr 1 is
x + mean Delta_i, FL-Simulator's server).

What could be checked: the paper's algorithm text was not available; its abstract says only
that MoFedSAM adds momentum to FedSAM to bridge local and global models. Which direction feeds
the momentum (the perturbation along the plain g, the momentum D in the descent only) and the
FedCM form of D are as FL-Simulator implements it (its ESAM step on the plain loss, the
perturbed loss scaled by alpha, (1 - alpha) D added before the step); the paper's text was
not available to check. FL-Simulator differs from this module's defaults by
- perturb_eps: ||g|| + 1e-7 there (the default divides by ||g||, SAM's rule);
- clip_mode="reference": it clips alpha g~ + (1 - alpha) D to global norm clip_norm before
  its SGD step adds weight decay (the default clips nothing);
- it divides the mean displacement by one nominal step count (client 0's batches per
  epoch) times last round's rate, where this module divides each client's displacement by
  its own sum of step sizes: the same whenever clients take equal steps (no option).
rho = 0 is the project's fedcm with the same alpha exactly; alpha = 1 is fedsam.
"""
import dataclasses

from fedjax_lama.algorithms import fedcm
from fedjax_lama.algorithms.common import Common, Spec, local_optimizer, require
from fedjax_lama.algorithms.fedsam import check_sam_options, sam_oracle, with_reference_clip
from fedjax_lama.engine.algorithm import Algorithm


@dataclasses.dataclass(frozen=True)
class Hparams:
  rho: float = 0.1             # perturbation radius
  alpha: float = 0.1           # weight of the local gradient; 1 - alpha on D (FL-Simulator: 0.1)
  perturb_eps: float = 1e-12   # ||g|| + perturb_eps; FL-Simulator: 1e-7
  clip_mode: str = "none"      # "none" (default) | "reference" (FL-Simulator's clip)
  clip_norm: float = 10.0

  def __post_init__(self):
    check_sam_options(self)
    require(isinstance(self.alpha, (int, float)) and not isinstance(self.alpha, bool)
            and 0.0 <= self.alpha <= 1.0, "alpha", self.alpha, "a number in [0, 1]")


def build(hp: Hparams, common: Common) -> Algorithm:
  momentum = fedcm.build(fedcm.Hparams(alpha=hp.alpha), common)
  correct = fedcm.client_momentum(hp.alpha)  # alpha g~ + (1 - alpha) D
  if hp.clip_mode == "reference":
    correct = with_reference_clip(correct, hp.clip_norm)
  return dataclasses.replace(momentum, local=local_optimizer(common, correction=correct),
                             grad=sam_oracle(hp.rho, hp.perturb_eps))


SPECS = (Spec("mofedsam", Hparams, build,
              "sharpness-aware local steps + client-level momentum D (2d down)"),)
