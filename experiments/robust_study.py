r"""Every attack against every defence (issue 54): a grid of runs, its tables, heatmaps and the
literature's claims checked on the numbers.

  python -m experiments.robust_study --config=configs/robust_fmnist_cnn.py \
      --config.data_dir=/path/to/data --out=experiments/results/robust_fmnist \
      --runs_dir=/tmp/robust_fmnist_runs

Rows are the defences of config.robust.defence ("none": the plain mean of the stack), columns
the attacks of config.robust.attack ("none": no attacker), both read from
fedjax_lama.robust.robust_stage at run time, so a rule or an attack added there joins the grid.
An attack column may carry its own options, NAME:KEY=VALUE[,KEY=VALUE] over config.robust
(e.g. "ipm:epsilon=100"). Each cell runs every seed of --seeds.

One local learning rate for every cell: the plain mean's without attack, picked from --lrs by
the validation accuracy (the mean of the last 3 evaluations on the split held out of the
training data) of seed --tune_seed; a single rate in --lrs is used as given.

f, the Byzantine clients per cohort every defence tolerates, is the expected number of
attackers in a cohort, round(malicious_fraction * n) for a fixed cohort of n clients; a rule
whose bound does not accept that f at n (Bulyan: n >= 4f + 3) gets the largest f it accepts,
and the report says so.

Runs live under --runs_dir (a workdir per run) and are reused or resumed, so an interrupted
study continues where it stopped. --processes=N trains the cells in N processes at once
after the learning rate is picked (each compiles its own programs, so N cores compile in
parallel while the processes share the accelerator), then reports; --shard=I/N is one such
process (cells I, I + N, ...; after --tune_only), and a run without --shard then writes the
report from the finished runs. Writes
<out>.md (a section ready for docs/results.md), <out>.json (every run's summary) and
<out>_accuracy.png (and <out>_backdoor.png when the runs report a backdoor's success).
"""
import dataclasses
import json
import math
import os
import sys
from typing import Optional, Sequence

import numpy as np

from experiments import sweep
from experiments.studies import _slug  # pylint: disable=protected-access
from fedjax_lama.errors import ConfigError
from fedjax_lama.robust import defences as defences_lib
from fedjax_lama.robust import robust_stage
from fedjax_lama.run import spec as spec_lib

# Extra columns beside robust_stage.ATTACKS at their config defaults: IPM at a large epsilon,
# where Xie et al. (UAI 2019) show the median and Krum broken.
EXTRA_ATTACKS = ("ipm:epsilon=100",)
# A cell "collapses" at or below twice chance on 10 classes.
COLLAPSED = 0.2
# A defence "keeps" its accuracy under an attack within this much of its no-attack accuracy.
KEPT = 0.05
# Summary keys of a backdoor's success (the attack's own metric, whatever its final name).
BACKDOOR_MARKERS = ("backdoor", "attack_success")


@dataclasses.dataclass(frozen=True)
class Attack:
  """One column: an attack of robust_stage.ATTACKS with options over config.robust."""
  label: str
  name: str
  options: dict = dataclasses.field(default_factory=dict)


def parse_attack(text: str) -> Attack:
  """NAME or NAME:KEY=VALUE[,KEY=VALUE] (a VALUE that is not JSON stays a string)."""
  name, _, assignments = (x.strip() for x in text.partition(":"))
  if name not in robust_stage.ATTACKS:
    raise ConfigError(f"--attacks: {name!r} in {text!r} is not accepted; accepted: "
                      f"{', '.join(robust_stage.ATTACKS)} (form NAME[:KEY=VALUE,...])")
  options = {}
  for assignment in filter(None, (a.strip() for a in assignments.split(","))):
    key, eq, value = (x.strip() for x in assignment.partition("="))
    if not key or not eq:
      raise ConfigError(f"--attacks: {assignment!r} in {text!r} is not KEY=VALUE "
                        "(form NAME[:KEY=VALUE,...], e.g. ipm:epsilon=100)")
    try:
      options[key] = json.loads(value)
    except json.JSONDecodeError:
      options[key] = value
  label = name if not options else name + ":" + ",".join(f"{k}={v}" for k, v in options.items())
  return Attack(label, name, options)


