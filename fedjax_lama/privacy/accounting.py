"""Privacy accounting of user-level DP with Google's dp-accounting library.

A round releases the noised sum of its cohort's clipped updates: a Gaussian query of noise
multiplier sigma on a sampled cohort. Poisson cohorts (rate q) are accounted as
`PoissonSampledDpEvent(q, GaussianDpEvent(sigma))` under add/remove-one adjacency (RDP or PLD
accountant); fixed-size cohorts (m of N, uniform without replacement) as
`SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(sigma / 2))` under replace-one
adjacency, which only the RDP accountant takes (replacing a client moves the clipped sum by up
to 2C: see `release_event`). A fixed-size cohort is never given Poisson amplification: that
would understate epsilon.

The RDP accountant works from the Renyi DP of the sampled Gaussian (Mironov, Talwar, Zhang,
"Renyi Differential Privacy of the Sampled Gaussian Mechanism", 2019) and converts it to
(epsilon, delta) with the bound of Canonne, Kamath, Steinke, NeurIPS 2020 (Proposition 12);
the PLD accountant composes privacy loss distributions (Doroshenko, Ghazi, Kamath, Kumar,
Manurangsi, "Connect the Dots", PETS 2022), usually tighter. Every epsilon
is reported with its accountant and the library's version, because conversions change
between versions.

Needs the `privacy` extra: pip install 'fedjax-lama[privacy]' (dp-accounting==0.6.0); from a
checkout, at its root: pip install -c constraints.txt -e ".[privacy]".
"""
import dataclasses
import importlib.metadata
from typing import Optional, Sequence

import numpy as np

from fedjax_lama.errors import FedjaxLamaError, HparamError, require, require_one_of
from fedjax_lama.privacy.dp_options import (ACCOUNTANTS, DpOptions, SamplingOptions,
                                            check_accountant_takes_sampling, check_delta,
                                            update_noise_multiplier)


class MissingDependencyError(FedjaxLamaError, ImportError):
  """An optional package the requested feature needs is not installed."""


try:
  import dp_accounting
  from dp_accounting import mechanism_calibration
  from dp_accounting import pld as dp_pld
  from dp_accounting import rdp as dp_rdp
except ImportError:
  raise MissingDependencyError(
      "privacy accounting needs dp-accounting: pip install 'fedjax-lama[privacy]' (from a "
      "checkout, at its root: pip install -c constraints.txt -e \".[privacy]\"; or pip "
      "install dp-accounting==0.6.0)") from None

LIBRARY = "dp-accounting"
LIBRARY_VERSION = importlib.metadata.version(LIBRARY)


@dataclasses.dataclass(frozen=True)
class PrivacyReport:
  """An (epsilon, delta) guarantee and what computed it."""
  epsilon: float
  delta: float
  accountant: str        # "rdp" or "pld"
  library_version: str   # dp-accounting's version

  def __str__(self) -> str:
    return (f"epsilon={self.epsilon:.4g} at delta={self.delta:.3g} "
            f"({self.accountant.upper()} accountant, {LIBRARY} {self.library_version})")


def _gaussian(noise_multiplier: float) -> "dp_accounting.DpEvent":
  require(isinstance(noise_multiplier, (int, float)) and not isinstance(noise_multiplier, bool)
          and noise_multiplier >= 0, "privacy.noise_multiplier", noise_multiplier,
          "a number >= 0")
  return dp_accounting.GaussianDpEvent(noise_multiplier)


def release_event(sampling: SamplingOptions, noise_multiplier: float) -> "dp_accounting.DpEvent":
  """One noised sum of the cohort's clipped updates, as the accountant must see it.

  Noise N(0, sigma^2 C^2) on a sum of updates clipped to C. Under add/remove-one adjacency
  (Poisson cohorts) one client moves the sum by at most C: a Gaussian query of multiplier
  sigma. Under replace-one adjacency (fixed-size cohorts) replacing a client's update moves it
  by up to 2C, so the query's multiplier relative to its sensitivity is sigma / 2.
  dp-accounting 0.6.0 defines `GaussianDpEvent`'s multiplier relative to the clip C but uses it
  as relative to the sensitivity in its replace-one formulas (google/differential-privacy
  issue 378), which would understate the Renyi divergence four-fold; the halving says it right.
  """
  if sampling.kind == "fixed":
    return _gaussian(noise_multiplier / 2)
  return _gaussian(noise_multiplier)


