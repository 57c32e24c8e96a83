r"""Personalized accuracy over clients: every personalization method against FedAvg (issue 55).

  python -m experiments.personal_study --data_dir=DATA --runs_dir=RUNS/personal \
      --out=experiments/results/personal --processes=2
  python -m experiments.personal_study --quick --runs_dir=/tmp/pq --out=/tmp/pq/report

Datasets (--datasets): "femnist" (configs/personal_femnist.py: the LEAF FEMNIST subset's
105 natural writers, each keeping its own LEAF test examples) and "fmnist"
(configs/personal_fmnist.py: Fashion-MNIST over 50 clients of two classes each, 20 % of each
client's data held out as its local test part, stratified by label). Every client is
evaluated on its own local test part after the last round.

Rows (ROWS; a row whose algorithm the registry does not have yet is skipped and named in the
report):
  * FedAvg, global model: each client evaluated with the one global model;
  * FedAvg + fine-tuning: the same run, each client's model being the global model after
    --finetune_steps steps of local SGD on its training part (the per-client evaluation's
    fine-tuning, config.finetune_steps) at the fine-tuning rate (--finetune_lr, by default
    the tuned local rate); a second run does the same at a tenth of that rate. Neither
    rate is tuned (the clients have no validation part of their own): the second row shows
    how much of the gain the rate decides;
  * local training only: Ditto at lambda = 0, whose personal model v_k is exactly the
    client's own local SGD from the initial model on its own data, never mixed with anything
    (tests/test_personalized_methods.py checks it against that recursion); every client
    takes part in every round, so each trains rounds x local_steps steps;
  * Ditto (Li, Hu, Beirami, Smith, ICML 2021) at lambda = config.ditto.lam;
  * APFL (Deng, Kamani, Mahdavi, 2020), alpha learned from 0.5;
  * pFedMe (Dinh, Tran, Nguyen, NeurIPS 2020), lambda = 1 / (2 lr) so that its outer step
    moves w_i half way to theta (lr lambda = 1/2; the paper's lambda 15 with the rates tuned
    here, 0.1 or more, would give lr lambda >= 1.5, an outer step past theta);
  * Per-FedAvg (FO) (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020), its inner step alpha the
    fine-tuning rate, evaluated with the same fine-tuning as FedAvg + fine-tuning (the model
    it trains for is the one such steps personalize);
  * FedPer, FedRep, LG-FedAvg with their default personal layers (the classifier head; for
    LG-FedAvg every layer but the head);
  * FedBN (Li, Jiang, Zhang, Kamp, Dou, ICLR 2021) on the setting's MLP with a BatchNorm
    after its hidden layer (model_options.batch_norm; on the plain MLP FedBN is FedAvg
    exactly), beside FedAvg on the same model: the pair to compare;
  * HypCluster (Mansour, Mohri, Ro, Suresh, 2020) with k = 2 cluster models.
The personal methods' own step sizes (Ditto's, APFL's and pFedMe's personal_lr) are the
tuned local rate.

Learning rate: FedAvg's local rate is picked on the validation split (mean validation
accuracy of the last 3 evaluations, seed --tune_seed) from --lrs, widened into FULL_LRS while
the pick sits at an edge (experiments/sweep.py), per dataset, and used by every row on the
setting's model: a per-method tuning does not fit a 2-core CPU budget. The rows on the model
with BatchNorm (FedAvg's and FedBN's) take FedAvg's rate on that model, picked the same way
(Run.tuning).

Columns (mean ± std over seeds of each run's per-client statistics, clients unweighted):
the served model's mean accuracy over clients and its 10th percentile, the global model's
mean, and the worst client. The claims of the papers checked on these numbers: Ditto's
fairness (a higher 10th percentile and a lower spread over clients than FedAvg's global
model, Li et al., ICML 2021, Table 1 and Fig. 3), FedRep above FedAvg under label skew
(Collins, Hassani, Mokhtari, Shakkottai, ICML 2021, Table 1), and every personalized model
above FedAvg's global model on per-client accuracy.

Writes <out>.md (a section ready for docs/results.md), <out>.json (every run's summary
without its records, the tuning scores) and <out>.png (mean and 10th percentile per row,
one panel per dataset), the figure linked by its file name (the report sits beside it).
Runs live under --runs_dir (a workdir per run), reused or resumed, so an interrupted study
continues where it stopped; the seeds of one row train as one vectorized computation.
--processes=N trains the rows in N processes at once after the rates are picked (each
compiles its own programs: the compilation of N rows runs on N cores).

Runs of the default study, per dataset: FedAvg at 3 rates on seed 0 to tune on each of the
two models (one of them reused; a pick at an edge adds a rate), then 13 runs x 3 seeds: 86
runs in 32 vectorized groups for both datasets. The costliest are pFedMe (6 gradients a local step) and the rows
taking 2 (local, Ditto, APFL, Per-FedAvg); --rounds scales them all.
"""
import dataclasses
import importlib
import json
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from experiments import robust_study
from experiments import sweep
from fedjax_lama import registry
from fedjax_lama import training
from fedjax_lama.errors import ConfigError

