"""FEMNIST from TensorFlow Federated's federated EMNIST HDF5 files.

TFF (`tff.simulation.datasets.emnist.load_data(only_digits=False)`) ships
`fed_emnist_train.h5` and `fed_emnist_test.h5`, each laid out as
`examples/<client_id>/pixels` (float [n, 28, 28]) and
`examples/<client_id>/label` (int [n]). The data is LEAF's FEMNIST
preprocessing (3,400 writers, 62 classes), so the conventions already match
`leaf.read_femnist_leaf`:

* pixels are pixel/255 with a WHITE background (value 1) and dark ink, exactly as
  in the LEAF JSON (the shipped LEAF subset has median pixel 1.0). TFF's own
  autoencoder task computes `1 - pixels` to get a zero background, which
  confirms the convention; nothing is inverted here.
* client ids are LEAF writer names (e.g. 'f3313_11'), and every writer's
  examples are split between the two files, as in LEAF's per-writer split.

The result is the same per-writer `LeafSplit` the LEAF reader returns, so
`load_dataset('femnist')`, the 'natural' partition and `femnist_clients`
work unchanged. Writers are taken in sorted name order
(HDF5 group iteration order is by name, made explicit here).

h5py is imported lazily: the rest of the data layer works without it.
"""

import os
from typing import Any

import numpy as np

from fedjax_lama.data import leaf
from fedjax_lama.data.data_errors import DataError

TRAIN_FILE = 'fed_emnist_train.h5'
TEST_FILE = 'fed_emnist_test.h5'
H5_FILES = {'train': TRAIN_FILE, 'test': TEST_FILE}
# The full TFF train file holds 671,585 images (2.1 GB as float32); a header
# announcing far more is refused before anything is read.
_MAX_PIXEL_BYTES = 1 << 34
_EXAMPLES = 'examples'


def _import_h5py() -> Any:
  try:
    import h5py  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise DataError(
        'reading FEMNIST from TFF HDF5 files (fed_emnist_*.h5) needs h5py: '
        'pip install h5py (or provide LEAF JSON files instead; see BUILD.md, '
        '"Data")') from e
  return h5py


def _child(h5py, group, name: str, kind, path: str, where: str):
  """group[name] if it is a hard-linked `kind`; refuses external links."""
  link = group.get(name, getlink=True)
  if link is None:
    raise DataError(f'{path}: {where}: missing "{name}"')
  if isinstance(link, h5py.ExternalLink):
    raise DataError(
        f'{path}: {where}/{name} is an external link to {link.filename!r}; '
        'only data stored in the file itself is read')
  try:
    obj = group[name]
  except (KeyError, OSError, ValueError) as e:  # Dangling soft link, etc.
    raise DataError(f'{path}: {where}/{name} cannot be opened ({e})') from e
  if not isinstance(obj, kind):
    raise DataError(
        f'{path}: {where}/{name} must be an HDF5 {kind.__name__}, got '
        f'{type(obj).__name__}')
  if kind is h5py.Dataset and (obj.is_virtual or obj.external):
    raise DataError(
        f'{path}: {where}/{name} refers to data in other files (virtual or '
        'external storage); only data stored in the file itself is read')
  return obj


def _read(ds, path: str, where: str) -> np.ndarray:
  try:
    return ds[()]
  except (OSError, ValueError, TypeError, RuntimeError) as e:
    raise DataError(f'{path}: {where}: corrupt data ({e})') from e


def _read_client(h5py, examples, client: str, path: str,
                 budget: list[int]) -> tuple[np.ndarray, np.ndarray]:
  where = f'{_EXAMPLES}/{client}'
  group = _child(h5py, examples, client, h5py.Group, path, _EXAMPLES)
  pixels = _child(h5py, group, 'pixels', h5py.Dataset, path, where)
  label = _child(h5py, group, 'label', h5py.Dataset, path, where)
  if pixels.dtype.kind != 'f' or pixels.ndim != 3 or pixels.shape[1:] != (
      28, 28):
    raise DataError(
        f'{path}: {where}/pixels must be floats of shape [n, 28, 28], got '
        f'{pixels.dtype} {pixels.shape}')
  if label.dtype.kind not in 'iu' or label.ndim != 1:
    raise DataError(
        f'{path}: {where}/label must be a 1-D integer array, got '
        f'{label.dtype} {label.shape}')
  n = pixels.shape[0]
  if label.shape[0] != n:
    raise DataError(
        f'{path}: {where} has {n} images but {label.shape[0]} labels')
  budget[0] -= n * 28 * 28 * 4
  if budget[0] < 0:
    raise DataError(
        f'{path}: the file announces more than {_MAX_PIXEL_BYTES} bytes of '
        'pixels; refusing to read it')
  x = np.asarray(_read(pixels, path, f'{where}/pixels'), np.float32)
  y = np.asarray(_read(label, path, f'{where}/label'))
  if not np.all(np.isfinite(x)) or x.min(initial=0) < 0 or x.max(
      initial=0) > 1:
    raise DataError(f'{path}: {where}/pixels: values must lie in [0, 1]')
  if y.size and (y.min() < 0 or y.max() >= leaf.FEMNIST_NUM_CLASSES):
    raise DataError(
        f'{path}: {where}/label: labels must be ints in '
        f'[0, {leaf.FEMNIST_NUM_CLASSES}), got [{y.min()}, {y.max()}]')
  return x.reshape((n,) + leaf.FEMNIST_SHAPE), y.astype(np.int32)


def read_femnist_h5_file(path: str) -> leaf.LeafSplit:
  """Reads one TFF federated-EMNIST HDF5 file into per-writer arrays.

  Returns:
    A `LeafSplit` with writers in sorted name order, x float32
    [n, 28, 28, 1] in [0, 1] (white background 1.0) and y int32 [n].

  Raises:
    DataError: missing file, not HDF5, no `examples` group, a client without
      `pixels`/`label`, wrong shapes or dtypes, values out of range, links to
      other files, or no clients at all.
  """
  h5py = _import_h5py()
  if not os.path.isfile(path):
    raise DataError(f'{path}: file not found')
  try:
    f = h5py.File(path, 'r')
  except (OSError, ValueError) as e:
    raise DataError(f'{path}: not a readable HDF5 file ({e})') from e
  with f:
    examples = _child(h5py, f, _EXAMPLES, h5py.Group, path, '/')
    clients = sorted(examples.keys())
    if not clients:
      raise DataError(f'{path}: "{_EXAMPLES}" holds no clients')
    budget = [_MAX_PIXEL_BYTES]
    xs, ys = [], []
    for client in clients:
      x, y = _read_client(h5py, examples, client, path, budget)
      xs.append(x)
      ys.append(y)
  return leaf.LeafSplit(list(clients), xs, ys)


def read_femnist_h5(directory: str) -> dict[str, leaf.LeafSplit]:
  """Reads `directory/fed_emnist_{train,test}.h5` (see the module docstring)."""
  return {s: read_femnist_h5_file(os.path.join(directory, f))
          for s, f in H5_FILES.items()}
