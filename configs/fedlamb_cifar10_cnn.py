"""Fed-LAMB on CIFAR-10 with a three-conv, two-dense CNN, 122,570 parameters
(Karimi, Li, Li, 2021, experiments; `cifar_cnn`, a project choice: the paper gives no sizes).

Karimi, Li, Li, 2021, Figure 3 middle and bottom rows. Settings, the
string after the file name (default "iid_e1"), e.g. --config=configs/fedlamb_cifar10_cnn.py:iid_e3:
  iid_e1, iid_e3: IID, panels f3-cifar-cnn-iid-c50-e1/e3;
  noniid_e3: one class per client (the paper's scheme is unstated), f3-cifar-cnn-noniid-c50-e3.
Paper setting (Karimi, Li, Li, 2021, experiments): 50 clients, 25 drawn per round without
replacement, batch 32, E local epochs, uniform weights (the paper's 1/n), beta 0.9/0.999, phi
identity, no augmentation; 100 rounds.
Fed-AMS: --config.algorithm=fedams; Fed-SGD is FedAvg: --config.algorithm=fedavg. local_lr and
fedlamb.lam are tuned on the learning-rate grids of experiments/tables.py; 3e-3 is a grid point, not
a tuned value. Inputs are standardised per channel with the training split's statistics (the authors
use (x - 0.5)/0.5). CIFAR-10 is not among the data the tests use: needs
<data_dir>/cifar10/cifar-10-batches-py (BUILD.md).
"""
from configs.fedlamb_mnist_mlp import paper_setting, setting_of

SETTINGS = {"iid_e1": ("iid", 1), "iid_e3": ("iid", 3), "noniid_e3": ("one_class", 3)}


def get_config(setting: str = "iid_e1"):
  partition, epochs = setting_of(SETTINGS, setting)
  return paper_setting("cifar10", "cifar_cnn", partition, epochs, 3e-3)  # PyTorch-style init
