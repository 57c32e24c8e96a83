r"""The FedAvg paper's Shakespeare rows: rounds to a target accuracy, FedSGD against FedAvg.

McMahan, Moore, Ramage, Hampson, Agüera y Arcas, "Communication-Efficient Learning of Deep
Networks from Decentralized Data", AISTATS 2017, Table 2 and Figure 2: the character LSTM on
Shakespeare, non-IID by speaking role, C = 0.1; per row (FedSGD: E = 1, B = ∞; FedAvg over
E in {1, 5} and B in {10, 50, ∞}) the rounds until the test accuracy first reaches 54 %, at
the best learning rate of a grid. The paper's numbers: experiments/paper_tables/
fedavg_shakespeare.md (as recalled, not checked against the paper's text).

  python -m experiments.reproduce --paper=fedavg --table=shakespeare --scale=small \
      --data_dir=DATA --out=experiments/results/reproduce
  python -m experiments.reproduce --paper=fedavg --table=shakespeare --scale=paper \
      --data_dir=DATA --out=OUT          # the whole grid, for an accelerator

Scales (`study`): "paper" is configs/fedavg_shakespeare.py as it is (every role with a test
part, the paper's 818,137-parameter LSTM, the target 54 %, rates from the paper's grid,
runs extended up to 4,000 rounds); "small" the subset a 2-core CPU runs in about an hour
(SMALL_REDUCED says what it changes); "smoke" a check of a few minutes.

How a row runs (RoundsToTarget):
  * FedSGD is `fedsgd` (one gradient over each client's whole data per round, the server
    step -lr times the n_k-weighted mean). FedAvg's B = ∞ is a batch of the largest client's
    training sequences, so every epoch is one full-batch step for every client.
  * Rates: the row's first points (`lrs`) train together (one vectorized computation),
    staged: to `stages[0]` rounds, then every run that has not reached the target on both
    the validation split and the test set is extended (an exact resume) to the next stage,
    up to the last (the cap). The rate picked is the one whose validation accuracy reaches
    the target first (ties: the higher mean of its last 3 validation accuracies; no rate
    reaching it: that mean alone), never the test accuracy (the paper picks the best
    test curve). A pick at an edge of the points tried adds the next point of `full_lrs`
    that way (sweep.tune_widening's rule); runs already trained are reused.
  * Rounds to target: the first evaluation (every config.eval_every rounds) whose test
    accuracy is at or above the target, ">cap" when none is. Speedup: FedSGD's rounds over
    the row's, a bound when either did not reach the target.
  * u = E n / B, n the mean of the clients' training sequences (the paper's "expected
    updates per round"); FedSGD's is 1.
Runs live in one workdir per (row, rate, seed) under the runs directory: a rerun reuses and
extends them, so an interrupted reproduction continues.
"""
import dataclasses
import math
import os
import re
from typing import Dict, List, Optional, Sequence

import numpy as np

from experiments import sweep

PAPER_TABLE = os.path.join(os.path.dirname(__file__), "paper_tables", "fedavg_shakespeare.md")
PAPER_TARGET = 0.54
# The paper's learning-rate grid for the LSTM, as recalled: resolution 10^(1/6) (1.47 is
# 10^(1/6)), three significant digits.
PAPER_LRS = tuple(float(f"{10 ** (k / 6):.3g}") for k in range(-3, 9))


@dataclasses.dataclass(frozen=True)
class Row:
  """One line of Table 2: FedSGD, or FedAvg with E local epochs of batch B (None: B = ∞)."""
  algorithm: str           # "fedsgd" | "fedavg"
  epochs: int
  batch: Optional[int]

  @property
  def label(self) -> str:
    name = "FedSGD" if self.algorithm == "fedsgd" else "FedAvg"
    return f"{name} E={self.epochs} B={'∞' if self.batch is None else self.batch}"

  @property
  def key(self) -> str:
    """Its workdir name."""
    return f"{self.algorithm}_e{self.epochs}_b{'inf' if self.batch is None else self.batch}"


# Table 2's rows in its order (FedSGD first).
ROWS = (Row("fedsgd", 1, None), Row("fedavg", 1, 50), Row("fedavg", 5, None),
        Row("fedavg", 1, 10), Row("fedavg", 5, 50), Row("fedavg", 5, 10))


