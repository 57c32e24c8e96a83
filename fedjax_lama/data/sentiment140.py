"""Sentiment140 from its original CSV files, as bag-of-words data per account.

FedAT (Chai et al. 2021, its Sentiment140 experiments) trains a logistic
regression over a bag of words on Sentiment140 with one client per Twitter
account. The release (Go, Bhayani and Huang, 2009;
`trainingandtestdata.zip`) holds two latin-1 CSV files with six quoted columns
`polarity, id, date, query, user, text`:

* `training.1600000.processed.noemoticon.csv`: 1,600,000 tweets, polarity 0
  (negative) or 4 (positive);
* `testdata.manual.2009.06.14.csv`: 498 hand-labelled tweets, polarity 0, 2
  (neutral) or 4. The binary task has no neutral class, so the 139 neutral
  tweets are dropped (counted in `Sentiment140.test_neutral_dropped`).

Labels are 0 (negative) and 1 (positive). Text is tokenised with LEAF's
Sent140 rule (`re.findall(r"[\\w']+|[.,!?;]", text)`, words and the
punctuation . , ! ? ;), lower-cased by default. The vocabulary is the
`vocab_size` most frequent tokens of the TRAINING file only (ties broken by
the token string), token id 0 the most frequent; tokens outside it are
dropped, as a bag of words over that vocabulary ignores them.

Memory: 1.6M x 10,000 dense float32 counts would be 64 GB, so the reader keeps
token ids, int32 [N, L] padded with PAD_ID = -1 (L = longest kept tweet, at
most `max_tokens`), 0.15 to 0.4 GB for the full file. `bag_of_words` turns
any rows of it into counts.

The files are untrusted: every row must have six columns and an accepted
polarity, and a record may not span lines (the release has one tweet per
line; a record that does points at an unbalanced quote).
"""

import array
import csv
import dataclasses
import os
import re

import numpy as np

from fedjax_lama.data.data_errors import DataError

TRAIN_FILE = 'training.1600000.processed.noemoticon.csv'
TEST_FILE = 'testdata.manual.2009.06.14.csv'
NUM_CLASSES = 2
PAD_ID = -1
DEFAULT_VOCAB_SIZE = 10_000
DEFAULT_MAX_TOKENS = 128
# LEAF's `split_line` (leaf/models/utils/language_utils.py).
_TOKEN_RE = re.compile(r"[\w']+|[.,!?;]")
_NUM_COLUMNS = 6
_POLARITY = {'0': 0, '4': 1}


@dataclasses.dataclass
class Sentiment140:
  """Sentiment140 as token ids; see the module docstring.

  Attributes:
    train_tokens: int32 [N, L] vocabulary ids, padded with PAD_ID (-1).
    train_y: int32 [N], 0 negative, 1 positive.
    train_users: int32 [N], index into `users` (the account of each tweet).
    test_tokens: int32 [M, L], same vocabulary and padding.
    test_y: int32 [M].
    test_users: int32 [M], index into `users` (test-only accounts are
      appended after the training accounts).
    users: account names; training accounts first, in order of first
      appearance in the training file.
    vocab: the token of each id.
    test_neutral_dropped: neutral (polarity 2) test tweets left out.
    truncated: tweets with more than `max_tokens` in-vocabulary tokens (their
      tail is cut; real tweets have at most about 70 tokens).
  """
  train_tokens: np.ndarray
  train_y: np.ndarray
  train_users: np.ndarray
  test_tokens: np.ndarray
  test_y: np.ndarray
  test_users: np.ndarray
  users: list[str]
  vocab: list[str]
  test_neutral_dropped: int
  truncated: int


def tokenize(text: str, lowercase: bool = True) -> list[str]:
  """LEAF's Sent140 tokenisation: words (with apostrophes) and . , ! ? ;."""
  return _TOKEN_RE.findall(text.lower() if lowercase else text)


@dataclasses.dataclass
class _RawSplit:
  words: np.ndarray  # int32 word ids of every row's tokens, concatenated.
  lengths: np.ndarray  # Tokens per row.
  labels: np.ndarray
  users: np.ndarray  # int32 index into the shared account table.
  neutral: int


def _read_csv(path: str, allowed: dict[str, int | None], lowercase: bool,
              word_ids: dict[str, int], grow: bool,
              user_ids: dict[str, int]) -> _RawSplit:
  """Reads one Sentiment140 CSV; polarities mapped through `allowed`.

  Tokens become ids of `word_ids` as they are read (new words are added when
  `grow`, else they become -1), so 1.6M tweets never exist as Python strings
  at once. Accounts are numbered in `user_ids` in order of first appearance.
  """
  if not os.path.isfile(path):
    raise DataError(f'{path}: file not found')
  words, lengths, labels, users = (array.array('i'), array.array('q'),
                                   array.array('i'), array.array('i'))
  neutral = 0
  accepted = sorted(allowed)
  try:
    # latin-1 maps every byte to a character, so decoding cannot fail.
    with open(path, 'r', encoding='latin-1', newline='') as f:
      reader = csv.reader(f)
      line = 0
      for row in reader:
        if reader.line_num != line + 1:
          raise DataError(
              f'{path}: line {line + 1}: a record spans lines '
              f'{line + 1}-{reader.line_num} (an unbalanced quote?); '
              'Sentiment140 has one tweet per line')
        line = reader.line_num
        if len(row) != _NUM_COLUMNS:
          raise DataError(
              f'{path}: line {reader.line_num}: expected {_NUM_COLUMNS} '
              'columns (polarity, id, date, query, user, text), got '
              f'{len(row)}')
        polarity = row[0].strip()
        if polarity not in allowed:
          raise DataError(
              f'{path}: line {reader.line_num}: polarity must be one of '
              f'{accepted}, got {row[0]!r}')
        label = allowed[polarity]
        if label is None:
          neutral += 1
          continue
        toks = tokenize(row[5], lowercase)
        for t in toks:
          i = word_ids.get(t)
          if i is None:
            if grow:
              i = word_ids[t] = len(word_ids)
            else:
              i = -1
          words.append(i)
        lengths.append(len(toks))
        labels.append(label)
        u = user_ids.get(row[4])
        if u is None:
          u = user_ids[row[4]] = len(user_ids)
        users.append(u)
  except csv.Error as e:
    raise DataError(f'{path}: malformed CSV ({e})') from e
  except OSError as e:
    raise DataError(f'{path}: cannot be read ({e})') from e
  if not labels:
    raise DataError(f'{path}: no labelled tweets found')
  return _RawSplit(np.frombuffer(words, np.int32).copy(),
                   np.frombuffer(lengths, np.int64).copy(),
                   np.frombuffer(labels, np.int32).copy(),
                   np.frombuffer(users, np.int32).copy(), neutral)


