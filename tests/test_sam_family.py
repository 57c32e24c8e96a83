"""FedSAM, MoFedSAM, FedSMOO and FedGamma: reductions to the methods they extend, and rounds
on the two-client least-squares problem against numpy references written here from the
papers' update rules.

The problem is tests/test_algorithm_reference.py's: f_i(w) = 0.5 ||A_i w - b_i||^2,
full-batch gradients, eta_l = 0.1, K = 2, x^0 = 0, float64, uniform weights, N = 2. The
references follow the papers' equations (ascent rho v / ||v||, no epsilon, no clip); the
modules' default perturb_eps (1e-12) is below the tolerance. FL-Simulator's readings (the
options) get references of their own, and each test also checks that the reading it pins
down changes the result on this problem, so a swapped rule cannot pass.
"""
import jax
import numpy as np
import pytest

from fedjax_lama import algorithms
from fedjax_lama.algorithms import Common
from fedjax_lama.errors import HparamError
from tests.test_algorithm_reference import ETA, K, N, engine, grad

ATOL = 1e-10
FULL = ((0, 1),) * 3
# Round 1 with both clients, then each alone (the other's rows and the 1/N means are
# exercised), then both again. FULL participation runs in the slow suite.
PARTIAL = ((0, 1), (1,), (0,), (0, 1))
COHORTS = [PARTIAL, pytest.param(FULL, marks=pytest.mark.slow)]


def build(name, common=Common(), **hparams):
  return algorithms.build(name, common, **hparams)


def bits(tree):
  return [np.asarray(x).tobytes() for x in jax.tree.leaves(tree)]


def along(v, rho):
  """The papers' ascent: rho v / ||v||."""
  return rho * v / np.linalg.norm(v)


def clipped(u, max_norm):
  """PyTorch's clip_grad_norm_ (FL-Simulator's clip of every method's direction)."""
  return u * min(1.0, max_norm / (np.linalg.norm(u) + 1e-6))


# ---- reductions --------------------------------------------------------------------------------
@pytest.mark.parametrize("participants", COHORTS)
@pytest.mark.parametrize("name,hparams,base,base_hparams", [
    ("fedsam", {"rho": 0.0}, "fedavg", {}),                        # Qu et al. 2022, Alg. 1
    ("mofedsam", {"rho": 0.0, "alpha": 0.3}, "fedcm", {"alpha": 0.3}),  # FedCM's momentum
    ("mofedsam", {"rho": 0.05, "alpha": 1.0}, "fedsam", {"rho": 0.05}),  # no momentum
    ("fedgamma", {"rho": 0.0}, "scaffold", {"option": "II"}),       # SCAFFOLD's variates
])
def test_reduction_is_bitwise_the_extended_method(name, hparams, base, base_hparams,
                                                  participants):
  common = Common(weight_decay=0.01)
  server, rows = engine(build(name, common, **hparams), len(participants),
                        participants=participants)
  want_server, want_rows = engine(build(base, common, **base_hparams), len(participants),
                                  participants=participants)
  assert bits(server.params) == bits(want_server.params)
  # The base's server state and rows (MoFedSAM at alpha = 1 still keeps D, which FedSAM lacks).
  assert bits({k: server.extra[k] for k in want_server.extra}) == bits(want_server.extra)
  assert bits(rows) == bits(want_rows)


@pytest.mark.parametrize("participants", COHORTS)
def test_fedsmoo_at_rho_zero_is_fedspeed_all_clients_and_feddyn(participants):
  """No perturbation: FedSpeed's regulariser and server (server_average="all_clients") with
  rho = 0, i.e. FedDyn with alpha = 1/lam; the perturbation duals stay 0."""
  lam, common, rounds = 5.0, Common(weight_decay=0.01), len(participants)
  server, rows = engine(build("fedsmoo", common, rho=0.0, lam=lam), rounds,
                        participants=participants)
  speed, speed_rows = engine(build("fedspeed", common, rho=0.0, lam=lam,
                                   server_average="all_clients"), rounds,
                             participants=participants)
  dyn, _ = engine(build("feddyn", common, alpha=1.0 / lam), rounds, participants=participants)
  assert bits(server.params) == bits(speed.params) == bits(dyn.params)
  assert bits(server.extra["g_hat_mean"]) == bits(speed.extra["g_hat_mean"])
  assert bits(rows["g_hat"]) == bits(speed_rows)
  assert not np.any(rows["mu"]["w"]) and not np.any(server.extra["s"]["w"])


