"""Tests of the FEMNIST-HDF5, Sentiment140, Shakespeare, Reddit and
TinyImageNet readers, on small files written in each release's real format.
"""

import csv
import io
import json
import os
import pathlib
import pickle
import sys

import numpy as np
import pytest

from fedjax_lama import data
from tests import test_data_readers
from tests.conftest import shared_data_dir_or_skip
from fedjax_lama.data import femnist_h5
from fedjax_lama.data import leaf_text
from fedjax_lama.data import sentiment140
from fedjax_lama.data import tinyimagenet




def _raises_naming(path, fn, *args, match=None, **kwargs):
  with pytest.raises(data.DataError) as info:
    fn(*args, **kwargs)
  message = str(info.value)
  # The missing-data message names the directory and the files expected in it; a partial or
  # malformed file is named by its whole path.
  path = pathlib.Path(path)
  assert str(path) in message or (str(path.parent) in message and path.name in message), (
      message)
  if match:
    assert match in str(info.value), str(info.value)
  return str(info.value)


# ----------------------------------------------------------------------------
# FEMNIST from TFF's HDF5 files.
# ----------------------------------------------------------------------------


def _write_h5(path, clients: dict) -> None:
  """TFF layout: examples/<client>/{pixels float32 [n,28,28], label int32}."""
  h5py = pytest.importorskip('h5py')
  with h5py.File(str(path), 'w') as f:
    examples = f.create_group('examples')
    for name, (pixels, label) in clients.items():
      g = examples.create_group(name)
      g.create_dataset('pixels', data=pixels)
      g.create_dataset('label', data=label)


def _h5_client(n: int, label: int, seed: int):
  rng = np.random.default_rng(seed)
  pixels = np.ones((n, 28, 28), np.float32)  # White background, as in LEAF.
  pixels[:, 5:20, 10:15] = rng.random((n, 15, 5), np.float32)
  return pixels, np.full(n, label, np.int32)


def _write_femnist_h5(directory):
  os.makedirs(directory, exist_ok=True)
  train = {'f0002_07': _h5_client(3, 61, 0), 'f0000_14': _h5_client(2, 4, 1)}
  test = {'f0000_14': _h5_client(1, 4, 2), 'f0009_33': _h5_client(2, 10, 3)}
  _write_h5(os.path.join(directory, femnist_h5.TRAIN_FILE), train)
  _write_h5(os.path.join(directory, femnist_h5.TEST_FILE), test)
  return train, test


def test_femnist_h5_roundtrip(tmp_path):
  pytest.importorskip('h5py')
  train, test = _write_femnist_h5(tmp_path / 'fed_emnist')
  ds = data.load_dataset('femnist', str(tmp_path))
  assert ds.info['format'] == 'h5'
  # Writers in sorted name order; the test-only writer comes after them.
  assert ds.client_names == ['f0000_14', 'f0002_07', 'f0009_33']
  np.testing.assert_array_equal(ds.train_client_ids, [0, 0, 1, 1, 1])
  np.testing.assert_array_equal(ds.test_client_ids, [0, 2, 2])
  np.testing.assert_array_equal(ds.train_y, [4, 4, 61, 61, 61])
  assert ds.train_x.shape == (5, 28, 28, 1) and ds.train_x.dtype == np.float32
  assert ds.train_y.dtype == np.int32 and ds.num_classes == 62
  np.testing.assert_array_equal(ds.train_x[2:, ..., 0], train['f0002_07'][0])
  np.testing.assert_array_equal(ds.test_x[1:, ..., 0], test['f0009_33'][0])
  # Not inverted: the background stays 1.0, as in LEAF.
  assert ds.train_x[0, 0, 0, 0] == 1.0
  assert len(data.natural(ds.train_client_ids)) == 2


