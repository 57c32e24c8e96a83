"""Fed-LAMB and Fed-AMS (Karimi, Li, Li, 2021, Algorithm 1): optax equivalences, invariants,
the zero-norm rule, the server's v_hat, a local step worked by hand, masked steps,
communication and config errors.

Most checks run the engine's own round functions (engine/sync_round.py) in float64 on a linear
least-squares model with two tensors (W [3, 2], b [2]); each client has 4 rows and step k
uses rows 2 (k mod 2) and 2 (k mod 2) + 1 of them.
"""
import tempfile

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from fedjax_lama import algorithms, models, training
from fedjax_lama import config as config_lib
from fedjax_lama.algorithms import Common
from fedjax_lama.engine import (aggregation, clients as clients_lib, cohort as cohort_lib, local,
                                sync_round, traffic as traffic_lib)
from fedjax_lama.engine.algorithm import ClientContext
from fedjax_lama.errors import ConfigError

ROWS, LR, N = 4, 0.01, 3
RNG = np.random.default_rng(0)
X = RNG.normal(size=(N * ROWS, 3))
Y = RNG.normal(size=(N * ROWS, 2))
PARAMS0 = {"W": RNG.normal(size=(3, 2)), "b": RNG.normal(size=2)}


def loss_fn(params, model_state, x, y, example_mask, key):
  del key
  r = x @ params["W"] + params["b"] - y
  return 0.5 * jnp.sum(example_mask[:, None] * r * r), (model_state, jnp.zeros(()))


def rows(client, step):
  return client * ROWS + 2 * (step % 2) + np.arange(2)


def cohort(ids, steps, max_steps, client_mask=None):
  """ids: client ids; steps[j]: real steps of slot j (the rest are padded)."""
  idx = np.stack([np.stack([rows(i, k) for k in range(max_steps)]) for i in ids])
  step_mask = np.array([[1.0 if k < s else 0.0 for k in range(max_steps)] for s in steps])
  mask = np.ones(len(ids)) if client_mask is None else np.asarray(client_mask, float)
  return cohort_lib.Cohort(jnp.asarray(idx, jnp.int32), jnp.ones(idx.shape), jnp.asarray(step_mask),
                          jnp.asarray(mask), jnp.asarray(ids, jnp.int32),
                          jnp.full(len(ids), float(ROWS)))


def build(name, common=Common(), **hp):
  return algorithms.build(name, common, **hp)


class Engine:
  """The engine's jitted round of `alg` (call inside jax.enable_x64)."""

  def __init__(self, alg, max_steps, lr=LR):
    self.alg, self.max_steps = alg, max_steps
    self.train_chunk, self.update = sync_round.make_round_fns(
        loss_fn, alg, optax.constant_schedule(lr), seed=0, weighting="uniform",
        local_steps=max_steps, population=N)
    self.server = alg.server.init(jax.tree.map(jnp.asarray, PARAMS0), {})
    template = alg.row_init(PARAMS0) if alg.row_init is not None else {}
    self.store = jax.tree.map(lambda r: jnp.stack([r] * N), template)

  def chunk(self, ids, steps, client_mask=None, server=None, store=None):
    c = cohort(ids, steps, self.max_steps, client_mask)
    store = self.store if store is None else store
    got = cohort_lib.gather_rows(store, c.client_ids) if store else {}
    return self.train_chunk(self.server if server is None else server, got, X, Y, c, 0), c

  def round(self, ids, steps, client_mask=None):
    (sums, new_rows, _), c = self.chunk(ids, steps, client_mask)
    if self.store:
      self.store = cohort_lib.scatter_rows(self.store, c.client_ids, c.client_mask, new_rows)
    self.server = self.update(self.server, sums)
    return sums


def optax_local(tx, params, client, steps, state=None):
  """The same client's steps with an optax optimizer run directly."""
  state = tx.init(params) if state is None else state
  for k in range(steps):
    r = rows(client, k)
    g = jax.grad(lambda p: loss_fn(p, {}, X[r], Y[r], jnp.ones(2), None)[0])(params)
    updates, state = tx.update(g, state, params)
    params = optax.apply_updates(params, updates)
  return params, state


def eng_params(params):
  return jax.tree.map(jnp.asarray, params)


def close(a, b, **kw):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, **kw), a, b)


