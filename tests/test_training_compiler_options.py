"""Local training compiles with `plan_lib.CPU_TRAINING_COMPILER_OPTIONS` on every path, and those
options change the speed, not the numbers.

The options (XLA:CPU's region-based live-range analysis in copy insertion) let a step update a
parameter's buffer in place instead of copying it first (the measurements are beside
`plan_lib.CPU_TRAINING_COMPILER_OPTIONS`). The first test proves the options reach the compiler: an option
XLA does not know, put in their place, must stop each training path with XLA's own error, so a
path that built its function with plain `jax.jit` fails here.
"""
import jax
import numpy as np
import pytest

from fedjax_lama import kernels, training
from fedjax_lama.engine import local, plan as plan_lib, sharding
from fedjax_lama.programs.vectorized import VectorizedSyncProgram
from benchmarks import benchmark
from tests import test_fedat_engine as clock_helpers
from tests import test_sharding as helpers

MESH = sharding.client_mesh(jax.devices()[:1])
UNKNOWN = "xla_fedjax_lama_probe_option"

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu",
                                reason="the options are passed on CPU only")


def _sync(algorithm):
  def train():
    helpers.run(helpers.build(helpers.tiny_config(algorithm=algorithm), MESH), rounds=1)
  return train


def _vectorized():
  configs = [helpers.tiny_config(seed=s) for s in (0, 1)]
  fed = helpers.tiny_federation()
  model = helpers.TinyMLP()
  params = [model.init(jax.random.PRNGKey(c.seed), fed.dataset.train_x[:1])["params"]
            for c in configs]
  algo = training.build_program(configs[0], model, params[0], {}, fed, MESH).algorithm
  program = VectorizedSyncProgram([training.run_options(c, fed) for c in configs], algo, model,
                                  params, [{}] * 2, [fed] * 2, MESH)
  program.run_round(program.init_state(), 0)


def _clock_trainer():
  setup = clock_helpers.clock_setup()
  params = setup[2]
  job = clock_helpers.TrainJob(0, 0, params, params, 1, 0.0)
  clock_helpers.make_trainer(setup).train([job])


@pytest.mark.parametrize("train", [_sync("fedavg"), _sync("fedlama"), _vectorized,
                                   _clock_trainer],
                         ids=["sync_program", "fedlama_window", "vectorized_runs",
                              "clock_trainer"])
def test_every_training_path_compiles_with_the_options(monkeypatch, train):
  monkeypatch.setattr(plan_lib, "CPU_TRAINING_COMPILER_OPTIONS", {UNKNOWN: True})
  with pytest.raises(Exception, match=f"No such compile option: '{UNKNOWN}'"):
    train()


def test_the_options_are_known_to_this_xla():
  f = local.jit_training(lambda x: x * 2.0)
  np.testing.assert_array_equal(f(np.ones(3, np.float32)), 2.0)


@pytest.mark.parametrize("model_name", [pytest.param("leaf_cnn", marks=pytest.mark.slow),
                                        "mnist_mlp"])
@pytest.mark.slow
def test_the_options_leave_an_engine_round_bit_for_bit_unchanged(model_name, monkeypatch):
  """A FedAvg round of the engine (the benchmark's workload: 4 clients x 3 steps x 8) gives
  the same parameters, bit for bit, compiled with the options and without."""
  w = benchmark.workload(model_name, clients=4, steps=3, batch=8,
                         conv_impl=kernels.resolve("auto"))
  with_options = benchmark.engine_round(w, "auto", mesh=MESH)()
  monkeypatch.setattr(plan_lib, "CPU_TRAINING_COMPILER_OPTIONS", {})
  without = benchmark.engine_round(w, "auto", mesh=MESH)()
  moved = False
  for a, b, start in zip(jax.tree.leaves(with_options),
                         jax.tree.leaves(without), jax.tree.leaves(w.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    moved |= not np.array_equal(np.asarray(a), np.asarray(start))
  assert moved, "the round did not train: the comparison would be vacuous"


@pytest.mark.parametrize("model_name, shape", [("fedat_cnn", (32, 32, 3)), ("lstm_lm", (80,))])
def test_the_benchmarks_workload_has_each_models_example_shape(model_name, shape):
  """Images keep their model's input shape; text models read windows of tokens."""
  w = benchmark.workload(model_name, clients=1, steps=1, batch=2,
                         conv_impl=kernels.resolve("auto"))
  assert w.shape == shape and w.data_x.shape == (2,) + shape
