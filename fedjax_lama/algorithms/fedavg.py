"""FedAvg.

H. B. McMahan, E. Moore, D. Ramage, S. Hampson, B. Aguera y Arcas,
"Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017.

Clients run K local SGD steps from the server model and upload delta_i = y_i - x;
the server applies optax.sgd(server_lr) to G = -sum_i p_i delta_i, which for
server_lr = 1 is the p-weighted average of the client models. Every other field of the
Algorithm record is left at its default: this module is the worked example of the
interface (docs/algorithms.md).
"""
from fedjax_lama.algorithms.common import Common, NoHparams, Spec, local_optimizer, server_sgd
from fedjax_lama.engine.algorithm import Algorithm, server_opt, upload_delta


def build(hp: NoHparams, common: Common) -> Algorithm:
  del hp  # FedAvg has no keys of its own
  return Algorithm(
      local=local_optimizer(common),  # SGD with the shared momentum and weight decay
      server=server_opt(server_sgd(common)),  # x <- x - server_lr G, G = -mean(delta)
      finish=upload_delta)            # upload delta = y - x; the server's default update


SPECS = (Spec("fedavg", NoHparams, build, "local SGD, weighted model average"),)
