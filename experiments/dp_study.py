r"""Accuracy against the privacy budget: DP-FedAvg (fixed and adaptive clip) and DP-FedAdam.

  python -m experiments.dp_study --config.data_dir=DATA --runs_dir=runs/dp_fmnist \
      --out=experiments/results/dp_fmnist
  python -m experiments.dp_study --quick --runs_dir=/tmp/dp_quick --out=/tmp/dp_quick/report

Rows (configs/dp_fmnist.py, Fashion-MNIST over 2,000 clients):
  * DP-FedAvg with a fixed clip C (McMahan, Ramage, Talwar, Zhang, ICLR 2018: clip each
    client's update to C, sum with unit weights, add N(0, sigma^2 C^2), divide by q N). C is
    the median norm of the clients' updates in the non-private run at the tuned rate (the
    value Andrew et al.'s quantile-0.5 clip settles at in a run without noise), chosen like
    the learning rate on runs that spend no budget; --clip_norm sets it instead;
  * DP-FedAvg with the clip tracking the median update norm (Andrew, Thakkar, McMahan,
    Ramaswamy, NeurIPS 2021: target quantile 0.5, geometric rate 0.2, the count noised with
    std q N / 20, the update noise raised so that both releases together cost sigma);
  * DP-FedAdam: the same noised mean of fixed-clip updates taken by the server's Adam step
    (Reddi et al., ICLR 2021, Algorithm 2, tau 1e-3) instead of a plain step.
Each at every target epsilon of --epsilons: sigma is calibrated before training so that
config.rounds rounds of Poisson sampling at rate q cost exactly that epsilon at the config's
delta (RDP accountant); "inf" is the same run with sigma = 0, the clip kept, so that the
column isolates what the noise costs. Two further rows run without clip or noise (FedAvg and
FedAdam at the same cohort and weighting): what clipping alone costs.

Learning rates: the local rate of the non-private runs (no clip, no noise) is picked on the
validation split (mean validation accuracy of the last 3 evaluations, seed --tune_seed, grid
--lrs widened to its neighbours in FULL_LRS while the pick sits at an edge), once for FedAvg
and once for FedAdam (its server rate fixed at FEDADAM_SERVER_LR); every private run of that
algorithm keeps that rate at every epsilon. Tuning per epsilon would spend the budget on the
choice (the validation scores of many noised runs are a release of their own) and triple the
runs.

Why this setting: the noise on the released mean has std sigma C / (q N) per coordinate, so
it shrinks only with a large expected cohort q N. The LEAF FEMNIST subset here has 105
writers: over 100 rounds at q = 0.5 (a cohort of about 52) sigma calibrates to 20.3 at
epsilon 1 and 3.3 at epsilon 8, a per-coordinate noise of 0.39 C and 0.063 C, 17 and 9 times
the noise below, so every private run would be noise. Fashion-MNIST cut into N = 2,000
clients of 27 examples (Dirichlet 1.0 class priors, equal sizes) gives q N = 100 at
q = 0.05, where 100 rounds calibrate to sigma 2.32 (epsilon 1) down to 0.74 (epsilon 8), a
per-coordinate noise of 0.023 C down to 0.0074 C. On a model of 21,840 parameters (Fed-LAMB's
MNIST CNN, dropout off) that is a noise of norm 3.4 C down to 1.1 C per round against a mean
update of norm at most C: every round is noisy, and the noise averages out over the rounds
by as much as the budget allows, so the range of epsilons shows a trend (a measured run: the
adaptive row at epsilon 2 and rate 0.1 ends at 0.763 test accuracy) without thousands of
clients per round. delta = 1e-5 is below 1/N.

Writes <out>.md (a section ready for docs/results.md: setting, command, table, figure
linked from docs/, reading), <out>.json (every run's summary without its records, the tuning
scores and the clips) and <out>.png (final test accuracy against epsilon, one line per row,
error bars over seeds). Runs live under --runs_dir, one workdir per run, reused or resumed
(experiments/sweep.py), so an interrupted study continues where it stopped and one run
directory can be filled in parts (e.g. --epsilons=inf,8 first). The seeds of one row and
epsilon, and the rates of one tuning grid, train together as one vectorized computation
(fedjax_lama/run/many.py); each (row, epsilon) is a program of its own (sigma is part of it).

Runs of the default study: 3 rates x 2 algorithms to tune (seed 0; a pick at an edge adds a
rate), 2 more seeds of each no-clip row, one FedAdam run to place its clip, and 3 rows x 5
epsilons x 3 seeds (the adaptive row's no-noise seed 0 is FedAvg's clip run): 55 runs (57
with widening) in 21 vectorized groups (23).
"""
import dataclasses
import json
import math
import os
import sys
import time
from typing import Dict, List, Optional, Sequence

