"""The baselines side by side (issue 15's study): Fashion-MNIST, FedAT's CNN, strong label skew.

Label Dirichlet 0.3 over 64 clients, 25 % participation, batch 32, 10 local steps per round,
the same local-step budget for every algorithm; 10 % of the training split is held out as a
validation set (config.validation_fraction) on which the learning rates are tuned
(experiments/compare_algorithms.py). Files: <data_dir>/fashion_mnist/.
"""
from fedjax_lama.config import base_config


def get_config():
  c = base_config()
  c.algorithm = "fedavg"
  c.dataset = "fashion_mnist"
  c.model = "fedat_cnn"
  c.partition = "dirichlet"
  c.dirichlet_concentration = 0.3
  c.min_client_size = 10
  c.num_clients = 64
  c.active_ratio = 0.25
  c.batch_size = 32
  c.local_steps = 10
  c.rounds = 40
  c.local_lr = 0.03
  c.weighting = "examples"
  c.validation_fraction = 0.1
  c.eval_every = 5
  c.checkpoint_every = 10
  c.eval_batch_size = 2000
  c.per_client_eval = "never"
  return c