def split_attacks(text: str) -> list:
  """--attacks: columns separated by ';' (an attack's options are separated by ',')."""
  return [a.strip() for a in text.split(";") if a.strip()]


def default_attacks() -> list:
  return list(robust_stage.ATTACKS) + list(EXTRA_ATTACKS)


def default_defences() -> list:
  return list(robust_stage.DEFENCES)


def defence_label(defence: str) -> str:
  return "mean (none)" if defence == "none" else defence


def cohort_size(base) -> int:
  if base.client_sampling != "fixed":
    raise ConfigError(f"config.client_sampling={base.client_sampling!r} is not accepted by the "
                      "robust study; accepted: 'fixed' (f is set from the cohort's size)")
  return max(1, int(round(base.active_ratio * base.num_clients)))


def tolerated(base) -> tuple[int, dict]:
  """(f, {defence: its own f where its bound refuses f}) for the study's cohort: f is the
  expected number of attackers per cohort, round(malicious_fraction * n)."""
  n = cohort_size(base)
  fraction = base.robust.malicious_fraction
  if not (isinstance(fraction, (int, float)) and 0 < fraction < 0.5):
    raise ConfigError(f"config.robust.malicious_fraction={fraction!r} is not accepted by the "
                      "robust study; accepted: a fraction in (0, 1/2)")
  f = int(round(fraction * n))
  own = {}
  for defence, rule in defences_lib.DEFENCES.items():
    if rule.bound is None or defence == "trimmed_mean":  # its beta is the config's
      continue
    holds = rule.bound.holds
    if not holds(n, f):
      own[defence] = max(g for g in range(f + 1) if holds(n, g))
  return f, own


def quick(base, rounds: Optional[int] = None):
  """`base` cut to a smoke run: 30 clients, cohorts of 15 (so f = 3 and every bound holds at
  a 20 % malicious share), 2 local steps, evaluated every round."""
  return sweep.configured(base, num_clients=30, active_ratio=0.5, local_steps=2,
                          rounds=rounds or 2, eval_every=1, checkpoint_every=rounds or 2,
                          min_client_size=2, plots=False)


@dataclasses.dataclass
class Study:
  """The grid (see the module docstring)."""
  base: object                     # ConfigDict of the runs (config.robust.malicious_fraction)
  defences: Sequence[str]
  attacks: Sequence[Attack]
  seeds: Sequence[int]
  lrs: Sequence[float]
  tune_seed: int = 0

  def __post_init__(self):
    for d in self.defences:
      if d not in robust_stage.DEFENCES:
        raise ConfigError(f"--defences: {d!r} is not accepted; accepted: "
                          f"{', '.join(robust_stage.DEFENCES)}")
    self.f, self.own_f = tolerated(self.base)
    for d in self.defences:  # every refusal before anything trains
      for a in self.attacks:
        spec_lib.robust_options(self.config(d, a, self.lrs[0], self.seeds[0]), "synchronous")

  def cells(self) -> list:
    return [(d, a) for d in self.defences for a in self.attacks]

  def config(self, defence: str, attack: Attack, lr: float, seed: int):
    fields = {"robust.defence": defence, "robust.attack": attack.name,
              "robust.f": self.own_f.get(defence, self.f)}
    fields.update({f"robust.{k}": v for k, v in attack.options.items()})
    return sweep.configured(self.base, fields, local_lr=lr, seed=seed)

  def workdir(self, runs_dir: str, defence: str, attack: Attack, lr: float, seed: int) -> str:
    return os.path.join(runs_dir, _slug(defence), _slug(attack.label), f"lr{lr:g}",
                        f"seed{seed}")

  def tune(self, runs_dir: str) -> tuple[float, Optional[dict]]:
    """The plain mean's rate without attack (and the validation scores when it was picked)."""
    if len(self.lrs) == 1:
      return self.lrs[0], None
    plain = Attack("none", "none")
    tuned = sweep.tune(lambda lr, seed: self.config("none", plain, lr, seed), self.lrs,
                       self.tune_seed,
                       lambda lr, seed: self.workdir(runs_dir, "none", plain, lr, seed))
    return tuned.value, tuned.scores

  def run(self, runs_dir: str, lr: float, shard: tuple[int, int] = (0, 1)) -> dict:
    """{(defence, attack label): [summary or {"diverged": message} per seed]} of the cells
    of `shard` (index, count)."""
    index, count = shard
    results = {}
    for i, (d, a) in enumerate(self.cells()):
      if i % count != index:
        continue
      outcomes = sweep.run_group([self.config(d, a, lr, s) for s in self.seeds],
                                 [self.workdir(runs_dir, d, a, lr, s) for s in self.seeds])
      runs = [{"diverged": str(r)} if isinstance(r, sweep.training.TrainingError) else r
              for r in outcomes]
      results[(d, a.label)] = runs
      print(f"{defence_label(d)} x {a.label}: final test accuracy "
            f"{sweep.mean_std([r.get('final_test_accuracy') for r in runs])}", flush=True)
    return results