# ---- optax equivalences (one client, full participation, one round) ---------
@pytest.mark.parametrize("m_bc, v_bc", [(True, True), (True, False), (False, True),
                                        (False, False)])
def test_fedams_equals_optax_amsgrad(m_bc, v_bc):
  with jax.enable_x64(True):
    eng = Engine(build("fedams", v_init=0.0, m_bias_correction=m_bc, v_bias_correction=v_bc), 6)
    eng.round([1], [6])
    tx = optax.amsgrad(LR, bias_correction_mu=m_bc, bias_correction_nu=v_bc)
    want, state = optax_local(tx, PARAMS0, 1, 6)
    close(eng.server.params, want, rtol=1e-14, atol=1e-15)
    close(eng.server.extra["v_hat"], state[0].nu, rtol=1e-14, atol=0)  # max(0, v) = v


@pytest.mark.parametrize("lam", [0.0, 0.1])
def test_fedlamb_equals_the_optax_chain(lam):
  with jax.enable_x64(True):
    eng = Engine(build("fedlamb", v_init=0.0, lam=lam), 6)
    eng.round([2], [6])
    tx = optax.chain(optax.scale_by_amsgrad(bias_correction_nu=False),
                     optax.add_decayed_weights(lam), optax.scale_by_trust_ratio(),
                     optax.scale_by_learning_rate(LR))
    want, state = optax_local(tx, PARAMS0, 2, 6)
    close(eng.server.params, want, rtol=1e-14, atol=1e-15)
    close(eng.server.extra["v_hat"], state[0].nu, rtol=1e-14, atol=0)


@pytest.mark.parametrize("lam", [0.0, 0.1])
def test_fedlamb_first_step_equals_optax_lamb(lam):
  with jax.enable_x64(True):
    eng = Engine(build("fedlamb", v_init=0.0, v_bias_correction=True, lam=lam), 1)
    eng.round([0], [1])
    want, _ = optax_local(optax.lamb(LR, eps=1e-8, weight_decay=lam), PARAMS0, 0, 1)
    close(eng.server.params, want, rtol=1e-14, atol=1e-15)


# ---- step length and zero norms, on the local transform -------- -----------
def local_step(alg, params, grads, v_hat, lr=LR):
  """One local step from a fresh round state: (step subtracted from params, new opt state)."""
  ctx = ClientContext({"params": params, "v_hat": v_hat}, {}, jnp.ones(()), jnp.zeros((), int))
  direction, state = alg.local.tx.update(grads, alg.local.init_state(ctx), params)
  return jax.tree.map(lambda d: lr * d, direction), state


def norms(tree):
  return {k: float(np.linalg.norm(np.ravel(v))) for k, v in tree.items()}


@pytest.mark.parametrize("lam", [0.0, 0.1])
def test_step_length_is_alpha_phi_of_the_weight_norm(lam):
  rng = np.random.default_rng(1)
  # norms ~ 20 (above phi_max), ~ 1, ~ 2e-3 (below phi_min)
  params = {"big": 10 * rng.normal(size=(2, 2)), "mid": rng.normal(size=(3,)) / 1.5,
            "tiny": 1e-3 * rng.normal(size=(2, 3))}
  a = norms(params)
  assert a["big"] > 5 and 0.1 < a["mid"] < 5 and a["tiny"] < 0.01
  with jax.enable_x64(True):
    for _ in range(3):  # a few random gradients and v_hat
      grads = jax.tree.map(lambda p: rng.normal(size=p.shape), params)
      v_hat = jax.tree.map(lambda p: rng.uniform(0, 1e-2, size=p.shape), params)
      step, _ = local_step(build("fedlamb", lam=lam), params, grads, v_hat)
      for k, n in norms(step).items():
        assert n == pytest.approx(LR * a[k], rel=1e-12)
      step, _ = local_step(build("fedlamb", lam=lam, phi="clip", phi_min=0.05, phi_max=5.0),
                           params, grads, v_hat)
      got = norms(step)
      assert got["big"] == pytest.approx(LR * 5.0, rel=1e-12)
      assert got["mid"] == pytest.approx(LR * a["mid"], rel=1e-12)
      assert got["tiny"] == pytest.approx(LR * 0.05, rel=1e-12)


