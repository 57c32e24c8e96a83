"""What a run tells its user: divergence stops with a truthful line, every phase logs progress,
the clock writes each tick's record as it happens, and the figures read without the code."""
import contextlib
import json
import logging
import math
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lama import config as config_lib
from fedjax_lama import errors, metrics, plots, progress, training
from fedjax_lama.privacy import dp_options
from fedjax_lama.privacy.dp_options import AdaptiveClipOptions, DpOptions, SamplingOptions
from fedjax_lama.programs.sync import SyncProgram
from fedjax_lama.run import records as records_lib, spec as spec_lib
from fedjax_lama.simulation import clock_run
from tests import test_privacy_runs as privacy_runs
from tests.test_fedat_engine import clock_config
from tests.test_training import tiny_config


def _steps(workdir):
  path = os.path.join(workdir, "checkpoints")
  return sorted(int(d) for d in os.listdir(path) if d.isdigit()) if os.path.isdir(path) else []


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def _poison(monkeypatch, at_round, what):
  """SyncProgram.run_round, with round `at_round` (0-based) returning NaN parameters or a NaN
  training loss."""
  original = SyncProgram.run_round

  def run_round(self, state, round_idx):
    state, out = original(self, state, round_idx)
    if round_idx == at_round:
      if what == "params":
        server = state["server"]
        nan = jax.tree.map(lambda x: x * jnp.nan, server.params)
        state = dict(state, server=server._replace(params=nan))
      else:
        out = out._replace(train_loss=float("nan"))
    return state, out

  monkeypatch.setattr(SyncProgram, "run_round", run_round)


# ---- divergence ---------------------------------------------------------------------------------
def test_nan_parameters_after_a_checkpoint_name_the_round_and_the_checkpoint(tmp_path,
                                                                              monkeypatch):
  _poison(monkeypatch, at_round=2, what="params")  # round 3; a checkpoint after round 2
  with pytest.raises(errors.TrainingDiverged) as caught:
    training.train_and_evaluate(tiny_config(rounds=6, checkpoint_every=2), str(tmp_path))
  message = str(caught.value)
  assert "\n" not in message
  assert "at round 3:" in message and "parameters" in message
  assert _steps(tmp_path) == [1]  # round 2, 0-based 1: what the message must say
  assert "a rerun resumes after round 2, the last checkpoint in" in message
  assert isinstance(caught.value, training.TrainingError)  # the CLI's one-line errors


def test_nan_loss_before_any_checkpoint_says_none_exists(tmp_path, monkeypatch):
  _poison(monkeypatch, at_round=0, what="loss")
  with pytest.raises(errors.TrainingDiverged,
                     match=r"at round 1: train_loss is nan \(non-finite\); no checkpoint exists "
                     r"yet in .*checkpoints, so a rerun starts from the beginning"):
    training.train_and_evaluate(tiny_config(rounds=6, checkpoint_every=2), str(tmp_path))
  assert _steps(tmp_path) == []


def _check_truthful(message, workdir):
  """The message's resume statement matches the checkpoints on disk."""
  steps = _steps(workdir)
  if steps:
    assert f"a rerun resumes after round {steps[-1] + 1}," in message
  else:
    assert "no checkpoint exists yet" in message


def test_huge_learning_rate_stops_with_a_truthful_line(tmp_path):
  with pytest.raises(errors.TrainingDiverged) as caught:
    training.train_and_evaluate(tiny_config(rounds=6, local_lr=1e30), str(tmp_path))
  message = str(caught.value)
  assert re.search(r"training diverged at round \d+: (train_loss|test_loss|test_accuracy) is "
                   r"\S+ \(non-finite\)|the model parameters", message), message
  assert "config.local_lr" in message
  _check_truthful(message, tmp_path)


@pytest.mark.slow
def test_fedlama_schedule_divergence_is_caught(tmp_path):
  c = tiny_config(schedule="fedlama", local_lr=1e30, **{"fedlama.total_steps": 24,
                                                        "fedlama.base_interval": 2})
  with pytest.raises(errors.TrainingDiverged, match=r"training diverged at round \d+") as caught:
    training.train_and_evaluate(c, str(tmp_path))
  _check_truthful(str(caught.value), tmp_path)


