"""The personalization study's FEMNIST setting (experiments/personal_study.py): natural writers.

The LEAF FEMNIST subset, one client per writer (partition "natural": 105 writers, 14,708
training and 1,685 test examples, 62 classes), every client keeping its own LEAF test
examples as its local test part (about 16 per writer). Small enough for a 2-core CPU: a
one-hidden-layer MLP (784-128-62, 108,478 parameters; its Dense_1 is the classifier head the
layer-partition methods keep personal), every client in every round (so that each client's
purely local model trains on every round, see the study), 10 local steps of batch 32,
30 rounds. The inputs are standardised with the training split's mean and std
(normalization "per_channel"): LEAF's images are white with dark ink (mean 0.96), and the
raw inputs left the MLP at 0.34 test accuracy after 30 rounds at rate 0.1, against 0.73
standardised. 10 % of the training split is held out for validation, where FedAvg's local
rate is tuned. The per-client evaluation runs once, after the last round.
Files: <data_dir>/femnist_leaf/.
"""
from fedjax_lama.config import base_config


def get_config():
  c = base_config()
  c.algorithm = "fedavg"
  c.dataset = "femnist"
  c.partition = "natural"
  c.model = "mlp"
  c.model_options.hidden_sizes = (128,)
  c.normalization = "per_channel"
  c.client_sampling = "fixed"
  c.active_ratio = 1.0
  c.weighting = "examples"
  c.batch_size = 32
  c.local_steps = 10
  c.rounds = 30
  c.local_lr = 0.1
  c.validation_fraction = 0.1
  # Natural LEAF clients keep their own test examples; the fraction only switches the local
  # test parts on (the training parts are not split).
  c.local_test_fraction = 0.2
  c.per_client_eval = "final"
  c.eval_every = 5
  c.checkpoint_every = 10
  c.eval_batch_size = 2000
  c.plots = False
  return c
