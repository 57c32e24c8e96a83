"""One entry point for every dataset: `load_dataset(name, data_dir, source)`.

Images come back as float32 NHWC in [0, 1] and labels as int32, whatever the
source (original files, tensorflow-datasets, or scikit-learn's bundled digits).
Normalisation and augmentation belong to the training code, which knows the
paper's recipe. FEMNIST also carries the natural writer of every example, from
which `femnist_clients` builds the FedLAMA clients (algorithms.md D23).
"""

import dataclasses
import os
import warnings

import numpy as np

from fedjax_lama.data import leaf
from fedjax_lama.data import readers
from fedjax_lama.data import seeding
from fedjax_lama.data import tfds_loader
from fedjax_lama.data.errors import DataError

DATA_DIR_ENV = 'FEDJAX_LAMA_DATA_DIR'
DATASET_NAMES = ('digits', 'mnist', 'fashion_mnist', 'cifar10', 'cifar100',
                 'femnist', 'emnist')
SOURCES = ('auto', 'files', 'tfds', 'builtin')

_NUM_CLASSES = {'digits': 10, 'mnist': 10, 'fashion_mnist': 10, 'cifar10': 10,
                'cifar100': 100, 'femnist': leaf.FEMNIST_NUM_CLASSES}
# Which sources can provide each dataset.
_SOURCES_OF = {
    'digits': ('builtin',),
    'mnist': ('files', 'tfds'),
    'fashion_mnist': ('files', 'tfds'),
    'cifar10': ('files', 'tfds'),
    'cifar100': ('files', 'tfds'),
    'femnist': ('files',),
    'emnist': ('tfds',),
}
_IDX_NAMES = ('train-images-idx3-ubyte', 'train-labels-idx1-ubyte',
              't10k-images-idx3-ubyte', 't10k-labels-idx1-ubyte')
_SUBDIRS = {
    'mnist': ('mnist', os.path.join('MNIST', 'raw'), ''),
    'fashion_mnist': ('fashion_mnist', 'fashion-mnist',
                      os.path.join('FashionMNIST', 'raw'), ''),
    'cifar10': (os.path.join('cifar10', 'cifar-10-batches-py'),
                'cifar-10-batches-py', 'cifar10'),
    'cifar100': (os.path.join('cifar100', 'cifar-100-python'),
                 'cifar-100-python', 'cifar100'),
    'femnist': ('femnist_leaf', 'femnist', os.path.join('femnist', 'data'), ''),
}
_PREPARE_HINT = {
    'mnist': 'the four MNIST IDX files (train-images-idx3-ubyte.gz, '
             'train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, '
             't10k-labels-idx1-ubyte.gz)',
    'fashion_mnist': 'the four Fashion-MNIST IDX files (same names as MNIST)',
    'cifar10': 'the extracted cifar-10-python.tar.gz (data_batch_1..5, '
               'test_batch)',
    'cifar100': 'the extracted cifar-100-python.tar.gz (train, test)',
    'femnist': 'LEAF FEMNIST output (train/*.json[.gz], test/*.json[.gz])',
}


@dataclasses.dataclass
class Dataset:
  """A dataset in host memory.

  Attributes:
    name: the dataset name given to `load_dataset`.
    train_x: float32 [N, H, W, C] in [0, 1].
    train_y: int32 [N].
    test_x: float32 [M, H, W, C] in [0, 1].
    test_y: int32 [M].
    num_classes: number of classes.
    train_client_ids: int32 [N], the natural writer of every training example
      (FEMNIST), else None.
    test_client_ids: int32 [M], likewise for the test split.
    client_names: the writer name of each natural client id (FEMNIST).
  """
  name: str
  train_x: np.ndarray
  train_y: np.ndarray
  test_x: np.ndarray
  test_y: np.ndarray
  num_classes: int
  train_client_ids: np.ndarray | None = None
  test_client_ids: np.ndarray | None = None
  client_names: list[str] | None = None


def _to_unit_float(images: np.ndarray) -> np.ndarray:
  x = images.astype(np.float32)
  x /= np.float32(255.0)
  return x


