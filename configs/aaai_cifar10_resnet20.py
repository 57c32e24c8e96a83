"""FedLAMA AAAI CIFAR-10 preset (Lee et al., AAAI 2023, experimental settings, aaai-t1): ResNet20,
Dirichlet 0.1, 128 clients, 25 % active, batch 32, tau' = 10, 10,000 local steps, weight decay 1e-4.

Learning rates of the paper's table: FedAvg(10) 0.4, FedAvg(20) 0.3, FedAvg(40) 0.3,
FedLAMA phi=2 0.2, phi=4 0.2. A FedAvg(k tau') run is phi=1 with base_interval k*tau'.
Needs <data_dir>/cifar10/cifar-10-batches-py (BUILD.md).
"""
from fedjax_lama.config import base_config


def get_config():
  c = base_config()
  c.algorithm = "fedlama"
  c.dataset = "cifar10"
  c.model = "resnet20"
  c.partition = "dirichlet"
  c.dirichlet_concentration = 0.1
  c.min_client_size = 10
  c.num_clients = 128
  c.active_ratio = 0.25
  c.batch_size = 32
  c.local_lr = 0.2
  c.local_momentum = 0.9
  c.weight_decay = 1e-4
  c.weighting = "uniform"
  # The reference feeder (the FedLAMA authors' feeders/feeder_cifar.py): per-pixel standardisation,
  # then zero-pad 4, random 32 x 32 crop and horizontal flip, drawn on device per client and step.
  c.normalization = "per_pixel"
  c.augmentation = "crop_flip"
  c.fedlama.base_interval = 10
  c.fedlama.phi = 2
  c.fedlama.total_steps = 10000
  c.eval_every = 5
  c.checkpoint_every = 25
  return c
