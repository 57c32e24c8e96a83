"""Tests of cohort packing and client sampling (fedjax_lama.data)."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedjax_lama import data
from fedjax_lama.data import packing
from fedjax_lama.data import sampling

_SETTINGS = settings(max_examples=40, deadline=None)


def _clients(sizes, seed=0):
  """Disjoint index arrays of the given sizes, scattered over a big range."""
  rng = np.random.default_rng(seed)
  rows = rng.permutation(max(1, 3 * sum(sizes)))
  offsets = np.concatenate([[0], np.cumsum(sizes)])
  return [rows[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def _row(batch: data.CohortBatch, i: int, steps: int):
  """Client slot i's first `steps` steps (indices, example_mask, step_mask)."""
  return (batch.indices[i, :steps], batch.example_mask[i, :steps],
          batch.step_mask[i, :steps])


def _assert_consistent(batch: data.CohortBatch, client_indices):
  c, s, b = batch.indices.shape
  assert batch.indices.dtype == np.int32
  assert batch.example_mask.dtype == np.float32
  assert batch.example_mask.shape == (c, s, b)
  assert batch.step_mask.shape == (c, s) and batch.step_mask.dtype == np.float32
  assert batch.client_mask.shape == (c,)
  assert batch.client_ids.dtype == np.int32
  assert batch.num_examples.dtype == np.float32
  assert set(np.unique(batch.example_mask)) <= {0.0, 1.0}
  # Padding is index 0; a step is real iff it has a real example; a slot is
  # real iff its client has data.
  assert np.all(batch.indices[batch.example_mask == 0] == 0)
  np.testing.assert_array_equal(batch.step_mask,
                                batch.example_mask.max(axis=2, initial=0))
  assert np.all(batch.example_mask.sum(axis=(1, 2))[batch.client_mask == 0]
                == 0)
  for i, idx in enumerate(client_indices):
    assert batch.num_examples[i] == len(idx)
    assert batch.client_mask[i] == (1.0 if len(idx) else 0.0)
    used = batch.indices[i][batch.example_mask[i] == 1]
    assert np.all(np.isin(used, idx))
  assert np.all(batch.client_mask[len(client_indices):] == 0)
  assert np.all(batch.num_examples[len(client_indices):] == 0)
  assert np.all(batch.client_ids[len(client_indices):] == 0)


# ----------------------------------------------------------------------------
# steps mode
# ----------------------------------------------------------------------------


@_SETTINGS
@given(st.lists(st.integers(0, 70), min_size=1, max_size=6),
       st.integers(1, 9), st.integers(1, 7), st.integers(0, 2**32 - 1),
       st.integers(0, 1000))
def test_steps_mode_padding_invariance(sizes, batch_size, steps, seed,
                                       round_idx):
  clients = _clients(sizes, seed=1)
  ids = [3 * i + 1 for i in range(len(sizes))]
  kwargs = dict(batch_size=batch_size, num_steps=steps, seed=seed,
                round_idx=round_idx)
  cohort = data.pack_cohort(clients, ids, **kwargs)
  padded = data.pack_cohort(clients[::-1], ids[::-1], pad_clients_to=9,
                            step_multiple=4, **kwargs)
  _assert_consistent(cohort, clients)
  _assert_consistent(padded, clients[::-1])
  assert cohort.indices.shape == (len(sizes), steps, batch_size)
  assert padded.indices.shape == (9, 4 * math.ceil(steps / 4), batch_size)
  n = len(sizes)
  for i in range(n):
    alone = data.pack_cohort([clients[i]], [ids[i]], **kwargs)
    for a, b, c in zip(_row(alone, 0, steps), _row(cohort, i, steps),
                       _row(padded, n - 1 - i, steps)):
      np.testing.assert_array_equal(a, b)
      np.testing.assert_array_equal(a, c)
    # Extra (bucketing) steps are masked out.
    assert np.all(padded.step_mask[n - 1 - i, steps:] == 0)
    if sizes[i]:
      assert np.all(cohort.example_mask[i] == 1)
    else:
      assert np.all(cohort.example_mask[i] == 0)


@_SETTINGS
@given(st.integers(1, 50), st.integers(1, 8), st.integers(1, 12),
       st.integers(0, 2**32 - 1))
def test_steps_mode_is_a_permutation_stream(n, batch_size, steps, seed):
  idx = np.arange(100, 100 + n)
  batch = data.pack_cohort([idx], [5], batch_size=batch_size, num_steps=steps,
                           seed=seed, round_idx=2)
  stream = batch.indices[0].reshape(-1) - 100
  # Consecutive blocks of n are permutations: every example is seen equally
  # often, and a small client repeats examples within a batch.
  for start in range(0, stream.size - n + 1, n):
    assert np.array_equal(np.sort(stream[start:start + n]), np.arange(n))
  counts = np.bincount(stream, minlength=n)
  assert counts.max() - counts.min() <= 1
  # More steps extend the same stream (prefix property).
  longer = data.pack_cohort([idx], [5], batch_size=batch_size,
                            num_steps=steps + 3, seed=seed, round_idx=2)
  np.testing.assert_array_equal(longer.indices[0, :steps], batch.indices[0])