def _as_nhwc(images: np.ndarray) -> np.ndarray:
  return images[..., None] if images.ndim == 3 else images


def _candidate_dirs(name: str, data_dir: str) -> list[str]:
  return [os.path.join(data_dir, s) if s else data_dir for s in _SUBDIRS[name]]


def _expected_files(name: str, directory: str) -> list[str]:
  if name in ('mnist', 'fashion_mnist'):
    return [os.path.join(directory, f + '.gz') for f in _IDX_NAMES]
  if name == 'cifar10':
    return [os.path.join(directory, f) for f in
            readers.CIFAR10_TRAIN_FILES + (readers.CIFAR10_TEST_FILE,)]
  if name == 'cifar100':
    return [os.path.join(directory, f) for f in ('train', 'test')]
  return [os.path.join(directory, s, '*.json[.gz]') for s in leaf.LEAF_SPLITS]


def _present(name: str, directory: str) -> list[bool]:
  """Which of the dataset's required files exist in `directory`."""
  if name in ('mnist', 'fashion_mnist'):
    return [os.path.isfile(os.path.join(directory, f + '.gz')) or
            os.path.isfile(os.path.join(directory, f)) for f in _IDX_NAMES]
  if name == 'femnist':
    return [bool(leaf.leaf_files(os.path.join(directory, s)))
            for s in leaf.LEAF_SPLITS]
  return [os.path.isfile(p) for p in _expected_files(name, directory)]


def _find_files(name: str, data_dir: str | None) -> str | None:
  """The directory holding the dataset's files, or None if there is none.

  Raises:
    DataError: a directory holds some but not all of the required files.
  """
  if data_dir is None:
    return None
  for directory in _candidate_dirs(name, data_dir):
    present = _present(name, directory)
    if all(present):
      return directory
    if any(present) and name != 'femnist':
      missing = [p for p, ok in zip(_expected_files(name, directory), present)
                 if not ok]
      raise DataError(
          f'{name}: {directory} holds only part of the dataset; missing '
          f'{missing}')
  return None


def _missing_files_message(name: str, data_dir: str | None) -> str:
  if data_dir is None:
    where = (f'no data_dir was given and ${DATA_DIR_ENV} is not set, so no '
             'files were looked for')
  else:
    options = '\n'.join(
        f'  {", ".join(_expected_files(name, d))}'
        for d in _candidate_dirs(name, data_dir))
    where = f'expected one of these file sets:\n{options}'
  return (f'{name}: dataset files not found; {where}\nPut '
          f'{_PREPARE_HINT[name]} there (see BUILD.md, "Data").')


def _load_files(name: str, directory: str) -> Dataset:
  num_classes = _NUM_CLASSES[name]
  if name in ('mnist', 'fashion_mnist'):
    paths = []
    for f in _IDX_NAMES:
      gz = os.path.join(directory, f + '.gz')
      paths.append(gz if os.path.isfile(gz) else os.path.join(directory, f))
    train_x, train_y = readers.read_idx_pair(paths[0], paths[1], num_classes)
    test_x, test_y = readers.read_idx_pair(paths[2], paths[3], num_classes)
    if train_x.shape[1:] != test_x.shape[1:]:
      raise DataError(
          f'{directory}: train images {train_x.shape[1:]} and test images '
          f'{test_x.shape[1:]} differ in shape')
  elif name == 'cifar10':
    train_x, train_y, test_x, test_y = readers.read_cifar10(directory)
  elif name == 'cifar100':
    train_x, train_y, test_x, test_y = readers.read_cifar100(directory)
  else:
    return _load_femnist(directory)
  return Dataset(name, _to_unit_float(_as_nhwc(train_x)), train_y,
                 _to_unit_float(_as_nhwc(test_x)), test_y, num_classes)