def test_femnist_h5_matches_real_leaf(tmp_path):
  """The real LEAF subset written in TFF's layout loads to the same data."""
  pytest.importorskip('h5py')
  leaf_ds = data.load_dataset('femnist', shared_data_dir_or_skip(),
                              options={'format': 'leaf'})
  for split, fname in femnist_h5.H5_FILES.items():
    x = getattr(leaf_ds, f'{split}_x')[..., 0]
    y = getattr(leaf_ds, f'{split}_y')
    ids = getattr(leaf_ds, f'{split}_client_ids')
    _write_h5(tmp_path / fname,
              {leaf_ds.client_names[c]: (x[ids == c], y[ids == c])
               for c in np.unique(ids)})
  h5_ds = data.load_dataset('femnist', str(tmp_path),
                            options={'format': 'h5'})
  assert sorted(h5_ds.client_names) == sorted(leaf_ds.client_names)
  for split in ('train', 'test'):
    for ds in (leaf_ds, h5_ds):
      assert getattr(ds, f'{split}_x').shape[1:] == (28, 28, 1)
    for c, name in enumerate(leaf_ds.client_names):
      c2 = h5_ds.client_names.index(name)
      a = getattr(leaf_ds, f'{split}_client_ids') == c
      b = getattr(h5_ds, f'{split}_client_ids') == c2
      np.testing.assert_array_equal(getattr(leaf_ds, f'{split}_x')[a],
                                    getattr(h5_ds, f'{split}_x')[b])
      np.testing.assert_array_equal(getattr(leaf_ds, f'{split}_y')[a],
                                    getattr(h5_ds, f'{split}_y')[b])
  assert np.median(h5_ds.train_x) == 1.0
  clients = data.femnist_clients(h5_ds.train_client_ids, 20, 2, seed=0,
                                 test_client_ids=h5_ds.test_client_ids)
  assert len(clients.train) == 10


def test_femnist_format_choice(tmp_path):
  pytest.importorskip('h5py')
  _write_femnist_h5(tmp_path)
  for split in ('train', 'test'):
    (tmp_path / 'femnist_leaf' / split).mkdir(parents=True)
    obj = {'users': ['w1'], 'num_samples': [1],
           'user_data': {'w1': {'x': [[0.5] * 784], 'y': [3]}}}
    (tmp_path / 'femnist_leaf' / split / 'a.json').write_text(json.dumps(obj))
  assert data.load_dataset('femnist', str(tmp_path)).info['format'] == 'leaf'
  ds = data.load_dataset('femnist', str(tmp_path), options={'format': 'h5'})
  assert ds.info['format'] == 'h5' and len(ds.client_names) == 3
  with pytest.raises(ValueError, match="'auto', 'leaf', 'h5'"):
    data.load_dataset('femnist', str(tmp_path), options={'format': 'tff'})


@pytest.mark.parametrize('case', [
    'not_hdf5', 'truncated', 'no_examples', 'no_clients', 'missing_label',
    'pixel_shape', 'int_pixels', 'count_mismatch', 'bad_label', 'bad_pixel',
    'external_link', 'label_2d'])
def test_femnist_h5_malformed(tmp_path, case):
  h5py = pytest.importorskip('h5py')
  _write_femnist_h5(tmp_path)
  path = tmp_path / femnist_h5.TRAIN_FILE
  pixels, label = _h5_client(2, 1, 0)
  if case == 'not_hdf5':
    path.write_bytes(b'polarity,id\n' * 10)
  elif case == 'truncated':
    path.write_bytes(path.read_bytes()[:3000])
  elif case == 'no_examples':
    with h5py.File(str(path), 'w') as f:
      f.create_group('clients')
  elif case == 'no_clients':
    with h5py.File(str(path), 'w') as f:
      f.create_group('examples')
  elif case == 'external_link':
    with h5py.File(str(path), 'a') as f:
      f['examples']['evil'] = h5py.ExternalLink('/etc/passwd', '/x')
  else:
    clients = {
        'missing_label': {'pixels': pixels},
        'pixel_shape': {'pixels': pixels[:, :, :27], 'label': label},
        'int_pixels': {'pixels': (pixels * 255).astype(np.uint8),
                       'label': label},
        'count_mismatch': {'pixels': pixels, 'label': label[:1]},
        'bad_label': {'pixels': pixels, 'label': np.array([0, 62])},
        'bad_pixel': {'pixels': pixels * 2, 'label': label},
        'label_2d': {'pixels': pixels, 'label': label[:, None]},
    }[case]
    with h5py.File(str(path), 'a') as f:
      g = f['examples'].create_group('f9999_00')
      for k, v in clients.items():
        g.create_dataset(k, data=v)
  message = _raises_naming(path, data.load_dataset, 'femnist', str(tmp_path))
  if case not in ('not_hdf5', 'truncated', 'no_examples', 'no_clients',
                  'external_link'):
    assert 'f9999_00' in message


