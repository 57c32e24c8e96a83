"""Run outputs: metrics.jsonl, summary.json, and TensorBoard events of a run."""
import json
import math
import os
from typing import Any

import numpy as np


def _plain(value):
  """JSON-safe plain Python value (numpy scalars/arrays -> numbers/lists; NaN -> None)."""
  if isinstance(value, dict):
    return {k: _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  if isinstance(value, np.ndarray):
    return _plain(value.tolist())
  if isinstance(value, np.generic):
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


def write_json(path: str, obj: Any) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(_plain(obj), f, indent=2, sort_keys=True)
    f.write("\n")
  os.replace(tmp, path)  # atomic: an interrupted write never leaves a half file


class JsonlWriter:
  """Appends one JSON object per evaluation; `truncate_after(round)` on resume."""

  def __init__(self, path: str):
    self.path = path

  def read(self) -> list[dict]:
    """The records on disk. A last line cut short (a kill during an append; every append
    writes one whole line) is dropped: the checkpoint it belonged to was not yet written.
    Any other line that does not parse raises ValueError naming the file and line."""
    if not os.path.exists(self.path):
      return []
    with open(self.path) as f:
      lines = f.read().split("\n")
    records = []
    for number, line in enumerate(lines, 1):
      if not line.strip():
        continue
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError as e:
        if number == len(lines):  # no newline after it: the append was interrupted
          break
        raise ValueError(f"{self.path} line {number} is not a JSON record ({e}); the records "
                         "before it are intact: move the file away to start its log anew") from e
    return records

  def truncate_after(self, round_idx: int) -> list[dict]:
    """Keeps the records of rounds <= round_idx (those covered by the checkpoint)."""
    kept = [r for r in self.read() if r["round"] <= round_idx]
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      for r in kept:
        f.write(json.dumps(_plain(r), sort_keys=True) + "\n")
    os.replace(tmp, self.path)
    return kept

  def write(self, record: dict) -> None:
    with open(self.path, "a") as f:
      f.write(json.dumps(_plain(record), sort_keys=True) + "\n")


class TensorBoardWriter:
  """TensorBoard event files of the metrics.jsonl records (issue 19 item 5), via tensorboardX.

  `write(record)` logs every numeric scalar of one evaluation record (ints, floats, numpy
  scalars; nested dicts as "outer/inner" tags) as a scalar summary tagged with its key, at
  step = record["local_steps"]: the local SGD steps per client so far, the x-axis on which
  runs of different algorithms, local-step counts and FedLAMA windows compare (one training
  round is a different number of steps for each). The round number is itself written as the
  scalar "round" at that step, so TensorBoard can show either. Lists (FedLAMA's per-layer
  discrepancies and multipliers), strings, booleans and None (a non-finite value in the
  JSON) are skipped. Values are stored as TensorBoard's float32 scalars (metrics.jsonl stays
  the exact record). Events reach the disk within `flush_secs` and all of them on close().
  Each writer opens a new event file whose name ends in a nanosecond stamp, so two writers
  of one logdir within a second (a quick resume) never overwrite each other's file.

  Resume: a resumed run rewrites the evaluations after its checkpoint; pass
  `purge_step=resume_purge_step(kept_records)` so TensorBoard hides the events a crashed run
  wrote at those steps (tensorboardX's purge_step; the same logdir as the first run).
  """

  def __init__(self, logdir: str, purge_step: int | None = None, flush_secs: int = 10):
    import time  # pylint: disable=g-import-not-at-top
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    os.makedirs(logdir, exist_ok=True)
    self.logdir = logdir
    # tensorboardX names files by the second: a unique suffix keeps a second writer from
    # truncating the first one's file (the names still sort by creation time).
    self._writer = SummaryWriter(logdir=logdir, purge_step=purge_step, flush_secs=flush_secs,
                                 filename_suffix=f".{time.time_ns()}")

  @staticmethod
  def scalars(record: dict, prefix: str = "") -> dict:
    """The {tag: float} that `write` logs for `record`."""
    out = {}
    for key, value in record.items():
      tag = f"{prefix}{key}"
      if isinstance(value, dict):
        out.update(TensorBoardWriter.scalars(value, prefix=tag + "/"))
        continue
      if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
      if isinstance(value, np.generic):
        value = value.item()
      if isinstance(value, (int, float)) and not isinstance(value, bool):
        out[tag] = float(value)
    return out

  def write(self, record: dict) -> None:
    if "local_steps" not in record:
      raise ValueError(f"a metrics record needs 'local_steps' (the TensorBoard step); "
                       f"got keys {sorted(record)}")
    step = int(record["local_steps"])
    for tag, value in self.scalars(record).items():
      self._writer.add_scalar(tag, value, global_step=step)

  def close(self) -> None:
    self._writer.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def resume_purge_step(kept_records: list[dict]) -> int:
  """TensorBoardWriter's purge_step on resume: the step after the last record kept (0: none)."""
  return int(kept_records[-1]["local_steps"]) + 1 if kept_records else 0


def export_tensorboard(workdir: str, logdir: str | None = None) -> str:
  """Writes the event files of a finished (or running) run's metrics.jsonl after the fact.

  logdir: default workdir/tensorboard. Returns the logdir. The new event file starts with
  purge_step=0, so TensorBoard shows it in place of any earlier events in that logdir."""
  logdir = logdir or os.path.join(workdir, "tensorboard")
  records = JsonlWriter(os.path.join(workdir, "metrics.jsonl")).read()
  with TensorBoardWriter(logdir, purge_step=0) as tb:
    for record in records:
      tb.write(record)
  return logdir
