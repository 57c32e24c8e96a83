"""Fed-LAMB on CIFAR-10 with ResNet-9, the He-style BasicBlock [1, 1, 1, 1] network of the
authors' code, 4,903,242 parameters (algorithms.md 4.5.3, 4.5.7).

Seed shared/seeds/004_753c1b0506df9c7d.txt, Figure 3 top row and Figure 4. Settings, the
string after the file name (default "c10_e1"), e.g.
--config=configs/fedlamb_cifar10_resnet9.py:c50_e3:
  c10_e1, c10_e3: 10 clients, 5 per round, panels f3-/f4-cifar-resnet9-iid-c10-e1/e3;
  c50_e1, c50_e3: 50 clients, 25 per round, panels f3-cifar-resnet9-iid-c50-e1/e3.
All IID, batch 32, E local epochs, uniform weights (C10), beta 0.9/0.999, phi identity, no
augmentation; 100 rounds as the authors' job scripts. BatchNorm statistics are averaged by the
server with the model. local_lr 5e-4 with lam 0 is the authors' ResNet job script (4.5.5), a
hint to tune from. The DAWNBench network: --config.model_options.variant=dawnbench.
Fed-AMS: --config.algorithm=fedams (scripts: 1e-4); Fed-SGD is FedAvg:
--config.algorithm=fedavg (scripts: 5e-3). Needs <data_dir>/cifar10/cifar-10-batches-py
(BUILD.md; CIFAR-10 is not in shared/data, algorithms.md 0).
"""
from fedjax_lama.config import base_config

SETTINGS = {"c10_e1": (10, 1), "c10_e3": (10, 3), "c50_e1": (50, 1), "c50_e3": (50, 3)}


def get_config(setting: str = "c10_e1"):
  if setting not in SETTINGS:
    raise ValueError(f"setting {setting!r} is not accepted; accepted: {', '.join(SETTINGS)}")
  num_clients, epochs = SETTINGS[setting]
  c = base_config()
  c.algorithm = "fedlamb"
  c.dataset = "cifar10"
  c.model = "resnet9"  # variant he_basic_1111, PyTorch-style init (4.5.3)
  c.normalization = "per_channel"  # the authors use (x - 0.5)/0.5
  c.augmentation = "none"
  c.partition = "iid"
  c.num_clients = num_clients
  c.client_sampling = "fixed"
  c.active_ratio = 0.5
  c.batch_size = 32
  c.local_epochs = epochs
  c.local_steps = 0
  c.rounds = 100
  c.local_lr = 5e-4
  c.local_momentum = 0.0  # Fed-LAMB / Fed-AMS refuse it (beta1 is their momentum)
  c.weight_decay = 0.0
  c.weighting = "uniform"
  c.fedlamb.lam = 0.0
  c.eval_every = 1
  c.checkpoint_every = 10
  return c