@pytest.mark.slow
def test_clock_divergence_names_the_tick_and_the_checkpoint(tmp_path, monkeypatch):
  original = clock_run.tick_record

  def tick_record(tick, previous, position, num_parameters):
    record = original(tick, previous, position, num_parameters)
    return dict(record, test_loss=float("inf")) if position == 3 else record

  monkeypatch.setattr(clock_run, "tick_record", tick_record)
  # checkpoint_every=2: a checkpoint after ticks 0 and 1, none after tick 2.
  with pytest.raises(errors.TrainingDiverged) as caught:
    training.train_and_evaluate(clock_config(), str(tmp_path))
  message = str(caught.value)
  assert "training diverged at tick 3 (virtual time 30 s): test_loss is inf" in message
  assert "a rerun resumes after tick 1, the last checkpoint in" in message
  assert isinstance(caught.value, training.DivergenceError)
  assert [r["tick"] for r in _records(tmp_path)] == [0, 1, 2]  # the diverged tick is not kept


@pytest.mark.slow
def test_clock_loss_growth_names_the_tick_and_the_starting_loss(tmp_path, monkeypatch):
  original = clock_run.tick_record
  seen = []

  def tick_record(tick, previous, position, num_parameters):
    record = original(tick, previous, position, num_parameters)
    seen.append(record["train_loss"])
    return dict(record, train_loss=record["train_loss"] * 5000) if position == 3 else record

  monkeypatch.setattr(clock_run, "tick_record", tick_record)
  with pytest.raises(training.DivergenceError) as caught:
    training.train_and_evaluate(clock_config(), str(tmp_path))
  start = clock_run.start_loss([{"train_loss": v} for v in seen])  # tick 1's: tick 0 trains none
  assert start == seen[1]
  assert str(caught.value).startswith(
      f"training diverged at tick 3 (virtual time 30 s): train_loss is {5000 * seen[3]:.4g} "
      f"(above config.max_loss_growth=1000 times the starting train_loss {start:.4g}; "
      "config.max_loss_growth=0 turns this check off); a rerun resumes after tick 1, ")
  assert [r["tick"] for r in _records(tmp_path)] == [0, 1, 2]


def test_clock_huge_learning_rate_stops_before_the_codec_sees_a_nan(tmp_path):
  # The first training call diverges (tick 0 is at t = 0, before any training): the check
  # after each training call catches it before the polyline codec would refuse the NaNs.
  with pytest.raises(errors.TrainingDiverged,
                     match=r"training diverged at virtual time [\d.]+ s \(after tick 0\): "
                     r"(train_loss is nan|a trained client model) .*no checkpoint exists yet"):
    training.train_and_evaluate(clock_config(local_lr=1e30), str(tmp_path))


# ---- a training loss that grows past config.max_loss_growth --------------------------------------
def _inflate(monkeypatch, at_round, factor):
  """SyncProgram.run_round, with round `at_round`'s (0-based) training loss times `factor`."""
  original = SyncProgram.run_round

  def run_round(self, state, round_idx):
    state, out = original(self, state, round_idx)
    if round_idx == at_round:
      out = out._replace(train_loss=out.train_loss * factor)
    return state, out

  monkeypatch.setattr(SyncProgram, "run_round", run_round)