def test_zero_norm_rules():
  params = {"w": np.array([[0.5, -0.3], [0.2, 0.4]]), "zero": np.zeros(2)}
  grads = {"w": np.array([[0.1, 0.2], [-0.1, 0.0]]), "zero": np.array([0.01, -0.04])}
  v_hat = jax.tree.map(lambda p: np.full(p.shape, 1e-4), params)
  with jax.enable_x64(True):
    ams, _ = local_step(build("fedams", v_init=1e-4), params, grads, v_hat)  # alpha p
    unit, _ = local_step(build("fedlamb", lam=0.1), params, grads, v_hat)
    np.testing.assert_array_equal(unit["zero"], ams["zero"])  # u = p since theta = 0: alpha p
    skip, _ = local_step(build("fedlamb", lam=0.1, zero_norm="skip"), params, grads, v_hat)
    np.testing.assert_array_equal(skip["zero"], 0.0)
    np.testing.assert_allclose(skip["w"], unit["w"], rtol=0, atol=0)  # regular layers agree
    clip, _ = local_step(build("fedlamb", phi="clip", phi_min=0.05), params, grads, v_hat)
    assert norms(clip)["zero"] == pytest.approx(LR * 0.05, rel=1e-12)
    no_grad = {"w": grads["w"], "zero": np.zeros(2)}  # theta = 0 and g = 0: u = 0
    for hp in ({}, {"zero_norm": "skip"}, {"phi": "clip", "phi_min": 0.05}):
      step, state = local_step(build("fedlamb", **hp), params, no_grad, v_hat)
      np.testing.assert_array_equal(step["zero"], 0.0)
      assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves((step, state)))


def test_lam_mask_and_the_shared_weight_decay():
  """lam_mask="exclude_1d" keeps lambda out of 1-d tensors; the shared additive
  weight_decay is L2 in the gradient, so it enters m and v."""
  params = {"w": np.array([[0.5, -0.3], [0.2, 0.4]]), "b": np.array([0.1, -0.2])}
  grads = {"w": np.array([[0.1, 0.2], [-0.1, 0.05]]), "b": np.array([0.01, -0.04])}
  v_hat = jax.tree.map(lambda p: np.full(p.shape, 1e-4), params)
  with jax.enable_x64(True):
    masked, _ = local_step(build("fedlamb", lam=0.1, lam_mask="exclude_1d"), params, grads, v_hat)
    every, _ = local_step(build("fedlamb", lam=0.1), params, grads, v_hat)
    plain, _ = local_step(build("fedlamb"), params, grads, v_hat)
    np.testing.assert_array_equal(masked["w"], every["w"])
    np.testing.assert_array_equal(masked["b"], plain["b"])
    assert not np.allclose(every["b"], plain["b"])
    l2 = jax.tree.map(lambda g, p: g + 0.1 * p, grads, params)
    for name in ("fedams", "fedlamb"):
      decayed, _ = local_step(build(name, Common(weight_decay=0.1)), params, grads, v_hat)
      close(decayed, local_step(build(name), params, l2, v_hat)[0], rtol=1e-15, atol=0)


@pytest.mark.parametrize("zero_norm", ["unit_ratio", pytest.param("skip", marks=pytest.mark.slow)])
def test_a_flax_model_with_zero_biases_stays_finite(zero_norm):
  """A full round of an MLP whose biases flax initialises to 0 (keras init), float32."""
  model = models.get("mlp", num_classes=3, hidden_sizes=(8,), init_style="keras")
  rng = np.random.default_rng(2)
  x = rng.normal(size=(24, 2, 2, 1)).astype(np.float32)
  y = rng.integers(0, 3, 24).astype(np.int32)
  params = model.init(jax.random.PRNGKey(0), x[:1])["params"]
  biases = {k: v["bias"] for k, v in params.items()}
  assert all(np.all(b == 0) for b in jax.tree.leaves(biases))
  alg = build("fedlamb", lam=0.01, zero_norm=zero_norm)
  phase = clients_lib.ClientPhase(local.make_loss_fn(model, False), alg,
                                optax.constant_schedule(0.01))
  server = alg.server.init(params, {})
  idx = np.arange(24).reshape(2, 3, 4)  # 2 clients, 3 steps of 4 examples
  c = cohort_lib.Cohort(jnp.asarray(idx, jnp.int32), jnp.ones((2, 3, 4)), jnp.ones((2, 3)),
                       jnp.ones(2), jnp.arange(2, dtype=jnp.int32), jnp.full(2, 12.0))
  ctx = clients_lib.client_contexts(alg.shared(server), {}, c)
  state = clients_lib.fresh_states(alg, ctx, {}, 2)
  final, stats = phase.train(state, ctx, jnp.asarray(x), jnp.asarray(y), c,
                             jax.random.split(jax.random.PRNGKey(1), 2), 0)
  info = phase.info(stats, c, 0)
  uploads, _ = phase.finish(final, ctx, info)
  sums = aggregation.reduce_uploads(alg, uploads, info, {}, c.client_mask, c.client_mask)
  new = alg.server.update(server, aggregation.aggregates(alg, sums, 2))
  # theta, m, v, w (the optax state) and the server's theta and v_hat
  for leaf in jax.tree.leaves((final.params, final.opt_state, new)):
    assert np.all(np.isfinite(leaf))
  moved = [np.any(new.params[k]["bias"] != 0) for k in biases]
  assert all(moved) if zero_norm == "unit_ratio" else not any(moved)


