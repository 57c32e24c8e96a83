"""experiments/dp_calibration.py: the StackOverflow setting calibrated beside its references."""
import os
import pathlib
import subprocess
import sys

import pytest

from experiments import dp_calibration
from fedjax_lama.privacy import accounting

REPO = pathlib.Path(__file__).resolve().parent.parent


def test_the_rdp_calibration_matches_its_reference():
  (row,) = dp_calibration.calibration_rows(["rdp"])
  assert row["sigma"] == pytest.approx(dp_calibration.REFERENCE["rdp"], abs=1e-4)
  assert row["epsilon"].epsilon <= dp_calibration.TARGET_EPSILON
  assert row["epsilon"].epsilon == pytest.approx(dp_calibration.TARGET_EPSILON, abs=1e-4)
  text = dp_calibration.format_rows([row])
  assert "RDP        |       0.9401 |      2.0000 |            0.9401 |" in text
  assert f"dp-accounting {accounting.LIBRARY_VERSION}" in text


@pytest.mark.slow
def test_the_program_prints_both_accountants():
  env = dict(os.environ, PYTHONPATH=str(REPO))
  out = subprocess.run([sys.executable, "-m", "experiments.dp_calibration"], cwd=REPO, env=env,
                       capture_output=True, text=True, check=True, timeout=600).stdout
  lines = out.splitlines()
  rdp = next(line for line in lines if line.startswith("RDP"))
  pld = next(line for line in lines if line.startswith("PLD"))
  ours_rdp, eps_rdp = (float(x) for x in rdp.split("|")[1:3])
  ours_pld, eps_pld = (float(x) for x in pld.split("|")[1:3])
  assert ours_rdp == pytest.approx(0.9401, abs=1e-4) and eps_rdp <= 2.0
  # The PLD accountant is tighter: less noise for the same target.
  assert 0.86 < ours_pld < ours_rdp and eps_pld <= 2.0
  assert "0.8647" in pld
