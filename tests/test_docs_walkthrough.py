"""The pages that teach the interface cannot drift from the code.

docs/algorithms.md walks through adding FedExP in full: its code blocks are extracted, each
must be the module's own code (fedjax_lama/algorithms/fedexp.py), and together they are
run as a module whose algorithm must train bit for bit as the registered one. docs/stages.md
walks through adding MeaMed as a defence and automatic clipping as DP's clipping rule, each
one module and one registration: the blocks must be the module's code and the registry's
line, and the code run from the page must match a numpy reference written here. The README's
algorithm table must name exactly the registry's algorithms.
"""
import pathlib
import re
import types

import jax
import numpy as np
import pytest

from fedjax_lama import algorithms, registry
from fedjax_lama import config as config_lib
from fedjax_lama.algorithms import Common, fedexp
from fedjax_lama.engine import stages
from fedjax_lama.errors import ConfigError, HparamError
from fedjax_lama.privacy import (AdaptiveClipOptions, DpOptions, SamplingOptions, automatic_clip,
                                 clipping, mechanisms)
from fedjax_lama.robust import defences, meamed
from fedjax_lama.run import spec as spec_lib
from tests import test_robust_runs as robust_runs
from tests import test_sharding as helpers
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
  assert float(from_page.report(ours)[1]["fedexp_eta_g"]) > 1.0  # it extrapolated


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


# ---- docs/stages.md: a defence and a clipping rule, each one module and one registration ----
STAGES_PAGE = REPO / "docs" / "stages.md"
MEAMED = "## Adding a defence, in full: MeaMed"
AUTOMATIC = "## Adding a clipping rule, in full: automatic clipping"


def section_blocks(title: str) -> list[str]:
  page = STAGES_PAGE.read_text()
  start = page.index(title)
  end = page.find("\n## ", start + len(title))
  return re.findall(r"```python\n(.*?)```", page[start:end if end >= 0 else None], re.S)


def run_section(title: str, module_file: str, registry_file: str) -> types.ModuleType:
  """The section's code run as a module, once checked: all blocks but the last are the whole
  module after its docstring; the last is the registration, a line of the registry's own
  source."""
  *module_blocks, registration = section_blocks(title)
  source = pathlib.Path(module_file).read_text()
  for block in module_blocks:
    assert block in source, f"docs/stages.md shows code that is not {module_file}'s:\n{block}"
  body = source[source.index('"""', 3) + 3:]
  assert re.sub(r"\s+", "", "".join(module_blocks)) == re.sub(r"\s+", "", body)
  assert registration.strip() in pathlib.Path(registry_file).read_text()
  module = types.ModuleType("walkthrough_" + pathlib.Path(module_file).stem)
  exec(compile("\n".join(module_blocks), "docs/stages.md", "exec"), module.__dict__)  # pylint: disable=exec-used
  return module


def numpy_meamed(x: np.ndarray, f: int) -> np.ndarray:
  """Xie, Koyejo, Gupta 2018, Definition 5, one coordinate at a time in float64: of the n
  values, the n - f nearest the median (ties: the lower client), averaged."""
  n = x.shape[0]
  flat = x.reshape(n, -1).astype(np.float64)
  out = np.empty(flat.shape[1])
  for j in range(flat.shape[1]):
    column = flat[:, j]
    order = np.argsort(np.abs(column - np.median(column)), kind="stable")
    out[j] = column[order[:n - f]].mean()
  return out.reshape(x.shape[1:])


def test_meamed_walkthrough_is_the_module_and_matches_numpy():
  page = run_section(MEAMED, meamed.__file__, defences.__file__)
  assert defences.DEFENCES["meamed"].build is meamed.stage
  rng = np.random.default_rng(0)
  real, padded, f = 9, 3, 2
  values = {"kernel": rng.normal(size=(real + padded, 4, 3)).astype(np.float32),
            "bias": rng.standard_cauchy(size=(real + padded, 3)).astype(np.float32)}
  values["kernel"][real:] = np.nan  # padded slots' garbage must never enter
  values["bias"][real:] = -1e30
  values["bias"][[1, 4], 0] = values["bias"][7, 0]  # ties in the distance to the median
  mask = np.array([1.0] * real + [0.0] * padded, np.float32)
  stage = page.stage(f)
  assert stage.consumes == stages.STACK and stage.reduces and stage.client is None
  stack = stages.Stack(jax.tree.map(jax.numpy.asarray, values), mask, mask)
  got, state, scalars = jax.jit(stage.server)(stack, stage.init(None), jax.random.PRNGKey(0))
  assert state == () and bool(scalars["valid"])
  for k, v in values.items():
    np.testing.assert_allclose(np.asarray(got[k]), numpy_meamed(v[:real], f), rtol=1e-6,
                               atol=1e-6)
  # Neither the plain mean nor the median: MeaMed is its own rule on this stack.
  assert not np.allclose(np.asarray(got["kernel"]), np.median(values["kernel"][:real], 0))
  assert not np.allclose(np.asarray(got["kernel"]), values["kernel"][:real].mean(0))
  # The registered rule is the page's: the same numbers.
  registered, _, _ = defences.build("meamed", f).server(stack, (), jax.random.PRNGKey(0))
  for k in values:
    np.testing.assert_array_equal(np.asarray(registered[k]), np.asarray(got[k]))


