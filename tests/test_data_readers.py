"""Tests of the dataset readers and `load_dataset` (fedjax_lama.data)."""

import gzip
import io
import json
import os
import pickle
import struct
import types
import warnings

import numpy as np
import pytest

from fedjax_lama import data
from tests.conftest import shared_data_dir_or_skip
from fedjax_lama.data import readers




# ----------------------------------------------------------------------------
# IDX.
# ----------------------------------------------------------------------------


def _idx_bytes(arr: np.ndarray, type_byte: int = 0x08) -> bytes:
  header = bytes([0, 0, type_byte, arr.ndim]) + struct.pack(
      f'>{arr.ndim}I', *arr.shape)
  return header + arr.astype(arr.dtype.newbyteorder('>')).tobytes()


def _write(path, payload: bytes, compress: bool) -> str:
  path = str(path)
  if compress:
    with gzip.open(path, 'wb') as f:
      f.write(payload)
  else:
    with open(path, 'wb') as f:
      f.write(payload)
  return path


@pytest.mark.parametrize('compress', [True, False])
def test_idx_roundtrip(tmp_path, compress):
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (5, 4, 3), dtype=np.uint8)
  labels = rng.integers(0, 10, (5,), dtype=np.uint8)
  ip = _write(tmp_path / 'img', _idx_bytes(images), compress)
  lp = _write(tmp_path / 'lab', _idx_bytes(labels), compress)
  x, y = readers.read_idx_pair(ip, lp)
  np.testing.assert_array_equal(x, images)
  np.testing.assert_array_equal(y, labels)
  assert y.dtype == np.int32
  # Other IDX element types decode to native-endian values.
  floats = rng.normal(size=(2, 3)).astype(np.float32)
  fp = _write(tmp_path / 'f', _idx_bytes(floats, 0x0D), compress)
  np.testing.assert_array_equal(readers.read_idx(fp), floats)


def _assert_data_error(path, fn, *args, match=None):
  with pytest.raises(data.DataError) as info:
    fn(*args)
  assert str(path) in str(info.value)
  if match:
    assert match in str(info.value)
  return info.value


@pytest.mark.parametrize('compress', [True, False])
def test_idx_malformed(tmp_path, compress):
  images = np.zeros((3, 2, 2), np.uint8)
  good = _idx_bytes(images)
  cases = {
      'bad_magic': (b'\x01\x02' + good[2:], 'not an IDX file'),
      'bad_type': (good[:2] + b'\x07' + good[3:], 'unknown IDX data type'),
      'zero_dims': (b'\x00\x00\x08\x00', 'zero dimensions'),
      'short_header': (good[:6], 'truncated IDX dimensions'),
      'short_payload': (good[:-1], 'truncated IDX payload'),
      'trailing': (good + b'\x00', 'trailing bytes'),
      'empty': (b'', 'truncated IDX magic'),
  }
  for name, (payload, message) in cases.items():
    path = _write(tmp_path / name, payload, compress)
    _assert_data_error(path, readers.read_idx, path, match=message)
  # A labels file where images are expected (and vice versa).
  lp = _write(tmp_path / 'labels', _idx_bytes(np.zeros(3, np.uint8)), compress)
  _assert_data_error(lp, readers.read_idx_images, lp, match='magic 2051')
  ip = _write(tmp_path / 'images', good, compress)
  _assert_data_error(ip, readers.read_idx_labels, ip, match='magic 2049')


def test_idx_header_cannot_force_huge_read(tmp_path):
  huge = bytes([0, 0, 8, 3]) + struct.pack('>3I', 2**31, 2**31, 2**31)
  path = _write(tmp_path / 'huge', huge, compress=False)
  _assert_data_error(path, readers.read_idx, path, match='limit')