# ---- numpy references ----------------------------------------------------------------------------
def ref_fedsam(rho, cohorts, clip_norm=None):
  """Qu et al. 2022, Algorithm 1: y <- y - eta grad f_i(y + rho g / ||g||); x <- x + mean d."""
  x = np.zeros(2)
  for ids in cohorts:
    d = []
    for i in ids:
      y = x.copy()
      for _ in range(K):
        g_sam = grad(i, y + along(grad(i, y), rho))
        y = y - ETA * (g_sam if clip_norm is None else clipped(g_sam, clip_norm))
      d.append(y - x)
    x = x + np.mean(d, axis=0)
  return x


def ref_mofedsam(rho, alpha, cohorts):
  """Qu et al. 2022, Algorithm 2: v = alpha g~ + (1 - alpha) D, D the last round's mean
  displacement in gradient units, -mean d / (K eta); 0 in the first round."""
  x, mom = np.zeros(2), np.zeros(2)
  for ids in cohorts:
    d = []
    for i in ids:
      y = x.copy()
      for _ in range(K):
        g_sam = grad(i, y + along(grad(i, y), rho))
        y = y - ETA * (alpha * g_sam + (1 - alpha) * mom)
      d.append(y - x)
    mom = -np.mean(d, axis=0) / (K * ETA)
    x = x + np.mean(d, axis=0)
  return x, mom


def ref_fedgamma(rho, cohorts, corrected=True):
  """Dai et al. 2023, Algorithm 1: ascent along g - c_i + c (corrected) or g (FL-Simulator),
  step along g~ - c_i + c; SCAFFOLD option II for c_i and c (1/N)."""
  x, c, ci = np.zeros(2), np.zeros(2), np.zeros((N, 2))
  for ids in cohorts:
    d, dc = [], []
    for i in ids:
      y = x.copy()
      for _ in range(K):
        g = grad(i, y)
        e = along(g - ci[i] + c if corrected else g, rho)
        y = y - ETA * (grad(i, y + e) - ci[i] + c)
      new = ci[i] - c + (x - y) / (K * ETA)
      d.append(y - x)
      dc.append(new - ci[i])
      ci[i] = new
    x = x + np.mean(d, axis=0)
    c = c + np.sum(dc, axis=0) / N
  return x, c, ci


def ref_fedsmoo(rho, lam, cohorts, with_local=True):
  """Sun et al. 2023, Algorithm 1 (module docstring): s_i = rho (g - mu_i - s) / ||.||,
  mu_i += s_i - s, step along g~(y + s_i) - g_hat_i + (y - x)/lam; g_hat_i -= (y_K - x)/lam;
  x <- mean_S y_K - lam mean_[N] g_hat_j; s <- rho z / ||z||, z = mean_S (mu_i + s_{i,K})
  (with_local) or mean_S mu_i (FL-Simulator)."""
  x, s = np.zeros(2), np.zeros(2)
  g_hat, mu = np.zeros((N, 2)), np.zeros((N, 2))
  for ids in cohorts:
    ys, zs = [], []
    for i in ids:
      y = x.copy()
      for _ in range(K):
        s_i = along(grad(i, y) - mu[i] - s, rho)
        mu[i] = mu[i] + s_i - s
        y = y - ETA * (grad(i, y + s_i) - g_hat[i] + (y - x) / lam)
      g_hat[i] = g_hat[i] - (y - x) / lam
      ys.append(y)
      zs.append(mu[i] + s_i if with_local else mu[i].copy())
    x = np.mean(ys, axis=0) - lam * np.mean(g_hat, axis=0)
    s = along(np.mean(zs, axis=0), rho)
  return x, s, g_hat, mu


@pytest.mark.parametrize("participants", COHORTS)
def test_fedsam_matches_numpy(participants):
  rho = 0.3
  want = ref_fedsam(rho, participants)
  assert not np.allclose(want, ref_fedsam(0.0, participants))  # the ascent matters here
  server, _ = engine(build("fedsam", rho=rho), len(participants), participants=participants)
  np.testing.assert_allclose(server.params["w"], want, rtol=0, atol=ATOL)


def test_fedsam_reference_clip_matches_numpy():
  """FL-Simulator's reading: the perturbed gradient clipped to norm clip_norm (active here)."""
  rho, clip_norm = 0.3, 0.5
  want = ref_fedsam(rho, FULL, clip_norm)
  assert not np.allclose(want, ref_fedsam(rho, FULL))
  server, _ = engine(build("fedsam", rho=rho, clip_mode="reference", clip_norm=clip_norm), 3)
  np.testing.assert_allclose(server.params["w"], want, rtol=0, atol=ATOL)