def _load_femnist(directory: str) -> Dataset:
  """FEMNIST with natural writer ids shared by the train and test splits."""
  splits = leaf.read_femnist_leaf(directory)
  names = list(splits['train'].users)
  index = {u: i for i, u in enumerate(names)}
  for u in splits['test'].users:
    if u not in index:
      index[u] = len(names)
      names.append(u)
  arrays = {}
  for s, split in splits.items():
    if not split.users:
      raise DataError(f'{directory}/{s}: no writers')
    ids = [np.full(len(y), index[u], np.int32)
           for u, y in zip(split.users, split.y)]
    arrays[s] = (np.concatenate(split.x), np.concatenate(split.y),
                 np.concatenate(ids))
  return Dataset('femnist', arrays['train'][0], arrays['train'][1],
                 arrays['test'][0], arrays['test'][1],
                 leaf.FEMNIST_NUM_CLASSES, arrays['train'][2],
                 arrays['test'][2], names)


def _load_tfds(name: str, data_dir: str | None) -> Dataset:
  train_x, train_y, test_x, test_y, num_classes = tfds_loader.load_tfds(
      name, data_dir)
  return Dataset(name, _to_unit_float(train_x), train_y,
                 _to_unit_float(test_x), test_y, num_classes)


def _load_builtin(name: str) -> Dataset:
  train_x, train_y, test_x, test_y = readers.load_digits_arrays()
  return Dataset(name, train_x, train_y, test_x, test_y, 10)


def load_dataset(name: str, data_dir: str | None = None,
                 source: str = 'auto') -> Dataset:
  """Loads a dataset into host numpy arrays.

  Args:
    name: one of DATASET_NAMES. 'digits' is scikit-learn's bundled 8x8 digits
      (no download); 'femnist' reads LEAF JSON files; 'emnist' comes from tfds.
    data_dir: directory of the original files (e.g. `data_dir/mnist/*.gz`,
      `data_dir/cifar10/cifar-10-batches-py/`, `data_dir/femnist_leaf/`, or the
      files directly in `data_dir`), also passed to tfds as its data_dir.
      Defaults to $FEDJAX_LAMA_DATA_DIR when set.
    source: 'auto' (files if present, else tfds; builtin for digits), 'files',
      'tfds' or 'builtin'.

  Returns:
    A `Dataset` with float32 NHWC images in [0, 1] and int32 labels.

  Raises:
    ValueError: unknown name or source, or a source that cannot provide name.
    DataError: files missing (the message lists the expected paths and how to
      prepare them) or malformed.
  """
  if name not in DATASET_NAMES:
    raise ValueError(
        f'dataset name must be one of {list(DATASET_NAMES)}, got {name!r}')
  if source not in SOURCES:
    raise ValueError(f'source must be one of {list(SOURCES)}, got {source!r}')
  possible = _SOURCES_OF[name]
  if source != 'auto' and source not in possible:
    raise ValueError(
        f'source {source!r} cannot provide dataset {name!r}; accepted: '
        f'{["auto"] + list(possible)}')
  if data_dir is None:
    data_dir = os.environ.get(DATA_DIR_ENV) or None
  if 'builtin' in possible:
    return _load_builtin(name)
  if source in ('auto', 'files') and 'files' in possible:
    directory = _find_files(name, data_dir)
    if directory is not None:
      return _load_files(name, directory)
    if source == 'files' or 'tfds' not in possible:
      raise DataError(_missing_files_message(name, data_dir))
  if source == 'auto' and 'files' in possible:
    try:
      return _load_tfds(name, data_dir)
    except DataError as e:
      raise DataError(
          f'{_missing_files_message(name, data_dir)}\nThe tfds fallback failed '
          f'too: {e}') from e
  return _load_tfds(name, data_dir)


# ----------------------------------------------------------------------------
# FEMNIST clients from natural writers (algorithms.md D23).
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class WriterClients:
  """Clients built from groups of natural writers.

  Attributes:
    train: per client, int64 indices into the train arrays.
    test: per client, int64 indices into the test arrays (the held-out data of
      the client's writers), or None when no test ids were given.
    writers: per client, the natural writer ids it holds.
    num_writers: number of writers actually used.
    requested_writers: number of writers asked for.
  """
  train: list[np.ndarray]
  test: list[np.ndarray] | None
  writers: list[np.ndarray]
  num_writers: int
  requested_writers: int


def _positive_int(value: int, field: str) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise ValueError(f'{field} must be a positive int, got {value!r}')
  if value < 1:
    raise ValueError(f'{field} must be a positive int, got {value}')
  return int(value)


