"""Ditto, APFL, pFedMe and Per-FedAvg: their reductions, bit for bit, and a numpy reference of
each paper's equations on the two-client least-squares problem of test_algorithm_reference.

The problem: f_i(w) = 0.5 ||A_i w - b_i||^2, full-batch gradients, lr 0.1, K = 2 local steps,
x^0 = 0, float64, uniform weighting. The references below are written from the papers'
algorithms (not from the modules under test). The engine runs the same rounds through
engine/sync_round.py; the parameters may be split into two arrays ("a" holds w[0], "b" w[1])
so that APFL's one-alpha-per-array option has two arrays to tell apart.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_lama import algorithms, training
from fedjax_lama.algorithms import Common
from fedjax_lama.engine import cohort as cohort_lib, sync_round
from fedjax_lama.engine.algorithm import ServerState
from tests import test_algorithm_contract as contract
from tests.test_algorithm_reference import A, B, ETA, K, N, grad

ATOL = 1e-12
FULL = ((0, 1),) * 3
PARTIAL = ((0, 1), (1,), (0,))
X0 = np.array([0.3, -0.2])


def hessian(i):
  return A[i].T @ A[i]


def _served(alg, params, row, model_state=None):
  """What `alg` serves a client with `row` when the server holds `params`."""
  server = ServerState(params, {} if model_state is None else model_state, (), {})
  return alg.serve(server, row, None)


def _split(w):
  return {"a": w[:1], "b": w[1:]}


def _join(tree):
  return np.concatenate([np.asarray(tree["a"]), np.asarray(tree["b"])], axis=-1)


def split_loss(params, model_state, x, y, example_mask, key):
  """f_i with w = (a, b): the reference's least squares over two parameter arrays."""
  del key
  w = jnp.concatenate([params["a"], params["b"]])
  r = x @ w - y
  return 0.5 * jnp.sum(example_mask * r * r), (model_state, jnp.zeros(()))


def engine(alg, cohorts, steps=(K, K), common_lr=ETA):
  """The rounds of `cohorts` (client ids per round) on the engine; client i takes steps[i]
  full-batch steps. Returns (server params as one vector, rows with vectors, the store)."""
  with jax.enable_x64(True):
    data_x = jnp.asarray(np.concatenate(A))
    data_y = jnp.asarray(np.concatenate(B))
    params = jax.tree.map(jnp.asarray, _split(X0))
    max_steps = max(steps)
    train_chunk, server_update = sync_round.make_round_fns(
        split_loss, alg, optax.constant_schedule(common_lr), seed=0, weighting="uniform",
        local_steps=max_steps, population=N)
    server = alg.server.init(params, {})
    template = alg.row_init(params) if alg.row_init is not None else {}
    store = jax.tree.map(lambda r: jnp.stack([r] * N), template)
    for r, ids in enumerate(cohorts):
      ids = np.array(ids)
      idx = np.stack([np.tile(np.array([2 * i, 2 * i + 1]), (max_steps, 1)) for i in ids])
      step_mask = np.array([[1.0 if k < steps[i] else 0.0 for k in range(max_steps)]
                            for i in ids])
      cohort = cohort_lib.Cohort(jnp.asarray(idx, jnp.int32), jnp.ones(idx.shape),
                                 jnp.asarray(step_mask), jnp.ones(len(ids)),
                                 jnp.asarray(ids, jnp.int32), jnp.full(len(ids), 2.0))
      rows = cohort_lib.gather_rows(store, jnp.asarray(ids)) if template else {}
      sums, new_rows, _ = train_chunk(server, rows, data_x, data_y, cohort, r)
      if template:
        store = cohort_lib.scatter_rows(store, jnp.asarray(ids), jnp.ones(len(ids)), new_rows)
      server = server_update(server, sums)
    store = jax.tree.map(np.asarray, store)
    return _join(jax.tree.map(np.asarray, server.params)), store


def server_mean(x, finals, beta=1.0):
  return x + beta * sum(y - x for y in finals) / len(finals)


def local_sgd(i, w, steps=K):
  for _ in range(steps):
    w = w - ETA * grad(i, w)
  return w


def ref_fedavg(cohorts, steps=(K, K)):
  x = X0.copy()
  for ids in cohorts:
    x = server_mean(x, [local_sgd(i, x, steps[i]) for i in ids])
  return x


# ---- Ditto -------------------------------------------------------------------------------------
def ref_ditto(lam, lr_p, cohorts, personal_steps=K, steps=(K, K)):
  """Li et al. 2021, Algorithm 1: w by local SGD;
  v_k <- v_k - lr_p (grad F_k(v_k) + lam (v_k - w^t))."""
  x, v = X0.copy(), [X0.copy(), X0.copy()]
  for ids in cohorts:
    finals = []
    for i in ids:
      finals.append(local_sgd(i, x, steps[i]))
      for _ in range(min(personal_steps, steps[i])):
        v[i] = v[i] - lr_p * (grad(i, v[i]) + lam * (v[i] - x))
    x = server_mean(x, finals)
  return x, np.stack(v)