def test_steps_mode_determinism_and_independence():
  clients = _clients([40, 7, 90])
  kwargs = dict(batch_size=8, num_steps=5)
  a = data.pack_cohort(clients, [0, 1, 2], seed=1, round_idx=3, **kwargs)
  b = data.pack_cohort(clients, [0, 1, 2], seed=1, round_idx=3, **kwargs)
  for field in ('indices', 'example_mask', 'step_mask', 'client_mask',
                'client_ids', 'num_examples'):
    np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
  other_round = data.pack_cohort(clients, [0, 1, 2], seed=1, round_idx=4,
                                 **kwargs)
  other_seed = data.pack_cohort(clients, [0, 1, 2], seed=2, round_idx=3,
                                **kwargs)
  other_id = data.pack_cohort(clients, [7, 1, 2], seed=1, round_idx=3,
                              **kwargs)
  assert not np.array_equal(a.indices[0], other_round.indices[0])
  assert not np.array_equal(a.indices[0], other_seed.indices[0])
  assert not np.array_equal(a.indices[0], other_id.indices[0])
  np.testing.assert_array_equal(a.indices[1:], other_id.indices[1:])


def test_steps_mode_per_client_steps():
  clients = _clients([30, 30, 30])
  batch = data.pack_cohort(clients, [0, 1, 2], batch_size=4,
                           num_steps=[2, 5, 0], seed=0, round_idx=0,
                           pad_steps_to=6)
  _assert_consistent(batch, clients)
  np.testing.assert_array_equal(batch.step_mask.sum(axis=1), [2, 5, 0])
  assert batch.indices.shape == (3, 6, 4)
  # A client given no work stays a real client whose every step is padding.
  assert batch.client_mask[2] == 1.0
  alone = data.pack_cohort([clients[1]], [1], batch_size=4, num_steps=5,
                           seed=0, round_idx=0)
  np.testing.assert_array_equal(alone.indices[0], batch.indices[1, :5])


# ----------------------------------------------------------------------------
# epochs mode
# ----------------------------------------------------------------------------


@_SETTINGS
@given(st.lists(st.integers(0, 60), min_size=1, max_size=5),
       st.integers(1, 9), st.integers(1, 4), st.booleans(),
       st.integers(1, 5), st.integers(0, 2**32 - 1))
def test_epochs_mode_coverage_and_shapes(sizes, batch_size, epochs, drop,
                                         multiple, seed):
  clients = _clients(sizes, seed=2)
  ids = list(range(10, 10 + len(sizes)))
  batch = data.pack_cohort(clients, ids, batch_size=batch_size,
                           num_epochs=epochs, seed=seed, round_idx=1,
                           step_multiple=multiple, drop_remainder=drop,
                           pad_clients_to=len(sizes) + 1)
  _assert_consistent(batch, clients)
  per_epoch = [data.steps_per_epoch(n, batch_size, drop) for n in sizes]
  needed = max(epochs * p for p in per_epoch)
  assert batch.indices.shape[1] == multiple * math.ceil(needed / multiple)
  for i, (idx, p) in enumerate(zip(clients, per_epoch)):
    np.testing.assert_array_equal(batch.step_mask[i].sum(), epochs * p)
    assert np.all(batch.step_mask[i, epochs * p:] == 0)
    used = batch.indices[i][batch.example_mask[i] == 1]
    counts = np.bincount(np.searchsorted(np.sort(idx), used),
                         minlength=len(idx))
    if not drop:
      # Every example exactly `epochs` times.
      assert np.all(counts == epochs)
    else:
      assert np.all(counts <= epochs)
      assert used.size == epochs * p * batch_size
    for e in range(epochs):
      # Each epoch is its own pass: no example twice within an epoch.
      block = batch.indices[i, e * p:(e + 1) * p]
      mask = batch.example_mask[i, e * p:(e + 1) * p]
      seen = block[mask == 1]
      assert np.unique(seen).size == seen.size
      if p and not drop:
        # Only the last batch of an epoch can be short.
        assert np.all(mask[:-1] == 1)
        assert mask[-1].sum() == len(idx) - (p - 1) * batch_size


def test_epochs_mode_padding_invariance():
  clients = _clients([13, 40, 0, 5])
  ids = [4, 9, 2, 11]
  kwargs = dict(batch_size=6, num_epochs=2, seed=5, round_idx=7)
  cohort = data.pack_cohort(clients, ids, step_multiple=4, pad_clients_to=8,
                            **kwargs)
  for i in range(4):
    alone = data.pack_cohort([clients[i]], [ids[i]], **kwargs)
    s = alone.indices.shape[1]
    for a, b in zip(_row(alone, 0, s), _row(cohort, i, s)):
      np.testing.assert_array_equal(a, b)
  # Client 2 has no data: all masks 0, slot masked, id kept.
  assert cohort.client_mask[2] == 0 and cohort.client_ids[2] == 2
  assert cohort.example_mask[2].sum() == 0 and cohort.step_mask[2].sum() == 0


