"""LEAF next-token datasets: Shakespeare (characters) and Reddit (words).

Both come as LEAF JSON splits `<root>/{train,test}/*.json[.gz]` with one
writer per user (`users`, `user_data[user] = {"x": [...], "y": [...]}`), read
in file order like `leaf.read_leaf_split`. Every example becomes an int32
token row; the user of each row is its natural client.

* Shakespeare (LEAF `data/shakespeare`): x is a list of 80-character strings,
  y the character that follows each. Ids are positions in LEAF's 80-character
  table `SHAKESPEARE_CHARS` (its `ALL_LETTERS`, so ids match LEAF's models);
  any other character maps to id 80 (`<oov>`), giving 81 classes. LEAF's own
  task predicts only y; `target="sequence"` (default) turns each row into a
  full next-token sequence for `lstm_lm` (targets = x[1:] followed by y), and
  `target="last"` keeps LEAF's single target. LEAF's `split_data.py` leaves out the
  79 windows between a role's training and test windows but counts them in the test
  file's `num_samples`, so a user's `num_samples` may be its windows or its windows + 79
  (the window length minus one); any other count is refused.
* Reddit (LEAF `data/reddit`, built by its `source/preprocess.py`): x is a
  list of comments, each a list of 10-token sequences (`<BOS>` ... `<EOS>`,
  padded with `<PAD>`); y is a list of per-comment dicts whose
  `target_tokens` holds the next-token sequences of the same shape (plus
  metadata, ignored). Every 10-token sequence is one example: x and y are
  int32 [N, 10]. Ids come from LEAF's `reddit_vocab.pck` when present (built
  by its `build_vocab.py`: {'vocab': {token: id}, 'size', 'unk_symbol',
  'pad_symbol'}), read with the restricted unpickler; otherwise the same kind
  of vocabulary is built from the training split: `<PAD>` 0, `<UNK>` 1, then
  the most frequent tokens (count, then token) up to `vocab_size`. Targets
  equal to the pad id are padding and must not be counted by a loss; LEAF's
  `count_tokens` also counts the `<PAD>` target after `<EOS>`, which this
  convention leaves out. LEAF's preprocessing copies the users' total comment
  counts into every split's `num_samples`, so Reddit's `num_samples` is not
  checked against the data.
"""

import dataclasses
import os
from typing import Any, Callable, Iterable

import numpy as np

from fedjax_lama.data import leaf
from fedjax_lama.data import readers
from fedjax_lama.data.data_errors import DataError

# LEAF's ALL_LETTERS (leaf/models/utils/language_utils.py).
SHAKESPEARE_CHARS = ('\n !"&\'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ'
                     '[]abcdefghijklmnopqrstuvwxyz}')
SHAKESPEARE_OOV = len(SHAKESPEARE_CHARS)
SHAKESPEARE_VOCAB = tuple(SHAKESPEARE_CHARS) + ('<oov>',)
SHAKESPEARE_TARGETS = ('sequence', 'last')
REDDIT_VOCAB_FILE = 'reddit_vocab.pck'
REDDIT_PAD, REDDIT_UNK = '<PAD>', '<UNK>'
DEFAULT_REDDIT_VOCAB_SIZE = 10_000

# Code point -> Shakespeare id, for code points below 128 (the table is ASCII).
_CHAR_LUT = np.full(128, SHAKESPEARE_OOV, np.int32)
for _i, _c in enumerate(SHAKESPEARE_CHARS):
  _CHAR_LUT[ord(_c)] = _i


@dataclasses.dataclass
class TokenSplit:
  """One split of a LEAF text dataset, per user, in file order.

  Attributes:
    users: user names.
    x: per-user int32 [n, L] input tokens.
    y: per-user int32 targets, [n, L] (sequences) or [n] (one per row).
  """
  users: list[str]
  x: list[np.ndarray]
  y: list[np.ndarray]