# ---- the numbers --------------------------------------------------------------------------------
def backdoor_key(results: dict) -> Optional[str]:
  """The summary key of a backdoor's success, when some run reports one: a numeric key
  naming BACKDOOR_MARKERS, the final value ("final_...") first."""
  keys = sorted({k for runs in results.values() for r in runs for k, v in r.items()
                 if any(m in k for m in BACKDOOR_MARKERS) and isinstance(v, (int, float))
                 and not isinstance(v, bool)})
  if not keys:
    return None
  return next((k for k in keys if k.startswith("final")), keys[0])


def finals(results: dict, key: str = "final_test_accuracy") -> dict:
  """{cell: [value per seed, None for a diverged run]} of the cells whose runs report `key`
  (a backdoor's success may be measured under its own attack only)."""
  reports = lambda runs: all("diverged" in r or key in r for r in runs) and any(
      key in r for r in runs) or all("diverged" in r for r in runs)
  return {cell: [r.get(key) if "diverged" not in r else None for r in runs]
          for cell, runs in results.items() if reports(runs)}


def _cell_text(values) -> str:
  lost = sum(v is None for v in values)
  if lost == len(values):
    return "diverged"
  text = sweep.mean_std(values)
  return text + (f" ({lost} diverged)" if lost else "")


def table(values: dict, defences, attacks) -> str:
  """Defences down, attacks across: mean ± std over seeds ("-": a cell not in `values`)."""
  rows = [[defence_label(d)] + [_cell_text(values[(d, a.label)]) if (d, a.label) in values
                                else "-" for a in attacks] for d in defences]
  return sweep.markdown_table(["defence \\ attack"] + [a.label for a in attacks], rows)


