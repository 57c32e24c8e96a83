"""What a reproduced table runs: comparisons of tuned variants, and FedLAMA interval tables.

A `Comparison` is a list of variants (config overrides) of one base config. Each variant's
local learning rate is tuned on the validation split (seed `tune_seed`, a log grid), fixed, or
borrowed from another variant (ablations keep the rate of their reference); then it runs with
every seed. A `FedLamaTable` is the AAAI/v1 layout: FedAvg(tau'), FedAvg(phi tau') and
FedLAMA(tau', phi) at one local-step budget, with comm ratios and early stopping as
AAAI reports it (Lee et al., AAAI 2023: the first evaluation above FedAvg's best).
Both return markdown and plots; runs are resumable workdirs under one directory.
"""
import dataclasses
import os
from typing import Callable, Optional, Sequence

import numpy as np

from experiments import sweep


@dataclasses.dataclass(frozen=True)
class Variant:
  label: str
  overrides: dict = dataclasses.field(default_factory=dict)
  lr: Optional[float] = None        # fixed local rate (None: tuned, or borrowed)
  lr_from: Optional[str] = None     # use the tuned rate of this variant
  lrs: Optional[Sequence[float]] = None   # this variant's own grid (default: the study's)
  # The larger grid `lrs` widens into while the pick is at an edge (sweep.tune_widening);
  # None: the study's `full_lrs`, and if that is None too, no widening.
  full_lrs: Optional[Sequence[float]] = None
  paper: str = ""                   # the paper's number(s) for this row, as printed


@dataclasses.dataclass
class Comparison:
  """Variants of `base` at one budget; see the module docstring."""
  base: object                       # ConfigDict
  variants: Sequence[Variant]
  lrs: Sequence[float]
  seeds: Sequence[int] = (0, 1, 2)
  tune_seed: int = 0
  target: Optional[float] = None     # report the first round with test accuracy >= target
  early_rounds: Sequence[int] = ()   # report test accuracy at these rounds (Fed-LAMB's claim)
  paper_header: str = "paper"
  full_lrs: Optional[Sequence[float]] = None  # default Variant.full_lrs

  def run(self, runs_dir: str) -> dict:
    tuned, results = {}, {}
    by_label = {v.label: v for v in self.variants}

    def config_of(v):
      return lambda lr, seed: sweep.configured(self.base, v.overrides, local_lr=lr, seed=seed)

    def workdir_of(v):
      return lambda lr, seed: os.path.join(runs_dir, _slug(v.label), f"lr{lr:g}", f"seed{seed}")

    def rate(v):
      if v.lr is not None:
        return v.lr
      if v.lr_from is not None:
        return rate(by_label[v.lr_from])
      if v.label not in tuned:
        lrs = v.lrs or self.lrs
        tuned[v.label] = sweep.tune_widening(config_of(v), lrs, self.tune_seed, workdir_of(v),
                                             v.full_lrs or self.full_lrs or lrs)
      return tuned[v.label].value

    for v in self.variants:
      lr = rate(v)
      outcomes = sweep.run_group([config_of(v)(lr, seed) for seed in self.seeds],
                                 [workdir_of(v)(lr, seed) for seed in self.seeds])
      # A diverged run is reported as such; the study goes on.
      runs = [{"diverged": str(r)} if isinstance(r, sweep.training.TrainingError) else r
              for r in outcomes]
      results[v.label] = {"lr": lr, "runs": runs,
                          "scores": tuned[v.label].scores if v.label in tuned else None}
      print(f"{v.label}: lr {lr:g}, final test accuracy "
            f"{sweep.mean_std([r.get('final_test_accuracy') for r in runs])}", flush=True)
    return results

  def report(self, results: dict, plot_path: Optional[str] = None) -> str:
    header = ["variant", "local lr", "final test acc", "best test acc"]
    if self.target is not None:
      header.append(f"rounds to {self.target:.2f}")
    header += [f"acc @ round {r}" for r in self.early_rounds]
    header += ["floats up / d / client / round", "floats down / d", "bits up / 32d",
               "wall s / run", self.paper_header]
    rows = []
    for v in self.variants:
      res = results[v.label]
      runs = [r for r in res["runs"] if "diverged" not in r]
      if not runs:
        rows.append([v.label, f"{res['lr']:g}", "diverged"] + [""] * (len(header) - 3))
        continue
      row = [v.label, f"{res['lr']:g}",
             sweep.mean_std([r["final_test_accuracy"] for r in runs]),
             sweep.mean_std([r["best_test_accuracy"] for r in runs])]
      if self.target is not None:
        reached = [rounds_to(r["records"], self.target) for r in runs]
        row.append(", ".join(str(x) if x is not None else f">{runs[0]['rounds']}"
                             for x in reached))
      for k in self.early_rounds:
        row.append(sweep.mean_std([accuracy_at(r["records"], k) for r in runs]))
      per = _participations(self.base, runs[0])
      d = runs[0]["num_parameters"]
      row += [f"{runs[0]['comm_floats_up'] / (d * per):.4g}",
              f"{runs[0]['comm_floats_down'] / (d * per):.4g}",
              f"{runs[0]['comm_bits_up'] / (32 * d * per):.4g}",
              f"{np.mean([r['wall_seconds'] for r in runs]):.0f}", v.paper or "-"]
      if len(runs) < len(res["runs"]):
        row[2] += f" ({len(res['runs']) - len(runs)} diverged)"
      rows.append(row)
    text = [sweep.markdown_table(header, rows)]
    tuned = {k: r for k, r in results.items() if r["scores"]}
    if tuned:
      text += ["", f"Validation scores of the tuning runs (seed {self.tune_seed}; mean "
               "validation accuracy of the last 3 evaluations; -inf: diverged):", "",
               sweep.markdown_table(["variant", "lr: validation score"],
                                    [[k, ", ".join(f"{lr:g}: {score:.4f}" for lr, score in
                                                   sorted(r["scores"].items()))]
                                     for k, r in tuned.items()])]
      edges = [f"{k} ({r['lr']:g}, the {'top' if r['lr'] == max(r['scores']) else 'bottom'})"
               for k, r in tuned.items()
               if len(r["scores"]) > 1 and r["lr"] in (min(r["scores"]), max(r["scores"]))]
      if edges:
        text += ["", "Picked at an edge of its grid, so a better rate may lie outside it: "
                 + ", ".join(edges) + "."]
    if plot_path:
      curves = {k: [r["records"] for r in res["runs"] if "records" in r]
                for k, res in results.items()}
      sweep.plot_curves(plot_path, {k: v for k, v in curves.items() if v}, xkey="round",
                        xlabel="round", title="test accuracy, mean over seeds")
    return "\n".join(text)