def _read_users(directory: str, check_num_samples: bool, window_gap: bool = False
                ) -> list[tuple[str, str, list[Any], list[Any]]]:
  """(file, user, x, y) of every user of a LEAF split, in file order.

  The same checks as `leaf.read_leaf_split`, with `num_samples` optional. With
  `window_gap`, `num_samples` may also exceed the data by the window length minus one
  (LEAF's Shakespeare test files: module docstring).
  """
  files = leaf.leaf_files(directory)
  if not files:
    raise DataError(f'{directory}: no LEAF *.json or *.json.gz files found')
  out, seen = [], {}
  for path in files:
    obj = leaf.load_json(path, max_bytes=1 << 32)
    leaf.check_leaf_file(obj, path)
    num_samples = obj.get('num_samples')
    for i, user in enumerate(obj['users']):
      if not isinstance(user, str):
        raise DataError(f'{path}: user names must be strings, got {user!r}')
      if user in seen:
        raise DataError(f'{path}: user {user!r} also appears in {seen[user]}')
      seen[user] = path
      data = obj['user_data'].get(user)
      if (not isinstance(data, dict) or not isinstance(data.get('x'), list) or
          not isinstance(data.get('y'), list)):
        raise DataError(f'{path}: user {user!r} has no "x"/"y" lists')
      if len(data['x']) != len(data['y']):
        raise DataError(
            f'{path}: user {user!r} has {len(data["x"])} inputs but '
            f'{len(data["y"])} targets')
      counts = {len(data['y'])}
      if window_gap and data['x'] and isinstance(data['x'][0], str):
        counts.add(len(data['y']) + len(data['x'][0]) - 1)
      if (check_num_samples and num_samples is not None and
          num_samples[i] not in counts):
        raise DataError(
            f'{path}: user {user!r}: num_samples says {num_samples[i]}, '
            f'data holds {len(data["y"])}')
      out.append((path, user, data['x'], data['y']))
  return out


# ----------------------------------------------------------------------------
# Shakespeare.
# ----------------------------------------------------------------------------


def shakespeare_ids(text: str) -> np.ndarray:
  """int32 ids of the characters of `text` (LEAF's table; others -> 80)."""
  points = np.frombuffer(text.encode('utf-32-le'), np.uint32)
  return np.where(points < 128, _CHAR_LUT[np.minimum(points, 127)],
                  SHAKESPEARE_OOV).astype(np.int32)


def _shakespeare_user(path: str, user: str, x: list[Any], y: list[Any],
                      seq_len: int | None, target: str
                      ) -> tuple[np.ndarray, np.ndarray, int | None]:
  where = f'{path}: user {user!r}'
  if not all(isinstance(s, str) for s in x):
    raise DataError(f'{where}: x must be a list of strings')
  if not all(isinstance(c, str) and len(c) == 1 for c in y):
    raise DataError(f'{where}: y must be a list of one-character strings')
  lengths = {len(s) for s in x}
  if seq_len is not None:
    lengths.add(seq_len)
  if len(lengths) > 1 or 0 in lengths:
    raise DataError(
        f'{where}: every x string must have the same non-zero length (LEAF '
        f'uses 80); found lengths {sorted(lengths)[:5]}')
  if lengths:
    seq_len = lengths.pop()
  width = seq_len or 0
  ids = shakespeare_ids(''.join(x)).reshape(len(x), width)
  nxt = shakespeare_ids(''.join(y))
  if target == 'last':
    return ids, nxt, seq_len
  seq = np.concatenate([ids[:, 1:], nxt[:, None]], axis=1)
  return ids, seq.astype(np.int32), seq_len


