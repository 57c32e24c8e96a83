"""Every test under benchmarks/ is in the slow set (`python -m pytest -m slow`): they run the
speed tools end to end, which the default suite leaves out to stay fast."""
import pathlib

import pytest

_BENCHMARKS = pathlib.Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects by marker
def pytest_collection_modifyitems(items):
  for item in items:
    if _BENCHMARKS in pathlib.Path(str(item.path)).resolve().parents:
      item.add_marker(pytest.mark.slow)
