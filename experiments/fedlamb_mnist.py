r"""Fed-LAMB against Fed-AMS and Fed-SGD on MNIST: every panel of issue 17 and one summary.

  python -m experiments.fedlamb_mnist --scale=small

Runs (or reuses) the eight MNIST studies of `experiments.reproduce` (--panels: the MLP and the
CNN, IID and one class per client, 1 and 5 local epochs; Karimi, Li, Li, 2021, experiments), writes
each
panel's own report under --out (as `experiments.reproduce` does), then one summary (--summary,
default experiments/results/fedlamb_mnist_<scale>.md, with a .json and a .png beside): for
every panel and method the tuned rate, the test accuracy after rounds 1, 5 and 10, the rounds
to the panel's target accuracy per seed and the final accuracy, and a computed verdict on the
paper's claim that Fed-LAMB converges fastest in the early rounds
(Karimi, Li, Li, 2021; the paper prints curves, no numbers).

The verdict rule (written in the report): a method's early score in one seed is its mean test
accuracy over rounds 1 to --early_rounds. Against each baseline the claim "holds" in a panel
when Fed-LAMB's early score is higher in every seed, "leans" when it is higher on the seed
mean but not in every seed, and "does not hold" otherwise. Seeds pair up: a seed fixes the
initial model, the partition and the sampled clients for every method.

--scale, --out (the panel reports) and --data_dir are experiments.reproduce's flags.
Panel runs live in --runs_root/fedlamb_<panel>_<scale> (the default of experiments.reproduce
when --runs_root is unset), so a panel reproduced alone is reused here, and an interrupted
command continues where it stopped.
"""
import json
import os
import time
from typing import Optional, Sequence

from absl import app, flags
import numpy as np

from experiments import reproduce, studies, sweep
from fedjax_lama.cli import logs

FLAGS = flags.FLAGS
PANELS = ("f2-mnist-mlp-noniid-e1", "f2-mnist-mlp-noniid-e5", "mnist-mlp-iid-e1",
          "mnist-mlp-iid-e5", "f2-mnist-cnn-noniid-e1", "f2-mnist-cnn-noniid-e5",
          "mnist-cnn-iid-e1", "mnist-cnn-iid-e5")
METHODS = ("Fed-LAMB", "Fed-AMS", "Fed-SGD")
BASELINES = ("Fed-AMS", "Fed-SGD")
REPORTED_ROUNDS = (1, 5, 10)

flags.DEFINE_list("panels", list(PANELS), "Fed-LAMB tables of experiments.reproduce to run.")
flags.DEFINE_string("runs_root", None, "Directory holding each panel's runs as "
                    "fedlamb_<panel>_<scale> (default: <out>/runs, as experiments.reproduce).")
flags.DEFINE_string("summary", None, "The summary report (default: "
                    "experiments/results/fedlamb_mnist_<scale>.md).")
flags.DEFINE_integer("early_rounds", 5, "The verdict's early rounds: 1 to this.")


def _curve(records) -> np.ndarray:
  """Test accuracy after rounds 1, 2, ... (one evaluation per round at these scales)."""
  by_round = {int(r["round"]): float(r["test_accuracy"]) for r in records
              if "test_accuracy" in r and int(r["round"]) >= 1}
  return np.array([by_round[k] for k in sorted(by_round)])


def early_scores(runs: Sequence[dict], early_rounds: int) -> Optional[np.ndarray]:
  """Per seed, the mean test accuracy over rounds 1..early_rounds (None if any seed diverged)."""
  if any("diverged" in r for r in runs):
    return None
  return np.array([_curve(r["records"])[:early_rounds].mean() for r in runs])


def claim_verdict(lamb: Optional[np.ndarray], other: Optional[np.ndarray]) -> str:
  """The module docstring's rule, on paired per-seed early scores."""
  if other is None:
    return "holds (the baseline diverged)"
  if lamb is None:
    return "does not hold (Fed-LAMB diverged)"
  diff = lamb - other
  if np.all(diff > 0):
    return "holds"
  if diff.mean() > 0:
    return "leans (not in every seed)"
  return "does not hold"


SETTING_FIELDS = ("dataset", "model", "partition", "num_clients", "active_ratio", "batch_size",
                  "local_epochs", "rounds")


