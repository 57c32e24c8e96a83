"""FedSpeed, CIFAR-100, 100 clients at 10 %, batch 50, 5 local epochs (Sun et al., ICLR 2023,
experimental settings); as configs/fedspeed_cifar10_100c.py. Needs
<data_dir>/cifar100/cifar-100-python (BUILD.md).
"""
from configs.fedspeed_cifar10_100c import slides_setting


def get_config():
  return slides_setting("cifar100", num_clients=100, active_ratio=0.1, batch_size=50,
                        local_epochs=5)
