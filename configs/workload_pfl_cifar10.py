"""The throughput workload of pfl-research's CIFAR-10 benchmark, on synthetic CIFAR-shaped data.

Setup (pfl-research, arXiv 2404.06430, its `cifar10_iid` benchmark): 50,000 32x32x3 images
over 1,000 clients (50 each, IID), 50 clients per round, one local epoch of batch 10 (5
local steps), 1,500 rounds, FedAvg, its `simple_cnn` (here `pfl_cnn`, 1,626,442
parameters). The data is `synthetic` (CIFAR-10's shapes and sizes, random learnable images:
no download), so the run measures the simulator's speed, not CIFAR-10 accuracy. The
learning rates are a plain choice, not pfl-research's tuned ones.

  python -m experiments.main --config=configs/workload_pfl_cifar10.py --workdir=/tmp/pfl
  python -m benchmarks.workload_pfl_cifar10 [--rounds=100]   # wall time, samples/s, MFU

Settings (after the file name): "pfl_cnn" (default) or "fedat_cnn" (FedAT's smaller CNN).
"""
import ml_collections

from fedjax_lama.config import base_config


def get_config(model: str = "pfl_cnn"):
  c = base_config()
  c.algorithm = "fedavg"
  c.dataset = "synthetic"  # CIFAR-10 shaped: 50,000 + 10,000 images 32x32x3, 10 classes
  c.dataset_options = ml_collections.ConfigDict(
      {"height": 32, "width": 32, "channels": 3, "num_classes": 10,
       "train_examples": 50_000, "test_examples": 10_000})
  c.model = model
  c.partition = "iid"
  c.num_clients = 1000
  c.client_sampling = "fixed"
  c.active_ratio = 0.05  # 50 clients per round
  c.batch_size = 10
  c.local_epochs = 1  # 50 examples: 5 steps of 10
  c.local_steps = 0
  c.rounds = 1500
  c.local_lr = 0.05
  c.server_lr = 1.0
  c.weighting = "examples"
  c.eval_every = 100
  c.checkpoint_every = 500
  c.eval_batch_size = 1000
  c.per_client_eval = "never"
  c.plots = False
  return c