def test_femnist_h5_partial_and_missing(tmp_path):
  pytest.importorskip('h5py')
  _write_femnist_h5(tmp_path)
  os.remove(tmp_path / femnist_h5.TEST_FILE)
  message = _raises_naming(tmp_path / femnist_h5.TEST_FILE, data.load_dataset,
                           'femnist', str(tmp_path))
  assert 'only part' in message
  empty = tmp_path / 'empty'
  empty.mkdir()
  message = _raises_naming(empty / femnist_h5.TRAIN_FILE, data.load_dataset,
                           'femnist', str(empty))
  assert 'LEAF FEMNIST' in message and 'fed_emnist.tar.bz2' in message


def test_femnist_h5_without_h5py(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, 'h5py', None)  # `import h5py` fails.
  (tmp_path / femnist_h5.TRAIN_FILE).write_bytes(b'x')
  (tmp_path / femnist_h5.TEST_FILE).write_bytes(b'x')
  with pytest.raises(data.DataError, match='pip install h5py'):
    data.load_dataset('femnist', str(tmp_path))


# ----------------------------------------------------------------------------
# Sentiment140 CSV.
# ----------------------------------------------------------------------------

_TRAIN_ROWS = [
    # polarity, id, date, query, user, text
    ('0', '1467810369', 'Mon Apr 06 22:19:45 PDT 2009', 'NO_QUERY',
     '_TheSpecialOne_', "@switchfoot awww, that's a bummer. bummer!"),
    ('0', '1467810672', 'Mon Apr 06 22:19:49 PDT 2009', 'NO_QUERY',
     'scotthamilton', 'is upset that he can\'t update his Facebook'),
    ('4', '1467822272', 'Mon Apr 06 22:22:45 PDT 2009', 'NO_QUERY',
     'ersle', 'I LOVE @Health4UandPets u guys r the best!! caf\xe9'),
    ('4', '1467822273', 'Mon Apr 06 22:22:46 PDT 2009', 'NO_QUERY',
     '_TheSpecialOne_', 'love love the "best" day, ever'),
]
_TEST_ROWS = [
    ('4', '3', 'Mon May 11 03:17:40 UTC 2009', 'kindle2', 'tpryan',
     'I love my Kindle2. Not that the DX is cool, zebra zebra zebra'),
    ('2', '5', 'Mon May 11 03:18:03 UTC 2009', 'kindle2', 'vcu451',
     'Reading my kindle2...'),
    ('0', '6', 'Mon May 11 03:18:54 UTC 2009', 'kindle2', 'ersle',
     'bummer'),
]


def _write_csv(path, rows) -> None:
  buf = io.StringIO()
  csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator='\n').writerows(rows)
  path.write_bytes(buf.getvalue().encode('latin-1'))


def _write_sentiment140(directory, train=None, test=None):
  os.makedirs(directory, exist_ok=True)
  _write_csv(directory / sentiment140.TRAIN_FILE, train or _TRAIN_ROWS)
  _write_csv(directory / sentiment140.TEST_FILE, test or _TEST_ROWS)


def test_sentiment140_reader(tmp_path):
  _write_sentiment140(tmp_path / 'sentiment140')
  raw = data.read_sentiment140(str(tmp_path / 'sentiment140'), vocab_size=6)
  # Training-split counts: ! 3, love 3, then , best bummer the (2 each), ties
  # broken by the token; 'zebra' (3 times, test only) is not in it.
  assert raw.vocab == ['!', 'love', ',', 'best', 'bummer', 'the']
  assert 'zebra' not in raw.vocab and 'caf\xe9' not in raw.vocab
  np.testing.assert_array_equal(raw.train_y, [0, 0, 1, 1])
  np.testing.assert_array_equal(raw.test_y, [1, 0])
  assert raw.test_neutral_dropped == 1
  assert raw.users == ['_TheSpecialOne_', 'scotthamilton', 'ersle', 'tpryan']
  np.testing.assert_array_equal(raw.train_users, [0, 1, 2, 0])
  np.testing.assert_array_equal(raw.test_users, [3, 2])
  # Row 0: "@switchfoot awww, that's a bummer. bummer!" keeps , bummer bummer !
  v = {w: i for i, w in enumerate(raw.vocab)}
  np.testing.assert_array_equal(raw.train_tokens[0, :4],
                                [v[','], v['bummer'], v['bummer'], v['!']])
  assert raw.train_tokens.dtype == np.int32
  assert np.all(raw.train_tokens[0, 4:] == sentiment140.PAD_ID)
  counts = data.bag_of_words(raw.train_tokens, 6)
  # 'love love the "best" day, ever'
  np.testing.assert_array_equal(counts[3], [0, 2, 1, 1, 0, 1])
  assert sentiment140.tokenize("Can't STOP, ok?!") == [
      "can't", 'stop', ',', 'ok', '?', '!']