import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from experiments import sweep
from fedjax_lama import training

FLAGS = flags.FLAGS

# The grid the tuning widens into while its pick sits at an edge (sweep.tune_widening).
FULL_LRS = (0.01, 0.03, 0.1, 0.3, 1.0)
# Reddi et al.'s FedAdam with the server rate the baselines study tuned at tau 1e-3.
FEDADAM_SERVER_LR = 0.03
FEDADAM_OVERRIDES = {"algorithm": "fedadam", "server_lr": FEDADAM_SERVER_LR}
ADAPTIVE_QUANTILE = 0.5
INF = math.inf


@dataclasses.dataclass(frozen=True)
class Method:
  """One row: a non-private algorithm (`base`, whose tuned rate it takes) plus its DP setting."""
  label: str
  title: str
  base: str                        # "fedavg" or "fedadam": the reference whose rate it keeps
  adaptive: bool = False           # Andrew et al.'s adaptive clip


METHODS = (
    Method("dp_fedavg_fixed", "DP-FedAvg, fixed clip", "fedavg"),
    Method("dp_fedavg_adaptive", f"DP-FedAvg, adaptive clip (quantile {ADAPTIVE_QUANTILE:g})",
           "fedavg", adaptive=True),
    Method("dp_fedadam", "DP-FedAdam, fixed clip", "fedadam"),
)
REFERENCES = {"fedavg": ("FedAvg, no clip, no noise", {"algorithm": "fedavg"}),
              "fedadam": ("FedAdam, no clip, no noise", FEDADAM_OVERRIDES)}


def parse_epsilons(values: Sequence[str]) -> List[float]:
  """--epsilons as floats; "inf" (or "infinity") is the run without noise."""
  out = []
  for v in values:
    text = str(v).strip().lower()
    try:
      eps = INF if text in ("inf", "infinity") else float(text)
    except ValueError:
      raise ValueError(f"--epsilons: {v!r} is not accepted; accepted: numbers > 0 or 'inf'"
                       ) from None
    if not eps > 0:
      raise ValueError(f"--epsilons: {v!r} is not accepted; accepted: numbers > 0 or 'inf'")
    out.append(eps)
  return out


def eps_label(eps: float) -> str:
  return "inf" if eps == INF else f"{eps:g}"


def eps_header(eps: float) -> str:
  return "ε = ∞ (no noise)" if eps == INF else f"ε = {eps:g}"


def reference_config(base, name: str, lr: float, seed: int):
  """The non-private run of `name` (privacy off: no clip, no noise)."""
  c = sweep.configured(base, REFERENCES[name][1], local_lr=lr, seed=seed)
  c.privacy.enabled = False
  return c


def private_config(base, method: Method, eps: float, lr: float, seed: int):
  """`method` at target epsilon `eps` (sigma calibrated for config.rounds); inf: sigma 0."""
  c = sweep.configured(base, REFERENCES[method.base][1], local_lr=lr, seed=seed)
  c.privacy.enabled = True
  if eps == INF:
    c.privacy.noise_multiplier = 0.0
  else:
    c.privacy.target_epsilon = float(eps)
  c.privacy.adaptive.enabled = method.adaptive
  if method.adaptive:
    c.privacy.adaptive.target_quantile = ADAPTIVE_QUANTILE
  return c


