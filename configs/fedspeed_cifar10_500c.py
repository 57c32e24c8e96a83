"""FedSpeed, CIFAR-10, 500 clients at 2 % (Sun et al., ICLR 2023, experimental settings, the slides'
main table t1):
ResNet-18-GN, balanced Dirichlet 0.6 (--config.partition=iid for the IID column), batch 20,
2 local epochs. 100 examples per client give K = 10; the slides' "25 iterations per round"
is inconsistent with that and is --config.local_epochs=0 --config.local_steps=25.
Other fields as configs/fedspeed_cifar10_100c.py.
"""
from configs.fedspeed_cifar10_100c import slides_setting


def get_config():
  return slides_setting("cifar10", num_clients=500, active_ratio=0.02, batch_size=20,
                        local_epochs=2)
