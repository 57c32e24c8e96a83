"""Config files loaded from Python, from any directory: `load("configs/default.py")`.

The training command reads `--config=FILE[:ARG]` with ml_collections' config_flags; this does
the same for a notebook or a script: the file is imported as a module and its `get_config()`
(or `get_config(ARG)`) returned. A relative path is taken from the current directory, as on
the command line. While the file is imported, the directory above its folder is searched
first, so a config that imports a sibling (`from configs import fedat_fmnist`) finds it as it
does when run from the checkout's root.
"""
import importlib.util
import os
import sys
from typing import Optional

import ml_collections

from fedjax_lama.errors import ConfigError


def load(path: str, argument: Optional[str] = None) -> ml_collections.ConfigDict:
  """The ConfigDict of the config file `path` (`get_config()`, or `get_config(argument)`)."""
  path = os.path.abspath(os.path.expanduser(path))
  if not os.path.isfile(path) or not path.endswith(".py"):
    raise ConfigError(f"config file {path}: not found; accepted: a Python file defining "
                      "get_config(), e.g. configs/default.py of the checkout")
  spec = importlib.util.spec_from_file_location(
      f"_fedjax_lama_config_{os.path.splitext(os.path.basename(path))[0]}", path)
  module = importlib.util.module_from_spec(spec)
  package_root = os.path.dirname(os.path.dirname(path))
  sys.path.insert(0, package_root)
  try:
    spec.loader.exec_module(module)
  finally:
    sys.path.remove(package_root)
  if not callable(getattr(module, "get_config", None)):
    raise ConfigError(f"config file {path}: defines no get_config(); accepted: a Python file "
                      "defining get_config(), e.g. configs/default.py of the checkout")
  return module.get_config() if argument is None else module.get_config(argument)
