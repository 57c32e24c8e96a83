"""FedSpeed (Sun et al., ICLR 2023): reductions to FedAvg and FedDyn, the closed form of
the upload, a local step and server rules worked by hand, persistence of the controllers, the static
skip of the second gradient, config errors and an end-to-end run.

Worked numbers are written here literally (float64 values of a numpy computation of
Algorithm 1 by hand); float32 results are compared at rtol 1e-5, atol 1e-6.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import default
from fedjax_lama import algorithms, training
from fedjax_lama.algorithms import Common, fedspeed
from fedjax_lama.config import ConfigError, base_config, validate
from fedjax_lama.engine import local, reduce
from fedjax_lama.engine import aggregation, clients as clients_lib, cohort as cohort_lib
from fedjax_lama.engine.algorithm import ClientContext, ClientInfo, LocalState
from fedjax_lama.errors import HparamError
from tests.test_algorithm_reference import engine, least_squares_loss

RTOL, ATOL = 1e-5, 1e-6


def build(common=Common(), **hparams):
  return algorithms.build("fedspeed", common, **hparams)


def bits(tree):
  return [np.asarray(x).tobytes() for x in jax.tree.leaves(tree)]


# ---- reductions --------------------------------------------------------------------------------
@pytest.mark.parametrize("hparams", [{"rho": 0.0}, {"alpha": 0.0}])
def test_no_perturbation_and_prox_off_is_fedavg_bitwise(hparams):
  common = Common(weight_decay=0.01)
  for participants in (((0, 1),) * 3, ((0, 1), (1,), (0,))):
    got = engine(build(common, prox_correction=False, **hparams), 3, participants=participants)[0]
    want = engine(algorithms.build("fedavg", common), 3, participants=participants)[0]
    assert bits(got.params) == bits(want.params)


@pytest.mark.slow
def test_rho_zero_all_clients_is_the_projects_feddyn():
  """2.2, last paragraph: FedDyn with alpha = 1/lam (uniform weights) under partial
  participation. clip_mode="none" is bitwise. clip_mode="reference" regroups the same
  terms as (g - g_hat - x/lam) + y/lam, so it agrees to rounding while the clip is inactive
  and differs once it clips: the project's FedDyn has no clip (the reference code's FedDyn
  clips the same way, so equality with THAT FedDyn would hold)."""
  lam, cohorts = 10.0, ((0, 1), (1,), (0,), (0, 1))
  kw = dict(rho=0.0, lam=lam, server_average="all_clients")
  dyn_server, dyn_rows = engine(algorithms.build("feddyn", alpha=1.0 / lam), 4,
                                participants=cohorts)
  server, rows = engine(build(**kw), 4, participants=cohorts)
  assert bits(server.params) == bits(dyn_server.params)
  assert bits(rows) == bits(dyn_rows)
  assert bits(server.extra["g_hat_mean"]) == bits(dyn_server.extra["h"])
  loose, _ = engine(build(clip_mode="reference", clip_norm=1e9, **kw), 4, participants=cohorts)
  np.testing.assert_allclose(loose.params["w"], dyn_server.params["w"], rtol=0, atol=1e-12)
  tight, _ = engine(build(clip_mode="reference", clip_norm=0.1, **kw), 4, participants=cohorts)
  assert not np.allclose(tight.params["w"], dyn_server.params["w"])


# ---- the upload's closed form: x_hat_i = y_K + h_i -----------------------------------------------
M, D, ROWS, STEPS, BATCH = 5, 3, 4, 3, 2


def run_partial_rounds(alg, cohorts, seed=0):
  """Rounds through engine/sync_round.py's client phase and reductions (float32, uniform weights),
  recording what the server sees. Returns [(x, ids, y_K, upload, rows, new_server)]."""
  rng = np.random.default_rng(seed)
  data_x = jnp.asarray(rng.normal(size=(M * ROWS, D)), jnp.float32)
  data_y = jnp.asarray(rng.normal(size=(M * ROWS,)), jnp.float32)
  phase = clients_lib.ClientPhase(least_squares_loss, alg, optax.constant_schedule(0.05))

  @jax.jit
  def one_round(server, rows, cohort, keys, r):
    ctx = clients_lib.client_contexts(alg.shared(server), rows, cohort)
    state = clients_lib.fresh_states(alg, ctx, server.model_state, cohort.indices.shape[0])
    final, stats = phase.train(state, ctx, data_x, data_y, cohort, keys, r * STEPS)
    info = phase.info(stats, cohort, r * STEPS)
    uploads, new_rows = phase.finish(final, ctx, info)
    weights = reduce.client_weights(cohort.client_mask, cohort.num_examples, "uniform")
    sums = aggregation.reduce_uploads(alg, uploads, info, final.model_state, weights,
                                    cohort.client_mask)
    new = alg.server.update(server, aggregation.aggregates(alg, sums, M))
    return final.params, uploads, new_rows, new

  params = {"w": jnp.asarray(rng.normal(size=D), jnp.float32)}
  server = alg.server.init(params, {})
  store = jax.tree.map(lambda r: jnp.stack([r] * M), alg.row_init(params))
  records = []
  for r, ids in enumerate(cohorts):
    ids = np.asarray(ids)
    idx = np.stack([[ROWS * i + rng.choice(ROWS, BATCH, replace=False) for _ in range(STEPS)]
                    for i in ids])
    c = len(ids)
    cohort = cohort_lib.Cohort(jnp.asarray(idx, jnp.int32), jnp.ones(idx.shape),
                              jnp.ones((c, STEPS)), jnp.ones(c), jnp.asarray(ids, jnp.int32),
                              jnp.full(c, float(ROWS)))
    keys = jax.random.split(jax.random.PRNGKey(r), c)
    rows = cohort_lib.gather_rows(store, jnp.asarray(ids))
    y_k, uploads, new_rows, new = one_round(server, rows, cohort, keys, r)
    store = cohort_lib.scatter_rows(store, jnp.asarray(ids), jnp.ones(c), new_rows)
    records.append((np.asarray(server.params["w"], np.float64), ids,
                    np.asarray(y_k["w"], np.float64), uploads, store, new))
    server = new
  return records


@pytest.mark.parametrize("mode", ["active", "all_clients"])
def test_closed_form_of_the_upload_under_partial_participation(mode):
  lam = 2.0
  cohorts = [np.random.default_rng(7 + r).choice(M, 2, replace=False) for r in range(6)]
  alg = build(rho=0.05, alpha=0.5, lam=lam, server_average=mode)
  h = np.zeros((M, D))  # running sum of each client's own displacements, built here
  prev_rows = None
  for x, ids, y_k, uploads, store, server in run_partial_rounds(alg, cohorts):
    for slot, i in enumerate(ids):
      h[i] += y_k[slot] - x
    rows = np.asarray(store["w"])
    np.testing.assert_allclose(rows, -h / lam, rtol=RTOL, atol=ATOL)  # g_hat_i = -h_i / lam
    if mode == "active":
      x_hat = x + np.asarray(uploads["x_hat_delta"]["w"], np.float64)
      np.testing.assert_allclose(x_hat, y_k + h[ids], rtol=RTOL, atol=ATOL)
      want = np.mean(y_k + h[ids], axis=0)
    else:
      np.testing.assert_allclose(uploads["delta"]["w"], y_k - x, rtol=RTOL, atol=ATOL)
      want = np.mean(y_k, axis=0) + np.mean(h, axis=0)  # all M clients, never-sampled at 0
      np.testing.assert_allclose(server.extra["g_hat_mean"]["w"], rows.mean(0), atol=ATOL)
    np.testing.assert_allclose(server.params["w"], want, rtol=RTOL, atol=ATOL)
    if prev_rows is not None:  # skipped clients keep their controller bit for bit
      skipped = np.setdiff1d(np.arange(M), ids)
      assert rows[skipped].tobytes() == prev_rows[skipped].tobytes()
    prev_rows = rows


def test_upload_map_is_independent_of_lambda():
  """One synthetic sequence of (x^s, y_K^s), active in some rounds, through lines 13-14."""
  rng = np.random.default_rng(3)
  seq = [(rng.normal(size=2), rng.normal(size=2), active) for active in (1, 0, 1, 1, 0, 1)]
  info = ClientInfo(1.0, 0.1, 0.1, 1.0, 0)
  with jax.enable_x64(True):
    sent = []
    for lam in (10.0, 0.37):
      alg, row, ups = build(lam=lam), {"w": jnp.zeros(2)}, []
      for x, y, active in seq:
        if not active:
          continue  # line 13 runs only for active clients
        ctx = ClientContext({"params": {"w": jnp.asarray(x)}}, row, 1.0, 0)
        uploads, row = alg.finish(LocalState({"w": jnp.asarray(y)}, {}, ()), ctx, info)
        ups.append(np.asarray(uploads["x_hat_delta"]["w"]) + x)
      sent.append(np.stack(ups))
  np.testing.assert_allclose(sent[0], sent[1], rtol=0, atol=1e-12)
  h = np.cumsum([y - x for x, y, active in seq if active], axis=0)
  np.testing.assert_allclose(sent[0], np.stack([y for _, y, a in seq if a]) + h, atol=1e-12)


# ---- a local step and the server worked by hand --------------------------------------------------
A63, B63 = np.array([[1.0, 2.0], [-1.0, 0.5]]), np.array([1.0, -0.5])
X_SRV, X_K, G_HAT = np.array([0.2, -0.1]), np.array([0.3, 0.1]), np.array([0.05, -0.02])


def mean_least_squares(params, model_state, x, y, example_mask, key):
  """F = 1/(2n) sum_j (a_j . x - b_j)^2, the mean loss of the worked step."""
  del key
  r = x @ params["w"] - y
  return 0.5 * jnp.sum(example_mask * r * r) / jnp.sum(example_mask), (model_state, 0.0)


def worked_step(alg, row=G_HAT):
  """One engine step (make_client_train's scan) from x_{i,k} with x^t downloaded, then finish."""
  params = {"w": jnp.asarray(X_K, jnp.float32)}
  train = local.make_client_train(mean_least_squares, alg, optax.constant_schedule(0.1))
  ctx = ClientContext({"params": {"w": jnp.asarray(X_SRV, jnp.float32)}},
                      {"w": jnp.asarray(row, jnp.float32)} if alg.row_init else {},
                      jnp.float32(2), jnp.int32(0))
  state = LocalState(params, {}, alg.local.tx.init(params))
  final, _ = train(state, ctx, jnp.asarray(A63, jnp.float32), jnp.asarray(B63, jnp.float32),
                   local.ClientBatch(jnp.array([[0, 1]]), jnp.ones((1, 2)), jnp.ones(1),
                                     jax.random.PRNGKey(0)), 0)
  uploads, new_row = alg.finish(final, ctx, ClientInfo(1.0, 0.1, 0.1, 2.0, 0))
  return np.asarray(final.params["w"]), uploads, new_row


def test_worked_local_step_matches_the_hand_computation():
  y, uploads, row = worked_step(build(rho=0.1, alpha=0.75, lam=10.0))
  np.testing.assert_allclose(y, [0.3506517521, 0.1555113508], rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(row["w"], [0.0349348248, -0.0455511351], rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(X_SRV + uploads["x_hat_delta"]["w"], [0.0013035042, 0.6110227017],
                             rtol=RTOL, atol=ATOL)
  y, _, _ = worked_step(build(rho=0.1, alpha=0.75, lam=10.0, rho_normalize=False))
  np.testing.assert_allclose(y, [0.3467734375, 0.14883203125], rtol=RTOL, atol=ATOL)
  y, uploads, _ = worked_step(build(rho=0.0, prox_correction=False))
  np.testing.assert_allclose(y, [0.3375, 0.14375], rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(X_SRV + uploads["delta"]["w"], [0.3375, 0.14375], rtol=RTOL)


def test_perturbation_norm_is_one_norm_over_all_leaves():
  """The worked step's g~ with the two coordinates in two leaves (per-leaf norms would change
  it)."""
  a, b = jnp.asarray(A63, jnp.float32), jnp.asarray(B63, jnp.float32)

  def loss(p):
    r = a @ jnp.concatenate([p["u"], p["v"]]) - b
    return 0.5 * jnp.mean(r * r), None

  params = {"u": jnp.array([0.3]), "v": jnp.array([0.1])}
  _, g, _ = build(rho=0.1, alpha=0.75).grad(jax.value_and_grad(loss, has_aux=True), params,
                                            None, ())
  np.testing.assert_allclose([g["u"][0], g["v"][0]], [-0.4665175210, -0.5951135084],
                             rtol=RTOL, atol=ATOL)


def test_reference_clip_order_on_the_worked_step():
  """The reference code's clip order: clip u = g~ - g_hat - x^t/lam by min(1, c / (||u|| + 1e-6));
  (w + 1/lam) y unclipped."""
  g_quasi = np.array([-0.4665175210, -0.5951135084])  # 6.3's table
  u = g_quasi - G_HAT - X_SRV / 10.0
  wd, hp = 0.01, dict(rho=0.1, alpha=0.75, lam=10.0, clip_mode="reference")
  for c in (1e3, 0.5):  # inactive, then active (||u|| = 0.78)
    want = X_K - 0.1 * (u * min(1.0, c / (np.linalg.norm(u) + 1e-6)) + (wd + 0.1) * X_K)
    y, _, _ = worked_step(build(Common(weight_decay=wd), clip_norm=c, **hp))
    np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL)
  # Prox-correction off in reference mode clips g~ alone (the reference FedAvg-style client).
  y, _, _ = worked_step(build(rho=0.0, prox_correction=False, clip_mode="reference",
                              clip_norm=0.1))
  g1 = np.array([-0.375, -0.4375])
  np.testing.assert_allclose(y, X_K - 0.1 * g1 * 0.1 / (np.linalg.norm(g1) + 1e-6),
                             rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mode,want", [("active", [0.0006517521, 0.2055113508]),
                                       ("all_clients", [0.1755431268, 0.0295927924])])
def test_server_rule_with_one_client_absent(mode, want):
  """m = 3, active {0, 2}; client 0 is the worked client, client 1 absent (h_1 unchanged)."""
  lam = 10.0
  alg = build(lam=lam, server_average=mode)
  h_prev = np.array([[-0.5, 0.2], [0.3, -0.3], [0.0, 0.1]])
  store = {"w": jnp.asarray(-h_prev / lam, jnp.float32)}  # g_hat_j = -h_j / lam
  ids, x_k = jnp.array([0, 2]), np.array([[0.3506517521, 0.1555113508], [0.1, -0.2]])
  x = {"w": jnp.asarray(X_SRV, jnp.float32)}
  server = alg.server.init(x, {})
  if mode == "all_clients":  # the server's running mean of the controllers before this round
    server = server._replace(extra={"g_hat_mean": {"w": store["w"].mean(0)}})
  ctx = ClientContext(alg.shared(server), cohort_lib.gather_rows(store, ids),
                      jnp.full(2, 2.0), ids)
  info = ClientInfo(jnp.ones(2), jnp.full(2, 0.1), jnp.full(2, 0.1), jnp.full(2, 2.0), ids)
  final = LocalState({"w": jnp.asarray(x_k, jnp.float32)}, {}, ())
  uploads, rows = jax.vmap(alg.finish, in_axes=(0, local.context_axes(), 0))(final, ctx, info)
  store = cohort_lib.scatter_rows(store, ids, jnp.ones(2), rows)
  sums = aggregation.reduce_uploads(alg, uploads, info, {}, jnp.ones(2), jnp.ones(2))
  new = alg.server.update(server, aggregation.aggregates(alg, sums, 3))
  np.testing.assert_allclose(new.params["w"], want, rtol=RTOL, atol=ATOL)
  h_new = -lam * np.asarray(store["w"], np.float64)
  np.testing.assert_allclose(h_new, [[-0.3493482479, 0.4555113508], [0.3, -0.3], [-0.1, 0.0]],
                             rtol=RTOL, atol=ATOL)
  assert np.asarray(store["w"][1]).tobytes() == np.float32(-h_prev[1] / lam).tobytes()


def test_controller_is_unchanged_by_skipped_rounds():
  alg = build()
  _, after_first = engine(alg, 1)
  _, later = engine(alg, 3, participants=((0, 1), (1,), (1,)))
  assert later["w"][0].tobytes() == after_first["w"][0].tobytes()
  assert later["w"][1].tobytes() != after_first["w"][1].tobytes()


# ---- static skip of the second gradient --------------------------------------------------------
@pytest.mark.parametrize("hparams,passes", [({}, 2), ({"rho": 0.0}, 1), ({"alpha": 0.0}, 1),
                                            ({"alpha": 0.5}, 2)])
def test_second_gradient_only_when_it_is_used(hparams, passes):
  traced = []

  def loss(params, model_state, x, y, example_mask, key):
    traced.append(1)  # once per gradient evaluation in the traced scan step
    return mean_least_squares(params, model_state, x, y, example_mask, key)

  alg = build(**hparams)
  train = local.make_client_train(loss, alg, optax.constant_schedule(0.1))
  params = {"w": jnp.zeros(2)}
  ctx = ClientContext({"params": params}, alg.row_init(params), jnp.float32(2), jnp.int32(0))
  jax.eval_shape(train, LocalState(params, {}, alg.local.tx.init(params)), ctx,
                 jnp.asarray(A63, jnp.float32), jnp.asarray(B63, jnp.float32),
                 local.ClientBatch(jnp.zeros((3, 2), jnp.int32), jnp.ones((3, 2)), jnp.ones(3),
                                   jax.random.PRNGKey(0)), 0)
  assert len(traced) == passes


# ---- config ------------------------------------------------------------------------------------
@pytest.mark.parametrize("field,value", [
    ("rho", -0.1), ("perturb_eps", 0.0), ("alpha", 1.5), ("lam", 0.0), ("lam", float("inf")),
    ("server_average", "all"), ("clip_mode", "torch"), ("clip_norm", 0.0),
    ("lamb", 0.1)])  # the reference code's name (1/lam) is not a field
def test_bad_fedspeed_values_name_the_field(field, value):
  c = base_config()
  c.algorithm = "fedspeed"
  c.fedspeed[field] = value
  with pytest.raises(ConfigError, match=f"config.fedspeed.{field}"):
    validate(c)


@pytest.mark.parametrize("field", ["rho_normalize", "prox_correction"])
def test_switches_must_be_booleans(field):
  """A ConfigDict refuses a str for a bool field itself; the Hparams check covers other callers."""
  with pytest.raises(HparamError, match=field):
    fedspeed.Hparams(**{field: "yes"})


def test_config_defaults_follow_the_reference_code():
  c = base_config()
  assert c.fedspeed.to_dict() == dict(
      rho=0.1, rho_normalize=True, perturb_eps=1e-7, alpha=1.0, lam=10.0, prox_correction=True,
      server_average="active", clip_mode="none", clip_norm=10.0)


# ---- end to end --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["active", "all_clients"])
@pytest.mark.slow
def test_end_to_end_run_sends_one_model_each_way(tmp_path, mode):
  c = default.get_config()
  c.algorithm = "fedspeed"
  c.fedspeed.server_average = mode
  c.update_from_flattened_dict({"rounds": 2, "local_steps": 3, "num_clients": 8,
                                "active_ratio": 0.5, "eval_every": 1, "checkpoint_every": 2,
                                "plots": False, "local_lr_decay": "exponential",
                                "local_lr_decay_factor": 0.998})
  summary = training.train_and_evaluate(c, str(tmp_path))
  assert np.isfinite(summary["final_test_accuracy"])
  assert summary["comm_floats_up"] == 2 * 4 * summary["num_parameters"]
  assert summary["comm_floats_down"] == 2 * 4 * summary["num_parameters"]
