"""Engine invariants: vmapped clients = a Python loop, FedAvg(1 client) = optax SGD, padding is inert."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_lama import algorithms, rng
from fedjax_lama.engine import (aggregation, clients as clients_lib, cohort as cohort_lib, local,
                                plan as plan_lib, reduce, sync_round)
from fedjax_lama.engine.algorithm import ClientContext


class TinyMLP(nn.Module):
  @nn.compact
  def __call__(self, x, train=False):
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(8)(x))
    return nn.Dense(3)(x)


SEED = 7
C, S, B, N = 4, 5, 6, 60


def _setup(momentum=0.0, weight_decay=0.0):
  model = TinyMLP()
  data_rng = np.random.default_rng(0)
  data_x = jnp.asarray(data_rng.normal(size=(N, 2, 2)).astype(np.float32))
  data_y = jnp.asarray(data_rng.integers(0, 3, size=N).astype(np.int32))
  params = model.init(jax.random.PRNGKey(0), data_x[:1])["params"]
  loss_fn = local.make_loss_fn(model, has_model_state=False)
  alg = algorithms.build("fedavg", algorithms.Common(local_momentum=momentum,
                                                    weight_decay=weight_decay))
  return model, data_x, data_y, params, loss_fn, alg


def _cohort(indices, example_mask=None, step_mask=None, client_mask=None, client_ids=None):
  c, s, b = indices.shape
  return cohort_lib.Cohort(
      jnp.asarray(indices, jnp.int32),
      jnp.ones((c, s, b), jnp.float32) if example_mask is None else jnp.asarray(example_mask, jnp.float32),
      jnp.ones((c, s), jnp.float32) if step_mask is None else jnp.asarray(step_mask, jnp.float32),
      jnp.ones((c,), jnp.float32) if client_mask is None else jnp.asarray(client_mask, jnp.float32),
      jnp.arange(c, dtype=jnp.int32) if client_ids is None else jnp.asarray(client_ids, jnp.int32),
      jnp.full((c,), 10.0, jnp.float32))


def _round(alg, loss_fn, lr=0.1, weighting="examples"):
  return sync_round.make_round_fns(loss_fn, alg, optax.constant_schedule(lr), seed=SEED,
                                  weighting=weighting, local_steps=S, population=C)


def _server(alg, params):
  return alg.server.init(params, {})


def _indices(c=C):
  return np.random.default_rng(1).integers(0, N, size=(c, S, B))


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_vmapped_clients_equal_python_loop(momentum):
  _, data_x, data_y, params, loss_fn, alg = _setup(momentum=momentum, weight_decay=1e-3)
  idx = _indices()
  train_chunk, server_update = _round(alg, loss_fn)
  sums, _, _ = train_chunk(_server(alg, params), {}, data_x, data_y, _cohort(idx), 3)
  new = server_update(_server(alg, params), sums)

  # The same thing, one client at a time, one jitted step at a time.
  def step(p, opt, xb, yb):
    g = jax.grad(lambda q: loss_fn(q, {}, xb, yb, jnp.ones(B), None)[0])(p)
    d, opt = alg.local.tx.update(g, opt, p)
    return jax.tree.map(lambda a, u: a - 0.1 * u, p, d), opt
  step = jax.jit(step)
  finals = []
  for c in range(C):
    p, opt = params, alg.local.tx.init(params)
    for s in range(S):
      p, opt = step(p, opt, data_x[idx[c, s]], data_y[idx[c, s]])
    finals.append(p)
  expected = jax.tree.map(lambda *xs: sum(xs) / C, *finals)
  chex_close = jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6), new.params, expected)
  del chex_close


def test_fedavg_one_client_equals_optax_sgd():
  _, data_x, data_y, params, loss_fn, _ = _setup()
  alg = algorithms.build("fedavg", algorithms.Common(local_momentum=0.9))
  idx = _indices(1)
  train_chunk, server_update = _round(alg, loss_fn, lr=0.05)
  sums, _, _ = train_chunk(_server(alg, params), {}, data_x, data_y, _cohort(idx), 0)
  new = server_update(_server(alg, params), sums)
  tx = optax.sgd(0.05, momentum=0.9)
  p, opt = params, tx.init(params)
  for s in range(S):
    g = jax.grad(lambda q: loss_fn(q, {}, data_x[idx[0, s]], data_y[idx[0, s]], jnp.ones(B), None)[0])(p)
    u, opt = tx.update(g, opt, p)
    p = optax.apply_updates(p, u)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               new.params, p)


def _run(alg, loss_fn, params, data_x, data_y, cohort):
  train_chunk, server_update = _round(alg, loss_fn)
  sums, _, stats = train_chunk(_server(alg, params), {}, data_x, data_y, cohort, 2)
  return server_update(_server(alg, params), sums).params, stats


def _assert_tree_equal(a, b):
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


def test_padded_client_changes_nothing():
  _, data_x, data_y, params, loss_fn, alg = _setup(momentum=0.9)
  idx = _indices()
  base, _ = _run(alg, loss_fn, params, data_x, data_y, _cohort(idx))
  garbage = np.concatenate([idx, np.random.default_rng(5).integers(0, N, size=(2, S, B))])
  padded, _ = _run(alg, loss_fn, params, data_x, data_y,
                   _cohort(garbage, client_mask=[1, 1, 1, 1, 0, 0], client_ids=[0, 1, 2, 3, 0, 0]))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), base, padded)


def test_padded_step_is_an_exact_noop():
  _, data_x, data_y, params, loss_fn, alg = _setup(momentum=0.9, weight_decay=1e-2)
  idx = _indices()
  extra = np.random.default_rng(9).integers(0, N, size=(C, 2, B))
  step_mask = np.ones((C, S + 2)); step_mask[:, S:] = 0
  client_train = local.make_client_train(loss_fn, alg, optax.constant_schedule(0.1))
  key = jax.random.PRNGKey(0)
  st = local.LocalState(params, {}, alg.local.tx.init(params))
  ctx = ClientContext({"params": params}, {}, 10.0, 0)
  a, _ = client_train(st, ctx, data_x, data_y,
                      local.ClientBatch(jnp.asarray(idx[0]), jnp.ones((S, B)), jnp.ones(S), key),
                      0)
  # Padded steps interleaved at the front and the end leave everything bit-for-bit the same
  # (momentum included) -- keys are derived from the step position, so place them at the end.
  b, _ = client_train(st, ctx, data_x, data_y,
                      local.ClientBatch(jnp.asarray(np.concatenate([idx[0], extra[0]])),
                                        jnp.ones((S + 2, B)), jnp.asarray(step_mask[0]), key),
                      0)
  _assert_tree_equal(a, b)


def test_padded_example_changes_nothing():
  _, data_x, data_y, params, loss_fn, alg = _setup()
  idx = _indices()
  base, _ = _run(alg, loss_fn, params, data_x, data_y, _cohort(idx))
  wider = np.concatenate([idx, np.random.default_rng(3).integers(0, N, size=(C, S, 3))], axis=2)
  emask = np.ones((C, S, B + 3)); emask[:, :, B:] = 0
  padded, _ = _run(alg, loss_fn, params, data_x, data_y, _cohort(wider, example_mask=emask))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), base, padded)


def test_weighted_sum_ignores_nan_in_padded_rows():
  x = {"w": jnp.array([[1.0, 2.0], [3.0, 4.0], [jnp.nan, jnp.inf]])}
  out = reduce.weighted_mean(x, jnp.array([1.0, 3.0, 0.0]))
  np.testing.assert_allclose(out["w"], [2.5, 3.5])


def test_client_keys_do_not_depend_on_cohort():
  k = rng.round_key(0, rng.STREAM_TRAIN, 4)
  a = rng.client_keys(k, jnp.array([5, 9, 2]))
  b = rng.client_keys(k, jnp.array([2, 7]))
  np.testing.assert_array_equal(a[2], b[0])


def test_scatter_rows_touches_only_real_clients():
  store = {"c": jnp.arange(12.0).reshape(6, 2)}
  new = cohort_lib.scatter_rows(store, jnp.array([4, 1, 0]), jnp.array([1.0, 1.0, 0.0]),
                               {"c": -jnp.ones((3, 2))})
  expected = np.arange(12.0).reshape(6, 2)
  expected[[4, 1]] = -1
  np.testing.assert_array_equal(new["c"], expected)


@pytest.mark.parametrize("name", ["scaffold", pytest.param("feddyn", marks=pytest.mark.slow),
                                  pytest.param("fedadmm", marks=pytest.mark.slow)])
@pytest.mark.slow
def test_folded_round_equals_reducing_the_stacked_clients(name):
  """make_round_fns folds each group of clients into the round's sums as it finishes
  (`ClientPhase.train(..., reduce_group=)`). Its sums (MEAN and SUM reductions,
  BatchNorm-free model state), per-client rows and statistics equal training every client,
  stacking the finals and reducing them afterwards, for every client map and group size,
  with padded clients."""
  _, data_x, data_y, params, loss_fn, _ = _setup()
  alg = algorithms.build(name)
  c = 6
  cohort = _cohort(np.random.default_rng(3).integers(0, N, size=(c, S, B)),
                   client_mask=[1, 1, 0, 1, 1, 0], client_ids=[4, 0, 0, 2, 1, 0])
  population = 5
  server = _server(alg, params)
  store = jax.vmap(lambda _: alg.row_init(params))(jnp.arange(population))
  store = jax.tree.map(  # rows that differ per client, so a mix-up shows
      lambda a: a + jnp.arange(population, dtype=a.dtype).reshape((-1,) + (1,) * (a.ndim - 1)),
      store)
  rows = cohort_lib.gather_rows(store, cohort.client_ids)
  schedule = optax.constant_schedule(0.1)

  # The reference: every client's final stacked, then finished and reduced at once.
  ctx = clients_lib.client_contexts(alg.shared(server), rows, cohort)
  keys = rng.client_keys(rng.round_key(SEED, rng.STREAM_TRAIN, 1), cohort.client_ids)
  state = clients_lib.fresh_states(alg, ctx, server.model_state, c, batched=False)
  phase = clients_lib.ClientPhase(loss_fn, alg, schedule,
                                state_axes=clients_lib.fresh_state_axes(alg),
                                plan=plan_lib.plan(client_map="vmap"))
  assert phase.client_map == "vmap"
  final, stats = phase.train(state, ctx, data_x, data_y, cohort, keys, S)
  info = phase.info(stats, cohort, S)
  uploads, want_rows = phase.finish(final, ctx, info)
  weights = reduce.client_weights(cohort.client_mask, cohort.num_examples, "examples")
  want = (aggregation.reduce_uploads(alg, uploads, info, final.model_state, weights,
                                   cohort.client_mask),
          want_rows, clients_lib.client_stats(stats))
  assert want[0].values, "no reductions to compare"

  saved = local.scan_group
  try:
    for client_map, width in (("vmap", None), ("scan", 1), ("scan", 2), ("scan", 3), ("scan", c)):
      local.scan_group = lambda *_, width=width, **__: width  # clients per scan iteration
      train_chunk, _ = sync_round.make_round_fns(loss_fn, alg, schedule, seed=SEED,
                                                weighting="examples", local_steps=S,
                                                population=population,
                                                plan=plan_lib.plan(client_map=client_map))
      got = train_chunk(server, rows, data_x, data_y, cohort, 1)
      assert jax.tree.structure(got) == jax.tree.structure(want)
      for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"{client_map} {width}")
  finally:
    local.scan_group = saved