def panel_summary(results: dict, target: Optional[float], early_rounds: int,
                  setting: Optional[dict] = None) -> dict:
  """The summary's numbers for one panel, from a Comparison's results (records included);
  `setting`: the panel's base config fields worth printing."""
  methods = {}
  for label in METHODS:
    res = results[label]
    ok = [r for r in res["runs"] if "diverged" not in r]
    row = {"lr": res["lr"], "seeds": len(res["runs"]), "diverged": len(res["runs"]) - len(ok)}
    if ok:
      curves = np.array([_curve(r["records"]) for r in ok])
      row["mean_curve"] = curves.mean(axis=0).tolist()
      row["std_curve"] = curves.std(axis=0).tolist()
      row["at_round"] = {k: [float(c[k - 1]) for c in curves] for k in REPORTED_ROUNDS
                         if k <= curves.shape[1]}
      row["final"] = [float(r["final_test_accuracy"]) for r in ok]
      if target is not None:
        row["rounds_to_target"] = [studies.rounds_to(r["records"], target) for r in ok]
    early = early_scores(res["runs"], early_rounds)
    row["early_score"] = None if early is None else early.tolist()
    methods[label] = row

  def scores(label):
    s = methods[label]["early_score"]
    return None if s is None else np.array(s)

  verdicts = {b: claim_verdict(scores("Fed-LAMB"), scores(b)) for b in BASELINES}
  return {"target": target, "setting": dict(setting or {}), "methods": methods,
          "verdicts": verdicts}


def summary_markdown(panels: dict, scale: str, early_rounds: int, wall_s: float,
                     panel_reports: dict, plot_name: str) -> str:
  """The summary report: the accuracy table, the verdicts, the plot, links to the panels."""
  rows, verdict_rows = [], []
  for name, p in panels.items():
    target = p["target"]
    for label in METHODS:
      m = p["methods"][label]
      if "final" not in m:
        rows.append([name, label, f"{m['lr']:g}", "diverged", "", "", "", ""])
        continue
      reached = ", ".join(str(x) if x is not None else f">{len(m['mean_curve'])}"
                          for x in m.get("rounds_to_target", []))
      rows.append([name, label, f"{m['lr']:g}"]
                  + [sweep.mean_std(m["at_round"].get(k, [])) for k in REPORTED_ROUNDS]
                  + [f"{target:.2f}: {reached}" if target is not None else "-",
                     sweep.mean_std(m["final"])
                     + (f" ({m['diverged']} diverged)" if m["diverged"] else "")])
    early = {label: p["methods"][label]["early_score"] for label in METHODS}
    verdict_rows.append([name] + [f"{np.mean(early[l]):.4f}" if early[l] else "diverged"
                                  for l in METHODS]
                        + [p["verdicts"][b] for b in BASELINES])
  holds = {b: sum(p["verdicts"][b].startswith("holds") for p in panels.values())
           for b in BASELINES}
  first = next(iter(panels.values()))["setting"]
  common = {k: v for k, v in first.items()
            if all(p["setting"].get(k) == v for p in panels.values())}
  varying = sorted(set(first) - set(common))
  flags_text = f" --panels={','.join(panels)}" if tuple(panels) != PANELS else ""
  text = [
      f"# Fed-LAMB, Fed-AMS and Fed-SGD on MNIST ({scale} scale)", "",
      f"Command: `python -m experiments.fedlamb_mnist --scale={scale}{flags_text}`", "",
      f"Machine: {sweep.machine()}. Wall time of this command: {wall_s / 60:.1f} min (finished "
      "runs are reused; each panel's report has its runs' own wall times).", "",
      "Setting (Karimi, Li, Li, 2021, experiments): "
      + ", ".join(f"{k}={v!r}" for k, v in common.items())
      + (f"; by panel: {', '.join(varying)} (the panel's name says which)" if varying else "")
      + ". Each method's learning rate is tuned on its log grid on a validation split (seed "
      "0), then run with every seed. Grids and reductions are in each panel's report.",
      "", "## Accuracy", "",
      "Test accuracy after rounds 1, 5 and 10 and at the end, mean ± std over the seeds; "
      "rounds to the target accuracy per seed ('>N': not within the N rounds).", "",
      sweep.markdown_table(["panel", "method", "lr"]
                           + [f"acc @ round {k}" for k in REPORTED_ROUNDS]
                           + ["rounds to target", "final"], rows), "",
      "## The paper's claim: Fed-LAMB converges fastest in the early rounds", "",
      f"Early score: a method's mean test accuracy over rounds 1-{early_rounds} in one seed "
      "(below: its mean over the seeds). Against a baseline the claim **holds** in a panel when "
      "Fed-LAMB's early score is higher in every seed (seeds pair up: one seed fixes the "
      "initial model, the partition and the sampled clients of every method), **leans** when "
      "it is higher on the seed mean only, and **does not hold** otherwise.", "",
      sweep.markdown_table(["panel"] + [f"early score {l}" for l in METHODS]
                           + [f"vs {b}" for b in BASELINES], verdict_rows), "",
      f"Holds in {holds['Fed-AMS']} of {len(panels)} panels against Fed-AMS and in "
      f"{holds['Fed-SGD']} of {len(panels)} against Fed-SGD.", "",
      f"![test accuracy per round, mean over seeds with a ±1 std band]({plot_name})", "",
      "## Panel reports", ""]
  text += [f"- [{name}]({path})" for name, path in panel_reports.items()]
  return "\n".join(text) + "\n"