def test_loss_growth_stops_naming_the_round_and_resumes_with_the_check_off(tmp_path,
                                                                           monkeypatch):
  c = tiny_config(rounds=6, eval_every=1, checkpoint_every=2)  # one round per record
  workdir = str(tmp_path)
  assert "interrupted_after_round" in training.train_and_evaluate(c, workdir,
                                                                   stop_after_round=1)
  _inflate(monkeypatch, at_round=2, factor=2000.0)  # round 3: 2000 x its own loss
  with pytest.raises(training.DivergenceError) as caught:
    training.train_and_evaluate(c, workdir)  # resumed: the starting loss is checkpointed
  message = str(caught.value)
  assert [r["round"] for r in _records(workdir)] == [1, 2]  # round 3 is not recorded

  c.max_loss_growth = 0.0  # off: the same rerun resumes and runs on
  training.train_and_evaluate(c, workdir)
  losses = [r["train_loss"] for r in _records(workdir)]
  assert len(losses) == 6
  grown, start = losses[2], losses[0]  # round 3's inflated loss, round 1's
  assert max(losses[:2] + losses[3:]) < 2 * start  # the other rounds: nowhere near 1000 x
  assert "\n" not in message
  assert message.startswith(
      f"training diverged at round 3: train_loss is {grown:.4g} (above "
      f"config.max_loss_growth=1000 times the starting train_loss {start:.4g}; "
      "config.max_loss_growth=0 turns this check off); a rerun resumes after round 2, the "
      "last checkpoint in "), message
  assert "config.local_lr" in message


def test_max_loss_growth_is_checked_like_every_field():
  for bad in (1.0, 0.5, -3.0, float("nan"), float("inf"), None):
    c = tiny_config()
    c.max_loss_growth = bad
    with pytest.raises(errors.ConfigError,
                       match=r"^config\.max_loss_growth=.* is not accepted; accepted: a finite "
                             r"number > 1 .* or 0 to turn the check off$"):
      config_lib.validate(c)
  for good in (0.0, 0, 1.5, 1e6):
    c = tiny_config()
    c.max_loss_growth = good
    config_lib.validate(c)
  assert config_lib.base_config().max_loss_growth == 1000.0  # the default docs/guide.md states


def test_growth_check_against_its_definition():
  from fedjax_lama import divergence  # pylint: disable=g-import-not-at-top
  assert divergence.grown_past(2001.0, 2.0, 1000.0)
  assert not divergence.grown_past(2000.0, 2.0, 1000.0)  # "exceeds", not "reaches"
  assert not divergence.grown_past(1e30, 2.0, 0.0)  # off
  assert not divergence.grown_past(1e30, None, 1000.0)  # no starting loss yet
  assert clock_run.start_loss([{"train_loss": None}, {"train_loss": float("nan")},
                               {"train_loss": 1.5}, {"train_loss": 0.2}]) == 1.5
  assert clock_run.start_loss([{"train_loss": None}]) is None


# ---- what the noise of a DP run does to the averaged update --------------------------------------
def test_dp_noise_line_against_a_hand_computation():
  sampling = SamplingOptions("poisson", 40, rate=0.25)  # expected cohort 0.25 * 40 = 10
  line = dp_options.noise_statement(DpOptions(2.0, 0.5, sampling), 400)
  # std 2 * 0.5 / 10 = 0.1 per coordinate; norm about 0.1 * sqrt(400) = 2 = 4 C.
  assert line.startswith(
      "differential privacy: sigma = 2, expected cohort 10 clients, noise std on the averaged "
      "update sigma C / cohort = 0.1 per coordinate beside the clip C = 0.5; over the model's "
      "400 parameters its norm is about 2, 4 x C "), line
  assert "each round's noise is larger than any averaged update can be" in line
  # 4 parameters: norm 0.2 = 0.4 C, below C: no warning.
  line = dp_options.noise_statement(DpOptions(2.0, 0.5, sampling), 4)
  assert "its norm is about 0.2, 0.4 x C" in line and "larger than" not in line
  # Adaptive clipping: the updates' sigma_delta = (1 - 1 / (2 * 2)^2)^(-1/2) = 1.0328 carries the
  # noise, at the initial clip.
  adaptive = DpOptions(1.0, 0.5, sampling, adaptive=AdaptiveClipOptions(count_stddev=2.0))
  sigma_delta = (1.0 - 1.0 / 16.0) ** -0.5
  assert dp_options.noise_std_on_mean(adaptive) == pytest.approx(sigma_delta * 0.5 / 10)
  line = dp_options.noise_statement(adaptive, 400)
  assert line.startswith(f"differential privacy: sigma = 1 (sigma_delta = {sigma_delta:.4g} on "
                         "the updates), expected cohort 10 clients")
  assert f"= {sigma_delta * 0.05:.4g} per coordinate beside the initial clip C = 0.5" in line