# The rate grid the tuning widens into while its pick sits at an edge.
FULL_LRS = (0.01, 0.03, 0.1, 0.3, 1.0)
# Dataset key -> the config module of its setting.
DATASETS = {"femnist": "configs.personal_femnist", "fmnist": "configs.personal_fmnist"}
DATASET_TITLES = {"femnist": "FEMNIST (LEAF subset, natural writers)",
                  "fmnist": "Fashion-MNIST (two classes per client)",
                  "digits": "digits (smoke run)"}
# A claim "holds" when the difference of seed means beats the larger seed std of the two.
GLOBAL, PERSONAL = "global", "personal"


@dataclasses.dataclass(frozen=True)
class Run:
  """One configuration trained with every seed; rows read its summaries."""
  key: str                         # workdir name
  algorithm: str
  # lr -> overrides of the run (beside algorithm and local_lr).
  overrides: Callable[[float], dict] = lambda lr: {}
  finetune: bool = False           # fine-tuning on at evaluation (config.finetune_steps)
  finetune_scale: float = 1.0      # the fine-tuning rate times this
  needs_batchnorm: bool = False    # skipped on a model without BatchNorm (it is FedAvg there)
  # The run whose FedAvg rate, picked on the validation split, this run takes: "fedavg" (the
  # setting's model), or "fedavg_bn" for the rows on the model with BatchNorm.
  tuning: str = "fedavg"


@dataclasses.dataclass(frozen=True)
class Row:
  label: str
  title: str
  run: str                         # Run.key
  model: str                       # GLOBAL or PERSONAL: which per-client metrics it reads


WITH_BATCHNORM = {"model_options.batch_norm": True}

RUNS = (
    Run("fedavg", "fedavg", finetune=True),
    Run("fedavg_ft_slow", "fedavg", finetune=True, finetune_scale=0.1),
    Run("local", "ditto", lambda lr: {"ditto.lam": 0.0, "ditto.personal_lr": lr}),
    Run("ditto", "ditto", lambda lr: {"ditto.personal_lr": lr}),
    Run("apfl", "apfl", lambda lr: {"apfl.personal_lr": lr}),
    Run("pfedme", "pfedme", lambda lr: {"pfedme.lam": 1.0 / (2.0 * lr),
                                        "pfedme.personal_lr": lr}),
    Run("perfedavg", "perfedavg", lambda lr: {"perfedavg.alpha": lr}, finetune=True),
    Run("fedper", "fedper"),
    Run("fedrep", "fedrep"),
    Run("lg_fedavg", "lg_fedavg"),
    # FedBN needs normalization layers: it and its FedAvg baseline train the setting's MLP
    # with a BatchNorm per hidden layer (on the plain MLP FedBN is FedAvg exactly).
    # Their rate is FedAvg's on that model, picked on the validation split as for the others.
    Run("fedavg_bn", "fedavg", lambda lr: dict(WITH_BATCHNORM), tuning="fedavg_bn"),
    Run("fedbn", "fedbn", lambda lr: dict(WITH_BATCHNORM), needs_batchnorm=True,
        tuning="fedavg_bn"),
    Run("hypcluster", "hypcluster"),
)
RUNS_BY_KEY = {r.key: r for r in RUNS}

