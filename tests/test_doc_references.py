"""Every reference in the library, its docs and its configs resolves.

A reader of a clone has the repository and the papers, nothing else. So a file under
fedjax_lama/, docs/, configs/, experiments/ or benchmarks/ (their tests aside), the README
or BUILD.md may cite a file of
the repository or a paper (authors, year, equation or algorithm line), and must not cite
a document the clone does not hold: a specification by section number, a design note,
codes of decisions recorded elsewhere, or a directory beside the checkout.

Each rule below is a regular expression over the file's text; every match is reported as
"path:line: text" so one run lists every place to rewrite.
"""

import json
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent

# The files a clone's reader meets: the library, its docs, configs, experiments and benchmarks.
SCANNED_DIRS = ("fedjax_lama", "docs", "configs", "experiments", "benchmarks", "third_party")
SCANNED_FILES = ("README.md", "BUILD.md")
SCANNED_SUFFIXES = (".py", ".md", ".ipynb", ".txt", ".sh", ".toml", ".cfg")

_SECTION = r"(?:§\s*)?(?:section\s+)?\d+(?:\.\d+)*"
_SECTION_NUMBER = r"[1-8]\.\d{1,2}(?:\.\d{1,2})?"
_CODE = r"[DC]\d{1,2}"

# (name, pattern): what each pattern finds is a citation of something not in the repository.
FORBIDDEN = (
    # The specification of the algorithms cited by section ("algorithms.md 5.3",
    # "algorithms.md section 8", "`algorithms.md` §1.4"). docs/algorithms.md is a page of
    # this repository without numbered sections, so a section number means the spec.
    ("spec section", re.compile(r"algorithms\.md`?\s*,?\s*\(?" + _SECTION, re.I)),
    ("spec decision", re.compile(r"algorithms\.md`?\s*,?\s*\(?" + _CODE + r"\b")),
    # The design note is not in the repository at all.
    ("design note", re.compile(r"\b(?:architecture|style|review)\.md\b")),
    ("sibling directory", re.compile(r"\.\./shared")),
    ("seed papers directory", re.compile(r"shared/(?:seeds|docs|data)\b")),
    ("pitfall number", re.compile(r"pitfalls?\s+\d+", re.I)),
    # Decision codes of the spec (D1-D25, C1-C11) where they stand as a citation: in
    # parentheses, in a list, as a range, before a colon, or as a possessive.
    ("decision code", re.compile(
        r"(?:(?<=[(\[])|(?<=[,;:] )|(?<=#\s)|(?<=# )|(?<=\band )|(?<=\bof )|(?<=\bchoices ))"
        + _CODE + r"\b"
        r"|\b" + _CODE + r"(?=\s*[),;:\]]|-[DC]\d|'s\b)")),
    # A bare section number in parentheses, "(5.10)" or "(1.6.3, 2.3)", the spec's
    # numbering without its name. Values in code stand after "(", "=" or ", " ("sgd(1.0)",
    # "(0.5, (1.2, 2.1))"), so only a parenthesis after a word and a space, or at a line's
    # start, counts.
    ("bare section number", re.compile(
        r"(?:(?<=[A-Za-z\]'\"`)] )|^)\((?:see |spec:? )?" + _SECTION_NUMBER
        + r"(?:(?:, | and | / |; )(?:" + _SECTION_NUMBER + r"|" + _CODE + r"))*\)", re.M)),
)

# In Python sources, a three-part number such as 3.1.6 is a section number: the code holds
# no version strings of that shape ("mnist:3.0.1", a dataset version, is excluded).
_PYTHON_SECTION = re.compile(r"(?<![\w.=/:'\"-])[1-8]\.\d{1,2}\.\d{1,2}(?![\w.])")

_MARKDOWN_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _scanned_paths():
  paths = [REPO / name for name in SCANNED_FILES if (REPO / name).exists()]
  for directory in SCANNED_DIRS:
    for path in sorted((REPO / directory).rglob("*")):
      if (path.is_file() and path.suffix in SCANNED_SUFFIXES
          and not {"__pycache__", "tests"} & set(path.relative_to(REPO).parts)):
        paths.append(path)
  return paths


