"""Shared test fixtures: where the real datasets are (tests skip when they are absent)."""
import contextlib
import os
import pathlib
import tempfile

import pytest

# Tests compare results, never speed: XLA's cheapest CPU backend settings cut compilation
# time (most of the suite's time) without changing what is computed. Set before JAX starts;
# a caller's own XLA_FLAGS win.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 "
                      "--xla_llvm_disable_expensive_passes=true")

# Most of the suite's time is compiling, and many tests compile the same small programs
# (the same model and algorithm in several files): XLA's persistent cache serves those from
# disk after their first compilation, in every worker, whatever their size or compile time.
# A cached executable computes exactly what a fresh compile of the same program does. The
# tests that count compilations turn it off while they count (`counting_compilations`).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), "fedjax_lama_tests_xla_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

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


@contextlib.contextmanager
def counting_compilations():
  """XLA's persistent cache off while a test counts backend compilations: a program compiled
  again must count, not be served from disk."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=g-import-not-at-top
  enabled = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", enabled)
    compilation_cache.reset_cache()
