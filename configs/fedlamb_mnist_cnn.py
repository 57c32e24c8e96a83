"""Fed-LAMB on MNIST with the paper's CNN, two conv + two dense, 21,840 parameters
(algorithms.md 4.5.7).

Seed shared/seeds/004_753c1b0506df9c7d.txt, Figure 2 bottom row (where the paper says
Fed-LAMB's early-round advantage is largest). Settings, the string after the file name
(default "noniid_e1"), e.g. --config=configs/fedlamb_mnist_cnn.py:iid_e5:
  noniid_e1, noniid_e5: one class per client (4.5.2), panels f2-mnist-cnn-noniid-e1/e5;
  iid_e1, iid_e5: IID split (no paper panel).
Paper setting (4.5.4): 50 clients, 25 drawn per round without replacement, batch 32, E local
epochs, uniform weights (C10), beta 0.9/0.999, phi identity; 100 rounds (project).
Fed-AMS: --config.algorithm=fedams; Fed-SGD is FedAvg: --config.algorithm=fedavg. local_lr and
fedlamb.lam are tuned per method on 4.5.5's grids; 1e-2 is a grid point, not a tuned value.
Files: <data_dir>/mnist/.
"""
from fedjax_lama.config import base_config

SETTINGS = {"noniid_e1": ("one_class", 1), "noniid_e5": ("one_class", 5),
            "iid_e1": ("iid", 1), "iid_e5": ("iid", 5)}


def get_config(setting: str = "noniid_e1"):
  if setting not in SETTINGS:
    raise ValueError(f"setting {setting!r} is not accepted; accepted: {', '.join(SETTINGS)}")
  partition, epochs = SETTINGS[setting]
  c = base_config()
  c.algorithm = "fedlamb"
  c.dataset = "mnist"
  c.model = "mnist_cnn"  # PyTorch-style init, dropout 0.5 (4.5.3)
  c.normalization = "per_channel"  # the training split's (0.1307, 0.3081), as the authors'
  c.partition = partition
  c.num_clients = 50
  c.client_sampling = "fixed"
  c.active_ratio = 0.5
  c.batch_size = 32
  c.local_epochs = epochs
  c.local_steps = 0
  c.rounds = 100
  c.local_lr = 1e-2
  c.local_momentum = 0.0  # Fed-LAMB / Fed-AMS refuse it (beta1 is their momentum)
  c.weight_decay = 0.0
  c.weighting = "uniform"
  c.fedlamb.lam = 0.0
  c.eval_every = 1
  c.checkpoint_every = 10
  return c
