"""Partitioners: which training examples each simulated client holds.

Every partitioner is a pure function of its arguments and a seed and returns a
list with one int64 index array per client (indices into the training arrays).
No example is assigned twice (except `dirichlet_balanced` with
`reuse_exhausted=True`, which reproduces a reference quirk on request).

Schemes and their sources:
* `iid`: random permutation cut into nearly equal parts (FedML "homo"; Fed-LAMB,
  Karimi, Li and Li).
* `dirichlet_fedml`: FedML `partition_data` "hetero", label Dirichlet with the
  N/n balancing cap and retries until every client has `min_client_size`
  examples (FedLAMA's partitions). Alias `dirichlet`.
* `dirichlet_balanced`: FL-Simulator's per-client Dirichlet class prior with
  equal client sizes (FedSpeed, Sun et al. 2023).
* `shards`: McMahan et al.'s (2017) sort-by-label shards (as FedAT and
  Fed-LAMB use them).
* `class_cyclic`: FedAT's "#class k per client" default (Chai et al. 2021).
* `one_class`: Fed-LAMB non-IID, client i holds class i mod C.
* `natural`: one client per natural id (LEAF writers).
* `local_split`: FedAT's per-client 80/20 train/test split, stratified by label
  on request.
* `natural_test_parts`: each natural client's own test examples.
"""

import fractions
import inspect
import math
import numbers
from typing import Any, Callable, Sequence

import numpy as np

from fedjax_lama.data import seeding
from fedjax_lama.data.validate import check_int as _check_int

# Sub-streams of seeding.PARTITION_STREAM, one per scheme.
_IID, _FEDML, _BALANCED, _SHARDS, _CYCLIC, _ONE_CLASS = range(1, 7)

IndexList = list[np.ndarray]


def _check_labels(labels: Any) -> np.ndarray:
  labels = np.asarray(labels)
  if labels.ndim != 1 or not (np.issubdtype(labels.dtype, np.integer) or
                              labels.size == 0):
    raise ValueError(
        f'labels must be a 1-D integer array, got dtype {labels.dtype} with '
        f'shape {labels.shape}')
  if labels.size == 0:
    raise ValueError('labels is empty: there is nothing to partition')
  if labels.min() < 0:
    raise ValueError(f'labels must be non-negative, got {labels.min()}')
  return labels.astype(np.int64)


def _check_concentration(alpha: Any) -> float:
  if (isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or
      not math.isfinite(alpha) or alpha <= 0):
    raise ValueError(
        f'dirichlet_concentration must be a finite number > 0, got {alpha!r}')
  return float(alpha)


def _check_clients(num_clients: Any, num_examples: int) -> int:
  num_clients = _check_int(num_clients, 'num_clients', 1)
  if num_clients > num_examples:
    raise ValueError(
        f'num_clients={num_clients} exceeds the {num_examples} examples: some '
        'clients would be empty')
  return num_clients


def _rng(seed: int, scheme: int) -> np.random.Generator:
  return seeding.make_rng(seeding.check_seed(seed), seeding.PARTITION_STREAM,
                          scheme)


def iid(num_examples: int, num_clients: int, seed: int) -> IndexList:
  """A random permutation cut into `num_clients` nearly equal parts.

  Part sizes differ by at most one (`np.array_split`).
  """
  num_examples = _check_int(num_examples, 'num_examples', 1)
  num_clients = _check_clients(num_clients, num_examples)
  perm = _rng(seed, _IID).permutation(num_examples)
  return [p.astype(np.int64) for p in np.array_split(perm, num_clients)]


