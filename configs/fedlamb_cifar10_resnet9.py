"""Fed-LAMB on CIFAR-10 with ResNet-9, the He-style BasicBlock [1, 1, 1, 1] network of the
authors' code, 4,903,242 parameters (Karimi, Li, Li, 2021, experiments).

Karimi, Li, Li, 2021, Figure 3 top row and Figure 4. Settings, the
string after the file name (default "c10_e1"), e.g.
--config=configs/fedlamb_cifar10_resnet9.py:c50_e3:
  c10_e1, c10_e3: 10 clients, 5 per round, panels f3-/f4-cifar-resnet9-iid-c10-e1/e3;
  c50_e1, c50_e3: 50 clients, 25 per round, panels f3-cifar-resnet9-iid-c50-e1/e3.
All IID, batch 32, E local epochs, uniform weights (the paper's 1/n), beta 0.9/0.999, phi identity,
no augmentation; 100 rounds as the authors' job scripts. BatchNorm statistics are averaged by the
server with the model. local_lr 5e-4 with lam 0 is the authors' ResNet job script (the authors' job
scripts), a
hint to tune from. The DAWNBench network: --config.model_options.variant=dawnbench.
Fed-AMS: --config.algorithm=fedams (scripts: 1e-4); Fed-SGD is FedAvg:
--config.algorithm=fedavg (scripts: 5e-3). Needs <data_dir>/cifar10/cifar-10-batches-py
(BUILD.md; CIFAR-10 is not among the data the tests use).
"""
from configs.fedlamb_mnist_mlp import paper_setting, setting_of

SETTINGS = {"c10_e1": (10, 1), "c10_e3": (10, 3), "c50_e1": (50, 1), "c50_e3": (50, 3)}


def get_config(setting: str = "c10_e1"):
  num_clients, epochs = setting_of(SETTINGS, setting)
  # He-style ResNet-9 (variant he_basic_1111), PyTorch-style init (Karimi, Li, Li, 2021,
  # experiments); the authors normalise with (x - 0.5) / 0.5, here the training split's per-channel
  # statistics.
  return paper_setting("cifar10", "resnet9", "iid", epochs, 5e-4, num_clients)