def sampled_event(sampling: SamplingOptions, release) -> "dp_accounting.DpEvent":
  """`release` (an event on the whole cohort) on a cohort drawn as `sampling` says."""
  if sampling.kind == "poisson":
    return dp_accounting.PoissonSampledDpEvent(sampling.rate, release)
  return dp_accounting.SampledWithoutReplacementDpEvent(
      sampling.num_clients, sampling.cohort_size, release)


def round_event(sampling: SamplingOptions, noise_multiplier: float) -> "dp_accounting.DpEvent":
  """One round: a Gaussian query of multiplier sigma on the sampled cohort."""
  return sampled_event(sampling, release_event(sampling, noise_multiplier))


def training_event(sampling: SamplingOptions, noise_multiplier: float,
                   rounds: int) -> "dp_accounting.DpEvent":
  """`rounds` rounds, each sampling a fresh cohort."""
  _check_rounds(rounds)
  return dp_accounting.SelfComposedDpEvent(round_event(sampling, noise_multiplier), rounds)


def schedule_event(sampling: SamplingOptions, noise_multiplier: float,
                   releases_per_round: Sequence[int]) -> "dp_accounting.DpEvent":
  """Rounds with several releases each, e.g. FedLAMA's per-layer synchronisations.

  Under FedLAMA (Lee et al., AAAI 2023) each synchronisation of a set of layers releases a
  noised sum of that set, clipped to C and noised with multiplier sigma. The k releases of one
  round's cohort together are one Gaussian query of sensitivity sqrt(k) C and noise sigma C per
  coordinate, i.e. of multiplier sigma / sqrt(k), exactly (the k releases may cover the same or
  different layers); that query is then sampled like any round. Rounds without a release cost
  nothing. A round here is one draw of the cohort: under FedLAMA with one cohort per window,
  one window.

  Args:
    sampling: how each round's cohort is drawn.
    noise_multiplier: sigma of every release.
    releases_per_round: k_r >= 0 for every round r, in order.
  """
  counts = list(releases_per_round)
  require(len(counts) > 0 and all(isinstance(k, (int, np.integer)) and not isinstance(k, bool)
                                  and k >= 0 for k in counts),
          "releases_per_round", counts, "a non-empty list of ints >= 0")
  counts = [int(k) for k in counts]
  events = [dp_accounting.SelfComposedDpEvent(
      round_event(sampling, noise_multiplier / np.sqrt(k)), counts.count(k))
            for k in sorted(set(counts)) if k > 0]
  return dp_accounting.ComposedDpEvent(events)


def make_accountant(accountant: str, sampling_kind: str,
                    rdp_orders: Optional[Sequence[float]] = None
                    ) -> "dp_accounting.PrivacyAccountant":
  """A fresh accountant under the adjacency the sampling needs.

  `rdp_orders`: the RDP accountant's orders (dp-accounting's defaults when None).
  """
  require_one_of("privacy.accountant", accountant, ACCOUNTANTS)
  check_accountant_takes_sampling(accountant, sampling_kind)
  relation = (dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE if sampling_kind == "poisson"
              else dp_accounting.NeighboringRelation.REPLACE_ONE)
  if accountant == "rdp":
    return dp_rdp.RdpAccountant(orders=rdp_orders, neighboring_relation=relation)
  return dp_pld.PLDAccountant(neighboring_relation=relation)


def epsilon_of_event(event, sampling: SamplingOptions, delta: float, accountant: str = "rdp",
                     rdp_orders: Optional[Sequence[float]] = None) -> PrivacyReport:
  """The epsilon of `event` at `delta` under the accountant named."""
  check_delta(delta, sampling.num_clients)
  composed = make_accountant(accountant, sampling.kind, rdp_orders).compose(event)
  return PrivacyReport(float(composed.get_epsilon(delta)), float(delta), accountant,
                       LIBRARY_VERSION)


def epsilon(sampling: SamplingOptions, noise_multiplier: float, rounds: int, delta: float,
            accountant: str = "rdp", rdp_orders: Optional[Sequence[float]] = None
            ) -> PrivacyReport:
  """epsilon at delta after `rounds` rounds of multiplier sigma on cohorts drawn by `sampling`."""
  return epsilon_of_event(training_event(sampling, noise_multiplier, rounds), sampling, delta,
                          accountant, rdp_orders)


