"""The main job: FedAvg, an MLP, the built-in 8x8 digits split non-IID over 32 clients.

Runs on a laptop CPU in well under a minute with no download (scikit-learn's
1,797 real handwritten digits ship with the package).
"""
import ml_collections

from fedjax_lama.config import base_config


def get_config():
  c = base_config()
  c.algorithm = "fedavg"
  c.dataset = "digits"
  c.model = "mlp"
  c.model_options = ml_collections.ConfigDict({"hidden_sizes": (128, 128)})
  c.partition = "dirichlet"
  c.dirichlet_concentration = 0.5
  c.min_client_size = 10
  c.num_clients = 32
  c.active_ratio = 1.0
  c.rounds = 60
  c.local_steps = 10
  c.batch_size = 16
  c.local_lr = 0.1
  c.local_momentum = 0.9
  c.eval_every = 5
  c.checkpoint_every = 20
  return c
