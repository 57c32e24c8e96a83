"""The repository's shape: one name per module, imports that flow one way, dependencies
that are used and pinned, documented commands that exist, config files that load from any
directory, and a package that installs from a clean copy and imports from elsewhere."""
import collections
import os
import pathlib
import re
import subprocess
import sys
import tomllib
import venv

from packaging.utils import canonicalize_name as canonical
import pytest

from fedjax_lama import config_file
from fedjax_lama.errors import ConfigError

REPO = pathlib.Path(__file__).resolve().parent.parent

_SOURCE_FOLDERS = ("fedjax_lama", "experiments", "benchmarks", "third_party", "tests")


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
  assert module_basename_clashes(REPO / "fedjax_lama") == {}


def test_no_library_module_shadows_a_standard_library_module():
  # A module named like one of Python's (`codecs`, `platform`) hides it from any script run
  # from its folder and misleads a reader of `import codecs`.
  shadows = [path.relative_to(REPO).as_posix() for path in sorted((REPO / "fedjax_lama").rglob("*"))
             if (path.suffix == ".py" or path.is_dir()) and path.stem in sys.stdlib_module_names]
  assert not shadows


def test_the_library_imports_none_of_the_tools_around_it():
  # Imports flow one way: experiments/, benchmarks/ and third_party/ use fedjax_lama, never
  # the reverse, so an installed package (which holds fedjax_lama/ only) imports.
  pattern = re.compile(r"^\s*(from|import) (experiments|benchmarks|third_party|configs|tests)\b",
                       re.MULTILINE)
  offenders = [path.relative_to(REPO).as_posix()
               for path in sorted((REPO / "fedjax_lama").rglob("*.py"))
               if pattern.search(path.read_text())]
  assert not offenders


def test_the_clash_check_finds_a_clash(tmp_path):
  for relative in ("a/metrics.py", "b/metrics.py", "b/__init__.py", "a/__init__.py",
                   "c/ok.py"):
    (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / relative).write_text("")
  assert module_basename_clashes(tmp_path) == {"metrics.py": ["a/metrics.py", "b/metrics.py"]}
  assert module_basename_clashes(tmp_path, frozenset({"b/metrics.py"})) == {}


def test_config_files_load_from_any_directory_with_their_siblings(tmp_path, monkeypatch):
  folder = tmp_path / "project" / "my_configs"
  folder.mkdir(parents=True)
  (folder / "base.py").write_text(
      "import ml_collections\n"
      "def get_config(rounds='3'):\n"
      "  return ml_collections.ConfigDict({'rounds': int(rounds), 'algorithm': 'fedavg'})\n")
  (folder / "child.py").write_text(
      "from my_configs import base\n"
      "def get_config():\n"
      "  c = base.get_config()\n"
      "  c.algorithm = 'scaffold'\n"
      "  return c\n")
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  monkeypatch.chdir(elsewhere)
  monkeypatch.delitem(sys.modules, "my_configs", raising=False)
  try:
    child = config_file.load(str(folder / "child.py"))
    assert (child.algorithm, child.rounds) == ("scaffold", 3)
    assert config_file.load("../project/my_configs/base.py", "7").rounds == 7
  finally:
    sys.modules.pop("my_configs", None)
    sys.modules.pop("my_configs.base", None)
  assert str(tmp_path / "project") not in sys.path


def test_the_checkouts_default_config_loads_as_the_command_reads_it():
  from configs import default  # pylint: disable=g-import-not-at-top
  assert config_file.load(str(REPO / "configs" / "default.py")) == default.get_config()


@pytest.mark.parametrize("text, message", [
    (None, "not found"), ("x = 1\n", "defines no get_config")])
def test_a_bad_config_file_is_refused_naming_it(tmp_path, text, message):
  path = tmp_path / "config.py"
  if text is not None:
    path.write_text(text)
  with pytest.raises(ConfigError, match=f"config file {path}: {message}"):
    config_file.load(str(path))


