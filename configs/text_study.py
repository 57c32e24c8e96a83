"""The text study's setting (experiments/text_study.py): Shakespeare by role at a 2-core CPU's
scale, on the LSTM or the transformer.

  python -m experiments.main --config=configs/text_study.py:lstm --workdir=/tmp/text_lstm
  python -m experiments.main --config=configs/text_study.py:transformer --workdir=/tmp/text_tf

Data: `shakespeare_roles` (fedjax_lama/data/shakespeare_roles.py): LEAF's --sf 0.1 draw of
whole roles (seed 0), then only the roles of 2,000 to 8,000 characters (min_samples,
max_samples), each role's first 80 % of windows for training and its last ones as its own
test part (split "sample"); every role's text cut into consecutive 80-character sequences
(stride 80), each next character a target. 21 roles, 972 training and 229 test sequences of
80 characters. Every role is a client and takes part in every round (so that each client's
personal model trains in every round, as in the personalization study); its own test
windows are its local test part (local_test_fraction only switches the parts on). 10 % of
the training sequences are held out for validation, where FedAvg's local rate is tuned.

Training: 5 local steps of batch 10 (50 sequences, 4,000 characters) per client and round,
plain SGD at rate 1.0 before tuning, 30 rounds, one per-client evaluation after the last.

Models (the string after the file name):
  lstm         the FedAvg paper's character LSTM (embedding 8, two LSTM layers, no dropout,
               no batch norm) at width 64: 57,625 parameters;
  transformer  `transformer_lm`, pre-LayerNorm, width 64, 2 blocks of 4 heads, learned
               positions over 80: 115,665 parameters.
Both are cut from the paper's 818,137-parameter LSTM and the named sizes of transformer_lm
(tiny: 4 blocks, 215,633) to fit 5 algorithms x 3 seeds x 2 models with tuning into about
90 minutes of this CPU.
Files: <data_dir>/shakespeare_gutenberg/ or the `shakespeare` 0.6 archive (BUILD.md, "Data").
"""
import ml_collections

from fedjax_lama.config import base_config

MODELS = {
    "lstm": ("lstm_lm", {"embed_size": 8, "hidden_size": 64, "num_layers": 2, "dropout": 0.0,
                         "batch_norm": False}),
    "transformer": ("transformer_lm", {"width": 64, "depth": 2, "heads": 4, "max_len": 80}),
}


def get_config(model: str = "lstm"):
  if model not in MODELS:
    raise ValueError(f"configs/text_study.py:{model}: accepted: {', '.join(MODELS)}")
  c = base_config()
  c.algorithm = "fedavg"
  c.dataset = "shakespeare_roles"
  c.dataset_options = ml_collections.ConfigDict(
      {"split": "sample", "train_fraction": 0.8, "stride": 80, "fraction": 0.1,
       "min_samples": 2000, "max_samples": 8000, "target": "sequence"})
  c.model, options = MODELS[model]
  c.model_options = ml_collections.ConfigDict(dict(options))
  c.partition = "natural"
  c.client_sampling = "fixed"
  c.active_ratio = 1.0
  c.weighting = "examples"
  c.local_steps = 5
  c.batch_size = 10
  c.local_lr = 1.0
  c.rounds = 30
  c.validation_fraction = 0.1
  c.local_test_fraction = 0.2
  c.per_client_eval = "final"
  c.eval_every = 5
  c.checkpoint_every = 10
  c.eval_batch_size = 1000
  c.plots = False
  return c
