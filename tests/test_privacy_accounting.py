"""Accounting: epsilons against a closed form written here, known answers, schedules, refusals."""
import importlib
import math
import sys

import pytest

from fedjax_lama.errors import FedjaxLamaError, HparamError
from fedjax_lama.privacy import (AdaptiveClipOptions, DpOptions, SamplingOptions, accounting,
                                 update_noise_multiplier)

import dp_accounting

# dp-accounting's default RDP orders that are integers: the closed form below holds there.
INTEGER_ORDERS = list(range(2, 64)) + [128, 256, 512, 1024]


def _log_add(a: float, b: float) -> float:
  if a == -math.inf:
    return b
  hi, lo = max(a, b), min(a, b)
  return hi + math.log1p(math.exp(lo - hi))


def sampled_gaussian_rdp(q: float, sigma: float, alpha: int) -> float:
  """RDP at integer order alpha of the Poisson-subsampled Gaussian.

  Mironov, Talwar, Zhang 2019, Sec. 3.3:
  A_alpha = sum_k binom(alpha, k) (1-q)^(alpha-k) q^k exp((k^2 - k) / (2 sigma^2)),
  RDP = log(A_alpha) / (alpha - 1); summed in log space so that alpha = 1024 does not overflow.
  At q = 1 only k = alpha survives: alpha / (2 sigma^2), the Gaussian's own RDP.
  """
  if q == 1:
    return alpha / (2 * sigma ** 2)
  log_a = -math.inf
  for k in range(alpha + 1):
    log_binom = math.lgamma(alpha + 1) - math.lgamma(k + 1) - math.lgamma(alpha - k + 1)
    log_term = (log_binom + (alpha - k) * math.log1p(-q) + k * math.log(q)
                + (k * k - k) / (2 * sigma ** 2))
    log_a = _log_add(log_a, log_term)
  return log_a / (alpha - 1)


def rdp_to_epsilon(orders, rdp, delta: float) -> float:
  """The conversion dp-accounting 0.6.0 uses (rdp_privacy_accountant.compute_epsilon).

  Canonne, Kamath, Steinke, NeurIPS 2020 (Proposition 12):
  epsilon = min over orders of rdp + log(1 - 1/alpha) - log(delta alpha) / (alpha - 1),
  floored at 0 (and 0 outright where delta^2 > 1 - exp(-rdp), the KL bound).
  """
  candidates = []
  for alpha, r in zip(orders, rdp):
    if delta ** 2 + math.expm1(-r) > 0:
      candidates.append(0.0)
    else:
      candidates.append(r + math.log1p(-1 / alpha) - math.log(delta * alpha) / (alpha - 1))
  return max(0.0, min(candidates))


def reference_epsilon(q: float, sigma: float, rounds: int, delta: float) -> float:
  rdp = [rounds * sampled_gaussian_rdp(q, sigma, a) for a in INTEGER_ORDERS]
  return rdp_to_epsilon(INTEGER_ORDERS, rdp, delta)


def poisson(q: float, num_clients: int = 10 ** 4) -> SamplingOptions:
  return SamplingOptions("poisson", num_clients, rate=q)


@pytest.mark.parametrize("q, sigma, rounds, delta", [
    (0.01, 1.0, 1000, 1e-5),
    (0.005, 0.9, 2000, 1e-6),
    (0.1, 2.0, 50, 1e-5),
    (1.0, 5.0, 10, 1e-5),
])
def test_epsilon_equals_the_closed_form_of_the_sampled_gaussian(q, sigma, rounds, delta):
  ours = accounting.epsilon(poisson(q), sigma, rounds, delta, "rdp", rdp_orders=INTEGER_ORDERS)
  assert ours.epsilon == pytest.approx(reference_epsilon(q, sigma, rounds, delta), rel=1e-9)
  assert ours.epsilon > 0


# (q, sigma, T, delta, epsilon RDP, epsilon PLD): dp-accounting 0.6.0, Poisson, add/remove.
KNOWN = [
    (256 / 60000, 1.1, 14062, 1e-5, 2.597, 2.382),
    (0.01, 1.0, 1000, 1e-5, 2.101, 1.828),
    (100 / 3400, 1.0, 1500, 1 / 3400, 6.697, 5.968),
    (1000 / 342477, 1.0, 1500, 1e-6, 1.196, 0.695),
]


