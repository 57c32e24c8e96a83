"""The workdir: what it must be, and the run it may already hold.

A workdir holds one run: config.json (the config as given), metrics.jsonl, checkpoints/,
summary.json and plots. Every check here runs before any data is loaded where it can:
the path (a directory that can be written, or a path where one can be made), then the run
already there (the same config resumes it; a larger config.rounds alone extends it, where an
uninterrupted run of that length gives the same). Nothing in a workdir is removed or
overwritten by a run that stops on an error.
"""
import errno
import json
import os
import shutil
import tempfile
from typing import Optional

from fedjax_lama import config as config_lib
from fedjax_lama.errors import ConfigError, WorkdirError

# Fields that may change between a run and its resumption without changing results.
# config.max_loss_growth changes only whether a diverging run stops: a run stopped by it resumes
# with the check off (0) or a larger multiple.
RESUMABLE_CHANGES = ("checkpoint_every", "plots", "data_dir", "per_client_eval", "tensorboard",
                     "max_loss_growth")
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CHECKPOINTS = "checkpoints"
# Free bytes below which a workdir's filesystem counts as full (a checkpoint of the
# smallest model needs more).
MIN_FREE_BYTES = 1 << 20


def check(workdir, spec) -> tuple[str, Optional[int]]:
  """The workdir's path once it can hold the run of `spec` (`check_workdir_usable`, then
  `check_workdir`), and the rounds of the finished run it extends (None if none)."""
  check_workdir_usable(workdir)
  workdir = os.fspath(workdir)
  return workdir, check_workdir(workdir, spec.records, spec.mode)


def check_workdir_usable(workdir) -> None:
  """Refuses a workdir that cannot hold a run, before any data is loaded: not a string,
  empty, a file, under a file, unwritable, or on a full filesystem. Writes nothing that
  stays: a workdir that does not exist yet is made only once every check passed."""
  if not isinstance(workdir, (str, os.PathLike)):
    raise WorkdirError(f"workdir={workdir!r} is not accepted; accepted: a directory path")
  workdir = os.fspath(workdir)
  if not workdir.strip():
    raise WorkdirError("workdir is empty (--workdir=); accepted: a directory path")
  probe_dir = os.path.abspath(workdir)
  while not os.path.exists(probe_dir):  # the directory that would hold the new workdir
    parent = os.path.dirname(probe_dir)
    if parent == probe_dir:
      break
    probe_dir = parent
  if not os.path.isdir(probe_dir):
    what = ("is a file" if probe_dir == os.path.abspath(workdir)
            else f"is under a file ({probe_dir})")
    raise WorkdirError(f"workdir {workdir} {what}; accepted: a directory, or a path where one "
                       "can be made")
  try:  # os.access answers for the user, not for the filesystem (read-only mounts, quotas)
    with tempfile.NamedTemporaryFile(dir=probe_dir, prefix=".fedjax_lama_probe_") as f:
      f.write(b"\0" * 4096)
      f.flush()
      os.fsync(f.fileno())
  except OSError as e:
    why = "the filesystem is full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
    raise WorkdirError(f"workdir {workdir} cannot be written ({probe_dir}: {why}); accepted: a "
                       "writable directory") from e
  free = shutil.disk_usage(probe_dir).free
  if free < MIN_FREE_BYTES:
    raise WorkdirError(f"workdir {workdir}: the filesystem of {probe_dir} is full ({free} bytes "
                       "free); free some space or use another --workdir")


def make(workdir: str) -> None:
  """The workdir's directory, once every check passed."""
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise WorkdirError(f"workdir {workdir} cannot be made ({e.strerror})") from e


def _read_config(workdir: str) -> Optional[dict]:
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      return config_lib.rename_old_fields(json.load(f))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ConfigError(f"{path} is not valid JSON ({e}); move it away or use a new "
                      "--workdir") from e
  except OSError as e:
    raise WorkdirError(f"{path} cannot be read ({e.strerror})") from e


_ABSENT = object()


def _changed(old: dict, new: dict, defaults: dict, key: str) -> bool:
  """Whether field `key` differs between a workdir's config and this one. A field or a
  section added to the config after the run started (config.system, a new option of an
  algorithm's section) is no change while it keeps its default."""
  a, b = old.get(key, _ABSENT), new.get(key, _ABSENT)
  if a is _ABSENT:
    return b != defaults.get(key, _ABSENT)
  if isinstance(a, dict) and isinstance(b, dict):
    inner = defaults.get(key) if isinstance(defaults.get(key), dict) else {}
    return any(_changed(a, b, inner, k) for k in set(a) | set(b))
  return a != b


def check_workdir(workdir: str, records, mode: str) -> Optional[int]:
  """Refuses to mix runs: an existing config.json must match `records.config_json`
  (RESUMABLE_CHANGES aside).

  A larger config.rounds extends the run in the workdir (see `check_extension`); returns
  the rounds of the run being extended, else None.
  """
  old = _read_config(workdir)
  if old is None:
    return None
  new, defaults = records.config_json, records.base_json
  diff = sorted(k for k in set(old) | set(new)
                if k not in RESUMABLE_CHANGES and _changed(old, new, defaults, k))
  extended = None
  if diff == ["rounds"] and isinstance(old.get("rounds"), int) and new["rounds"] > old["rounds"]:
    check_extension(records, mode, old["rounds"])
    extended, diff = old["rounds"], []
  if diff:
    raise ConfigError(
        f"--workdir={workdir} holds a run with a different config (fields: "
        f"{', '.join(diff)}); use a new --workdir, the same config to "
        "resume, or a larger config.rounds alone to extend it")
  return extended


def check_extension(records, mode: str, old_rounds: int) -> None:
  """A run of `old_rounds` extended to config.rounds equals an uninterrupted run of
  config.rounds only where nothing depends on the total: refuses the others, naming why."""
  def refuse(why):
    raise ConfigError(
        f"config.rounds={records.rounds} cannot extend the run of {old_rounds} rounds in this "
        f"workdir: {why}; use a new --workdir")
  if mode == "clock":
    refuse("runs on the simulated clock have no rounds")
  if records.local_lr_decay == "cosine":
    refuse("config.local_lr_decay='cosine' decays over the total number of local steps")
  if mode == "fedlama" and records.fedlama_total_steps:
    refuse(f"config.fedlama.total_steps={records.fedlama_total_steps} sets the run's length")
  if records.target_epsilon is not None:
    refuse(f"config.privacy.target_epsilon={records.target_epsilon} calibrated the noise "
           "for the run's number of rounds")
  if old_rounds % records.eval_every:
    refuse(f"its last round ({old_rounds}) is not a multiple of config.eval_every="
           f"{records.eval_every}, so its final evaluation restarted the training-loss average "
           "that an uninterrupted run carries on")
