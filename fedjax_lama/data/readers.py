"""Readers for image datasets in their original file formats (numpy only).

* IDX (MNIST, Fashion-MNIST), gzip-compressed or not.
* CIFAR-10 / CIFAR-100 "python version" pickles, through a restricted unpickler.
* scikit-learn's bundled `digits` (no download), the built-in smoke-test
  dataset.

All inputs are untrusted: a bad header, a truncated
payload, a broken gzip stream or a pickle that asks for anything other than
plain containers and numpy arrays raises `DataError` naming the file. No reader
trusts a header to size an allocation before the bytes are actually there.
"""

import gzip
import io
import os
import pickle
import zlib
from typing import Any, BinaryIO

import numpy as np

from fedjax_lama.data.data_errors import DataError

_GZIP_MAGIC = b'\x1f\x8b'
_CHUNK = 1 << 22

# ----------------------------------------------------------------------------
# Bytes from a (possibly gzip-compressed) file.
# ----------------------------------------------------------------------------


def _is_gzip(path: str) -> bool:
  with open(path, 'rb') as f:
    return f.read(2) == _GZIP_MAGIC


def _open_maybe_gzip(path: str) -> BinaryIO:
  """Opens `path` for binary reading, decompressing if it starts as gzip."""
  if not os.path.isfile(path):
    raise DataError(f'{path}: file not found')
  if _is_gzip(path):
    return gzip.open(path, 'rb')
  return open(path, 'rb')


def _read_exact(f: BinaryIO, n: int, path: str, what: str) -> bytes:
  """Reads exactly n bytes."""
  # In chunks, so that a lying header cannot force a huge allocation.
  parts = []
  remaining = n
  try:
    while remaining > 0:
      chunk = f.read(min(remaining, _CHUNK))
      if not chunk:
        break
      parts.append(chunk)
      remaining -= len(chunk)
  except (OSError, EOFError, zlib.error) as e:
    raise DataError(f'{path}: corrupt or truncated file ({e})') from e
  data = b''.join(parts)
  if len(data) != n:
    raise DataError(
        f'{path}: truncated {what}: expected {n} bytes, file has {len(data)}')
  return data


def _expect_eof(f: BinaryIO, path: str) -> None:
  """Checks there are no trailing bytes (and lets gzip verify its CRC)."""
  try:
    extra = f.read(1)
  except (OSError, EOFError, zlib.error) as e:
    raise DataError(f'{path}: corrupt or truncated file ({e})') from e
  if extra:
    raise DataError(
        f'{path}: trailing bytes after the payload announced by the header')


def read_bytes(path: str, max_bytes: int = 1 << 31) -> bytes:
  """Returns the (decompressed) content of `path`, at most `max_bytes` long."""
  with _open_maybe_gzip(path) as f:
    parts = []
    total = 0
    try:
      while True:
        chunk = f.read(_CHUNK)
        if not chunk:
          break
        total += len(chunk)
        if total > max_bytes:
          raise DataError(
              f'{path}: decompressed size exceeds the limit of {max_bytes} '
              'bytes')
        parts.append(chunk)
    except (OSError, EOFError, zlib.error) as e:
      raise DataError(f'{path}: corrupt or truncated file ({e})') from e
  return b''.join(parts)


# ----------------------------------------------------------------------------
# IDX (http://yann.lecun.com/exdb/mnist/, "FILE FORMATS").
# ----------------------------------------------------------------------------

# IDX type byte -> big-endian numpy dtype.
_IDX_DTYPES = {
    0x08: np.dtype('>u1'),
    0x09: np.dtype('>i1'),
    0x0B: np.dtype('>i2'),
    0x0C: np.dtype('>i4'),
    0x0D: np.dtype('>f4'),
    0x0E: np.dtype('>f8'),
}
_IDX_MAX_BYTES = 1 << 33


