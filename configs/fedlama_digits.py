"""FedLAMA on the built-in digits with an MLP: runs on a laptop CPU in about a minute.

A FedAvg(tau') baseline is the same config with --config.fedlama.phi=1, and
FedAvg(phi tau') is --config.fedlama.fixed_multipliers=<phi> (Lee et al., AAAI 2023, Algorithm 2).
"""
import ml_collections

from fedjax_lama.config import base_config


def get_config():
  c = base_config()
  c.algorithm = "fedlama"
  c.dataset = "digits"
  c.model = "mlp"
  c.model_options = ml_collections.ConfigDict({"hidden_sizes": (128, 128)})
  c.partition = "dirichlet"
  c.dirichlet_concentration = 0.1
  c.min_client_size = 10
  c.num_clients = 32
  c.active_ratio = 0.25
  c.batch_size = 16
  c.local_lr = 0.1
  c.local_momentum = 0.9
  c.weighting = "uniform"  # uniform 1/m, as Eq. 2 of both papers and the authors' code
  c.fedlama.base_interval = 5
  c.fedlama.phi = 2
  c.fedlama.interval_rule = "aaai"
  c.fedlama.total_steps = 1200
  c.eval_every = 5
  c.checkpoint_every = 20
  return c