def test_epochs_mode_per_client_epochs():
  clients = _clients([10, 10])
  batch = data.pack_cohort(clients, [0, 1], batch_size=4, num_epochs=[1, 3],
                           seed=0, round_idx=0)
  np.testing.assert_array_equal(batch.step_mask.sum(axis=1), [3, 9])
  np.testing.assert_array_equal(batch.example_mask.sum(axis=(1, 2)), [10, 30])


# ----------------------------------------------------------------------------
# argument checks
# ----------------------------------------------------------------------------


def test_pack_cohort_errors():
  clients = _clients([5, 5])
  base = dict(batch_size=2, seed=0, round_idx=0)
  with pytest.raises(ValueError, match='exactly one'):
    data.pack_cohort(clients, [0, 1], **base)
  with pytest.raises(ValueError, match='exactly one'):
    data.pack_cohort(clients, [0, 1], num_steps=1, num_epochs=1, **base)
  with pytest.raises(ValueError, match='client_ids'):
    data.pack_cohort(clients, [0], num_steps=1, **base)
  with pytest.raises(ValueError, match='pad_clients_to'):
    data.pack_cohort(clients, [0, 1], num_steps=1, pad_clients_to=1, **base)
  with pytest.raises(ValueError, match='batch_size'):
    data.pack_cohort(clients, [0, 1], num_steps=1, batch_size=0, seed=0,
                     round_idx=0)
  with pytest.raises(ValueError, match='num_steps'):
    data.pack_cohort(clients, [0, 1], num_steps=[1, 2, 3], **base)
  with pytest.raises(ValueError, match='num_epochs'):
    data.pack_cohort(clients, [0, 1], num_epochs=-1, **base)
  with pytest.raises(ValueError, match='step_multiple'):
    data.pack_cohort(clients, [0, 1], num_steps=1, step_multiple=0, **base)
  with pytest.raises(ValueError, match='pad_steps_to'):
    data.pack_cohort(clients, [0, 1], num_steps=3, pad_steps_to=2, **base)
  with pytest.raises(ValueError, match=r'client_indices\[1\]'):
    data.pack_cohort([clients[0], np.array([-1])], [0, 1], num_steps=1, **base)
  with pytest.raises(ValueError, match=r'client_ids\[0\]'):
    data.pack_cohort(clients, [-1, 1], num_steps=1, **base)
  with pytest.raises(ValueError, match='round_idx'):
    data.pack_cohort(clients, [0, 1], num_steps=1, batch_size=2, seed=0,
                     round_idx=-1)


# ----------------------------------------------------------------------------
# client sampling
# ----------------------------------------------------------------------------


@_SETTINGS
@given(st.integers(1, 300), st.data(), st.integers(0, 2**32 - 1),
       st.integers(0, 10**6))
def test_sample_clients_properties(num_clients, draw, seed, round_idx):
  cohort_size = draw.draw(st.integers(1, num_clients))
  ids = data.sample_clients(num_clients, cohort_size, seed, round_idx)
  assert ids.shape == (cohort_size,) and ids.dtype == np.int64
  assert np.unique(ids).size == cohort_size
  assert ids.min() >= 0 and ids.max() < num_clients
  # A pure function of (seed, round): no dependence on earlier calls.
  data.sample_clients(num_clients, cohort_size, seed, round_idx + 1)
  np.testing.assert_array_equal(
      ids, data.sample_clients(num_clients, cohort_size, seed, round_idx))


def test_sample_clients_is_uniform_and_varies():
  counts = np.zeros(20)
  for r in range(2000):
    counts[data.sample_clients(20, 5, 0, r)] += 1
  # Each client is picked with probability 1/4: 500 expected, sd about 19.
  assert np.all(np.abs(counts - 500) < 100)
  first = {tuple(data.sample_clients(128, 32, s, 0)) for s in range(5)}
  assert len(first) == 5
  # Draw order is kept (not sorted).
  assert any(np.any(np.diff(data.sample_clients(50, 10, 0, r)) < 0)
             for r in range(5))
  with pytest.raises(ValueError, match='cohort_size'):
    data.sample_clients(10, 11, 0, 0)
  with pytest.raises(ValueError, match='cohort_size'):
    data.sample_clients(10, 0, 0, 0)
  with pytest.raises(ValueError, match='round_idx'):
    data.sample_clients(10, 2, 0, -1)


def test_sample_bernoulli():
  ids = data.sample_bernoulli(1000, 0.3, 1, 4)
  assert np.all(np.diff(ids) > 0)
  assert 230 < ids.size < 370
  np.testing.assert_array_equal(ids, data.sample_bernoulli(1000, 0.3, 1, 4))
  assert data.sample_bernoulli(50, 0.0, 0, 0).size == 0
  assert data.sample_bernoulli(50, 1.0, 0, 0).size == 50
  assert not np.array_equal(ids, data.sample_bernoulli(1000, 0.3, 1, 5))
  with pytest.raises(ValueError, match='probability'):
    sampling.sample_bernoulli(10, 1.5, 0, 0)


def test_package_reexports():
  assert data.pack_cohort is packing.pack_cohort
  assert data.sample_clients is sampling.sample_clients