@pytest.mark.parametrize("cohorts,lam", [
    (PARTIAL, 0.0), (PARTIAL, 0.7), (FULL, 0.7),
    pytest.param(FULL, 0.0, marks=pytest.mark.slow)], ids=["partial-0", "partial-0.7",
                                                           "full-0.7", "full-0"])
def test_ditto_matches_numpy(cohorts, lam):
  x, v = ref_ditto(lam, 0.05, cohorts, steps=(K, 1))
  server, rows = engine(algorithms.build("ditto", lam=lam, personal_lr=0.05), cohorts,
                        steps=(K, 1))
  np.testing.assert_allclose(server, x, atol=ATOL)
  np.testing.assert_allclose(_join(rows["v"]), v, atol=ATOL)
  np.testing.assert_allclose(x, ref_fedavg(cohorts, steps=(K, 1)), atol=ATOL)


def test_ditto_at_lambda_zero_is_local_training_alone():
  """lam = 0: each personal model is the client's own local SGD from w^0, round after round,
  whatever the global model does."""
  _, rows = engine(algorithms.build("ditto", lam=0.0, personal_lr=0.05), PARTIAL)
  for i in range(N):
    alone = X0.copy()
    for _ in range(sum(i in ids for ids in PARTIAL) * K):
      alone = alone - 0.05 * grad(i, alone)
    np.testing.assert_allclose(_join(rows["v"])[i], alone, atol=ATOL)


def test_ditto_serves_the_personal_model_and_the_global_one_before_a_client_took_part():
  alg = algorithms.build("ditto", lam=0.7, personal_lr=0.05)
  _, rows = engine(alg, ((1,),))
  np.testing.assert_allclose(rows["seen"], [0.0, 1.0])
  w = _split(np.array([5.0, 6.0]))
  for i, want in ((0, [5.0, 6.0]), (1, _join(rows["v"])[1])):
    params, _ = _served(alg, w, jax.tree.map(lambda a, i=i: a[i], rows))
    np.testing.assert_allclose(_join(params), want)
  assert not np.allclose(_join(rows["v"])[1], X0)


def test_ditto_personal_steps_are_the_first_of_the_round():
  x, v = ref_ditto(0.7, 0.05, FULL, personal_steps=1)
  assert not np.allclose(v, ref_ditto(0.7, 0.05, FULL)[1])
  server, rows = engine(algorithms.build("ditto", lam=0.7, personal_lr=0.05, personal_steps=1),
                        FULL)
  np.testing.assert_allclose(server, x, atol=ATOL)
  np.testing.assert_allclose(_join(rows["v"]), v, atol=ATOL)


# ---- APFL --------------------------------------------------------------------------------------
def ref_apfl(alpha0, lr_p, lr_a, cohorts, chain=True, per_leaf=False, adapt=True,
             first_download=False):
  """Deng et al. 2020, Algorithm 1, with every update from the step's starting values; alpha
  one per coordinate (the engine's two arrays) when per_leaf, else one for the model."""
  x = X0.copy()
  v = [X0.copy(), X0.copy()]
  alpha = [np.full(2, alpha0), np.full(2, alpha0)]
  seen = [False, False]
  for ids in cohorts:
    finals = []
    for i in ids:
      if first_download and not seen[i]:
        v[i] = x.copy()
      seen[i] = True
      w = x.copy()
      for _ in range(K):
        g_w = grad(i, w)
        mixed = alpha[i] * v[i] + (1 - alpha[i]) * w
        g = grad(i, mixed)
        g_alpha = (v[i] - w) * g if per_leaf else np.full(2, np.dot(v[i] - w, g))
        new_v = v[i] - lr_p * (alpha[i] * g if chain else g)
        if adapt:
          alpha[i] = np.clip(alpha[i] - lr_a * g_alpha, 0.0, 1.0)
        v[i], w = new_v, w - ETA * g_w
      finals.append(w)
    x = server_mean(x, finals)
  return x, np.stack(v), np.stack(alpha)


