"""Cohort packing: ragged client datasets -> fixed-shape index blocks + masks.

The training arrays live on device and the engine gathers rows inside jit, so
packing produces indices, not pixels. A cohort becomes
`indices[C, S, B]` with `example_mask[C, S, B]`, `step_mask[C, S]` and
`client_mask[C]`: a padded example adds nothing to the loss or the example
count, a padded step leaves the client state untouched, a padded client has
weight zero. Steps are rounded up to `step_multiple` so that a run compiles
once.

Batches of a client are a function of (seed, round_idx, client_id) and its own
data only: the same client packs to the same rows whether it trains alone, in
any cohort, or next to padding, which keeps single-device, sharded and chunked
runs comparable.

Two modes:
* steps (`num_steps`): K full batches from a stream of fresh random
  permutations of the client's data (a static B for vmap: a batch may
  span two permutations and repeats examples when the client has fewer than
  B). The stream restarts every round from (seed, round_idx, client_id); the
  FedLAMA reference code's stream that continues across participations is not reproduced, since that
  would make a round depend on the client's history.
* epochs (`num_epochs`): ceil(n / B) batches per epoch (floor with
  `drop_remainder`), one fresh permutation per epoch, the last batch of each
  epoch padded with example_mask 0 (the reference `tf.data.batch(B)`).
"""

import dataclasses
import numbers
from typing import Any, Sequence

import numpy as np

from fedjax_lama.data import seeding
from fedjax_lama.data.validate import check_int as _check_int

_INT32_MAX = np.iinfo(np.int32).max


@dataclasses.dataclass(frozen=True)
class CohortBatch:
  """One cohort's local-training input, as host numpy arrays.

  Attributes:
    indices: int32 [C, S, B], rows of the train arrays (0 where padded).
    example_mask: float32 [C, S, B], 1 for a real example, 0 for padding.
    step_mask: float32 [C, S], 1 if the step has at least one real example.
    client_mask: float32 [C], 1 for a real client with data; 0 for a padded
      slot and for a client with no examples (it cannot train, so it must not
      weigh on the aggregate).
    client_ids: int32 [C], the client id (0 for padded slots; kept for a
      client with no examples).
    num_examples: float32 [C], size of the client's local dataset (0 if padded).
  """
  indices: np.ndarray
  example_mask: np.ndarray
  step_mask: np.ndarray
  client_mask: np.ndarray
  client_ids: np.ndarray
  num_examples: np.ndarray

  @property
  def num_clients(self) -> int:
    return self.indices.shape[0]

  @property
  def num_steps(self) -> int:
    return self.indices.shape[1]

  @property
  def batch_size(self) -> int:
    return self.indices.shape[2]


def _per_client(value: Any, field: str, num: int) -> list[int]:
  """An int or a per-client sequence of ints, each >= 0."""
  if isinstance(value, numbers.Integral) and not isinstance(value, bool):
    return [_check_int(value, field, 0)] * num
  values = list(np.asarray(value).reshape(-1)) if not isinstance(
      value, (str, bytes)) else None
  if values is None or len(values) != num:
    raise ValueError(
        f'{field} must be an int or a sequence of {num} ints (one per client), '
        f'got {value!r}')
  return [_check_int(v, f'{field}[{i}]', 0) for i, v in enumerate(values)]


def _check_indices(idx: Any, i: int) -> np.ndarray:
  idx = np.asarray(idx)
  if idx.ndim != 1 or not (np.issubdtype(idx.dtype, np.integer) or
                           idx.size == 0):
    raise ValueError(
        f'client_indices[{i}] must be a 1-D integer array, got dtype '
        f'{idx.dtype} with shape {idx.shape}')
  if idx.size and (idx.min() < 0 or idx.max() > _INT32_MAX):
    raise ValueError(
        f'client_indices[{i}] must lie in [0, 2**31 - 1], got '
        f'[{idx.min()}, {idx.max()}]')
  return idx.astype(np.int64)


def _client_rng(seed: int, round_idx: int, client_id: int,
                stream: int = seeding.PACK_STREAM) -> np.random.Generator:
  return seeding.make_rng(seed, stream, round_idx, client_id)


def _permutations(rng: np.random.Generator, n: int, count: int) -> np.ndarray:
  """`count` independent permutations of range(n), int64 [count, n]."""
  return rng.permuted(np.tile(np.arange(n, dtype=np.int64), (count, 1)),
                      axis=1)