def dirichlet_fedml(labels: Any, num_clients: int, alpha: float, seed: int,
                    min_client_size: int = 10,
                    max_attempts: int = 1000) -> IndexList:
  """FedML's "hetero" label-Dirichlet partition (as the FedLAMA reference code uses it).

  Repeats until every client holds at least `min_client_size` examples: for
  each class in turn, shuffle its indices, draw p ~ Dir(alpha 1_n), zero p_j for
  every client already holding >= N/n examples (the balancing cap, tested
  before the class is dealt), renormalise, and cut the class at
  floor(N_k cumsum(p)). Finally shuffle each client's list. Sizes are
  unbalanced; every example is assigned exactly once.

  Args:
    labels: int [N] class labels.
    num_clients: n.
    alpha: the Dirichlet concentration (config field dirichlet_concentration).
    seed: partition seed.
    min_client_size: minimum examples per client (FedML uses 10).
    max_attempts: bound on the retries before giving up.

  Raises:
    ValueError: bad arguments, min_client_size * n > N, or no valid partition
      after max_attempts draws.
  """
  labels = _check_labels(labels)
  n = _check_clients(num_clients, labels.size)
  alpha = _check_concentration(alpha)
  min_size = _check_int(min_client_size, 'min_client_size', 0)
  max_attempts = _check_int(max_attempts, 'max_attempts', 1)
  total = labels.size
  if min_size * n > total:
    raise ValueError(
        f'min_client_size={min_size} x num_clients={n} exceeds the {total} '
        'examples: impossible')
  rng = _rng(seed, _FEDML)
  class_idx = [np.flatnonzero(labels == c) for c in np.unique(labels)]
  cap = total / n
  for _ in range(max_attempts):
    sizes = np.zeros(n, np.int64)
    pieces: list[list[np.ndarray]] = [[] for _ in range(n)]
    ok = True
    for idx in class_idx:
      idx = rng.permutation(idx)
      p = rng.dirichlet(np.full(n, alpha))
      p = np.where(sizes < cap, p, 0.0)
      mass = p.sum()
      if not np.isfinite(mass) or mass <= 0:
        ok = False  # Every uncapped client drew exactly 0: a failed attempt.
        break
      cuts = (np.cumsum(p / mass) * idx.size).astype(np.int64)[:-1]
      for j, part in enumerate(np.split(idx, cuts)):
        if part.size:
          pieces[j].append(part)
          sizes[j] += part.size
    if ok and sizes.min() >= min_size:
      return [rng.permutation(np.concatenate(pc)) if pc else
              np.zeros(0, np.int64) for pc in pieces]
  raise ValueError(
      f'dirichlet partition: no draw in {max_attempts} attempts gave every one '
      f'of the {n} clients min_client_size={min_size} examples at '
      f'dirichlet_concentration={alpha}; lower min_client_size or num_clients, '
      'or raise dirichlet_concentration')


def dirichlet_balanced(labels: Any, num_clients: int, alpha: float, seed: int,
                       reuse_exhausted: bool = False) -> IndexList:
  """FL-Simulator's balanced Dirichlet partition (FedSpeed, Sun et al. 2023).

  Every client gets exactly floor(N / n) examples (the remainder is left
  unused; the reference gives it to client 0, which is 0 examples in all the
  project's settings). Client i draws a class prior p_i ~ Dir(alpha 1_C); the
  N slots are filled in a uniformly random order, each by drawing a class from
  its client's prior and taking the next unused example of that class.

  When a class runs out the reference resets its pool (so late clients get
  duplicates and some examples stay unused); here the default redraws from the
  client's prior restricted to classes that still have examples (from the
  remaining class counts if the prior has no mass left on them), so no example
  is used twice. `reuse_exhausted=True` reproduces the reference's reuse.

  The reference picks a random client with room for each slot; filling slots in
  a random order gives the same multinomial class counts per client and
  differs only in which clients meet exhausted classes.
  """
  labels = _check_labels(labels)
  n = _check_clients(num_clients, labels.size)
  alpha = _check_concentration(alpha)
  size = labels.size // n
  rng = _rng(seed, _BALANCED)
  classes, cls_of_example = np.unique(labels, return_inverse=True)
  num_classes = classes.size
  priors = rng.dirichlet(np.full(num_classes, alpha), size=n)
  slot_client = rng.permutation(np.repeat(np.arange(n), size))
  cum = np.cumsum(priors, axis=1)
  cum[:, -1] = 1.0
  # Row-offset search: the first class whose cumulative prior exceeds u.
  flat = (cum + np.arange(n)[:, None]).ravel()
  u = rng.random(slot_client.size)
  slot_class = (np.searchsorted(flat, slot_client + u, side='right') -
                slot_client * num_classes)
  slot_class = np.minimum(slot_class, num_classes - 1)
  available = np.bincount(cls_of_example, minlength=num_classes)
  if not reuse_exhausted:
    slot_class = _redraw_exhausted(slot_client, slot_class, priors, available,
                                   rng)
  pools = [rng.permutation(np.flatnonzero(cls_of_example == c))
           for c in range(num_classes)]
  # Rank of each slot among the slots of its class, in fill order.
  order = np.argsort(slot_class, kind='stable')
  starts = np.searchsorted(slot_class[order], np.arange(num_classes))
  rank = np.empty_like(order)
  rank[order] = np.arange(order.size) - starts[slot_class[order]]
  offsets = np.concatenate([[0], np.cumsum(available)[:-1]])
  flat_pools = np.concatenate(pools)
  slot_example = flat_pools[offsets[slot_class] +
                            rank % available[slot_class]]
  by_client = np.argsort(slot_client, kind='stable')
  return [row.astype(np.int64) for row in
          slot_example[by_client].reshape(n, size)]