@pytest.mark.parametrize("options", [
    {},
    {"personal_gradient": "mixture", "alpha_granularity": "leaf",
     "personal_start": "first_download"},   # FedJAX 0.0.17's reading
    {"adapt_alpha": False, "alpha": 0.3},
], ids=["paper", "fedjax", "fixed_alpha"])
def test_apfl_matches_numpy(options):
  hp = {"alpha": 0.5, "personal_lr": 0.05, "alpha_lr": 0.2, **options}
  x, v, alpha = ref_apfl(hp["alpha"], 0.05, 0.2, PARTIAL,
                         chain=hp.get("personal_gradient", "chain") == "chain",
                         per_leaf=hp.get("alpha_granularity") == "leaf",
                         adapt=hp.get("adapt_alpha", True),
                         first_download=hp.get("personal_start") == "first_download")
  server, rows = engine(algorithms.build("apfl", **hp), PARTIAL)
  np.testing.assert_allclose(server, x, atol=ATOL)
  np.testing.assert_allclose(_join(rows["v"]), v, atol=ATOL)
  np.testing.assert_allclose(np.stack([rows["alpha"]["a"], rows["alpha"]["b"]], -1), alpha,
                             atol=ATOL)
  np.testing.assert_allclose(rows["seen"], [1.0, 1.0])
  if hp.get("adapt_alpha", True):
    assert not np.allclose(alpha, hp["alpha"])
  if hp.get("alpha_granularity") == "leaf":
    assert not np.allclose(alpha[:, 0], alpha[:, 1])  # the two arrays' alphas differ


def test_apfl_personal_model_is_the_mixture_and_unseen_clients_get_the_global_model():
  alg = algorithms.build("apfl", alpha=0.5)
  w = {"a": jnp.array([1.0]), "b": jnp.array([2.0])}
  row = {"v": {"a": jnp.array([3.0]), "b": jnp.array([0.0])},
         "alpha": {"a": jnp.array(0.25), "b": jnp.array(0.5)}, "seen": jnp.array(1.0)}
  params, state = _served(alg, w, row, {"s": 1})
  assert state == {"s": 1}
  np.testing.assert_allclose(_join(params), [0.25 * 3 + 0.75 * 1, 0.5 * 0 + 0.5 * 2])
  params, _ = _served(alg, w, {**row, "seen": jnp.array(0.0)})
  np.testing.assert_allclose(_join(params), [1.0, 2.0])


# ---- pFedMe ------------------------------------------------------------------------------------
def ref_pfedme(lam, lr_p, inner, beta, cohorts):
  """Dinh et al. 2020, Algorithm 1: theta~ by `inner` steps on f_i(theta) + lam/2 ||theta - w||^2
  (theta warm-started from the round's start), w <- w - lr lam (w - theta~); server beta-mixing."""
  x, thetas = X0.copy(), [X0.copy(), X0.copy()]
  for ids in cohorts:
    finals = []
    for i in ids:
      w, theta = x.copy(), x.copy()
      for _ in range(K):
        for _ in range(inner):
          theta = theta - lr_p * (grad(i, theta) + lam * (theta - w))
        w = w - ETA * lam * (w - theta)
      thetas[i] = theta
      finals.append(w)
    x = server_mean(x, finals, beta)
  return x, np.stack(thetas)


@pytest.mark.parametrize("beta", [1.0, 2.0])
def test_pfedme_matches_numpy(beta):
  x, theta = ref_pfedme(2.0, 0.05, 3, beta, PARTIAL)
  alg = algorithms.build("pfedme", Common(server_lr=beta), lam=2.0, personal_lr=0.05,
                         inner_steps=3)
  server, rows = engine(alg, PARTIAL)
  np.testing.assert_allclose(server, x, atol=ATOL)
  np.testing.assert_allclose(_join(rows["theta"]), theta, atol=ATOL)
  params, _ = _served(alg, _split(np.zeros(2)), jax.tree.map(lambda a: a[1], rows))
  np.testing.assert_allclose(_join(params), theta[1], atol=ATOL)
  unseen = {**jax.tree.map(lambda a: a[1], rows), "seen": np.float32(0)}
  np.testing.assert_allclose(_join(_served(alg, _split(np.ones(2)), unseen)[0]),
                             np.ones(2))


# ---- Per-FedAvg --------------------------------------------------------------------------------
def ref_perfedavg(alpha, hessian_free, cohorts):
  """Fallah et al. 2020, Algorithm 1 with D = D' = D'' the full batch: w <- w - lr (I - alpha H)
  grad f(w - alpha grad f(w)); (FO) without the Hessian term."""
  x = X0.copy()
  for ids in cohorts:
    finals = []
    for i in ids:
      w = x.copy()
      for _ in range(K):
        g = grad(i, w - alpha * grad(i, w))
        if hessian_free:
          g = g - alpha * hessian(i) @ g
        w = w - ETA * g
      finals.append(w)
    x = server_mean(x, finals)
  return x


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_perfedavg_matches_numpy(variant):
  x = ref_perfedavg(0.3, variant == "hf", PARTIAL)
  assert not np.allclose(x, ref_perfedavg(0.3, variant != "hf", PARTIAL))
  server, _ = engine(algorithms.build("perfedavg", alpha=0.3, variant=variant), PARTIAL)
  np.testing.assert_allclose(server, x, atol=ATOL)
  assert algorithms.build("perfedavg").personal is None  # fine-tuning serves its clients


