"""Typed options of user-level differential privacy, checked once where they are built.

Every refusal is one line naming the field (`privacy.<name>`) and what is accepted
(`HparamError`), so a config layer can hand these fields through unchanged.

The noise multiplier of the model updates under adaptive clipping follows Andrew, Thakkar,
McMahan, Ramaswamy, "Differentially Private Learning with Adaptive Clipping", NeurIPS 2021
(Theorem 1): releasing the noised count of unclipped clients with noise std sigma_b beside the
updates noised with sigma_delta costs what one Gaussian query with multiplier sigma costs when
sigma_delta = (sigma^-2 - (2 sigma_b)^-2)^(-1/2).
"""
import dataclasses
import math
import numbers
import warnings
from typing import Optional, Tuple, Union

from fedjax_lama.errors import HparamError, require, require_one_of
from fedjax_lama.privacy.clipping import CLIPPINGS
# How the overall clip C is shared among the layers under per-layer clipping (McMahan et al.,
# ICLR 2018, Sec. "Per-layer clipping"): C_l^2 = C^2 / L ("equal") or C_l^2 = C^2 d_l / d
# ("size", d_l the layer's parameter count); an explicit tuple gives the shares C_l^2 / C^2.
LAYER_SPLITS = ("equal", "size")
SAMPLINGS = ("poisson", "fixed")
ACCOUNTANTS = ("rdp", "pld")


def _is_number(value) -> bool:
  return (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and math.isfinite(float(value)))


def _is_count(value) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class SamplingOptions:
  """How each round's cohort is drawn; the accountant relies on it.

  Attributes:
    kind: "poisson": every client joins independently with probability `rate` (the cohort
      size varies; accounted with Poisson amplification under add/remove-one adjacency);
      "fixed": `cohort_size` clients uniformly without replacement (accounted as sampling
      without replacement under replace-one adjacency, never as Poisson).
    num_clients: population size N.
    rate: q in (0, 1], Poisson only.
    cohort_size: m in [1, N], fixed only.
  """
  kind: str
  num_clients: int
  rate: Optional[float] = None
  cohort_size: Optional[int] = None

  def __post_init__(self):
    require_one_of("privacy.sampling", self.kind, SAMPLINGS)
    require(_is_count(self.num_clients) and self.num_clients >= 1, "privacy.num_clients",
            self.num_clients, "an int >= 1")
    if self.kind == "poisson":
      require(_is_number(self.rate) and 0 < self.rate <= 1, "privacy.rate", self.rate,
              "a sampling rate q in (0, 1]")
    else:
      require(_is_count(self.cohort_size) and 1 <= self.cohort_size <= self.num_clients,
              "privacy.cohort_size", self.cohort_size,
              f"an int in [1, num_clients={self.num_clients}]")

  @property
  def expected_cohort(self) -> float:
    """The fixed denominator of the noised mean: q N (Poisson) or m (fixed)."""
    if self.kind == "poisson":
      return self.rate * self.num_clients
    return float(self.cohort_size)

  @property
  def sampling_fraction(self) -> float:
    """q for Poisson, m / N for fixed-size cohorts."""
    return self.rate if self.kind == "poisson" else self.cohort_size / self.num_clients


@dataclasses.dataclass(frozen=True)
class AdaptiveClipOptions:
  """Andrew et al., NeurIPS 2021: the clip tracks the `target_quantile` of update norms.

  Attributes:
    target_quantile: gamma in [0, 1], the fraction of clients meant to be left unclipped.
    learning_rate: eta > 0 of the geometric update C <- C exp(-eta (b - gamma)).
    count_stddev: sigma_b >= 0, std of the Gaussian noise on the count of unclipped clients
      (TF Privacy's default is expected cohort / 20); it must exceed noise_multiplier / 2,
      so 0 only without privacy (noise_multiplier 0).
  """
  target_quantile: float = 0.5
  learning_rate: float = 0.2
  count_stddev: float = 1.0

  def __post_init__(self):
    require(_is_number(self.target_quantile) and 0 <= self.target_quantile <= 1,
            "privacy.adaptive.target_quantile", self.target_quantile, "a number in [0, 1]")
    require(_is_number(self.learning_rate) and self.learning_rate > 0,
            "privacy.adaptive.learning_rate", self.learning_rate, "a number > 0")
    require(_is_number(self.count_stddev) and self.count_stddev >= 0,
            "privacy.adaptive.count_stddev", self.count_stddev, "a number >= 0")


