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
rate is tuned. The per-client evaluation runs once, after the last round. Other fields as
configs/personal_fmnist.py.
Files: <data_dir>/femnist_leaf/.
"""
from configs.personal_fmnist import study_setting


def get_config():
  c = study_setting("femnist", "natural")
  c.normalization = "per_channel"
  # Natural LEAF clients keep their own test examples; local_test_fraction only switches
  # the local test parts on (the training parts are not split).
  return c
