"""tensorflow-datasets loader into host numpy arrays, without TensorFlow.

TensorFlow is not a dependency of this project. `tfds.data_source` reads
datasets prepared in the `array_record` format with numpy only, so that is the
path used here. A dataset prepared in the default TFRecord format can only be
read through `tf.data`; that path is taken only when TensorFlow happens to be
installed, and otherwise a `DataError` says how to fix it.
"""

import importlib.util
from typing import Any, Sequence

import numpy as np

from fedjax_lama.data.data_errors import DataError

# Supported names -> the feature that holds the class label.
_TFDS_DATASETS = {
    'mnist': 'label',
    'fashion_mnist': 'label',
    'cifar10': 'label',
    'cifar100': 'label',  # Fine labels; tfds also has 'coarse_label'.
    'emnist': 'label',  # tfds default config: emnist/byclass (62 classes).
}
TFDS_NAMES = tuple(sorted(_TFDS_DATASETS))
_BATCH = 1024


def _base_name(name: str) -> str:
  return name.split('/')[0].split(':')[0]


def prepare_command(name: str, data_dir: str | None) -> str:
  """The shell command that prepares `name` for `load_tfds`."""
  dd = f' --data_dir={data_dir}' if data_dir else ''
  return f'tfds build {name}{dd} --file_format=array_record'


def _import_tfds():
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as e:  # pragma: no cover
    raise DataError(
        'tensorflow-datasets is not installed: pip install tensorflow-datasets'
    ) from e
  return tfds


def _stack_source(source: Sequence[Any], label_key: str,
                  where: str) -> tuple[np.ndarray, np.ndarray]:
  """Reads every record of a random-access source into two arrays."""
  n = len(source)
  images, labels = [], []
  for start in range(0, n, _BATCH):
    keys = list(range(start, min(n, start + _BATCH)))
    try:
      records = source.__getitems__(keys)
    except TypeError:
      # tfds.testing.mock_data's array_record mock does not implement batched
      # reads; fall back to one record at a time.
      records = [source[k] for k in keys]
    for r in records:
      images.append(np.asarray(r['image']))
      labels.append(np.asarray(r[label_key]))
  if not images:
    raise DataError(f'{where}: the split is empty')
  return np.stack(images), np.asarray(labels, np.int64)


def _read_with_tf(builder: Any, split: str, label_key: str,
                  where: str) -> tuple[np.ndarray, np.ndarray]:
  tfds = _import_tfds()
  ds = builder.as_dataset(split=split, batch_size=-1)
  arrays = tfds.as_numpy(ds)
  return np.asarray(arrays['image']), np.asarray(arrays[label_key], np.int64)


def _load_split(tfds: Any, name: str, split: str, data_dir: str | None,
                label_key: str) -> tuple[np.ndarray, np.ndarray]:
  where = f'tfds {name}[{split}]' + (f' in {data_dir}' if data_dir else '')
  try:
    source = tfds.data_source(name, split=split, data_dir=data_dir,
                              download=False)
  except Exception as e:  # pylint: disable=broad-except
    # tfds raises several unrelated types here (AssertionError, FileNotFound,
    # NotImplementedError for TFRecord data, ...); sort them out below.
    source_error = e
  else:
    return _stack_source(source, label_key, where)
  try:
    builder = tfds.builder(name, data_dir=data_dir)
    prepared = builder.is_prepared()
  except Exception as e:  # pylint: disable=broad-except
    raise DataError(f'{where}: cannot open the dataset ({e})') from e
  if not prepared:
    raise DataError(
        f'{where}: dataset not prepared. Prepare it (needs internet) with\n'
        f'  {prepare_command(name, data_dir)}\n'
        'or python -m tensorflow_datasets.scripts.download_and_prepare '
        f'--datasets={name}' + (f' --data_dir={data_dir}' if data_dir else '')
        + ' --file_format=array_record\n(see BUILD.md). '
        f'Underlying error: {source_error}') from source_error
  if importlib.util.find_spec('tensorflow') is None:
    raise DataError(
        f'{where}: the dataset is prepared in the {builder.info.file_format} '
        'format, which only TensorFlow can read. Either pip install '
        'tensorflow, or re-prepare it without TensorFlow-only formats: '
        f'{prepare_command(name, data_dir)} (in a fresh data_dir). '
        f'Underlying error: {source_error}') from source_error
  return _read_with_tf(builder, split, label_key, where)


def load_tfds(name: str, data_dir: str | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
  """Loads a prepared tfds dataset into host numpy arrays.

  Args:
    name: one of mnist, fashion_mnist, cifar10, cifar100, emnist, optionally
      with a tfds config/version (e.g. 'emnist/letters', 'mnist:3.0.1').
    data_dir: the tfds data directory (tfds' default when None).

  Returns:
    (train_x uint8 [N, H, W, C], train_y int32, test_x, test_y, num_classes).
    EMNIST images are transposed to the natural orientation (tfds keeps the
    raw EMNIST layout, which is the transpose of MNIST's).

  Raises:
    ValueError: an unsupported name.
    DataError: the dataset is not prepared (the message gives the command) or
      cannot be read without TensorFlow.
  """
  base = _base_name(name)
  if base not in _TFDS_DATASETS:
    raise ValueError(
        f'tfds dataset name must be one of {list(TFDS_NAMES)} (optionally with '
        f'"/config" or ":version"), got {name!r}')
  tfds = _import_tfds()
  label_key = _TFDS_DATASETS[base]
  train_x, train_y = _load_split(tfds, name, 'train', data_dir, label_key)
  test_x, test_y = _load_split(tfds, name, 'test', data_dir, label_key)
  try:
    num_classes = int(tfds.builder(name, data_dir=data_dir).info.features[
        label_key].num_classes)
  except Exception as e:  # pylint: disable=broad-except
    raise DataError(f'tfds {name}: cannot read the label metadata ({e})') from e
  if base == 'emnist':
    train_x = np.swapaxes(train_x, 1, 2)
    test_x = np.swapaxes(test_x, 1, 2)
  for split, x, y in (('train', train_x, train_y), ('test', test_x, test_y)):
    if x.ndim != 4 or x.dtype != np.uint8:
      raise DataError(
          f'tfds {name}[{split}]: expected uint8 images [N, H, W, C], got '
          f'{x.dtype} {x.shape}')
    if y.size and (y.min() < 0 or y.max() >= num_classes):
      raise DataError(
          f'tfds {name}[{split}]: labels outside [0, {num_classes})')
  return (np.ascontiguousarray(train_x), train_y.astype(np.int32),
          np.ascontiguousarray(test_x), test_y.astype(np.int32), num_classes)