def _redraw_exhausted(slot_client: np.ndarray, slot_class: np.ndarray,
                      priors: np.ndarray, available: np.ndarray,
                      rng: np.random.Generator) -> np.ndarray:
  """Sequentially redraws slots whose class has run out (rejection sampling)."""
  slot_class = slot_class.copy()
  counts = np.zeros_like(available)
  # Up to the first slot that over-draws a class, every draw stands.
  order = np.argsort(slot_class, kind='stable')
  starts = np.searchsorted(slot_class[order], np.arange(available.size))
  rank = np.empty_like(order)
  rank[order] = np.arange(order.size) - starts[slot_class[order]]
  over = np.flatnonzero(rank >= available[slot_class])
  if over.size == 0:
    return slot_class
  first = int(over[0])
  counts += np.bincount(slot_class[:first], minlength=available.size)
  remaining = available - counts
  for t in range(first, slot_class.size):
    c = slot_class[t]
    if remaining[c] <= 0:
      p = priors[slot_client[t]] * (remaining > 0)
      if p.sum() <= 0:
        p = remaining.astype(np.float64)
      c = int(np.searchsorted(np.cumsum(p / p.sum()), rng.random(),
                              side='right'))
      c = min(c, available.size - 1)
      while remaining[c] <= 0:  # Guards the last-bin rounding edge.
        c = (c - 1) % available.size
      slot_class[t] = c
    remaining[c] -= 1
  return slot_class


def shards(labels: Any, num_clients: int, classes_per_client: int, seed: int,
           num_shards: int | None = None) -> IndexList:
  """McMahan et al.'s shards: sort by label, cut, deal shards to clients.

  The training indices are sorted by label (ties by index) and cut into
  `num_shards` (default num_clients * classes_per_client, so every example is
  used) nearly equal shards; the shards are shuffled and client k receives
  shards k*s .. k*s+s-1 with s = classes_per_client (McMahan et al. 2017;
  Fed-LAMB's `shards` uses num_shards=200 with 50 clients, which
  leaves half the data unused). A shard that straddles a class boundary holds
  two classes, so a client holds at most 2s classes and, when every class size
  is a multiple of the shard size, at most s.
  """
  labels = _check_labels(labels)
  n = _check_clients(num_clients, labels.size)
  per_client = _check_int(classes_per_client, 'classes_per_client', 1)
  num_classes = np.unique(labels).size
  if per_client > num_classes:
    raise ValueError(
        f'classes_per_client={per_client} exceeds the {num_classes} classes '
        'present in labels')
  needed = n * per_client
  total_shards = needed if num_shards is None else _check_int(
      num_shards, 'num_shards', needed)
  if total_shards > labels.size:
    raise ValueError(
        f'num_shards={total_shards} exceeds the {labels.size} examples')
  order = np.argsort(labels, kind='stable')
  shard_list = np.array_split(order, total_shards)
  dealt = _rng(seed, _SHARDS).permutation(total_shards)
  return [np.concatenate([shard_list[s] for s in
                          dealt[k * per_client:(k + 1) * per_client]])
          .astype(np.int64) for k in range(n)]


def class_cyclic(labels: Any, num_clients: int, classes_per_client: int,
                 seed: int) -> IndexList:
  """FedAT's "#class k per client" partition (Chai et al. 2021, its default).

  With C classes (sorted), client k holds classes {(k + i) mod C : i < kappa}.
  Each class's indices, in random order, are cut into as many nearly equal
  contiguous pieces as it has holders (`np.array_split`), given to the holders
  in increasing client id. Requires num_clients * kappa to be a multiple of C,
  so every class has the same number of holders.
  """
  labels = _check_labels(labels)
  n = _check_clients(num_clients, labels.size)
  kappa = _check_int(classes_per_client, 'classes_per_client', 1)
  classes = np.unique(labels)
  num_classes = classes.size
  if kappa > num_classes:
    raise ValueError(
        f'classes_per_client={kappa} exceeds the {num_classes} classes present '
        'in labels')
  if (n * kappa) % num_classes:
    raise ValueError(
        f'class_cyclic needs num_clients * classes_per_client to be a multiple '
        f'of the {num_classes} classes, got {n} * {kappa}')
  rng = _rng(seed, _CYCLIC)
  pieces: list[list[np.ndarray]] = [[] for _ in range(n)]
  for c, label in enumerate(classes):
    holders = [k for k in range(n) if (c - k) % num_classes < kappa]
    idx = rng.permutation(np.flatnonzero(labels == label))
    for k, part in zip(holders, np.array_split(idx, len(holders))):
      pieces[k].append(part)
  return [np.concatenate(p).astype(np.int64) for p in pieces]