def test_idx_broken_gzip(tmp_path):
  payload = _idx_bytes(np.arange(4000, dtype=np.uint8).reshape(10, 20, 20)
                       % 7)
  path = _write(tmp_path / 'ok.gz', payload, compress=True)
  raw = open(path, 'rb').read()
  truncated = tmp_path / 'truncated.gz'
  truncated.write_bytes(raw[:len(raw) // 2])
  _assert_data_error(truncated, readers.read_idx, str(truncated),
                     match='truncated')
  corrupt = bytearray(raw)
  for i in range(20, len(raw) - 10):
    corrupt[i] ^= 0x5A
  bad = tmp_path / 'corrupt.gz'
  bad.write_bytes(bytes(corrupt))
  _assert_data_error(bad, readers.read_idx, str(bad))
  missing = tmp_path / 'missing.gz'
  _assert_data_error(missing, readers.read_idx, str(missing),
                     match='not found')


def test_idx_pair_mismatch(tmp_path):
  ip = _write(tmp_path / 'i', _idx_bytes(np.zeros((3, 2, 2), np.uint8)), True)
  lp = _write(tmp_path / 'l', _idx_bytes(np.zeros(4, np.uint8)), True)
  with pytest.raises(data.DataError, match='3 images but'):
    readers.read_idx_pair(ip, lp)
  lp = _write(tmp_path / 'l2', _idx_bytes(np.array([0, 1, 10], np.uint8)), True)
  _assert_data_error(lp, readers.read_idx_pair, ip, lp, match='out of range')


_MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851,
                       5949]
_MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_real_mnist_known_counts():
  ds = data.load_dataset('mnist', shared_data_dir_or_skip(), source='files')
  assert ds.train_x.shape == (60000, 28, 28, 1)
  assert ds.test_x.shape == (10000, 28, 28, 1)
  assert ds.train_x.dtype == np.float32 and ds.train_y.dtype == np.int32
  assert ds.train_x.min() == 0.0 and ds.train_x.max() == 1.0
  assert ds.num_classes == 10 and ds.train_client_ids is None
  np.testing.assert_array_equal(np.bincount(ds.train_y), _MNIST_TRAIN_COUNTS)
  np.testing.assert_array_equal(np.bincount(ds.test_y), _MNIST_TEST_COUNTS)
  # The famous first examples: a 5 in train, a 7 in test.
  assert ds.train_y[0] == 5 and ds.test_y[0] == 7


def test_real_fashion_mnist_balanced():
  ds = data.load_dataset('fashion_mnist', shared_data_dir_or_skip())
  np.testing.assert_array_equal(np.bincount(ds.train_y), [6000] * 10)
  np.testing.assert_array_equal(np.bincount(ds.test_y), [1000] * 10)
  assert ds.train_x.shape == (60000, 28, 28, 1)


def test_idx_files_directly_in_data_dir(tmp_path):
  rng = np.random.default_rng(1)
  for prefix, n in (('train', 6), ('t10k', 4)):
    _write(tmp_path / f'{prefix}-images-idx3-ubyte.gz',
           _idx_bytes(rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)),
           True)
    # Uncompressed labels are accepted too.
    _write(tmp_path / f'{prefix}-labels-idx1-ubyte',
           _idx_bytes(rng.integers(0, 10, n, dtype=np.uint8)), False)
  ds = data.load_dataset('mnist', str(tmp_path), source='files')
  assert ds.train_x.shape == (6, 28, 28, 1) and ds.test_y.shape == (4,)


def test_partial_idx_directory_is_reported(tmp_path):
  d = tmp_path / 'mnist'
  d.mkdir()
  _write(d / 'train-images-idx3-ubyte.gz',
         _idx_bytes(np.zeros((2, 28, 28), np.uint8)), True)
  with pytest.raises(data.DataError, match='t10k-labels-idx1-ubyte.gz'):
    data.load_dataset('mnist', str(tmp_path), source='files')


# ----------------------------------------------------------------------------
# CIFAR pickles.
# ----------------------------------------------------------------------------


