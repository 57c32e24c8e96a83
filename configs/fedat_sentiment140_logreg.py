"""FedAvg on Sentiment140 with logistic regression: FedAT's text setting (Chai et al., SC'21, Sec.
6).

COMMAND:
  python -m experiments.main --config=configs/fedat_sentiment140_logreg.py --workdir=/tmp/s140

FedAT (Chai et al., SC'21, Sec. 6 and Table 1): one client per Twitter account (the natural
partition, about 660,000 accounts in the training file), logistic regression over a bag of words, 10
clients per round, E = 3 local epochs of batch B = 10, each client's data split 80/20 into local
train and test (per-client accuracy and its variance), target accuracy 0.73 (Table 2). The algorithm
here is FedAvg (FedAT's own tiers are not in this program).

Project choices: local SGD (FedAT's Adam is not a local optimiser of this program) with an
untuned learning rate; a 10,000-word vocabulary (FedAT gives none); active_ratio = 1.5e-5 gives
10 accounts per round on the full training file -- scale it to about 10 / (number of accounts)
on a subset. Bag of words as int32 token ids ('tokens'): dense float32 counts of 1.6M tweets x
10,000 words would need 64 GB, so the logistic regression sums kernel rows of the ids instead
(models.dense.LogReg), with exactly the vocab x 2 + 2 parameters of the counts form.

Preparation: unzip the release's trainingandtestdata.zip (Go, Bhayani and Huang, 2009) so that
`training.1600000.processed.noemoticon.csv` and `testdata.manual.2009.06.14.csv` lie in
`<data_dir>/sentiment140/` (or `<data_dir>/sent140/`, or `<data_dir>` itself), where data_dir is
--config.data_dir, else $FEDJAX_LAMA_DATA_DIR, else ./data. The 139 neutral test tweets are
dropped (the task is binary).
"""
import ml_collections

from fedjax_lama.config import base_config


def get_config():
  c = base_config()
  c.algorithm = "fedavg"
  c.dataset = "sentiment140"
  c.dataset_options = ml_collections.ConfigDict({"vocab_size": 10_000,
                                                 "representation": "tokens"})
  c.model = "logreg"
  c.partition = "natural"
  c.local_test_fraction = 0.2
  c.client_sampling = "fixed"
  c.active_ratio = 1.5e-5
  c.local_epochs = 3
  c.local_steps = 0
  c.batch_size = 10
  c.local_lr = 0.1
  c.weighting = "examples"
  c.rounds = 500
  c.eval_every = 10
  c.checkpoint_every = 50
  c.eval_batch_size = 10_000
  return c