def paper_rows(path: str = PAPER_TABLE) -> Dict[str, dict]:
  """Row label -> {"u", "iid", "noniid"} as the paper table file prints them (its cells)."""
  out = {}
  with open(path) as f:
    for line in f:
      cells = [c.strip() for c in line.strip().strip("|").split("|")]
      if len(cells) != 6 or cells[0] not in ("FedSGD", "FedAvg"):
        continue
      batch = None if cells[2] == "∞" else int(cells[2])
      row = Row(cells[0].lower(), int(cells[1]), batch)
      out[row.label] = {"u": cells[3], "iid": cells[4], "noniid": cells[5]}
  return out


def first_round(records, key: str, target: float) -> Optional[int]:
  """The round of the first record whose `key` is at or above `target` (None: never)."""
  for r in records:
    if key in r and r[key] >= target:
      return int(r["round"])
  return None


def _failed(outcome) -> bool:
  return isinstance(outcome, sweep.training.TrainingError)


@dataclasses.dataclass
class RoundsToTarget:
  """Table 2's rows on `base` (see the module docstring)."""
  base: object                       # configs/fedavg_shakespeare.py, scaled
  lrs: Sequence[float]               # the first points of every row's rate search
  full_lrs: Sequence[float]          # the grid the search widens into
  target: float
  stages: Sequence[int]              # round counts runs are extended through; the last: cap
  rows: Sequence[Row] = ROWS
  seeds: Sequence[int] = (0,)        # seeds[0] is the tuning seed (its run is reused)
  paper_target: float = PAPER_TARGET
  # Config fields every row sets itself (reproduce.settings_of leaves them out).
  row_fields = ("algorithm", "local_steps", "local_epochs", "batch_size", "local_lr", "rounds")

  def __post_init__(self):
    if list(self.stages) != sorted(set(self.stages)) or any(
        s % self.base.eval_every for s in self.stages):
      raise ValueError(f"stages {tuple(self.stages)} must increase and be multiples of "
                       f"eval_every={self.base.eval_every}")
    outside = sorted(set(self.lrs) - set(self.full_lrs))
    if outside:
      raise ValueError(f"rates {outside} are not points of the grid {tuple(self.full_lrs)}")
    self._sizes = None

  @property
  def tune_seed(self) -> int:
    return self.seeds[0]

  # ---- the data's client sizes (B = ∞ and u) -------------------------------------------
  def client_sizes(self) -> np.ndarray:
    """Training sequences per client: before the validation hold-out (index 0, its max is
    B = ∞ for every seed) and after the tuning seed's hold-out (index 1, for u)."""
    if self._sizes is None:
      from fedjax_lama import data as fdata, federation, training  # pylint: disable=g-import-not-at-top
      config = sweep.configured(self.base, seed=self.tune_seed)
      dataset = training.load_dataset(config, federation.resolve_data_dir(config.data_dir))
      before = np.bincount(dataset.train_client_ids)
      after = before
      if config.validation_fraction > 0:
        held, _ = fdata.split_validation(dataset, config.validation_fraction, config.seed)
        after = np.bincount(held.train_client_ids, minlength=len(before))
      self._sizes = (before[before > 0], after[before > 0])
    return self._sizes

  def full_batch(self) -> int:
    return int(self.client_sizes()[0].max())

  def updates_per_round(self, row: Row) -> float:
    """u = E n / B (n: the mean client's training sequences; FedSGD: 1)."""
    if row.algorithm == "fedsgd":
      return 1.0
    n = float(self.client_sizes()[1].mean())
    return row.epochs if row.batch is None else row.epochs * n / row.batch

  # ---- runs ----------------------------------------------------------------------------
  def config(self, row: Row, lr: float, seed: int, rounds: int):
    fields = {"algorithm": row.algorithm, "local_lr": lr, "seed": seed, "rounds": rounds}
    if row.algorithm == "fedavg":
      fields.update(local_epochs=row.epochs, local_steps=0,
                    batch_size=row.batch if row.batch is not None else self.full_batch())
    return sweep.configured(self.base, fields)

  @staticmethod
  def workdir(runs_dir: str, row: Row, lr: float, seed: int) -> str:
    return os.path.join(runs_dir, row.key, f"lr{lr:g}", f"seed{seed}")

  def reached(self, summary: dict) -> bool:
    records = summary["records"]
    return (first_round(records, "val_accuracy", self.target) is not None
            and first_round(records, "test_accuracy", self.target) is not None)

  def train_staged(self, row: Row, lrs: Sequence[float], seed: int, runs_dir: str) -> list:
    """Every rate of `lrs` at `seed`, each extended stage by stage until it reached the
    target (validation and test) or the cap; outcomes as sweep.run_group gives them."""
    done = {}
    for rounds in self.stages:
      todo = [lr for lr in lrs if lr not in done]
      if not todo:
        break
      outcomes = sweep.run_group([self.config(row, lr, seed, rounds) for lr in todo],
                                 [self.workdir(runs_dir, row, lr, seed) for lr in todo],
                                 extend=True)
      for lr, outcome in zip(todo, outcomes):
        if _failed(outcome) or self.reached(outcome) or rounds == self.stages[-1]:
          done[lr] = outcome
    return [done[lr] for lr in lrs]

  def score(self, outcome) -> tuple:
    """Smaller is better: (validation rounds to target, or inf; minus the mean of the last
    3 validation accuracies). A failed run scores (inf, inf)."""
    if _failed(outcome):
      return (math.inf, math.inf)
    rounds = first_round(outcome["records"], "val_accuracy", self.target)
    return (math.inf if rounds is None else rounds, -sweep.validation_score(outcome))

  def tune(self, row: Row, runs_dir: str) -> tuple:
    """(the rate picked, {rate: outcome} of every rate tried at the tuning seed)."""
    grid = sorted(self.full_lrs)
    tried = sorted(self.lrs)
    outcomes = {}
    while True:
      todo = [lr for lr in tried if lr not in outcomes]
      outcomes.update(zip(todo, self.train_staged(row, todo, self.tune_seed, runs_dir)))
      best = min(tried, key=lambda lr: self.score(outcomes[lr]))
      i = grid.index(best)
      if best == tried[0] and i > 0:
        tried.insert(0, grid[i - 1])
      elif best == tried[-1] and i + 1 < len(grid):
        tried.append(grid[i + 1])
      else:
        return best, outcomes

  def run(self, runs_dir: str) -> dict:
    """Row label -> {"lr", "u", "tried": {rate: tuning outcome summary}, "runs": the picked
    rate's outcome per seed}."""
    results = {}
    for row in self.rows:
      lr, outcomes = self.tune(row, runs_dir)
      runs = [outcomes[lr]] + [self.train_staged(row, [lr], seed, runs_dir)[0]
                               for seed in self.seeds[1:]]
      as_dict = lambda o: {"diverged": str(o)} if _failed(o) else o
      results[row.label] = {"lr": lr, "u": self.updates_per_round(row),
                            "tried": {lr_: as_dict(o) for lr_, o in outcomes.items()},
                            "runs": [as_dict(o) for o in runs]}
      reached = [None if "diverged" in r else first_round(r["records"], "test_accuracy",
                                                          self.target) for r in results[
                                                              row.label]["runs"]]
      print(f"{row.label}: lr {lr:g}, test rounds to {self.target:g}: {reached}", flush=True)
    return results

  # ---- the report ----------------------------------------------------------------------
  def rounds_cell(self, runs) -> tuple:
    """(rounds to the target on test, mean over seeds, or None; the cell's text)."""
    found = [None if "diverged" in r else first_round(r["records"], "test_accuracy",
                                                      self.target) for r in runs]
    if any("diverged" in r for r in runs):
      return None, "diverged"
    if any(x is None for x in found):
      cap = max(int(r["rounds"]) for r in runs)
      hit = [x for x in found if x is not None]
      text = f">{cap}" + (f" ({len(hit)} of {len(found)} seeds: {', '.join(map(str, hit))})"
                          if hit else "")
      return None, text
    mean = float(np.mean(found))
    return mean, f"{mean:g}" if len(found) == 1 else f"{mean:g} ({', '.join(map(str, found))})"

  def report(self, results: dict, plot_path: Optional[str] = None) -> str:
    paper = paper_rows()
    sgd = results.get(ROWS[0].label)
    sgd_rounds, _ = self.rounds_cell(sgd["runs"]) if sgd else (None, "")
    sgd_cap = max(int(r.get("rounds", 0)) for r in sgd["runs"]) if sgd else 0
    header = ["row", "u (ours)", "lr picked", f"rounds to {self.target:.0%} (test)",
              "speedup over FedSGD", "best test acc", "wall s / run",
              f"paper non-IID, {self.paper_target:.0%}", "paper IID", "paper u"]
    lines, ratios = [], {}
    for row in self.rows:
      res = results.get(row.label)
      p = paper.get(row.label, {})
      if res is None:
        lines.append([row.label, "not run"] + [""] * 5 + [p.get("noniid", "-"),
                                                          p.get("iid", "-"), p.get("u", "-")])
        continue
      rounds, cell = self.rounds_cell(res["runs"])
      if row.algorithm == "fedsgd":
        speed = "1×"
      elif rounds is not None and sgd_rounds is not None:
        ratios[row.label] = sgd_rounds / rounds
        speed = f"{ratios[row.label]:.1f}×"
      elif rounds is not None:  # FedSGD did not reach it: a lower bound
        ratios[row.label] = sgd_cap / rounds
        speed = f">{ratios[row.label]:.1f}×"
      else:
        speed = "-"
      ok = [r for r in res["runs"] if "diverged" not in r]
      lines.append([row.label, f"{res['u']:.1f}", f"{res['lr']:g}", cell, speed,
                    sweep.mean_std([r["best_test_accuracy"] for r in ok]),
                    f"{np.mean([r['wall_seconds'] for r in ok]):.0f}" if ok else "-",
                    p.get("noniid", "-"), p.get("iid", "-"), p.get("u", "-")])
    text = [sweep.markdown_table(header, lines), "",
            f"Rates tried at seed {self.tune_seed} (validation rounds to {self.target:g}; "
            "-: not reached within the rounds the run trained; the pick is in bold):", "",
            sweep.markdown_table(["row", "rate: validation rounds (rounds trained)"], [
                [row.label, ", ".join(self._tried_cell(lr, o, lr == results[row.label]["lr"])
                                      for lr, o in sorted(results[row.label]["tried"].items()))]
                for row in self.rows if row.label in results]), "",
            *[f"- {line}" for line in self.claims(results, ratios)]]
    if plot_path:
      self.plot(results, plot_path)
    return "\n".join(text)

  def _tried_cell(self, lr: float, outcome: dict, picked: bool) -> str:
    if "diverged" in outcome:
      cell = f"{lr:g}: diverged"
    else:
      rounds = first_round(outcome["records"], "val_accuracy", self.target)
      cell = f"{lr:g}: {'-' if rounds is None else rounds} ({outcome['rounds']})"
    return f"**{cell}**" if picked else cell

  def claims(self, results: dict, ratios: Dict[str, float]) -> List[str]:
    """The paper's claims on these rows, checked on the numbers."""
    out = []
    fedavg = [r for r in self.rows if r.algorithm == "fedavg" and r.label in results]
    if ROWS[0].label in results and fedavg:
      faster = [r.label for r in fedavg if r.label in ratios and ratios[r.label] > 1]
      verdict = "holds" if len(faster) == len(fedavg) else (
          "does not hold" if not faster else "partly holds")
      out.append(f"Every FedAvg row reaches the target in fewer rounds than FedSGD "
                 f"(paper, non-IID: 6.5× to 95.3×): {verdict} ({len(faster)} of "
                 f"{len(fedavg)} rows; speedups "
                 + ", ".join(f"{k} {v:.1f}×" for k, v in ratios.items()) + ").")
    if ratios:
      top = max(ratios.values())
      best = [k for k, v in ratios.items() if v == top]
      fastest = Row("fedavg", 5, 10).label
      verdict = ("does not hold" if fastest not in best else "holds" if len(best) == 1
                 else "holds, tied")
      out.append(f"E=5 B=10, the most computation per round, is the fastest row (paper: 41 "
                 f"rounds, 95.3×): {verdict} (the fastest here: {', '.join(best)}, "
                 f"{top:.1f}×).")
      paper = paper_rows()
      order = sorted(ratios, key=lambda k: -ratios[k])
      paper_order = sorted([k for k in ratios if k in paper],
                           key=lambda k: -float(paper[k]["noniid"].split("(")[1].rstrip("×)")))
      out.append("The rows in order of speedup, here: " + ", ".join(order)
                 + "; the paper's (non-IID): " + ", ".join(paper_order) + ".")
    return out

  def plot(self, results: dict, path: str) -> None:
    """Test accuracy against rounds, the picked rate of every row (seed means), with the
    target."""
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for row in self.rows:
      runs = [r for r in results.get(row.label, {}).get("runs", []) if "records" in r]
      if not runs:
        continue
      length = min(len(r["records"]) for r in runs)
      xs = [rec["round"] for rec in runs[0]["records"][:length]]
      ys = np.mean([[rec["test_accuracy"] for rec in r["records"][:length]] for r in runs],
                   axis=0)
      ax.plot(xs, ys, label=f"{row.label} (lr {results[row.label]['lr']:g})")
    ax.axhline(self.target, color="gray", linestyle="--", linewidth=1, label="target")
    ax.set_xscale("log")
    ax.set_xlabel("communication rounds")
    ax.set_ylabel("test accuracy (next character)")
    ax.set_title("Shakespeare by role, non-IID: FedSGD and FedAvg")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