def one_class(labels: Any, num_clients: int, seed: int,
              num_classes: int | None = None) -> IndexList:
  """Fed-LAMB non-IID: client i holds only class i mod C.

  For each class c, its indices in random order are split into as many nearly
  equal contiguous parts as there are clients of that class (`np.array_split`)
  and given to them in increasing id. C defaults to max(labels) + 1; when
  num_clients < C the classes >= num_clients are unused.
  """
  labels = _check_labels(labels)
  n = _check_clients(num_clients, labels.size)
  c_total = (int(labels.max()) + 1 if num_classes is None else
             _check_int(num_classes, 'num_classes', int(labels.max()) + 1))
  rng = _rng(seed, _ONE_CLASS)
  out: list[np.ndarray] = [np.zeros(0, np.int64)] * n
  for c in range(c_total):
    holders = list(range(c, n, c_total))
    if not holders:
      continue
    idx = rng.permutation(np.flatnonzero(labels == c))
    for k, part in zip(holders, np.array_split(idx, len(holders))):
      out[k] = part.astype(np.int64)
  return out


def natural(client_ids: Any) -> IndexList:
  """One client per distinct natural id (e.g. FEMNIST writer), ids ascending.

  Client j holds, in increasing order, the examples whose id is the j-th
  smallest distinct id.
  """
  ids = np.asarray(client_ids)
  if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype,
                                                         np.integer):
    raise ValueError('client_ids must be a non-empty 1-D integer array')
  order = np.argsort(ids, kind='stable')
  _, starts = np.unique(ids[order], return_index=True)
  return [p.astype(np.int64) for p in np.split(order, starts[1:])]


def local_split(client_indices: Sequence[np.ndarray], test_fraction: float,
                seed: int, labels: Any = None) -> tuple[IndexList, IndexList]:
  """Splits every client's data at random into disjoint local train and test parts.

  Without `labels`, FedAT (Chai et al. 2021): for clients in order, shuffle the
  client's indices; the first floor((1 - f) n) are training, the rest test
  (f = 0.2: 500 -> 400/100, 600 -> 480/120). The fraction is taken as an exact
  rational so 0.2 never rounds the wrong way.

  With `labels` (the training labels, one class per example), the split is
  stratified: the client's test part has the same size, n - floor((1 - f) n),
  shared among its classes in proportion to their counts (each class gets the
  floor of f n_c, and the examples left go to the classes with the largest
  remainders, ties to the smaller label), and each class's test examples are a
  random draw of its own. Both are pure functions of (indices, f, seed).
  """
  if (isinstance(test_fraction, bool) or
      not isinstance(test_fraction, numbers.Real) or
      not 0 <= test_fraction < 1):
    raise ValueError(f'test_fraction must be in [0, 1), got {test_fraction!r}')
  frac = fractions.Fraction(test_fraction).limit_denominator(1 << 20)
  rng = seeding.make_rng(seeding.check_seed(seed), seeding.LOCAL_SPLIT_STREAM)
  if labels is not None:
    labels = np.asarray(labels)
    if labels.ndim != 1:
      raise ValueError(f'labels must be one class per example (1-D), got shape '
                       f'{labels.shape}')
  train, test = [], []
  for idx in client_indices:
    idx = np.asarray(idx, np.int64).reshape(-1)
    perm = rng.permutation(idx)
    n_train = (idx.size * (frac.denominator - frac.numerator)) // (
        frac.denominator)
    if labels is None:
      train.append(perm[:n_train])
      test.append(perm[n_train:])
      continue
    is_test = _stratified_test_mask(labels[perm], idx.size - n_train, frac)
    train.append(perm[~is_test])
    test.append(perm[is_test])
  return train, test


