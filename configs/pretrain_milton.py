"""Central pretraining on the Milton texts, the public corpus the federated Shakespeare task
starts from (experiments/pretrain.py; docs/guide.md, "Pretrain, then federate").

  python -m experiments.pretrain --config=configs/pretrain_milton.py --workdir=/tmp/milton
  python -m experiments.pretrain --config=configs/pretrain_milton.py:tiny --workdir=/tmp/m

One client holds the whole corpus (partition "iid" over one client), and FedAvg with one
client and server rate 1 is plain SGD on it: each round is `local_steps` steps of
minibatch SGD, and the run's checkpoints, resumption, evaluation and records are those of
every run. Data: `milton` (fedjax_lama/data/gutenberg.py), the 7 Milton texts of the
package `shakespeare` 0.6, cleaned as the role texts are (line ends become spaces) and
cut into consecutive 80-character windows (stride 80), each next character a target; the
last 10 % of every text is held out as the test windows the final evaluation reads (loss,
bits per character, next-character accuracy).

Models (the string after the file name):
  default  `transformer_lm` of the text study (configs/text_study.py:transformer): width 64,
           2 blocks of 4 heads, learned positions over 80, 115,665 parameters; 60 rounds of
           50 steps of batch 32 (3,000 steps, 7.7 M characters, about six passes over the
           15,150 training windows): test loss 1.90 nats, 2.75 bits per character,
           next-character accuracy 0.450 on the 1,680 held-out windows. Its checkpoint
           starts the text study's transformer runs (--config.init_from=<this workdir>).
  lstm     the text study's character LSTM (57,625 parameters), same schedule.
  tiny     a transformer of width 16, one block, 20-character windows, 4 rounds of 10
           steps: the tests' smoke size.
Files: <data_dir>/shakespeare_gutenberg/milton/ or the `shakespeare` 0.6 archive (BUILD.md,
"Data").
"""
import ml_collections

from configs import text_study
from fedjax_lama.config import base_config

SIZES = ("default", "lstm", "tiny")


def get_config(size: str = "default"):
  if size not in SIZES:
    raise ValueError(f"configs/pretrain_milton.py:{size}: accepted: {', '.join(SIZES)}")
  c = base_config()
  c.algorithm = "fedavg"
  c.server_lr = 1.0
  c.dataset = "milton"
  c.dataset_options = ml_collections.ConfigDict(
      {"seq_len": 80, "stride": 80, "test_fraction": 0.1, "target": "sequence"})
  c.partition = "iid"
  c.num_clients = 1
  c.client_sampling = "fixed"
  c.active_ratio = 1.0
  c.min_client_size = 0
  c.model, options = text_study.MODELS["lstm" if size == "lstm" else "transformer"]
  c.model_options = ml_collections.ConfigDict(dict(options))
  c.local_steps = 50
  c.batch_size = 32
  # SGD with momentum 0.9 at 0.1 (reset every round): after 500 steps of the default model,
  # test loss 2.54 against 2.62 for plain SGD at 1.0 (the text study's rate), while 0.3
  # with momentum stalls at 3.20.
  c.local_lr = 0.1
  c.local_momentum = 0.9
  c.rounds = 60
  c.eval_every = 10
  c.checkpoint_every = 10
  c.eval_batch_size = 1000
  c.per_client_eval = "never"
  c.plots = False
  if size == "tiny":
    c.dataset_options.seq_len = 20
    c.dataset_options.stride = 20
    c.model_options = ml_collections.ConfigDict(
        {"width": 16, "depth": 1, "heads": 2, "max_len": 20})
    c.local_steps = 10
    c.batch_size = 8
    c.rounds = 4
    c.eval_every = 2
    c.checkpoint_every = 2
    c.eval_batch_size = 256
  return c