def read_idx(path: str) -> np.ndarray:
  """Reads an IDX file (gzip-compressed or not) into a native-endian array.

  Args:
    path: the file; gzip is detected from its first two bytes, not its name.

  Returns:
    The array with the shape and dtype given by the header.

  Raises:
    DataError: bad magic, unknown type, zero dimensions, a payload shorter or
      longer than the header announces, or a corrupt gzip stream.
  """
  with _open_maybe_gzip(path) as f:
    magic = _read_exact(f, 4, path, 'IDX magic number')
    if magic[0] != 0 or magic[1] != 0:
      raise DataError(
          f'{path}: not an IDX file (magic number {magic.hex()}; the first '
          'two bytes must be zero)')
    if magic[2] not in _IDX_DTYPES:
      raise DataError(f'{path}: unknown IDX data type 0x{magic[2]:02x}')
    ndim = magic[3]
    if ndim == 0:
      raise DataError(f'{path}: IDX header declares zero dimensions')
    dims = np.frombuffer(
        _read_exact(f, 4 * ndim, path, 'IDX dimensions'), dtype='>u4')
    dims = tuple(int(d) for d in dims)
    dtype = _IDX_DTYPES[magic[2]]
    nbytes = int(np.prod(dims, dtype=object)) * dtype.itemsize
    if nbytes > _IDX_MAX_BYTES:
      raise DataError(
          f'{path}: IDX header announces {nbytes} bytes of payload, more than '
          f'the limit of {_IDX_MAX_BYTES}')
    payload = _read_exact(f, nbytes, path, 'IDX payload')
    _expect_eof(f, path)
  return np.frombuffer(payload, dtype=dtype).reshape(dims).astype(
      dtype.newbyteorder('='))


def read_idx_images(path: str) -> np.ndarray:
  """Reads IDX images (magic 2051): uint8 [N, H, W]."""
  arr = read_idx(path)
  if arr.ndim != 3 or arr.dtype != np.uint8:
    raise DataError(
        f'{path}: expected IDX images (magic 2051: uint8, 3 dimensions), got '
        f'dtype {arr.dtype} with shape {arr.shape}')
  return arr


def read_idx_labels(path: str, num_classes: int | None = None) -> np.ndarray:
  """Reads IDX labels (magic 2049): int32 [N], optionally range-checked."""
  arr = read_idx(path)
  if arr.ndim != 1 or arr.dtype != np.uint8:
    raise DataError(
        f'{path}: expected IDX labels (magic 2049: uint8, 1 dimension), got '
        f'dtype {arr.dtype} with shape {arr.shape}')
  if num_classes is not None and arr.size and int(arr.max()) >= num_classes:
    raise DataError(
        f'{path}: label {int(arr.max())} out of range [0, {num_classes})')
  return arr.astype(np.int32)