def heatmap(path: str, values: dict, defences, attacks, title: str) -> None:
  """The table as an annotated heatmap (mean over seeds; a diverged cell is blank)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  grid = np.full((len(defences), len(attacks)), np.nan)
  spread = np.zeros_like(grid)
  for i, d in enumerate(defences):
    for j, a in enumerate(attacks):
      ok = [v for v in values.get((d, a.label), []) if v is not None]
      if ok:
        grid[i, j], spread[i, j] = np.mean(ok), np.std(ok)
  fig, ax = plt.subplots(figsize=(1.3 * len(attacks) + 2.5, 0.55 * len(defences) + 1.8),
                         dpi=110)
  image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
  for i in range(grid.shape[0]):
    for j in range(grid.shape[1]):
      text = ("diverged" if (defences[i], attacks[j].label) in values else "") \
          if np.isnan(grid[i, j]) else f"{grid[i, j]:.3f}\n±{spread[i, j]:.3f}"
      ax.text(j, i, text, ha="center", va="center", fontsize=7,
              color="white" if np.isnan(grid[i, j]) or grid[i, j] < 0.6 else "black")
  ax.set_xticks(range(len(attacks)), [a.label for a in attacks], rotation=30, ha="right",
                fontsize=8)
  ax.set_yticks(range(len(defences)), [defence_label(d) for d in defences], fontsize=8)
  ax.set_xlabel("attack")
  ax.set_ylabel("defence")
  ax.set_title(title, fontsize=9)
  fig.colorbar(image, ax=ax, fraction=0.03)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


# ---- the literature's claims ------------------------------------------------------------------
def _stats(values) -> Optional[tuple[float, float, int]]:
  """(mean, std, seeds) with a diverged run counted as accuracy 0 (it has collapsed)."""
  if not values:
    return None
  x = np.asarray([0.0 if v is None else v for v in values], float)
  return float(x.mean()), float(x.std()), len(x)


def _fmt(s) -> str:
  return f"{s[0]:.4f} ± {s[1]:.4f}"


def _verdict(holds: bool) -> str:
  return "**holds**" if holds else "**does not hold**"


def _largest(attacks, name: str, option: str) -> Optional[Attack]:
  """The column of attack `name` with the largest `option` (its config default: 0)."""
  columns = [a for a in attacks if a.name == name]
  if not columns:
    return None
  return max(columns, key=lambda a: float(a.options.get(option, 0)))


def claims(values: dict, attacks: Sequence[Attack]) -> list:
  """One line per claim the grid can check, "holds" / "does not hold" with the numbers
  (means ± std over seeds; a diverged run counts as accuracy 0). A gap must exceed the two
  cells' standard deviations summed to count."""
  get = lambda d, a: _stats(values.get((d, a)))
  lines = []
  base = get("none", "none")
  # (a) Robust rules lose accuracy without attack on non-IID data.
  for d, source in (("krum", "Blanchard et al., NeurIPS 2017: Krum keeps one update and "
                             "loses the averaging"),
                    ("median", "Yin et al., ICML 2018: the median's error grows with the "
                               "clients' heterogeneity")):
    own = get(d, "none")
    if base and own:
      gap, spread = base[0] - own[0], base[1] + own[1]
      lines.append(f"- (a) {d} without attack is below the mean on non-IID data ({source}): "
                   f"{_verdict(gap > spread)}: {_fmt(own)} against the mean's {_fmt(base)} "
                   f"(gap {gap:+.4f}, spreads summed {spread:.4f}).")
  # (b) Sign flipping: the mean collapses, every defence keeps its accuracy.
  flip = _largest(attacks, "sign_flip", "scale")
  if flip is not None and get("none", flip.label):
    mean_flip = get("none", flip.label)
    collapsed = mean_flip[0] <= COLLAPSED
    lines.append(f"- (b) the mean collapses under {flip.label} (Li et al., AAAI 2019; "
                 f"Blanchard et al., NeurIPS 2017: one Byzantine client moves the mean "
                 f"arbitrarily): {_verdict(collapsed)}: {_fmt(mean_flip)} (collapse: at "
                 f"most {COLLAPSED}).")
    for d in sorted({d for d, _ in values} - {"none"}):
      own, attacked = get(d, "none"), get(d, flip.label)
      if own and attacked:
        kept = collapsed and attacked[0] >= own[0] - KEPT
        lines.append(f"  - {d} keeps its accuracy under {flip.label} where the mean "
                     f"collapses: {_verdict(kept)}: {_fmt(attacked)} against "
                     f"{_fmt(own)} without attack (kept: within {KEPT}"
                     + ("" if collapsed else "; the mean did not collapse") + ").")
  # (c) ALIE hides in the honest spread and degrades the rules.
  alie = _largest(attacks, "alie", "z")
  if alie is not None:
    for d in ("krum", "median", "trimmed_mean"):
      own, attacked = get(d, "none"), get(d, alie.label)
      if own and attacked:
        drop, spread = own[0] - attacked[0], own[1] + attacked[1]
        lines.append(f"- (c) {alie.label} degrades {d} below its no-attack accuracy "
                     "(Baruch et al., NeurIPS 2019, \"A little is enough\"): "
                     f"{_verdict(drop > spread)}: {_fmt(attacked)} against {_fmt(own)} "
                     f"(drop {drop:+.4f}, spreads summed {spread:.4f}).")
  # (d) IPM at a large epsilon breaks Krum and the median.
  ipm = _largest(attacks, "ipm", "epsilon")
  if ipm is not None:
    for d in ("krum", "median"):
      own, attacked = get(d, "none"), get(d, ipm.label)
      if own and attacked:
        lines.append(f"- (d) {ipm.label} breaks {d} (Xie, Koyejo, Gupta, UAI 2019, inner "
                     "product manipulation): "
                     f"{_verdict(attacked[0] <= COLLAPSED)}: {_fmt(attacked)} against "
                     f"{_fmt(own)} without attack (broken: at most {COLLAPSED}).")
  return lines


