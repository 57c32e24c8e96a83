"""LEAF JSON readers (FEMNIST; the same layout serves Shakespeare and Sent140).

LEAF (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018) stores
each split as JSON files `{"users": [...], "num_samples": [...],
"user_data": {user: {"x": [...], "y": [...]}}}` under `<root>/train` and
`<root>/test`, optionally gzip-compressed (`*.json.gz`). The reader keeps the
writers in file order (files sorted by name, then the order of `users`), which
is deterministic and independent of the file system.
"""

import dataclasses
import glob
import json
import os
from typing import Any

import numpy as np

from fedjax_lama.data.data_errors import DataError
from fedjax_lama.data import readers

LEAF_SPLITS = ('train', 'test')
FEMNIST_NUM_CLASSES = 62
FEMNIST_SHAPE = (28, 28, 1)


@dataclasses.dataclass
class LeafSplit:
  """One split of a LEAF dataset, per writer, in file order.

  Attributes:
    users: writer names.
    x: per-writer inputs, aligned with `users` (raw JSON values unless a
      converter was given).
    y: per-writer targets, aligned with `users`.
  """
  users: list[str]
  x: list[Any]
  y: list[Any]

  def num_examples(self) -> int:
    return int(sum(len(v) for v in self.y))


def leaf_files(directory: str) -> list[str]:
  """The `*.json` and `*.json.gz` files of one split directory, sorted."""
  files = glob.glob(os.path.join(directory, '*.json'))
  files += glob.glob(os.path.join(directory, '*.json.gz'))
  return sorted(files)


def load_json(path: str, max_bytes: int = 1 << 31) -> Any:
  """A JSON file of at most max_bytes; DataError naming the file if it is not JSON."""
  raw = readers.read_bytes(path, max_bytes=max_bytes)
  try:
    return json.loads(raw)
  except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8.
    raise DataError(f'{path}: invalid JSON ({e})') from e


def check_leaf_file(obj: Any, path: str) -> None:
  """The LEAF layout: users (list), user_data (dict), num_samples matching users."""
  if not isinstance(obj, dict):
    raise DataError(f'{path}: expected a JSON object, got {type(obj).__name__}')
  for key, kind in (('users', list), ('user_data', dict)):
    if not isinstance(obj.get(key), kind):
      raise DataError(
          f'{path}: missing or malformed "{key}" (a JSON {kind.__name__} is '
          'required)')
  num_samples = obj.get('num_samples')
  if num_samples is not None and (not isinstance(num_samples, list) or
                                  len(num_samples) != len(obj['users'])):
    raise DataError(f'{path}: "num_samples" does not match "users"')


def read_leaf_split(directory: str) -> LeafSplit:
  """Reads every LEAF JSON file in one split directory.

  Raises:
    DataError: no files, malformed JSON, a writer listed without data, x and y
      of different lengths, a `num_samples` mismatch, or a writer that appears
      in two files of the same split.
  """
  files = leaf_files(directory)
  if not files:
    raise DataError(
        f'{directory}: no LEAF *.json or *.json.gz files found')
  users, xs, ys = [], [], []
  seen = {}
  for path in files:
    obj = load_json(path)
    check_leaf_file(obj, path)
    num_samples = obj.get('num_samples')
    for i, user in enumerate(obj['users']):
      if not isinstance(user, str):
        raise DataError(f'{path}: user names must be strings, got {user!r}')
      if user in seen:
        raise DataError(
            f'{path}: writer {user!r} also appears in {seen[user]}')
      seen[user] = path
      data = obj['user_data'].get(user)
      if (not isinstance(data, dict) or not isinstance(data.get('x'), list) or
          not isinstance(data.get('y'), list)):
        raise DataError(f'{path}: writer {user!r} has no "x"/"y" lists')
      if len(data['x']) != len(data['y']):
        raise DataError(
            f'{path}: writer {user!r} has {len(data["x"])} inputs but '
            f'{len(data["y"])} targets')
      if num_samples is not None and num_samples[i] != len(data['y']):
        raise DataError(
            f'{path}: writer {user!r}: num_samples says {num_samples[i]}, '
            f'data holds {len(data["y"])}')
      users.append(user)
      xs.append(data['x'])
      ys.append(data['y'])
  return LeafSplit(users, xs, ys)


def read_leaf(root: str) -> dict[str, LeafSplit]:
  """Reads `<root>/train` and `<root>/test` as raw LEAF splits."""
  return {s: read_leaf_split(os.path.join(root, s)) for s in LEAF_SPLITS}


def _femnist_arrays(split: LeafSplit, directory: str) -> LeafSplit:
  """Converts raw FEMNIST lists to float32 [n, 28, 28, 1] and int32 [n]."""
  xs, ys = [], []
  for user, x, y in zip(split.users, split.x, split.y):
    try:
      x = np.asarray(x, dtype=np.float32)
      y = np.asarray(y)
    except (ValueError, TypeError) as e:
      raise DataError(
          f'{directory}: writer {user!r}: x must be lists of 784 numbers '
          f'and y a list of ints ({e})') from e
    if x.ndim != 2 or x.shape[1] != 784:
      raise DataError(
          f'{directory}: writer {user!r}: x must have shape [n, 784], got '
          f'{x.shape}')
    if not np.all(np.isfinite(x)) or x.min(initial=0) < 0 or x.max(
        initial=0) > 1:
      raise DataError(
          f'{directory}: writer {user!r}: pixel values must lie in [0, 1]')
    if y.size and (not np.issubdtype(y.dtype, np.integer) or y.ndim != 1 or
                   y.min() < 0 or y.max() >= FEMNIST_NUM_CLASSES):
      raise DataError(
          f'{directory}: writer {user!r}: labels must be ints in '
          f'[0, {FEMNIST_NUM_CLASSES})')
    xs.append(x.reshape((-1,) + FEMNIST_SHAPE))
    ys.append(y.astype(np.int32).reshape(-1))
  return LeafSplit(list(split.users), xs, ys)


def read_femnist_leaf(root: str) -> dict[str, LeafSplit]:
  """Reads LEAF FEMNIST: per-writer float32 [n, 28, 28, 1] in [0, 1], int32 y.

  The 784 LEAF features are a row-major 28x28 image (as the FedLAMA reference
  code reshapes them); 62 classes: digits, then upper-case, then lower-case letters.
  """
  out = {}
  for s in LEAF_SPLITS:
    directory = os.path.join(root, s)
    out[s] = _femnist_arrays(read_leaf_split(directory), directory)
  return out