# ---- the server's v_hat ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["fedams", "fedlamb"])
@pytest.mark.slow
def test_server_v_hat_is_the_running_max_of_the_masked_mean(name):
  rng = np.random.default_rng(3)
  with jax.enable_x64(True):
    eng = Engine(build(name, lam=0.01) if name == "fedlamb" else build(name), 4)
    # Start from a v_hat with some coordinates far above any v the clients reach (kept by
    # the max) and the rest at v_init (raised by it).
    big = jax.tree.map(lambda p: jnp.where(rng.random(p.shape) < 0.5, 10.0, 1e-8),
                       eng.server.params)
    eng.server = eng.server._replace(extra={"v_hat": big})
    kept_total = raised_total = 0
    for _ in range(6):  # every slot present (one compilation), non-participants masked
      mask = np.zeros(N)
      mask[rng.choice(N, size=rng.integers(1, N + 1), replace=False)] = 1.0
      steps = rng.integers(1, 5, size=N).tolist()
      prev = eng.server
      # Each participant's own upload of v, from a cohort of that client alone (weight 1).
      own = [eng.chunk(range(N), steps, client_mask=np.eye(N)[i])[0][0].values["v"]
             for i in np.flatnonzero(mask)]
      sums = eng.round(range(N), steps, client_mask=mask)
      mean = jax.tree.map(lambda v: v / sums.weight, sums.values["v"])
      close(mean, jax.tree.map(lambda *v: np.mean(v, axis=0), *own),
            rtol=1e-15, atol=0)
      for new, old, m in zip(*(jax.tree.leaves(t) for t in
                               (eng.server.extra["v_hat"], prev.extra["v_hat"], mean))):
        np.testing.assert_allclose(new, np.maximum(old, m), rtol=1e-15, atol=0)
        assert np.all(new >= old)  # exactly, whatever the cohort
        kept = old > m * (1 + 1e-12)
        np.testing.assert_array_equal(new[kept], old[kept])  # the max keeps v_hat bit for bit
        kept_total, raised_total = kept_total + kept.sum(), raised_total + (new > old).sum()
    assert kept_total > 0 and raised_total > 0  # both branches of the max were exercised


def test_first_local_step_uses_the_downloaded_v_hat():
  """Fed-AMS's first step, by hand: m_hat = g, w = max(v_hat, b2 v_hat + (1 - b2) g^2)."""
  params = jax.tree.map(np.asarray, PARAMS0)
  with jax.enable_x64(True):
    grads = jax.grad(lambda p: loss_fn(p, {}, X[rows(0, 0)], Y[rows(0, 0)], jnp.ones(2), None)[0])(
        params)
    for scale in (1e-6, 1e-2):
      v_hat = jax.tree.map(lambda p: np.full(p.shape, scale), params)
      eng = Engine(build("fedams"), 1)
      eng.server = eng.server._replace(extra={"v_hat": jax.tree.map(jnp.asarray, v_hat)})
      eng.round([0], [1])
      for k in params:
        g, vh = np.asarray(grads[k]), v_hat[k]
        w = np.maximum(vh, 0.999 * vh + 0.001 * g * g)
        np.testing.assert_allclose(eng.server.params[k], params[k] - LR * g / (np.sqrt(w) + 1e-8),
                                   rtol=1e-13)