# ---- the report ---------------------------------------------------------------------------------
def _link(path: str, doc_dir: Optional[str]) -> str:
  """`path` as linked from `doc_dir` (None: the report's own directory, beside the figure)."""
  return os.path.relpath(os.path.abspath(path), os.path.abspath(doc_dir or os.path.dirname(path)))


def setting(study: Study, lr: float, scores: Optional[dict]) -> list:
  base, n = study.base, cohort_size(study.base)
  own = "; ".join(f"{d} f={g} (its bound refuses f={study.f} at n={n})"
                  for d, g in study.own_f.items() if d in study.defences)
  options = ", ".join(f"{k}={base.robust[k]}" for k in ("scale", "std", "z", "epsilon"))
  rate = (f"{lr:g}, the plain mean's without attack, picked from "
          f"{{{', '.join(f'{x:g}' for x in study.lrs)}}} by the mean validation accuracy of "
          f"the last 3 evaluations (seed {study.tune_seed}: "
          + ", ".join(f"{x:g}: {s:.4f}" for x, s in sorted(scores.items())) + ")"
          if scores else f"{lr:g}, given")
  return [
      f"Setting: {base.dataset}, {base.model}, {base.algorithm}; partition {base.partition} "
      f"(concentration {base.dirichlet_concentration}) over {base.num_clients} clients, "
      f"cohorts of n={n} drawn uniformly each round, {base.local_steps} local steps of batch "
      f"{base.batch_size}, {base.rounds} rounds, weighting {base.weighting}, validation "
      f"split {base.validation_fraction:.0%} of the training data.",
      f"Attackers: {base.robust.malicious_fraction:.0%} of the clients "
      f"(floor(fraction x clients), drawn per seed), sampled like the others, so a cohort "
      f"holds {study.f} in expectation and more or fewer in a given round. Attack options "
      f"(config.robust, unless the column names its own): {options}; alie's z=0 is Baruch "
      "et al.'s z_max for the cohort. Upload attacks are omniscient (they see the round's "
      "honest uploads).",
      f"Defences tolerate f={study.f} per cohort, the expected number of attackers, "
      f"round(fraction x n)" + (f"; {own}" if own else "") +
      f"; trimmed_mean beta={base.robust.beta}, centered_clipping radius="
      f"{base.robust.radius}, norm_bounding bound={base.robust.bound}. 'mean (none)' is "
      "the plain weighted mean of the cohort.",
      f"Local learning rate, one for every cell: {rate}. Test accuracy after the last round, "
      f"mean ± std over seeds {', '.join(map(str, study.seeds))}.",
  ]