ROWS = (
    Row("fedavg", "FedAvg (global model)", "fedavg", GLOBAL),
    Row("fedavg_ft", "FedAvg + fine-tuning", "fedavg", PERSONAL),
    Row("fedavg_ft_slow", "FedAvg + fine-tuning at a tenth of the rate", "fedavg_ft_slow",
        PERSONAL),
    Row("local", "local training only (Ditto, λ = 0)", "local", PERSONAL),
    Row("ditto", "Ditto", "ditto", PERSONAL),
    Row("apfl", "APFL", "apfl", PERSONAL),
    Row("pfedme", "pFedMe", "pfedme", PERSONAL),
    Row("perfedavg", "Per-FedAvg (FO) + fine-tuning", "perfedavg", PERSONAL),
    Row("fedper", "FedPer", "fedper", PERSONAL),
    Row("fedrep", "FedRep", "fedrep", PERSONAL),
    Row("lg_fedavg", "LG-FedAvg", "lg_fedavg", PERSONAL),
    Row("fedavg_bn", "FedAvg, MLP with BatchNorm (global model)", "fedavg_bn", GLOBAL),
    Row("fedbn", "FedBN (MLP with BatchNorm)", "fedbn", PERSONAL),
    Row("hypcluster", "HypCluster (k = 2)", "hypcluster", PERSONAL),
)
ROW_LABELS = tuple(r.label for r in ROWS)


def metric(model: str, stat: str) -> str:
  return f"client_test_accuracy/{model}/{stat}"


def select_rows(labels: Sequence[str], rows: Sequence[Row] = ROWS) -> List[Row]:
  """--methods as rows (empty: all), in the order of `rows` (default this study's ROWS); an
  unknown label stops with the list."""
  accepted = [r.label for r in rows]
  unknown = [x for x in labels if x not in accepted]
  if unknown:
    raise ConfigError(f"--methods: {unknown[0]!r} is not accepted; accepted: "
                      f"{', '.join(accepted)}")
  return [r for r in rows if not labels or r.label in labels]


