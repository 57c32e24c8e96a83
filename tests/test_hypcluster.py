"""HypCluster: a numpy reference of Mansour et al.'s rounds on the two-client least-squares
problem, k = 1 as FedAvg bit for bit, the engine hook that makes the choice, and refusals.

The reference is written from the paper's algorithm (choose the cluster model of lowest loss,
train it locally, average each cluster's displacements over the clients that chose it, keep a
cluster nobody chose), not from the module under test; only the initial cluster models are
taken from the module (its documented noise), since the reference needs the same start.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_lama import algorithms, training
from fedjax_lama.algorithms import Common, hypcluster
from fedjax_lama.engine import (client_store, cohort as cohort_lib, local, personal_eval,
                                sharding, sync_round)
from fedjax_lama.engine.algorithm import Algorithm, ClientContext, LocalState, Personalization
from tests import test_algorithm_contract as contract, test_personal_eval
from tests import test_sharding as helpers
from tests.test_algorithm_reference import A, B, ETA, K, N, grad
from tests.test_personalized_methods import (ATOL, FULL, PARTIAL, X0, _bits, _fedavg_round,
                                             _join, _split, split_loss)


def loss(i, w):
  r = A[i] @ w - B[i]
  return 0.5 * float(r @ r)


def run_engine(alg, cohorts):
  """The rounds of `cohorts` on the engine (full-batch steps, K per client, uniform weights):
  (every cluster model as a [k, 2] array, the rows' chosen clusters, the initial models)."""
  with jax.enable_x64(True):
    data_x = jnp.asarray(np.concatenate(A))
    data_y = jnp.asarray(np.concatenate(B))
    params = jax.tree.map(jnp.asarray, _split(X0))
    train_chunk, server_update = sync_round.make_round_fns(
        split_loss, alg, optax.constant_schedule(ETA), seed=0, weighting="uniform",
        local_steps=K, population=N)
    server = alg.server.init(params, {})
    initial = _join(hypcluster.stacked(server.params, server.extra["others"]))
    store = jax.tree.map(lambda r: jnp.stack([r] * N), alg.row_init(params))
    for r, ids in enumerate(cohorts):
      ids = np.array(ids)
      idx = np.stack([np.tile(np.array([2 * i, 2 * i + 1]), (K, 1)) for i in ids])
      cohort = cohort_lib.Cohort(jnp.asarray(idx, jnp.int32), jnp.ones(idx.shape),
                                 jnp.ones((len(ids), K)), jnp.ones(len(ids)),
                                 jnp.asarray(ids, jnp.int32), jnp.full(len(ids), 2.0))
      rows = cohort_lib.gather_rows(store, jnp.asarray(ids))
      sums, new_rows, _ = train_chunk(server, rows, data_x, data_y, cohort, r)
      store = cohort_lib.scatter_rows(store, jnp.asarray(ids), jnp.ones(len(ids)), new_rows)
      server = server_update(server, sums)
    clusters = _join(jax.tree.map(np.asarray,
                                  hypcluster.stacked(server.params, server.extra["others"])))
    return clusters, np.asarray(store["cluster"]), np.asarray(initial)


def ref_hypcluster(initial, cohorts):
  """Mansour et al. 2020, HypCluster with uniform weights: (clusters, last choice per client,
  every round's choices)."""
  x = [w.copy() for w in initial]
  last, history = [-1.0] * N, []
  for ids in cohorts:
    chosen = {i: int(np.argmin([loss(i, w) for w in x])) for i in ids}
    history.append(chosen)
    finals = {}
    for i in ids:
      w = x[chosen[i]]
      for _ in range(K):
        w = w - ETA * grad(i, w)
      finals[i] = w
    for j in range(len(x)):
      members = [i for i in ids if chosen[i] == j]
      if members:  # a cluster nobody chose stays
        x[j] = x[j] + sum(finals[i] - x[j] for i in members) / len(members)
    for i in ids:
      last[i] = float(chosen[i])
  return np.stack(x), np.array(last), history


@pytest.mark.parametrize("cohorts,k", [(FULL, 2), (PARTIAL, 3)], ids=["full-2", "partial-3"])
def test_hypcluster_matches_numpy(cohorts, k):
  alg = algorithms.build("hypcluster", num_clusters=k, init_scale=1.0, init_seed=1)
  clusters, last, initial = run_engine(alg, cohorts)
  want, want_last, history = ref_hypcluster(initial, cohorts)
  # Not vacuous: the two clients choose different clusters in some round.
  assert any(len(set(h.values())) > 1 for h in history), history
  np.testing.assert_allclose(clusters, want, atol=ATOL)
  np.testing.assert_array_equal(last, want_last)
  if k == 3:  # some cluster was never chosen and kept its initial model exactly
    never = [j for j in range(k) if all(j not in h.values() for h in history)]
    assert never
    np.testing.assert_array_equal(clusters[never], initial[never])


def test_one_cluster_is_fedavg_bit_for_bit():
  """k = 1 (local momentum 0.9, padded clients, steps and examples): FedAvg's server."""
  _, padded = contract._padded_variant()
  want, _ = _fedavg_round()
  got, rows = contract._engine_round(
      algorithms.build("hypcluster", Common(local_momentum=0.9), num_clusters=1),
      [padded, padded])
  assert _bits((got.params, got.opt_state)) == _bits((want.params, want.opt_state))
  assert set(np.unique(rows["cluster"])) <= {-1.0, 0.0}


def test_start_sees_the_first_batch_and_changes_nothing_else():
  """`Personalization.start` gets the loss on step 0's batch; a start that returns the state as
  it is leaves the client's training bit-identical to an algorithm without one; a call that
  continues the round (begins=False) does not start again."""
  seen = []

  def start(state, ctx, loss_at):
    seen.append(loss_at(state.params))
    return state

  def loss_fn(params, model_state, x, y, mask, key):
    del key
    r = x @ params - y
    return jnp.sum(mask * r * r), (model_state, jnp.zeros(()))

  data_x = jnp.asarray(np.arange(12.0, dtype=np.float32).reshape(6, 2))
  data_y = jnp.asarray(np.arange(6.0, dtype=np.float32))
  batch = local.ClientBatch(jnp.asarray([[4, 5], [0, 1]], jnp.int32), jnp.ones((2, 2)),
                            jnp.ones(2), jax.random.PRNGKey(0))
  params = jnp.asarray([0.1, -0.2], jnp.float32)
  out = {}
  starting = Algorithm(personal=Personalization(lambda server, row, loss_at: None, start=start))
  for name, alg, begins in (("plain", Algorithm(), True), ("start", starting, True),
                            ("continued", starting, False)):
    train = local.make_client_train(loss_fn, alg, lambda s: 0.01, begins=begins)
    ctx = alg.shared(alg.server.init(params, {}))
    state = LocalState(params, {}, alg.local.tx.init(params))
    out[name] = train(state, ClientContext(ctx, {}, jnp.ones(()), jnp.zeros((), jnp.int32)),
                      data_x, data_y, batch, 0)
  assert _bits(out["plain"]) == _bits(out["start"]) == _bits(out["continued"])
  assert len(seen) == 1  # the continued call did not start again
  want = float(np.sum((np.asarray(data_x[4:6]) @ np.asarray(params) - np.asarray(data_y[4:6]))
                      ** 2))
  np.testing.assert_allclose(float(seen[0]), want, rtol=1e-6)


def test_refusals_are_named():
  for value in (0, -1, 1.5, True, "2"):
    with pytest.raises(ValueError, match=rf"num_clusters={value!r} is not accepted"):
      algorithms.build("hypcluster", num_clusters=value)
  with pytest.raises(ValueError, match=r"init_scale=-1.0 is not accepted"):
    algorithms.build("hypcluster", init_scale=-1.0)
  config = contract.config_for("hypcluster")
  config.hypcluster.num_clusters = 0
  with pytest.raises(ValueError, match=r"hypcluster\.num_clusters"):
    training.build_algorithm(config, num_clients=8)


def test_robust_defences_are_refused():
  """A defence would replace one cluster's masked mean by a reducer over the whole cohort:
  refused before any training, because HypCluster declares its own aggregate of the model
  upload. (DP's refusal, for the upload c_i, is tests/test_privacy_contract.py's.)"""
  config = contract.config_for("hypcluster")
  config.robust.defence, config.robust.f = "median", 0
  with pytest.raises(ValueError, match=r"config\.robust\.defence='median' is not accepted with "
                     r"config\.algorithm='hypcluster' \(it declares its own aggregate"):
    helpers.build(config, sharding.client_mesh(jax.devices()[:1]))


def test_per_client_evaluation_serves_each_client_its_lowest_loss_cluster():
  """Each client is served, of the k current models, the one of lowest mean loss over its
  whole training part (FedJAX's HypClusterEvaluator), whatever its last round's choice in its
  row; the choice and the test losses against numpy."""
  alg = algorithms.build("hypcluster", num_clusters=3, init_scale=1.0)
  params = {"w": jnp.asarray([0.5, -1.0], jnp.float32)}
  server = alg.server.init(params, {})
  clusters = np.stack([np.asarray(params["w"])] +
                      list(np.asarray(server.extra[hypcluster.OTHERS]["w"])))  # [k, 2]

  def eval_fn(p, model_state, x, y, mask):
    del model_state
    r = x @ p["w"] - y
    return mask * r * r, (jnp.abs(r) < 0.5).astype(jnp.float32)  # per-example losses

  rng = np.random.default_rng(0)
  test_x = rng.normal(size=(9, 2)).astype(np.float32)
  test_y = rng.integers(-2, 3, size=9).astype(np.int32)  # labels: the evaluator takes ints
  # Each client's training part is drawn from one cluster's model (labels rounded), so the
  # clients choose different clusters.
  train_x = rng.normal(size=(12, 2)).astype(np.float32)
  owners = np.repeat([2, 0, 1], 4)
  train_y = np.rint(np.einsum("nd,nd->n", train_x, clusters[owners])).astype(np.int32)
  train_parts = [np.arange(0, 4), np.arange(4, 8), np.arange(8, 12)]
  parts = [np.array([0, 1, 2]), np.array([3, 4, 5]), np.array([6, 7, 8])]
  mesh = sharding.client_mesh(jax.devices()[:1])
  evaluator = personal_eval.PersonalEvaluator(
      eval_fn, mesh, test_x=test_x, test_y=test_y, test_parts=parts, clients_per_chunk=3,
      serve=alg.serve, train_x=train_x, train_y=train_y, train_parts=train_parts)
  store = client_store.ClientStore.create(alg.row_init(params), 3, mesh)
  # Last-round choices that are not the lowest-loss ones: the row is not what is served.
  store.scatter(np.arange(3, dtype=np.int32), np.ones(3, np.float32),
                {"cluster": np.array([1.0, 1.0, 0.0], np.float32)})
  sums = evaluator(server.params, {}, store, server=server)
  chosen = []
  for i in range(3):
    tx, ty = train_x[train_parts[i]].astype(np.float64), train_y[train_parts[i]]
    mean_losses = [np.mean((tx @ w - ty) ** 2) for w in clusters]
    j = int(np.argmin(mean_losses))
    chosen.append(j)
    r = test_x[parts[i]].astype(np.float64) @ clusters[j] - test_y[parts[i]]
    np.testing.assert_allclose(sums["personal"].loss_sum[i], np.sum(r * r), rtol=1e-5)
  assert chosen == [2, 0, 1]
  # The global model (x_1) is client 1's choice: the same numbers there.
  np.testing.assert_allclose(sums["global"].loss_sum[1], sums["personal"].loss_sum[1])


@pytest.mark.slow
def test_a_run_records_the_clients_cluster_models(tmp_path):
  """Through train_and_evaluate: the personal metrics are the served clusters' (the program
  hands the server state to the evaluator)."""
  config = test_personal_eval._tiny(algorithm="hypcluster", rounds=2)
  config.hypcluster.num_clusters = 3
  config.hypcluster.init_scale = 0.05  # close: the clients split over them
  summary = training.train_and_evaluate(config, str(tmp_path))
  for stat in personal_eval.STATISTICS:
    assert personal_eval.metric_name("personal", stat) in summary
  assert summary[personal_eval.metric_name("personal", "mean")] != summary[
      personal_eval.metric_name("global", "mean")]