def report(study: Study, results: dict, lr: float, scores: Optional[dict], out: str,
           command: str = "", doc_dir: Optional[str] = None) -> str:
  """The markdown section; writes the heatmaps beside `out`."""
  accuracy = finals(results)
  base = study.base
  wall = sum(r.get("wall_seconds", 0) for runs in results.values() for r in runs)
  text = [f"## Attacks against robust aggregation: {base.dataset}, {base.model}", ""]
  if command:
    text += [f"Command: `{command}`", ""]
  text += setting(study, lr, scores)
  text += [f"Runs: {len(study.defences)} defences x {len(study.attacks)} attacks x "
           f"{len(study.seeds)} seeds = {sum(len(r) for r in results.values())}; machine: "
           f"{sweep.machine()}; wall time of the runs {wall / 60:.0f} min in total.", ""]
  png = out + "_accuracy.png"
  heatmap(png, accuracy, study.defences, study.attacks,
          f"final test accuracy, mean over {len(study.seeds)} seeds")
  text += ["Final test accuracy (mean ± std over seeds):", "",
           table(accuracy, study.defences, study.attacks), "",
           f"![final test accuracy]({_link(png, doc_dir)})", ""]
  key = backdoor_key(results)
  if key is not None:
    success = finals(results, key)
    png = out + "_backdoor.png"
    heatmap(png, success, study.defences, study.attacks, f"{key}, mean over seeds")
    text += [f"Backdoor success, `{key}` of summary.json (mean ± std over seeds):", "",
             table(success, study.defences, study.attacks), "",
             f"![backdoor success]({_link(png, doc_dir)})", ""]
  lines = claims(accuracy, study.attacks)
  if lines:
    text += ["The literature's claims, checked on these numbers (a gap counts when it exceeds "
             "the two cells' standard deviations summed; a diverged run counts as accuracy "
             "0):", "", *lines]
  return "\n".join(text)


def write(study: Study, results: dict, lr: float, scores: Optional[dict], out: str,
          command: str = "", doc_dir: Optional[str] = None) -> str:
  """<out>.md, <out>.json and the heatmaps; returns the markdown."""
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  text = report(study, results, lr, scores, out, command, doc_dir)
  with open(out + ".md", "w") as f:
    f.write(text + "\n")
  slim = {f"{d}|{a}": [{k: v for k, v in r.items() if k != "records"} for r in runs]
          for (d, a), runs in results.items()}
  with open(out + ".json", "w") as f:
    json.dump({"lr": lr, "lr_scores": scores, "f": study.f, "own_f": study.own_f,
               "defences": list(study.defences), "attacks": [a.label for a in study.attacks],
               "seeds": list(study.seeds), "runs": slim}, f, indent=1, default=str)
  return text


def parse_shard(text: str) -> tuple[int, int]:
  index, slash, count = text.partition("/")
  try:
    shard = int(index), int(count)
  except ValueError:
    shard = None
  if not slash or shard is None or not 0 <= shard[0] < shard[1]:
    raise ConfigError(f"--shard={text!r} is not accepted; accepted: I/N with 0 <= I < N")
  return shard


def run_shards(processes: int, argv: Sequence[str], module: str = "experiments.robust_study",
               runs_dir: Optional[str] = None) -> None:
  """This command (`python -m module argv`) again as `processes` processes, --shard=I/N each,
  at once; returns when all finished (their output in <runs_dir>/shard<I>.log), raising if
  one failed. The processes share the machine's accelerator, so none preallocates its memory.
  runs_dir: None reads this study's flags."""
  import subprocess  # pylint: disable=g-import-not-at-top
  runs_dir = runs_dir or FLAGS.runs_dir or FLAGS.out + "_runs"
  os.makedirs(runs_dir, exist_ok=True)
  args, skip = [], False
  for a in argv:  # every flag but --processes (given as --processes=N or --processes N)
    if not skip and not a.startswith("--processes"):
      args.append(a)
    skip = a == "--processes"
  env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
  children = []
  for i in range(processes):
    log = open(os.path.join(runs_dir, f"shard{i}.log"), "w")  # pylint: disable=consider-using-with
    command = [sys.executable, "-m", module, *args,
               f"--shard={i}/{processes}"]
    children.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env),
                     log))
  failed = []
  for i, (child, log) in enumerate(children):
    if child.wait() != 0:
      failed.append(f"{os.path.join(runs_dir, f'shard{i}.log')} (exit {child.returncode})")
    log.close()
  if failed:
    raise RuntimeError("shards failed: " + ", ".join(failed))


