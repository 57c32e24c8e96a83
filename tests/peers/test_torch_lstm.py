"""The PyTorch LSTM loop of `benchmarks.benchmark --peers=torch` (third_party/torch_lstm.py)
computes `lstm_lm`'s round: the weights map both ways, the forward passes agree, and one
FedAvg round of clients trained one after another in PyTorch equals the engine's round on
the same batches (float32). Needs PyTorch (requirements-peers.txt):

    /tmp/peers-venv/bin/python -m pytest -q -n 0 tests/peers/test_torch_lstm.py -s
"""
import numpy as np
import pytest

from third_party import torch_lstm

torch = torch_lstm.import_torch()
if torch is None:
  pytest.skip("PyTorch is not installed: requirements-peers.txt (a virtual environment of "
              "its own)", allow_module_level=True)

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position

from fedjax_lama import algorithms, models  # pylint: disable=wrong-import-position
from tests.peers import engine_rounds  # pylint: disable=wrong-import-position
from tests.peers.engine_rounds import largest  # pylint: disable=wrong-import-position

V, EMBED, HIDDEN, LAYERS, WINDOW, BATCH, LR = 13, 4, 6, 2, 7, 3, 0.5


def options(tanh_outputs):
  return {"vocab_size": V, "num_classes": V, "embed_size": EMBED, "hidden_size": HIDDEN,
          "num_layers": LAYERS, "tanh_outputs": tanh_outputs}


def ours(tanh_outputs):
  return models.get("lstm_lm", V, vocab_size=V, embed_size=EMBED, hidden_size=HIDDEN,
                    num_layers=LAYERS, dropout=0.0, batch_norm=False, tanh_outputs=tanh_outputs)


def initial(model):
  return model.init(jax.random.PRNGKey(3), jnp.zeros((1, WINDOW), jnp.int32))["params"]


@pytest.mark.parametrize("tanh_outputs", [False, True])
def test_weights_map_and_forward_passes_agree(tanh_outputs):
  model = ours(tanh_outputs)
  rng = np.random.default_rng(2)  # weights of N(0, 0.5^2): logits of order 1
  params = jax.tree.map(lambda a: rng.normal(0, 0.5, a.shape).astype(np.float32),
                        initial(model))
  state = torch_lstm.torch_state(torch, params, LAYERS)
  assert largest(torch_lstm.our_params(state, LAYERS), params) == 0
  module = torch_lstm.build(torch, **options(tanh_outputs))
  module.load_state_dict(state)
  tokens = np.random.default_rng(0).integers(0, V, (BATCH, WINDOW))
  theirs = module(torch.from_numpy(tokens)).detach().numpy()
  mine = np.asarray(model.apply({"params": params}, jnp.asarray(tokens, jnp.int32)))
  assert np.max(np.abs(theirs - mine)) < 1e-5
  assert np.max(np.abs(mine)) > 0.5


def test_one_round_equals_the_engines():
  model = ours(True)
  params = initial(model)
  rng = np.random.default_rng(1)
  batches = [[(rng.integers(0, V, (BATCH, WINDOW)), rng.integers(0, V, (BATCH, WINDOW)))
              for _ in range(3)] for _ in range(4)]
  run = torch_lstm.fed_avg_loop(torch, options(True), params, batches, LR, threads=1)
  theirs = torch_lstm.our_params(run(), LAYERS)
  alg = algorithms.build("fedavg")
  (_, server, _), = engine_rounds.rounds(alg, model, batches, ((0, 1, 2, 3),),
                                         alg.server.init(params, {}), LR)
  distance = largest(jax.tree.map(np.asarray, server.params), theirs)
  print(f"\nPyTorch {torch_lstm.version()} LSTM loop vs the engine's round, float32: largest "
        f"parameter difference {distance:.3g}")
  assert distance < 1e-5
  assert largest(theirs, params) > 1e-2