def has_batchnorm(config) -> bool:
  """Whether config.model keeps BatchNorm statistics (checked on a 28x28x1 input, the image
  size of the study's datasets; a dense model does not look at the size)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fedjax_lama import models  # pylint: disable=g-import-not-at-top
  module = models.get(config.model, 10, **dict(config.model_options))
  shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0),
                                              jnp.zeros((1, 28, 28, 1), jnp.float32)))
  return "batch_stats" in shapes


def runnable(rows: Sequence[Row], base, available: Sequence[str],
             runs_by_key: Optional[Dict[str, Run]] = None) -> tuple:
  """(runs to train, {row label: why it is skipped}) for `rows` on `base`; the rows' runs are
  read from `runs_by_key` (default this study's RUNS_BY_KEY)."""
  runs_by_key = RUNS_BY_KEY if runs_by_key is None else runs_by_key
  skipped, runs = {}, []
  for row in rows:
    run = runs_by_key[row.run]
    if run.algorithm not in available:
      skipped[row.label] = f"algorithm {run.algorithm!r} is not in this build's registry"
      continue
    # The model the run trains (its overrides may add normalization layers); the rate does
    # not change the model.
    if run.needs_batchnorm and not has_batchnorm(sweep.configured(base, run.overrides(1.0))):
      skipped[row.label] = (f"model {base.model!r} has no BatchNorm layer: FedBN is FedAvg "
                            "there")
      continue
    if run not in runs:
      runs.append(run)
  return runs, skipped


def run_config(base, run: Run, lr: float, seed: int, finetune_steps: int,
               finetune_lr: Optional[float]):
  """`run` at local rate `lr` and `seed`; fine-tuning only where the run asks for it."""
  fields = {"algorithm": run.algorithm, "local_lr": lr, "seed": seed, **run.overrides(lr)}
  c = sweep.configured(base, fields)
  c.finetune_steps = finetune_steps if run.finetune else 0
  if run.finetune:
    c.finetune_lr = (finetune_lr or lr) * run.finetune_scale
  return c


class Study:
  """One dataset's tuning and runs (workdirs under <runs_dir>/<dataset>)."""

  def __init__(self, name: str, base, rows: Sequence[Row], seeds: Sequence[int],
               lrs: Sequence[float], tune_seed: int, finetune_steps: int,
               finetune_lr: Optional[float], full_lrs: Sequence[float] = FULL_LRS,
               runs_by_key: Optional[Dict[str, Run]] = None):
    """runs_by_key: the runs the rows name (default RUNS_BY_KEY; other studies of served
    models, experiments/text_study.py, bring their own)."""
    self.name, self.base, self.rows = name, base, list(rows)
    self.seeds, self.lrs, self.tune_seed = list(seeds), list(lrs), tune_seed
    self.finetune_steps, self.finetune_lr = finetune_steps, finetune_lr
    self.full_lrs = sorted(set(full_lrs) | set(lrs))
    self.runs_by_key = RUNS_BY_KEY if runs_by_key is None else runs_by_key
    self.runs, self.skipped = runnable(self.rows, base, registry.names(), self.runs_by_key)

  def workdir(self, runs_dir: str, run: Run, lr: float, seed: int) -> str:
    return os.path.join(runs_dir, self.name, run.key, f"lr{lr:g}", f"seed{seed}")

  def config(self, run: Run, lr: float, seed: int):
    return run_config(self.base, run, lr, seed, self.finetune_steps, self.finetune_lr)

  def tune(self, runs_dir: str) -> Dict[str, sweep.Tuned]:
    """Run.tuning key -> FedAvg's local rate on the validation split, for the setting's model
    ("fedavg") and every other model a run trains ("fedavg_bn"). The tuning runs are that
    FedAvg run's own (fine-tuning changes only the per-client evaluation, not the validation
    score)."""
    out = {}
    for key in ["fedavg"] + sorted({r.tuning for r in self.runs} - {"fedavg"}):
      tuner = self.runs_by_key[key]
      if len(self.lrs) == 1:
        out[key] = sweep.Tuned(self.lrs[0], {})
        continue
      out[key] = sweep.tune_widening(
          lambda lr, s, tuner=tuner: self.config(tuner, lr, s), self.lrs, self.tune_seed,
          lambda lr, s, tuner=tuner: self.workdir(runs_dir, tuner, lr, s), self.full_lrs)
    return out

  def train(self, runs_dir: str, lrs: Dict[str, float], shard: tuple = (0, 1)
            ) -> Dict[str, list]:
    """Every run of this shard (runs index, index + count, ...) with every seed, at the rate
    of its tuning (lrs: Run.tuning key -> rate): run key -> summaries (a diverged run as
    {"diverged": message})."""
    index, count = shard
    out = {}
    for i, run in enumerate(self.runs):
      if i % count != index:
        continue
      lr = lrs[run.tuning]
      outcomes = sweep.run_group([self.config(run, lr, s) for s in self.seeds],
                                 [self.workdir(runs_dir, run, lr, s) for s in self.seeds])
      out[run.key] = [{"diverged": str(r)} if isinstance(r, training.TrainingError) else r
                      for r in outcomes]
      print(f"{self.name} {run.key}: personal mean " + sweep.mean_std(
          [r.get(metric(PERSONAL, "mean")) for r in out[run.key]]), flush=True)
    return out


# ---- statistics of the rows -----------------------------------------------------------------
def row_values(row: Row, runs: Dict[str, list], model: Optional[str] = None,
               stat: str = "mean") -> List[float]:
  """`stat` of the row's served model (or of `model`) over its finished seeds."""
  summaries = runs.get(row.run, [])
  key = metric(model or row.model, stat)
  return [float(r[key]) for r in summaries if "diverged" not in r and r.get(key) is not None]


def row_stats(rows: Sequence[Row], runs: Dict[str, list]) -> Dict[str, dict]:
  """label -> {stat: (seed mean, seed std)} for mean, p10, std, worst of the served model and
  the global model's mean; rows without finished runs are left out."""
  out = {}
  for row in rows:
    stats = {}
    for stat in ("mean", "p10", "std", "worst"):
      values = row_values(row, runs, stat=stat)
      if values:
        stats[stat] = (float(np.mean(values)), float(np.std(values)))
    values = row_values(row, runs, model=GLOBAL)
    if values:
      stats["global_mean"] = (float(np.mean(values)), float(np.std(values)))
    if stats:
      out[row.label] = stats
  return out


def _cell(stat) -> str:
  return "-" if stat is None else f"{stat[0]:.4f} ± {stat[1]:.4f}"


def table(rows: Sequence[Row], stats: Dict[str, dict], skipped: Dict[str, str]) -> str:
  """One line per row; rows skipped or without finished runs say so."""
  header = ["row", "personalized mean", "personalized p10", "global model mean",
            "worst client", "std over clients"]
  lines = []
  for row in rows:
    if row.label in skipped:
      lines.append([row.title, f"skipped: {skipped[row.label]}", "", "", "", ""])
      continue
    s = stats.get(row.label)
    if s is None:
      lines.append([row.title, "diverged or not run", "", "", "", ""])
      continue
    lines.append([row.title, _cell(s.get("mean")), _cell(s.get("p10")),
                  _cell(s.get("global_mean")), _cell(s.get("worst")), _cell(s.get("std"))])
  return sweep.markdown_table(header, lines)


# ---- the claims -----------------------------------------------------------------------------
def compare(better, worse, higher_is_better: bool = True) -> str:
  """'holds' when the seed means differ the claimed way by more than the larger seed std,
  'holds within the seeds' spread' when only the means do, 'does not hold' otherwise."""
  if better is None or worse is None:
    return "not measured"
  gap = (better[0] - worse[0]) * (1 if higher_is_better else -1)
  if gap > max(better[1], worse[1]):
    return "holds"
  if gap > 0:
    return "holds within the seeds' spread"
  return "does not hold"


def claims(stats: Dict[str, dict]) -> List[str]:
  """The papers' claims checked on one dataset's numbers (stats as row_stats gives them)."""
  get = lambda label, stat: stats.get(label, {}).get(stat)
  lines = []
  fedavg_p10, fedavg_std = get("fedavg", "p10"), get("fedavg", "std")
  if "ditto" in stats and "fedavg" in stats:
    p10 = compare(get("ditto", "p10"), fedavg_p10)
    spread = compare(get("ditto", "std"), fedavg_std, higher_is_better=False)
    verdict = ("holds" if p10 == spread == "holds" else
               "does not hold" if p10 == spread == "does not hold" else "partly holds")
    lines.append(
        f"Ditto's fairness (Li et al., ICML 2021: a higher 10th percentile and a lower spread "
        f"over clients than FedAvg): {verdict} (10th percentile {get('ditto', 'p10')[0]:.4f} "
        f"against {fedavg_p10[0]:.4f}: {p10}; std over clients {get('ditto', 'std')[0]:.4f} "
        f"against {fedavg_std[0]:.4f}: {spread}).")
  else:
    lines.append("Ditto's fairness (Li et al., ICML 2021): not measured (Ditto or FedAvg not "
                 "run).")
  def above(method: str, baseline: str, claim: str, why_not: str, extra: str = "") -> str:
    """The claim that `method`'s mean over clients is above `baseline`'s."""
    if method not in stats or baseline not in stats:
      return f"{claim}: not measured ({why_not} not run)."
    return (f"{claim}: {compare(get(method, 'mean'), get(baseline, 'mean'))} (mean over "
            f"clients {get(method, 'mean')[0]:.4f} against {get(baseline, 'mean')[0]:.4f}"
            f"{extra}).")

  lines.append(above(
      "fedrep", "fedavg", "FedRep above FedAvg (Collins et al., ICML 2021)", "FedRep or FedAvg",
      f"; FedAvg + fine-tuning {get('fedavg_ft', 'mean')[0]:.4f}" if "fedavg_ft" in stats
      else ""))
  lines.append(above(
      "fedbn", "fedavg_bn", "FedBN above FedAvg on the same model with BatchNorm (Li et al., "
      "ICLR 2021, shown there under feature shift; here the skew is the setting's)",
      "FedBN or its FedAvg baseline"))
  if "fedavg" in stats:
    above, below = [], []
    global_rows = {r.label for r in ROWS if r.model == GLOBAL}
    for label, s in stats.items():
      if label in global_rows:  # FedAvg's own rows serve the global model
        continue
      verdict = compare(s.get("mean"), get("fedavg", "mean"))
      (above if verdict == "holds" else below).append(
          f"{label} {s['mean'][0]:.4f}" + ("" if verdict in ("holds", "does not hold")
                                           else f" ({verdict})"))
    lines.append(
        f"Personalization above FedAvg's global model ({get('fedavg', 'mean')[0]:.4f} mean "
        "over clients): above by more than the seeds' spread: "
        + (", ".join(above) or "none") + "; not: " + (", ".join(below) or "none") + ".")
  return lines


# ---- the report -----------------------------------------------------------------------------
def plot(path: str, panels: Dict[str, tuple]) -> None:
  """One panel per dataset: per row, bars of the personalized mean and 10th percentile over
  clients (mean over seeds, std error bars). panels: dataset -> (rows, stats)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(6.5 * max(1, len(panels)), 4.5),
                           dpi=100, squeeze=False)
  for ax, (name, (rows, stats)) in zip(axes[0], panels.items()):
    shown = [r for r in rows if r.label in stats]
    x = np.arange(len(shown))
    for offset, stat, label in ((-0.2, "mean", "mean over clients"),
                                (0.2, "p10", "10th percentile")):
      values = [stats[r.label].get(stat, (np.nan, 0.0)) for r in shown]
      ax.bar(x + offset, [v[0] for v in values], 0.4, yerr=[v[1] for v in values],
             capsize=2, label=label)
    ax.set_xticks(x)
    ax.set_xticklabels([r.title for r in shown], rotation=40, ha="right", fontsize=7)
    ax.set_ylim(0, 1)
    ax.set_ylabel("per-client test accuracy")
    ax.set_title(DATASET_TITLES.get(name, name), fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


def setting_text(study: Study, lr: float, scores: dict, others: Optional[dict] = None) -> str:
  """The setting's paragraph; `others`: Run.tuning key -> (rate, scores) of the runs tuned
  apart (the model with BatchNorm)."""
  b = study.base
  apart = "".join(
      f" FedAvg and FedBN on the MLP with BatchNorm: local rate {rate:g} (FedAvg's on that "
      "model, picked on the validation split"
      + (": " + ", ".join(f"{k:g}: {v:.4f}" for k, v in sorted(sc.items())) if sc else "")
      + ")." for key, (rate, sc) in sorted((others or {}).items()))
  partition = (f"{b.partition}" + (f", {b.classes_per_client} classes per client"
                                   if b.partition in ("shards", "class_cyclic") else ""))
  return (f"Setting: {b.dataset}, partition {partition}, "
          f"{'every natural client' if b.partition == 'natural' else f'{b.num_clients} clients'}"
          f", model {b.model} {dict(b.model_options)}, {b.active_ratio:.0%} of the clients per "
          f"round, {b.local_steps} local steps of batch {b.batch_size}, {b.rounds} rounds, "
          f"validation split {b.validation_fraction:.0%} of the training data, local test "
          + ("parts: each writer's own LEAF test examples" if b.partition == "natural" else
             f"parts {b.local_test_fraction:.0%} of each client's data (stratified by label)")
          + f". Local rate {lr:g} for every other row (FedAvg's, picked on the validation split"
          + (": " + ", ".join(f"{k:g}: {v:.4f}" for k, v in sorted(scores.items()))
             if scores else ", a single rate given") + f"); fine-tuning "
          f"{study.finetune_steps} steps at rate {study.finetune_lr or lr:g} (and "
          f"{(study.finetune_lr or lr) / 10:g} in its second row)." + apart)


def write_report(studies: Dict[str, Study], results: Dict[str, dict], out: str, command: str,
                 elapsed: Optional[float] = None) -> str:
  """<out>.md, <out>.json, <out>.png; results: dataset -> {"lr", "scores", "runs"}."""
  first = next(iter(studies.values()))
  intro = (
      "Each client evaluated on its own local test part after the last round; each cell is "
      "the mean ± std over seeds " + ", ".join(map(str, first.seeds)) + " of a run's "
      "statistic over clients (unweighted). The personalized columns read each row's served "
      "model (FedAvg's global model in its own row), the global column each run's global "
      "model (the layer-partition methods' global model keeps its personal layers as "
      "initialised). Local training only is Ditto at λ = 0 (its personal models are the "
      "clients' own SGD from the initial model); pFedMe at λ = 1 / (2 lr); Per-FedAvg "
      "evaluated after the same fine-tuning as FedAvg + fine-tuning, its inner step α the "
      "fine-tuning rate.")

  def section(name, study, res, stats):
    return [f"### {DATASET_TITLES.get(name, name)}", "",
            setting_text(study, res["lr"], res["scores"], res.get("others")), "",
            table(study.rows, stats, study.skipped), "",
            *[f"- {line}" for line in claims(stats)], ""]

  return write_study_files(studies, results, out, command, elapsed,
                           "## Personalization: per-client accuracy", intro, section,
                           row_stats, "personalized accuracy per method")


def write_study_files(studies: Dict[str, Study], results: Dict[str, dict], out: str,
                      command: str, elapsed: Optional[float], heading: str, intro: str,
                      section: Callable, stats_of: Callable, figure: str,
                      panel_title: Callable[[str], str] = lambda name: name,
                      plot_fn: Optional[Callable] = None) -> str:
  """The report files of a study of served models: <out>.md (heading, intro, command,
  machine, section(name, study, results[name], stats) per study, the figure), <out>.png
  (plot_fn(path, panels), default `plot`, a panel per study) and <out>.json (every run's
  summary without its records, the tuning scores, the rows' statistics as
  stats_of(rows, runs) gives them, and results[name]["notes"] where a study has them)."""
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  panels, sections, stats = {}, [], {}
  for name, study in studies.items():
    stats[name] = stats_of(study.rows, results[name]["runs"])
    panels[panel_title(name)] = (study.rows, stats[name])
    sections += section(name, study, results[name], stats[name])
  (plot_fn or plot)(out + ".png", panels)
  wall = sum(r.get("wall_seconds", 0) / r.get("vectorized_runs", 1)
             for res in results.values() for runs in res["runs"].values() for r in runs)
  text = "\n".join([
      heading, "", intro, "",
      f"Command: `{command}`", "",
      f"Machine: {sweep.machine()}. Time of the reported runs: {wall / 60:.1f} min"
      + (f"; this invocation took {elapsed / 60:.1f} min (finished runs reused)."
         if elapsed is not None else "."), "",
      *sections,
      f"![{figure}]({os.path.basename(out + '.png')})", ""])
  with open(out + ".md", "w") as f:
    f.write(text)
  slim = lambda runs: [{k: v for k, v in r.items() if k != "records"} for r in runs]
  with open(out + ".json", "w") as f:
    json.dump({name: {"lr": res["lr"],
                      "scores": {f"{k:g}": v for k, v in res["scores"].items()},
                      "tuned_apart": {key: {"lr": rate,
                                            "scores": {f"{k:g}": v for k, v in sc.items()}}
                                      for key, (rate, sc) in res.get("others", {}).items()},
                      "seeds": studies[name].seeds, "skipped": studies[name].skipped,
                      "rows": {r.label: {"run": r.run, "model": r.model}
                               for r in studies[name].rows},
                      "stats": stats[name], "notes": res.get("notes", {}),
                      "runs": {k: slim(v) for k, v in res["runs"].items()}}
               for name, res in results.items()}, f, indent=1, default=str)
  return text


# --quick: the whole pipeline on the built-in digits data (label skew, every row).
QUICK = {"dataset": "digits", "model": "mlp", "partition": "shards", "classes_per_client": 2,
         "num_clients": 8, "active_ratio": 1.0, "rounds": 2, "local_steps": 2,
         "batch_size": 8, "eval_every": 1, "checkpoint_every": 2, "eval_batch_size": 500,
         "validation_fraction": 0.2, "local_test_fraction": 0.2, "per_client_eval": "final",
         "plots": False}
QUICK_SEEDS, QUICK_LRS = (0, 1), (0.1,)


def quick_config():
  from fedjax_lama.config import base_config  # pylint: disable=g-import-not-at-top
  c = sweep.configured(base_config(), QUICK)
  c.model_options.hidden_sizes = (16,)
  return c


def dataset_config(name: str, data_dir: str, rounds: int):
  module = DATASETS.get(name)
  if module is None:
    raise ConfigError(f"--datasets: {name!r} is not accepted; accepted: "
                      f"{', '.join(DATASETS)}")
  c = importlib.import_module(module).get_config()
  if data_dir:
    c.data_dir = data_dir
  if rounds:
    c.rounds = rounds
  return c


def main(argv) -> None:
  del argv
  from fedjax_lama.cli import logs  # pylint: disable=g-import-not-at-top
  logs.progress_only()
  rows = select_rows(FLAGS.methods)
  if FLAGS.quick:
    bases = {"digits": quick_config()}
  else:
    bases = {n: dataset_config(n, FLAGS.data_dir, FLAGS.rounds) for n in FLAGS.datasets}
  seeds, lrs, grid, runs_dir = seeds_rates_and_runs(FLAGS, QUICK_SEEDS, QUICK_LRS, FULL_LRS)
  studies = {n: Study(n, b, rows, seeds, lrs, FLAGS.tune_seed, FLAGS.finetune_steps,
                      FLAGS.finetune_lr or None, full_lrs=grid)
             for n, b in bases.items()}
  start = time.perf_counter()
  results = run_studies(studies, runs_dir, "experiments.personal_study", FLAGS.shard,
                        FLAGS.processes)
  if results is not None:
    print(write_report(studies, results, FLAGS.out, command_line("experiments.personal_study"),
                       time.perf_counter() - start))


def run_studies(studies: Dict[str, Study], runs_dir: str, module: str, shard: str = "",
                processes: int = 1) -> Optional[Dict[str, dict]]:
  """Every study's rates picked on validation, then its runs trained: name -> {"lr",
  "scores" (FedAvg's on the study's model), "others" (Run.tuning key -> (rate, scores) of the
  runs tuned apart), "runs"}. shard "I/N": only that shard's runs, and None; processes > 1:
  the runs first trained in that many processes of `module` (each a shard)."""
  tuned = {}
  for name, study in studies.items():
    tuned[name] = study.tune(runs_dir)
    for key, t in tuned[name].items():
      print(f"{name}: local rate {t.value:g} ({key}) {t.scores}", flush=True)
    for label, why in study.skipped.items():
      print(f"{name}: {label} skipped ({why})", flush=True)
  rates = {name: {k: t.value for k, t in tuned[name].items()} for name in studies}
  if shard:
    for name, study in studies.items():
      study.train(runs_dir, rates[name], robust_study.parse_shard(shard))
    return None
  if processes > 1:
    robust_study.run_shards(processes, sys.argv[1:], module=module, runs_dir=runs_dir)
  return {name: {"lr": tuned[name]["fedavg"].value, "scores": tuned[name]["fedavg"].scores,
                 "others": {k: (t.value, t.scores) for k, t in tuned[name].items()
                            if k != "fedavg"},
                 "runs": study.train(runs_dir, rates[name])}
          for name, study in studies.items()}


# Flags naming this machine's directories, written as placeholders in a report's command.
_PLACEHOLDERS = {"--data_dir": "DATA", "--runs_dir": "RUNS", "--pretrained": "PRETRAINED"}


def command_line(module: str) -> str:
  """This command as run, the data directory written DATA, the runs directory RUNS and a
  pretraining's workdir PRETRAINED (where they live is the machine's, not the study's)."""
  def shown(arg):
    name, eq, _ = arg.partition("=")
    return f"{name}={_PLACEHOLDERS[name]}" if eq and name in _PLACEHOLDERS else arg
  return " ".join([f"python -m {module}"] + [shown(a) for a in sys.argv[1:]])