def test_non_participants_change_nothing():
  with jax.enable_x64(True):
    eng = Engine(build("fedlamb", m_round_init="carry", v_round_init="carry"), 3)
    eng.round([0, 1, 2], [3, 3, 3])  # every row now differs from its initial value
    base, _ = eng.chunk([0, 2], [3, 2])
    store = jax.tree.map(lambda a: a.at[1].set(123.0), eng.store)  # client 1's row
    other_row, _ = eng.chunk([0, 2], [3, 2], store=store)
    # client 1 in a padded slot (mask 0), holding the changed row
    padded, _ = eng.chunk([0, 2, 1], [3, 2, 3], client_mask=[1, 1, 0], store=store)
    server = eng.update(eng.server, base[0])
    for sums in (padded[0], other_row[0]):
      for a, b in zip(jax.tree.leaves(server),
                      jax.tree.leaves(eng.update(eng.server, sums))):
        np.testing.assert_array_equal(a, b)


def test_carry_keeps_each_clients_moments_and_restarts_the_counter():
  """m_round_init = v_round_init = "carry", one client, two rounds, v_init = 0."""
  with jax.enable_x64(True):
    eng = Engine(build("fedams", v_init=0.0, m_round_init="carry", v_round_init="carry"), 4)
    eng.round([1], [4])
    tx = optax.amsgrad(LR, bias_correction_nu=False)
    params, state = optax_local(tx, PARAMS0, 1, 4)
    close(jax.tree.map(lambda a: a[1], eng.store), {"m": state[0].mu, "v": state[0].nu},
          rtol=1e-13, atol=1e-16)
    eng.round([1], [4])
    # Round 2 restarts the counter and the local max at v_hat_1 = max(0, nu) = nu.
    ams = state[0]._replace(count=jnp.zeros((), jnp.int32), nu_max=state[0].nu)
    params, _ = optax_local(tx, eng_params(params), 1, 4, (ams, state[1]))
    close(eng.server.params, params, rtol=1e-13, atol=1e-15)


def test_server_source_uses_own_v_in_round_one_then_the_frozen_v_hat():
  """v_hat_source = "server" (the authors' code)."""
  params = jax.tree.map(np.asarray, PARAMS0)
  g = jax.tree.map(lambda p: np.full(p.shape, 0.1), params)
  alg = build("fedams", v_hat_source="server")
  with jax.enable_x64(True):
    sentinel = alg.server.init(params, {}).extra["v_hat"]
    step, _ = local_step(alg, params, g, sentinel)
    v1 = 0.999 * 1e-8 + 0.001 * 0.01
    close(step, jax.tree.map(lambda p: np.full(p.shape, LR * 0.1 / (np.sqrt(v1) + 1e-8)),
                             params), rtol=1e-13)
    frozen = jax.tree.map(lambda p: np.full(p.shape, 4.0), params)
    ctx = ClientContext({"params": params, "v_hat": frozen}, {}, jnp.ones(()), jnp.zeros((), int))
    state = alg.local.init_state(ctx)
    for t in range(1, 4):  # m_hat = g whatever t; the denominator stays sqrt(4) + eps
      d, state = alg.local.tx.update(g, state, params)
      close(d, jax.tree.map(lambda p: np.full(p.shape, 0.1 / (2 + 1e-8)), params),
            rtol=1e-13)
    # the server's first maximum starts from v_init, not from the sentinel
    eng = Engine(alg, 2)
    eng.round([0], [2])
    assert all(np.all(v >= 1e-8) for v in jax.tree.leaves(eng.server.extra["v_hat"]))


