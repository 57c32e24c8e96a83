r"""FedAT's Tables 1-2 and its precision ablation on the simulated system (Chai et al., SC'21, Sec.
6).

  python -m experiments.fedat_tables --config=configs/fedat_fmnist.py \
      --config.data_dir=/path/to/data --budget_s=300 --seeds=0,1,2

For every #class setting (--settings: 2, 4, 6, 8, iid) and seed, runs FedAT, FedAvg,
FedProx, TiFL and FedAsync (--methods) on the same simulated system (3.1: 100 clients, the
paper's five straggler parts, 10 unstable clients, 5 tiers), and FedAT at polyline
precision 3, 4, 6 and none (--precisions) on --ablation_setting, each to --budget_s seconds
of virtual time. Then writes a markdown report (--report) with, mean ± std over seeds:
best accuracy, the average variance of per-client accuracy (absolute and normalised to
FedAT's, Table 1), virtual time and bytes up + down to the target accuracy (Table 2;
--targets, default 0.79 for #class 2 as in the paper), the ablation's uploads to target,
the paper's numbers beside (Chai et al., SC'21, Tables 1-2), which of the paper's orderings hold
here, and a plot of accuracy over virtual time (seed means). Raw numbers go to <report>.json.

Every run is an ordinary run directory under --out/budget<B>/<setting>/<method>/seed<s>
(resumable: an interrupted study continues where it stopped; finished runs are reused).
--finished_only trains nothing and reports what has finished: rows average the seeds they
have (the Runs table counts them) and the runs still missing are listed.
FedAT at precision 4 is the Table 1 FedAT run itself.

Cost on the 2-core CPU (FedAT's CNN, ~1 s per job of 3 epochs x 48 steps of 10 images):
jobs per virtual second are about 3.6 (FedAT), 7.8 (FedAsync: all 100 clients always busy),
0.3 (FedAvg, FedProx), 0.5 (TiFL), so one seed of the five settings plus the ablation is
about 73 jobs per virtual second: --budget_s=300 for three seeds is ~18 hours. Smoke test:
  python -m experiments.fedat_tables --config.data_dir=/path/to/data --budget_s=40 \
      --eval_interval_s=10 --seeds=0 --settings=2,iid --out=/tmp/fedat_smoke \
      --report=/tmp/fedat_smoke/report.md
"""
import dataclasses
import json
import math
import os
from typing import Optional

from absl import app, flags
from ml_collections import config_flags
import numpy as np

from configs import fedat_fmnist
from fedjax_lama.cli import logs

LABELS = {"fedat": "FedAT", "fedavg": "FedAvg", "fedprox": "FedProx", "tifl": "TiFL",
          "fedasync": "FedAsync", "asofed": "ASO-Fed", "fedbuff": "FedBuff"}
MB = 1e6  # the paper's MB, taken as 10^6 bytes (Chai et al., SC'21, metrics)

# Chai et al., SC'21, Tables 1-2, t1 (best accuracy; Norm. Var. to FedAT; FedAT's row: Abs. Var.).
PAPER_T1_FMNIST = {"TiFL": (0.859, 1.29), "FedAvg": (0.842, 1.86), "FedProx": (0.831, 2.243),
                   "FedAsync": (0.795, 2.0), "FedAT": (0.873, 0.007)}
PAPER_T1_CIFAR10 = {  # columns #2, #4, #6, #8, iid
    "TiFL": ((0.527, 0.615, 0.654, 0.655, 0.685), (1.26, 2.79, 1.33, 1.3, 2.12)),
    "FedAvg": ((0.547, 0.628, 0.654, 0.667, 0.686), (2, 5.07, 4.33, 3.1, 4.23)),
    "FedProx": ((0.509, 0.609, 0.624, 0.650, 0.669), (1.261, 6.75, 3.981, 2.22, 2.992)),
    "FedAsync": ((0.480, 0.541, 0.531, 0.561, 0.567), (2, 3.93, 2.08, 1.54, 2.69)),
    "FedAT": ((0.591, 0.633, 0.673, 0.681, 0.701), (0.0042, 0.0014, 0.0012, 0.001, 0.00052)),
}
PAPER_T2_FMNIST_MB = {"FedAvg": 1048.25, "TiFL": 1041.98, "FedProx": 2169.95,
                      "FedAsync": 9895.53, "FedAT": 1041.54}


FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags (defined only when it runs as a command, so the study is importable)."""
  config_flags.DEFINE_config_file("config", "configs/fedat_fmnist.py",
                                  "Base config (its #class setting is replaced per run).")
  flags.DEFINE_list("settings", list(fedat_fmnist.SETTINGS), "#class per client settings.")
  flags.DEFINE_list("methods", ["fedat", "fedavg", "fedprox", "tifl", "fedasync"],
                    "Methods of Tables 1-2 (also: asofed, fedbuff).")
  flags.DEFINE_list("precisions", ["3", "4", "6", "none"], "FedAT polyline precisions of the "
                    "ablation ('none': raw float32); empty to skip.")
  flags.DEFINE_string("ablation_setting", "2", "#class setting of the precision ablation.")
  flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds.")
  flags.DEFINE_float("budget_s", 300.0, "Virtual-time budget of every run (seconds).")
  flags.DEFINE_float("eval_interval_s", 50.0, "Virtual seconds between evaluation ticks.")
  flags.DEFINE_list("targets", ["2=0.79"], "Target accuracies per setting, setting=accuracy; a "
                    "setting given twice has two targets (the first is its runs' own).")
  flags.DEFINE_string("out", "experiments/results/fedat_fmnist/runs", "Run directories.")
  flags.DEFINE_string("report", "experiments/results/fedat_fmnist.md", "Markdown report.")
  flags.DEFINE_string("include", None, "An earlier report's JSON (<report>.json) whose runs "
                      "join the tables at --settings for the methods this command does not "
                      "run (their stored measures; not the plot): a new method's row beside a "
                      "committed study without retraining it.")
  flags.DEFINE_bool("finished_only", False, "Train nothing: report the runs that have finished "
                    "and list the missing ones (a study whose seeds differ by setting).")


# ---- runs ---------------------------------------------------------------------------------------
def parse_targets(items) -> dict:
  """["2=0.79", "2=0.4", "iid=0.8"] -> {"2": [0.79, 0.4], "iid": [0.8]}."""
  out = {}
  for item in items:
    setting, sep, value = item.partition("=")
    try:
      accuracy = float(value)
    except ValueError:
      accuracy = None
    if not sep or accuracy is None or not 0 < accuracy <= 1:
      raise app.UsageError(f"--targets: {item!r} is not setting=accuracy with an accuracy in "
                           "(0, 1], e.g. 2=0.79")
    setting = setting.strip().lower()
    if setting not in fedat_fmnist.SETTINGS:
      raise app.UsageError(f"--targets: {item!r} names no setting; the settings are "
                           f"{', '.join(fedat_fmnist.SETTINGS)}")
    out.setdefault(setting, []).append(accuracy)
  return out


def targets_of(targets: dict, setting: str) -> list:
  """The setting's target accuracies (a single number counts as a list of one)."""
  value = targets.get(setting)
  if value is None:
    return []
  return [float(v) for v in value] if isinstance(value, (list, tuple)) else [float(value)]


def run_target(targets: dict, setting: str) -> Optional[float]:
  """The target recorded in a run's own summary: the setting's first."""
  return (targets_of(targets, setting) or [None])[0]


def run_config(base, setting: str, method: str, seed: int, precision="4", budget_s=300.0,
               eval_interval_s=50.0, targets=None):
  """The config of one run: the base config at a setting, method, seed and budget."""
  c = base.copy_and_resolve_references()
  fedat_fmnist.apply_setting(c, setting, {setting: run_target(targets or {}, setting)})
  c.algorithm = method
  c.system.clock = method in ("fedavg", "fedprox")
  c.seed = seed
  c.system.max_virtual_time_s = float(budget_s)
  c.system.eval_interval_s = float(eval_interval_s)
  if method == "fedat":
    c.fedat.compression_precision = None if precision == "none" else int(precision)
  return c