def _runs(outcomes) -> list:
  """Summaries without their records' bulk kept out; a diverged run is reported as such."""
  return [{"diverged": str(r)} if isinstance(r, training.TrainingError) else r
          for r in outcomes]


def clip_config(base, method: Method, clip: Optional[float]):
  """`base` with the fixed clip of `method` (None: keep the config's)."""
  if clip is None or method.adaptive:
    return base
  return sweep.configured(base, {"privacy.clip_norm": float(clip)})


def median_norm(summary: dict, last: int = 3) -> float:
  """The adaptive clip of a run without noise at its last `last` evaluations, averaged: where
  Andrew et al.'s quantile-0.5 clip settles, the median norm of the clients' updates."""
  clips = [r["aggregator_dp/clip_norm"] for r in summary["records"]
           if "aggregator_dp/clip_norm" in r]
  if not clips:
    raise ValueError("the run records no aggregator_dp/clip_norm: not an adaptive DP run")
  return float(np.mean(clips[-last:]))


ADAPTIVE_NO_NOISE = Method("clip_calibration", "adaptive clip, no noise", "fedavg",
                           adaptive=True)


def run_study(base, epsilons: Sequence[float], seeds: Sequence[int], lrs: Sequence[float],
              tune_seed: int, runs_dir: str, full_lrs: Sequence[float] = FULL_LRS,
              clip_norm: Optional[float] = None) -> dict:
  """Tunes the references, sets the fixed clips, then runs every method at every epsilon with
  every seed (see the module docstring).

  clip_norm: the fixed clip of the fixed-clip rows; None: for each base algorithm, the median
  update norm of its non-private run at the tuned rate (`median_norm` of an adaptive-clip run
  without noise, seed `tune_seed`), chosen like the rate on a run that spends no budget.
  """
  results = {"tuning": {}, "references": {}, "clips": {}, "methods": {}}
  rates = {}
  for name in REFERENCES:
    workdir = lambda lr, seed, name=name: os.path.join(runs_dir, f"{name}_nodp", f"lr{lr:g}",
                                                       f"seed{seed}")
    make = lambda lr, seed, name=name: reference_config(base, name, lr, seed)
    tuned = sweep.tune_widening(make, list(lrs), tune_seed, workdir,
                                sorted(set(full_lrs) | set(lrs)))
    rates[name] = tuned.value
    results["tuning"][name] = {"lr": tuned.value, "scores": tuned.scores}
    outcomes = _runs(sweep.run_group([make(tuned.value, s) for s in seeds],
                                     [workdir(tuned.value, s) for s in seeds]))
    results["references"][name] = {"lr": tuned.value, "runs": outcomes}
    print(f"{name} (no DP): lr {tuned.value:g}, final test accuracy "
          f"{sweep.mean_std([r.get('final_test_accuracy') for r in outcomes])}", flush=True)

  def workdir_of(method, eps, lr, seed):
    return os.path.join(runs_dir, method.label, f"eps{eps_label(eps)}", f"lr{lr:g}",
                        f"seed{seed}")

  clips = {}
  for name in REFERENCES:
    if clip_norm is not None:
      clips[name] = float(clip_norm)
      results["clips"][name] = {"clip_norm": clips[name], "from": "--clip_norm"}
      continue
    # The adaptive FedAvg row's no-noise run of seed tune_seed is this run for FedAvg.
    method = next((m for m in METHODS if m.adaptive and m.base == name),
                  dataclasses.replace(ADAPTIVE_NO_NOISE, label=f"{name}_clip_calibration",
                                      base=name))
    summary = sweep.run(private_config(base, method, INF, rates[name], tune_seed),
                        workdir_of(method, INF, rates[name], tune_seed))
    clips[name] = median_norm(summary)
    results["clips"][name] = {"clip_norm": clips[name], "from": method.label}
    print(f"{name}: fixed clip {clips[name]:.4g} (median update norm, no noise)", flush=True)

  for method in METHODS:
    lr = rates[method.base]
    method_base = clip_config(base, method, clips[method.base])
    per_eps = results["methods"].setdefault(method.label, {})
    for eps in epsilons:
      outcomes = _runs(sweep.run_group(
          [private_config(method_base, method, eps, lr, s) for s in seeds],
          [workdir_of(method, eps, lr, s) for s in seeds]))
      per_eps[eps_label(eps)] = {"lr": lr, "runs": outcomes}
      print(f"{method.label} epsilon {eps_label(eps)}: final test accuracy "
            f"{sweep.mean_std([r.get('final_test_accuracy') for r in outcomes])}", flush=True)
  return results