def steps_per_epoch(num_examples: int, batch_size: int,
                    drop_remainder: bool = False) -> int:
  """Batches in one local epoch: ceil(n / B) (a short last batch is kept), or floor(n / B)
  if dropping. The one count of it: the engine's packing, the simulated clock's latency and
  job packing, and the programs' static step axis all use it."""
  if drop_remainder:
    return int(num_examples) // int(batch_size)
  return -(-int(num_examples) // int(batch_size))


def _steps_rows(n: int, steps: int, batch_size: int,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  total = steps * batch_size
  count = -(-total // n)
  pos = _permutations(rng, n, count).reshape(-1)[:total]
  return pos.reshape(steps, batch_size), np.ones((steps, batch_size), bool)


def _epochs_rows(n: int, epochs: int, batch_size: int, drop_remainder: bool,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  per_epoch = steps_per_epoch(n, batch_size, drop_remainder)
  width = per_epoch * batch_size
  perms = _permutations(rng, n, epochs)
  if drop_remainder:
    pos = perms[:, :width]
    real = np.ones_like(pos, bool)
  else:
    pos = np.zeros((epochs, width), np.int64)
    pos[:, :n] = perms
    real = np.zeros((epochs, width), bool)
    real[:, :n] = True
  return (pos.reshape(epochs * per_epoch, batch_size),
          real.reshape(epochs * per_epoch, batch_size))


def pack_cohort(client_indices: Sequence[np.ndarray],
                client_ids: Sequence[int],
                *,
                batch_size: int,
                num_steps: int | Sequence[int] | None = None,
                num_epochs: int | Sequence[int] | None = None,
                seed: int,
                round_idx: int,
                pad_clients_to: int | None = None,
                step_multiple: int = 1,
                drop_remainder: bool = False,
                pad_steps_to: int | None = None,
                stream: int = seeding.PACK_STREAM) -> CohortBatch:
  """Packs a cohort's batches into fixed-shape index and mask arrays.

  Args:
    client_indices: per cohort client, its rows of the train arrays.
    client_ids: per cohort client, its id (keys its batch randomness).
    batch_size: B.
    num_steps: steps mode: local steps per client (an int, or one per client
      for FedNova-style heterogeneous work).
    num_epochs: epochs mode: local epochs per client (an int, or one per
      client, e.g. FedAT's variable epochs). Exactly one of the two is given.
    seed: run seed.
    round_idx: round (or sampling event) index.
    pad_clients_to: pad the client axis to this many slots (e.g. a multiple of
      the device count); padded slots have client_mask 0.
    step_multiple: round the step axis up to a multiple of this (bucketing).
    drop_remainder: epochs mode: drop each epoch's last partial batch.
    pad_steps_to: make the step axis at least this long (before rounding), so
      rounds of varying work share one shape.
    stream: the seeding stream of the batches (default the training batches';
      seeding.FINETUNE_STREAM for fine-tuning before evaluation).

  Returns:
    A `CohortBatch` with C = max(len(client_indices), pad_clients_to) slots and
    S steps: max(num_steps) in steps mode (whatever the data, so the shape
    depends on the config only), the largest epochs x steps_per_epoch in
    epochs mode; raised to pad_steps_to, then rounded up to step_multiple.
    A client with no examples gets all masks 0, client_mask included. A client
    with data but no work (0 steps or epochs, or fewer than B examples with
    drop_remainder) keeps client_mask 1 with every step masked, i.e. it returns
    the model it was given, as the reference loaders would.

  Raises:
    ValueError: invalid arguments, naming the field.
  """
  num = len(client_indices)
  if len(client_ids) != num:
    raise ValueError(
        f'client_ids has {len(client_ids)} entries but client_indices has '
        f'{num}')
  batch_size = _check_int(batch_size, 'batch_size', 1)
  seed = seeding.check_seed(seed)
  round_idx = _check_int(round_idx, 'round_idx', 0)
  step_multiple = _check_int(step_multiple, 'step_multiple', 1)
  if (num_steps is None) == (num_epochs is None):
    raise ValueError('give exactly one of num_steps and num_epochs')
  slots = num if pad_clients_to is None else _check_int(
      pad_clients_to, 'pad_clients_to', num)
  ids = [_check_int(c, f'client_ids[{i}]', 0) for i, c in enumerate(client_ids)]
  for i, c in enumerate(ids):
    if c > _INT32_MAX:
      raise ValueError(f'client_ids[{i}] must fit in int32, got {c}')
  idxs = [_check_indices(x, i) for i, x in enumerate(client_indices)]
  if num_steps is not None:
    work = _per_client(num_steps, 'num_steps', num)
  else:
    work = _per_client(num_epochs, 'num_epochs', num)

  rows = []
  needed = 0
  for idx, cid, w in zip(idxs, ids, work):
    n = idx.size
    # Steps mode: the step axis is the requested work, whatever the data, so
    # the shape is fixed by the config. Epochs mode: it follows the data.
    needed = max(needed, w if num_steps is not None else
                 w * steps_per_epoch(n, batch_size, drop_remainder))
    if n == 0 or w == 0:
      rows.append(None)
      continue
    rng = _client_rng(seed, round_idx, cid, stream)
    if num_steps is not None:
      pos, real = _steps_rows(n, w, batch_size, rng)
    else:
      pos, real = _epochs_rows(n, w, batch_size, drop_remainder, rng)
    rows.append((idx[pos], real))

  steps = needed
  if pad_steps_to is not None:
    pad_steps_to = _check_int(pad_steps_to, 'pad_steps_to', 0)
    if pad_steps_to < needed:
      raise ValueError(
          f'pad_steps_to={pad_steps_to} is less than the {needed} steps this '
          'cohort needs')
    steps = pad_steps_to
  steps = -(-steps // step_multiple) * step_multiple

  indices = np.zeros((slots, steps, batch_size), np.int32)
  example_mask = np.zeros((slots, steps, batch_size), np.float32)
  client_mask = np.zeros((slots,), np.float32)
  client_id_arr = np.zeros((slots,), np.int32)
  num_examples = np.zeros((slots,), np.float32)
  client_id_arr[:num] = ids
  for i, (idx, r) in enumerate(zip(idxs, rows)):
    num_examples[i] = idx.size
    client_mask[i] = 1.0 if idx.size else 0.0
    if r is None:
      continue
    global_rows, real = r
    s = global_rows.shape[0]
    indices[i, :s] = np.where(real, global_rows, 0)
    example_mask[i, :s] = real
  step_mask = (example_mask.max(axis=2, initial=0.0) > 0).astype(np.float32)
  return CohortBatch(indices, example_mask, step_mask, client_mask,
                     client_id_arr, num_examples)
