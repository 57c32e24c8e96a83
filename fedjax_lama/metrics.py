"""Run outputs: metrics.jsonl, summary.json, plots (architecture.md 3)."""
import json
import math
import os
from typing import Any, Iterable

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


def plot_run(workdir: str, records: Iterable[dict], title: str = "") -> list[str]:
  """Accuracy vs round and vs communicated floats, as PNG files in workdir."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  records = [r for r in records if r.get("test_accuracy") is not None]
  if not records:
    return []
  rounds = [r["round"] for r in records]
  acc = [r["test_accuracy"] for r in records]
  comm = [(r["comm_floats_up"] + r["comm_floats_down"]) for r in records]
  paths = []
  for name, xs, xlabel in (("accuracy_vs_round.png", rounds, "round"),
                           ("accuracy_vs_comm.png", comm, "floats communicated (up + down)")):
    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=100)
    ax.plot(xs, acc, marker=".")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = os.path.join(workdir, name)
    fig.savefig(path)
    plt.close(fig)
    paths.append(path)
  return paths
