"""FedBABU: the body averaged, the head frozen at its initialisation.

J. Oh, S. Kim, S.-Y. Yun, "FedBABU: Toward Enhanced Representation for Federated Image
Classification", ICLR 2022 (arXiv 2106.06042).

The model is split into a body (the feature extractor) and a head (the classifier). During
federated training the head stays at its random initialisation, on every client and on the
server: clients train the body alone (the run's local optimizer with the head's direction
set to zero) and the server averages the bodies (FedAvg on the body). Only the body
travels, d - d_head floats each way per participant: every client holds the initial head
from the start, and the server never changes it. Personalization happens at evaluation:
each client fine-tunes the global model on its own training part before it is evaluated on
its test part (config.finetune_steps; config.finetune_layers names the layers fine-tuning
moves, the head's name for head-only fine-tuning).

The head is the model's classifier by default: its top-level Dense module with the highest
index (the last dense layer applied; docs/algorithms.md, "Personalization by layer
partition"). head_layers="none" freezes nothing, which is FedAvg bit for bit.
"""
import dataclasses

import jax

from fedjax_lama.algorithms.common import Common, Spec, local_optimizer, server_sgd
from fedjax_lama.algorithms.layer_partition import (DEFAULT, as_tree, check_layer_names,
                                                    classifier_head, named_layers)
from fedjax_lama.engine.algorithm import (Algorithm, Personalization, ServerRule, ServerState,
                                          freeze, server_opt)


@dataclasses.dataclass(frozen=True)
class Hparams:
  # Comma-separated layer names of the head ("Dense_1"); "" the model's classifier head;
  # "none": no head (FedAvg).
  head_layers: str = DEFAULT

  def __post_init__(self):
    check_layer_names("head_layers", self.head_layers)


def build(hp: Hparams, common: Common) -> Algorithm:
  head = named_layers(hp.head_layers, classifier_head, "fedbabu.head_layers")

  def is_head(params):  # params-shaped Python bools: True on the head's leaves
    return as_tree(head(params), params)

  def is_body(params):
    return as_tree(~head(params), params)

  server = server_opt(server_sgd(common))  # FedAvg: x <- x + server_lr mean(delta)

  def server_update(state: ServerState, agg) -> ServerState:
    # The head keeps its initialisation whatever the aggregate holds there (zeros from the
    # clients, or the noise of a DP mechanism), so the head every client holds stays right.
    new = server.update(state, agg)
    params = jax.tree.map(lambda frozen, old, x: old if frozen else x, is_head(state.params),
                          state.params, new.params)
    return new._replace(params=params)

  return Algorithm(local=freeze(local_optimizer(common), is_head),
                   server=ServerRule(server.init, server_update),
                   personal=Personalization(exchanged=is_body))


SPECS = (Spec("fedbabu", Hparams, build,
              "FedAvg on the body; the head frozen at its initialisation, fine-tuned at "
              "evaluation (the body travels)"),)
