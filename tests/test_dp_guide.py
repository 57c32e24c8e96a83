"""docs/guide.md's privacy tables are the code's own answers (experiments/dp_guide.py).

- The committed text between the markers equals the generator's output: which algorithms a
  DP run accepts (every registered algorithm's program built under DP) and the noise a target
  epsilon puts on the default run's averaged update.
- The committed lists agree with the privacy contract's hand-made groups
  (tests/test_privacy_contract.py), and the personal-model algorithms are marked.
- The population table against a hand computation: std = sigma C / N on every coordinate, its
  norm sigma C sqrt(d) / N, and the smallest N at which that norm is at most C.
"""
import math
import re

import pytest

from experiments import dp_guide
from tests import test_privacy_contract as privacy_contract

D_DEFAULT = 64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10  # MLP (128, 128) on 8x8 digits


def _committed(section):
  return dp_guide.committed(dp_guide.GUIDE.read_text(), section)


@pytest.fixture(scope="module")
def generated():
  return dp_guide.sections()


def test_the_guide_holds_the_generators_output(generated):
  for section in dp_guide.SECTIONS:
    assert _committed(section) == generated[section], (
        f"docs/guide.md's {section!r} section differs from the code's: run "
        "python -m experiments.dp_guide --write")


def test_the_accepted_algorithms_are_the_privacy_contracts():
  text = _committed("algorithms")
  accepted_line = text[text.index("Accepted"):text.index("\n\n")]  # its first paragraph
  accepted = re.findall(r"`([a-z0-9_]+)`", accepted_line)
  refused = re.findall(r"^- `([a-z0-9_]+)`: (.*)$", text, re.M)
  assert sorted(accepted) == sorted(privacy_contract.DP_ACCEPTED)
  assert sorted(name for name, _ in refused) == sorted(privacy_contract.DP_REFUSED)
  for name, reason in refused:  # the reason the run's refusal names
    assert privacy_contract.DP_REFUSED[name] in reason, (name, reason)
  personal = re.findall(r"`([a-z0-9_]+)`\s+\(personal\)", accepted_line)
  assert sorted(personal) == ["apfl", "ditto", "fedbn", "fedper", "fedrep", "lg_fedavg", "pfedme"]


def test_the_population_table_against_a_hand_computation():
  text = _committed("population")
  assert f"d = {D_DEFAULT:,} parameters" in text and "C = 1," in text
  rows = [line for line in text.splitlines() if re.match(r"^\| \d", line)]
  assert [float(r.split("|")[1]) for r in rows] == list(dp_guide.EPSILONS)
  sigmas = []
  for row in rows:
    cells = [c.strip() for c in row.strip("|").split("|")]
    sigma = float(cells[1])
    sigmas.append(sigma)
    for n, cell in zip(dp_guide.POPULATIONS, cells[2:-1]):
      std, ratio = (float(x) for x in re.match(r"(\S+) \((\S+) C\)", cell).groups())
      assert std == pytest.approx(sigma / n, rel=5e-3)  # sigma C / N (C = 1), 3 digits
      assert ratio == pytest.approx(sigma * math.sqrt(D_DEFAULT) / n, rel=5e-3)
    needed = int(cells[-1].replace(",", ""))
    assert needed == pytest.approx(sigma * math.sqrt(D_DEFAULT), abs=2 + 1e-3 * needed)
  assert sigmas == sorted(sigmas, reverse=True)  # a smaller epsilon needs more noise


def test_rewrite_replaces_only_between_the_markers():
  text = "\n".join(["intro", dp_guide.begin_marker("algorithms"), "old", "lines",
                    dp_guide.end_marker("algorithms"), "outro"])
  assert dp_guide.rewrite(text, {"algorithms": "new"}) == "\n".join(
      ["intro", dp_guide.begin_marker("algorithms"), "new", dp_guide.end_marker("algorithms"),
       "outro"])
  with pytest.raises(ValueError, match="lacks the markers of section 'population'"):
    dp_guide.committed(text, "population")
