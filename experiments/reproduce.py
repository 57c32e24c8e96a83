r"""Reproduce a seed paper's table with one command; the report prints the paper's numbers beside.

  python -m experiments.reproduce --list
  python -m experiments.reproduce --paper=fedlama --table=aaai-t3 --scale=small
  python -m experiments.reproduce --paper=fedspeed --table=t1 --scale=paper \
      --data_dir=/data --out=/tmp/fedspeed

Scales (experiments/tables.py): "paper" is the paper's exact setting (for users with the
data and an accelerator), "small" a reduced version on the real datasets that
finishes on a 2-core CPU within about an hour, "smoke" a few-minute check. Learning rates that the papers tuned are
tuned on a validation split held out of the training data, never on the test set. Writes
<out>/<paper>_<table>_<scale>.md (the command that reruns it, our numbers, the paper's, the
settings that ran, the machine, the wall time) with its plots and a JSON of the results.
--out defaults to a directory outside the source tree (DEFAULT_OUT); the committed reports
under experiments/results are rewritten only when --out names that directory. Runs live in
--runs (default <out>/runs/...) and are reused or resumed, so an interrupted reproduction
continues.
"""
import json
import os
import shlex
import time
from typing import Any, NamedTuple, Optional

from absl import app, flags

from fedjax_lama.cli import logs

FLAGS = flags.FLAGS
flags.DEFINE_string("paper", None, "fedlama | fedspeed | fedat | fedlamb | fedavg")
flags.DEFINE_string("table", None, "Table id (see --list).")
flags.DEFINE_enum("scale", "small", ["smoke", "small", "paper"], "Scale of the reproduction.")
DEFAULT_OUT = os.path.join(os.path.expanduser("~"), "fedjax_lama_results", "reproduce")
flags.DEFINE_string("out", DEFAULT_OUT, "Directory of the reports (the committed ones: "
                    "--out=experiments/results).")
flags.DEFINE_string("runs", None, "Directory of the runs (default <out>/runs/<paper>_<table>_"
                    "<scale>; tables of one study share it).")
flags.DEFINE_string("data_dir", None, "Data directory (default: $FEDJAX_LAMA_DATA_DIR, else "
                    "./data (fedjax_lama.data.resolve_data_dir)).")
flags.DEFINE_bool("list", False, "List every paper and table id, then exit.")

# Config fields worth printing as "the exact settings" of a run.
SETTINGS = ("algorithm", "schedule", "dataset", "model", "partition", "dirichlet_concentration",
            "classes_per_client", "num_clients", "active_ratio", "client_sampling", "batch_size",
            "local_steps", "local_epochs", "rounds", "local_lr_decay", "local_lr_decay_factor",
            "local_momentum", "weight_decay", "server_lr", "weighting", "validation_fraction",
            "normalization", "augmentation")


def listing() -> str:
  from experiments import tables  # pylint: disable=g-import-not-at-top
  lines = []
  for (paper, table), entry in sorted(tables.REGISTRY.items()):
    lines.append(f"{paper:9s} {table:30s} {entry.title}")
  return "\n".join(lines)


def _rounds_ran(results) -> list:
  """The distinct round counts of the runs in a study's results (their summaries)."""
  found = set()

  def walk(value):
    if isinstance(value, dict):
      if "final_test_accuracy" in value and "rounds" in value:
        found.add(int(value["rounds"]))
      for v in value.values():
        walk(v)
    elif isinstance(value, (list, tuple)):
      for v in value:
        walk(v)

  walk(results)
  return sorted(found)


def settings_of(study, results=None) -> str:
  """The settings of the runs as they ran at this scale: the study's base config, with the
  fields the study itself sets (step budgets, virtual-time budgets, seeds, rate grids) in
  place of the base config's, and the round counts the runs' summaries report."""
  base = getattr(study, "base", None)
  if base is None:
    parts = getattr(study, "parts", {})
    return "\n".join(f"- {name}: {settings_of(part, (results or {}).get(name))}"
                     for name, part in parts.items())
  on_clock = hasattr(study, "budget_s")
  # A FedLAMA table's step budget, a clock study's virtual-time budget set the run's length.
  skip = {"rounds"} if on_clock or hasattr(study, "total_steps") else set()
  # Fields each row of the study sets itself (its table says them).
  skip |= set(getattr(study, "row_fields", ()))
  fields = [f"{k}={base[k]!r}" for k in SETTINGS if k in base and k not in skip]
  if base.get("schedule") == "fedlama" or base.algorithm == "fedlama":
    fields += [f"fedlama.base_interval={base.fedlama.base_interval}",
               f"fedlama.interval_rule={base.fedlama.interval_rule!r}"]
  if hasattr(study, "total_steps"):
    fields.append(f"local steps per run={study.total_steps}")
  if hasattr(study, "phis"):
    fields.append(f"phi={tuple(study.phis)}")
  if on_clock:
    fields.append(f"virtual-time budget={study.budget_s:g} s, an evaluation every "
                  f"{study.eval_interval_s:g} s")
  if hasattr(study, "lrs"):
    fields.append(f"local_lr grid={tuple(study.lrs)}")
  if hasattr(study, "seeds"):
    fields.append(f"seeds={tuple(study.seeds)}")
  rounds = [] if on_clock else _rounds_ran(results)
  if rounds:
    fields.append("rounds that ran=" + "/".join(map(str, rounds)))
  return ", ".join(fields)


