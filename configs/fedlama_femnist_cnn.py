"""FedLAMA on LEAF FEMNIST with the LEAF CNN: the AAAI setting (Lee et al., AAAI 2023, experimental
settings: 256 writers, two per client).

Two writers per client, 25 % of the clients active, batch 32, tau' = 20, phi in {1, 2, 4, 8},
4,000 local steps in the paper. The shared subset has 105 writers (the paper samples 256 of
3,550), giving 53 clients; use --config.fedlama.total_steps to reduce the budget on a CPU.
"""
from fedjax_lama.config import base_config


def get_config():
  c = base_config()
  c.algorithm = "fedlama"
  c.dataset = "femnist"
  c.model = "leaf_cnn"
  c.partition = "femnist_writers"
  c.femnist_num_writers = 256
  c.femnist_writers_per_client = 2
  c.active_ratio = 0.25
  c.batch_size = 32
  c.local_lr = 0.04
  c.local_momentum = 0.0
  c.weighting = "uniform"
  c.fedlama.base_interval = 20
  c.fedlama.phi = 2
  c.fedlama.total_steps = 4000
  c.eval_every = 1
  c.checkpoint_every = 5
  return c
