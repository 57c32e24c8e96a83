"""FedLAMA on Fashion-MNIST with FedAT's CNN, the AAAI CIFAR-10 setting scaled to this CPU.

AAAI setting (Lee et al., AAAI 2023, experimental settings): label Dirichlet alpha 0.1, 128 clients,
25 % active, batch 32, tau' = 10, phi in {1, 2, 4}. CIFAR-10 is not available here, so this runs
Fashion-MNIST with the same CNN family. Files: <data_dir>/fashion_mnist/.
"""
from fedjax_lama.config import base_config


def get_config():
  c = base_config()
  c.algorithm = "fedlama"
  c.dataset = "fashion_mnist"
  c.model = "fedat_cnn"
  c.partition = "dirichlet"
  c.dirichlet_concentration = 0.1
  c.min_client_size = 10
  c.num_clients = 128
  c.active_ratio = 0.25
  c.batch_size = 32
  c.local_lr = 0.02
  c.local_momentum = 0.9
  c.weighting = "uniform"
  c.fedlama.base_interval = 10
  c.fedlama.phi = 2
  c.fedlama.total_steps = 400
  c.eval_every = 2
  c.checkpoint_every = 10
  c.eval_batch_size = 2000
  return c