def top_words(words: np.ndarray, names: list[str], vocab_size: int
              ) -> np.ndarray:
  """Ids of the `vocab_size` most frequent words, by count then by name."""
  counts = np.bincount(words, minlength=len(names))
  if counts.size > vocab_size:
    # Every word tied with the vocab_size-th count competes on its name.
    threshold = np.partition(counts, counts.size - vocab_size)[
        counts.size - vocab_size]
    candidates = np.flatnonzero(counts >= threshold)
  else:
    candidates = np.arange(counts.size)
  order = sorted(candidates.tolist(), key=lambda i: (-counts[i], names[i]))
  return np.asarray(order[:vocab_size], np.int64)


def _to_ids(split: _RawSplit, lut: np.ndarray, max_tokens: int):
  """Maps word ids to vocabulary ids and drops the rest (ragged triples)."""
  ids = np.where(split.words >= 0, lut[np.maximum(split.words, 0)], -1)
  row = np.repeat(np.arange(split.lengths.size), split.lengths)
  keep = ids >= 0
  ids, row = ids[keep].astype(np.int32), row[keep]
  lengths = np.bincount(row, minlength=split.lengths.size)
  starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
  position = np.arange(ids.size) - starts[row]
  truncated = int(np.sum(lengths > max_tokens))
  inside = position < max_tokens
  return ((ids[inside], row[inside], position[inside]),
          np.minimum(lengths, max_tokens), truncated)


def _pad(ragged, num_rows: int, width: int) -> np.ndarray:
  ids, row, position = ragged
  out = np.full((num_rows, width), PAD_ID, np.int32)
  out[row, position] = ids
  return out


def read_sentiment140(directory: str, vocab_size: int = DEFAULT_VOCAB_SIZE,
                      lowercase: bool = True,
                      max_tokens: int = DEFAULT_MAX_TOKENS) -> Sentiment140:
  """Reads the two Sentiment140 CSV files of `directory` (module docstring).

  Raises:
    DataError: a file is missing, a row does not have six columns, a polarity
      is not 0/4 (train) or 0/2/4 (test), the CSV is malformed, or a file has
      no labelled tweets.
  """
  word_ids, user_ids = {}, {}
  train = _read_csv(os.path.join(directory, TRAIN_FILE), _POLARITY, lowercase,
                    word_ids, True, user_ids)
  test = _read_csv(os.path.join(directory, TEST_FILE),
                   {**_POLARITY, '2': None}, lowercase, word_ids, False,
                   user_ids)
  names = list(word_ids)
  del word_ids
  chosen = top_words(train.words, names, vocab_size)
  lut = np.full(max(len(names), 1), -1, np.int64)
  lut[chosen] = np.arange(chosen.size)
  train_ragged, train_len, train_cut = _to_ids(train, lut, max_tokens)
  test_ragged, test_len, test_cut = _to_ids(test, lut, max_tokens)
  width = int(max(train_len.max(initial=0), test_len.max(initial=0), 1))
  return Sentiment140(
      _pad(train_ragged, train.labels.size, width), train.labels, train.users,
      _pad(test_ragged, test.labels.size, width), test.labels, test.users,
      list(user_ids), [names[i] for i in chosen], test.neutral,
      train_cut + test_cut)


def bag_of_words(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
  """Counts per row: float32 [n, vocab_size] from int [n, L] ids (PAD_ID -1).

  This is the logistic-regression input of FedAT Sentiment140 (3.6); the same
  map on device is `jax.nn.one_hot(tokens, vocab_size).sum(-2)` (one_hot of
  -1 is a zero row).
  """
  tokens = np.asarray(tokens)
  if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
    raise ValueError(
        f'tokens must be a 2-D integer array, got {tokens.dtype} '
        f'{tokens.shape}')
  if tokens.size and (tokens.min() < PAD_ID or tokens.max() >= vocab_size):
    raise ValueError(
        f'token ids must lie in [0, {vocab_size}) or be PAD_ID ({PAD_ID})')
  out = np.zeros((tokens.shape[0], vocab_size), np.float32)
  row, col = np.nonzero(tokens >= 0)
  linear, counts = np.unique(row.astype(np.int64) * vocab_size +
                             tokens[row, col], return_counts=True)
  out.reshape(-1)[linear] = counts
  return out
