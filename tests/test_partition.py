"""Property and known-answer tests of fedjax_lama.data.partitions."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedjax_lama import data
from fedjax_lama.data import partitions as P

_SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def labelled(draw, min_examples=1, max_examples=400, max_classes=12):
  """(labels, num_clients, seed) with every label value present."""
  num_classes = draw(st.integers(1, max_classes))
  n = draw(st.integers(max(min_examples, num_classes), max_examples))
  seed = draw(st.integers(0, 2**32 - 1))
  rng = np.random.default_rng(draw(st.integers(0, 2**16)))
  labels = np.concatenate([np.arange(num_classes),
                           rng.integers(0, num_classes, n - num_classes)])
  rng.shuffle(labels)
  num_clients = draw(st.integers(1, max(1, min(n, 40))))
  return labels, num_clients, seed


def _assert_disjoint(parts, n, cover):
  flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
  assert all(p.dtype == np.int64 and p.ndim == 1 for p in parts)
  assert np.unique(flat).size == flat.size, 'an example is assigned twice'
  assert flat.size == 0 or (flat.min() >= 0 and flat.max() < n)
  if cover:
    assert flat.size == n, 'not every example is assigned'


def _same(a, b):
  return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


# ----------------------------------------------------------------------------
# iid
# ----------------------------------------------------------------------------


@_SETTINGS
@given(labelled())
def test_iid_properties(args):
  labels, k, seed = args
  parts = P.iid(labels.size, k, seed)
  assert len(parts) == k
  _assert_disjoint(parts, labels.size, cover=True)
  sizes = [p.size for p in parts]
  assert max(sizes) - min(sizes) <= 1
  assert _same(parts, P.iid(labels.size, k, seed))
  assert _same(parts, P.partition('iid', labels, k, seed))


def test_iid_known_sizes():
  # FedML's Dirichlet partition: 390 or 391 CIFAR images per client for 128 clients.
  assert set(p.size for p in P.iid(50000, 128, 0)) == {390, 391}
  # Karimi, Li, Li, 2021: MNIST with 50 clients gives 1,200 each.
  assert set(p.size for p in P.iid(60000, 50, 1)) == {1200}
  assert not _same(P.iid(100, 4, 0), P.iid(100, 4, 1))


# ----------------------------------------------------------------------------
# dirichlet_fedml
# ----------------------------------------------------------------------------


@_SETTINGS
@given(labelled(min_examples=20), st.sampled_from([0.05, 0.3, 1.0, 10.0]),
       st.integers(0, 5))
def test_dirichlet_fedml_properties(args, alpha, min_size):
  labels, k, seed = args
  k = max(1, min(k, labels.size // max(min_size, 1), 20))
  try:
    parts = P.dirichlet_fedml(labels, k, alpha, seed, min_client_size=min_size,
                              max_attempts=200)
  except ValueError as e:
    assert 'attempts' in str(e)  # Only the bounded retry may give up.
    return
  assert len(parts) == k
  _assert_disjoint(parts, labels.size, cover=True)
  assert min(p.size for p in parts) >= min_size
  assert _same(parts, P.dirichlet_fedml(labels, k, alpha, seed,
                                        min_client_size=min_size,
                                        max_attempts=200))


def test_dirichlet_fedml_cifar_like_statistics():
  # 128 clients, CIFAR-10-sized labels, alpha 0.1 (aaai-t1): unbalanced, every
  # client >= 10, and the cap N/n = 390.6 bounds every client before its last
  # piece, so at least half of the clients hold fewer than ~N/n.
  labels = np.repeat(np.arange(10), 5000)
  parts = P.partition('dirichlet', labels, 128, 0, dirichlet_concentration=0.1)
  sizes = np.array([p.size for p in parts])
  _assert_disjoint(parts, labels.size, cover=True)
  assert sizes.min() >= 10 and sizes.max() > 2 * 390
  assert np.median(sizes) <= 391
  # Each client's list is shuffled, not grouped by class.
  big = parts[int(np.argmax([np.unique(labels[p]).size for p in parts]))]
  assert not np.all(np.diff(labels[big]) >= 0)


def _mean_max_class_share(parts, labels):
  shares = [np.bincount(labels[p], minlength=10).max() / p.size
            for p in parts if p.size]
  return float(np.mean(shares))


@settings(max_examples=5, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_dirichlet_small_alpha_is_more_skewed(seed):
  labels = np.repeat(np.arange(10), 200)
  small = P.dirichlet_fedml(labels, 20, 0.05, seed, min_client_size=1)
  large = P.dirichlet_fedml(labels, 20, 100.0, seed, min_client_size=1)
  assert (_mean_max_class_share(small, labels) >
          _mean_max_class_share(large, labels) + 0.3)
  small = P.dirichlet_balanced(labels, 20, 0.05, seed)
  large = P.dirichlet_balanced(labels, 20, 100.0, seed)
  assert (_mean_max_class_share(small, labels) >
          _mean_max_class_share(large, labels) + 0.3)


def test_dirichlet_fedml_errors():
  labels = np.repeat(np.arange(2), 10)
  with pytest.raises(ValueError, match='min_client_size'):
    P.dirichlet_fedml(labels, 3, 0.5, 0, min_client_size=7)
  with pytest.raises(ValueError, match='dirichlet_concentration'):
    P.dirichlet_fedml(labels, 2, 0.0, 0)
  with pytest.raises(ValueError, match='dirichlet_concentration'):
    P.dirichlet_fedml(labels, 2, float('nan'), 0)
  with pytest.raises(ValueError, match='num_clients'):
    P.dirichlet_fedml(labels, 0, 0.5, 0)
  with pytest.raises(ValueError, match='min_client_size'):
    P.dirichlet_fedml(labels, 2, 0.5, 0, min_client_size=-1)
  # Feasible in principle, but alpha tiny: the bounded retry gives up cleanly.
  with pytest.raises(ValueError, match='attempts'):
    P.dirichlet_fedml(np.repeat(np.arange(2), 50), 10, 1e-3, 0,
                      min_client_size=10, max_attempts=5)
  with pytest.raises(ValueError, match='seed'):
    P.dirichlet_fedml(labels, 2, 0.5, -1)


# ----------------------------------------------------------------------------
# dirichlet_balanced
# ----------------------------------------------------------------------------


@_SETTINGS
@given(labelled(), st.sampled_from([0.01, 0.6, 5.0]))
def test_dirichlet_balanced_properties(args, alpha):
  labels, k, seed = args
  parts = P.dirichlet_balanced(labels, k, alpha, seed)
  assert len(parts) == k
  _assert_disjoint(parts, labels.size, cover=labels.size % k == 0)
  assert {p.size for p in parts} == {labels.size // k}
  assert _same(parts, P.partition('dirichlet_balanced', labels, k, seed,
                                  dirichlet_concentration=alpha))


def test_dirichlet_balanced_reference_reuse():
  labels = np.repeat(np.arange(10), 100)
  reused = P.dirichlet_balanced(labels, 10, 0.05, 0, reuse_exhausted=True)
  assert {p.size for p in reused} == {100}
  flat = np.concatenate(reused)
  # Tiny alpha exhausts classes: the reference reuses examples.
  assert np.unique(flat).size < flat.size
  clean = P.dirichlet_balanced(labels, 10, 0.05, 0)
  _assert_disjoint(clean, labels.size, cover=True)


def test_dirichlet_balanced_follows_priors():
  # With the reference's reuse no class ever runs out, so each client's class
  # histogram is a draw from its own prior: at alpha 0.05 most clients are
  # dominated by one class. Without reuse every example is used once, which
  # forces the cohort's histograms to sum to the class totals.
  labels = np.repeat(np.arange(10), 2000)
  reused = P.dirichlet_balanced(labels, 10, 0.05, 3, reuse_exhausted=True)
  assert _mean_max_class_share(reused, labels) > 0.7
  clean = P.dirichlet_balanced(labels, 10, 0.05, 3)
  histograms = np.stack([np.bincount(labels[p], minlength=10) for p in clean])
  np.testing.assert_array_equal(histograms.sum(0), [2000] * 10)


# ----------------------------------------------------------------------------
# shards, class_cyclic, one_class
# ----------------------------------------------------------------------------


@_SETTINGS
@given(st.integers(1, 10), st.integers(1, 5), st.integers(1, 5), st.data())
def test_shards_properties(num_classes, shards_per_class, shard_size, draw):
  # Class sizes a multiple of the shard size, so no shard straddles classes.
  total_shards = num_classes * shards_per_class
  divisors = [d for d in range(1, num_classes + 1) if total_shards % d == 0]
  per_client = draw.draw(st.sampled_from(divisors))
  num_clients = total_shards // per_client
  seed = draw.draw(st.integers(0, 2**32 - 1))
  labels = np.repeat(np.arange(num_classes), shards_per_class * shard_size)
  np.random.default_rng(seed).shuffle(labels)
  parts = P.shards(labels, num_clients, per_client, seed)
  assert len(parts) == num_clients
  _assert_disjoint(parts, labels.size, cover=True)
  assert all(np.unique(labels[p]).size <= per_client for p in parts)
  assert {p.size for p in parts} == {per_client * shard_size}
  assert _same(parts, P.partition('mcmahan_shards', labels, num_clients, seed,
                                  classes_per_client=per_client))


@_SETTINGS
@given(labelled(min_examples=10), st.integers(1, 3))
def test_shards_general_labels(args, per_client):
  labels, k, seed = args
  num_classes = np.unique(labels).size
  per_client = min(per_client, num_classes)
  if k * per_client > labels.size:
    return
  parts = P.shards(labels, k, per_client, seed)
  _assert_disjoint(parts, labels.size, cover=True)
  # Shards may straddle class boundaries here; sizes stay nearly equal.
  sizes = [p.size for p in parts]
  assert max(sizes) - min(sizes) <= per_client


def test_shards_fedlamb_code_scheme():
  # Karimi, Li, Li, 2021, experiments: MNIST-like, 200 shards of 300, 50 clients x 2 shards
  # uses half of the data, 600 images per client.
  labels = np.repeat(np.arange(10), 6000)
  parts = P.shards(labels, 50, 2, 0, num_shards=200)
  _assert_disjoint(parts, labels.size, cover=False)
  assert {p.size for p in parts} == {600}
  assert np.concatenate(parts).size == 30000
  assert all(np.unique(labels[p]).size <= 2 for p in parts)


def test_shards_errors():
  labels = np.repeat(np.arange(3), 10)
  with pytest.raises(ValueError, match='classes_per_client'):
    P.shards(labels, 2, 4, 0)
  with pytest.raises(ValueError, match='classes_per_client'):
    P.shards(labels, 2, 0, 0)
  with pytest.raises(ValueError, match='num_shards'):
    P.shards(labels, 5, 2, 0, num_shards=4)
  with pytest.raises(ValueError, match='classes_per_client'):
    P.class_cyclic(labels, 3, 4, 0)


@pytest.mark.parametrize('kappa,sizes', [(2, {500}), (4, {500}),
                                         (6, {498, 500, 504}),
                                         (8, {496, 500, 504})])
def test_class_cyclic_fedat_known_sizes(kappa, sizes):
  # FedAT's #class k: CIFAR-10, 100 clients: 500 images for kappa 2 and 4,
  # 498-504 for 6, 496-504 for 8.
  labels = np.repeat(np.arange(10), 5000)
  parts = P.partition('class_cyclic', labels, 100, 7, classes_per_client=kappa)
  _assert_disjoint(parts, labels.size, cover=True)
  assert {p.size for p in parts} <= sizes
  assert min(p.size for p in parts) == min(sizes)
  for k, p in enumerate(parts):
    assert set(np.unique(labels[p])) == {(k + i) % 10 for i in range(kappa)}


def test_class_cyclic_needs_divisible_holders():
  with pytest.raises(ValueError, match='multiple'):
    P.class_cyclic(np.repeat(np.arange(10), 10), 7, 2, 0)


@_SETTINGS
@given(labelled(min_examples=30, max_classes=10))
def test_one_class_properties(args):
  labels, k, seed = args
  parts = P.one_class(labels, k, seed)
  num_classes = int(labels.max()) + 1
  _assert_disjoint(parts, labels.size, cover=k >= num_classes)
  for i, p in enumerate(parts):
    if p.size:
      assert set(np.unique(labels[p])) == {i % num_classes}
  for c in range(min(k, num_classes)):
    sizes = [parts[i].size for i in range(c, k, num_classes)]
    assert max(sizes) - min(sizes) <= 1
  assert _same(parts, P.partition('one_class', labels, k, seed))


def test_one_class_mnist_known_sizes():
  # Karimi, Li, Li, 2021, experiments: 50 clients on MNIST hold 1,084 to 1,349 images.
  counts = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
  labels = np.repeat(np.arange(10), counts)
  parts = P.one_class(labels, 50, 0)
  sizes = [p.size for p in parts]
  assert min(sizes) == 1084 and max(sizes) == 1349
  _assert_disjoint(parts, labels.size, cover=True)


# ----------------------------------------------------------------------------
# natural, local_split, dispatcher
# ----------------------------------------------------------------------------


@_SETTINGS
@given(st.lists(st.integers(0, 20), min_size=1, max_size=200))
def test_natural_properties(ids):
  ids = np.asarray(ids)
  parts = P.natural(ids)
  uniq = np.unique(ids)
  assert len(parts) == uniq.size
  _assert_disjoint(parts, ids.size, cover=True)
  for u, p in zip(uniq, parts):
    assert np.all(ids[p] == u) and np.all(np.diff(p) > 0)
  assert _same(parts, P.partition('natural', None, uniq.size, 0,
                                  client_ids=ids))


@_SETTINGS
@given(st.lists(st.integers(0, 60), min_size=1, max_size=8),
       st.sampled_from([0.0, 0.1, 0.2, 0.5]), st.integers(0, 2**32 - 1))
def test_local_split_properties(sizes, fraction, seed):
  offsets = np.concatenate([[0], np.cumsum(sizes)])
  clients = [np.arange(a, b) for a, b in zip(offsets[:-1], offsets[1:])]
  train, test = P.local_split(clients, fraction, seed)
  for c, tr, te in zip(clients, train, test):
    assert np.array_equal(np.sort(np.concatenate([tr, te])), c)
    assert tr.size == int(np.floor(c.size * (1 - fraction) + 1e-9))
  again = P.local_split(clients, fraction, seed)
  assert _same(train, again[0]) and _same(test, again[1])


def test_local_split_fedat_known_sizes():
  # a local 80/20 split: 500 -> 400/100, 600 -> 480/120.
  train, test = P.local_split([np.arange(500), np.arange(600)], 0.2, 0)
  assert [t.size for t in train] == [400, 480]
  assert [t.size for t in test] == [100, 120]
  with pytest.raises(ValueError, match='test_fraction'):
    P.local_split([np.arange(5)], 1.0, 0)


def test_dispatcher_errors():
  labels = np.repeat(np.arange(2), 10)
  with pytest.raises(ValueError, match='dirichlet_balanced'):
    P.partition('lda', labels, 2, 0)
  with pytest.raises(ValueError, match='dirichlet_concentration'):
    P.partition('dirichlet', labels, 2, 0)
  with pytest.raises(ValueError, match='bogus'):
    P.partition('iid', labels, 2, 0, bogus=1)
  with pytest.raises(ValueError, match='client_ids'):
    P.partition('natural', labels, 2, 0)
  with pytest.raises(ValueError, match='num_clients'):
    P.partition('natural', None, 3, 0, client_ids=np.array([0, 0, 1]))
  with pytest.raises(ValueError, match='num_clients'):
    P.partition('iid', labels, 21, 0)
  with pytest.raises(ValueError, match='labels'):
    P.partition('shards', np.array([0.5, 1.5]), 1, 0, classes_per_client=1)
  assert data.partition is P.partition