def _text(path: pathlib.Path) -> str:
  text = path.read_text(encoding="utf-8")
  if path.suffix == ".ipynb":  # cells' sources, one cell after another; outputs excluded
    notebook = json.loads(text)
    text = "\n".join("".join(cell.get("source", ())) for cell in notebook.get("cells", ()))
  return text


def _resolves(target: str, path: pathlib.Path) -> bool:
  """A relative file reference resolves beside the citing file or at the repository root."""
  target = target.split("#", 1)[0]
  if not target:
    return True  # an anchor in the same page
  for base in (path.parent, REPO):
    candidate = (base / target).resolve()
    if candidate.exists() and (candidate == REPO or REPO in candidate.parents):
      return True
  return False


def unresolved_references(path: pathlib.Path):
  """Yields "path:line: reason: text" for every unresolved citation in one file."""
  text = _text(path)
  relative = path.relative_to(REPO)

  def where(offset):
    return text.count("\n", 0, offset) + 1

  for name, pattern in FORBIDDEN:
    for match in pattern.finditer(text):
      yield f"{relative}:{where(match.start())}: {name}: {match.group(0)!r}"
  if path.suffix == ".py":
    for match in _PYTHON_SECTION.finditer(text):
      yield f"{relative}:{where(match.start())}: section number: {match.group(0)!r}"
  if path.suffix in (".md", ".ipynb"):
    for match in _MARKDOWN_LINK.finditer(text):
      target = match.group(1)
      if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
        continue  # http:, https:, mailto: ...
      if not _resolves(target, path):
        yield f"{relative}:{where(match.start())}: missing link target: {target!r}"


def test_rules_find_what_they_are_meant_to_find():
  """Each rule on a line that breaks it, and on a near line that does not."""
  breaking = {
      "spec section": ["See algorithms.md 5.3.", "(`algorithms.md` §1.4)",
                       "algorithms.md section 8"],
      "spec decision": ["(algorithms.md D23)"],
      "design note": ["the run contract (architecture.md 3)"],
      "sibling directory": ["../shared/docs/review.md"],
      "seed papers directory": ["SC'21, shared/seeds/003.txt"],
      "pitfall number": ["(6.3 pitfall 12)"],
      "decision code": ["(D13)", "algorithms.md 1.4, D1-D25", "# D23: the test set",
                        "uniform weights (C10), beta", "D24's rule"],
      "bare section number": ["FedPAQ (5.10) on the", "known answers (1.6.3, D22)"],
  }
  clean = ["optax.sgd(1.0)", "a ratio of 0.451 at 0b0a054", "docs/algorithms.md",
           "Reddi et al., 2021, Algorithm 2", "conv2D and C-order", "jax 0.4.30", "H100 D2H"]
  assert _PYTHON_SECTION.search("H of 3.1.4 (the budget)")
  assert _PYTHON_SECTION.search("(3.2.1 step 5)")
  assert not _PYTHON_SECTION.search("'mnist:3.0.1'")
  assert not _PYTHON_SECTION.search("jax==0.4.30, 1.2")
  for name, pattern in FORBIDDEN:
    for line in breaking[name]:
      assert pattern.search(line), (name, line)
    for line in clean:
      assert not pattern.search(line), (name, line)


def test_markdown_links_resolve_inside_the_repository():
  page = REPO / "docs" / "results.md"
  assert _resolves("../README.md", page)
  assert _resolves("results.md#reproducing", page)
  assert not _resolves("../../shared/docs/algorithms.md", page)
  assert not _resolves("missing_page.md", page)


@pytest.mark.parametrize("path", _scanned_paths(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_reference_resolves(path):
  problems = list(unresolved_references(path))
  assert not problems, "unresolved references (cite a file of the repository or a paper):\n" + (
      "\n".join(problems))