def options_epsilon(options: DpOptions, rounds: int) -> PrivacyReport:
  """The guarantee of `rounds` rounds run with `options` (its sampling, sigma, delta, accountant).

  Under adaptive clipping the configured sigma is what the updates and the count cost together
  (Andrew et al., NeurIPS 2021, Theorem 1), so it is the sigma accounted.
  """
  return epsilon(options.sampling, options.noise_multiplier, rounds, options.delta,
                 options.accountant)


def schedule_epsilon(sampling: SamplingOptions, noise_multiplier: float,
                     releases_per_round: Sequence[int], delta: float, accountant: str = "rdp",
                     rdp_orders: Optional[Sequence[float]] = None) -> PrivacyReport:
  """epsilon at delta of a schedule of releases (see `schedule_event`)."""
  return epsilon_of_event(schedule_event(sampling, noise_multiplier, releases_per_round),
                          sampling, delta, accountant, rdp_orders)


def calibrate_noise_multiplier(sampling: SamplingOptions, target_epsilon: float, delta: float,
                               rounds: int, accountant: str = "rdp", tolerance: float = 1e-6,
                               max_noise_multiplier: float = 1e3) -> float:
  """The smallest sigma whose `rounds` rounds cost at most `target_epsilon` at `delta`.

  Brent's method over sigma (dp-accounting's `calibrate_dp_mechanism`); the returned sigma
  meets the target (its epsilon is at most `target_epsilon`) and is within `tolerance` of the
  smallest one that does.

  Raises:
    HparamError naming privacy.target_epsilon when even `max_noise_multiplier` costs more than
    the target (the error gives the epsilon it costs).
  """
  require(isinstance(target_epsilon, (int, float)) and not isinstance(target_epsilon, bool)
          and target_epsilon > 0, "privacy.target_epsilon", target_epsilon, "a number > 0")
  check_delta(delta, sampling.num_clients)
  _check_rounds(rounds)

  def make_fresh():
    return make_accountant(accountant, sampling.kind)

  def make_event(sigma):
    # sigma = 0 publishes the sum (epsilon infinite); said as such, because the accountant's
    # formula for sampling without replacement divides by sigma.
    if sigma == 0:
      return dp_accounting.NonPrivateDpEvent()
    return training_event(sampling, sigma, rounds)

  floor = make_fresh().compose(make_event(max_noise_multiplier)).get_epsilon(delta)
  if floor > target_epsilon:
    raise HparamError("privacy.target_epsilon", target_epsilon,
                      f"a value >= {floor:.4g}, the epsilon of noise_multiplier="
                      f"{max_noise_multiplier:g} at delta={delta:g} over {rounds} rounds "
                      f"({accountant.upper()} accountant)")
  return float(mechanism_calibration.calibrate_dp_mechanism(
      make_fresh, make_event, target_epsilon, delta,
      bracket_interval=mechanism_calibration.ExplicitBracketInterval(0, max_noise_multiplier),
      tol=tolerance))


def calibrate_noise_multiplier_adaptive(sampling: SamplingOptions, target_epsilon: float,
                                        delta: float, rounds: int, count_stddev: float,
                                        accountant: str = "rdp", tolerance: float = 1e-6):
  """(sigma, sigma_delta) for adaptive clipping: the pair costs what sigma alone costs.

  Andrew et al., NeurIPS 2021 (Theorem 1). Refuses a target that the count's noise alone
  already exceeds (sigma >= 2 sigma_b), naming privacy.target_epsilon.
  """
  sigma = calibrate_noise_multiplier(sampling, target_epsilon, delta, rounds, accountant,
                                     tolerance)
  if sigma >= 2 * count_stddev:
    raise HparamError("privacy.target_epsilon", target_epsilon,
                      f"a target whose noise multiplier ({sigma:.4g}) is below 2 * "
                      f"privacy.adaptive.count_stddev = {2 * count_stddev:.4g}")
  return sigma, update_noise_multiplier(sigma, count_stddev)


def _check_rounds(rounds) -> None:
  require(isinstance(rounds, int) and not isinstance(rounds, bool) and rounds >= 1,
          "privacy.rounds", rounds, "an int >= 1")