def _writer_index(client_ids: np.ndarray | None, field: str
                  ) -> dict[int, np.ndarray]:
  if client_ids is None:
    return {}
  ids = np.asarray(client_ids)
  if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f'{field} must be a 1-D integer array')
  order = np.argsort(ids, kind='stable')
  uniq, starts = np.unique(ids[order], return_index=True)
  pieces = np.split(order.astype(np.int64), starts[1:])
  return dict(zip(uniq.tolist(), pieces))


def _group_clients(groups: list[np.ndarray], train_ids: np.ndarray,
                   test_ids: np.ndarray | None, requested: int
                   ) -> WriterClients:
  train_of = _writer_index(train_ids, 'train_client_ids')
  test_of = _writer_index(test_ids, 'test_client_ids')
  empty = np.zeros(0, np.int64)

  def gather(index, writers):
    return np.sort(np.concatenate([index.get(w, empty) for w in writers]))

  train = [gather(train_of, g.tolist()) for g in groups]
  test = ([gather(test_of, g.tolist()) for g in groups]
          if test_ids is not None else None)
  used = int(sum(len(g) for g in groups))
  return WriterClients(train, test, groups, used, requested)


def femnist_clients(train_client_ids: np.ndarray, num_writers: int = 256,
                    writers_per_client: int = 2, seed: int = 0,
                    test_client_ids: np.ndarray | None = None
                    ) -> WriterClients:
  """FedLAMA AAAI FEMNIST clients: random writers, grouped per client.

  `num_writers` distinct writers are drawn uniformly at random (stream
  WRITERS of `seed`) and consecutive groups of `writers_per_client` form the
  clients (256 writers, 2 per client give 128 clients; algorithms.md D23). If
  fewer writers exist, all are used, a warning is issued and
  `num_writers` < `requested_writers` in the result; the last client then holds
  fewer writers when the count does not divide.
  """
  num_writers = _positive_int(num_writers, 'femnist_num_writers')
  writers_per_client = _positive_int(writers_per_client,
                                     'femnist_writers_per_client')
  writers = np.unique(np.asarray(train_client_ids))
  if writers.size == 0:
    raise ValueError('train_client_ids is empty: there are no writers')
  take = num_writers
  if writers.size < num_writers:
    warnings.warn(
        f'femnist_num_writers={num_writers} but only {writers.size} writers '
        f'exist; using all {writers.size}', stacklevel=2)
    take = int(writers.size)
  rng = seeding.make_rng(seed, seeding.WRITERS_STREAM)
  chosen = rng.choice(writers, size=take, replace=False)
  groups = [chosen[i:i + writers_per_client]
            for i in range(0, take, writers_per_client)]
  return _group_clients(groups, train_client_ids, test_client_ids, num_writers)


def femnist_clients_round_robin(train_client_ids: np.ndarray,
                                writer_fraction: float, num_clients: int,
                                seed: int = 0,
                                test_client_ids: np.ndarray | None = None
                                ) -> WriterClients:
  """FedLAMA v1 FEMNIST clients: random writers dealt round-robin.

  round(writer_fraction * W) writers (at least num_clients) are drawn at random
  and writer j goes to client j mod num_clients (algorithms.md D23, v1 presets).
  """
  num_clients = _positive_int(num_clients, 'num_clients')
  if not 0 < writer_fraction <= 1:
    raise ValueError(
        f'femnist_writer_fraction must be in (0, 1], got {writer_fraction!r}')
  writers = np.unique(np.asarray(train_client_ids))
  take = max(int(round(writer_fraction * writers.size)), num_clients)
  if take > writers.size:
    raise ValueError(
        f'num_clients={num_clients} needs at least that many writers, but only '
        f'{writers.size} exist')
  rng = seeding.make_rng(seed, seeding.WRITERS_STREAM)
  chosen = rng.choice(writers, size=take, replace=False)
  groups = [chosen[j::num_clients] for j in range(num_clients)]
  requested = int(round(writer_fraction * writers.size))
  return _group_clients(groups, train_client_ids, test_client_ids, requested)
