"""FedSGD.

H. B. McMahan et al., AISTATS 2017 (the "FedSGD" baseline of the FedAvg paper).

Each client computes one gradient over its whole local dataset at the server model
(B = infinity, one step) and moves by -lr G_i; the server averages: FedAvg with K = 1
full-batch step, exactly. `full_batch=False` is the minibatch variant (one step on one
batch of config.batch_size), which is not the paper's FedSGD. The Fed-LAMB seed's
"Fed-SGD" is local SGD with periodic averaging, i.e. `fedavg`, not this.

The record is FedAvg's; the one step per round is a fact of the run, declared on the
Spec (`one_step`) and carried into the run options.
"""
import dataclasses

from fedjax_lama.algorithms import fedavg
from fedjax_lama.algorithms.common import Common, NoHparams, Spec, require_one_of
from fedjax_lama.engine.algorithm import Algorithm


@dataclasses.dataclass(frozen=True)
class Hparams:
  full_batch: bool = True

  def __post_init__(self):
    require_one_of("full_batch", self.full_batch, (True, False))


def build(hp: Hparams, common: Common) -> Algorithm:
  del hp  # full_batch is the run's batching (Spec.one_step)
  return fedavg.build(NoHparams(), common)


def one_step(hp: Hparams) -> str:
  return "full_batch" if hp.full_batch else "minibatch"


SPECS = (Spec("fedsgd", Hparams, build, "one full-batch gradient step per round",
              one_step=one_step,
              layerwise="FedSGD takes one step per round; there is no interval to relax"),)