def test_sentiment140_dataset_representations(tmp_path):
  _write_sentiment140(tmp_path)
  ds = data.load_dataset('sentiment140', str(tmp_path),
                         options={'vocab_size': 6})
  assert ds.input_kind == data.INPUT_BOW_COUNTS and ds.num_classes == 2
  assert ds.train_x.shape == (4, 6) and ds.train_x.dtype == np.float32
  assert ds.info['test_neutral_dropped'] == 1
  tok = data.load_dataset('sentiment140', str(tmp_path),
                          options={'vocab_size': 6,
                                   'representation': 'tokens'})
  assert tok.input_kind == data.INPUT_BOW_TOKENS and tok.pad_id == -1
  np.testing.assert_array_equal(data.bag_of_words(tok.train_x, 6), ds.train_x)
  np.testing.assert_array_equal(data.bag_of_words(tok.test_x, 6), ds.test_x)
  np.testing.assert_array_equal(ds.train_client_ids, [0, 1, 2, 0])
  assert [len(c) for c in data.natural(ds.train_client_ids)] == [2, 1, 1]
  with pytest.raises(data.DataError, match="'representation': 'tokens'"):
    data.load_dataset('sentiment140', str(tmp_path),
                      options={'max_dense_bytes': 100})
  cased = data.load_dataset('sentiment140', str(tmp_path),
                            options={'lowercase': False})
  assert 'LOVE' in cased.vocab and 'love' in cased.vocab
  for bad in ({'vocab': 3}, {'representation': 'dense'},
              {'vocab_size': 0}, {'lowercase': 1}):
    with pytest.raises(ValueError) as info:
      data.load_dataset('sentiment140', str(tmp_path), options=bad)
    assert not isinstance(info.value, data.DataError)


def test_sentiment140_truncation(tmp_path):
  rows = [('0', '1', 'd', 'q', 'u', 'a b c d e f'), ('4', '2', 'd', 'q', 'v',
                                                      'a')]
  _write_sentiment140(tmp_path, train=rows)
  with pytest.warns(UserWarning, match='max_tokens=4'):
    ds = data.load_dataset('sentiment140', str(tmp_path),
                           options={'max_tokens': 4,
                                    'representation': 'tokens'})
  assert ds.train_x.shape[1] == 4 and ds.info['truncated_tweets'] == 1


@pytest.mark.parametrize('case', ['columns', 'train_neutral', 'bad_polarity',
                                  'open_quote', 'truncated', 'empty',
                                  'missing_test'])
def test_sentiment140_malformed(tmp_path, case):
  _write_sentiment140(tmp_path)
  path = tmp_path / sentiment140.TRAIN_FILE
  if case == 'columns':
    _write_csv(path, _TRAIN_ROWS[:2] + [('0', '1', 'user', 'text')])
  elif case == 'train_neutral':
    _write_csv(path, _TRAIN_ROWS + [('2',) + _TRAIN_ROWS[0][1:]])
  elif case == 'bad_polarity':
    path = tmp_path / sentiment140.TEST_FILE
    _write_csv(path, [('5',) + _TEST_ROWS[0][1:]])
  elif case == 'open_quote':
    raw = path.read_bytes().split(b'\n')
    raw[1] = raw[1][:-1]  # Drop the closing quote of the second tweet.
    path.write_bytes(b'\n'.join(raw))
  elif case == 'truncated':
    raw = path.read_bytes()
    path.write_bytes(raw[:raw.rindex(b'NO_QUERY')])
  elif case == 'empty':
    path.write_bytes(b'')
  elif case == 'missing_test':
    path = tmp_path / sentiment140.TEST_FILE
    os.remove(path)
  message = _raises_naming(path, data.load_dataset, 'sentiment140',
                           str(tmp_path))
  if case in ('columns', 'train_neutral', 'open_quote', 'truncated'):
    assert {'columns': 'line 3', 'train_neutral': 'line 5',
            'open_quote': 'line 2', 'truncated': 'line 4'}[case] in message


