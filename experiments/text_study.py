r"""Federated language modelling on Shakespeare by role at a 2-core CPU's scale (issue 60).

  python -m experiments.text_study --data_dir=DATA --out=experiments/results/text
  python -m experiments.text_study --quick --data_dir=DATA --runs_dir=/tmp/tq --out=/tmp/tq/r

Setting (configs/text_study.py, per model): 21 speaking roles, every role in every round, 5
local steps of batch 10 sequences of 80 characters, 30 rounds, each role's own last windows
its local test part, 10 % of the training sequences held out for validation. Models
(--models): "lstm" (the FedAvg paper's character LSTM at width 64) and "transformer"
(transformer_lm, width 64, 2 blocks).

Rows (ROWS; the global model's rows first, then the personalized ones):
  * FedAvg (McMahan et al., AISTATS 2017), global model;
  * FedAdam (Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan, ICLR 2021):
    server rate 0.03 and tau 1e-3, the baselines study's setting (not tuned here);
  * SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, ICML 2020), its defaults;
  * FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, MLSys 2020), mu = 0.01;
  * FedLAMA (Lee, Zhang, Avestimehr, AAAI 2023) over FedAvg: config.schedule="fedlama",
    base interval tau' = the local steps of a round, phi = 2, the same local steps in all
    (rounds / phi windows of tau' phi steps);
  * FedAvg + fine-tuning: the FedAvg run, each client's model the global one after
    --finetune_steps local SGD steps on its own training part (config.finetune_steps);
  * Ditto (Li, Hu, Beirami, Smith, ICML 2021) at its default lambda 0.1, the personal rate
    the tuned local rate.
Learning rate: FedAvg's local rate, per model, picked on the validation split (mean
validation accuracy of the last 3 evaluations, seed --tune_seed) from --lrs, widened into
FULL_LRS while the pick sits at an edge (sweep.tune_widening), then used by every row of that
model, as the personalization study does (a per-method tuning does not fit this CPU's
budget).

Columns (mean ± std over seeds): the global model's next-character accuracy on the pooled
test windows (final_test_accuracy), the served model's mean over clients, its 10th
percentile and its worst client (each client on its own test windows, unweighted), and the
uplink floats against FedAvg's. The claims checked per model: FedAdam, SCAFFOLD and FedProx
each above FedAvg (their papers' claims under client heterogeneity), FedLAMA within FedAvg's
accuracy at less uplink, and fine-tuning and Ditto above FedAvg's global model per client.
"holds" needs the seed means apart by more than the larger seed std (personal_study.compare).

Writes <out>.md (a section ready for docs/results.md), <out>.json and <out>.png (per row,
the mean and 10th percentile over clients, one panel per model). Runs live under --runs_dir
(a workdir per run), reused or resumed, so an interrupted study continues where it stopped;
the seeds of one row train as one vectorized computation (FedLAMA's one after another).

Runs of the default study, per model: FedAvg at 3 rates on seed 0 (a pick at an edge adds
one), then 6 runs x 3 seeds (the tuning run reused): 20 runs in 8 groups.
"""
import importlib
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from experiments import personal_study as ps
from experiments import sweep
from experiments.personal_study import GLOBAL, PERSONAL, Row, Run
from fedjax_lama.errors import ConfigError

# The rate grid the tuning widens into while its pick sits at an edge.
FULL_LRS = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
MODEL_TITLES = {"lstm": "LSTM (the FedAvg paper's, width 64)",
                "transformer": "transformer (width 64, 2 blocks)"}
# Settings that are not rates, fixed (not tuned) for every model.
FEDADAM = {"server_lr": 0.03, "fedadam.tau": 1e-3}
FEDPROX_MU = 0.01
FEDLAMA_PHI = 2

ROWS = (
    Row("fedavg", "FedAvg (global model)", "fedavg", GLOBAL),
    Row("fedadam", "FedAdam", "fedadam", GLOBAL),
    Row("scaffold", "SCAFFOLD", "scaffold", GLOBAL),
    Row("fedprox", f"FedProx (μ = {FEDPROX_MU:g})", "fedprox", GLOBAL),
    Row("fedlama", f"FedLAMA over FedAvg (φ = {FEDLAMA_PHI})", "fedlama", GLOBAL),
    Row("fedavg_ft", "FedAvg + fine-tuning", "fedavg", PERSONAL),
    Row("ditto", "Ditto (λ = 0.1)", "ditto", PERSONAL),
)
ROW_LABELS = tuple(r.label for r in ROWS)