# Distribution names whose import name differs.
_IMPORT_NAMES = {"ml-collections": "ml_collections", "absl-py": "absl",
                 "orbax-checkpoint": "orbax", "tensorflow-datasets": "tensorflow_datasets",
                 "scikit-learn": "sklearn", "pillow": "PIL"}


# Pytest plugins the suite uses through an option of pytest.ini rather than an import.
_PLUGINS_USED_BY_OPTION = {"pytest-xdist": " -n "}


def test_every_declared_dependency_is_imported_somewhere():
  """pyproject.toml lists nothing the project does not use (tqdm was once listed, unused)."""
  project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  declared = list(project["dependencies"])
  for extra in project["optional-dependencies"].values():
    declared += [r for r in extra if not r.startswith(project["name"])]
  sources = "\n".join(p.read_text() for folder in _SOURCE_FOLDERS if (REPO / folder).is_dir()
                      for p in (REPO / folder).rglob("*.py"))
  for requirement in declared:
    name = re.match(r"[A-Za-z0-9._-]+", requirement).group()
    module = _IMPORT_NAMES.get(name.lower(), name.replace("-", "_"))
    if name in _PLUGINS_USED_BY_OPTION:  # a pytest plugin: used through pytest.ini's options
      assert _PLUGINS_USED_BY_OPTION[name] in (REPO / "pytest.ini").read_text(), name
      continue
    assert any(f"{how}{module}" in sources for how in (
        "import ", "from ", 'importorskip("', "importorskip('")), name


def test_constraints_pin_every_declared_dependency():
  pinned = {canonical(line.split("==")[0]) for line in
            (REPO / "constraints.txt").read_text().splitlines() if "==" in line}
  project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  declared = list(project["dependencies"])
  for extra in project["optional-dependencies"].values():
    declared += [r for r in extra if not r.startswith(project["name"])]
  missing = {canonical(re.match(r"[A-Za-z0-9._-]+", r).group()) for r in declared} - pinned
  assert not missing


def _documented_commands() -> dict:
  """{`python -m module` named in a document or a config: [files]}."""
  texts = [REPO / "README.md", REPO / "BUILD.md", *(REPO / "docs").glob("*.md"),
           *(REPO / "benchmarks").glob("*.md"), *(REPO / "configs").glob("*.py"),
           REPO / "experiments" / "notebook.ipynb", REPO / "requirements-peers.txt"]
  commands = collections.defaultdict(list)
  for path in texts:
    if path.is_file():
      for module in re.findall(r"python3? -m ([A-Za-z_][\w.]*)", path.read_text()):
        commands[module].append(path.relative_to(REPO).as_posix())
  return commands


def test_every_documented_command_names_a_module_of_the_checkout():
  # A moved tool leaves no stale command line behind in the README, the docs or the configs.
  stale = {}
  for module, files in _documented_commands().items():
    top = module.split(".")[0]
    if top in ("pip", "venv", "pytest", "ipykernel", "ipykernel_launcher", "tensorboard"):
      continue
    if not (REPO / (module.replace(".", "/") + ".py")).is_file():
      stale[module] = sorted(set(files))
  assert not stale


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
  venv.EnvBuilder(system_site_packages=True).create(environment)
  python = str(environment / "bin" / "python")
  # This interpreter's pip installs into the new environment (pip's --python); the build
  # backend (setuptools) comes from the package index into pip's isolated build environment.
  install = [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--quiet"]
  subprocess.run(install + (["-e", str(checkout)] if editable else [str(checkout)]),
                 check=True, cwd=tmp_path)
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  imported = subprocess.run(
      [python, "-c", "import sys, fedjax_lama, fedjax_lama.algorithms, fedjax_lama.cli.logs; "
       "from fedjax_lama import config_file; print(fedjax_lama.__file__); "
       "print(config_file.load(sys.argv[1]).algorithm)", str(checkout / "configs" / "default.py")],
      cwd=elsewhere, env=env, check=True, capture_output=True, text=True).stdout.split()
  assert pathlib.Path(imported[0]).is_relative_to(checkout if editable else environment)
  assert imported[1] == "fedavg"