def test_a_dp_run_says_its_noise_then_stops_when_its_loss_grows(tmp_path, progress_lines,
                                                               monkeypatch):
  titles = []
  run_plots = plots.run_plots
  monkeypatch.setattr(plots, "run_plots",
                      lambda workdir, records, title: titles.append(title) or run_plots(
                          workdir, records, title))
  c = privacy_runs.dp_config(sigma=50.0, plots=True)  # 8 clients, q = 0.5, C = 0.5
  with pytest.raises(training.DivergenceError) as caught:
    training.train_and_evaluate(c, str(tmp_path))
  (line,) = [l for l in progress_lines if l.startswith("differential privacy:")]
  # By hand: the expected cohort 0.5 * 8 = 4, the std 50 * 0.5 / 4 = 6.25; the MLP (128, 128)
  # on 8x8 digits has d = 64*128 + 128 + 128*128 + 128 + 128*10 + 10 = 26,122 parameters.
  d = 64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10
  numbers = re.search(r"sigma = (\S+), expected cohort (\S+) clients, .* = (\S+) per coordinate "
                      r"beside the clip C = (\S+); over the model's (\S+) parameters its norm is "
                      r"about (\S+), (\S+) x C", line).groups()
  assert [float(x.replace(",", "")) for x in numbers] == pytest.approx(
      [50.0, 4.0, 6.25, 0.5, d, 6.25 * math.sqrt(d), 6.25 * math.sqrt(d) / 0.5], rel=1e-3)
  message = str(caught.value)
  assert re.match(r"training diverged at round \d+: train_loss is \S+ \(above "
                  r"config\.max_loss_growth=1000 times the starting train_loss", message), message
  assert "the noise std on the averaged update is 6.25 beside the clip C = 0.5" in message

  c.max_loss_growth = 0.0  # off: the run goes on to its end
  summary = training.train_and_evaluate(c, str(tmp_path))
  assert summary["rounds"] == 4
  # Its per-client metrics are marked as outside the guarantee, and accuracy is drawn against
  # the epsilon spent.
  outside = summary["privacy"]["outside_guarantee"]
  assert outside["metrics"] == sorted(k for k in summary if k.startswith("client_train_accuracy"))
  assert outside["metrics"] and "own data" in outside["why"]
  assert (tmp_path / plots.EPSILON_FILE).stat().st_size > 0
  assert titles == [f"fedavg / digits\nDP epsilon {summary['privacy']['epsilon']:.3g} at delta "
                    "1e-05 (sigma 50)"]


def test_all_finite_against_numpy():
  tree = {"a": np.ones((3, 2), np.float32), "b": np.arange(4, dtype=np.int32)}
  from fedjax_lama import divergence  # pylint: disable=g-import-not-at-top
  assert divergence.all_finite(tree)
  for bad in (np.nan, np.inf, -np.inf):
    broken = dict(tree, a=tree["a"].copy())
    broken["a"][1, 0] = bad
    assert divergence.all_finite(broken) == bool(np.all(np.isfinite(broken["a"])))


# ---- records on the clock, as they happen -------------------------------------------------------
class _Killed(BaseException):
  """Stands for a kill: nothing after it runs (not an Exception, so nothing catches it)."""


def _kill_at_tick(monkeypatch, index):
  original = clock_run.EngineSimulator._record_tick

  def record_tick(self, i, final=False):
    if i == index:
      raise _Killed()
    return original(self, i, final)

  monkeypatch.setattr(clock_run.EngineSimulator, "_record_tick", record_tick)


def _strip(records):
  return [{k: v for k, v in r.items() if k != "wall_seconds"} for r in records]