@dataclasses.dataclass(frozen=True)
class DpOptions:
  """Central user-level DP over any synchronous algorithm (DP-FedAvg).

  McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language Models",
  ICLR 2018: each sampled client's update is clipped in L2 to `clip_norm`, the clipped updates
  are summed with uniform weights, Gaussian noise N(0, sigma^2 C^2) is added once to the sum,
  and the sum is divided by the expected cohort size (a fixed denominator, so that one client
  changes the released mean by at most C / expected cohort).

  Attributes:
    noise_multiplier: sigma >= 0, the noise of one release in units of the clip (under
      adaptive clipping, the cost of the updates and the count together).
    clip_norm: C > 0, the clip of the whole update (the initial clip when adaptive).
    sampling: how cohorts are drawn (SamplingOptions).
    delta: the delta of the reported (epsilon, delta), in (0, 1).
    clipping: a rule of privacy/clipping.py CLIPPINGS: "flat" (one L2 clip over the whole
      model), "per_layer" or "automatic".
    layer_split: under per-layer clipping, how C is shared among layers: "equal", "size", or
      a tuple of shares C_l^2 / C^2 (one per leaf, summing to 1).
    adaptive: AdaptiveClipOptions, or None for a fixed clip.
    accountant: "rdp" or "pld" (the PLD accountant refuses fixed-size cohorts).
  """
  noise_multiplier: float
  clip_norm: float
  sampling: SamplingOptions
  delta: float = 1e-6
  clipping: str = "flat"
  layer_split: Union[str, Tuple[float, ...]] = "equal"
  adaptive: Optional[AdaptiveClipOptions] = None
  accountant: str = "rdp"

  def __post_init__(self):
    require(_is_number(self.noise_multiplier) and self.noise_multiplier >= 0,
            "privacy.noise_multiplier", self.noise_multiplier, "a number >= 0")
    require(_is_number(self.clip_norm) and self.clip_norm > 0, "privacy.clip_norm",
            self.clip_norm, "a number > 0")
    require(isinstance(self.sampling, SamplingOptions), "privacy.sampling", self.sampling,
            "a SamplingOptions")
    check_delta(self.delta, self.sampling.num_clients)
    require_one_of("privacy.clipping", self.clipping, CLIPPINGS)
    if isinstance(self.layer_split, tuple):
      require(all(_is_number(s) and s > 0 for s in self.layer_split)
              and abs(sum(self.layer_split) - 1) < 1e-6, "privacy.layer_split",
              self.layer_split, "positive shares summing to 1, 'equal' or 'size'")
    else:
      require_one_of("privacy.layer_split", self.layer_split, LAYER_SPLITS)
    require_one_of("privacy.accountant", self.accountant, ACCOUNTANTS)
    check_accountant_takes_sampling(self.accountant, self.sampling.kind)
    if self.adaptive is not None:
      require(isinstance(self.adaptive, AdaptiveClipOptions), "privacy.adaptive",
              self.adaptive, "an AdaptiveClipOptions or None")
      # The indicator "left unclipped" is defined on the whole-model norm; per-layer clips
      # would need one quantile per layer, which the paper does not analyse.
      require(CLIPPINGS[self.clipping].adaptive, "privacy.clipping", self.clipping,
              " or ".join(repr(n) for n, r in CLIPPINGS.items() if r.adaptive)
              + " when privacy.adaptive is set")
      update_noise_multiplier(self.noise_multiplier, self.adaptive.count_stddev)

  @property
  def update_noise_multiplier(self) -> float:
    """sigma_delta, the multiplier of the noise on the summed updates."""
    if self.adaptive is None:
      return float(self.noise_multiplier)
    return update_noise_multiplier(self.noise_multiplier, self.adaptive.count_stddev)