def run_label(method: str, precision: str = "4") -> str:
  label = LABELS[method]
  return label if method != "fedat" or precision == "4" else f"{label}-p{precision}"


def run_one(config, workdir: str) -> dict:
  """Runs (or resumes, or reuses) one run; returns its summary and metrics records."""
  from fedjax_lama import training  # pylint: disable=g-import-not-at-top
  summary_path = os.path.join(workdir, "summary.json")
  if os.path.exists(summary_path):
    with open(summary_path) as f:
      summary = json.load(f)
  else:
    summary = training.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return {"summary": summary, "records": records, "workdir": workdir}


def measures(records: list, target: Optional[float]) -> dict:
  """The 3.5 measures of one run, from its metrics records."""
  from fedjax_lama.simulation import clock_run, robustness_metrics as metrics  # pylint: disable=g-import-not-at-top
  out = metrics.summarize(clock_run.ticks_from_records(records), target)
  uploads = records[-1]["uploads"]
  out["bytes_per_upload"] = records[-1]["bytes_up"] / uploads if uploads else None
  return out


def run_measures(run: dict, target: Optional[float]) -> Optional[dict]:
  """`measures` of a run: from its records, or, for a run included from an earlier report's
  JSON (no records), as that JSON stored them; None where it stored none for `target`."""
  if "records" in run:
    return measures(run["records"], target)
  stored = run.get("measures_at", {})
  if target is None:
    return next(iter(stored.values()), None)
  return stored.get(f"{target:g}")


def load_included(path: str, settings: list, budget_s: float) -> dict:
  """The runs of an earlier report's JSON (`<report>.json`) at `settings`, as results entries
  without records: the tables read their stored measures; the plot leaves them out."""
  try:
    with open(path) as f:
      stored = json.load(f)
    runs, stored_budget = stored["runs"], float(stored["budget_s"])
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise app.UsageError(f"--include: {path} is not a report JSON of this tool ({e})") from e
  if stored_budget != budget_s:
    raise app.UsageError(f"--include: {path} ran to {stored_budget:g} s of virtual time, this "
                         f"study to --budget_s={budget_s:g}; the rows must share the budget")
  out = {}
  for s in settings:
    for label, entries in runs.get(s, {}).items():
      for e in entries:
        # Reports before measures_at stored the measures at the setting's first target only.
        at = e.get("measures_at") or {f"{e['measures']['target']:g}"
                                      if e["measures"].get("target") is not None else "none":
                                      e["measures"]}
        out.setdefault(s, {}).setdefault(label, []).append(
            {"workdir": e["workdir"], "summary": e["summary"], "measures_at": at,
             "included_from": path})
  return out


# ---- statistics and formatting ------------------------------------------------------------------
def mean_std(values) -> Optional[tuple]:
  values = [v for v in values if v is not None and math.isfinite(v)]
  if not values:
    return None
  return float(np.mean(values)), float(np.std(values)), len(values)


def fmt(stat, digits=3, scale=1.0, total=None) -> str:
  if stat is None:
    return "not reached" if total else "-"
  mean, std, n = stat
  text = f"{mean / scale:.{digits}f}"
  if n > 1:  # one run has no spread to show
    text += f" ± {std / scale:.{digits}f}"
  if total is not None and n < total:
    text += f" ({n}/{total})"
  return text


def ordering_lines(table: dict, settings: list, seeds: int,
                   targets: Optional[dict] = None) -> list:
  """Which of the paper's qualitative outcomes (Chai et al., SC'21, Sec. 6) hold in these runs
  (Table 2's at every target of `targets`)."""
  lines = []
  for s in settings:
    rows = {m: row for m, row in table[s].items() if "-p" not in m}  # the ablation aside
    acc = {m: row["best"][0] for m, row in rows.items() if row["best"]}
    var = {m: row["var"][0] for m, row in rows.items() if row["var"]}
    if "FedAT" not in acc or len(acc) < 2:
      continue
    best = max(acc, key=acc.get)
    worst = min(acc, key=acc.get)
    lowest = min(var, key=var.get)
    lines.append(
        f"- #class {s}: best accuracy {best} ({acc[best]:.3f}) — FedAT first: "
        f"{'holds' if best == 'FedAT' else 'does not hold'}; lowest variance {lowest} — "
        f"{'holds' if lowest == 'FedAT' else 'does not hold'}; worst accuracy {worst} "
        f"({acc[worst]:.3f}) — FedAsync last: "
        f"{'holds' if worst == 'FedAsync' else 'does not hold'}.")
    for t in targets_of(targets or {}, s):
      lines.append(f"- #class {s}, target {t:g}: " + _target_claims(rows, t))
  return lines