def fedlama_fields(base) -> dict:
  """FedLAMA over FedAvg with the local-step budget of `base`'s FedAvg: tau' = the local steps
  of a round, rounds / phi windows of tau' phi steps, evaluated about as often."""
  if base.rounds % FEDLAMA_PHI:
    raise ConfigError(f"config.rounds={base.rounds} is not accepted by the text study: FedLAMA "
                      f"runs rounds / phi windows; accepted: a multiple of {FEDLAMA_PHI}")
  return {"schedule": "fedlama", "fedlama.base_interval": base.local_steps,
          "fedlama.phi": FEDLAMA_PHI, "fedlama.total_steps": 0,
          "rounds": base.rounds // FEDLAMA_PHI,
          "eval_every": max(1, base.eval_every // FEDLAMA_PHI)}


def runs_for(base) -> Dict[str, Run]:
  """The study's runs on `base` (run key -> Run)."""
  lama = fedlama_fields(base)
  runs = (Run("fedavg", "fedavg", finetune=True),
          Run("fedadam", "fedadam", lambda lr: dict(FEDADAM)),
          Run("scaffold", "scaffold"),
          Run("fedprox", "fedprox", lambda lr: {"fedprox.mu": FEDPROX_MU}),
          Run("fedlama", "fedavg", lambda lr: dict(lama)),
          Run("ditto", "ditto", lambda lr: {"ditto.personal_lr": lr}))
  return {r.key: r for r in runs}


def select_rows(labels: Sequence[str]) -> List[Row]:
  """--methods as rows (empty: all), in ROWS order; an unknown label stops with the list."""
  unknown = [x for x in labels if x not in ROW_LABELS]
  if unknown:
    raise ConfigError(f"--methods: {unknown[0]!r} is not accepted; accepted: "
                      f"{', '.join(ROW_LABELS)}")
  return [r for r in ROWS if not labels or r.label in labels]


def make_study(name: str, base, rows: Sequence[Row], seeds, lrs, tune_seed: int,
               finetune_steps: int, finetune_lr: Optional[float],
               full_lrs: Sequence[float] = FULL_LRS) -> ps.Study:
  """The personalization study's machinery (tuning, vectorized seeds, resumable workdirs)
  over this study's runs."""
  return ps.Study(name, base, rows, seeds, lrs, tune_seed, finetune_steps, finetune_lr,
                  full_lrs=full_lrs, runs_by_key=runs_for(base))


# ---- statistics -----------------------------------------------------------------------------
def _seed_stat(values) -> Optional[tuple]:
  values = [float(v) for v in values if v is not None]
  return (float(np.mean(values)), float(np.std(values))) if values else None


def row_stats(rows: Sequence[Row], runs: Dict[str, list]) -> Dict[str, dict]:
  """personal_study.row_stats (per-client statistics of the served model) plus "pooled" (the
  global model's accuracy on the pooled test windows) and "uplink" (uplink floats over
  FedAvg's, mean over seeds)."""
  stats = ps.row_stats(rows, runs)
  ok = lambda key: [r for r in runs.get(key, []) if "diverged" not in r]
  reference = np.mean([r["comm_floats_up"] for r in ok("fedavg")]) if ok("fedavg") else None
  for row in rows:
    if row.label not in stats:
      continue
    finished = ok(row.run)
    stats[row.label]["pooled"] = _seed_stat([r.get("final_test_accuracy") for r in finished])
    if reference:
      stats[row.label]["uplink"] = float(
          np.mean([r["comm_floats_up"] for r in finished]) / reference)
  return stats


def table(rows: Sequence[Row], stats: Dict[str, dict], skipped: Dict[str, str]) -> str:
  header = ["row", "test accuracy (pooled, global model)", "served model: mean over clients",
            "10th percentile", "worst client", "uplink / FedAvg's"]
  lines = []
  for row in rows:
    if row.label in skipped:
      lines.append([row.title, f"skipped: {skipped[row.label]}", "", "", "", ""])
      continue
    s = stats.get(row.label)
    if s is None:
      lines.append([row.title, "diverged or not run", "", "", "", ""])
      continue
    pooled = s.get("pooled") if row.model == GLOBAL else None
    lines.append([row.title, ps._cell(pooled) if pooled else "(its global model: FedAvg's)",
                  ps._cell(s.get("mean")), ps._cell(s.get("p10")), ps._cell(s.get("worst")),
                  f"{s['uplink']:.3f}" if "uplink" in s else "-"])
  return sweep.markdown_table(header, lines)


# ---- the claims -----------------------------------------------------------------------------
def claims(stats: Dict[str, dict]) -> List[str]:
  """The papers' claims checked on one model's numbers (stats as row_stats gives them)."""
  get = lambda label, stat: stats.get(label, {}).get(stat)
  lines = []
  base = get("fedavg", "pooled")
  for label, claim in (("fedadam", "FedAdam above FedAvg (Reddi et al., ICLR 2021)"),
                       ("scaffold", "SCAFFOLD above FedAvg (Karimireddy et al., ICML 2020)"),
                       ("fedprox", "FedProx above FedAvg (Li et al., MLSys 2020)")):
    if get(label, "pooled") is None or base is None:
      lines.append(f"{claim}: not measured.")
      continue
    lines.append(f"{claim}: {ps.compare(get(label, 'pooled'), base)} (pooled test accuracy "
                 f"{get(label, 'pooled')[0]:.4f} against {base[0]:.4f}).")
  lama = get("fedlama", "pooled")
  if lama is None or base is None:
    lines.append("FedLAMA within FedAvg's accuracy at less uplink (Lee et al., AAAI 2023): "
                 "not measured.")
  else:
    below = ps.compare(base, lama)  # "holds": FedLAMA below FedAvg beyond the seeds' spread
    uplink = get("fedlama", "uplink")
    cheaper = uplink is not None and uplink < 1.0
    verdict = ("holds" if below != "holds" and cheaper else
               "does not hold" if below == "holds" and not cheaper else "partly holds")
    lines.append(
        f"FedLAMA within FedAvg's accuracy at less uplink (Lee et al., AAAI 2023): {verdict} "
        f"(pooled test accuracy {lama[0]:.4f} against {base[0]:.4f}: "
        f"{'below by more than the seeds spread' if below == 'holds' else 'within or above'}"
        f"; uplink {uplink if uplink is None else f'{uplink:.3f}'} of FedAvg's).")
  global_mean = get("fedavg", "mean")
  for label, claim in (("fedavg_ft", "Fine-tuning above FedAvg's global model per client"),
                       ("ditto", "Ditto above FedAvg's global model per client (Li et al., "
                                 "ICML 2021)")):
    if get(label, "mean") is None or global_mean is None:
      lines.append(f"{claim}: not measured.")
      continue
    lines.append(f"{claim}: {ps.compare(get(label, 'mean'), global_mean)} (mean over "
                 f"clients {get(label, 'mean')[0]:.4f} against {global_mean[0]:.4f}; 10th "
                 f"percentile {get(label, 'p10')[0]:.4f} against "
                 f"{get('fedavg', 'p10')[0]:.4f}).")
  return lines


# ---- the report -----------------------------------------------------------------------------
def setting_text(study: ps.Study, lr: float, scores: dict) -> str:
  b = study.base
  o = b.dataset_options
  return (f"Setting: {b.dataset} (split {o.split}, train fraction {o.train_fraction}, "
          f"--sf {o.fraction}, roles of {o.min_samples} to {o.max_samples} samples, stride "
          f"{o.stride}), model {b.model} {dict(b.model_options)}, every role in every round, "
          f"{b.local_steps} local steps of batch {b.batch_size}, {b.rounds} rounds, validation "
          f"split {b.validation_fraction:.0%} of the training sequences, each role's own test "
          f"windows its local test part. Local rate {lr:g} for every row (FedAvg's, picked on "
          "the validation split" + (": " + ", ".join(f"{k:g}: {v:.4f}" for k, v in
                                                     sorted(scores.items()))
                                    if scores else ", a single rate given")
          + f"); fine-tuning {study.finetune_steps} steps at rate "
          f"{study.finetune_lr or lr:g}.")


def write_report(studies: Dict[str, ps.Study], results: Dict[str, dict], out: str,
                 command: str, elapsed: Optional[float] = None) -> str:
  """<out>.md, <out>.json, <out>.png; results: model -> {"lr", "scores", "runs"}."""
  first = next(iter(studies.values()))
  intro = (
      "FedAvg, FedAdam, SCAFFOLD, FedProx and FedLAMA on both models, and the personalized "
      "accuracy of fine-tuning and Ditto, each client (a speaking role) evaluated on its own "
      "test windows after the last round; each cell is the mean ± std over seeds "
      + ", ".join(map(str, first.seeds)) + ". Accuracy is next-character accuracy over all 80 "
      f"positions of a window. FedAdam: server rate {FEDADAM['server_lr']:g}, tau "
      f"{FEDADAM['fedadam.tau']:g}; FedProx: mu {FEDPROX_MU:g}; FedLAMA: tau' = the round's "
      f"local steps, phi = {FEDLAMA_PHI}, the same local steps in all; none of these is "
      "tuned.")

  def section(name, study, res, stats):
    return [f"#### {MODEL_TITLES.get(name, name)}", "",
            setting_text(study, res["lr"], res["scores"]), "",
            table(study.rows, stats, study.skipped), "",
            *[f"- {line}" for line in claims(stats)], ""]

  return ps.write_study_files(studies, results, out, command, elapsed,
                              "## Federated language modelling: Shakespeare by role", intro,
                              section, row_stats, "accuracy per method and model",
                              lambda name: MODEL_TITLES.get(name, name))


# --quick: the whole pipeline on a few roles, both models at a few thousand parameters.
QUICK = {"rounds": 2, "local_steps": 2, "eval_every": 1, "checkpoint_every": 2,
         "dataset_options.fraction": 0.03}
QUICK_MODELS = {"lstm": {"hidden_size": 8, "num_layers": 1},
                "transformer": {"width": 16, "depth": 1, "heads": 2}}
QUICK_SEEDS, QUICK_LRS = (0, 1), (1.0,)


def model_config(name: str, data_dir: str = "", rounds: int = 0, quick: bool = False):
  """configs/text_study.py:<name>, with --data_dir and --rounds, or the quick setting."""
  if name not in MODEL_TITLES:
    raise ConfigError(f"--models: {name!r} is not accepted; accepted: "
                      f"{', '.join(MODEL_TITLES)}")
  c = importlib.import_module("configs.text_study").get_config(name)
  if data_dir:
    c.data_dir = data_dir
  if quick:
    c = sweep.configured(c, QUICK)
    c.model_options.update(QUICK_MODELS[name])
  if rounds:
    c.rounds = rounds
  return c


def main(argv) -> None:
  del argv
  from fedjax_lama.cli import logs  # pylint: disable=g-import-not-at-top
  logs.progress_only()
  rows = select_rows(FLAGS.methods)
  bases = {n: model_config(n, FLAGS.data_dir, FLAGS.rounds, FLAGS.quick) for n in FLAGS.models}
  seeds, lrs, grid, runs_dir = ps.seeds_rates_and_runs(FLAGS, QUICK_SEEDS, QUICK_LRS, FULL_LRS)
  studies = {n: make_study(n, b, rows, seeds, lrs, FLAGS.tune_seed, FLAGS.finetune_steps,
                           FLAGS.finetune_lr or None, grid)
             for n, b in bases.items()}
  start = time.perf_counter()
  results = ps.run_studies(studies, runs_dir, "experiments.text_study", FLAGS.shard,
                           FLAGS.processes)
  if results is not None:
    print(write_report(studies, results, FLAGS.out, ps.command_line("experiments.text_study"),
                       time.perf_counter() - start))


if __name__ == "__main__":
  from absl import app, flags  # pylint: disable=g-import-not-at-top

  FLAGS = flags.FLAGS
  ps.define_flags(flags, "experiments/results/text", ["0.3", "1.0", "3.0"],
                  f"FedAvg's local-rate grid (widened into {ps.grid_text(FULL_LRS)} at an edge); "
                  "one rate is used as given.",
                  "A smoke run: 2 rounds on a few roles, both models at a few thousand "
                  "parameters, seeds 0 and 1, rate 1.0 (overrides --seeds, --lrs).")
  flags.DEFINE_list("models", list(MODEL_TITLES), "Models: " + ", ".join(MODEL_TITLES) + ".")
  flags.DEFINE_list("methods", [], "Rows (default all): " + ", ".join(ROW_LABELS) + ".")
  app.run(main)