def _finals(runs) -> List[float]:
  return [r["final_test_accuracy"] for r in runs if "diverged" not in r]


def _cell(runs) -> str:
  finals = _finals(runs)
  if not finals:
    return "diverged"
  text = sweep.mean_std(finals)
  lost = len(runs) - len(finals)
  return text + (f" ({lost} diverged)" if lost else "")


def _privacy_values(results, label: str, key: str) -> List[float]:
  """summary["privacy"][key] of every finished run at epsilon `label`, over the methods."""
  out = []
  for method in METHODS:
    for r in results["methods"].get(method.label, {}).get(label, {}).get("runs", []):
      value = r.get("privacy", {}).get(key) if "diverged" not in r else None
      if value is not None:
        out.append(float(value))
  return out


def _adaptive_update_sigma(results, label: str) -> List[float]:
  runs = [r for m in METHODS if m.adaptive
          for r in results["methods"].get(m.label, {}).get(label, {}).get("runs", [])]
  return [float(r["privacy"]["update_noise_multiplier"]) for r in runs
          if "diverged" not in r and "update_noise_multiplier" in r.get("privacy", {})]


def _span(values: Sequence[float], fmt: str = "{:.4g}") -> str:
  if not values:
    return "-"
  low, high = min(values), max(values)
  return fmt.format(low) if np.isclose(low, high, rtol=1e-6) else (
      f"{fmt.format(low)} to {fmt.format(high)}")


def table(results: dict, epsilons: Sequence[float], base) -> str:
  """Rows: methods and the no-DP references; columns: epsilon. Final test accuracy, mean ± std
  over seeds, then the sigma each epsilon calibrated to and the epsilon the runs reached."""
  header = ["row", "local lr"] + [eps_header(e) for e in epsilons]
  rows = []
  for method in METHODS:
    per_eps = results["methods"][method.label]
    rows.append([method.title, f"{per_eps[eps_label(epsilons[0])]['lr']:g}"]
                + [_cell(per_eps[eps_label(e)]["runs"]) for e in epsilons])
  for name, (title, _) in REFERENCES.items():
    ref = results["references"][name]
    rows.append([title, f"{ref['lr']:g}"] + [_cell(ref["runs"]) if e == INF else "-"
                                             for e in epsilons])
  cohort = base.active_ratio * base.num_clients
  rows.append(["noise multiplier σ (calibrated)", ""] + [
      "0" if e == INF else _span(_privacy_values(results, eps_label(e), "noise_multiplier"))
      for e in epsilons])
  if any(m.adaptive for m in METHODS):
    rows.append(["σ of the update, adaptive clip (Andrew et al., Thm. 1)", ""] + [
        "0" if e == INF else _span(_adaptive_update_sigma(results, eps_label(e)))
        for e in epsilons])
  rows.append([f"noise std of the mean / C = σ / (qN), qN = {cohort:g}", ""] + [
      "0" if e == INF else _span([s / cohort for s in _privacy_values(
          results, eps_label(e), "noise_multiplier")], "{:.4f}") for e in epsilons])
  rows.append([f"ε reached after {base.rounds} rounds (δ = {base.privacy.delta:g})", ""] + [
      "∞" if e == INF else _span(_privacy_values(results, eps_label(e), "epsilon"), "{:.3f}")
      for e in epsilons])
  return sweep.markdown_table(header, rows)


