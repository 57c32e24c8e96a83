"""FedLAMA AAAI CIFAR-100 preset (Lee et al., AAAI 2023, experimental settings, aaai-t2): WRN-28-10
(dropout 0.3), Dirichlet 0.1, 128 clients, 25 % active, batch 32, tau' = 10, 10,000 local steps.

Learning rates: FedAvg 0.4 / 0.2 / 0.2 (tau' 10/20/40), FedLAMA phi=2 0.3, phi=4 0.2.
Needs <data_dir>/cifar100/cifar-100-python (BUILD.md) and an accelerator.
"""
from configs import aaai_cifar10_resnet20


def get_config():
  c = aaai_cifar10_resnet20.get_config()
  c.dataset = "cifar100"
  c.model = "wrn28_10"
  c.local_lr = 0.3
  return c