def command_line(paper: str, table: str, scale: str, out: str, runs: Optional[str],
                 data_dir: str) -> str:
  """The command that writes this report again: every flag, paths made absolute."""
  args = [f"--paper={paper}", f"--table={table}", f"--scale={scale}",
          f"--out={os.path.abspath(out)}"]
  if runs:
    args.append(f"--runs={os.path.abspath(runs)}")
  args.append(f"--data_dir={os.path.abspath(data_dir)}")
  return " ".join(["python -m experiments.reproduce"] + [shlex.quote(a) for a in args])


def reproduce(paper: str, table: str, scale: str, out: str, runs: str = None) -> str:
  """Runs (or reuses) one table's study and writes its report; returns the report's path."""
  return reproduce_table(paper, table, scale, out, runs).path


def data_dir() -> str:
  """The data directory the runs read (config.data_dir is unset in the tables' configs)."""
  from fedjax_lama import federation  # pylint: disable=g-import-not-at-top
  return federation.resolve_data_dir("")


class Reproduction(NamedTuple):
  path: str       # the report
  study: Any      # the table's study at the scale (its base config, seeds, target)
  results: dict   # the study's results, with every run's per-evaluation records


def reproduce_table(paper: str, table: str, scale: str, out: str,
                    runs: str = None) -> Reproduction:
  """`reproduce`, also returning the study and its results with every run's per-evaluation
  records (the JSON leaves them out), for commands that summarise several tables."""
  from experiments import sweep, tables  # pylint: disable=g-import-not-at-top
  key = (paper, table)
  if key not in tables.REGISTRY:
    raise app.UsageError(f"--paper={paper!r} --table={table!r} is not known; run --list")
  entry = tables.REGISTRY[key]
  study = entry.study(scale)
  name = f"{paper}_{table}_{scale}"
  runs_given = runs
  runs = runs or os.path.join(out, "runs", f"{entry.runs_key}_{scale}")
  os.makedirs(out, exist_ok=True)
  start = time.perf_counter()
  results = study.run(runs)
  wall = time.perf_counter() - start
  plot = os.path.join(out, f"{name}.png")
  ours = study.report(results, plot)
  command = command_line(paper, table, scale, out, runs_given, data_dir())
  text = [f"# {paper} {table} ({scale} scale): {entry.title}", "",
          f"Command: `{command}`", "",
          f"Machine: {sweep.machine()}. Wall time of this command: {wall / 60:.1f} min "
          "(finished runs are reused; their own wall times are in the table).", ""]
  if scale == "small" and entry.reduced:
    text += [f"Reduced from the paper: {entry.reduced}.", ""]
  elif scale == "smoke":
    text += ["Smoke scale: a few rounds on small data, to check the pipeline; the numbers "
             "mean nothing.", ""]
  text += ["Settings: " + settings_of(study, results), "", "## Ours", "", ours, "",
           f"![curves]({os.path.basename(plot)})", "", "## The paper's (as printed)", "",
           entry.paper_text()]
  path = os.path.join(out, f"{name}.md")
  with open(path, "w") as f:
    f.write("\n".join(text) + "\n")
  with open(os.path.join(out, f"{name}.json"), "w") as f:
    json.dump(_slim(results), f, indent=1, default=str)
  return Reproduction(path, study, results)


def _slim(results):
  """The results without per-evaluation records (they stay in the runs' metrics.jsonl)."""
  if isinstance(results, dict):
    return {k: _slim(v) for k, v in results.items() if k != "records"}
  if isinstance(results, list):
    return [_slim(v) for v in results]
  return results


def set_default_data_dir() -> None:
  """--data_dir, else $FEDJAX_LAMA_DATA_DIR, else ./data (fedjax_lama.data.resolve_data_dir)."""
  if FLAGS.data_dir:
    os.environ["FEDJAX_LAMA_DATA_DIR"] = os.path.abspath(FLAGS.data_dir)


def main(argv):
  del argv
  logs.progress_only()
  if FLAGS.list:
    print(listing())
    return
  if not FLAGS.paper or not FLAGS.table:
    raise app.UsageError("give --paper and --table (or --list)")
  set_default_data_dir()
  path = reproduce(FLAGS.paper, FLAGS.table, FLAGS.scale, FLAGS.out, FLAGS.runs)
  print(f"report: {path}")


if __name__ == "__main__":
  app.run(main)