def read_idx_pair(images_path: str, labels_path: str,
                  num_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
  """Reads matching IDX image and label files: (uint8 [N,H,W], int32 [N])."""
  images = read_idx_images(images_path)
  labels = read_idx_labels(labels_path, num_classes)
  if images.shape[0] != labels.shape[0]:
    raise DataError(
        f'{images_path} holds {images.shape[0]} images but {labels_path} '
        f'holds {labels.shape[0]} labels')
  return images, labels


# ----------------------------------------------------------------------------
# CIFAR pickles, through a restricted unpickler.
# ----------------------------------------------------------------------------


def _numpy_multiarray():
  # numpy 2 renamed numpy.core to numpy._core; importing the old name warns.
  core = getattr(np, '_core', None)
  if core is not None:
    return core.multiarray
  return np.core.multiarray  # pragma: no cover  (numpy < 2)


# The only builtins a CIFAR pickle may name. Everything callable that could
# reach code (getattr, eval, exec, __import__, ...) is absent on purpose.
_SAFE_BUILTINS = {
    'dict': dict, 'list': list, 'tuple': tuple, 'str': str, 'bytes': bytes,
    'int': int, 'float': float, 'bool': bool,
}


def _allowed_globals() -> dict[tuple[str, str], Any]:
  multiarray = _numpy_multiarray()
  allowed = {}
  for module in ('builtins', '__builtin__'):  # Python 3 and Python 2 pickles.
    for name, obj in _SAFE_BUILTINS.items():
      allowed[(module, name)] = obj
  for module in ('numpy.core.multiarray', 'numpy._core.multiarray'):
    allowed[(module, '_reconstruct')] = multiarray._reconstruct
    allowed[(module, 'scalar')] = multiarray.scalar
  allowed[('numpy', 'ndarray')] = np.ndarray
  allowed[('numpy', 'dtype')] = np.dtype
  return allowed


class _RestrictedUnpickler(pickle.Unpickler):
  """Rebuilds plain containers and numpy arrays, and nothing else.

  A pickle is a program: `find_class` is the only way it can reach code, so an
  allow-list there stops `os.system`, `builtins.eval` and friends before they
  are even looked up.
  """

  def __init__(self, file: BinaryIO, path: str):
    super().__init__(file, encoding='bytes')
    self._path = path
    self._allowed = _allowed_globals()

  def find_class(self, module: str, name: str) -> Any:
    obj = self._allowed.get((module, name))
    if obj is None:
      raise DataError(
          f'{self._path}: refusing to unpickle forbidden global '
          f'{module}.{name} (only builtin containers and numpy arrays are '
          'allowed)')
    return obj

  def persistent_load(self, pid: Any) -> Any:
    raise DataError(f'{self._path}: refusing pickle persistent id {pid!r}')


def safe_unpickle(path: str, max_bytes: int = 1 << 30) -> Any:
  """Unpickles `path` with the restricted unpickler (gzip accepted).

  Raises:
    DataError: the file is missing, truncated, corrupt or needs a forbidden
      global.
  """
  data = read_bytes(path, max_bytes=max_bytes)
  try:
    return _RestrictedUnpickler(io.BytesIO(data), path).load()
  except DataError:
    raise
  except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError,
          IndexError, AttributeError, MemoryError, UnicodeDecodeError,
          OverflowError) as e:
    raise DataError(
        f'{path}: corrupt or truncated pickle ({type(e).__name__}: {e})'
    ) from e


def _get_key(d: dict[Any, Any], key: str, path: str) -> Any:
  for k in (key.encode(), key):
    if k in d:
      return d[k]
  raise DataError(f'{path}: missing key {key!r} (found {sorted(map(str, d))})')