# ---- a local step worked by hand --------------------------------------------------------------
THETA = {"W": np.array([[0.5, -0.3], [0.2, 0.4]]), "b": np.array([0.1, -0.2])}
V_HAT_PREV = {"W": np.array([[1e-4, 4e-4], [2.5e-5, 1e-4]]), "b": np.array([1e-4, 1e-4])}
GRAD = {"W": np.array([[0.02, -0.01], [0.03, 0.0]]), "b": np.array([0.01, -0.04])}
PRINTED = {
    "W": {"m": [0.002, -0.001, 0.003, 0], "v": [0.0001003, 0.0003997, 2.5875e-05, 9.99e-05],
          "v_hat": [0.0001003, 0.0004, 2.5875e-05, 0.0001],
          "step": [0.00235373, -0.00059137, 0.00693615, 4.70274e-06],
          "theta_new": [0.497646, -0.299409, 0.193064, 0.399995],
          "fedams_step": [0.01997, -0.005, 0.0589767, 0], "step_norm": 0.00734847},
    "b": {"m": [0.001, -0.004], "v": [0.0001, 0.0001015], "v_hat": [0.0001, 0.0001015],
          "step": [0.000546392, -0.00216828], "theta_new": [0.0994536, -0.197832],
          "fedams_step": [0.00999999, -0.0397033], "step_norm": 0.00223607},
}
PRINT = dict(rtol=1e-5, atol=1e-11)  # printed with 6 significant digits


def test_worked_local_step_matches_the_hand_computation():
  with jax.enable_x64(True):
    lamb = build("fedlamb", lam=0.01)
    step, state = local_step(lamb, THETA, GRAD, V_HAT_PREV)
    ams_state = optax.tree_utils.tree_get(state, "ScaleByAmsgradState")
    fedams, _ = local_step(build("fedams"), THETA, GRAD, V_HAT_PREV)
    for layer, want in PRINTED.items():
      flat = lambda t: np.ravel(t[layer])
      np.testing.assert_allclose(flat(ams_state.mu), want["m"], **PRINT)
      np.testing.assert_allclose(flat(ams_state.nu), want["v"], **PRINT)
      np.testing.assert_allclose(flat(ams_state.nu_max), want["v_hat"], **PRINT)
      np.testing.assert_allclose(flat(step), want["step"], **PRINT)
      np.testing.assert_allclose(np.ravel(THETA[layer]) - flat(step), want["theta_new"], **PRINT)
      np.testing.assert_allclose(flat(fedams), want["fedams_step"], **PRINT)
      assert np.linalg.norm(flat(step)) == pytest.approx(want["step_norm"], rel=1e-5)
    # Zero-initialised b: unit_ratio takes the plain adaptive step, skip leaves it at zero.
    zero_b = {"W": THETA["W"], "b": np.zeros(2)}
    unit, _ = local_step(lamb, zero_b, GRAD, V_HAT_PREV)
    np.testing.assert_allclose(unit["b"], [0.00999999, -0.0397033], **PRINT)
    skip, _ = local_step(build("fedlamb", lam=0.01, zero_norm="skip"), zero_b, GRAD, V_HAT_PREV)
    np.testing.assert_array_equal(skip["b"], [0.0, 0.0])
    # With v bias correction: Fed-AMS's W step is 31.6 times smaller; Fed-LAMB's keeps its
    # length, nearly its direction (cosine 0.9995), and its 4th coordinate goes to 1.5e-4.
    fedams_c, _ = local_step(build("fedams", v_bias_correction=True), THETA, GRAD, V_HAT_PREV)
    ratio = np.linalg.norm(fedams["W"]) / np.linalg.norm(fedams_c["W"])
    assert ratio == pytest.approx(31.6, abs=0.05)
    step_c, _ = local_step(build("fedlamb", lam=0.01, v_bias_correction=True), THETA, GRAD,
                           V_HAT_PREV)
    a, b = np.ravel(step["W"]), np.ravel(step_c["W"])
    assert np.linalg.norm(b) == pytest.approx(0.00734847, rel=1e-5)
    assert a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) == pytest.approx(0.9995, abs=5e-5)
    assert b[3] == pytest.approx(1.5e-4, abs=0.05e-4)


# ---- masked surplus steps ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["fedams", "fedlamb"])
def test_masked_surplus_steps_change_nothing(name):
  alg = build(name, v_bias_correction=True)
  with jax.enable_x64(True):
    phase = clients_lib.ClientPhase(loss_fn, alg, optax.constant_schedule(LR))
    server = alg.server.init(eng_params(PARAMS0), {})

    def final(max_steps, steps):
      c = cohort([0, 1], steps, max_steps)
      ctx = clients_lib.client_contexts(alg.shared(server), {}, c)
      state = clients_lib.fresh_states(alg, ctx, {}, 2)
      out, _ = phase.train(state, ctx, jnp.asarray(X), jnp.asarray(Y), c,
                           jax.random.split(jax.random.PRNGKey(0), 2), 0)
      return jax.tree.map(lambda a: np.asarray(a[0]), out)  # client 0

    short, padded = final(3, [3, 3]), final(5, [3, 5])
    for a, b in zip(jax.tree.leaves(short), jax.tree.leaves(padded)):
      np.testing.assert_array_equal(a, b)
    assert optax.tree_utils.tree_get(padded.opt_state, "ScaleByAmsgradState").count == 3