def plot_panels(path: str, panels: dict) -> None:
  """One subplot per panel: each method's seed-mean test accuracy with a ±1 std band."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  cols = min(4, len(panels))
  rows = -(-len(panels) // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), dpi=100, squeeze=False)
  for ax, (name, p) in zip(axes.flat, panels.items()):
    for label in METHODS:
      m = p["methods"][label]
      if "mean_curve" not in m:
        continue
      mean, std = np.array(m["mean_curve"]), np.array(m["std_curve"])
      rounds = np.arange(1, len(mean) + 1)
      ax.plot(rounds, mean, label=f"{label} (lr {m['lr']:g})")
      ax.fill_between(rounds, mean - std, mean + std, alpha=0.2)
    ax.set_title(name, fontsize=9)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  for ax in list(axes.flat)[len(panels):]:
    ax.axis("off")
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


def run(panels: Sequence[str], scale: str, out: str, runs_root: Optional[str],
        summary_path: str, early_rounds: int) -> str:
  """Runs or reuses every panel, writes their reports and the summary; returns its path."""
  from experiments import tables  # pylint: disable=g-import-not-at-top
  unknown = [p for p in panels if ("fedlamb", p) not in tables.REGISTRY]
  if unknown:
    raise app.UsageError(f"--panels: {unknown} are not Fed-LAMB tables; known: "
                         f"{', '.join(PANELS)} (and the CIFAR ones of --list)")
  if early_rounds < 1:
    raise app.UsageError(f"--early_rounds must be at least 1, got {early_rounds}")
  start = time.perf_counter()
  summaries, reports = {}, {}
  for name in panels:
    # None: experiments.reproduce's own default, <out>/runs/fedlamb_<panel>_<scale>.
    runs = os.path.join(runs_root, f"fedlamb_{name}_{scale}") if runs_root else None
    done = reproduce.reproduce_table("fedlamb", name, scale, out, runs)
    setting = {k: done.study.base[k] for k in SETTING_FIELDS}
    setting["seeds"] = len(done.study.seeds)
    summaries[name] = panel_summary(done.results, done.study.target, early_rounds, setting)
    reports[name] = os.path.relpath(done.path, os.path.dirname(os.path.abspath(summary_path)))
  wall = time.perf_counter() - start
  stem = os.path.splitext(summary_path)[0]
  os.makedirs(os.path.dirname(summary_path) or ".", exist_ok=True)
  plot_panels(stem + ".png", summaries)
  with open(summary_path, "w") as f:
    f.write(summary_markdown(summaries, scale, early_rounds, wall, reports,
                             os.path.basename(stem) + ".png"))
  with open(stem + ".json", "w") as f:
    json.dump(summaries, f, indent=1)
  return summary_path


def main(argv):
  del argv
  logs.progress_only()
  reproduce.set_default_data_dir()
  summary = FLAGS.summary or f"experiments/results/fedlamb_mnist_{FLAGS.scale}.md"
  path = run(FLAGS.panels, FLAGS.scale, FLAGS.out, FLAGS.runs_root, summary, FLAGS.early_rounds)
  print(f"report: {path}")


if __name__ == "__main__":
  app.run(main)