def read_cifar_batch(path: str, label_key: str = 'labels',
                     num_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
  """Reads one CIFAR python batch: (uint8 [N, 32, 32, 3] NHWC, int32 [N]).

  Args:
    path: a CIFAR-10 `data_batch_*`/`test_batch` or CIFAR-100 `train`/`test`.
    label_key: 'labels' for CIFAR-10, 'fine_labels' for CIFAR-100.
    num_classes: labels must lie in [0, num_classes).
  """
  obj = safe_unpickle(path)
  if not isinstance(obj, dict):
    raise DataError(f'{path}: expected a dict, got {type(obj).__name__}')
  data = _get_key(obj, 'data', path)
  labels = _get_key(obj, label_key, path)
  if (not isinstance(data, np.ndarray) or data.dtype != np.uint8 or
      data.ndim != 2 or data.shape[1] != 3 * 32 * 32):
    desc = (f'{data.dtype} {data.shape}' if isinstance(data, np.ndarray)
            else type(data).__name__)
    raise DataError(
        f'{path}: "data" must be a uint8 array of shape [N, 3072], got {desc}')
  try:
    labels = np.asarray(labels)
  except (ValueError, TypeError) as e:
    raise DataError(f'{path}: "{label_key}" is not a list of ints') from e
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise DataError(
        f'{path}: "{label_key}" must be a 1-D list of ints, got dtype '
        f'{labels.dtype} shape {labels.shape}')
  if labels.shape[0] != data.shape[0]:
    raise DataError(
        f'{path}: {data.shape[0]} images but {labels.shape[0]} labels')
  if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
    raise DataError(
        f'{path}: labels must lie in [0, {num_classes}), got '
        f'[{labels.min()}, {labels.max()}]')
  images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
  return np.ascontiguousarray(images), labels.astype(np.int32)


CIFAR10_TRAIN_FILES = tuple(f'data_batch_{i}' for i in range(1, 6))
CIFAR10_TEST_FILE = 'test_batch'


def read_cifar10(directory: str) -> tuple[np.ndarray, ...]:
  """Reads `cifar-10-batches-py/`: (train_x, train_y, test_x, test_y), uint8."""
  parts = [read_cifar_batch(os.path.join(directory, n))
           for n in CIFAR10_TRAIN_FILES]
  test_x, test_y = read_cifar_batch(os.path.join(directory, CIFAR10_TEST_FILE))
  train_x = np.concatenate([p[0] for p in parts])
  train_y = np.concatenate([p[1] for p in parts])
  return train_x, train_y, test_x, test_y


def read_cifar100(directory: str) -> tuple[np.ndarray, ...]:
  """Reads `cifar-100-python/` with fine labels.

  Returns:
    (train_x, train_y, test_x, test_y), uint8 NHWC images and int32 labels.
  """
  train_x, train_y = read_cifar_batch(
      os.path.join(directory, 'train'), 'fine_labels', 100)
  test_x, test_y = read_cifar_batch(
      os.path.join(directory, 'test'), 'fine_labels', 100)
  return train_x, train_y, test_x, test_y


# ----------------------------------------------------------------------------
# scikit-learn digits: real data that ships with sklearn (no download).
# ----------------------------------------------------------------------------

DIGITS_NUM_TEST = 360


def _stratified_test_mask(labels: np.ndarray, num_test: int,
                          seed: int) -> np.ndarray:
  """Boolean mask choosing `num_test` examples, proportional per class.

  Per-class quotas are floor(n_c * num_test / N) plus one for the classes with
  the largest remainders (ties by class), so the split is reproducible from
  numpy alone and independent of scikit-learn's splitter.
  """
  classes, counts = np.unique(labels, return_counts=True)
  exact = counts * num_test / labels.size
  quota = np.floor(exact).astype(np.int64)
  extra = num_test - int(quota.sum())
  order = np.lexsort((classes, -(exact - quota)))
  quota[order[:extra]] += 1
  rng = np.random.default_rng(np.random.SeedSequence([seed]))
  mask = np.zeros(labels.size, bool)
  for c, q in zip(classes, quota):
    members = np.flatnonzero(labels == c)
    mask[rng.permutation(members)[:q]] = True
  return mask


def load_digits_arrays(seed: int = 0) -> tuple[np.ndarray, ...]:
  """scikit-learn's digits as (train_x, train_y, test_x, test_y).

  1,797 real 8x8 images (UCI optdigits test set, bundled with scikit-learn),
  float32 [N, 8, 8, 1] in [0, 1] (pixel / 16), int32 labels; a fixed stratified
  split of 1,437 train / 360 test.
  """
  try:
    # Imported here: scikit-learn is slow to import and only digits needs it.
    from sklearn import datasets as sk_datasets  # pylint: disable=g-import-not-at-top
  except ImportError as e:  # pragma: no cover
    raise DataError(
        'the "digits" dataset needs scikit-learn: pip install scikit-learn'
    ) from e
  bunch = sk_datasets.load_digits()
  images = np.asarray(bunch.images, np.float32)[..., None] / np.float32(16.0)
  labels = np.asarray(bunch.target, np.int32)
  test = _stratified_test_mask(labels, DIGITS_NUM_TEST, seed)
  return images[~test], labels[~test], images[test], labels[test]