class _Lines(logging.Handler):
  def __init__(self):
    super().__init__()
    self.lines = []

  def emit(self, record):
    self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def killed_then_rerun(tmp_path_factory):
  """A run on the clock (a checkpoint every 2 ticks) killed while evaluating tick 3, then run
  again to the end: (records after the kill, records at the end, the rerun's log lines)."""
  workdir = str(tmp_path_factory.mktemp("killed"))
  c = clock_config(checkpoint_every=2)
  with pytest.MonkeyPatch.context() as patch:
    _kill_at_tick(patch, 3)
    with pytest.raises(_Killed):
      training.train_and_evaluate(c, workdir)
  killed = _records(workdir)
  assert _steps(workdir), "a checkpoint after tick 1 was expected"
  with _capture() as lines:
    training.train_and_evaluate(c, workdir)
  return killed, _records(workdir), lines


@pytest.mark.slow
def test_tick_records_are_written_as_they_happen(killed_then_rerun):
  killed, _, _ = killed_then_rerun
  # Tick 2 was evaluated after the last checkpoint (ticks 0-1) and before the kill.
  assert [r["tick"] for r in killed] == [0, 1, 2]
  assert [r["round"] for r in killed] == [1, 2, 3]


def test_a_rerun_neither_duplicates_nor_drops_tick_records(killed_then_rerun):
  killed, final, _ = killed_then_rerun
  assert [r["tick"] for r in final] == [0, 1, 2, 3, 4]
  assert [r["round"] for r in final] == [1, 2, 3, 4, 5]
  assert final[:2] == killed[:2]  # covered by the checkpoint: kept as written
  assert _strip(final[2:3]) == _strip(killed[2:3])  # after it: computed again, the same


@pytest.mark.slow
def test_records_written_before_any_checkpoint_survive_a_kill(tmp_path, monkeypatch):
  c = clock_config(checkpoint_every=100)
  with monkeypatch.context() as patch:
    _kill_at_tick(patch, 3)
    with pytest.raises(_Killed):
      training.train_and_evaluate(c, str(tmp_path))
  assert [r["tick"] for r in _records(tmp_path)] == [0, 1, 2] and not _steps(tmp_path)
  training.train_and_evaluate(c, str(tmp_path))  # no checkpoint: starts afresh
  assert [r["tick"] for r in _records(tmp_path)] == [0, 1, 2, 3, 4]


# ---- progress -----------------------------------------------------------------------------------
@contextlib.contextmanager
def _capture():
  handler = _Lines()
  progress.logger.addHandler(handler)
  level = progress.logger.level
  progress.logger.setLevel(logging.INFO)
  try:
    yield handler.lines
  finally:
    progress.logger.removeHandler(handler)
    progress.logger.setLevel(level)


@pytest.fixture
def progress_lines():
  with _capture() as lines:
    yield lines


def _in_order(lines, patterns):
  at = 0
  for pattern in patterns:
    hits = [i for i, line in enumerate(lines) if i >= at and re.search(pattern, line)]
    assert hits, f"no line matching {pattern!r} after line {at}:\n" + "\n".join(lines)
    at = hits[0]


def test_every_phase_of_a_run_logs_a_line(tmp_path, progress_lines):
  training.train_and_evaluate(tiny_config(plots=True, per_client_eval="final"), str(tmp_path))
  _in_order(progress_lines, [r"^loading data: ", r"^partitioning into 8 clients",
                             r"^building the model", r"compiling", r"evaluating \(the first",
                             r"^round 2/4  test_acc", r"round 4/4: evaluating, with per-client",
                             r"^round 4/4  test_acc .* ETA 0\.0s", r"^writing .*summary\.json",
                             r"^writing plots"])


def test_every_tick_on_the_clock_logs_a_line(killed_then_rerun):
  progress_lines = killed_then_rerun[2]
  ticks = [line for line in progress_lines if line.startswith("tick ")]
  assert [int(line.split()[1]) for line in ticks] == [2, 3, 4]
  _in_order(progress_lines, [r"^loading data", r"^partitioning", r"^restoring",
                             r"^resuming after tick 1 ", r"compile", r"^tick 2 ",
                             r"^tick 4 .*ETA 0\.0s", r"^writing .*summary\.json",
                             r"^writing plots"])


