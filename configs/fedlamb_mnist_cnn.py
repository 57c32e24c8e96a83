"""Fed-LAMB on MNIST with the paper's CNN, two conv + two dense, 21,840 parameters
(Karimi, Li, Li, 2021, experiments).

Karimi, Li, Li, 2021, Figure 2 bottom row (where the paper says
Fed-LAMB's early-round advantage is largest). Settings, the string after the file name
(default "noniid_e1"), e.g. --config=configs/fedlamb_mnist_cnn.py:iid_e5:
  noniid_e1, noniid_e5: one class per client (Karimi, Li, Li, 2021, experiments), panels
  f2-mnist-cnn-noniid-e1/e5; iid_e1, iid_e5: IID split (no paper panel).
Paper setting (Karimi, Li, Li, 2021, experiments): 50 clients, 25 drawn per round without
replacement, batch 32, E local epochs, uniform weights (the paper's 1/n), beta 0.9/0.999, phi
identity; 100 rounds (project).
Fed-AMS: --config.algorithm=fedams; Fed-SGD is FedAvg: --config.algorithm=fedavg. local_lr and
fedlamb.lam are tuned per method on the learning-rate grids of experiments/tables.py; 1e-2 is a grid
point, not a tuned value.
Files: <data_dir>/mnist/.
"""
from configs.fedlamb_mnist_mlp import paper_setting, setting_of

SETTINGS = {"noniid_e1": ("one_class", 1), "noniid_e5": ("one_class", 5),
            "iid_e1": ("iid", 1), "iid_e5": ("iid", 5)}


def get_config(setting: str = "noniid_e1"):
  partition, epochs = setting_of(SETTINGS, setting)
  # PyTorch-style init, dropout 0.5.
  return paper_setting("mnist", "mnist_cnn", partition, epochs, 1e-2)
