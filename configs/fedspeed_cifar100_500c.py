"""FedSpeed, CIFAR-100, 500 clients at 2 %, batch 20, 2 local epochs (Sun et al., ICLR 2023,
experimental settings, t1); as configs/fedspeed_cifar10_500c.py. Needs
<data_dir>/cifar100/cifar-100-python (BUILD.md).
"""
from configs.fedspeed_cifar10_100c import slides_setting


def get_config():
  return slides_setting("cifar100", num_clients=500, active_ratio=0.02, batch_size=20,
                        local_epochs=2)
