"""experiments.sweep: a diverged run is finished (recorded, reused), and it never stops the
runs beside it, whether they train together or one after another; tuning widens its grid
while the pick sits at an edge."""
import math
import os

import pytest

from experiments import sweep
from fedjax_lama import training
from fedjax_lama.config import ConfigError
from tests.test_training import tiny_config


def _mtime(workdir):
  return os.path.getmtime(os.path.join(workdir, "metrics.jsonl"))


@pytest.mark.slow
@pytest.mark.parametrize("together", [True, False])
def test_divergence_is_recorded_reused_and_spares_the_other_runs(tmp_path, together):
  # Runs differing only in local_lr train together; a different local_steps forces the
  # one-after-another path (where the first error used to stop the rest).
  bad = tiny_config(local_lr=1e30)
  good = tiny_config(local_lr=0.1, local_steps=3 if together else 2)
  workdirs = [str(tmp_path / "bad"), str(tmp_path / "good")]
  first = sweep.run_group([bad, good], workdirs)
  assert isinstance(first[0], training.DivergenceError)
  assert "non-finite" in str(first[0])
  assert first[1]["rounds"] == 4 and first[1]["records"]
  assert os.path.exists(os.path.join(workdirs[0], sweep.DIVERGED))
  stamps = [_mtime(w) for w in workdirs]
  again = sweep.run_group([bad, good], workdirs)  # nothing trains again
  assert [_mtime(w) for w in workdirs] == stamps
  assert isinstance(again[0], training.DivergenceError)
  assert "recorded in" in str(again[0]) and "non-finite" in str(again[0])
  assert again[1]["final_test_accuracy"] == first[1]["final_test_accuracy"]
  with pytest.raises(training.DivergenceError, match="recorded in"):
    sweep.run(bad, workdirs[0])


def test_a_divergence_record_of_another_config_is_not_reused(tmp_path):
  bad = tiny_config(local_lr=1e30)
  with pytest.raises(training.DivergenceError):
    sweep.run(bad, str(tmp_path))
  with pytest.raises(ConfigError, match="different config"):
    sweep.run(tiny_config(local_lr=1e30, num_clients=6), str(tmp_path))


def test_an_unreadable_divergence_record_names_the_file(tmp_path):
  bad = tiny_config(local_lr=1e30)
  with pytest.raises(training.DivergenceError):
    sweep.run(bad, str(tmp_path))
  (tmp_path / sweep.DIVERGED).write_text("{not json")
  with pytest.raises(ConfigError, match="diverged.json is not a divergence record"):
    sweep.run(bad, str(tmp_path))


def _fake_tuning(monkeypatch, score_of):
  """run_group replaced by a validation score per learning rate; records what it was asked."""
  asked = []

  def run_group(configs, workdirs):
    asked.append(sorted(c for c in configs))
    return [{"records": [{"val_accuracy": score_of(c)}]} for c in configs]

  monkeypatch.setattr(sweep, "run_group", run_group)
  return asked


GRID = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3)


@pytest.mark.parametrize("best,tried", [
    (0.3, [0.01, 0.03, 0.1, 0.3]),            # top edge: widens upward to the grid's end
    (0.003, [0.001, 0.003, 0.01, 0.03, 0.1]),  # bottom edge: widens until the pick is inside
    (0.03, [0.01, 0.03, 0.1]),                # inside: nothing more is tried
])
def test_tune_widening_steps_out_while_the_pick_is_at_an_edge(monkeypatch, best, tried):
  # A single-peaked validation score with its peak at `best` (the config is the rate itself).
  asked = _fake_tuning(monkeypatch, lambda lr: -abs(math.log(lr / best)))
  result = sweep.tune_widening(lambda lr, seed: lr, [0.01, 0.03, 0.1], 0, lambda lr, s: "",
                               GRID)
  assert result.value == best
  assert sorted(result.scores) == tried
  assert asked[-1] == tried


def test_tune_widening_stops_at_a_diverged_neighbour(monkeypatch):
  # Higher is better up to 0.1; 0.3 diverges (-inf), so the pick 0.1 stays.
  _fake_tuning(monkeypatch, lambda lr: float("-inf") if lr > 0.2 else lr)
  result = sweep.tune_widening(lambda lr, seed: lr, [0.01, 0.03, 0.1], 0, lambda lr, s: "",
                               GRID)
  assert result.value == 0.1 and sorted(result.scores) == [0.01, 0.03, 0.1, 0.3]


def test_tune_widening_refuses_values_off_its_grid():
  with pytest.raises(ValueError, match=r"\[0.05\] are not points of the grid"):
    sweep.tune_widening(lambda lr, seed: lr, [0.01, 0.05], 0, lambda lr, s: "", GRID)


def test_tune_widening_within_its_own_values_is_tune(monkeypatch):
  # Comparison tunes every variant this way; without a larger grid it must not widen.
  asked = _fake_tuning(monkeypatch, lambda lr: lr)  # best at the top edge
  result = sweep.tune_widening(lambda lr, seed: lr, [0.1, 0.01, 0.03], 0, lambda lr, s: "",
                               [0.1, 0.01, 0.03])
  assert result.value == 0.1 and asked == [[0.01, 0.03, 0.1]]