def test_sentiment140_missing(tmp_path):
  message = _raises_naming(
      os.path.join(str(tmp_path), 'sentiment140', sentiment140.TRAIN_FILE),
      data.load_dataset, 'sentiment140', str(tmp_path))
  assert 'trainingandtestdata.zip' in message and 'BUILD.md' in message


# ----------------------------------------------------------------------------
# Shakespeare (LEAF JSON).
# ----------------------------------------------------------------------------


def _leaf(users: dict, num_samples=None) -> dict:
  return {'users': list(users),
          'num_samples': num_samples or [len(v['y']) for v in users.values()],
          'user_data': users}


def _write_json(path, obj, compress=False):
  os.makedirs(os.path.dirname(str(path)), exist_ok=True)
  test_data_readers._write_leaf(path, obj, compress)  # pylint: disable=protected-access


_PLAY = ('ROMEO. But soft! What light through yonder window breaks? It is the '
         'east, and Juliet is the sun. Arise, fair sun, and kill the envious '
         'moon$ who is already sick.')


def _shakespeare_user(start: int, n: int) -> dict:
  """Consecutive 80-character windows of the text and their next character."""
  xs = [_PLAY[i:i + 80] for i in range(start, start + n)]
  return {'x': xs, 'y': [_PLAY[i + 80] for i in range(start, start + n)]}


def _write_shakespeare(root):
  _write_json(root / 'train' / 'all_data_niid_0_keep_0_train_9.json.gz',
              _leaf({'THE_TRAGEDY_OF_ROMEO_AND_JULIET_ROMEO':
                     _shakespeare_user(0, 3),
                     'THE_TRAGEDY_OF_ROMEO_AND_JULIET_JULIET':
                     _shakespeare_user(40, 2)}), compress=True)
  _write_json(root / 'test' / 'all_data_niid_0_keep_0_test_9.json',
              _leaf({'THE_TRAGEDY_OF_ROMEO_AND_JULIET_JULIET':
                     _shakespeare_user(60, 1)}))


def test_shakespeare(tmp_path):
  _write_shakespeare(tmp_path / 'shakespeare' / 'data')
  ds = data.load_dataset('shakespeare', str(tmp_path))
  assert ds.input_kind == data.INPUT_TOKENS and ds.num_classes == 81
  assert len(ds.vocab) == 81 and ds.vocab[80] == '<oov>'
  assert ds.train_x.shape == (5, 80) and ds.train_x.dtype == np.int32
  assert ds.train_y.shape == (5, 80) and ds.train_y.dtype == np.int32
  assert ''.join(ds.vocab[i] for i in ds.train_x[0]) == _PLAY[:80]
  # Next-token targets: the input shifted by one, then LEAF's y.
  np.testing.assert_array_equal(ds.train_y[:, :-1], ds.train_x[:, 1:])
  assert ds.vocab[ds.train_y[0, -1]] == _PLAY[80]
  # LEAF's table: '\n' is 0, ' ' 1, 'a' 53, '}' 79; '$' is outside it.
  assert [leaf_text.SHAKESPEARE_CHARS.index(c) for c in '\n a}'] == [
      0, 1, 53, 79]
  np.testing.assert_array_equal(leaf_text.shakespeare_ids('a$\xe9\n'),
                                [53, 80, 80, 0])
  assert 80 in ds.test_x  # The '$' of "moon$".
  assert ds.client_names[0].endswith('_ROMEO')
  np.testing.assert_array_equal(ds.train_client_ids, [0, 0, 0, 1, 1])
  np.testing.assert_array_equal(ds.test_client_ids, [1])
  last = data.load_dataset('shakespeare', str(tmp_path),
                           options={'target': 'last'})
  assert last.train_y.shape == (5,)
  np.testing.assert_array_equal(last.train_y, ds.train_y[:, -1])


@pytest.mark.parametrize('case', ['lengths', 'long_y', 'not_string',
                                  'num_samples', 'duplicate', 'bad_json'])
def test_shakespeare_malformed(tmp_path, case):
  _write_shakespeare(tmp_path)
  path = tmp_path / 'train' / 'z.json'
  user = _shakespeare_user(0, 2)
  obj = _leaf({'HAMLET': user})
  if case == 'lengths':
    user['x'][1] = user['x'][1][:79]
  elif case == 'long_y':
    user['y'][0] = 'ab'
  elif case == 'not_string':
    user['x'][0] = [1, 2, 3]
  elif case == 'num_samples':
    obj['num_samples'] = [5]
  elif case == 'duplicate':
    obj = _leaf({'THE_TRAGEDY_OF_ROMEO_AND_JULIET_ROMEO': user})
  if case == 'bad_json':
    path.write_bytes(b'{"users": ["HAMLET"], ')
  else:
    _write_json(path, obj)
  _raises_naming(path, data.load_dataset, 'shakespeare', str(tmp_path))