def _target_claims(rows: dict, target: float) -> str:
  """Table 2's outcomes at one target: FedAT needs the fewest bytes (up + down) and reaches
  the target sooner than the synchronous baselines (Chai et al., SC'21, Sec. 6). A method counts as
  reaching it only when every one of its runs does; rows without measures at `target` (from
  an included JSON that stored none) are left out."""
  rows = {m: row for m, row in rows.items() if row["to_target"].get(target) is not None}
  if "FedAT" not in rows:
    return "FedAT has no measures at this target, so its claims are not checked."

  def reached(label, key):
    stat = rows[label]["to_target"][target][key]
    return stat[0] if stat is not None and stat[2] == rows[label]["runs"] else None

  bytes_to = {m: reached(m, "bytes_to_target") for m in rows}
  if bytes_to.get("FedAT") is None:
    missed = "no method reaches it" if all(v is None for v in bytes_to.values()) else \
        "FedAT does not reach it in every seed"
    return f"{missed}, so FedAT's fewest bytes and earliest time do not hold."
  fewest = min((v, m) for m, v in bytes_to.items() if v is not None)[1]
  parts = [f"fewest MB up + down {fewest} ({bytes_to[fewest] / MB:.2f}) — FedAT fewest: "
           f"{'holds' if fewest == 'FedAT' else 'does not hold'}"]
  fedat_time = reached("FedAT", "time_to_target")
  for m in ("TiFL", "FedAvg", "FedProx"):
    if m not in rows:
      continue
    other = reached(m, "time_to_target")
    if other is None:
      parts.append(f"{m} does not reach it, FedAT does: sooner holds")
    else:
      parts.append(f"time to it {m} / FedAT = {other / max(fedat_time, 1e-9):.2f}x (the "
                   f"paper: 5-6x on CIFAR-10) — sooner: "
                   f"{'holds' if other > fedat_time else 'does not hold'}")
  return "; ".join(parts) + "."


