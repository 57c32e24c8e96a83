"""The pages that teach the interface cannot drift from the code.

docs/algorithms.md walks through adding FedExP in full: its code blocks are extracted, each
must be the module's own code (fedjax_lama/algorithms/fedexp.py), and together they are
run as a module whose algorithm must train bit for bit as the registered one. The README's
algorithm table must name exactly the registry's algorithms.
"""
import pathlib
import re
import types

import jax
import numpy as np

from fedjax_lama import algorithms, registry
from fedjax_lama.algorithms import Common, fedexp
from tests.test_algorithm_reference import engine

REPO = pathlib.Path(__file__).resolve().parent.parent
WALKTHROUGH = "## Adding an algorithm, in full: FedExP"


def walkthrough_blocks() -> list[str]:
  page = (REPO / "docs" / "algorithms.md").read_text()
  start = page.index(WALKTHROUGH)
  end = page.index("\n## ", start + len(WALKTHROUGH))
  return re.findall(r"```python\n(.*?)```", page[start:end], re.S)


def test_walkthrough_blocks_are_the_modules_code():
  blocks = walkthrough_blocks()
  assert len(blocks) >= 4
  source = pathlib.Path(fedexp.__file__).read_text()
  for block in blocks:
    assert block in source, f"docs/algorithms.md shows code that is not fedexp.py's:\n{block}"
  # Together the blocks are the whole module after its docstring: nothing left out.
  body = source[source.index('"""', 3) + 3:]
  assert re.sub(r"\s+", "", "".join(blocks)) == re.sub(r"\s+", "", body)


def test_walkthrough_code_runs_and_trains_as_the_registered_algorithm():
  module = types.ModuleType("walkthrough_fedexp")
  exec(compile("\n".join(walkthrough_blocks()), "docs/algorithms.md", "exec"),  # pylint: disable=exec-used
       module.__dict__)
  (spec,) = module.SPECS
  assert spec.name == "fedexp"
  hp = module.Hparams(eps=1e-3, eval_average_last_two=True)
  from_page = spec.make(hp, Common())
  registered = algorithms.build("fedexp", eps=1e-3, eval_average_last_two=True)
  ours = engine(from_page, 3, steps=(2, 1))[0]
  theirs = engine(registered, 3, steps=(2, 1))[0]
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
    np.testing.assert_array_equal(a, b)
  assert float(from_page.server.report(ours)[1]["fedexp_eta_g"]) > 1.0  # it extrapolated


def readme_algorithm_names() -> set[str]:
  readme = (REPO / "README.md").read_text()
  start = readme.index("## Algorithms")
  end = readme.index("\n## ", start + 1)
  names = set()
  for line in readme[start:end].splitlines():
    if line.startswith("| `"):
      first_cell = line.split("|")[1]
      # The names are the backticked words before any parenthesis of options.
      names.update(re.findall(r"`([a-z0-9_]+)`", first_cell.split("(")[0]))
  return names


def test_readme_algorithm_table_is_the_registry():
  assert readme_algorithm_names() == set(registry.names())