# ----------------------------------------------------------------------------
# Reddit (LEAF JSON).
# ----------------------------------------------------------------------------


def _reddit_comment(text: str, seq_len: int = 10):
  """LEAF's `create_seqs` for one comment: (x sequences, y dict)."""
  words = text.split()
  c = ['<BOS>'] + words + ['<EOS>']
  t = words + ['<EOS>', '<PAD>']
  counts = [1.0] * len(c)
  pad = (-len(c)) % seq_len
  c += ['<PAD>'] * pad
  t += ['<PAD>'] * ((-len(t)) % seq_len)
  counts += [0.0] * pad
  rows = lambda v: [v[i:i + seq_len] for i in range(0, len(v), seq_len)]
  return rows(c), {'created_utc': 1512086400, 'score': 3,
                   'subreddit': 'AskReddit', 'target_tokens': rows(t),
                   'count_tokens': rows(counts)}


def _reddit_user(*texts):
  pairs = [_reddit_comment(t) for t in texts]
  return {'x': [p[0] for p in pairs], 'y': [p[1] for p in pairs]}


def _write_reddit(root):
  train = {'user_a': _reddit_user('the cat sat on the mat', 'the dog'),
           'user_b': _reddit_user(
               'a b c d e f g h i j k the end of a long comment')}
  # LEAF copies the users' total comment counts into every split.
  _write_json(root / 'train' / 'reddit_0_train.json',
              _leaf(train, num_samples=[3, 2]))
  _write_json(root / 'test' / 'reddit_0_test.json',
              _leaf({'user_a': _reddit_user('the zebra')}, num_samples=[3]))


def test_reddit_built_vocab(tmp_path):
  _write_reddit(tmp_path / 'reddit_leaf')
  ds = data.load_dataset('reddit', str(tmp_path), options={'vocab_size': 8})
  assert ds.info['vocab_source'] == 'train'
  # <PAD> 0, <UNK> 1; then by count: the 4, <BOS> 3, <EOS> 3, a 2, ...
  assert ds.vocab[:7] == ['<PAD>', '<UNK>', 'the', '<BOS>', '<EOS>', 'a', 'b']
  assert ds.num_classes == 8 and ds.pad_id == 0
  # One row per 10-token sequence: 1 + 1 (user_a) + 2 (user_b).
  assert ds.train_x.shape == (4, 10) and ds.train_y.shape == (4, 10)
  np.testing.assert_array_equal(ds.train_client_ids, [0, 0, 1, 1])
  v = {w: i for i, w in enumerate(ds.vocab)}
  unk = 1
  np.testing.assert_array_equal(
      ds.train_x[0], [v['<BOS>'], v['the'], unk, unk, unk, v['the'], unk,
                      v['<EOS>'], 0, 0])
  np.testing.assert_array_equal(
      ds.train_y[0], [v['the'], unk, unk, unk, v['the'], unk, v['<EOS>'], 0,
                      0, 0])
  np.testing.assert_array_equal(ds.test_x[0, :4],
                                [v['<BOS>'], v['the'], unk, v['<EOS>']])
  assert ds.input_kind == data.INPUT_TOKENS


def test_reddit_leaf_vocab_file(tmp_path):
  root = tmp_path / 'reddit' / 'data'
  _write_reddit(root)
  os.makedirs(tmp_path / 'reddit' / 'vocab')
  vocab = {'<PAD>': 0, '<UNK>': 1, 'the': 2, '<BOS>': 3, '<EOS>': 4,
           'zebra': 9}
  with open(tmp_path / 'reddit' / 'vocab' / 'reddit_vocab.pck', 'wb') as f:
    pickle.dump({'vocab': vocab, 'size': 10, 'unk_symbol': 1,
                 'pad_symbol': 0}, f)
  ds = data.load_dataset('reddit', str(tmp_path))
  assert ds.num_classes == 10 and ds.info['vocab_source'].endswith(
      'reddit_vocab.pck')
  np.testing.assert_array_equal(ds.test_x[0, :5], [3, 2, 9, 4, 0])
  assert ds.vocab[9] == 'zebra' and ds.vocab[5] == ''