def main(argv):
  """The command line (flags below)."""
  del argv
  from fedjax_lama.cli import logs  # pylint: disable=g-import-not-at-top
  logs.progress_only()
  base = FLAGS.config
  seeds = [int(x) for x in FLAGS.seeds]
  lrs = [float(x) for x in FLAGS.lrs]
  if FLAGS.rounds:
    base = sweep.configured(base, rounds=FLAGS.rounds)
  if FLAGS.quick:
    base, seeds, lrs = quick(base, FLAGS.rounds), seeds[:1], lrs[:1]
  study = Study(base, FLAGS.defences or default_defences(),
                [parse_attack(a) for a in (split_attacks(FLAGS.attacks) or default_attacks())],
                seeds, lrs, FLAGS.tune_seed)
  runs_dir = FLAGS.runs_dir or FLAGS.out + "_runs"
  lr, scores = study.tune(runs_dir)
  print(f"local learning rate {lr:g}" + (f" (validation scores {scores})" if scores else ""),
        flush=True)
  if FLAGS.tune_only:
    return
  if FLAGS.shard:
    study.run(runs_dir, lr, parse_shard(FLAGS.shard))
    return
  if FLAGS.processes > 1:
    run_shards(FLAGS.processes, sys.argv[1:])
  results = study.run(runs_dir, lr)
  print(write(study, results, lr, scores, FLAGS.out,
              " ".join(["python -m experiments.robust_study"] + sys.argv[1:])))


if __name__ == "__main__":
  from absl import app, flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top

  FLAGS = flags.FLAGS
  config_flags.DEFINE_config_file("config", "configs/robust_fmnist_cnn.py", "Base config.")
  flags.DEFINE_string("out", "experiments/results/robust_fmnist",
                      "Report prefix: <out>.md, <out>.json, <out>_accuracy.png.")
  flags.DEFINE_string("runs_dir", None, "Directory of the runs' workdirs (default <out>_runs).")
  flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds of every cell.")
  flags.DEFINE_list("defences", [], "Rows (default: every name of robust_stage.DEFENCES).")
  flags.DEFINE_string("attacks", "", "Columns separated by ';', each NAME[:KEY=VALUE,...] "
                      "(default: every robust_stage.ATTACKS entry and "
                      f"{'; '.join(EXTRA_ATTACKS)}).")
  flags.DEFINE_list("lrs", ["0.03", "0.1", "0.3"], "Local rates the plain mean is tuned on.")
  flags.DEFINE_integer("tune_seed", 0, "Seed of the tuning runs (reused as a final run).")
  flags.DEFINE_integer("rounds", 0, "Rounds (0: the config's).")
  flags.DEFINE_boolean("quick", False, "A smoke run: 30 clients, cohorts of 15, 2 local "
                       "steps, 2 rounds (or --rounds), the first seed and rate.")
  flags.DEFINE_string("shard", "", "I/N: train only cells I, I + N, ... and write no report.")
  flags.DEFINE_boolean("tune_only", False, "Pick the learning rate and stop.")
  flags.DEFINE_integer("processes", 1, "After tuning, train the cells in this many processes "
                       "at once (--shard each), then report; compilation runs in parallel.")
  app.run(main)