# ---- communication ----------------------------------------------------------------------------
@pytest.mark.slow
def test_communication_is_two_vectors_each_way():
  """The run's ledger (train_and_evaluate) for fedlamb; the declared traffic of fedams and
  fedavg: 2d floats up and down per participant and round, twice FedAvg's d."""
  from configs import default
  c = default.get_config()
  c.update_from_flattened_dict({"algorithm": "fedlamb", "rounds": 2, "local_steps": 2,
                                "num_clients": 8, "active_ratio": 0.5, "local_momentum": 0.0,
                                "plots": False, "eval_every": 2, "checkpoint_every": 2,
                                "per_client_eval": "never"})
  with tempfile.TemporaryDirectory() as workdir:
    s = training.train_and_evaluate(c, workdir)
  d, active = s["num_parameters"], 4 * 2  # 4 clients in each of 2 rounds
  assert s["comm_floats_up"] == s["comm_floats_down"] == 2 * d * active
  assert s["comm_bits_up"] == 32 * s["comm_floats_up"]
  params = jax.tree.map(jnp.asarray, PARAMS0)
  sizes = np.array([6, 2])  # b, W
  for name, vectors in (("fedavg", 1), ("fedams", 2), ("fedlamb", 2)):
    alg = build(name)
    traffic = traffic_lib.traffic(alg, alg.server.init(params, {}), {})
    np.testing.assert_array_equal(np.sort(traffic.up_per_leaf), vectors * np.sort(sizes))
    np.testing.assert_array_equal(np.sort(traffic.down_per_leaf), vectors * np.sort(sizes))
    assert traffic.up_other == traffic.down_other == 0


# ---- config errors ----------------------------------------------------------------------------
BAD = [("beta1", 1.0), ("beta2", -0.1), ("eps", -1e-8), ("eps_root", "x"), ("v_init", -1.0),
       ("m_bias_correction", 1), ("v_bias_correction", "no"), ("v_hat_source", "global"),
       ("m_round_init", "server"), ("v_round_init", "zeros")]
BAD_LAMB = [("phi", "sqrt"), ("phi_min", -1.0), ("phi_max", 0.0), ("zero_norm", "nan"),
            ("lam", 1.0), ("lam", -0.1), ("lam_mask", "bias"), ("layer_unit", "block"),
            ("unknown_field", 1)]


@pytest.mark.parametrize("name, field, value",
                         [("fedams", f, v) for f, v in BAD] +
                         [("fedlamb", f, v) for f, v in BAD + BAD_LAMB])
def test_bad_values_name_the_field(name, field, value):
  c = config_lib.base_config()
  c.algorithm = name
  c.local_momentum = 0.0
  config_lib.validate(c)
  section = c[name].to_dict()
  section[field] = value
  c[name] = ml_collections.ConfigDict(section)
  with pytest.raises(ConfigError, match=rf"config\.{name}\.{field}"):
    config_lib.validate(c)


def test_phi_max_below_phi_min_and_no_denominator_floor_are_refused():
  c = config_lib.base_config()
  c.algorithm, c.local_momentum = "fedlamb", 0.0
  c.fedlamb.phi_min, c.fedlamb.phi_max = 2.0, 1.0
  with pytest.raises(ConfigError, match=r"config\.fedlamb\.phi_max"):
    config_lib.validate(c)
  c.fedlamb.phi_min, c.fedlamb.eps = 0.0, 0.0
  with pytest.raises(ConfigError, match=r"config\.fedlamb\.eps"):
    config_lib.validate(c)


def test_local_momentum_is_refused():
  c = config_lib.base_config()
  c.algorithm, c.local_momentum = "fedams", 0.9
  with pytest.raises(ConfigError, match=r"config\.local_momentum.*fedams\.beta1"):
    config_lib.validate(c)