@pytest.mark.parametrize("q, sigma, rounds, delta, eps_rdp, eps_pld", KNOWN)
def test_known_epsilons_of_both_accountants(q, sigma, rounds, delta, eps_rdp, eps_pld):
  sampling = poisson(q, num_clients=int(round(1 / delta)))
  rdp = accounting.epsilon(sampling, sigma, rounds, delta, "rdp")
  pld = accounting.epsilon(sampling, sigma, rounds, delta, "pld")
  assert rdp.epsilon == pytest.approx(eps_rdp, abs=6e-4)
  assert pld.epsilon == pytest.approx(eps_pld, abs=6e-4)
  assert (rdp.accountant, pld.accountant) == ("rdp", "pld")
  assert rdp.library_version == "0.6.0"
  assert "RDP accountant, dp-accounting 0.6.0" in str(rdp)


def test_a_fixed_size_cohort_costs_at_least_its_poisson_figure():
  fixed = SamplingOptions("fixed", 3400, cohort_size=100)
  poisson_figure = accounting.epsilon(
      SamplingOptions("poisson", 3400, rate=100 / 3400), 1.0, 1500, 1 / 3400).epsilon
  report = accounting.epsilon(fixed, 1.0, 1500, 1 / 3400, "rdp")
  assert report.epsilon >= poisson_figure
  # Accounted as sampling without replacement under replace-one, never as Poisson.
  event = accounting.round_event(fixed, 1.0)
  assert isinstance(event, dp_accounting.SampledWithoutReplacementDpEvent)
  assert (event.source_dataset_size, event.sample_size) == (3400, 100)
  # Replacing a client moves the clipped sum by up to 2C: the library sees multiplier sigma / 2.
  assert event.event == dp_accounting.GaussianDpEvent(0.5)
  # The known answer of the library's event at multiplier 1 (13.78) is our sigma = 2.
  library = dp_accounting.rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  library.compose(dp_accounting.SelfComposedDpEvent(
      dp_accounting.SampledWithoutReplacementDpEvent(3400, 100, dp_accounting.GaussianDpEvent(1.0)),
      1500))
  assert library.get_epsilon(1 / 3400) == pytest.approx(13.78, abs=6e-3)
  assert accounting.epsilon(fixed, 2.0, 1500, 1 / 3400).epsilon == pytest.approx(13.78, abs=6e-3)
  assert report.epsilon > 13.78


def test_the_pld_accountant_refuses_a_fixed_size_cohort():
  with pytest.raises(HparamError, match=r"^privacy\.accountant='pld' .*'rdp'"):
    accounting.epsilon(SamplingOptions("fixed", 100, cohort_size=10), 1.0, 10, 1e-3, "pld")


def test_a_schedule_of_releases_against_a_hand_computed_epsilon():
  # Without sampling (q = 1) the 6 releases of [2, 0, 1, 3] compose to RDP 6 alpha / (2 sigma^2).
  sigma, delta = 8.0, 1e-5
  rdp = [6 * a / (2 * sigma ** 2) for a in INTEGER_ORDERS]
  ours = accounting.schedule_epsilon(poisson(1.0), sigma, [2, 0, 1, 3], delta,
                                     rdp_orders=INTEGER_ORDERS)
  assert ours.epsilon == pytest.approx(rdp_to_epsilon(INTEGER_ORDERS, rdp, delta), rel=1e-9)
  # With sampling, k releases on one cohort are one Gaussian query of multiplier sigma/sqrt(k).
  q, sigma, delta = 0.02, 1.5, 1e-6
  schedule = [2] * 40 + [0] * 7 + [1] * 30
  rdp = [40 * sampled_gaussian_rdp(q, sigma / math.sqrt(2), a)
         + 30 * sampled_gaussian_rdp(q, sigma, a) for a in INTEGER_ORDERS]
  ours = accounting.schedule_epsilon(poisson(q), sigma, schedule, delta,
                                     rdp_orders=INTEGER_ORDERS)
  assert ours.epsilon == pytest.approx(rdp_to_epsilon(INTEGER_ORDERS, rdp, delta), rel=1e-9)


def test_one_release_per_round_is_plain_training():
  sampling = poisson(0.01)
  assert accounting.schedule_epsilon(sampling, 1.1, [1] * 300, 1e-6).epsilon == pytest.approx(
      accounting.epsilon(sampling, 1.1, 300, 1e-6).epsilon, rel=1e-12)


