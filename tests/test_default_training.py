"""Every registered algorithm trains on configs/default.py (local momentum 0.9) at its default
hyper-parameters, or is refused up front with a ConfigError that says why.

The default config is the README's first run: an MLP on the 8x8 digits over 32 non-IID
clients, 10 local steps at lr 0.1 with heavy-ball momentum 0.9. Two failures this guards:
SCAFFOLD's option II dividing the displacement by the sum of the learning rates (about ten
times too small a divisor under momentum 0.9, so c_i overestimates the mean gradient and
training diverges), and the adaptive server optimizers of Reddi et al. 2021 run at a server
rate of 1.0 (test accuracy at chance).
"""
import json
import math
import os

import pytest

from configs import default
from fedjax_lama import registry, training
from fedjax_lama.errors import ConfigError

# Refused on configs/default.py, and the field the refusal names: an adaptive local optimizer
# (AMSGrad) has its own first moment instead of SGD momentum.
REFUSED = {"fedlamb": "local_momentum", "fedams": "local_momentum"}
CHANCE = 0.1  # ten digit classes


def _config(name, rounds):
  c = default.get_config()
  c.algorithm = name
  c.rounds = rounds
  c.eval_every = 1
  c.checkpoint_every = rounds
  c.per_client_eval = "never"
  c.plots = False
  return c


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _train_losses(workdir):
  return {r["round"]: r["train_loss"] for r in _records(workdir) if "train_loss" in r}


# Personalization by layer partition whose personal layers (the head, or all but the head)
# the server never trains.
PERSONAL_LAYERS = ("fedper", "fedrep", "lg_fedavg")


def test_default_config_has_local_momentum():
  assert default.get_config().local_momentum == 0.9
  assert set(REFUSED) <= set(registry.SPECS)


@pytest.mark.slow
def test_scaffold_training_loss_falls_on_the_default_config(tmp_path):
  """SCAFFOLD (option II, the default) at local momentum 0.9: 10 rounds, finite and falling."""
  summary = training.train_and_evaluate(_config("scaffold", 10), str(tmp_path))
  losses = _train_losses(tmp_path)
  assert sorted(losses) == list(range(1, 11))
  assert all(math.isfinite(v) for v in losses.values())
  assert losses[10] < 0.5 * losses[1]
  assert summary["final_test_accuracy"] > 0.5


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(registry.SPECS))
def test_every_algorithm_trains_on_the_default_config(tmp_path, name):
  """30 rounds at the algorithm's default hyper-parameters: the training loss at round 30 is
  finite and below round 1's, and the test accuracy is far above chance."""
  config = _config(name, 30)
  if name in REFUSED:
    with pytest.raises(ConfigError, match=rf"config\.{REFUSED[name]}=.*{name}"):
      training.train_and_evaluate(config, str(tmp_path))
    assert not os.path.exists(os.path.join(tmp_path, "metrics.jsonl"))
    return
  summary = training.train_and_evaluate(config, str(tmp_path))
  losses = _train_losses(tmp_path)
  assert math.isfinite(losses[30]) and losses[30] < losses[1], losses
  if name in PERSONAL_LAYERS:
    # The global model keeps its personal layers as initialised: only each client's own
    # model (Algorithm.serve) is measured by these methods.
    return
  assert summary["final_test_accuracy"] > 5 * CHANCE, summary["final_test_accuracy"]