class _Py2StylePickler(pickle._Pickler):  # pylint: disable=protected-access
  """Writes pickles the way Python 2 wrote the CIFAR batches.

  Strings become BINSTRING (loaded as bytes with encoding='bytes') and numpy's
  reconstructor is named `numpy.core.multiarray._reconstruct`, the name in the
  original files.
  """
  dispatch = pickle._Pickler.dispatch.copy()  # pylint: disable=protected-access

  def _save_py2_str(self, obj):
    raw = obj.encode('latin1') if isinstance(obj, str) else obj
    self.write(pickle.BINSTRING + struct.pack('<i', len(raw)) + raw)
    self.memoize(obj)

  dispatch[str] = _save_py2_str
  dispatch[bytes] = _save_py2_str

  def save_global(self, obj, name=None):
    reconstruct = readers._numpy_multiarray()._reconstruct  # pylint: disable=protected-access
    if obj is reconstruct:
      self.write(pickle.GLOBAL + b'numpy.core.multiarray\n_reconstruct\n')
      self.memoize(obj)
    else:
      super().save_global(obj, name)


def _py2_pickle(obj) -> bytes:
  buf = io.BytesIO()
  _Py2StylePickler(buf, protocol=2).dump(obj)
  return buf.getvalue()


def _cifar_batch(n: int, seed: int, label_key: str = 'labels',
                 num_classes: int = 10) -> dict:
  rng = np.random.default_rng(seed)
  return {
      'batch_label': 'training batch',
      label_key: [int(v) for v in rng.integers(0, num_classes, n)],
      'data': rng.integers(0, 256, (n, 3072), dtype=np.uint8),
      'filenames': [f'img_{i}.png' for i in range(n)],
  }


def _write_cifar10(directory, py2: bool = True) -> list[dict]:
  os.makedirs(directory, exist_ok=True)
  batches = []
  for i, name in enumerate(readers.CIFAR10_TRAIN_FILES +
                           (readers.CIFAR10_TEST_FILE,)):
    batch = _cifar_batch(3 + i, seed=i)
    raw = _py2_pickle(batch) if py2 else pickle.dumps(batch)
    with open(os.path.join(directory, name), 'wb') as f:
      f.write(raw)
    batches.append(batch)
  return batches


@pytest.mark.parametrize('py2', [True, False])
def test_cifar10_layout_known_pixels(tmp_path, py2):
  batches = _write_cifar10(tmp_path / 'cifar10' / 'cifar-10-batches-py', py2)
  ds = data.load_dataset('cifar10', str(tmp_path), source='files')
  assert ds.train_x.shape == (3 + 4 + 5 + 6 + 7, 32, 32, 3)
  assert ds.test_x.shape == (8, 32, 32, 3)
  assert ds.train_x.dtype == np.float32 and ds.num_classes == 10
  np.testing.assert_array_equal(
      ds.train_y, np.concatenate([b['labels'] for b in batches[:5]]))
  # Row layout: 1024 red, 1024 green, 1024 blue values, each row-major.
  row = batches[0]['data'][1]
  for r, c, ch in ((0, 0, 0), (3, 17, 1), (31, 31, 2), (5, 0, 2)):
    assert ds.train_x[1, r, c, ch] == np.float32(row[ch * 1024 + r * 32 + c]
                                                 / np.float32(255))


def test_cifar100_fine_labels(tmp_path):
  d = tmp_path / 'cifar-100-python'
  d.mkdir()
  for name, n in (('train', 7), ('test', 3)):
    batch = _cifar_batch(n, seed=n, label_key='fine_labels', num_classes=100)
    batch['coarse_labels'] = [0] * n
    (d / name).write_bytes(_py2_pickle(batch))
  ds = data.load_dataset('cifar100', str(tmp_path))
  assert ds.num_classes == 100 and ds.train_x.shape == (7, 32, 32, 3)
  assert ds.train_y.max() < 100


class _EvilSystem:

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (os.system, (f'touch {self.marker}',))


class _EvilEval:

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (eval, (f'open({str(self.marker)!r}, "w").close()',))


@pytest.mark.parametrize('evil_cls,forbidden',
                         [(_EvilSystem, 'system'), (_EvilEval, 'eval')])
