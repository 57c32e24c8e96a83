"""The differential-privacy study's setting (experiments/dp_study.py): Fashion-MNIST, 2,000 clients.

Why many small clients: the noise DP-FedAvg adds to the released mean update has std
sigma C / (q N) per coordinate, so only a large expected cohort q N keeps it below the signal.
N = 2,000 clients of 27 examples each (Dirichlet 1.0 class priors with equal client sizes;
10 % of the training split held out for validation) sampled by Poisson at q = 0.05 give
q N = 100; 100 rounds then calibrate (RDP, delta 1e-5 < 1 / N) to sigma 2.32, 1.44, 1.01,
0.74 at epsilon 1, 2, 4, 8. The model is Fed-LAMB's MNIST CNN (21,840 parameters) with
dropout off: a small model keeps the noise's norm sqrt(d) sigma C / (q N) small. Uniform
weighting (DP-FedAvg's unit weights), 5 local steps of batch 16 per round.

privacy.clip_norm is the adaptive row's initial clip; the study sets the fixed clip from a
non-private run (the median update norm) unless --clip_norm says otherwise, and turns
privacy on per row. Files: <data_dir>/fashion_mnist/.
"""
from fedjax_lama.config import base_config


def get_config():
  c = base_config()
  c.algorithm = "fedavg"
  c.dataset = "fashion_mnist"
  c.model = "mnist_cnn"
  c.model_options.dropout = 0.0
  c.partition = "dirichlet_balanced"
  c.dirichlet_concentration = 1.0
  c.num_clients = 2000
  c.min_client_size = 10
  c.validation_fraction = 0.1
  # Poisson cohorts at rate q = active_ratio: what the accountant's amplification assumes.
  c.client_sampling = "bernoulli"
  c.active_ratio = 0.05
  c.weighting = "uniform"
  c.batch_size = 16
  c.local_steps = 5
  c.rounds = 100
  c.local_lr = 0.1
  # Every 20 rounds: the last 3 evaluations (rounds 60-100) score the tuning and place the
  # fixed clip; fewer evaluations spare the accountant's per-evaluation epsilon.
  c.eval_every = 20
  c.checkpoint_every = 50
  c.eval_batch_size = 2000
  c.per_client_eval = "never"
  c.plots = False
  c.privacy.clip_norm = 0.5
  c.privacy.delta = 1e-5
  return c