def read_shakespeare_split(directory: str, target: str = 'sequence'
                           ) -> TokenSplit:
  """Reads one LEAF Shakespeare split into token rows (module docstring).

  Raises:
    DataError: malformed LEAF JSON, x not strings of one common length, or y
      not single characters.
  """
  if target not in SHAKESPEARE_TARGETS:
    raise ValueError(
        f'shakespeare target must be one of {list(SHAKESPEARE_TARGETS)}, got '
        f'{target!r}')
  users, xs, ys = [], [], []
  seq_len = None
  for path, user, x, y in _read_users(directory, check_num_samples=True,
                                      window_gap=True):
    ids, tgt, seq_len = _shakespeare_user(path, user, x, y, seq_len, target)
    users.append(user)
    xs.append(ids)
    ys.append(tgt)
  width = seq_len or 0
  # Users read before the width was known may hold [0, 0] arrays.
  xs = [a.reshape(-1, width) for a in xs]
  if target == 'sequence':
    ys = [a.reshape(-1, width) for a in ys]
  return TokenSplit(users, xs, ys)


# ----------------------------------------------------------------------------
# Reddit.
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class RedditVocab:
  """A Reddit word vocabulary.

  Attributes:
    index: token -> id.
    size: number of ids (the model's vocabulary / number of classes).
    pad_id: id of `<PAD>`.
    unk_id: id given to tokens outside `index`.
    source: the vocabulary file, or 'train' when built from the train split.
  """
  index: dict[str, int]
  size: int
  pad_id: int
  unk_id: int
  source: str

  def tokens(self) -> list[str]:
    """The token of each id ('' for ids no token maps to; first one wins)."""
    out = [''] * self.size
    for token, i in self.index.items():
      if not out[i]:
        out[i] = token
    return out

  def lookup(self) -> Callable[[list[str]], list[int]]:
    get, unk = self.index.get, self.unk_id
    return lambda seq: [get(t, unk) for t in seq]


def read_reddit_vocab(path: str) -> RedditVocab:
  """Reads LEAF's `reddit_vocab.pck` (restricted unpickler, then validated)."""
  obj = readers.safe_unpickle(path, max_bytes=1 << 28)
  if isinstance(obj, dict):
    obj = {k.decode() if isinstance(k, bytes) else k: v for k, v in
           obj.items()}
  if not isinstance(obj, dict) or not all(
      k in obj for k in ('vocab', 'size', 'unk_symbol', 'pad_symbol')):
    raise DataError(
        f'{path}: expected a dict with keys vocab, size, unk_symbol, '
        'pad_symbol (LEAF build_vocab.py output)')
  size = obj['size']
  if isinstance(size, bool) or not isinstance(size, int) or size < 2:
    raise DataError(f'{path}: "size" must be an int >= 2, got {size!r}')
  for key in ('unk_symbol', 'pad_symbol'):
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < size:
      raise DataError(f'{path}: "{key}" must be an int in [0, {size})')
  vocab = obj['vocab']
  if not isinstance(vocab, dict):
    raise DataError(f'{path}: "vocab" must be a dict token -> id')
  index = {}
  for token, i in vocab.items():
    if isinstance(token, bytes):
      token = token.decode('utf-8', 'replace')
    if (not isinstance(token, str) or isinstance(i, bool) or
        not isinstance(i, int) or not 0 <= i < size):
      raise DataError(
          f'{path}: "vocab" must map strings to ids in [0, {size}), got '
          f'{token!r}: {i!r}')
    index[token] = i
  return RedditVocab(index, size, obj['pad_symbol'], obj['unk_symbol'], path)


def build_reddit_vocab(sequences: Iterable[list[str]],
                       vocab_size: int = DEFAULT_REDDIT_VOCAB_SIZE
                       ) -> RedditVocab:
  """`<PAD>` 0, `<UNK>` 1, then the most frequent tokens (count, token)."""
  if vocab_size < 3:
    raise ValueError(f'reddit vocab_size must be at least 3, got {vocab_size}')
  counts = {}
  for seq in sequences:
    for t in seq:
      counts[t] = counts.get(t, 0) + 1
  counts.pop(REDDIT_PAD, None)
  counts.pop(REDDIT_UNK, None)
  words = sorted(counts, key=lambda t: (-counts[t], t))[:vocab_size - 2]
  index = {REDDIT_PAD: 0, REDDIT_UNK: 1}
  index.update({w: i + 2 for i, w in enumerate(words)})
  return RedditVocab(index, vocab_size, 0, 1, 'train')


