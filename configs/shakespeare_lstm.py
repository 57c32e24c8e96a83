"""FedAvg on LEAF Shakespeare with the LSTM language model, one client per speaking role.

COMMAND:
  python -m experiments.main --config=configs/shakespeare_lstm.py --workdir=/tmp/shakespeare

Data: LEAF's Shakespeare (natural partition: one client per role). Every row is a window of
80 characters; with dataset_options.target='sequence' (the default here) the model predicts
each next character of the window, and accuracy is next-character accuracy over all 80
positions. --config.dataset_options.target=last trains and scores only the character after
the window (LEAF's task; lstm_lm then uses its last position's logits).

Model: `lstm_lm` (FedAT's Reddit architecture, Chai et al., SC'21, Sec. 6: embedding, one LSTM,
dropout 0.1, batch norm, dense) over LEAF's 81-character vocabulary (its 80 characters + one
for any other): vocab_size is set from the dataset. Embedding 8 and width 256 follow LEAF's
Shakespeare model, which stacks two LSTM layers (ours has one). LEAF's baseline
(paper_experiments/shakespeare.sh): 10 clients per round, 1 local epoch of batch 10, SGD
lr 0.8; lr is not tuned for this model.

Preparation: in LEAF's data/shakespeare run
  ./preprocess.sh -s niid --sf 0.05 -k 64 -tf 0.9 -t sample
(LEAF's paper setting) and put the resulting `data/train/*.json` and `data/test/*.json` under
`<data_dir>/shakespeare/data/` (or `<data_dir>/shakespeare_leaf/`, `<data_dir>/shakespeare/`),
where data_dir is --config.data_dir, else $FEDJAX_LAMA_DATA_DIR, else ./data. With
`-t sample` every role has rows in both splits. active_ratio 0.02 draws about 10 roles per
round from a few hundred; set it to 10 / (number of roles) for another split.
"""
import ml_collections

from fedjax_lama.config import base_config


def get_config():
  c = base_config()
  c.algorithm = "fedavg"
  c.dataset = "shakespeare"
  c.dataset_options = ml_collections.ConfigDict({"target": "sequence"})
  c.model = "lstm_lm"
  c.model_options = ml_collections.ConfigDict({"embed_size": 8, "hidden_size": 256})
  c.partition = "natural"
  c.client_sampling = "fixed"
  c.active_ratio = 0.02
  c.local_epochs = 1
  c.local_steps = 0
  c.batch_size = 10
  c.local_lr = 0.8
  c.rounds = 80
  c.eval_every = 5
  c.checkpoint_every = 20
  return c
