"""FedSGD.

H. B. McMahan et al., AISTATS 2017 (the "FedSGD" baseline of the FedAvg paper).

Each client computes one gradient over its whole local dataset at the server model
(B = infinity, one step) and moves by -lr G_i; the server averages: FedAvg with K = 1
full-batch step, exactly. `full_batch=False` is the minibatch variant (one step on one
batch of config.batch_size), which is not the paper's FedSGD. The Fed-LAMB seed's
"Fed-SGD" is local SGD with periodic averaging, i.e. `fedavg`, not this.
"""
import dataclasses

from fedjax_lama.algorithms.common import Common, Spec, fedavg_like, require_one_of
from fedjax_lama.engine.algorithm import Algorithm


@dataclasses.dataclass(frozen=True)
class Hparams:
  full_batch: bool = True

  def __post_init__(self):
    require_one_of("full_batch", self.full_batch, (True, False))


def build(hp: Hparams, common: Common) -> Algorithm:
  return fedavg_like("fedsgd", common, full_batch=hp.full_batch, one_step=True,
                     layerwise="FedSGD takes one step per round; there is no interval to relax")


SPECS = (Spec("fedsgd", Hparams, build, "one full-batch gradient step per round"),)