def seeds_rates_and_runs(flag_values, quick_seeds, quick_lrs, full_lrs) -> tuple:
  """(seeds, rates, the grid the tuning widens into, runs directory) of a study of served
  models from its flags (`define_flags`): --quick's own seeds and rates, which are also its
  whole grid, else --seeds, --lrs and `full_lrs`; --runs_dir, else <out>_runs."""
  if flag_values.quick:
    seeds, lrs, grid = list(quick_seeds), list(quick_lrs), list(quick_lrs)
  else:
    seeds, lrs = [int(s) for s in flag_values.seeds], [float(x) for x in flag_values.lrs]
    grid = list(full_lrs)
  return seeds, lrs, grid, flag_values.runs_dir or flag_values.out + "_runs"


def grid_text(full_lrs: Sequence[float]) -> str:
  """The span of a rate grid for a flag's help: "0.03 ... 10"."""
  return f"{min(full_lrs):g} ... {max(full_lrs):g}"


def define_flags(flags, out: str, lrs: Sequence[str], lrs_help: str, quick_help: str) -> None:
  """The flags every study of served models shares (this one, experiments/text_study.py)."""
  flags.DEFINE_string("data_dir", "", "Data directory (default: the configs' own).")
  flags.DEFINE_string("runs_dir", None, "Directory of the runs' workdirs (default <out>_runs).")
  flags.DEFINE_string("out", out, "Report prefix: <out>.md, <out>.json, <out>.png.")
  flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds of every row.")
  flags.DEFINE_list("lrs", list(lrs), lrs_help)
  flags.DEFINE_integer("tune_seed", 0, "Seed of the tuning runs (reused as a final run).")
  flags.DEFINE_integer("rounds", 0, "Rounds of every run (0: the configs').")
  flags.DEFINE_integer("finetune_steps", 5, "k: local SGD steps of the fine-tuned rows before "
                       "the per-client evaluation.")
  flags.DEFINE_float("finetune_lr", 0.0, "Fine-tuning rate (0: the tuned local rate).")
  flags.DEFINE_boolean("quick", False, quick_help)
  flags.DEFINE_string("shard", "", "I/N: train only runs I, I + N, ... and write no report.")
  flags.DEFINE_integer("processes", 1, "After tuning, train the runs in this many processes at "
                       "once (--shard each), then report.")


if __name__ == "__main__":
  from absl import app, flags  # pylint: disable=g-import-not-at-top

  FLAGS = flags.FLAGS
  define_flags(flags, "experiments/results/personal", ["0.03", "0.1", "0.3"],
               f"FedAvg's local-rate grid (widened into {grid_text(FULL_LRS)} at an edge); one "
               "rate is used as given.",
               "A smoke run: digits over 8 two-class clients, 2 rounds, seeds 0 and 1, rate "
               "0.1, every row (overrides --datasets, --seeds, --lrs).")
  flags.DEFINE_list("datasets", list(DATASETS), "Datasets: " + ", ".join(DATASETS) + ".")
  flags.DEFINE_list("methods", [], "Rows (default all): " + ", ".join(ROW_LABELS) + ".")
  app.run(main)