@pytest.mark.parametrize("participants", COHORTS)
def test_mofedsam_matches_numpy(participants):
  rho, alpha = 0.3, 0.4
  x, mom = ref_mofedsam(rho, alpha, participants)
  assert not np.allclose(x, ref_mofedsam(rho, 1.0, participants)[0])  # the momentum matters
  assert not np.allclose(x, ref_mofedsam(0.0, alpha, participants)[0])  # and the ascent
  server, _ = engine(build("mofedsam", rho=rho, alpha=alpha), len(participants),
                     participants=participants)
  np.testing.assert_allclose(server.params["w"], x, rtol=0, atol=ATOL)
  np.testing.assert_allclose(server.extra["D"]["w"], mom, rtol=0, atol=ATOL)


@pytest.mark.parametrize("participants", COHORTS)
@pytest.mark.parametrize("perturbation", ["corrected", "local"])
def test_fedgamma_matches_numpy(participants, perturbation):
  rho = 0.3
  corrected = perturbation == "corrected"
  x, c, ci = ref_fedgamma(rho, participants, corrected)
  other = ref_fedgamma(rho, participants, not corrected)[0]
  assert not np.allclose(x, other)  # the two readings differ on this problem
  server, rows = engine(build("fedgamma", rho=rho, perturbation=perturbation),
                        len(participants), participants=participants)
  np.testing.assert_allclose(server.params["w"], x, rtol=0, atol=ATOL)
  np.testing.assert_allclose(server.extra["c"]["w"], c, rtol=0, atol=ATOL)
  np.testing.assert_allclose(rows["w"], ci, rtol=0, atol=ATOL)
  np.testing.assert_allclose(server.extra["c"]["w"], rows["w"].mean(0), atol=ATOL)  # c = mean


@pytest.mark.parametrize("participants", COHORTS)
@pytest.mark.parametrize("global_perturbation", ["with_local", "dual_only"])
def test_fedsmoo_matches_numpy(participants, global_perturbation):
  rho, lam = 0.3, 5.0
  with_local = global_perturbation == "with_local"
  x, s, g_hat, mu = ref_fedsmoo(rho, lam, participants, with_local)
  assert not np.allclose(x, ref_fedsmoo(rho, lam, participants, not with_local)[0])
  server, rows = engine(build("fedsmoo", rho=rho, lam=lam,
                              global_perturbation=global_perturbation), len(participants),
                        participants=participants)
  np.testing.assert_allclose(server.params["w"], x, rtol=0, atol=ATOL)
  np.testing.assert_allclose(server.extra["s"]["w"], s, rtol=0, atol=ATOL)
  np.testing.assert_allclose(rows["g_hat"]["w"], g_hat, rtol=0, atol=ATOL)
  np.testing.assert_allclose(rows["mu"]["w"], mu, rtol=0, atol=ATOL)
  np.testing.assert_allclose(np.linalg.norm(s), rho, rtol=1e-12)  # s on the rho-sphere


def test_fedsmoo_reference_clip_matches_numpy():
  """FL-Simulator's clip: u = g~ - g_hat_i - x/lam clipped, y/lam added unclipped."""
  rho, lam, clip_norm = 0.3, 5.0, 0.5
  x, s, g_hat, mu = np.zeros(2), np.zeros(2), np.zeros((N, 2)), np.zeros((N, 2))
  for ids in FULL:
    ys, zs = [], []
    for i in ids:
      y = x.copy()
      for _ in range(K):
        s_i = along(grad(i, y) - mu[i] - s, rho)
        mu[i] = mu[i] + s_i - s
        u = grad(i, y + s_i) - g_hat[i] - x / lam
        y = y - ETA * (clipped(u, clip_norm) + y / lam)
      g_hat[i] = g_hat[i] - (y - x) / lam
      ys.append(y)
      zs.append(mu[i] + s_i)
    x = np.mean(ys, axis=0) - lam * np.mean(g_hat, axis=0)
    s = along(np.mean(zs, axis=0), rho)
  assert not np.allclose(x, ref_fedsmoo(rho, lam, FULL)[0])
  server, _ = engine(build("fedsmoo", rho=rho, lam=lam, clip_mode="reference",
                           clip_norm=clip_norm), 3)
  np.testing.assert_allclose(server.params["w"], x, rtol=0, atol=ATOL)


# ---- options -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,field,value", [
    ("fedsam", "rho", -0.1), ("fedsam", "perturb_eps", 0.0), ("fedsam", "clip_mode", "torch"),
    ("mofedsam", "alpha", 1.5), ("mofedsam", "clip_norm", 0.0),
    ("fedsmoo", "lam", 0.0), ("fedsmoo", "global_perturbation", "mean"),
    ("fedgamma", "perturbation", "global"), ("fedgamma", "rho", float("nan")),
])
def test_bad_hyper_parameters_name_the_field(name, field, value):
  with pytest.raises(HparamError, match=field):
    build(name, **{field: value})
