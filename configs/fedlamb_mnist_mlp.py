"""Fed-LAMB on MNIST with the paper's MLP, 784-200-10 with dropout (Karimi, Li, Li, 2021,
experiments).

Karimi, Li, Li, 2021, Figure 2 top row. One config per setting,
chosen by the string after the file name (default "noniid_e1"):
  --config=configs/fedlamb_mnist_mlp.py:noniid_e5
  noniid_e1, noniid_e5: one class per client (Karimi, Li, Li, 2021, experiments), panels
  f2-mnist-mlp-noniid-e1/e5; iid_e1, iid_e5: IID split (the paper shows no IID MNIST panel).
Paper setting (Karimi, Li, Li, 2021, experiments): 50 clients, 25 drawn per round without
replacement, batch 32, E local epochs (last partial batch kept), uniform weights (the paper's 1/n),
beta 0.9/0.999, phi identity;
100 rounds (project). Fed-AMS: --config.algorithm=fedams; the paper's Fed-SGD is FedAvg:
--config.algorithm=fedavg. local_lr (and fedlamb.lam in {0, 0.01, 0.1}) are tuned per method
on the learning-rate grids of experiments/tables.py; the default 1e-2 is a Fed-LAMB grid point, not
a tuned value. Preprocessing (x/255 - mean)/std of the training split: the authors' (0.1307,
0.3081).
Files: <data_dir>/mnist/.
"""
from fedjax_lama.config import base_config

SETTINGS = {"noniid_e1": ("one_class", 1), "noniid_e5": ("one_class", 5),
            "iid_e1": ("iid", 1), "iid_e5": ("iid", 5)}


def paper_setting(dataset: str, model: str, partition: str, epochs: int, local_lr: float,
                  num_clients: int = 50):
  """The setting every Fed-LAMB experiment shares (Karimi, Li, Li, 2021, experiments): `num_clients`
  clients, half drawn per round without replacement, batch 32, E local epochs, uniform weights (the
  paper's 1/n), no momentum (Fed-LAMB / Fed-AMS refuse it: beta1 is their momentum), lambda 0, 100
  rounds."""
  c = base_config()
  c.algorithm = "fedlamb"
  c.dataset = dataset
  c.model = model
  c.normalization = "per_channel"
  c.augmentation = "none"
  c.partition = partition
  c.num_clients = num_clients
  c.client_sampling = "fixed"
  c.active_ratio = 0.5
  c.batch_size = 32
  c.local_epochs = epochs
  c.local_steps = 0
  c.rounds = 100
  c.local_lr = local_lr
  c.local_momentum = 0.0
  c.weight_decay = 0.0
  c.weighting = "uniform"
  c.fedlamb.lam = 0.0
  c.eval_every = 1
  c.checkpoint_every = 10
  return c


def setting_of(settings: dict, setting: str):
  if setting not in settings:
    raise ValueError(f"setting {setting!r} is not accepted; accepted: {', '.join(settings)}")
  return settings[setting]


def get_config(setting: str = "noniid_e1"):
  partition, epochs = setting_of(SETTINGS, setting)
  # PyTorch-style init (init_style "torch"); the training split's (0.1307, 0.3081).
  return paper_setting("mnist", "mnist_mlp", partition, epochs, 1e-2)