# ---- reductions bit for bit, on a network in float32 ------------------------------------------
def _bits(tree):
  return [np.asarray(x).tobytes() for x in jax.tree.leaves(tree)]


@functools.lru_cache(maxsize=None)
def _fedavg_round():
  _, padded = contract._padded_variant()
  return contract._engine_round(algorithms.build("fedavg", Common(local_momentum=0.9)),
                                [padded, padded])


@pytest.mark.parametrize("name,hparams", [
    ("ditto", {"lam": 0.5}),
    pytest.param("ditto", {"lam": 0.0, "personal_steps": 1}, marks=pytest.mark.slow),
    ("apfl", {"alpha": 0.0, "adapt_alpha": False}),
])
def test_global_model_is_fedavg_bit_for_bit(name, hparams):
  """Ditto's global model, and APFL's with alpha fixed at 0, are FedAvg's (local momentum 0.9,
  padded clients, steps and examples)."""
  common = Common(local_momentum=0.9)
  _, padded = contract._padded_variant()
  want_server, _ = _fedavg_round()
  got_server, rows = contract._engine_round(algorithms.build(name, common, **hparams),
                                            [padded, padded])
  assert _bits((got_server.params, got_server.opt_state)) == _bits(
      (want_server.params, want_server.opt_state))
  if name == "apfl":  # alpha = 0: the local models never move from w^0
    params = got_server.params
    initial = _bits(jax.tree.map(lambda a: a[0], rows["v"]))
    assert initial != _bits(params)
    assert all(_bits(jax.tree.map(lambda a, k=k: a[k], rows["v"])) == initial
               for k in range(8))


# ---- rows on the host and on the device, resumed -----------------------------------------------
NAMES = ("ditto", "apfl", "pfedme")


@pytest.fixture(scope="module")
def placed(tmp_path_factory):
  cache = {}

  def get(name, on_host):
    if (name, on_host) not in cache:
      config = contract.config_for(name, active_ratio=0.25, rounds=3,
                                   **{"engine.client_state_on_host": on_host})
      cache[name, on_host] = contract._run_resumed(config, tmp_path_factory.mktemp(name))
    return cache[name, on_host]

  return get


@pytest.mark.parametrize("name", contract._core_first(NAMES, core=("ditto",)))
def test_personal_rows_resume_exactly_on_host_and_device(placed, name):
  host, device = placed(name, True), placed(name, False)
  assert contract._bits(host["resumed"]) == contract._bits(host["straight"])
  assert contract._bits(device["resumed"]) == contract._bits(device["straight"])
  assert contract._bits(host["straight"]) == contract._bits(device["straight"])
  assert isinstance(jax.tree.leaves(host["program"].store.rows)[0], np.ndarray)


def test_bad_hyper_parameters_are_named():
  for name, field, value in (("ditto", "lam", -1.0), ("ditto", "personal_steps", 1.5),
                             ("apfl", "alpha", 1.5), ("apfl", "alpha_granularity", "layer"),
                             ("pfedme", "inner_steps", 0), ("perfedavg", "variant", "full")):
    with pytest.raises(ValueError, match=rf"{field}={value!r} is not accepted"):
      algorithms.build(name, **{field: value})
  config = contract.config_for("apfl")
  config.apfl.personal_gradient = "both"
  with pytest.raises(ValueError, match=r"apfl\.personal_gradient"):
    training.build_algorithm(config, num_clients=8)


@pytest.mark.parametrize("name", contract._core_first(NAMES, core=("ditto",)))
def test_serve_vmaps_over_a_runs_store(placed, name):
  """`serve` over every row of a run's store at once (per-client evaluation's use): the
  clients that trained get their own model, the others the evaluated global model."""
  run = placed(name, False)
  program = run["program"]
  params, rows = run["straight"][0].params, run["straight"][1]
  alg = training.build_algorithm(contract.config_for(name), num_clients=8)
  personal, _ = jax.vmap(lambda row: _served(alg, params, row))(rows)
  sampled = np.asarray(run["sampled"])
  never = np.setdiff1d(np.arange(program.store.num_clients), sampled)
  assert len(never) and len(sampled)
  for got, w in zip(jax.tree.leaves(personal), jax.tree.leaves(params)):
    assert got.shape == (program.store.num_clients,) + w.shape
    np.testing.assert_array_equal(got[never], np.broadcast_to(w, got[never].shape))
    assert not np.allclose(got[sampled], np.broadcast_to(w, got[sampled].shape))