def plot(path: str, results: dict, epsilons: Sequence[float]) -> None:
  """Final test accuracy against epsilon (log scale; "no noise" drawn one step right of the
  largest budget), one line per method with std error bars; the no-DP rows as dashed lines."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  finite = sorted(e for e in epsilons if e != INF)
  inf_at = (finite[-1] * 2) if finite else 1.0
  position = lambda e: inf_at if e == INF else e
  fig, ax = plt.subplots(figsize=(6.5, 4.2), dpi=100)
  for method in METHODS:
    xs, ys, errs = [], [], []
    for e in sorted(epsilons, key=position):
      finals = _finals(results["methods"][method.label][eps_label(e)]["runs"])
      if finals:
        xs.append(position(e))
        ys.append(np.mean(finals))
        errs.append(np.std(finals))
    ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label=method.title)
  for name, (title, _) in REFERENCES.items():
    finals = _finals(results["references"][name]["runs"])
    if finals:
      ax.axhline(np.mean(finals), linestyle="--", linewidth=1, color="gray" if name == "fedavg"
                 else "black", label=title)
  ticks = sorted({position(e) for e in epsilons})
  ax.set_xscale("log", base=2)
  ax.set_xticks(ticks)
  ax.set_xticklabels(["∞\n(no noise)" if t == inf_at and INF in epsilons else f"{t:g}"
                      for t in ticks])
  ax.minorticks_off()
  ax.set_xlabel("target ε")
  ax.set_ylabel("final test accuracy")
  ax.set_title("accuracy against the privacy budget (mean ± std over seeds)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


def reading(results: dict, epsilons: Sequence[float]) -> str:
  """One line read off the numbers: each method's accuracy at the smallest and the largest
  finite budget and without noise."""
  finite = sorted(e for e in epsilons if e != INF)
  parts = []
  for method in METHODS:
    per_eps = results["methods"][method.label]
    at = lambda e: (np.mean(_finals(per_eps[eps_label(e)]["runs"]))
                    if _finals(per_eps[eps_label(e)]["runs"]) else None)
    ends = sorted({finite[0], finite[-1]}) if finite else []
    points = [(e, at(e)) for e in ends + ([INF] if INF in epsilons else [])]
    parts.append(f"{method.title}: " + ", ".join(
        f"{'no noise' if e == INF else f'ε {e:g}'} {a:.4f}" if a is not None else
        f"{'no noise' if e == INF else f'ε {e:g}'} diverged" for e, a in points))
  for name, (title, _) in REFERENCES.items():
    finals = _finals(results["references"][name]["runs"])
    parts.append(f"{title}: " + (f"{np.mean(finals):.4f}" if finals else "diverged"))
  return "Reading (mean final test accuracy): " + "; ".join(parts) + "."


def setting_text(base, seeds, lrs, tune_seed, results) -> str:
  d = base.privacy
  return "\n".join([
      f"Setting: {base.dataset}, model {base.model}, partition {base.partition} "
      f"(concentration {base.dirichlet_concentration}) over N = {base.num_clients} clients, "
      f"validation split {base.validation_fraction:.0%} of the training data; Poisson "
      f"sampling at q = {base.active_ratio:g} (expected cohort "
      f"{base.active_ratio * base.num_clients:g}), "
      f"uniform weighting, {base.local_steps} local steps of batch {base.batch_size}, "
      f"{base.rounds} rounds. DP: flat L2 clip; " + clips_text(results) + "; the adaptive "
      f"row starts at C = {d.clip_norm:g} (target quantile {ADAPTIVE_QUANTILE:g}, rate "
      f"{d.adaptive.learning_rate:g}, count noise std "
      + (f"{d.adaptive.count_stddev:g}" if d.adaptive.count_stddev is not None else "qN/20")
      + f"); δ = {d.delta:g}, {d.accountant.upper()} accountant; σ calibrated per target ε "
      f"for the whole run. FedAdam: server rate {FEDADAM_SERVER_LR:g}, tau "
      f"{base.fedadam.tau:g}.",
      "Learning rates: the local rate of the non-private FedAvg and FedAdam (no clip, no noise) "
      f"was picked from {{{', '.join(f'{x:g}' for x in lrs)}}} (widened into "
      f"{{{', '.join(f'{x:g}' for x in FULL_LRS)}}} at an edge) by the mean validation accuracy "
      f"of the last 3 evaluations, seed {tune_seed}, and kept for every ε of the private rows "
      "(" + "; ".join(f"{n}: {r['lr']:g}, scores " + ", ".join(
          f"{lr:g}: {s:.4f}" for lr, s in sorted(r["scores"].items()))
          for n, r in results["tuning"].items()) + ").",
      f"Seeds {', '.join(map(str, seeds))}; final test accuracy, mean ± std over seeds. "
      "ε = ∞ is the same private run with σ = 0 (the clip kept); the no-clip rows show what "
      "clipping alone costs."])


def clips_text(results) -> str:
  values = ", ".join(f"{name} {c['clip_norm']:.3g}" for name, c in results["clips"].items())
  if all(c["from"] == "--clip_norm" for c in results["clips"].values()):
    return f"fixed C ({values}) set by --clip_norm"
  return (f"fixed C ({values}): the median update norm of each algorithm's non-private run at "
          "its tuned rate (where the adaptive clip settles without noise, mean of its last 3 "
          "evaluations, tuning seed)")


# The section is written to be pasted into docs/results.md: its figure link starts there.
def figure_link(path: str) -> str:
  """The figure as the report beside it links it (docs/results.md links it from docs/)."""
  return os.path.basename(path)


def write_report(base, results, epsilons, seeds, lrs, tune_seed, out, command,
                 elapsed: Optional[float] = None) -> str:
  """<out>.md (a results section), <out>.json (every summary), <out>.png (the figure)."""
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  plot(out + ".png", results, epsilons)
  # Runs trained together report the group's time each: split it among them.
  wall = sum(r.get("wall_seconds", 0) / r.get("vectorized_runs", 1)
             for group in _all_groups(results) for r in group)
  text = "\n".join([
      "## Differential privacy: accuracy against ε", "",
      setting_text(base, seeds, lrs, tune_seed, results), "",
      f"Command: `{command}`", "",
      f"Machine: {sweep.machine()}. Time of the reported runs: {wall / 60:.1f} min (a group "
      "trained together counted once; the tuning runs of the rates not kept are not counted)"
      + (f"; this invocation took {elapsed / 60:.1f} min (finished runs reused)."
         if elapsed is not None else "."), "",
      table(results, epsilons, base), "",
      f"![final test accuracy against ε]({figure_link(out + '.png')})", "",
      reading(results, epsilons), ""])
  with open(out + ".md", "w") as f:
    f.write(text)
  slim = lambda runs: [{k: v for k, v in r.items() if k != "records"} for r in runs]
  with open(out + ".json", "w") as f:
    json.dump({
        "epsilons": [eps_label(e) for e in epsilons], "seeds": list(seeds),
        "tuning": {n: {"lr": r["lr"], "scores": {f"{k:g}": v for k, v in r["scores"].items()}}
                   for n, r in results["tuning"].items()},
        "clips": results["clips"],
        "references": {n: {"lr": r["lr"], "runs": slim(r["runs"])}
                       for n, r in results["references"].items()},
        "methods": {m: {e: {"lr": g["lr"], "runs": slim(g["runs"])} for e, g in per.items()}
                    for m, per in results["methods"].items()},
    }, f, indent=1, default=str)
  return text


def _all_groups(results):
  yield from (r["runs"] for r in results["references"].values())
  yield from (g["runs"] for per in results["methods"].values() for g in per.values())


# --quick: a smoke run of the whole pipeline (the built-in digits data, 4 rounds; its time is
# mostly compilation: 16 runs in 11 programs).
QUICK = {"dataset": "digits", "model": "mlp", "partition": "iid", "num_clients": 20,
         "active_ratio": 0.5, "rounds": 4, "local_steps": 2, "batch_size": 8,
         "eval_every": 2, "checkpoint_every": 2, "eval_batch_size": 500,
         "validation_fraction": 0.2}
# Two seeds, so that the smoke run also trains a row's seeds as one vectorized computation.
QUICK_EPSILONS, QUICK_SEEDS, QUICK_LRS = (4.0, INF), (0, 1), (0.1,)


def quick_config(base):
  c = sweep.configured(base, QUICK)
  c.model_options = type(c.model_options)()  # the MLP takes none of the CNN's options
  c.privacy.delta = 1e-3  # below 1 / N = 0.05
  # The count's noise must cost less than the whole budget (> sigma / 2; q N / 20 = 0.5 is not).
  c.privacy.adaptive.count_stddev = 1.0
  return c


def _command(argv) -> str:
  """The command as typed, with the data and runs directories as DATA and RUNS."""
  args = []
  for a in argv[1:]:
    key, eq, value = a.partition("=")
    if eq and key.lstrip("-") == "config.data_dir":
      a = f"{key}=DATA"
    elif eq and key.lstrip("-") == "runs_dir":
      a = f"{key}=RUNS/{os.path.basename(value.rstrip('/'))}"
    args.append(a)
  return " ".join(["python -m experiments.dp_study"] + args)


def define_flags() -> None:
  config_flags.DEFINE_config_file("config", "configs/dp_fmnist.py", "Base config.")
  flags.DEFINE_string("runs_dir", None, "Directory of the runs' workdirs (default: <out>_runs).")
  flags.DEFINE_string("out", "experiments/results/dp_fmnist",
                      "Report prefix: writes <out>.md, <out>.json, <out>.png.")
  flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds of every row.")
  flags.DEFINE_list("epsilons", ["1", "2", "4", "8", "inf"],
                    "Target epsilons; 'inf' is the run without noise (sigma 0, clip kept).")
  flags.DEFINE_integer("rounds", 0, "Rounds of every run (0: the config's); sigma is "
                       "calibrated for this many.")
  flags.DEFINE_list("lrs", ["0.1", "0.3", "1"], "Local learning-rate grid of the "
                    "non-private tuning (widened into 0.01 ... 1 at an edge).")
  flags.DEFINE_integer("tune_seed", 0, "Seed of the tuning runs (reused as a final run).")
  flags.DEFINE_float("clip_norm", 0.0, "Fixed clip of the fixed-clip rows (0: each base "
                     "algorithm's median update norm without noise, measured at its tuned rate).")
  flags.DEFINE_bool("quick", False, "A smoke run (a minute or two on a CPU): digits, 20 "
                    "clients, 4 rounds, epsilons 4 and inf, seeds 0 and 1, lr 0.1 (overrides "
                    "--seeds, --epsilons, --lrs).")


def main(argv) -> None:
  del argv  # the report quotes sys.argv, flags included
  from fedjax_lama.cli import logs  # pylint: disable=g-import-not-at-top
  logs.progress_only()
  # dp-accounting warns for every RDP order it drops while calibrating; the orders it keeps
  # give the epsilon reported, so the warnings say nothing about the result.
  logging.set_verbosity(logging.ERROR)
  base = FLAGS.config
  if FLAGS.quick:
    base = quick_config(base)
    epsilons, seeds, lrs = list(QUICK_EPSILONS), list(QUICK_SEEDS), list(QUICK_LRS)
  else:
    epsilons = parse_epsilons(FLAGS.epsilons)
    seeds, lrs = [int(s) for s in FLAGS.seeds], [float(x) for x in FLAGS.lrs]
  if FLAGS.rounds:
    base.rounds = FLAGS.rounds
  runs_dir = FLAGS.runs_dir or FLAGS.out + "_runs"
  start = time.perf_counter()
  results = run_study(base, epsilons, seeds, lrs, FLAGS.tune_seed, runs_dir,
                      full_lrs=lrs if FLAGS.quick else FULL_LRS,
                      clip_norm=FLAGS.clip_norm or None)
  print(write_report(base, results, epsilons, seeds, lrs, FLAGS.tune_seed, FLAGS.out,
                     _command(sys.argv), elapsed=time.perf_counter() - start))


if __name__ == "__main__":
  define_flags()
  app.run(main)
