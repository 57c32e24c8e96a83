"""How every algorithm treats BatchNorm running statistics (the one policy, docs/guide.md,
"BatchNorm").

- Synchronous rounds (FedAvg, FedProx, FedPAQ, ...): the server's statistics are the
  weighted mean (the aggregation weights) of the participants' statistics after local
  training, like their layer's parameters; they are never compressed.
- FedLAMA (the papers are silent; its authors' code never averages them):
  scale and bias are layers like any other; the running
  statistics are not layers. "window" (default) averages them over the slots at every
  window end, "round" after every sub-round, "never" keeps them slot-local (evaluation
  then uses slot 0's). They are excluded from C and reported as bn_stat_floats.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_lama import algorithms, federation, training
from fedjax_lama import config as config_lib
from fedjax_lama.fedlama import layer_units as layers
from fedjax_lama.data import Dataset
from fedjax_lama.engine import cohort as cohort_lib, local, sharding, sync_round


class TinyBN(nn.Module):
  @nn.compact
  def __call__(self, x, train=False):
    x = x.reshape((x.shape[0], -1))
    x = nn.Dense(6)(x)
    x = nn.BatchNorm(use_running_average=not train, momentum=0.5)(x)
    return nn.Dense(3)(nn.relu(x))


C, S, B, N = 3, 4, 5, 60


def _data():
  r = np.random.default_rng(0)
  x = r.normal(size=(N, 2, 2)).astype(np.float32) * np.arange(1, 5).reshape(1, 2, 2)
  y = r.integers(0, 3, size=N).astype(np.int32)
  return jnp.asarray(x), jnp.asarray(y)


def _init(model, x):
  v = model.init(jax.random.PRNGKey(0), x[:2])
  return v["params"], v["batch_stats"]


@pytest.mark.slow
def test_sync_round_averages_running_stats_with_the_aggregation_weights():
  model = TinyBN()
  data_x, data_y = _data()
  params, stats = _init(model, data_x)
  loss_fn = local.make_loss_fn(model, has_model_state=True)
  alg = algorithms.build("fedavg")
  idx = np.random.default_rng(1).integers(0, N, size=(C, S, B))
  num_examples = jnp.array([10.0, 30.0, 60.0])
  cohort = cohort_lib.Cohort(jnp.asarray(idx, jnp.int32), jnp.ones((C, S, B)), jnp.ones((C, S)),
                            jnp.ones(C), jnp.arange(C, dtype=jnp.int32), num_examples)
  train_chunk, server_update = sync_round.make_round_fns(
      loss_fn, alg, optax.constant_schedule(0.1), seed=0, weighting="examples", local_steps=S,
      population=C)
  server = alg.server.init(params, stats)
  sums, _, _ = train_chunk(server, {}, data_x, data_y, cohort, 0)
  new = server_update(server, sums)

  # Reference: each client alone, one step at a time.
  def step(p, s, xb, yb):
    (_, (s2, _)), g = jax.value_and_grad(loss_fn, has_aux=True)(p, s, xb, yb, jnp.ones(B), None)
    return jax.tree.map(lambda a, b: a - 0.1 * b, p, g), s2
  finals = []
  for c in range(C):
    p, s = params, stats
    for k in range(S):
      p, s = step(p, s, data_x[idx[c, k]], data_y[idx[c, k]])
    finals.append(s)
  w = np.asarray(num_examples) / float(np.sum(num_examples))
  expected = jax.tree.map(lambda *xs: sum(wi * xi for wi, xi in zip(w, xs)), *finals)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               new.model_state, expected)
  # The statistics moved (the test would catch "never averaged" or "kept the initial ones").
  assert not np.allclose(jax.tree.leaves(new.model_state)[0],
                         jax.tree.leaves(stats)[0])


def _config(algorithm, phi=2, bn="window"):
  c = config_lib.base_config()
  c.algorithm, c.num_clients, c.active_ratio, c.batch_size = algorithm, 4, 1.0, B
  c.partition, c.weighting, c.local_lr = "iid", "uniform", 0.1
  c.local_steps, c.rounds = 3, 2
  c.fedlama.base_interval, c.fedlama.phi, c.fedlama.bn_stats_sync = 3, phi, bn
  c.fedlama.total_steps = 3 * phi * 2
  return c


def _program(c):
  x, y = _data()
  ds = Dataset("synthetic", np.asarray(x), np.asarray(y), np.asarray(x[:20]),
               np.asarray(y[:20]), 3)
  fed = federation.build_federation(training.partition_spec(c), ds)
  model = TinyBN()
  params, stats = _init(model, x)
  return training.build_program(c, model, params, stats, fed, sharding.client_mesh()), params, stats


def _leaves(t):
  return [np.asarray(a) for a in jax.tree.leaves(t)]


@pytest.mark.parametrize("bn", ["window", "round"])
@pytest.mark.slow
def test_fedlama_averages_stats_into_every_slot_and_the_global_model(bn):
  program, params, stats = _program(_config("fedlama", bn=bn))
  state, out = program.run_round(program.init_state(), 0)
  state = state["fedlama"]
  for slot_leaf, global_leaf in zip(_leaves(state.slots.model_state),
                                    _leaves(state.server.model_state)):
    for row in slot_leaf[:4]:
      np.testing.assert_array_equal(row, global_leaf)
  assert not np.allclose(_leaves(state.server.model_state)[0], _leaves(stats)[0])
  per_model = sum(a.size for a in _leaves(stats))
  assert out.extra["bn_stat_floats"] == 2 * per_model * 4 * (2 if bn == "round" else 1)
  # Running statistics are not layers: C counts trainable parameters only.
  assert int(np.sum(layers.layer_spec(params, "tensor").sizes)) == sum(
      a.size for a in _leaves(params))


def test_fedlama_never_keeps_slot_local_stats_and_evaluates_slot_0():
  program, _, _ = _program(_config("fedlama", bn="never"))
  state, out = program.run_round(program.init_state(), 0)
  state = state["fedlama"]
  mean_leaf = _leaves(state.slots.model_state)[0]
  assert not np.allclose(mean_leaf[0], mean_leaf[1])
  for g, s in zip(_leaves(state.server.model_state), _leaves(state.slots.model_state)):
    np.testing.assert_array_equal(g, s[0])
  assert out.extra["bn_stat_floats"] == 0


def test_fedlama_phi1_window_stats_equal_fedavg_stats():
  sync, _, _ = _program(_config("fedavg"))
  lama, _, _ = _program(_config("fedlama", phi=1))
  s_state, _ = sync.run_round(sync.init_state(), 0)
  l_state, _ = lama.run_round(lama.init_state(), 0)
  for a, b in zip(_leaves(s_state["server"].model_state),
                  _leaves(l_state["fedlama"].server.model_state)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  for a, b in zip(_leaves(s_state["server"].params), _leaves(l_state["fedlama"].server.params)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
