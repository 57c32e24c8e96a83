"""The FedAvg paper's Shakespeare LSTM setting (McMahan, Moore, Ramage, Hampson, Agüera y Arcas,
AISTATS 2017, Sec. 3 and Table 2): non-IID by speaking role, C = 0.1, E and B per row.

  python -m experiments.main --config=configs/fedavg_shakespeare.py --workdir=/tmp/fedavg_sh \
      --config.local_epochs=5 --config.batch_size=10 --config.local_lr=1.47

Data: `shakespeare_roles` (fedjax_lama/data/shakespeare_roles.py), one client per speaking role,
every role with a test part (split "sample": its first 80 % of windows train, its last ones
test; 819 roles here, the paper's 1,146 counts every role), the role's text cut into
consecutive 80-character sequences (stride 80) whose every next character is a target, so
that an epoch reads each character once, as the paper's LSTM unrolled over 80 characters
does. 10 % of the training sequences are held out for validation (the rates are picked
there, never on the test set).

Model: the paper's character LSTM (`lstm_lm`: an 8-dimensional embedding, two LSTM layers of
256, a dense output over LEAF's 81 characters; no dropout, no batch norm): 818,137
parameters.

Training: 10 % of the roles per round (C = 0.1), E local epochs of batch B by examples'
weights (n_k / n), plain SGD; FedSGD is `--config.algorithm=fedsgd` (one gradient over each
client's whole data per round). The paper's B = infinity is a batch of the largest client's
training sequences (one step per epoch; experiments/fedavg_shakespeare.py sets it from the
data). rounds is the cap of one run; experiments/fedavg_shakespeare.py extends runs until
they reach the target accuracy.
Files: <data_dir>/shakespeare_gutenberg/ or the `shakespeare` 0.6 archive (BUILD.md, "Data").
"""
import ml_collections

from fedjax_lama.config import base_config

# The paper's model: embedding 8, two LSTM layers of 256, no dropout, no batch norm.
PAPER_LSTM = {"embed_size": 8, "hidden_size": 256, "num_layers": 2, "dropout": 0.0,
              "batch_norm": False}


def get_config():
  c = base_config()
  c.algorithm = "fedavg"
  c.dataset = "shakespeare_roles"
  c.dataset_options = ml_collections.ConfigDict(
      {"split": "sample", "train_fraction": 0.8, "stride": 80, "target": "sequence"})
  c.model = "lstm_lm"
  c.model_options = ml_collections.ConfigDict(dict(PAPER_LSTM))
  c.partition = "natural"
  c.client_sampling = "fixed"
  c.active_ratio = 0.1
  c.weighting = "examples"
  c.local_epochs = 1
  c.local_steps = 0
  c.batch_size = 10
  c.local_lr = 1.47
  c.local_momentum = 0.0
  c.validation_fraction = 0.1
  c.rounds = 4000
  c.eval_every = 20
  c.checkpoint_every = 20
  c.per_client_eval = "never"
  c.eval_batch_size = 2000
  c.plots = False
  return c
