"""FedSpeed on Fashion-MNIST, the CPU stand-in for CIFAR-10 (issue 16):
FedAT's CNN, balanced Dirichlet 0.6, 10 % of 100 clients, batch 50, 5 local epochs
(600 examples per client: K = 60; lower local_epochs if the CPU budget asks), the reference
code's eta = 0.1 * 0.998^round, weight decay 1e-3, rho_0 = 0.1, alpha = 1, lam = 10.
Baselines: the same config with --config.algorithm=<name>. Files: <data_dir>/fashion_mnist/.
"""
from configs.fedspeed_cifar10_100c import slides_setting


def get_config():
  c = slides_setting("fashion_mnist", num_clients=100, active_ratio=0.1, batch_size=50,
                     local_epochs=5)
  c.model = "fedat_cnn"
  c.normalization = "none"
  c.augmentation = "none"
  c.rounds = 200
  c.eval_every = 5
  c.checkpoint_every = 20
  c.eval_batch_size = 2000
  return c
