"""Every baseline against a hand-written numpy reference of its paper's equations.

The problem: two clients, f_i(w) = 0.5 ||A_i w - b_i||^2, full-batch gradients,
eta_l = 0.1, K = 2, x^0 = 0, float64. The references below are written from each paper's
equations (not from the code under test); the first rounds of a worked example, computed
by hand, are asserted literally as well. The engine runs the same rounds through
engine/sync_round.py (the vmapped scan, the algorithm's finish, reductions and server
update) with a least-squares loss.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_lama import algorithms
from fedjax_lama.algorithms import Common
from fedjax_lama.engine import local as local_lib
from fedjax_lama.engine import cohort as cohort_lib, sync_round
from fedjax_lama.engine.algorithm import (ClientContext, LocalState, corrected, local_sgd,
                                          server_opt)

A = [np.array([[1., 0.], [0., 2.]]), np.array([[1., 1.], [0., 1.]])]
B = [np.array([1., 1.]), np.array([0., 2.])]
N, P = 2, np.array([0.5, 0.5])
ETA, K = 0.1, 2
ATOL = 1e-12


def grad(i, w):
  return A[i].T @ (A[i] @ w - B[i])


# ---- the engine on the same problem --------------------------------------------------------
def least_squares_loss(params, model_state, x, y, example_mask, key):
  """0.5 * sum over the batch rows of (a_j . w - b_j)^2: f_i with the full batch."""
  del key
  r = x @ params["w"] - y
  return 0.5 * jnp.sum(example_mask * r * r), (model_state, jnp.zeros(()))


def engine(alg, rounds, steps=(K, K), weighting="uniform", participants=((0, 1),) * 3,
           num_examples=(2.0, 2.0), x0=None, schedule=optax.constant_schedule(ETA),
           loss=least_squares_loss, model_state=None):
  """Runs `rounds` rounds; client i takes steps[i] full-batch steps at the rates
  schedule(r * max(steps) + k). Returns (server, rows). `x0`: the initial w, or a whole
  params pytree for another `loss` (with its initial `model_state`)."""
  with jax.enable_x64(True):
    data_x = jnp.asarray(np.concatenate(A))
    data_y = jnp.asarray(np.concatenate(B))
    if isinstance(x0, dict):
      params = jax.tree.map(jnp.asarray, x0)
    else:
      params = {"w": jnp.asarray(np.zeros(2) if x0 is None else x0)}
    max_steps = max(steps)
    train_chunk, server_update = sync_round.make_round_fns(
        loss, alg, schedule, seed=0, weighting=weighting,
        local_steps=max_steps, population=N)
    model_state = jax.tree.map(jnp.asarray, model_state or {})
    server = alg.server.init(params, model_state)
    template = alg.row_init(params) if alg.row_init is not None else {}
    store = jax.tree.map(lambda r: jnp.stack([r] * N), template)
    for r in range(rounds):
      ids = np.array(participants[r])
      idx = np.stack([np.tile(np.array([2 * i, 2 * i + 1]), (max_steps, 1)) for i in ids])
      step_mask = np.array([[1.0 if k < steps[i] else 0.0 for k in range(max_steps)]
                            for i in ids])
      cohort = cohort_lib.Cohort(jnp.asarray(idx, jnp.int32), jnp.ones(idx.shape),
                                jnp.asarray(step_mask), jnp.ones(len(ids)),
                                jnp.asarray(ids, jnp.int32),
                                jnp.asarray(np.array(num_examples)[ids]))
      rows = cohort_lib.gather_rows(store, jnp.asarray(ids)) if template else {}
      sums, new_rows, _ = train_chunk(server, rows, data_x, data_y, cohort, r)
      if template:
        store = cohort_lib.scatter_rows(store, jnp.asarray(ids), jnp.ones(len(ids)), new_rows)
      server = server_update(server, sums)
    return jax.tree.map(np.asarray, (server, store))


def build(name, common=Common(), **hparams):
  return algorithms.build(name, common, **hparams)


# ---- references (the worked example's program, extended to every baseline) ----------------
def local(i, x, extra, steps=K):
  y = x.copy()
  for _ in range(steps):
    y = y - ETA * (grad(i, y) + extra(y))
  return y


def ref_fedavg(x, eta_g=1.0, steps=(K, K)):
  d = [local(i, x, lambda y: 0.0, steps[i]) - x for i in range(N)]
  return x + eta_g * sum(P[i] * d[i] for i in range(N))


def test_a_correction_is_the_head_of_the_local_chain_and_keeps_its_state():
  """corrected(correction, tx): tx runs on correction(g, params, ctx), with the client's
  context passed as optax's extra argument, and the state is tx's own (same structure)."""
  tx = optax.chain(optax.add_decayed_weights(0.1), optax.trace(0.5))
  pull = lambda g, params, ctx: jax.tree.map(lambda a, p, x: a + ctx.row * (p - x), g, params,
                                             ctx.shared["params"])
  chain = local_sgd(momentum=0.5, weight_decay=0.1, correction=pull).tx
  anchor, params = {"w": jnp.array([1.0, 2.0])}, {"w": jnp.array([1.5, 1.0])}
  g = {"w": jnp.ones(2)}
  ctx = ClientContext({"params": anchor}, jnp.float32(2.0), jnp.float32(1), jnp.int32(0))
  state = chain.init(params)
  assert jax.tree.structure(state) == jax.tree.structure(tx.init(params))
  for _ in range(2):
    got, state = chain.update(g, state, params, ctx=ctx)
  plain = tx.init(params)
  for _ in range(2):
    want_step, plain = tx.update(pull(g, params, ctx), plain, params)
  assert _bits(got) == _bits(want_step) and _bits(state) == _bits(plain)
  # A plain optax transform in the local slot ignores the context.
  ignored, _ = corrected(None, optax.trace(0.5)).update(g, optax.trace(0.5).init(params), params,
                                                       ctx=ctx)
  assert _bits(ignored) == _bits(g)


def test_fedavg_and_fedprox_match_the_worked_example():
  xa, xp = np.zeros(2), np.zeros(2)
  mu = 0.5
  for r, (want_a, want_p) in enumerate([([0.085, 0.34], [0.0825, 0.33]),
                                        ([0.125375, 0.504475], [0.122925, 0.49479375])]):
    xa = ref_fedavg(xa)
    xp_old = xp
    xp = xp_old + sum(P[i] * (local(i, xp_old, lambda y: mu * (y - xp_old)) - xp_old)
                      for i in range(N))
    np.testing.assert_allclose(xa, want_a, atol=ATOL)
    np.testing.assert_allclose(xp, want_p, atol=ATOL)
    server, _ = engine(build("fedavg"), r + 1)
    np.testing.assert_allclose(server.params["w"], xa, atol=ATOL)
    server, _ = engine(build("fedprox", mu=mu), r + 1)
    np.testing.assert_allclose(server.params["w"], xp, atol=ATOL)


def test_scaffold_option_ii_matches_the_worked_example():
  x, c, ci = np.zeros(2), np.zeros(2), [np.zeros(2), np.zeros(2)]
  printed = [([0.085, 0.34], [-0.425, -1.7], [-0.95, -1.6], [0.1, -1.8]),
             ([0.125875, 0.50085], [-0.204375, -0.80425], [-0.8955, -0.492], [0.48675, -1.1165])]
  for r, (want_x, want_c, want_c1, want_c2) in enumerate(printed):
    dy, dc = [], []
    for i in range(N):
      y = local(i, x, lambda y, i=i: c - ci[i])
      new = ci[i] - c + (x - y) / (K * ETA)
      dy.append(y - x)
      dc.append(new - ci[i])
      ci[i] = new
    x = x + sum(P[i] * dy[i] for i in range(N))
    c = c + sum(dc) / N
    for got, want in ((x, want_x), (c, want_c), (ci[0], want_c1), (ci[1], want_c2)):
      np.testing.assert_allclose(got, want, atol=ATOL)
    server, rows = engine(build("scaffold"), r + 1)
    np.testing.assert_allclose(server.params["w"], x, atol=ATOL)
    np.testing.assert_allclose(server.extra["c"]["w"], c, atol=ATOL)
    np.testing.assert_allclose(rows["w"], np.stack(ci), atol=ATOL)
    # The invariant c = mean_j c_j.
    np.testing.assert_allclose(server.extra["c"]["w"], rows["w"].mean(0), atol=ATOL)


def test_scaffold_option_i_uses_the_gradient_at_the_server_model():
  x, c, ci = np.zeros(2), np.zeros(2), [np.zeros(2), np.zeros(2)]
  for r in range(2):
    dy, dc = [], []
    for i in range(N):
      y = local(i, x, lambda y, i=i: c - ci[i])
      new = grad(i, x)
      dy.append(y - x)
      dc.append(new - ci[i])
      ci[i] = new
    x = x + sum(P[i] * dy[i] for i in range(N))
    c = c + sum(dc) / N
  server, rows = engine(build("scaffold", option="I"), 2)
  np.testing.assert_allclose(server.params["w"], x, atol=ATOL)
  np.testing.assert_allclose(server.extra["c"]["w"], c, atol=ATOL)
  np.testing.assert_allclose(rows["w"], np.stack(ci), atol=ATOL)


def test_scaffold_partial_participation_uses_one_over_n():
  """Only client 1 takes part in round 2: c moves by dc_1 / N (not / M), c_0 keeps its row."""
  x, c, ci = np.zeros(2), np.zeros(2), [np.zeros(2), np.zeros(2)]
  cohorts = ((0, 1), (1,))
  for cohort in cohorts:
    dy, dc, weights = [], [], []
    for i in cohort:
      y = local(i, x, lambda y, i=i: c - ci[i])
      new = ci[i] - c + (x - y) / (K * ETA)
      dy.append(y - x)
      dc.append(new - ci[i])
      ci[i] = new
    x = x + sum(dy) / len(cohort)
    c = c + sum(dc) / N
  server, rows = engine(build("scaffold"), 2, participants=cohorts)
  np.testing.assert_allclose(server.params["w"], x, atol=ATOL)
  np.testing.assert_allclose(server.extra["c"]["w"], c, atol=ATOL)
  np.testing.assert_allclose(rows["w"], np.stack(ci), atol=ATOL)
  np.testing.assert_allclose(server.extra["c"]["w"], rows["w"].mean(0), atol=ATOL)


def test_feddyn_and_fedadmm_match_the_worked_example():
  alpha = rho = 0.5
  x, h, lam = np.zeros(2), np.zeros(2), [np.zeros(2), np.zeros(2)]
  xm, z, xhat = np.zeros(2), [np.zeros(2), np.zeros(2)], [np.zeros(2), np.zeros(2)]
  printed = [([0.165, 0.66], [-0.04125, -0.165], [0.0925, 0.155], [-0.01, 0.175]),
             ([0.2306875, 0.934425], [-0.037046875, -0.15110625], [0.16118125, 0.0933875],
              [-0.0870875, 0.208825])]
  for r, (want_x, want_h, want_z1, want_z2) in enumerate(printed):
    ys = []
    for i in range(N):
      y = local(i, x, lambda y, i=i: -lam[i] + alpha * (y - x))
      lam[i] = lam[i] - alpha * (y - x)
      ys.append(y)
    h = h - alpha * sum(y - x for y in ys) / N
    x = sum(P[i] * ys[i] for i in range(N)) - h / alpha
    new_x = xm.copy()
    for i in range(N):
      y = local(i, xm, lambda y, i=i: z[i] + rho * (y - xm))
      z[i] = z[i] + rho * (y - xm)
      aug = y + z[i] / rho
      new_x = new_x + (aug - xhat[i]) / N
      xhat[i] = aug
    xm = new_x
    for got, want in ((x, want_x), (h, want_h), (z[0], want_z1), (z[1], want_z2), (xm, want_x)):
      np.testing.assert_allclose(got, want, atol=ATOL)
    server, rows = engine(build("feddyn", alpha=alpha), r + 1)
    np.testing.assert_allclose(server.params["w"], x, atol=ATOL)
    np.testing.assert_allclose(server.extra["h"]["w"], h, atol=ATOL)
    np.testing.assert_allclose(rows["w"], np.stack(lam), atol=ATOL)
    np.testing.assert_allclose(server.extra["h"]["w"], rows["w"].mean(0), atol=ATOL)  # h = mean
    server, rows = engine(build("fedadmm", rho=rho), r + 1)
    np.testing.assert_allclose(server.params["w"], xm, atol=ATOL)
    np.testing.assert_allclose(rows["z"]["w"], np.stack(z), atol=ATOL)
    np.testing.assert_allclose(rows["x_hat"]["w"], np.stack(xhat), atol=ATOL)
    np.testing.assert_allclose(server.params["w"], rows["x_hat"]["w"].mean(0), atol=ATOL)


def test_fednova_normalises_unequal_steps():
  """Client 0 takes 2 steps, client 1 takes 3: x + tau_eff sum_i p_i delta_i / ||a_i||_1."""
  steps, rho, x = (2, 3), 0.5, np.zeros(2)
  # Heavy-ball closed form (Wang et al. 2020):
  # ||a||_1 = [tau - rho (1 - rho^tau) / (1 - rho)] / (1 - rho).
  norm_a = [(t - rho * (1 - rho ** t) / (1 - rho)) / (1 - rho) for t in steps]
  for _ in range(2):
    deltas = []
    for i in range(N):
      y, m = x.copy(), np.zeros(2)
      for _ in range(steps[i]):
        m = rho * m + grad(i, y)
        y = y - ETA * m
      deltas.append(y - x)
    tau_eff = sum(P[i] * norm_a[i] for i in range(N))
    x = x + tau_eff * sum(P[i] * deltas[i] / norm_a[i] for i in range(N))
  server, _ = engine(build("fednova", Common(local_momentum=rho)), 2, steps=steps)
  np.testing.assert_allclose(server.params["w"], x, atol=ATOL)
  # Plain SGD: ||a_i||_1 = tau_i, which differs from FedAvg when the tau_i differ.
  plain, _ = engine(build("fednova"), 1, steps=steps)
  d = [local(i, np.zeros(2), lambda y: 0.0, steps[i]) for i in range(N)]
  want = sum(P[i] * steps[i] for i in range(N)) * sum(P[i] * d[i] / steps[i] for i in range(N))
  np.testing.assert_allclose(plain.params["w"], want, atol=ATOL)
  assert not np.allclose(want, ref_fedavg(np.zeros(2), steps=steps))


# ---- heavy-ball local momentum: the effective step ||a_i||_1 --------------------------------
BETA = 0.9


def heavy_ball(i, x, extra, rates, nesterov=False):
  """Client i's local steps from x under optax.trace(BETA): m = BETA m + g, y -= rate * m
  (with nesterov: y -= rate * (g + BETA m)); g = grad_i(y) + extra(y)."""
  y, m = x.copy(), np.zeros(2)
  for rate in rates:
    g = grad(i, y) + extra(y)
    m = BETA * m + g
    y = y - rate * ((g + BETA * m) if nesterov else m)
  return y


def norm_a(rates, nesterov=False):
  """FedNova's ||a||_1 with the rates inside (Wang et al. 2020): gradient j enters the
  displacement with coefficient sum_{k >= j} rate_k BETA^(k - j) (nesterov: rate_j +
  sum_{k >= j} rate_k BETA^(k - j + 1)); the sum of these coefficients."""
  n = len(rates)
  coeffs = []
  for j in range(n):
    tail = sum(rates[k] * BETA ** (k - j + (1 if nesterov else 0)) for k in range(j, n))
    coeffs.append(tail + (rates[j] if nesterov else 0.0))
  return sum(coeffs)


def test_effective_step_is_the_sum_of_the_gradient_coefficients():
  """The coefficients of norm_a really are how each gradient enters the displacement: on a
  problem whose gradient is a fixed vector g, y - x = -||a||_1 g."""
  rates = [0.1, 0.05, 0.2]
  for nesterov in (False, True):
    y, m = np.zeros(2), np.zeros(2)
    g = np.array([1.0, -2.0])
    for rate in rates:
      m = BETA * m + g
      y = y - rate * ((g + BETA * m) if nesterov else m)
    np.testing.assert_allclose(y, -norm_a(rates, nesterov) * g, rtol=1e-13)


def test_scaffold_option_ii_with_momentum_estimates_the_mean_gradient():
  """Karimireddy et al. 2020, option II (Eq. 4): c_i+ = c_i - c + (x - y) / (step), where
  the step is the client's effective step under heavy-ball momentum 0.9, ||a_i||_1 of
  FedNova -- not K eta, which under momentum overestimates the mean gradient about
  tenfold. One round and a second one, clients with 3 and 2 steps."""
  steps = (3, 2)
  x, c, ci = np.zeros(2), np.zeros(2), [np.zeros(2), np.zeros(2)]
  for r in range(2):
    dy, dc = [], []
    for i in range(N):
      rates = [ETA] * steps[i]
      y = heavy_ball(i, x, lambda y, i=i: c - ci[i], rates)
      new = ci[i] - c + (x - y) / norm_a(rates)
      dy.append(y - x)
      dc.append(new - ci[i])
      ci[i] = new
    x = x + sum(P[i] * dy[i] for i in range(N))
    c = c + sum(dc) / N
    server, rows = engine(build("scaffold", Common(local_momentum=BETA)), r + 1, steps=steps)
    np.testing.assert_allclose(server.params["w"], x, atol=ATOL)
    np.testing.assert_allclose(server.extra["c"]["w"], c, atol=ATOL)
    np.testing.assert_allclose(rows["w"], np.stack(ci), atol=ATOL)
    if r == 0:
      # Round 1 (c = c_i = 0): c_i+ is the mean of the gradients weighted by their
      # coefficients, so it lies within the range of the gradients the client computed.
      for i in range(N):
        ys, m, grads = np.zeros(2), np.zeros(2), []
        for _ in range(steps[i]):
          grads.append(grad(i, ys))
          m = BETA * m + grads[-1]
          ys = ys - ETA * m
        lo, hi = np.min(grads, 0), np.max(grads, 0)
        assert np.all(ci[i] >= lo - 1e-12) and np.all(ci[i] <= hi + 1e-12)


def test_fedcm_direction_with_momentum_uses_the_effective_step():
  """FedCM (Xu et al. 2021): D <- -mean_i delta_i / (client i's effective step) under local
  heavy-ball momentum; clients step along alpha g + (1 - alpha) D."""
  alpha, steps = 0.5, (3, 2)
  x, d = np.zeros(2), np.zeros(2)
  for _ in range(2):
    deltas, dirs = [], []
    for i in range(N):
      rates = [ETA] * steps[i]
      y = heavy_ball(i, x, lambda y, i=i: (alpha - 1) * grad(i, y) + (1 - alpha) * d, rates)
      deltas.append(y - x)
      dirs.append(-(y - x) / norm_a(rates))
    x = x + sum(P[i] * deltas[i] for i in range(N))
    d = sum(P[i] * dirs[i] for i in range(N))
  server, _ = engine(build("fedcm", Common(local_momentum=BETA), alpha=alpha), 2, steps=steps)
  np.testing.assert_allclose(server.params["w"], x, atol=ATOL)
  np.testing.assert_allclose(server.extra["D"]["w"], d, atol=ATOL)


def test_fednova_with_momentum_and_per_step_rates():
  """FedNova's ||a_i||_1 with a decaying rate, each step at its own rate: the server step
  is tau_eff sum_i p_i delta_i / ||a_i||_1 with tau_eff = sum_i p_i ||a_i||_1 (the unit of
  a -- rates inside or not -- cancels)."""
  steps = (3, 2)
  schedule = lambda s: ETA * 0.7 ** s
  x = np.zeros(2)
  for r in range(2):
    deltas, norms = [], []
    for i in range(N):
      rates = [schedule(r * max(steps) + k) for k in range(steps[i])]
      deltas.append(heavy_ball(i, x, lambda y: 0.0, rates) - x)
      norms.append(norm_a(rates))
    tau_eff = sum(P[i] * norms[i] for i in range(N))
    x = x + tau_eff * sum(P[i] * deltas[i] / norms[i] for i in range(N))
  server, _ = engine(build("fednova", Common(local_momentum=BETA)), 2, steps=steps,
                     schedule=schedule)
  np.testing.assert_allclose(server.params["w"], x, atol=ATOL)


def test_fednova_proximal_closed_form():
  """||a||_1 = (1 - (1 - eta mu)^tau) / (eta mu) for FedProx clients (Wang et al. 2020)."""
  mu, steps, x = 2.0, (2, 3), np.zeros(2)
  beta = ETA * mu
  norm_a = [(1 - (1 - beta) ** t) / beta for t in steps]
  deltas = [local(i, x, lambda y: mu * (y - x), steps[i]) - x for i in range(N)]
  want = sum(P[i] * norm_a[i] for i in range(N)) * sum(P[i] * deltas[i] / norm_a[i]
                                                       for i in range(N))
  server, _ = engine(build("fednova", mu=mu), 1, steps=steps)
  np.testing.assert_allclose(server.params["w"], want, atol=ATOL)


def test_fedavgm():
  beta, eta_g, x, v = 0.9, 0.7, np.zeros(2), np.zeros(2)
  for _ in range(3):
    g = -(ref_fedavg(x) - x)
    v = beta * v + g
    x = x - eta_g * v
  server, _ = engine(build("fedavgm", Common(server_lr=eta_g), momentum=beta), 3)
  np.testing.assert_allclose(server.params["w"], x, atol=ATOL)


@pytest.mark.parametrize("kind", ["adam", "yogi", "adagrad"])
def test_reddi_adaptive_server_optimizers(kind):
  """Reddi et al.'s equations (Algorithm 2): m, v of the mean update, v^-1 = tau^2, no bias
  correction."""
  eta_g, b1, b2, tau = 0.3, (0.0 if kind == "adagrad" else 0.9), 0.99, 1e-3
  x, m, v = np.zeros(2), np.zeros(2), np.full(2, tau * tau)
  for _ in range(3):
    delta = ref_fedavg(x) - x
    m = b1 * m + (1 - b1) * delta
    if kind == "adagrad":
      v = v + delta ** 2
    elif kind == "yogi":
      v = v - (1 - b2) * delta ** 2 * np.sign(v - delta ** 2)
    else:
      v = b2 * v + (1 - b2) * delta ** 2
    x = x + eta_g * m / (np.sqrt(v) + tau)
  hp = dict(beta1=b1, beta2=b2, tau=tau)
  server, _ = engine(build("fed" + kind, Common(server_lr=eta_g), **hp), 3)
  np.testing.assert_allclose(server.params["w"], x, atol=ATOL)


def test_fedcm():
  alpha, x, d = 0.5, np.zeros(2), np.zeros(2)
  for _ in range(3):
    deltas = []
    for i in range(N):
      y = x.copy()
      for _ in range(K):
        y = y - ETA * (alpha * grad(i, y) + (1 - alpha) * d)
      deltas.append(y - x)
    d = -sum(P[i] * deltas[i] for i in range(N)) / (ETA * K)
    x = x + sum(P[i] * deltas[i] for i in range(N))
  server, _ = engine(build("fedcm", alpha=alpha), 3)
  np.testing.assert_allclose(server.params["w"], x, atol=ATOL)
  np.testing.assert_allclose(server.extra["D"]["w"], d, atol=ATOL)


def test_fedsgd_is_one_full_batch_gradient_step():
  x = np.zeros(2)
  for _ in range(2):
    x = x - ETA * sum(P[i] * grad(i, x) for i in range(N))
  server, _ = engine(build("fedsgd"), 2, steps=(1, 1))
  np.testing.assert_allclose(server.params["w"], x, atol=ATOL)


def ref_fedexp(x, eps, steps=(K, K), participants=(0, 1)):
  """Jhunjhunwala, Wang, Joshi, ICLR 2023, Algorithm 1, in the paper's sign convention:
  Delta_i = x - y_i, Delta = (1/M) sum_i Delta_i (uniform),
  eta_g = max(1, sum_i ||Delta_i||^2 / (2 M (||Delta||^2 + eps))), x <- x - eta_g Delta."""
  updates = [x - local(i, x, lambda y: 0.0, steps[i]) for i in participants]
  m = len(participants)
  mean = sum(updates) / m
  eta_g = max(1.0, sum(u @ u for u in updates) / (2 * m * (mean @ mean + eps)))
  return x - eta_g * mean, eta_g


@pytest.mark.parametrize("eps,steps,participants", [
    (1e-3, (K, 1), ((0, 1),) * 3),       # unequal steps: the updates disagree, eta_g > 1
    (1e-3, (K, K), ((0, 1), (1,), (0, 1))),  # one client alone: eta_g = max(1, 1/2 ...) = 1
    (10.0, (K, 1), ((0, 1),) * 3),       # a large eps keeps eta_g at 1: FedAvg, uniform
])
def test_fedexp_matches_its_algorithm_1(eps, steps, participants):
  """Three rounds against the reference; the mean is uniform whatever the weighting (here
  by examples, 1 : 3), eta_g is kept for the round's report, and with
  eval_average_last_two the report evaluates (x_t + x_{t-1}) / 2."""
  xs, etas = [np.zeros(2)], []
  for r in range(3):
    x, eta_g = ref_fedexp(xs[-1], eps, steps, participants[r])
    xs.append(x)
    etas.append(eta_g)
  if eps == 1e-3 and steps == (K, 1) and len(participants[0]) == 2:
    assert max(etas) > 1.0  # the case extrapolates (round 3 here)
  if eps == 10.0:
    assert etas == [1.0, 1.0, 1.0]
  alg = build("fedexp", eps=eps, eval_average_last_two=True)
  for r in range(1, 4):
    server, _ = engine(alg, r, steps=steps, weighting="examples", participants=participants,
                       num_examples=(1.0, 3.0))
    np.testing.assert_allclose(server.params["w"], xs[r], atol=ATOL)
    eval_params, scalars = alg.server.report(server)
    np.testing.assert_allclose(scalars["fedexp_eta_g"], etas[r - 1], rtol=1e-6)
    np.testing.assert_allclose(eval_params["w"], (xs[r] + xs[r - 1]) / 2, atol=ATOL)
  plain = build("fedexp", eps=eps)
  eval_params, _ = plain.server.report(engine(plain, 2, steps=steps, participants=participants)[0])
  np.testing.assert_allclose(eval_params["w"], xs[2], atol=ATOL)


def test_fedexp_refuses_a_server_rate_and_the_layerwise_schedule():
  from fedjax_lama.errors import HparamError  # pylint: disable=g-import-not-at-top
  with pytest.raises(HparamError, match=r"server_lr=0\.5.*None \(FedExP sets its own"):
    build("fedexp", Common(server_lr=0.5))
  with pytest.raises(HparamError, match=r"eps=0.*a number > 0"):
    build("fedexp", eps=0)
  assert "per layer" in algorithms.layerwise("fedexp")


def test_fedcom_server_learning_rate_with_identity_compression():
  x = np.zeros(2)
  for _ in range(2):
    x = ref_fedavg(x, eta_g=0.5)
  server, _ = engine(_without_uplink(build("fedcom", Common(server_lr=0.5))), 2)
  np.testing.assert_allclose(server.params["w"], x, atol=ATOL)


def _without_uplink(alg):
  """The algorithm with the identity uplink: its default compressor is the run's (its Spec's
  `uplink`), and the engine called without a compressor compresses nothing."""
  return alg


# ---- reductions to FedAvg (the setting of each algorithm that is FedAvg) -------------------
def _bits(tree):
  return [np.asarray(x).tobytes() for x in jax.tree.leaves(tree)]


def _fedavg(rounds=2, **kw):
  return engine(build("fedavg"), rounds, **kw)[0].params


@pytest.mark.parametrize("name,hparams", [
    ("fedprox", {"mu": 0.0}),
    ("scaffold", {"control_variates": False}),
    ("feddyn", {"alpha": 0.0}),
    ("fedcm", {"alpha": 1.0}),
    ("fedavgm", {"momentum": 0.0}),
])
def test_reductions_that_are_bitwise_fedavg(name, hparams):
  server, _ = engine(build(name, **hparams), 2)
  assert _bits(server.params) == _bits(_fedavg())


def test_scaffold_first_round_is_fedavg_bitwise_and_later_rounds_differ():
  assert _bits(engine(build("scaffold"), 1)[0].params) == _bits(_fedavg(1))
  assert not np.allclose(engine(build("scaffold"), 2)[0].params["w"], _fedavg(2)["w"])


def test_fedsgd_is_fedavg_with_one_full_batch_step_bitwise():
  server, _ = engine(build("fedsgd"), 2, steps=(1, 1))
  assert _bits(server.params) == _bits(_fedavg(steps=(1, 1)))


def test_fednova_equal_steps_is_fedavg_up_to_rounding():
  server, _ = engine(build("fednova"), 2)
  np.testing.assert_allclose(server.params["w"], _fedavg()["w"], atol=ATOL)


def test_fedadmm_rho_zero_full_participation_equal_weights_is_fedavg():
  server, _ = engine(build("fedadmm", rho=0.0), 2)
  np.testing.assert_allclose(server.params["w"], _fedavg()["w"], atol=ATOL)
  # Under partial participation the stale augmented model of client 0 stays in the average.
  cohorts = ((0, 1), (1,), (1,))
  partial, _ = engine(build("fedadmm", rho=0.0), 2, participants=cohorts)
  assert not np.allclose(partial.params["w"],
                         engine(build("fedavg"), 2, participants=cohorts)[0].params["w"])


@pytest.mark.parametrize("kind,hparams,lr_over_tau", [
    ("adam", {"beta2": 0.0}, 1.0),   # v = delta^2: the step is delta T / (|delta| + T)
    ("yogi", {}, 2.0),               # v stays within (1 - b2) delta^2 of v^-1 = T^2
    ("adagrad", {}, 2.0),            # v = T^2 + delta^2
])
def test_adaptive_server_optimizers_approach_fedavg_in_the_limit(kind, hparams, lr_over_tau):
  """No setting is FedAvg. With beta1 = 0 and tau = T the first step is
  server_lr * delta / (sqrt(v) + T), which tends to delta when server_lr / (sqrt(v) + T) -> 1:
  for Adam with beta2 = 0 that is server_lr = T (relative error at most
  sqrt(v) / T); since v starts at tau^2 = T^2, Yogi and Adagrad need server_lr = 2T."""
  big = 1e8
  server, _ = engine(build("fed" + kind, Common(server_lr=lr_over_tau * big), beta1=0.0,
                           tau=big, **hparams), 1)
  want = _fedavg(1)["w"]
  np.testing.assert_allclose(server.params["w"], want, rtol=np.max(np.abs(want)) / big * 10)
  assert _bits(server.params) != _bits(_fedavg(1))


def test_optax_sgd_server_is_fedavg_bitwise():
  """The plumbing: a server optimizer slot holding optax.sgd(1.0) is FedAvg."""
  alg = dataclasses.replace(build("fedadam"), server=server_opt(optax.sgd(1.0)))
  assert _bits(engine(alg, 2)[0].params) == _bits(_fedavg())


def test_fedpaq_and_fedcom_with_identity_compression_are_fedavg():
  for name in ("fedpaq", "fedcom"):
    assert _bits(engine(_without_uplink(build(name)), 2)[0].params) == _bits(_fedavg())


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.slow
def test_effective_step_of_a_span_split_in_two_calls(nesterov):
  """The per-leaf count of the FedLAMA schedule: the effective step of steps 1..5 in one call
  equals that of steps 1..3 plus steps 4..5 continued from the unit momentum of the first
  call (StepStats.carry_gain, unit_momentum, unit_decay), each step at its own rate, and
  padded steps count for nothing. The reference is norm_a's coefficient sum."""
  schedule = lambda s: ETA * 0.7 ** s
  alg = build("fedavg", Common(local_momentum=BETA, nesterov=nesterov))
  train = local_lib.make_client_train(least_squares_loss, alg, schedule)
  with jax.enable_x64(True):
    data_x, data_y = jnp.asarray(np.concatenate(A)), jnp.asarray(np.concatenate(B))
    params = {"w": jnp.zeros(2)}
    state = LocalState(params, {}, alg.local.tx.init(params))
    ctx = ClientContext({"params": params}, {}, 2.0, 0)

    def run(steps, offset, padded=0):
      idx = jnp.tile(jnp.array([0, 1]), (steps + padded, 1))
      mask = jnp.concatenate([jnp.ones(steps), jnp.zeros(padded)])
      batch = local_lib.ClientBatch(idx, jnp.ones(idx.shape), mask, jax.random.PRNGKey(0))
      return train(state, ctx, data_x, data_y, batch, offset)[1]

    whole = run(5, 0, padded=2)
    first, second = run(3, 0, padded=1), run(2, 3)
    composed = (first.effective_step + second.effective_step
                + second.carry_gain * first.unit_momentum)
    want = norm_a([schedule(k) for k in range(5)], nesterov)
    np.testing.assert_allclose(float(whole.effective_step), want, rtol=1e-12)
    np.testing.assert_allclose(float(composed), want, rtol=1e-12)
    np.testing.assert_allclose(float(second.unit_momentum + second.unit_decay
                                     * first.unit_momentum),
                               float(whole.unit_momentum), rtol=1e-12)