def plot(results: dict, settings: list, path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 3.4), dpi=100,
                           squeeze=False)
  for ax, s in zip(axes[0], settings):
    for label, runs in results[s].items():
      runs = [r for r in runs if "records" in r]
      if not runs:
        continue
      length = min(len(r["records"]) for r in runs)
      t = [r["virtual_time"] for r in runs[0]["records"][:length]]
      acc = np.mean([[r["test_accuracy"] for r in run["records"][:length]] for run in runs], 0)
      ax.plot(t, acc, label=label, linestyle="--" if "-p" in label else "-")
    ax.set_title(f"#class {s}")
    ax.set_xlabel("virtual time (s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
  axes[0][0].set_ylabel("accuracy (pooled local test sets)")
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


# ---- the report ---------------------------------------------------------------------------------
def build_tables(results: dict, settings: list, targets: dict, num_seeds: int) -> dict:
  table = {}
  for s in settings:
    table[s] = {}
    fedat_var = [run_measures(r, None)["mean_variance"] for r in results[s].get("FedAT", [])]
    for label, runs in results[s].items():
      m = [run_measures(r, None) for r in runs]
      norm = ([a["mean_variance"] / b for a, b in zip(m, fedat_var)]
              if len(fedat_var) == len(m) else [])
      row = {"best": mean_std([x["best_accuracy"] for x in m]),
             "var": mean_std([x["mean_variance"] for x in m]),
             "norm_var": mean_std(norm), "runs": len(m),
             "final_time": mean_std([x["final_virtual_time"] for x in m]),
             "bytes_per_upload": mean_std([x["bytes_per_upload"] for x in m]),
             "final_mb_up": mean_std([x["final_bytes_up"] for x in m]),
             "wall": mean_std([r["summary"].get("wall_seconds") for r in runs])}
      row["to_target"] = {}
      for t in targets_of(targets, s):
        reached = [run_measures(r, t) for r in runs]
        # None: an included report's JSON stored no measures at this target.
        row["to_target"][t] = None if None in reached else {
            key: mean_std([x[key] for x in reached])
            for key in ("time_to_target", "time_to_target_smoothed", "bytes_to_target",
                        "bytes_to_target_up")}
      table[s][label] = row
  return table


def setup_text(c, fedbuff: bool = False) -> str:
  """The simulated system and the local training of the study, from its base config."""
  sysc = c.system
  per_step = sysc.compute_model.step_cost_s
  return (
      f"Dataset {c.dataset}, model {c.model}, {c.num_clients} clients; straggler delays "
      f"{', '.join(f'{lo:g}-{hi:g}' for lo, hi in sysc.straggler_ranges)} s added per job "
      f"({sysc.compute_model.kind} compute, {per_step} s per local step), "
      f"{sysc.num_unstable} unstable clients, {sysc.num_tiers} tiers ({sysc.tiering}); "
      f"{c.fedat.clients_per_round} clients per tier round (FedAvg / FedProx "
      f"{max(1, round(c.active_ratio * c.num_clients))}, TiFL {c.tifl.clients_per_round}); "
      f"E = {c.local_epochs}, B = {c.batch_size}, {sysc.local_optimizer}(lr {c.local_lr:g}); "
      f"lambda = {c.fedat.lam:g}, mu = {c.fedprox.mu:g}, FedAsync alpha = "
      f"{c.fedasync.alpha:g} ({c.fedasync.staleness}); FedAT at polyline precision "
      f"{c.fedat.compression_precision} both ways ({sysc.polyline_mode}), the others raw "
      "float32 (FedAT, Chai et al., SC'21)."
      + (f" FedBuff (Nguyen et al., AISTATS 2022): {c.fedbuff.concurrency} clients training "
         f"at once, a server step every K = {c.fedbuff.buffer_size} updates with eta_g = "
         f"{c.fedbuff.server_lr:g}, staleness weight {c.fedbuff.staleness} (a = "
         f"{c.fedbuff.poly_a:g})." if fedbuff else ""))


def report(base, results: dict, settings: list, targets: dict, seeds: list, ablation: list,
           plot_name: str, budget_s: float = 300.0, eval_interval_s: float = 50.0,
           ablation_setting: str = "2", missing: Optional[list] = None,
           requested_settings: Optional[list] = None, include: Optional[str] = None) -> str:
  """The markdown report of `settings` (those with runs). `missing` (finished_only studies):
  the (setting, label, seed) runs not yet finished; each row then averages the seeds it has.
  `requested_settings`: the command's --settings, when some have no run yet."""
  n = len(seeds)
  tabled = settings + [s for s in [ablation_setting] if ablation and s in results
                       and s not in settings]
  table = build_tables(results, tabled, targets, n)
  lines = [
      f"# FedAT on {base.dataset}: Tables 1-2 and the precision ablation on the simulated "
      "system", "",
      "Produced by `python -m experiments.fedat_tables` (Chai et al., SC'21, Sec. 6) with "
      f"`--budget_s={budget_s:g} --eval_interval_s={eval_interval_s:g} "
      f"--seeds={','.join(map(str, seeds))} "
      f"--settings={','.join(requested_settings or settings)} "
      f"--precisions={','.join(ablation)} --targets="
      + ",".join(f"{s}={t:g}" for s in targets for t in targets_of(targets, s))
      + f"{' --finished_only' if missing is not None else ''}"
      + (f" --include={include}` (plus the --config overrides of the setup below); the rows "
         "of methods this command did not run come from that JSON, as it stored them (the "
         "plot and the targets it did not store leave them out). " if include else
         "` (plus the --config overrides of the setup below). ")
      + f"{setup_text(base, any('FedBuff' in results[s] for s in settings))} "
      f"Accuracy is pooled over every client's local "
      f"{base.local_test_fraction:.0%} test split at each tick; variance is the population "
      "variance of per-client accuracy averaged over the ticks (Chai et al., SC'21); "
      "mean ± std over "
      + (f"{n} seed(s)" if missing is None else
         f"the finished seeds of {n} (the Runs table counts each row's)")
      + ". The paper trained to convergence within an unstated budget; this study "
      f"stops at {budget_s:g} s of virtual time, so compare orderings, not absolute "
      "numbers.",
      "",
      "## Table 1: best accuracy and accuracy variance",
      "",
      "| method | row | " + " | ".join(f"#class {s}" for s in settings)
      + " | paper F-MNIST #2 | paper CIFAR-10 #2/#4/#6/#8/iid |",
      "|---|---|" + "---|" * len(settings) + "---|---|",
  ]
  methods = [l for l in ("TiFL", "FedAvg", "FedProx", "FedAsync", "ASO-Fed", "FedBuff", "FedAT")
             if any(l in table[s] for s in settings)]
  for label in methods:
    paper_f = PAPER_T1_FMNIST.get(label)
    paper_c = PAPER_T1_CIFAR10.get(label)
    cells = [fmt(table[s][label]["best"]) if label in table[s] else "-" for s in settings]
    lines.append(f"| {label} | Accuracy | " + " | ".join(cells) +
                 f" | {paper_f[0] if paper_f else '-'} | "
                 f"{'/'.join(map(str, paper_c[0])) if paper_c else '-'} |")
    if label == "FedAT":
      cells = [fmt(table[s][label]["var"], 5) if label in table[s] else "-" for s in settings]
      lines.append(f"| {label} | Abs. Var. | " + " | ".join(cells) +
                   f" | {paper_f[1]} | {'/'.join(map(str, paper_c[1]))} |")
    else:
      cells = [fmt(table[s][label]["norm_var"], 2) if label in table[s] else "-"
               for s in settings]
      lines.append(f"| {label} | Norm. Var. | " + " | ".join(cells) +
                   f" | {paper_f[1] if paper_f else '-'} | "
                   f"{'/'.join(map(str, paper_c[1])) if paper_c else '-'} |")
  impr = []
  for s in settings:
    acc = {l: table[s][l]["best"][0] for l in table[s]
           if table[s][l]["best"] and "-p" not in l}
    if "FedAT" in acc and len(acc) > 1:
      base = {l: a for l, a in acc.items() if l != "FedAT"}
      best, worst = max(base, key=base.get), min(base, key=base.get)
      impr.append(f"{(acc['FedAT'] - base[best]) / acc['FedAT']:.2%} vs {best} / "
                  f"{(acc['FedAT'] - base[worst]) / acc['FedAT']:.2%} vs {worst}")
    else:
      impr.append("-")
  lines += [f"| | impr.(a) / (b) | " + " | ".join(impr) + " | 1.6% / 8.93% | "
            "7.44%/0.79%/2.82%/2.05%/2.13% (a) |", ""]
  lines += ["impr. = (acc_FedAT - acc_baseline) / acc_FedAT against the best (a) and worst (b) "
            "baseline, from the seed means (Chai et al., SC'21, metrics).", ""]

  lines += ["## Table 2: virtual time and data to the target accuracy", ""]
  for s in settings:
    for t in targets_of(targets, s):
      # The paper's MB are for Fashion-MNIST #class 2 at 0.79 only.
      paper_mb = PAPER_T2_FMNIST_MB if (s, t) == ("2", 0.79) else {}
      lines += [f"#class {s}, target accuracy {t:g} (first tick at or above it; 'smoothed' "
                "uses the trailing mean of 5 ticks; reached in k/n seeds when not all):", "",
                "| method | virtual time to target (s) | smoothed (s) | MB up + down to target "
                "| MB up to target | paper MB (F-MNIST 0.79) |",
                "|---|---|---|---|---|---|"]
      for label in methods:
        if label not in table[s]:
          continue
        row, runs = table[s][label]["to_target"][t], table[s][label]["runs"]
        if row is None:
          lines.append(f"| {label} | not stored in the included JSON | | | | "
                       f"{paper_mb.get(label, '-')} |")
          continue
        lines.append(f"| {label} | {fmt(row['time_to_target'], 0, total=runs)} | "
                     f"{fmt(row['time_to_target_smoothed'], 0, total=runs)} | "
                     f"{fmt(row['bytes_to_target'], 2, MB, total=runs)} | "
                     f"{fmt(row['bytes_to_target_up'], 2, MB, total=runs)} | "
                     f"{paper_mb.get(label, '-')} |")
      lines.append("")
  if not any(targets_of(targets, s) for s in settings):
    lines += ["No setting of this study has a target (--targets).", ""]

  if ablation:
    s = ablation_setting
    ablation_targets = targets_of(targets, s)
    lines += [f"## Precision ablation (FedAT, #class {s}; paper Fig. 5 on CIFAR-10)", "",
              "| precision | best accuracy | mean variance | bytes per upload | MB uploaded "
              "in the budget | "
              + ("".join(f"MB up to {t:g} | virtual time to {t:g} (s) | "
                         for t in ablation_targets)
                 or "MB up to target | virtual time to target (s) | ").rstrip(),
              "|---|---|---|---|---|" + "---|---|" * max(1, len(ablation_targets))]
    for p in ablation:
      label = run_label("fedat", p)
      if label not in table.get(s, {}):
        continue
      row = table[s][label]
      # "-" without a target, "not reached" (in k of the row's runs) with one.
      reached = [row["to_target"][t] or {} for t in ablation_targets] or [{}]
      total = row["runs"] if ablation_targets else None
      lines.append(f"| {p} | {fmt(row['best'])} | {fmt(row['var'], 5)} | "
                   f"{fmt(row['bytes_per_upload'], 0)} | {fmt(row['final_mb_up'], 2, MB)} | "
                   + "".join(f"{fmt(r.get('bytes_to_target_up'), 2, MB, total=total)} | "
                             f"{fmt(r.get('time_to_target'), 0, total=total)} | "
                             for r in reached).rstrip())
    lines += ["", "Paper (x3, CIFAR-10 #class 2): precision 3 is the worst; at the 0.50 target "
              "precision 4 uploads 36.41 % less than precision 6 and 67.3 % less than no "
              "compression. A raw upload of FedAT's Fashion-MNIST CNN is 373,288 bytes.", ""]

  lines += ["## Where the paper's ordering holds here", ""]
  lines += (ordering_lines(table, settings, n, targets)
            or ["- (no setting with FedAT and a baseline)"])
  if ablation and ablation_setting in table:
    accs = {p: table[ablation_setting].get(run_label("fedat", p), {}).get("best")
            for p in ablation}
    accs = {p: a[0] for p, a in accs.items() if a}
    if len(accs) > 1:
      worst = min(accs, key=accs.get)
      lines.append(f"- precision ablation: lowest best accuracy at precision {worst} — "
                   f"precision 3 worst: {'holds' if worst == '3' else 'does not hold'}.")
  lines += ["", f"![accuracy over virtual time]({plot_name})", "",
            "## Runs", "",
            "| #class | method | seeds | virtual time reached (s) | wall s per run |",
            "|---|---|---|---|---|"]
  for s in tabled:
    for label, row in table[s].items():
      lines.append(f"| {s} | {label} | {row['runs']} | {fmt(row['final_time'], 0)} | "
                   f"{fmt(row['wall'], 0)} |")
  if missing:
    seeds_of = {}
    for setting, label, seed in missing:
      seeds_of.setdefault((setting, label), []).append(str(seed))
    lines += ["", f"Not finished, so not in the tables ({len(missing)} runs): " + "; ".join(
        f"#class {s} {label} seed {', '.join(ss)}" for (s, label), ss in seeds_of.items())
              + "."]
  return "\n".join(lines) + "\n"


@dataclasses.dataclass
class FedATStudy:
  """Tables 1-2 and the precision ablation: every run, then the report (reproduce's study)."""
  base: object
  settings: list
  methods: list
  precisions: list
  seeds: list
  budget_s: float = 300.0
  eval_interval_s: float = 50.0
  targets: dict = dataclasses.field(default_factory=lambda: {"2": 0.79})
  ablation_setting: str = "2"
  finished_only: bool = False        # report finished runs only; train nothing
  include: Optional[str] = None      # an earlier report's JSON whose other methods' runs join
  missing: list = dataclasses.field(default_factory=list, init=False)  # set by run()

  def plan(self) -> list:
    plan = [(s, m, "4") for s in self.settings for m in self.methods]
    plan += [(self.ablation_setting, "fedat", p) for p in self.precisions
             if (self.ablation_setting, "fedat", p) not in plan]
    return plan

  def run(self, runs_dir: str) -> dict:
    root = os.path.join(runs_dir, f"budget{self.budget_s:g}")
    results = {}
    self.missing = []
    for seed in self.seeds:
      for setting, method, precision in self.plan():
        label = run_label(method, precision)
        workdir = os.path.join(root, setting, label, f"seed{seed}")
        if self.finished_only and not os.path.exists(os.path.join(workdir, "summary.json")):
          self.missing.append((setting, label, seed))
          continue
        config = run_config(self.base, setting, method, seed, precision, self.budget_s,
                            self.eval_interval_s, self.targets)
        out = run_one(config, workdir)
        results.setdefault(setting, {}).setdefault(label, []).append(out)
        s = out["summary"]
        print(f"#class {setting} {label} seed {seed}: best {s['best_test_accuracy']:.4f} "
              f"virtual {s['virtual_time']:.0f}s updates {s['global_updates']} "
              f"MB {s['comm_bytes'] / MB:.1f} wall {s['wall_seconds']:.0f}s", flush=True)
    if self.include:
      for setting, by_label in load_included(self.include, self.settings, self.budget_s).items():
        for label, runs in by_label.items():
          if label not in results.get(setting, {}):  # this command's own runs come first
            results.setdefault(setting, {})[label] = runs
    return results

  def report(self, results: dict, plot_path: Optional[str] = None) -> str:
    settings = [s for s in self.settings if s in results]
    plot_name = ""
    if plot_path:
      plot(results, settings, plot_path)
      plot_name = os.path.basename(plot_path)
    return report(self.base, results, settings, self.targets, self.seeds, self.precisions,
                  plot_name, self.budget_s, self.eval_interval_s, self.ablation_setting,
                  self.missing if self.finished_only else None, self.settings, self.include)

  def raw(self, results: dict) -> dict:
    """Per run: its summary and its measures at every target of its setting (None: the
    target-free measures), which `load_included` reads back."""
    def entry(r, s):
      at = {f"{t:g}" if t is not None else "none": run_measures(r, t)
            for t in targets_of(self.targets, s) or [None]}
      return {"workdir": r["workdir"], "summary": r["summary"],
              "measures": next(iter(at.values())), "measures_at": at,
              **({"included_from": r["included_from"]} if "included_from" in r else {})}
    return {s: {label: [entry(r, s) for r in runs] for label, runs in by_label.items()}
            for s, by_label in results.items()}


def main(argv):
  del argv
  logs.progress_only()
  study = FedATStudy(FLAGS.config, [s.lower() for s in FLAGS.settings], list(FLAGS.methods),
                     [p.lower() for p in FLAGS.precisions], [int(s) for s in FLAGS.seeds],
                     FLAGS.budget_s, FLAGS.eval_interval_s, parse_targets(FLAGS.targets),
                     FLAGS.ablation_setting, FLAGS.finished_only, FLAGS.include)
  results = study.run(FLAGS.out)
  report_dir = os.path.dirname(os.path.abspath(FLAGS.report))
  os.makedirs(report_dir, exist_ok=True)
  plot_path = os.path.splitext(os.path.abspath(FLAGS.report))[0] + "_accuracy.png"
  text = study.report(results, plot_path)
  with open(FLAGS.report, "w") as f:
    f.write(text)
  with open(os.path.splitext(FLAGS.report)[0] + ".json", "w") as f:
    json.dump({"budget_s": study.budget_s, "seeds": study.seeds, "targets": study.targets,
               "runs": study.raw(results)}, f, indent=1, default=lambda x: None)
  print(text)


if __name__ == "__main__":
  define_flags()
  app.run(main)