def check_delta(delta, num_clients: int) -> None:
  """Refuses delta outside (0, 1); warns when it exceeds 1 / num_clients.

  A delta above 1/N allows a mechanism that publishes one user's data outright, so the
  guarantee says little; it is allowed, with one warning line.
  """
  require(_is_number(delta) and 0 < delta < 1, "privacy.delta", delta, "a number in (0, 1)")
  if delta > 1 / num_clients:
    warnings.warn(f"privacy.delta={delta!r} is above 1/num_clients={1 / num_clients:.3g}: "
                  "the guarantee allows one user's data to be published", UserWarning,
                  stacklevel=3)


def check_accountant_takes_sampling(accountant: str, sampling: str) -> None:
  """The PLD accountant of dp-accounting cannot account sampling without replacement."""
  require(not (accountant == "pld" and sampling == "fixed"), "privacy.accountant", accountant,
          "'rdp' with privacy.sampling='fixed' (fixed-size cohorts are accounted with "
          "replace-one adjacency, which only the RDP accountant takes)")


def update_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
  """sigma_delta = (sigma^-2 - (2 sigma_b)^-2)^(-1/2) (Andrew et al., NeurIPS 2021, Thm. 1).

  The count of unclipped clients, centred as sum_i (b_i - 1/2), has sensitivity 1/2, so its
  noise sigma_b is a Gaussian query of multiplier 2 sigma_b; the two queries compose to one of
  multiplier sigma exactly when the equation holds. It has a solution only when
  2 sigma_b > sigma; otherwise the count alone costs more than the whole budget. Under
  replace-one adjacency both sensitivities double (2C and 1), so the same split holds.
  """
  if noise_multiplier == 0:
    return 0.0  # no privacy asked: nothing to share between the two queries
  if 2 * count_stddev <= noise_multiplier:
    raise HparamError("privacy.adaptive.count_stddev", count_stddev,
                      f"a number > noise_multiplier / 2 = {noise_multiplier / 2:.6g} (the "
                      "count's noise must cost less than the whole budget)")
  return (noise_multiplier ** -2 - (2 * count_stddev) ** -2) ** -0.5


# ---- what the noise does to the averaged update ------------------------------------------------
def noise_std_on_mean(options: DpOptions) -> float:
  """The std of the noise on every coordinate of the averaged update: sigma C / (q N).

  The sum of the clipped updates gets N(0, sigma^2 C^2) per coordinate and is divided by the
  expected cohort q N (m for a fixed-size cohort), so the released mean carries
  sigma C / (q N); sigma is the update's multiplier (sigma_delta under adaptive clipping, at
  the initial clip C). One client moves that mean by at most C / (q N), and the mean of the
  clipped updates has norm at most C.
  """
  return (options.update_noise_multiplier * options.clip_norm
          / options.sampling.expected_cohort)


def noise_statement(options: DpOptions, num_parameters: int) -> str:
  """The one line a DP run logs at its start: sigma, the expected cohort and the noise std on
  the averaged update beside the clip C, with the noise's norm over the model's parameters
  (about std sqrt(d)) against C, the largest norm the mean of clipped updates can have."""
  sigma = options.update_noise_multiplier
  std = noise_std_on_mean(options)
  norm = std * math.sqrt(num_parameters)
  clip = options.clip_norm
  adaptive = options.adaptive is not None
  sigma_text = (f"sigma = {options.noise_multiplier:.4g} (sigma_delta = {sigma:.4g} on the "
                "updates)" if adaptive else f"sigma = {sigma:.4g}")
  line = (f"differential privacy: {sigma_text}, expected cohort "
          f"{options.sampling.expected_cohort:g} clients, noise std on the averaged update "
          f"sigma C / cohort = {std:.4g} per coordinate beside the "
          f"{'initial ' if adaptive else ''}clip C = {clip:g}; over the "
          f"model's {num_parameters:,} parameters its norm is about {norm:.4g}, "
          f"{norm / clip:.3g} x C (the mean of the clipped updates has norm at most C)")
  if norm > clip:
    line += ("; each round's noise is larger than any averaged update can be: a larger "
             "expected cohort lowers it (docs/guide.md, 'The population an epsilon needs')")
  return line