@pytest.mark.parametrize('case', ['y_not_dict', 'shape', 'seq_len',
                                  'token_type', 'evil_pickle', 'vocab_range'])
def test_reddit_malformed(tmp_path, case):
  _write_reddit(tmp_path)
  path = tmp_path / 'train' / 'reddit_1_train.json'
  user = _reddit_user('hello there')
  if case == 'y_not_dict':
    user['y'][0] = ['hello']
  elif case == 'shape':
    user['y'][0]['target_tokens'].append(['x'] * 10)
  elif case == 'seq_len':
    user['x'][0][0] = user['x'][0][0][:9]
  elif case == 'token_type':
    user['x'][0][0][1] = 7
  elif case == 'evil_pickle':
    path = tmp_path / 'reddit_vocab.pck'
    path.write_bytes(b'\x80\x02cos\nsystem\nX\x04\x00\x00\x00trueq\x00\x85R.')
  elif case == 'vocab_range':
    path = tmp_path / 'reddit_vocab.pck'
    path.write_bytes(pickle.dumps({'vocab': {'a': 12}, 'size': 10,
                                   'unk_symbol': 1, 'pad_symbol': 0}))
  if not path.name.endswith('.pck'):
    _write_json(path, _leaf({'user_z': user}))
  _raises_naming(path, data.load_dataset, 'reddit', str(tmp_path))


# ----------------------------------------------------------------------------
# TinyImageNet.
# ----------------------------------------------------------------------------

_WNIDS = ['n01443537', 'n01629819', 'n01641577']
_COLOURS = {0: (200, 30, 30), 1: (30, 200, 30), 2: (30, 30, 200)}


def _jpeg(path, colour, size=64, mode='RGB'):
  from PIL import Image  # pylint: disable=g-import-not-at-top
  os.makedirs(os.path.dirname(str(path)), exist_ok=True)
  value = colour[0] if mode == 'L' else colour
  Image.new(mode, (size, size), value).save(str(path), 'JPEG', quality=95)


def _write_tinyimagenet(root):
  os.makedirs(root)
  (root / 'wnids.txt').write_text('\n'.join(_WNIDS) + '\n')
  for c, w in enumerate(_WNIDS):
    for k in range(2):
      mode = 'L' if (c, k) == (2, 1) else 'RGB'
      _jpeg(root / 'train' / w / 'images' / f'{w}_{k}.JPEG', _COLOURS[c],
            mode=mode)
    (root / 'train' / w / f'{w}_boxes.txt').write_text('')
  lines = []
  for k, c in enumerate([2, 0, 1]):
    _jpeg(root / 'val' / 'images' / f'val_{k}.JPEG', _COLOURS[c])
    lines.append(f'val_{k}.JPEG\t{_WNIDS[c]}\t0\t0\t63\t63')
  (root / 'val' / 'val_annotations.txt').write_text('\n'.join(lines) + '\n')


def test_tinyimagenet(tmp_path):
  pytest.importorskip('PIL')
  _write_tinyimagenet(tmp_path / 'tiny-imagenet-200')
  ds = data.load_dataset('tinyimagenet', str(tmp_path))
  assert ds.num_classes == 3 and ds.input_kind == data.INPUT_IMAGE
  assert ds.train_x.shape == (6, 64, 64, 3) and ds.train_x.dtype == np.float32
  assert ds.test_x.shape == (3, 64, 64, 3)
  np.testing.assert_array_equal(ds.train_y, [0, 0, 1, 1, 2, 2])
  np.testing.assert_array_equal(ds.test_y, [2, 0, 1])
  assert 0.0 <= ds.train_x.min() and ds.train_x.max() <= 1.0
  # Solid colours survive JPEG within a few levels.
  means = ds.train_x.mean(axis=(1, 2)) * 255
  for i, c in enumerate([0, 0, 1, 1, 2]):
    np.testing.assert_allclose(means[i], _COLOURS[c], atol=3)
  # The grayscale image became RGB with three equal channels.
  gray = ds.train_x[5]
  np.testing.assert_array_equal(gray[..., 0], gray[..., 1])
  np.testing.assert_array_equal(gray[..., 0], gray[..., 2])
  np.testing.assert_allclose(gray.mean() * 255, _COLOURS[2][0], atol=3)
  np.testing.assert_allclose(ds.test_x[0].mean(axis=(0, 1)) * 255,
                             _COLOURS[2], atol=3)
  # Pixels are exactly the decoded bytes / 255.
  decoded = tinyimagenet.read_image(
      str(tmp_path / 'tiny-imagenet-200' / 'train' / _WNIDS[2] / 'images' /
          f'{_WNIDS[2]}_1.JPEG'))
  assert decoded.dtype == np.uint8 and decoded.shape == (64, 64, 3)
  np.testing.assert_array_equal(ds.train_x[5],
                                decoded.astype(np.float32) / np.float32(255))