def test_cifar_pickle_refuses_code(tmp_path, evil_cls, forbidden):
  marker = tmp_path / 'pwned'
  batch = _cifar_batch(2, seed=0)
  batch['payload'] = evil_cls(marker)
  path = tmp_path / 'data_batch_1'
  path.write_bytes(pickle.dumps(batch))
  err = _assert_data_error(path, readers.read_cifar_batch, str(path),
                           match='forbidden global')
  assert forbidden in str(err)
  assert not marker.exists()
  # Sanity check of the test itself: the plain unpickler would run it.
  pickle.loads(path.read_bytes())
  assert marker.exists()


@pytest.mark.parametrize('target', ['builtins.getattr', 'os.popen',
                                    'subprocess.Popen', 'numpy.load'])
def test_cifar_pickle_refuses_other_globals(tmp_path, target):
  module, name = target.rsplit('.', 1)
  raw = (b'\x80\x02c' + module.encode() + b'\n' + name.encode() + b'\n' +
         b')R.')  # PROTO 2, GLOBAL, EMPTY_TUPLE, REDUCE, STOP
  path = tmp_path / 'batch'
  path.write_bytes(raw)
  _assert_data_error(path, readers.safe_unpickle, str(path), match=target)


def test_cifar_pickle_truncated_and_malformed(tmp_path):
  raw = _py2_pickle(_cifar_batch(4, seed=0))
  path = tmp_path / 'data_batch_1'
  path.write_bytes(raw[:len(raw) // 2])
  _assert_data_error(path, readers.read_cifar_batch, str(path),
                     match='truncated')
  path.write_bytes(b'')
  _assert_data_error(path, readers.read_cifar_batch, str(path))
  cases = {
      'not_dict': [1, 2, 3],
      'no_data': {'labels': [0]},
      'wrong_width': {'data': np.zeros((2, 100), np.uint8), 'labels': [0, 1]},
      'float_data': {'data': np.zeros((2, 3072), np.float32),
                     'labels': [0, 1]},
      'count_mismatch': {'data': np.zeros((2, 3072), np.uint8),
                         'labels': [0]},
      'bad_label': {'data': np.zeros((2, 3072), np.uint8), 'labels': [0, 10]},
  }
  for name, obj in cases.items():
    p = tmp_path / name
    p.write_bytes(pickle.dumps(obj))
    _assert_data_error(p, readers.read_cifar_batch, str(p))


def test_cifar_missing_files_message(tmp_path):
  with pytest.raises(data.DataError) as info:
    data.load_dataset('cifar10', str(tmp_path), source='files')
  message = str(info.value)
  assert os.path.join(str(tmp_path), 'cifar-10-batches-py') in message
  assert 'data_batch_1' in message
  assert 'BUILD.md' in message
  d = tmp_path / 'cifar-10-batches-py'
  d.mkdir()
  (d / 'data_batch_1').write_bytes(_py2_pickle(_cifar_batch(2, 0)))
  with pytest.raises(data.DataError, match='test_batch'):
    data.load_dataset('cifar10', str(tmp_path), source='files')


# ----------------------------------------------------------------------------
# LEAF JSON.
# ----------------------------------------------------------------------------


def _leaf_obj(users: dict) -> dict:
  return {'users': list(users), 'num_samples': [len(v['y']) for v in
                                                users.values()],
          'user_data': users}


def _write_leaf(path, obj, compress: bool) -> None:
  raw = json.dumps(obj).encode()
  if compress:
    with gzip.open(str(path), 'wb') as f:
      f.write(raw)
  else:
    path.write_bytes(raw)


def _femnist_user(n: int, label: int) -> dict:
  return {'x': [[(i % 10) / 10.0] * 784 for i in range(n)], 'y': [label] * n}


def _write_femnist(root) -> None:
  (root / 'train').mkdir(parents=True)
  (root / 'test').mkdir()
  _write_leaf(root / 'train' / 'a_train.json.gz',
              _leaf_obj({'w1': _femnist_user(3, 1),
                         'w2': _femnist_user(2, 61)}),
              True)
  _write_leaf(root / 'train' / 'b_train.json',
              _leaf_obj({'w3': _femnist_user(4, 5)}), False)
  _write_leaf(root / 'test' / 'a_test.json.gz',
              _leaf_obj({'w1': _femnist_user(1, 1), 'w3': _femnist_user(2, 5)}),
              True)


def test_leaf_synthetic_femnist(tmp_path):
  _write_femnist(tmp_path / 'femnist_leaf')
  ds = data.load_dataset('femnist', str(tmp_path))
  assert ds.client_names == ['w1', 'w2', 'w3']
  np.testing.assert_array_equal(ds.train_client_ids,
                                [0, 0, 0, 1, 1, 2, 2, 2, 2])
  np.testing.assert_array_equal(ds.test_client_ids, [0, 2, 2])
  np.testing.assert_array_equal(ds.train_y, [1, 1, 1, 61, 61, 5, 5, 5, 5])
  assert ds.train_x.shape == (9, 28, 28, 1) and ds.train_x.dtype == np.float32
  assert ds.train_x[1, 27, 27, 0] == np.float32(0.1)
  assert ds.num_classes == 62


def test_leaf_raw_reader_keeps_text(tmp_path):
  for split in ('train', 'test'):
    (tmp_path / split).mkdir()
    _write_leaf(tmp_path / split / f'{split}.json',
                _leaf_obj({'ROMEO': {'x': ['abc', 'def'], 'y': ['d', 'g']}}),
                False)
  out = data.read_leaf(str(tmp_path))
  assert out['train'].users == ['ROMEO']
  assert out['test'].x == [['abc', 'def']] and out['test'].num_examples() == 2


@pytest.mark.parametrize('case', ['xy_mismatch', 'num_samples', 'duplicate',
                                  'bad_json', 'truncated_gz', 'short_row',
                                  'out_of_range', 'bad_label', 'no_files'])
def test_leaf_malformed(tmp_path, case):
  root = tmp_path / 'femnist_leaf'
  _write_femnist(root)
  train = root / 'train'
  bad = train / 'c_train.json'
  if case == 'xy_mismatch':
    user = _femnist_user(2, 0)
    user['y'] = [0]
    _write_leaf(bad, _leaf_obj({'w9': user}), False)
  elif case == 'num_samples':
    obj = _leaf_obj({'w9': _femnist_user(2, 0)})
    obj['num_samples'] = [3]
    _write_leaf(bad, obj, False)
  elif case == 'duplicate':
    _write_leaf(bad, _leaf_obj({'w1': _femnist_user(2, 0)}), False)
  elif case == 'bad_json':
    bad.write_bytes(b'{"users": [')
  elif case == 'truncated_gz':
    bad = train / 'c_train.json.gz'
    _write_leaf(bad, _leaf_obj({'w9': _femnist_user(50, 0)}), True)
    bad.write_bytes(bad.read_bytes()[:200])
  elif case == 'short_row':
    user = _femnist_user(2, 0)
    user['x'][1] = user['x'][1][:783]
    _write_leaf(bad, _leaf_obj({'w9': user}), False)
  elif case == 'out_of_range':
    user = _femnist_user(2, 0)
    user['x'][0][5] = 2.0
    _write_leaf(bad, _leaf_obj({'w9': user}), False)
  elif case == 'bad_label':
    _write_leaf(bad, _leaf_obj({'w9': _femnist_user(2, 62)}), False)
  elif case == 'no_files':
    for f in train.iterdir():
      f.unlink()
  with pytest.raises(data.DataError) as info:
    data.read_femnist_leaf(str(root))
  if case == 'no_files':
    assert str(train) in str(info.value)
  elif case in ('short_row', 'out_of_range', 'bad_label'):
    assert 'w9' in str(info.value) and str(train) in str(info.value)
  else:
    assert str(bad) in str(info.value)


@pytest.fixture(scope='module')
def real_femnist():
  return data.load_dataset('femnist', shared_data_dir_or_skip(), source='files')


def test_real_femnist_subset(real_femnist):
  ds = real_femnist
  assert ds.train_x.shape == (14708, 28, 28, 1)
  assert ds.test_x.shape == (1685, 28, 28, 1)
  assert len(ds.client_names) == 105
  assert np.unique(ds.train_client_ids).size == 105
  assert set(np.unique(ds.test_client_ids)) == set(range(105))
  assert np.unique(ds.train_y).size == 62 and np.unique(ds.test_y).size == 62
  assert 0.0 <= ds.train_x.min() and ds.train_x.max() <= 1.0
  # LEAF background is white (1.0): most pixels are background.
  assert np.median(ds.train_x) == 1.0


def test_real_femnist_clients(real_femnist):
  ds = real_femnist
  with pytest.warns(UserWarning, match='only 105 writers'):
    clients = data.femnist_clients(ds.train_client_ids, 256, 2, seed=3,
                                   test_client_ids=ds.test_client_ids)
  assert clients.num_writers == 105 and clients.requested_writers == 256
  assert len(clients.train) == 53
  assert [len(w) for w in clients.writers] == [2] * 52 + [1]
  all_train = np.concatenate(clients.train)
  assert np.array_equal(np.sort(all_train), np.arange(ds.train_y.size))
  assert np.concatenate(clients.test).size == ds.test_y.size
  for writers, tr, te in zip(clients.writers, clients.train, clients.test):
    assert set(np.unique(ds.train_client_ids[tr])) == set(writers.tolist())
    assert set(np.unique(ds.test_client_ids[te])) <= set(writers.tolist())
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    few = data.femnist_clients(ds.train_client_ids, 20, 2, seed=3)
  assert len(few.train) == 10 and few.num_writers == 20
  again = data.femnist_clients(ds.train_client_ids, 20, 2, seed=3)
  assert all(np.array_equal(a, b) for a, b in zip(few.train, again.train))
  rr = data.femnist_clients_round_robin(ds.train_client_ids, 0.5, 8, seed=0)
  assert len(rr.train) == 8 and rr.num_writers == 52
  assert [len(w) for w in rr.writers] == [7] * 4 + [6] * 4
  natural = data.natural(ds.train_client_ids)
  assert len(natural) == 105


# ----------------------------------------------------------------------------
# Built-in digits and the entry point.
# ----------------------------------------------------------------------------


def test_digits_builtin():
  ds = data.load_dataset('digits')
  assert ds.train_x.shape == (1437, 8, 8, 1)
  assert ds.test_x.shape == (360, 8, 8, 1)
  assert ds.train_x.dtype == np.float32 and ds.train_y.dtype == np.int32
  assert ds.train_x.min() == 0.0 and ds.train_x.max() == 1.0
  from sklearn import datasets as sk  # pylint: disable=g-import-not-at-top
  counts = np.bincount(sk.load_digits().target)
  np.testing.assert_array_equal(
      np.bincount(ds.train_y) + np.bincount(ds.test_y), counts)
  # Stratified: every class gives within one example of its 20 % share.
  assert np.all(np.abs(np.bincount(ds.test_y) - counts * 360 / 1797) < 1)
  again = data.load_dataset('digits', source='builtin')
  np.testing.assert_array_equal(ds.test_x, again.test_x)
  # Train and test are disjoint: no test image appears in train.
  train_rows = {r.tobytes() for r in ds.train_x}
  overlap = sum(r.tobytes() in train_rows for r in ds.test_x)
  all_rows = [r.tobytes() for r in
              np.concatenate([ds.train_x, ds.test_x])]
  duplicates = len(all_rows) - len(set(all_rows))
  assert overlap <= duplicates


def test_load_dataset_bad_arguments(tmp_path):
  with pytest.raises(ValueError, match='cifar100') as info:
    data.load_dataset('imagenet')
  assert not isinstance(info.value, data.DataError)
  with pytest.raises(ValueError, match="'auto', 'files', 'tfds', 'builtin'"):
    data.load_dataset('mnist', source='web')
  with pytest.raises(ValueError, match='builtin'):
    data.load_dataset('digits', source='files')
  with pytest.raises(ValueError, match='tfds'):
    data.load_dataset('emnist', str(tmp_path), source='files')
  with pytest.raises(ValueError, match='files'):
    data.load_dataset('femnist', str(tmp_path), source='tfds')
  with pytest.raises(data.DataError, match='BUILD.md'):
    data.load_dataset('femnist', str(tmp_path))


# ----------------------------------------------------------------------------
# tensorflow-datasets (offline, with tfds.testing.mock_data).
# ----------------------------------------------------------------------------


@pytest.fixture(scope='module')
def tfds_module() -> types.ModuleType:
  return pytest.importorskip('tensorflow_datasets')


@pytest.mark.parametrize('name,shape,classes', [
    ('mnist', (28, 28, 1), 10), ('fashion_mnist', (28, 28, 1), 10),
    ('cifar10', (32, 32, 3), 10), ('cifar100', (32, 32, 3), 100),
    ('emnist', (28, 28, 1), 62)])
def test_tfds_mock(tfds_module, tmp_path, name, shape, classes):
  with tfds_module.testing.mock_data(num_examples=6):
    train_x, train_y, test_x, test_y, num_classes = data.load_tfds(name)
    ds = data.load_dataset(name, str(tmp_path), source='auto')
  assert train_x.shape == (6,) + shape and train_x.dtype == np.uint8
  assert test_x.shape == (6,) + shape and test_y.dtype == np.int32
  assert num_classes == classes and ds.num_classes == classes
  assert train_y.min() >= 0 and train_y.max() < classes
  np.testing.assert_array_equal(ds.train_x, train_x.astype(np.float32) / 255)


def test_tfds_emnist_transposed(tfds_module):
  with tfds_module.testing.mock_data(num_examples=3):
    train_x = data.load_tfds('emnist')[0]
    source = tfds_module.data_source('emnist', split='train', download=False)
    raw = np.stack([source[i]['image'] for i in range(len(source))])
  np.testing.assert_array_equal(train_x, np.swapaxes(raw, 1, 2))


def test_tfds_missing_dataset(tfds_module, tmp_path):
  del tfds_module
  with pytest.raises(data.DataError) as info:
    data.load_tfds('mnist', data_dir=str(tmp_path))
  assert f'tfds build mnist --data_dir={tmp_path}' in str(info.value)
  with pytest.raises(data.DataError) as info:
    data.load_dataset('mnist', str(tmp_path), source='auto')
  message = str(info.value)
  assert 'train-images-idx3-ubyte.gz' in message and 'tfds build' in message
  with pytest.raises(ValueError, match='mnist'):
    data.load_tfds('svhn_cropped')


def test_tfds_tfrecord_without_tensorflow(tfds_module, monkeypatch):
  # A dataset prepared in TFRecord format cannot be read without TensorFlow;
  # the error must say how to fix it rather than fail inside tfds.
  import importlib.util  # pylint: disable=g-import-not-at-top

  def no_source(*args, **kwargs):
    raise NotImplementedError('Random access data source for file format '
                              'FileFormat.TFRECORD is not supported.')

  builder = types.SimpleNamespace(
      is_prepared=lambda: True,
      info=types.SimpleNamespace(file_format='tfrecord'))
  monkeypatch.setattr(tfds_module, 'data_source', no_source)
  monkeypatch.setattr(tfds_module, 'builder', lambda *a, **k: builder)
  real_find_spec = importlib.util.find_spec
  monkeypatch.setattr(
      importlib.util, 'find_spec',
      lambda name, *a: None if name == 'tensorflow' else real_find_spec(name,
                                                                        *a))
  with pytest.raises(data.DataError) as info:
    data.load_tfds('cifar10', data_dir='/nonexistent')
  message = str(info.value)
  assert 'pip install tensorflow' in message
  assert '--file_format=array_record' in message