def test_eta_counts_the_evaluations_still_to_come():
  # 10 s over 2 rounds, 3 rounds and 2 evaluations of 7 s left: 3 * 5 + 2 * 7.
  assert progress.eta_seconds(10.0, 2, 3, 7.0, 2) == pytest.approx(29.0)
  assert progress.eta_seconds(10.0, 2, 0, 7.0, 0) == 0.0


# ---- figures ------------------------------------------------------------------------------------
def _draw(fig):
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  FigureCanvasAgg(fig).draw()


def _overlaps(a, b) -> bool:
  return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _sync_records():
  return [{"round": r, "test_accuracy": 0.1 * r, "comm_floats_up": 10 * r,
           "comm_floats_down": 10 * r} for r in (1, 2, 3)]


def _clock_records():
  return [{"virtual_time": t, "test_accuracy": 0.2 + t / 100, "client_test_accuracy_mean": 0.2,
           "client_test_accuracy_var": 0.01, "comm_floats_up": t, "comm_floats_down": t}
          for t in (0.0, 10.0, 20.0, 30.0, 40.0)]


def test_every_figure_has_a_title():
  figures = list(plots.run_figures(_sync_records(), "fedavg / mnist").values())
  figures += list(plots.clock_figures(_clock_records(), "fedat / digits").values())
  figures.append(plots.layer_comm_figure(["Conv_0", "Dense_0"], [10, 20], [3, 1]))
  figures.append(plots.selection_curves_figure(
      [{"fedlama_delta": [0.2, 0.5, 1.0], "fedlama_lambda": [0.1, 0.6, 1.0],
        "local_steps": 8}], "aaai"))
  for fig in figures:
    titles = [ax.get_title() for ax in fig.axes] + [fig._suptitle.get_text()  # pylint: disable=protected-access
                                                    if fig._suptitle else ""]  # pylint: disable=protected-access
    assert all(ax.get_title() for ax in fig.axes), titles


def test_titles_name_the_algorithm_schedule_privacy_and_attack():
  title = lambda config, records=(): records_lib.run_title(spec_lib.build_spec(config).records,
                                                           list(records))
  assert title(tiny_config()) == "fedavg / digits"
  assert title(tiny_config(schedule="fedlama")) == "fedavg + fedlama / digits"
  assert title(privacy_runs.dp_config(sigma=2.0), [{"dp_epsilon": 3.2109}]) == (
      "fedavg / digits\nDP epsilon 3.21 at delta 1e-05 (sigma 2)")
  assert title(privacy_runs.dp_config(sigma=0.0), [{"dp_epsilon": None}]) == (
      "fedavg / digits\nDP with sigma 0 (no finite epsilon)")
  attacked = tiny_config(**{"robust.defence": "median", "robust.f": 1,
                            "robust.attack": "sign_flip", "robust.malicious_count": 1})
  assert title(attacked) == (
      "fedavg / digits\ndefence median (f=1), attack sign_flip (1 malicious client)")
  attacked = tiny_config(**{"robust.attack": "gaussian", "robust.malicious_fraction": 0.25})
  assert title(attacked) == (
      "fedavg / digits\nno defence, attack gaussian (0.25 of the clients malicious)")
  defended = tiny_config(**{"robust.defence": "krum", "robust.f": 1})
  assert title(defended) == "fedavg / digits\ndefence krum (f=1), no attack"


