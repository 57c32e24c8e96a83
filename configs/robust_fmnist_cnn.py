"""The attack x defence study's base run (issue 54): Fashion-MNIST, FedAT's CNN, FedAvg.

100 clients with label Dirichlet(0.5) shards, a fixed cohort of 20 per round (20 %), batch 32,
10 local steps per round, 10 % of the training split held out for validation (the no-attack
mean's learning rate is picked there). 20 % of the clients are malicious when an attack is on
(config.robust.malicious_fraction, drawn from the seed), so a cohort of 20 expects 4: every
defence is set to tolerate f = 4 per cohort, which each rule's bound accepts at n = 20
(Krum and Multi-Krum n > 2f + 2 = 10, Bulyan n >= 4f + 3 = 19, the medians n > 2f = 8, the
trimmed mean with beta = 0.2: floor(0.2 * 20) = 4 >= f). experiments/robust_study.py sets
config.robust.defence and config.robust.attack per cell (and f, from the same rule).
Files: <data_dir>/fashion_mnist/.
"""
from fedjax_lama.config import base_config

NUM_CLIENTS = 100
COHORT = 20
MALICIOUS_FRACTION = 0.2


def get_config():
  c = base_config()
  c.algorithm = "fedavg"
  c.dataset = "fashion_mnist"
  c.model = "fedat_cnn"
  c.partition = "dirichlet"
  c.dirichlet_concentration = 0.5
  c.min_client_size = 10
  c.num_clients = NUM_CLIENTS
  c.client_sampling = "fixed"
  c.active_ratio = COHORT / NUM_CLIENTS
  c.batch_size = 32
  c.local_steps = 10
  c.rounds = 50
  c.local_lr = 0.05
  c.weighting = "examples"
  c.validation_fraction = 0.1
  c.eval_every = 5
  c.checkpoint_every = 25
  c.eval_batch_size = 2000
  c.per_client_eval = "never"
  # The robust section: f from the expected attackers per cohort (see the module docstring).
  c.robust.f = round(MALICIOUS_FRACTION * COHORT)
  c.robust.beta = MALICIOUS_FRACTION
  c.robust.malicious_fraction = MALICIOUS_FRACTION
  # Sign flipping at scale 4: with the expected 4 attackers among 20 the mean's expected
  # update is zero, and a round with more attackers walks it backwards.
  c.robust.scale = 4.0
  # norm_bounding's bound, centered_clipping's radius and gaussian's std stay the library's
  # defaults, 1.0 each, not tuned to this model's update norms.
  return c