def _stratified_test_mask(labels: np.ndarray, n_test: int,
                          frac: fractions.Fraction) -> np.ndarray:
  """bool mask over a shuffled client's examples: n_test of them, shared among the
  classes by largest remainder of frac * n_c, the first ones of each class."""
  classes, inverse, counts = np.unique(labels, return_inverse=True,
                                       return_counts=True)
  quota = counts * frac.numerator
  take = quota // frac.denominator
  remainder = quota - take * frac.denominator
  extra = n_test - int(take.sum())
  # Largest remainder first; ties to the smaller label (stable sort on -remainder).
  take[np.argsort(-remainder, kind='stable')[:extra]] += 1
  # Rank of each example within its class, in the shuffled order.
  order = np.argsort(inverse, kind='stable')
  starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
  rank = np.empty(labels.size, np.int64)
  rank[order] = np.arange(labels.size) - np.repeat(starts, counts)
  del classes
  return rank < take[inverse]


def natural_test_parts(train_client_ids: Any, test_client_ids: Any) -> IndexList:
  """Each natural client's own test examples (indices into the test arrays), in the
  order of `natural(train_client_ids)`; test ids of no training client are dropped."""
  train_ids = np.asarray(train_client_ids)
  test_ids = np.asarray(test_client_ids)
  distinct = np.unique(train_ids)
  position = np.searchsorted(distinct, test_ids)
  position = np.minimum(position, distinct.size - 1)
  known = distinct[position] == test_ids
  rows = np.flatnonzero(known)
  owner = position[known]
  order = np.argsort(owner, kind='stable')
  bounds = np.searchsorted(owner[order], np.arange(distinct.size + 1))
  return [rows[order[a:b]].astype(np.int64) for a, b in zip(bounds[:-1], bounds[1:])]


# ----------------------------------------------------------------------------
# Dispatch by config name.
# ----------------------------------------------------------------------------

_OPTION_ALIASES = {'dirichlet_concentration': 'alpha'}


def _iid_from_labels(labels: Any, num_clients: int, seed: int) -> IndexList:
  return iid(_check_labels(labels).size, num_clients, seed)


def _natural_from_options(labels: Any, num_clients: int | None, seed: int,
                          client_ids: Any = None) -> IndexList:
  del labels, seed  # The natural partition is given, not drawn.
  if client_ids is None:
    raise ValueError('partition "natural" needs the option client_ids')
  out = natural(client_ids)
  if num_clients is not None and num_clients != len(out):
    raise ValueError(
        f'num_clients={num_clients} but client_ids has {len(out)} distinct ids')
  return out


PARTITIONERS: dict[str, Callable[..., IndexList]] = {
    'iid': _iid_from_labels,
    'dirichlet': dirichlet_fedml,
    'dirichlet_fedml': dirichlet_fedml,
    'dirichlet_balanced': dirichlet_balanced,
    'shards': shards,
    'mcmahan_shards': shards,
    'class_cyclic': class_cyclic,
    'one_class': one_class,
    'natural': _natural_from_options,
}


def partition(name: str, labels: Any, num_clients: int | None, seed: int,
              **options: Any) -> IndexList:
  """Runs the partitioner registered under `name` (see PARTITIONERS).

  Options are the partitioner's keyword arguments; `dirichlet_concentration`
  is accepted for `alpha` (the config field name).
  "natural" takes `client_ids=` and ignores labels and seed.

  Raises:
    ValueError: unknown name or option, or invalid values.
  """
  if name not in PARTITIONERS:
    raise ValueError(
        f'partition must be one of {sorted(PARTITIONERS)}, got {name!r}')
  fn = PARTITIONERS[name]
  kwargs = {_OPTION_ALIASES.get(k, k): v for k, v in options.items()}
  params = inspect.signature(fn).parameters
  accepted = [p for p in params if p not in ('labels', 'num_clients', 'seed')]
  unknown = sorted(k for k in kwargs if k not in accepted)
  if unknown:
    raise ValueError(
        f'partition {name!r} does not accept option(s) {unknown}; accepted: '
        f'{accepted}')
  missing = [p for p in accepted if params[p].default is inspect.Parameter.empty
             and p not in kwargs]
  if missing:
    shown = ['dirichlet_concentration' if p == 'alpha' else p for p in missing]
    raise ValueError(f'partition {name!r} needs option(s) {shown}')
  return fn(labels=labels, num_clients=num_clients, seed=seed, **kwargs)
