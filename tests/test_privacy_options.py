"""Every bad privacy option stops with one line naming its field."""
import warnings

import pytest

from fedjax_lama.errors import HparamError
from fedjax_lama.privacy import AdaptiveClipOptions, DpOptions, SamplingOptions

POISSON = SamplingOptions("poisson", 1000, rate=0.01)


def build(**overrides):
  fields = dict(noise_multiplier=1.0, clip_norm=0.5, sampling=POISSON, delta=1e-4)
  fields.update(overrides)
  return DpOptions(**fields)


@pytest.mark.parametrize("make, field", [
    (lambda: build(noise_multiplier=-0.1), "privacy.noise_multiplier"),
    (lambda: build(noise_multiplier=float("nan")), "privacy.noise_multiplier"),
    (lambda: build(clip_norm=0), "privacy.clip_norm"),
    (lambda: build(clip_norm=-1.0), "privacy.clip_norm"),
    (lambda: build(delta=0), "privacy.delta"),
    (lambda: build(delta=1), "privacy.delta"),
    (lambda: build(delta=-1e-5), "privacy.delta"),
    (lambda: build(clipping="global"), "privacy.clipping"),
    (lambda: build(clipping="per_layer", layer_split="sizes"), "privacy.layer_split"),
    (lambda: build(clipping="per_layer", layer_split=(0.5, 0.4)), "privacy.layer_split"),
    (lambda: build(accountant="prv"), "privacy.accountant"),
    (lambda: build(accountant="pld", sampling=SamplingOptions("fixed", 100, cohort_size=10)),
     "privacy.accountant"),
    (lambda: build(clipping="per_layer", adaptive=AdaptiveClipOptions(count_stddev=5.0)),
     "privacy.clipping"),
    (lambda: build(noise_multiplier=2.0, adaptive=AdaptiveClipOptions(count_stddev=1.0)),
     "privacy.adaptive.count_stddev"),
    (lambda: SamplingOptions("poisson", 1000, rate=0), "privacy.rate"),
    (lambda: SamplingOptions("poisson", 1000, rate=1.01), "privacy.rate"),
    (lambda: SamplingOptions("poisson", 1000), "privacy.rate"),
    (lambda: SamplingOptions("fixed", 1000, cohort_size=0), "privacy.cohort_size"),
    (lambda: SamplingOptions("fixed", 10, cohort_size=11), "privacy.cohort_size"),
    (lambda: SamplingOptions("shuffle", 10, rate=0.5), "privacy.sampling"),
    (lambda: SamplingOptions("poisson", 0, rate=0.5), "privacy.num_clients"),
    (lambda: AdaptiveClipOptions(target_quantile=1.5), "privacy.adaptive.target_quantile"),
    (lambda: AdaptiveClipOptions(learning_rate=0), "privacy.adaptive.learning_rate"),
    (lambda: AdaptiveClipOptions(count_stddev=-1), "privacy.adaptive.count_stddev"),
])
def test_each_bad_option_is_refused_in_one_line_naming_its_field(make, field):
  with pytest.raises(HparamError) as raised:
    make()
  message = str(raised.value)
  assert message.startswith(field + "=") and "accepted:" in message
  assert "\n" not in message
  assert raised.value.field == field


def test_a_delta_above_one_over_the_population_warns_in_one_line():
  with pytest.warns(UserWarning) as caught:
    build(delta=0.01)  # 1 / num_clients = 0.001
  (warning,) = caught
  assert str(warning.message).startswith("privacy.delta=0.01 is above 1/num_clients")
  assert "\n" not in str(warning.message)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    build(delta=1e-3)  # at 1/N: no warning


def test_good_options_and_their_derived_values():
  opts = build()
  assert opts.sampling.expected_cohort == pytest.approx(10.0)
  assert opts.update_noise_multiplier == 1.0
  fixed = SamplingOptions("fixed", 200, cohort_size=20)
  assert (fixed.expected_cohort, fixed.sampling_fraction) == (20.0, 0.1)
  adaptive = build(adaptive=AdaptiveClipOptions(count_stddev=2.0))
  assert adaptive.update_noise_multiplier == pytest.approx((1 - 1 / 16) ** -0.5)
  no_privacy = build(noise_multiplier=0.0, adaptive=AdaptiveClipOptions(count_stddev=0.0))
  assert no_privacy.update_noise_multiplier == 0.0