def test_accuracy_axes_span_zero_to_one_and_a_dp_run_plots_accuracy_by_epsilon():
  records = [dict(r, dp_epsilon=0.5 * r["round"]) for r in _sync_records()]
  figures = plots.run_figures(records, "fedavg / mnist")
  assert sorted(figures) == sorted([plots.ROUND_FILE, plots.COMM_FILE, plots.EPSILON_FILE])
  assert plots.EPSILON_FILE not in plots.run_figures(_sync_records(), "t")  # no DP, no figure
  epsilon = figures[plots.EPSILON_FILE].axes[0]
  assert list(epsilon.lines[0].get_xdata()) == [0.5, 1.0, 1.5]
  assert list(epsilon.lines[0].get_ydata()) == [r["test_accuracy"] for r in records]
  assert epsilon.get_xlabel().startswith("epsilon spent")
  # What a figure shows follows the run's first line; privacy, attack and defence below.
  titled = plots.run_figures(records, "fedavg / digits\nDP epsilon 2 at delta 1e-05 (sigma 3)")
  assert titled[plots.ROUND_FILE].axes[0].get_title() == (
      "fedavg / digits: test accuracy by round\nDP epsilon 2 at delta 1e-05 (sigma 3)")
  accuracy_figures = list(figures.values()) + [
      plots.clock_figures(_clock_records(), "t")[plots.VIRTUAL_TIME_FILE],
      plots.client_accuracy_figure({"global": [0.2, 0.3], "personal": [0.4, 0.5]}, "t")]
  for fig in accuracy_figures:
    _draw(fig)
    assert fig.axes[0].get_ylim() == (0.0, 1.0), fig.axes[0].get_title()


def test_fedlama_layer_bars_are_labelled_with_layer_names():
  names = ["Conv_0/kernel", "Conv_1/kernel", "Dense_0/kernel"]
  fig = plots.layer_comm_figure(names, [100, 200, 300], [4, 2, 1])
  _draw(fig)
  for ax in fig.axes:
    assert [t.get_text() for t in ax.get_xticklabels()] == names
    assert list(ax.get_xticks()) == [0, 1, 2]


def test_virtual_time_axis_is_in_seconds_and_starts_at_zero():
  fig = plots.clock_figures(_clock_records(), "fedat / digits")[plots.VIRTUAL_TIME_FILE]
  _draw(fig)
  ax = fig.axes[0]
  assert ax.get_xlabel() == "virtual time (s)"
  assert ax.get_xlim()[0] == 0.0
  assert 0.0 in list(ax.get_xticks())
  assert ax.lines[0].get_xdata()[0] == 0.0  # the tick at t = 0 is drawn at x = 0
  assert plots.ROUND_FILE not in plots.clock_figures(_clock_records(), "t")


@pytest.mark.parametrize("make", [
    lambda: plots.clock_figures(_clock_records(), "t")[plots.VIRTUAL_TIME_FILE],
    lambda: plots.selection_curves_figure(
        [{"fedlama_delta": list(np.linspace(0, 1, 6)), "fedlama_lambda": list(np.linspace(0, 1, 6)),
          "local_steps": s} for s in (8, 16, 24, 32)], "aaai"),
])
def test_legends_sit_off_the_data(make):
  fig = make()
  _draw(fig)
  ax = fig.axes[0]
  renderer = fig.canvas.get_renderer()
  legend = ax.get_legend().get_window_extent(renderer)
  assert not _overlaps(legend, ax.get_window_extent(renderer))


def test_algorithm_packages_do_not_import_matplotlib():
  root = os.path.join(os.path.dirname(__file__), "..", "fedjax_lama")
  offenders = []
  for directory, _, files in os.walk(root):
    for name in files:
      path = os.path.join(directory, name)
      if name.endswith(".py") and os.path.basename(path) != "plots.py":
        if "matplotlib" in open(path).read():
          offenders.append(os.path.relpath(path, root))
  assert offenders == []


def test_run_writes_the_figures_it_names(tmp_path):
  records = _sync_records()
  paths = plots.run_plots(str(tmp_path), records, "fedavg / mnist")
  assert sorted(os.path.basename(p) for p in paths) == [plots.COMM_FILE, plots.ROUND_FILE]
  assert all(os.path.getsize(p) > 0 for p in paths)
  metrics.JsonlWriter(str(tmp_path / "metrics.jsonl")).write(
      {"round": 1, "fedlama_delta": [0.5, 1.0], "fedlama_lambda": [0.5, 1.0], "local_steps": 4})
  paths = plots.fedlama_plots(str(tmp_path), ["a", "b"], [1, 2], [2, 1], "aaai")
  assert sorted(os.path.basename(p) for p in paths) == [plots.CURVES_FILE,
                                                         plots.LAYER_COMM_FILE]