def _reddit_sequences(path: str, user: str, x: list[Any], y: list[Any],
                      seq_len: int | None
                      ) -> tuple[list[list[str]], list[list[str]], int | None]:
  """Flattens a user's comments into aligned (input, target) sequences."""
  where = f'{path}: user {user!r}'
  inputs, targets = [], []
  for j, (comment, label) in enumerate(zip(x, y)):
    if not isinstance(label, dict) or 'target_tokens' not in label:
      raise DataError(
          f'{where}: y[{j}] must be a dict with "target_tokens" (LEAF '
          'reddit format)')
    tgt = label['target_tokens']
    if not isinstance(comment, list) or not isinstance(tgt, list) or len(
        comment) != len(tgt):
      raise DataError(
          f'{where}: comment {j}: x and target_tokens must be lists of the '
          'same number of sequences')
    for seq in comment + tgt:
      if (not isinstance(seq, list) or
          not all(isinstance(t, str) for t in seq)):
        raise DataError(
            f'{where}: comment {j}: every sequence must be a list of token '
            'strings')
      if seq_len is None:
        seq_len = len(seq)
      if len(seq) != seq_len or seq_len == 0:
        raise DataError(
            f'{where}: comment {j}: sequences must all have the same '
            f'non-zero length (LEAF uses 10); found {len(seq)} and {seq_len}')
    inputs.extend(comment)
    targets.extend(tgt)
  return inputs, targets, seq_len


def find_reddit_vocab(directory: str) -> str | None:
  """LEAF's vocabulary file next to the data, in `vocab/`, or `../vocab/`."""
  for p in (os.path.join(directory, REDDIT_VOCAB_FILE),
            os.path.join(directory, 'vocab', REDDIT_VOCAB_FILE),
            os.path.join(directory, os.pardir, 'vocab', REDDIT_VOCAB_FILE)):
    if os.path.isfile(p):
      return os.path.normpath(p)
  return None


def read_reddit(root: str, vocab_size: int = DEFAULT_REDDIT_VOCAB_SIZE
                ) -> tuple[dict[str, TokenSplit], RedditVocab]:
  """Reads LEAF Reddit `root/{train,test}` into int32 [n, 10] rows per user.

  The vocabulary is `find_reddit_vocab(root)` when present, else built from
  the training split with `vocab_size` ids (module docstring).

  Raises:
    DataError: malformed LEAF JSON or Reddit structure, or a bad vocabulary
      file.
  """
  raw, seq_len = {}, None
  for s in leaf.LEAF_SPLITS:
    directory = os.path.join(root, s)
    users = []
    for path, user, x, y in _read_users(directory, check_num_samples=False):
      inputs, targets, seq_len = _reddit_sequences(path, user, x, y, seq_len)
      users.append((user, inputs, targets))
    raw[s] = users
  vocab_path = find_reddit_vocab(root)
  if vocab_path is not None:
    vocab = read_reddit_vocab(vocab_path)
  else:
    vocab = build_reddit_vocab(
        (seq for _, inputs, _ in raw['train'] for seq in inputs), vocab_size)
  lookup = vocab.lookup()
  width = seq_len or 0
  out = {}
  for s, users in raw.items():
    split = TokenSplit([], [], [])
    for user, inputs, targets in users:
      split.users.append(user)
      split.x.append(np.asarray([lookup(q) for q in inputs],
                                np.int32).reshape(-1, width))
      split.y.append(np.asarray([lookup(q) for q in targets],
                                np.int32).reshape(-1, width))
    out[s] = split
  return out, vocab
