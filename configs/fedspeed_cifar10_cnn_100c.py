"""FedSpeed, CIFAR-10 with the reference code's small CNN (`fedspeed_lenet`, 797,962
parameters), 100 clients at 10 %, batch 50, 5 local epochs: the setting of the results table and the
rho_0 and alpha ablations of FedSpeed (Sun et al., ICLR 2023). Other fields as
configs/fedspeed_cifar10_100c.py. Needs CIFAR-10 (BUILD.md); configs/fedspeed_fmnist.py is the
stand-in on the data available here.
"""
from configs.fedspeed_cifar10_100c import slides_setting


def get_config():
  c = slides_setting("cifar10", num_clients=100, active_ratio=0.1, batch_size=50,
                     local_epochs=5)
  c.model = "fedspeed_lenet"
  return c