def test_meamed_runs_from_the_config_with_its_bound_and_fields_checked():
  config = robust_runs.robust_config("meamed", "sign_flip", rounds=2)
  program = helpers.build(config, robust_runs.MESH)
  assert program.opts.aggregator.name == "(attack[sign_flip], meamed)"
  state, outs = helpers.run(program)
  assert all(o.extra["aggregator_valid"] == 1.0 for o in outs)
  assert all(np.all(np.isfinite(np.asarray(x)))
             for x in jax.tree.leaves(state["server"].params))
  # 10 clients a round: n > 2f allows f <= 4.
  with pytest.raises(ConfigError, match=r"config\.robust\.f=5 .* meamed needs n > 2f .* "
                                        r"f <= 4"):
    spec_lib.build_spec(robust_runs.robust_config("meamed", **{"robust.f": 5}))
  unset = robust_runs.robust_config("meamed")
  unset.robust.f = None
  with pytest.raises(ConfigError, match=r"config\.robust\.f is not set; accepted with "
                                        r"config\.robust\.defence='meamed'"):
    spec_lib.build_spec(unset)
  with pytest.raises(ConfigError, match=r"config\.robust\.beta has no effect with "
                                        r"config\.robust\.defence='meamed'"):
    config_lib.check_overrides(config, ["robust.beta"])


def test_automatic_clipping_walkthrough_is_the_module_and_matches_numpy():
  page = run_section(AUTOMATIC, automatic_clip.__file__, clipping.__file__)
  assert clipping.CLIPPINGS["automatic"].clip is automatic_clip.clip
  rng = np.random.default_rng(1)
  clip_norm, clients = 1.5, 7
  scales = np.exp(rng.uniform(-3, 2, clients))
  updates = [{"w": (rng.normal(size=(4, 3)) * s).astype(np.float32),
              "b": (rng.normal(size=(3,)) * s).astype(np.float32)} for s in scales]
  for u in updates:  # one client at a time, as the paper states the rule
    norm = np.sqrt(sum(np.sum(np.square(v.astype(np.float64))) for v in u.values()))
    got, got_norm = page.clip(jax.tree.map(jax.numpy.asarray, u), clip_norm)
    assert float(got_norm) == pytest.approx(norm, rel=1e-6)
    for k in u:
      np.testing.assert_allclose(np.asarray(got[k]), clip_norm * u[k] / (norm + 0.01),
                                 rtol=1e-5, atol=1e-7)
    clipped_norm = np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64)))
                               for x in jax.tree.leaves(got)))
    assert clipped_norm < clip_norm
  # Registered: DP-FedAvg's stage with it, without noise, is the numpy mean of the clipped
  # updates over the expected cohort.
  options = DpOptions(noise_multiplier=0.0, clip_norm=clip_norm, delta=1e-3,
                      clipping="automatic",
                      sampling=SamplingOptions("poisson", 70, rate=0.1))
  stage = mechanisms.user_level_dp(options)
  stacked = jax.tree.map(lambda *xs: jax.numpy.asarray(np.stack(xs)), *updates)
  out = jax.vmap(stage.client, in_axes=(0, None, 0))(
      stacked, stage.init(None), jax.random.split(jax.random.PRNGKey(0), clients))
  summed = jax.tree.map(lambda x: x.sum(0), out)
  value, _, _ = stage.server(stages.Sums(summed, jax.numpy.float32(clients)), stage.init(None),
                             jax.random.PRNGKey(1))
  for k in updates[0]:
    want = sum(clip_norm * u[k].astype(np.float64)
               / (np.sqrt(sum(np.sum(np.square(v.astype(np.float64))) for v in u.values()))
                  + 0.01) for u in updates) / options.sampling.expected_cohort
    np.testing.assert_allclose(np.asarray(value[k]), want, rtol=1e-5, atol=1e-7)
  with pytest.raises(HparamError, match=r"privacy\.clipping='automatic'.*'flat' when "
                                        r"privacy\.adaptive is set"):
    DpOptions(noise_multiplier=1.0, clip_norm=1.0, delta=1e-3, clipping="automatic",
              sampling=SamplingOptions("poisson", 70, rate=0.1),
              adaptive=AdaptiveClipOptions())