def rounds_to(records, target: float) -> Optional[int]:
  for r in records:
    if r["test_accuracy"] >= target:
      return r["round"]
  return None


def accuracy_at(records, round_idx: int) -> Optional[float]:
  for r in records:
    if r["round"] >= round_idx:
      return r["test_accuracy"]
  return None


def _participations(base, summary) -> int:
  cohort = max(1, int(round(base.active_ratio * base.num_clients)))
  return summary["rounds"] * cohort


def _slug(label: str) -> str:
  return "".join(c if c.isalnum() or c in "._-" else "_" for c in label)


def base_name(config) -> str:
  """The schedule FedLAMA is compared with: FedAvg, FedProx or FedPAQ (AAAI Tables 3, 4)."""
  if config.compressor.name == "qsgd":
    return "FedPAQ"
  return "FedProx" if config.fedlama.local_algorithm == "fedprox" else "FedAvg"


def run_variants(base, phis, total_steps, eval_steps=0):
  """(label, config) pairs: FedAvg(tau'), FedAvg(phi tau'), FedLAMA(tau', phi).

  eval_steps: evaluate every this many local steps (0: at every longest window)."""
  tau = base.fedlama.base_interval
  name = base_name(base)
  lama = "FedLAMA" if name == "FedAvg" else f"{name}+FedLAMA"
  out = []

  def variant(label, interval, phi, fixed=None):
    c = base.copy_and_resolve_references()
    c.fedlama.base_interval, c.fedlama.phi = interval, phi
    c.fedlama.fixed_multipliers = fixed
    c.fedlama.total_steps = total_steps
    window = interval * phi
    every = eval_steps or tau * max(phis)
    c.eval_every = max(1, every // window)
    out.append((label, c))

  variant(f"{name}({tau})", tau, 1)
  for phi in phis:
    variant(f"{name}({phi * tau})", phi * tau, 1)
  for phi in phis:
    variant(f"{lama}({tau},{phi})", tau, phi)
  return out


def early_stop(lama_records, baseline_best, total_steps):
  """Early stopping as AAAI reports it: first evaluation beating the baseline's best; None when it
  never does."""
  for r in lama_records:
    if r["test_accuracy"] > baseline_best:
      return {"step": r["local_steps"], "accuracy": r["test_accuracy"],
              "comm_ratio_budget": r["comm_ratio"] * r["local_steps"] / total_steps}
  return None


@dataclasses.dataclass
class FedLamaTable:
  """FedAvg(tau'), FedAvg(phi tau'), FedLAMA(tau', phi) at one local-step budget (the tables of Lee
  et al., AAAI 2023 and arXiv:2110.10302)."""
  base: object                      # a FedLAMA config (config.fedlama.*)
  phis: Sequence[int]
  total_steps: int
  seeds: Sequence[int] = (0,)
  eval_steps: int = 0
  paper: dict = dataclasses.field(default_factory=dict)   # run label -> printed numbers

  def run(self, runs_dir: str) -> dict:
    results = {}
    for seed in self.seeds:
      for label, c in run_variants(self.base, list(self.phis), self.total_steps,
                                                   self.eval_steps):
        c.seed = seed
        summary = sweep.run(c, os.path.join(runs_dir, _slug(label), f"seed{seed}"))
        results.setdefault(label, []).append(summary)
        print(f"{label} seed {seed}: final {summary['final_test_accuracy']:.4f}", flush=True)
    return results

  def report(self, results: dict, plot_path: Optional[str] = None) -> str:
    tau = self.base.fedlama.base_interval
    name = base_name(self.base)
    ref = [r["comm_floats_up"] for r in results[f"{name}({tau})"]]
    rows = []
    for label, runs in results.items():
      ratio = [r["comm_floats_up"] / ref[i] for i, r in enumerate(runs)]
      stops = "-"
      if "FedLAMA(" in label:
        phi = int(label.rsplit(",", 1)[1].rstrip(")"))
        baseline = results[f"{name}({phi * tau})"]
        found = [early_stop(r["records"], b["best_test_accuracy"],
                                            self.total_steps) for r, b in zip(runs, baseline)]
        stops = "; ".join("not reached" if e is None else
                          f"{e['step']}, {e['accuracy']:.4f}, {e['comm_ratio_budget']:.4f}"
                          for e in found)
      rows.append([label, sweep.mean_std([r["final_test_accuracy"] for r in runs]),
                   sweep.mean_std([r["best_test_accuracy"] for r in runs]),
                   f"{np.mean(ratio):.4f}", stops,
                   f"{np.mean([r['wall_seconds'] for r in runs]):.0f}",
                   self.paper.get(label, "-")])
    if plot_path:
      sweep.plot_curves(plot_path, {k: [r["records"] for r in v] for k, v in results.items()},
                        title="test accuracy against local steps")
    return sweep.markdown_table(["run", "final test acc", "best test acc", "comm ratio",
                                 "early stop: step, acc, C ratio", "wall s / run", "paper"],
                                rows)


@dataclasses.dataclass
class Multi:
  """Several studies of one table (its columns: datasets, partitions), reported in turn."""
  parts: dict                        # column name -> study

  def run(self, runs_dir: str) -> dict:
    return {name: part.run(os.path.join(runs_dir, _slug(name)))
            for name, part in self.parts.items()}

  def report(self, results: dict, plot_path: Optional[str] = None) -> str:
    text = []
    for name, part in self.parts.items():
      path = plot_path and plot_path.replace(".png", f"_{_slug(name)}.png")
      text += [f"### {name}", "", part.report(results[name], path), ""]
    return "\n".join(text)


@dataclasses.dataclass
class Custom:
  """A study with its own runner and report (FedAT's clock-based tables)."""
  run_fn: Callable[[str], dict]
  report_fn: Callable[[dict, Optional[str]], str]

  def run(self, runs_dir: str) -> dict:
    return self.run_fn(runs_dir)

  def report(self, results: dict, plot_path: Optional[str] = None) -> str:
    return self.report_fn(results, plot_path)
