"""FedSpeed, CIFAR-10, 100 clients at 10 % (Sun et al., ICLR 2023, experimental settings: the
slides' ablation and local-epoch setting, FL-Simulator's README setting): ResNet-18-GN, balanced
Dirichlet 0.6, batch 50, 5 local epochs (K = 50), 1000 rounds.

Reference-code hyper-parameters (the FedSpeed authors' FL-Simulator code; Sun et al., ICLR 2023,
experimental settings): eta = 0.1 decayed by 0.998 per round, weight decay 1e-3 at the unperturbed
point, rho_0 = 0.1 normalised, alpha = 1, lam = 10 (the code's lamb = 0.1 is 1/lam), no clip. The
server rule is the slides' "active"; the reference code's is
--config.fedspeed.server_average=all_clients (the reference code's mean of h over all clients):
report which one produced a number.
Unweighted means (line 16; equal client sizes make them the size-weighted means as well).
Needs <data_dir>/cifar10/cifar-10-batches-py (BUILD.md) and an accelerator.
"""
from fedjax_lama.config import base_config


def slides_setting(dataset: str, num_clients: int, active_ratio: float, batch_size: int,
                   local_epochs: int):
  """The FedSpeed settings of Sun et al., ICLR 2023, experimental settings on `dataset` (shared by
  fedspeed_* configs)."""
  c = base_config()
  c.algorithm = "fedspeed"
  c.dataset = dataset
  c.model = "resnet18_gn"
  c.partition = "dirichlet_balanced"  # FL-Simulator's equal-size Dirichlet; "iid" for IID
  c.dirichlet_concentration = 0.6
  c.num_clients = num_clients
  c.active_ratio = active_ratio
  c.batch_size = batch_size
  c.local_epochs = local_epochs
  c.local_steps = 0
  c.rounds = 1000
  c.local_lr = 0.1
  c.local_lr_decay = "exponential"  # once per round, also in epoch mode
  c.local_lr_decay_factor = 0.998
  c.weight_decay = 1e-3
  c.weighting = "uniform"
  # The reference pipeline: per-channel standardisation, zero-pad 4 + random crop, flip
  # (the reference crops with probability 1/2 only; crop_flip always crops).
  c.normalization = "per_channel"
  c.augmentation = "crop_flip"
  c.fedspeed.rho = 0.1
  c.fedspeed.alpha = 1.0
  c.fedspeed.lam = 10.0
  c.eval_every = 10
  c.checkpoint_every = 50
  return c


def get_config():
  return slides_setting("cifar10", num_clients=100, active_ratio=0.1, batch_size=50,
                        local_epochs=5)
