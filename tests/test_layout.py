"""The repository's shape: one name per module, and a package that installs and imports."""
import collections
import os
import pathlib
import subprocess
import sys
import venv

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent

# Pairs that still share a name, until the model zoo's split renames them.
_KNOWN_CLASHES = frozenset({"models/registry.py", "models/layers.py"})


def module_basename_clashes(package: pathlib.Path, allowed=frozenset()) -> dict:
  """{basename: [paths relative to package]} for module names used more than once."""
  by_name = collections.defaultdict(list)
  for path in sorted(package.rglob("*.py")):
    relative = path.relative_to(package).as_posix()
    if path.name == "__init__.py" or relative in allowed:
      continue
    by_name[path.name].append(relative)
  return {name: paths for name, paths in by_name.items() if len(paths) > 1}


def test_no_two_library_modules_share_a_name():
  # Two `config.py` or `metrics.py` with unrelated meanings make imports and tracebacks
  # ambiguous to a reader.
  assert module_basename_clashes(REPO / "fedjax_lama", _KNOWN_CLASHES) == {}


def test_the_clash_check_finds_a_clash(tmp_path):
  for relative in ("a/metrics.py", "b/metrics.py", "b/__init__.py", "a/__init__.py",
                   "c/ok.py"):
    (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / relative).write_text("")
  assert module_basename_clashes(tmp_path) == {"metrics.py": ["a/metrics.py", "b/metrics.py"]}
  assert module_basename_clashes(tmp_path, frozenset({"b/metrics.py"})) == {}


def _clean_copy(destination: pathlib.Path) -> None:
  """The files git tracks (and untracked ones it does not ignore), nothing built or cached."""
  listed = subprocess.run(
      ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
      check=True, capture_output=True).stdout.decode().split("\0")
  for relative in filter(None, listed):
    source = REPO / relative
    if not source.is_file():  # deleted in the work tree but not yet in the index
      continue
    target = destination / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(source.read_bytes())


@pytest.mark.slow
@pytest.mark.parametrize("editable", [False, True], ids=["wheel", "editable"])
def test_installs_from_a_clean_copy_and_imports_from_elsewhere(tmp_path, editable):
  # A fresh virtual environment that sees the already installed dependencies (jax etc.,
  # so nothing is downloaded); the project itself is installed from a copy of the checkout
  # and imported from a directory outside it.
  if subprocess.run(["git", "rev-parse"], cwd=REPO, capture_output=True).returncode:
    pytest.skip(f"{REPO} is not a git checkout")
  checkout = tmp_path / "checkout"
  _clean_copy(checkout)
  environment = tmp_path / "venv"
  venv.EnvBuilder(system_site_packages=True, with_pip=True).create(environment)
  python = str(environment / "bin" / "python")
  install = [python, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
             "--no-index", "--quiet"]
  subprocess.run(install + (["-e", str(checkout)] if editable else [str(checkout)]),
                 check=True, cwd=tmp_path)
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  imported = subprocess.run(
      [python, "-c", "import fedjax_lama, fedjax_lama.algorithms, fedjax_lama.cli.logs; "
       "from fedjax_lama import configs; print(fedjax_lama.__file__); "
       "print(configs.load('default').algorithm)"],
      cwd=elsewhere, env=env, check=True, capture_output=True, text=True).stdout.split()
  assert pathlib.Path(imported[0]).is_relative_to(checkout if editable else environment)
  assert imported[1] == "fedavg"
