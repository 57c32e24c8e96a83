"""Poisson cohorts: their inclusion rate, their determinism, and chunks that drop no client."""
import numpy as np
import pytest

from fedjax_lama.errors import HparamError
from fedjax_lama.federation import Sampler
from fedjax_lama.privacy import (SamplingOptions, cohort_chunks, poisson_capacity,
                                 poisson_cohort, sample_cohort)


def test_the_inclusion_rate_is_q():
  num_clients, q, rounds = 2000, 0.05, 50
  included = np.zeros(num_clients)
  for r in range(rounds):
    included[poisson_cohort(num_clients, q, seed=7, round_idx=r)] += 1
  trials = num_clients * rounds
  # The total is Binomial(trials, q): a 5-sigma band around its mean.
  assert abs(included.sum() - q * trials) < 5 * np.sqrt(trials * q * (1 - q))
  # No client is favoured: each one's count over the rounds is Binomial(rounds, q).
  assert included.max() <= rounds * q + 6 * np.sqrt(rounds * q * (1 - q)) + 1


def test_a_cohort_is_a_function_of_seed_and_round_only():
  first = [poisson_cohort(500, 0.1, seed=3, round_idx=r) for r in range(5)]
  again = poisson_cohort(500, 0.1, seed=3, round_idx=4)  # no earlier round drawn first
  np.testing.assert_array_equal(first[4], again)
  assert not np.array_equal(first[3], first[4])
  assert not np.array_equal(poisson_cohort(500, 0.1, seed=4, round_idx=4), again)
  # The federation's "bernoulli" sampler draws the same cohorts: the run the accountant means.
  sampler = Sampler(kind="bernoulli", active_ratio=0.1, num_clients=500, seed=3)
  np.testing.assert_array_equal(sampler.sample(4), again)
  np.testing.assert_array_equal(
      sample_cohort(SamplingOptions("poisson", 500, rate=0.1), seed=3, round_idx=4), again)


def test_fixed_size_cohorts_have_their_size():
  ids = sample_cohort(SamplingOptions("fixed", 50, cohort_size=7), seed=1, round_idx=2)
  assert len(ids) == 7 == len(set(ids.tolist()))


def test_a_draw_above_capacity_splits_into_chunks_covering_every_client_once():
  num_clients, q = 1000, 0.3
  capacity = 64
  draw = poisson_cohort(num_clients, q, seed=0, round_idx=0)
  assert len(draw) > 3 * capacity
  chunks = cohort_chunks(draw, capacity)
  assert len(chunks) == -(-len(draw) // capacity)
  assert all(c.client_ids.shape == c.mask.shape == (capacity,) for c in chunks)
  covered = np.concatenate([c.client_ids[c.mask > 0] for c in chunks])
  np.testing.assert_array_equal(np.sort(covered), np.sort(draw))
  assert sum(int(c.mask.sum()) for c in chunks) == len(draw)
  assert chunks[-1].mask.sum() == len(draw) - (len(chunks) - 1) * capacity


def test_an_empty_draw_is_one_masked_chunk():
  (chunk,) = cohort_chunks(np.array([], np.int64), 8)
  assert chunk.mask.sum() == 0 and chunk.client_ids.shape == (8,)
  (exact,) = cohort_chunks(np.arange(8), 8)
  assert exact.mask.sum() == 8


def test_the_capacity_holds_the_mean_plus_four_deviations():
  assert poisson_capacity(10_000, 0.01) == int(np.ceil(100 + 4 * np.sqrt(99)))
  assert poisson_capacity(10, 0.9) == 10  # never beyond the population
  assert poisson_capacity(1000, 1e-6) == 1


@pytest.mark.parametrize("rate", [0, -0.1, 1.5, True, "0.1"])
def test_a_bad_rate_is_refused_naming_it(rate):
  with pytest.raises(HparamError, match=r"^privacy\.rate=.* accepted: a sampling rate q in "
                     r"\(0, 1\]$"):
    poisson_cohort(100, rate, seed=0, round_idx=0)


def test_a_bad_capacity_is_refused_naming_it():
  with pytest.raises(HparamError, match="^capacity=0 "):
    cohort_chunks(np.arange(3), 0)