@pytest.mark.parametrize('case', ['size', 'truncated', 'not_image',
                                  'unknown_wnid', 'missing_val', 'no_images',
                                  'bad_line', 'duplicate_wnid'])
def test_tinyimagenet_malformed(tmp_path, case):
  pytest.importorskip('PIL')
  root = tmp_path / 'tiny-imagenet-200'
  _write_tinyimagenet(root)
  path = root / 'train' / _WNIDS[1] / 'images' / f'{_WNIDS[1]}_0.JPEG'
  annotations = root / 'val' / 'val_annotations.txt'
  if case == 'size':
    _jpeg(path, (1, 2, 3), size=32)
  elif case == 'truncated':
    path.write_bytes(path.read_bytes()[:300])
  elif case == 'not_image':
    path.write_bytes(b'GIF89a' + b'\x00' * 10)
  elif case == 'unknown_wnid':
    path = annotations
    path.write_text('val_0.JPEG\tn99999999\t0\t0\t1\t1\n')
  elif case == 'missing_val':
    path = root / 'val' / 'images' / 'val_1.JPEG'
    os.remove(path)
  elif case == 'no_images':
    path = root / 'train' / _WNIDS[0] / 'images'
    for f in os.listdir(path):
      os.remove(path / f)
  elif case == 'bad_line':
    path = annotations
    path.write_text('../../etc/passwd\tn01443537\n')
  elif case == 'duplicate_wnid':
    path = root / 'wnids.txt'
    path.write_text('\n'.join(_WNIDS + _WNIDS[:1]))
  _raises_naming(path, data.load_dataset, 'tinyimagenet', str(tmp_path))


def test_tinyimagenet_missing_and_partial(tmp_path):
  message = _raises_naming(
      os.path.join(str(tmp_path), 'tiny-imagenet-200', 'wnids.txt'),
      data.load_dataset, 'tinyimagenet', str(tmp_path))
  assert 'tiny-imagenet-200.zip' in message
  root = tmp_path / 'tiny-imagenet-200'
  os.makedirs(root)
  (root / 'wnids.txt').write_text('n01443537\n')
  message = _raises_naming(root / 'val' / 'val_annotations.txt',
                           data.load_dataset, 'tinyimagenet', str(tmp_path))
  assert 'only part' in message


# ----------------------------------------------------------------------------
# The entry point.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize('name,expected', [
    ('sentiment140', sentiment140.TRAIN_FILE),
    ('shakespeare', 'train/*.json'),
    ('reddit', 'train/*.json'),
    ('tinyimagenet', 'tiny-imagenet-200.zip'),
    ('femnist', femnist_h5.TEST_FILE)])
def test_dispatch_missing_files(tmp_path, name, expected):
  assert name in data.DATASET_NAMES
  with pytest.raises(data.DataError) as info:
    data.load_dataset(name, str(tmp_path))
  assert expected in str(info.value) and 'BUILD.md' in str(info.value)
  with pytest.raises(ValueError, match='files') as info:
    data.load_dataset(name, str(tmp_path), source='tfds')
  assert not isinstance(info.value, data.DataError)


def test_dataset_is_backward_compatible():
  ds = data.Dataset('x', np.zeros((1, 2, 2, 1), np.float32),
                    np.zeros(1, np.int32), np.zeros((1, 2, 2, 1), np.float32),
                    np.zeros(1, np.int32), 10)
  assert ds.input_kind == data.INPUT_IMAGE and ds.vocab is None
  assert ds.pad_id is None and ds.info == {} and ds.client_names is None
  assert data.load_dataset('digits').input_kind == data.INPUT_IMAGE
  with pytest.raises(ValueError, match='accepted: none'):
    data.load_dataset('digits', options={'vocab_size': 3})
