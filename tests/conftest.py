"""Shared test fixtures: where the real datasets are (tests skip when they are absent)."""
import os
import pathlib

import pytest

# Tests compare results, never speed: XLA's cheapest CPU backend settings cut compilation
# time (most of the suite's time) without changing what is computed. Set before JAX starts;
# a caller's own XLA_FLAGS win.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 "
                      "--xla_llvm_disable_expensive_passes=true")

REPO = pathlib.Path(__file__).resolve().parent.parent
# The tests' own fallback for the real datasets (the library's default is ./data): the
# checkout's sibling shared/data, where it exists and $FEDJAX_LAMA_DATA_DIR is not set.
if (REPO.parent / "shared" / "data").is_dir():
  os.environ.setdefault("FEDJAX_LAMA_DATA_DIR", str(REPO.parent / "shared" / "data"))


def shared_data_dir() -> pathlib.Path:
  return pathlib.Path(os.environ.get("FEDJAX_LAMA_DATA_DIR", REPO.parent / "shared" / "data"))


def shared_data_dir_or_skip() -> str:
  """The real datasets' directory; skips the calling test when it is absent."""
  path = shared_data_dir()
  if not path.exists():
    pytest.skip(f"real datasets not found at {path} (set FEDJAX_LAMA_DATA_DIR)")
  return str(path)


@pytest.fixture
def data_dir():
  return pathlib.Path(shared_data_dir_or_skip())
