"""The personalization study's Fashion-MNIST setting (experiments/personal_study.py): label skew.

Fashion-MNIST cut into 50 clients holding two classes each (partition "shards",
classes_per_client 2: the label skew of McMahan et al. 2017 and of the FedRep and Ditto
papers' pathological splits), 10 % of the training split held out for validation first.
Each client's data is split into a training part and a local test part of 20 %, stratified
by label (so the local test part has the client's two classes). Small enough for a 2-core
CPU: a one-hidden-layer MLP (784-128-10; its Dense_1 is the classifier head the
layer-partition methods keep personal), every client in every round, 10 local steps of
batch 32, 30 rounds. The per-client evaluation runs once, after the last round.
Files: <data_dir>/fashion_mnist/.
"""
from fedjax_lama.config import base_config


def study_setting(dataset: str, partition: str):
  """What both settings of the personalization study share: the MLP (784-128-classes), every
  client in every round, 10 local steps of batch 32, 30 rounds, rate 0.1 before tuning, a
  validation split of 10 %, local test parts, one per-client evaluation at the end."""
  c = base_config()
  c.algorithm = "fedavg"
  c.dataset = dataset
  c.partition = partition
  c.model = "mlp"
  c.model_options.hidden_sizes = (128,)
  c.client_sampling = "fixed"
  c.active_ratio = 1.0
  c.weighting = "examples"
  c.batch_size = 32
  c.local_steps = 10
  c.rounds = 30
  c.local_lr = 0.1
  c.validation_fraction = 0.1
  c.local_test_fraction = 0.2
  c.per_client_eval = "final"
  c.eval_every = 5
  c.checkpoint_every = 10
  c.eval_batch_size = 2000
  c.plots = False
  return c


def get_config():
  c = study_setting("fashion_mnist", "shards")
  c.classes_per_client = 2
  c.num_clients = 50
  return c
