"""Shared test fixtures: where the real datasets are (tests skip when they are absent)."""
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


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
