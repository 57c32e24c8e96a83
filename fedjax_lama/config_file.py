"""Config files loaded from Python, from any directory: `load("configs/default.py")`.

The training command (experiments/main.py) and a notebook or a script load a config file the
same way: the file is imported as a module and its `get_config()` (or `get_config(ARG)`)
returned. A relative path is taken from the current directory, as on the command line. While
the file is imported, the directory above its folder is searched first, so a config that
imports a sibling (`from configs import fedat_fmnist`) finds it as it does when run from the
checkout's root. Whatever goes wrong (no such file, a file that raises, no get_config()) stops
with one ConfigError naming the file.
"""
import importlib.util
import os
import sys
from typing import Optional

import ml_collections

from fedjax_lama.errors import ConfigError

_ACCEPTED = "accepted: a Python file defining get_config(), e.g. configs/default.py of the checkout"


def _exception_line(e: BaseException) -> str:
  if isinstance(e, SyntaxError):
    return f"SyntaxError: {e.msg} (line {e.lineno})"
  return f"{type(e).__name__}: {e}"


def load(path: str, argument: Optional[str] = None) -> ml_collections.ConfigDict:
  """The ConfigDict of the config file `path` (`get_config()`, or `get_config(argument)`)."""
  path = os.path.abspath(os.path.expanduser(path))
  if os.path.isdir(path):
    raise ConfigError(f"config file {path} is a directory; {_ACCEPTED}")
  if not os.path.isfile(path) or not path.endswith(".py"):
    raise ConfigError(f"config file {path}: not found (no such file); {_ACCEPTED}")
  spec = importlib.util.spec_from_file_location(
      f"_fedjax_lama_config_{os.path.splitext(os.path.basename(path))[0]}", path)
  module = importlib.util.module_from_spec(spec)
  package_root = os.path.dirname(os.path.dirname(path))
  sys.path.insert(0, package_root)
  try:
    spec.loader.exec_module(module)
  except Exception as e:  # the file is the user's: whatever it raises is its problem
    raise ConfigError(f"config file {path} cannot be loaded: {_exception_line(e)}") from e
  finally:
    sys.path.remove(package_root)
  if not callable(getattr(module, "get_config", None)):
    raise ConfigError(f"config file {path}: defines no get_config(); {_ACCEPTED}")
  try:
    config = module.get_config() if argument is None else module.get_config(argument)
  except Exception as e:
    raise ConfigError(f"config file {path}: get_config({argument or ''}) raised "
                      f"{_exception_line(e)}") from e
  if not isinstance(config, ml_collections.ConfigDict):
    raise ConfigError(f"config file {path}: get_config() returned a {type(config).__name__}; "
                      "accepted: an ml_collections.ConfigDict")
  return config