@pytest.mark.parametrize("bad", [[], [1, -1], [1.5], [True]])
def test_a_bad_schedule_is_refused_naming_it(bad):
  with pytest.raises(HparamError, match="^releases_per_round="):
    accounting.schedule_epsilon(poisson(0.1), 1.0, bad, 1e-6)


def test_calibration_meets_the_target_and_is_tight():
  sampling, delta, rounds = poisson(0.01), 1e-6, 500
  sigma = accounting.calibrate_noise_multiplier(sampling, 3.0, delta, rounds, "rdp")
  assert accounting.epsilon(sampling, sigma, rounds, delta).epsilon <= 3.0
  assert accounting.epsilon(sampling, sigma - 1e-4, rounds, delta).epsilon > 3.0


def test_an_unreachable_target_is_refused_naming_it():
  with pytest.raises(HparamError, match=r"^privacy\.target_epsilon=0\.001 .*accepted: a value "
                     r">= [0-9.]+, the epsilon of noise_multiplier=1000"):
    accounting.calibrate_noise_multiplier(poisson(0.005), 1e-3, 1e-6, 2000, "rdp")
  with pytest.raises(HparamError, match=r"^privacy\.target_epsilon=0 "):
    accounting.calibrate_noise_multiplier(poisson(0.005), 0, 1e-6, 2000, "rdp")


def test_adaptive_clipping_splits_the_budget_so_the_pair_costs_sigma():
  # Andrew et al., Theorem 1: Gaussian(sigma_delta) with Gaussian(2 sigma_b) costs Gaussian(sigma).
  sigma, count_stddev = 1.2, 5.0
  sigma_delta = update_noise_multiplier(sigma, count_stddev)
  assert sigma_delta == pytest.approx((sigma ** -2 - (2 * count_stddev) ** -2) ** -0.5)
  pair = dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(sigma_delta),
                                        dp_accounting.GaussianDpEvent(2 * count_stddev)])
  sampling = poisson(1.0, num_clients=1000)
  assert accounting.epsilon_of_event(pair, sampling, 1e-5).epsilon == pytest.approx(
      accounting.epsilon(sampling, sigma, 1, 1e-5).epsilon, rel=1e-9)
  sigma, sigma_delta = accounting.calibrate_noise_multiplier_adaptive(
      poisson(0.01), 3.0, 1e-6, 200, count_stddev=5.0)
  assert sigma_delta == pytest.approx(update_noise_multiplier(sigma, 5.0))
  with pytest.raises(HparamError, match=r"^privacy\.target_epsilon=0\.1 "):
    accounting.calibrate_noise_multiplier_adaptive(poisson(0.01), 0.1, 1e-6, 200,
                                                   count_stddev=1.0)


def test_importing_the_accountant_without_dp_accounting_names_the_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "dp_accounting", None)  # makes `import dp_accounting` fail
  monkeypatch.delitem(sys.modules, "fedjax_lama.privacy.accounting")
  with pytest.raises(ImportError) as raised:
    importlib.import_module("fedjax_lama.privacy.accounting")
  assert isinstance(raised.value, FedjaxLamaError)
  message = str(raised.value)
  assert "\n" not in message and "pip install 'fedjax-lama[privacy]'" in message
  assert 'pip install -c constraints.txt -e ".[privacy]"' in message  # a checkout's command


def test_both_accountants_take_a_schedule():
  # k releases per round are one query of multiplier sigma / sqrt(k), under either accountant.
  sampling = poisson(0.02)
  for name in ("rdp", "pld"):
    assert accounting.schedule_epsilon(sampling, 1.5, [3] * 50 + [0] * 5, 1e-6, name).epsilon \
        == pytest.approx(accounting.epsilon(sampling, 1.5 / math.sqrt(3), 50, 1e-6, name).epsilon,
                         rel=1e-9)
  assert accounting.schedule_epsilon(sampling, 1.5, [0, 0], 1e-6, "pld").epsilon == 0


def test_the_options_guarantee_is_that_of_their_sampling_sigma_and_delta():
  sampling = poisson(0.01)
  options = DpOptions(noise_multiplier=1.1, clip_norm=0.3, sampling=sampling, delta=1e-5,
                      accountant="pld", adaptive=AdaptiveClipOptions(count_stddev=5.0))
  report = accounting.options_epsilon(options, 300)
  assert report == accounting.epsilon(sampling, 1.1, 300, 1e-5, "pld")
  assert report.accountant == "pld"
