r"""LoRA on Shakespeare by role: the transformer pretrained on Milton, then federated (issue 62).

  python -m experiments.lora_study --data_dir=DATA --out=experiments/results/lora
  python -m experiments.lora_study --quick --data_dir=DATA --runs_dir=/tmp/lq --out=/tmp/lq/r

Setting: the text study's transformer (configs/text_study.py:transformer: width 64, 2 blocks
of 4 heads, 21 speaking roles, every role in every round, 5 local steps of batch 10 windows
of 80 characters, 30 rounds, each role's own last windows its local test part, 10 % of the
training windows for validation), every run started from one central pretraining on the
Milton texts (configs/pretrain_milton.py, experiments/pretrain.py: 3,000 steps, written to
<runs_dir>/pretrain and reused when there, or --pretrained=WORKDIR). LoRA (Hu et al., ICLR
2022) adapts the attention projections and both MLP layers of every block (TARGETS), alpha 8
at every rank (the scale alpha / r, as Hu et al. keep alpha fixed).

Rows (ROWS):
  * the pretrained base with no federation: the checkpoint evaluated on the roles' test
    windows (no training, nothing sent);
  * local-only LoRA, r = 4: FedPer with every block's adapters personal and nothing else
    trainable, so each role trains its own adapters from B = 0 over the shared base and
    nothing is averaged or sent (the algorithm's own partition, no special case);
  * FedAvg with full fine-tuning (McMahan et al., AISTATS 2017): every parameter trains and
    travels;
  * FedAvg-LoRA at r = 4 and r = 16: A and B trained and averaged separately;
  * FFA-LoRA (Sun, Li, Li, Ding, ICLR 2024) at r = 16: A frozen at its initialization, B
    trained and averaged (half of FedAvg-LoRA's uplink at the same r, as A and B have equal
    sizes over these targets);
  * personal LoRA, r = 4: LG-FedAvg (Liang et al., 2020) over the trainable set "lora,Dense_0":
    every block's adapters personal (each role's own, in the client store), the output layer
    shared and averaged;
  * DP FFA-LoRA at epsilon 8 (DP-FedAvg, McMahan, Ramage, Talwar, Zhang, ICLR 2018, on FFA-LoRA's
    B, as Sun et al. pair them): sigma calibrated by the project's RDP accountant for the
    study's cohort (every role, every round) and rounds. The row trains only when the noise
    norm on the averaged update, sigma C sqrt(d) / cohort over the d = B's floats, is at most
    USEFUL_NOISE_NORM times the clip C (docs/guide.md, "The population an epsilon needs");
    otherwise the report says what cohort the same sigma needs. With 21 roles it does not
    train.
Learning rate: FedAvg's local rate picked on the validation split (mean validation accuracy
of the last 3 evaluations, seed --tune_seed) from --lrs, widened into the text study's grid
while the pick sits at an edge, once for full fine-tuning and once for FedAvg-LoRA at r = 4;
every adapter row takes the latter.

Columns (mean ± std over seeds): the run's total uplink bytes (every client, every round;
the bits the ledger counts / 8) and its ratio to full fine-tuning's, the served model's
accuracy on the pooled test windows of the roles (the example-weighted mean over roles: the
global model's, or each role's own under the personal rows), its mean over roles, 10th
percentile and worst role. The figure puts both accuracies against the uplink bytes, one point
per row (0 bytes on the left of a symlog axis).

Writes <out>.md, <out>.json, <out>.png. Runs live under --runs_dir (a workdir per run, the base
evaluation in <runs_dir>/transformer/base/summary.json), reused or resumed; a second call
trains nothing. The adapter rows' seeds train one after another (each seed has its own
adapters' initialization; fedjax_lama/run/many.py).

Runs of the default study: the pretraining, FedAvg at 3 rates twice (full and LoRA r = 4) on
seed 0 to tune (a pick at an edge adds one), then 6 rows x 3 seeds (the tuning runs reused):
22 runs in 8 groups. On this 2-core CPU with --processes=2 (two rows at once after the
tuning): 43 min wall, the pretraining 4.9 min of it (docs/results.md).
"""
import json
import math
import os
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from experiments import dp_guide
from experiments import personal_study as ps
from experiments import pretrain as pretrain_cli
from experiments import sweep
from experiments import text_study
from experiments.personal_study import GLOBAL, PERSONAL, Row, Run
from fedjax_lama import metrics
from fedjax_lama.errors import ConfigError

NAME = "transformer"
TARGETS = "*/attention/*,*/mlp_*"
FFA_RANK = 16
PERSONAL_RANK = 4
EPSILON = 8.0
# The DP row trains when the noise norm on the averaged update is at most this many clips C:
# at more, every round's noise exceeds any averaged update (docs/guide.md).
USEFUL_NOISE_NORM = 1.0
DP_CLIP = 0.1

ROWS = (
    Row("base", "pretrained base, no federation", "base", GLOBAL),
    Row("local", f"local-only LoRA, r = {PERSONAL_RANK}", "local", PERSONAL),
    Row("full", "FedAvg, full fine-tuning", "fedavg", GLOBAL),
    Row("lora4", "FedAvg-LoRA, r = 4", "lora4", GLOBAL),
    Row("lora16", "FedAvg-LoRA, r = 16", "lora16", GLOBAL),
    Row("ffa", f"FFA-LoRA, r = {FFA_RANK}", "ffa", GLOBAL),
    Row("personal", f"personal LoRA, r = {PERSONAL_RANK} (output layer shared)", "personal",
        PERSONAL),
    Row("dp_ffa", f"DP FFA-LoRA, r = {FFA_RANK}, ε = {EPSILON:g}", "dp_ffa", GLOBAL),
)
ROW_LABELS = tuple(r.label for r in ROWS)


def adapters(rank: int) -> dict:
  return {"rank": rank, "targets": TARGETS}


def dp_fields(clients: int, clip: float) -> dict:
  """DP-FedAvg at EPSILON over `clients` roles: uniform weights, the population the
  accountant counts equal to the partition's roles."""
  return {"weighting": "uniform", "num_clients": clients, "privacy.enabled": True,
          "privacy.target_epsilon": EPSILON, "privacy.clip_norm": clip}


def runs_for(base, clients: int, dp_clip: float = DP_CLIP) -> Dict[str, Run]:
  """The study's runs on `base` (run key -> Run); "fedavg" (full fine-tuning) and "lora4"
  are tuned, every adapter run takes "lora4"'s rate."""
  blocks = ",".join(f"block_{i}" for i in range(base.model_options.depth))

  def lora(rank, **fields):
    return lambda lr: {"model_options.lora": adapters(rank), **fields}

  runs = (Run("fedavg", "fedavg"),
          Run("lora4", "fedavg", lora(4), tuning="lora4"),
          Run("lora16", "fedavg", lora(16), tuning="lora4"),
          Run("ffa", "fedavg", lora(FFA_RANK, trainable="lora_b"), tuning="lora4"),
          Run("local", "fedper", lora(PERSONAL_RANK, trainable="lora",
                                      **{"fedper.personal_layers": blocks}), tuning="lora4"),
          Run("personal", "lg_fedavg", lora(PERSONAL_RANK, trainable="lora,Dense_0"),
              tuning="lora4"),
          Run("dp_ffa", "fedavg", lora(FFA_RANK, trainable="lora_b",
                                       **dp_fields(clients, dp_clip)), tuning="lora4"))
  return {r.key: r for r in runs}


def select_rows(labels: Sequence[str]) -> List[Row]:
  """--methods as rows (empty: all), in ROWS order; an unknown label stops with the list."""
  return ps.select_rows(labels, ROWS)


# ---- the settings ---------------------------------------------------------------------------
# --quick: a few roles, the text study's quick transformer (width 16, one block), pretrained
# for 20 steps.
QUICK_PRETRAIN = {"rounds": 2, "local_steps": 10, "batch_size": 8, "eval_every": 2,
                  "checkpoint_every": 2}


def study_config(data_dir: str = "", rounds: int = 0, quick: bool = False):
  """The text study's transformer setting (its --quick one with quick)."""
  return text_study.model_config(NAME, data_dir, rounds, quick)


def pretrain_config(data_dir: str = "", quick: bool = False):
  """configs/pretrain_milton.py on the study's transformer (its --quick size with quick)."""
  from configs import pretrain_milton  # pylint: disable=g-import-not-at-top
  c = pretrain_milton.get_config()
  if data_dir:
    c.data_dir = data_dir
  if quick:
    c = sweep.configured(c, QUICK_PRETRAIN)
    c.model_options.update(text_study.QUICK_MODELS[NAME])
  return c


def pretrain(config, workdir: str) -> dict:
  """The central pretraining of `config` in `workdir`: trained, resumed or reused."""
  pretrain_cli.check_central(config)
  return sweep.run(config, workdir)


def setting_facts(config) -> dict:
  """{"clients": the roles the partition makes, "ffa_size": the floats of FFA-LoRA's
  trainable set (B at FFA_RANK)} of `config` (its data read, no training)."""
  from fedjax_lama.models import lora  # pylint: disable=g-import-not-at-top
  from fedjax_lama.run import parts as parts_lib, spec as spec_lib  # pylint: disable=g-import-not-at-top
  c = sweep.configured(config, {"model_options.lora": adapters(FFA_RANK)})
  parts = parts_lib.prepare(spec_lib.build_spec(c))
  return {"clients": int(parts.fed.num_clients),
          "ffa_size": int(lora.trainable_set(parts.params, "lora_b").size)}


# ---- DP at epsilon 8: does the role count allow a useful noise level? -----------------------
def dp_plan(config, clients: int, size: int, clip: float = DP_CLIP,
            epsilon: float = EPSILON) -> dict:
  """sigma for `epsilon` over config.rounds rounds of `config`'s cohorts of `clients`, the noise
  it puts on the averaged update of `size` floats, whether that is useful, and the expected
  cohort that brings the noise norm to USEFUL_NOISE_NORM C at the same sigma."""
  from fedjax_lama.privacy import dp_options  # pylint: disable=g-import-not-at-top
  c = sweep.configured(config, dp_fields(clients, clip))
  options = dp_guide.calibrated_options(c, clients, epsilon)
  cohort = float(options.sampling.expected_cohort)
  std = dp_options.noise_std_on_mean(options)
  norm = std * math.sqrt(size) / options.clip_norm
  return {"epsilon": epsilon, "delta": c.privacy.delta, "rounds": c.rounds, "clients": clients,
          "cohort": cohort, "sigma": options.noise_multiplier, "size": size,
          "clip": options.clip_norm, "noise_std": std, "noise_norm_over_clip": norm,
          "useful": norm <= USEFUL_NOISE_NORM,
          "cohort_needed": math.ceil(cohort * norm / USEFUL_NOISE_NORM),
          "accountant": c.privacy.accountant}


def dp_text(plan: dict) -> str:
  """The DP row's verdict, and what it needs when the noise is not useful."""
  return (f"DP FFA-LoRA at ε = {plan['epsilon']:g} (δ = {plan['delta']:g}, "
          f"{plan['accountant'].upper()} accountant, {plan['rounds']} rounds, an expected "
          f"cohort of {plan['cohort']:g} of {plan['clients']} roles): σ = {plan['sigma']:.3g}, "
          f"a noise std σ C / cohort = {plan['noise_std'] / plan['clip']:.3g} C on every "
          f"coordinate of the averaged update, over B's {plan['size']:,} floats a norm of "
          f"about {plan['noise_norm_over_clip']:.3g} C, against at most C for the mean of the "
          "clipped updates: "
          + ("useful, the row trains." if plan["useful"] else
             f"not useful (at most {USEFUL_NOISE_NORM:g} C), every round's noise exceeds any "
             "averaged update, so the row is not run. At the same σ the noise norm falls to "
             f"{USEFUL_NOISE_NORM:g} C with an expected cohort of {plan['cohort_needed']:,} "
             "clients per round (σ depends on ε and the rounds only while every client takes "
             "part in every round); sampling a cohort out of a larger population lowers σ "
             "too."))


# ---- the pretrained base, evaluated ----------------------------------------------------------
def read_summary(workdir: str) -> dict:
  """The summary.json of a finished run's workdir; one line when there is none."""
  path = os.path.join(workdir, "summary.json")
  if not os.path.exists(path):
    raise ConfigError(f"--pretrained={workdir}: no finished run there ({path} is missing); "
                      "accepted: the workdir of a finished experiments.pretrain run")
  with open(path) as f:
    return json.load(f)


def evaluate_base(config, workdir: str) -> dict:
  """The base row's summary: `config`'s initial model (its config.init_from checkpoint)
  evaluated on the test windows, pooled and per role, as a run's last evaluation reads them;
  nothing trained or sent. Written to <workdir>/summary.json and read from there again."""
  path = os.path.join(workdir, "summary.json")
  if os.path.exists(path):
    return read_summary(workdir)
  from fedjax_lama.engine import evaluate as evaluation  # pylint: disable=g-import-not-at-top
  from fedjax_lama.run import parts as parts_lib, records  # pylint: disable=g-import-not-at-top
  from fedjax_lama.run import spec as spec_lib  # pylint: disable=g-import-not-at-top
  started = time.perf_counter()
  spec = spec_lib.build_spec(config)
  parts = parts_lib.prepare(spec)
  program = parts_lib.program(spec, parts)
  params, model_state = program.eval_params(program.init_state())
  ds = parts.fed.dataset
  res = evaluation.evaluate(program.eval_fn, params, model_state, ds.test_x, ds.test_y,
                            config.eval_batch_size)
  evaluator = records.make_personal_evaluator(None, program, parts.fed, config.eval_batch_size)
  summary = {"init_from": config.init_from, "final_test_accuracy": res.accuracy,
             "final_test_loss": res.loss, "rounds": 0, "comm_floats_up": 0, "comm_bits_up": 0,
             **records.client_test_record(evaluator(params, model_state, None, 0,
                                                    personal=False)),
             "wall_seconds": time.perf_counter() - started}
  os.makedirs(workdir, exist_ok=True)
  metrics.write_json(path, summary)
  return summary


# ---- statistics, table, readings ------------------------------------------------------------
def _seed_stat(values) -> Optional[tuple]:
  values = [float(v) for v in values if v is not None]
  return (float(np.mean(values)), float(np.std(values))) if values else None


def row_stats(rows: Sequence[Row], runs: Dict[str, list]) -> Dict[str, dict]:
  """personal_study.row_stats (the served model per role) plus "pooled" (the served model on
  the pooled test windows: its example-weighted mean over roles) and "uplink_bytes" (the
  run's total uplink, mean over seeds)."""
  stats = ps.row_stats(rows, runs)
  for row in rows:
    if row.label in stats:
      finished = [r for r in runs.get(row.run, []) if "diverged" not in r]
      stats[row.label]["pooled"] = _seed_stat(ps.row_values(row, runs, stat="weighted_mean"))
      stats[row.label]["uplink_bytes"] = float(np.mean([r["comm_bits_up"] / 8
                                                        for r in finished]))
  return stats


def table(rows: Sequence[Row], stats: Dict[str, dict], skipped: Dict[str, str]) -> str:
  header = ["row", "uplink bytes", "uplink / full fine-tuning's",
            "test accuracy, pooled (served model)", "mean over roles", "10th percentile",
            "worst role"]
  full = stats.get("full", {}).get("uplink_bytes")
  lines = []
  for row in rows:
    s = stats.get(row.label)
    if row.label in skipped or s is None:
      lines.append([row.title, f"skipped: {skipped[row.label]}" if row.label in skipped
                    else "diverged or not run"] + [""] * 5)
      continue
    lines.append([row.title, f"{s['uplink_bytes']:,.0f}",
                  f"{s['uplink_bytes'] / full:.4f}" if full else "-", ps._cell(s.get("pooled")),  # pylint: disable=protected-access
                  ps._cell(s.get("mean")), ps._cell(s.get("p10")), ps._cell(s.get("worst"))])  # pylint: disable=protected-access
  return sweep.markdown_table(header, lines)


def readings(stats: Dict[str, dict]) -> List[str]:
  """Each row against the pretrained base and the LoRA rows against full fine-tuning (pooled
  accuracy of the served model; "holds" beyond the seeds' spread, personal_study.compare)."""
  get = lambda label, stat: stats.get(label, {}).get(stat)
  lines = []
  for label, against, what in (
      ("full", "base", "FedAvg with full fine-tuning above the pretrained base"),
      ("lora4", "base", "FedAvg-LoRA (r = 4) above the pretrained base"),
      ("lora4", "full", "FedAvg-LoRA (r = 4) above full fine-tuning"),
      ("lora16", "lora4", "FedAvg-LoRA r = 16 above r = 4"),
      ("ffa", "lora16", f"FFA-LoRA above FedAvg-LoRA at r = {FFA_RANK}"),
      ("personal", "local", "personal LoRA above local-only LoRA"),
      ("personal", "lora4", "personal LoRA above FedAvg-LoRA (r = 4)")):
    a, b = get(label, "pooled"), get(against, "pooled")
    if a is None or b is None:
      lines.append(f"{what}: not measured.")
      continue
    ratio = (f"; uplink {get(label, 'uplink_bytes') / get(against, 'uplink_bytes'):.3g} x"
             if get(against, "uplink_bytes") else "")
    lines.append(f"{what}: {ps.compare(a, b)} (pooled test accuracy {a[0]:.4f} against "
                 f"{b[0]:.4f}{ratio}).")
  return lines


def plot(path: str, panels: Dict[str, tuple]) -> None:
  """Accuracy against uplink bytes, one point per row (pooled and mean over roles, std error
  bars over seeds), on a symlog axis that keeps the rows sending nothing at 0."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(7.5 * max(1, len(panels)), 5),
                           dpi=100, squeeze=False)
  for ax, (name, (rows, stats)) in zip(axes[0], panels.items()):
    shown = [r for r in rows if r.label in stats and stats[r.label].get("pooled")]
    sent = [stats[r.label]["uplink_bytes"] for r in shown if stats[r.label]["uplink_bytes"] > 0]
    for stat, marker, label in (("pooled", "o", "pooled test windows"),
                                ("mean", "s", "mean over roles")):
      xs = [stats[r.label]["uplink_bytes"] for r in shown]
      ys = [stats[r.label][stat] for r in shown]
      ax.errorbar(xs, [y[0] for y in ys], yerr=[y[1] for y in ys], fmt=marker, capsize=2,
                  label=label, mfc="none" if stat == "mean" else None)
    for i, r in enumerate(shown):  # staggered, so that rows at one point stay legible
      ax.annotate(r.title, (stats[r.label]["uplink_bytes"], stats[r.label]["pooled"][0]),
                  textcoords="offset points", xytext=(4, 4 - 9 * (i % 3)), fontsize=7)
    ax.set_xscale("symlog", linthresh=min(sent) if sent else 1.0)
    ax.set_xlabel("uplink bytes of the run (every role, every round)")
    ax.set_ylabel("next-character test accuracy (served model)")
    ax.set_title(name, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


# ---- the report -------------------------------------------------------------------------------
def setting_text(study: ps.Study, res: dict) -> str:
  b = study.base
  o = b.dataset_options
  notes = res.get("notes", {})
  pre = notes.get("pretrain", {})
  rates = ", ".join(f"{k:g}: {v:.4f}" for k, v in sorted(res["scores"].items()))
  lora_rate, lora_scores = res.get("others", {}).get("lora4", (None, {}))
  return (
      f"Setting: {b.dataset} (split {o.split}, --sf {o.fraction}, roles of {o.min_samples} to "
      f"{o.max_samples} samples, stride {o.stride}; {notes.get('clients', '?')} roles), model "
      f"{b.model} {dict(b.model_options)}, every role in every round, {b.local_steps} local "
      f"steps of batch {b.batch_size}, {b.rounds} rounds. Pretrained on Milton: test "
      f"accuracy {pre.get('final_test_accuracy', float('nan')):.4f}, "
      f"{pre.get('final_test_bits_per_token', float('nan')):.3f} bits per character after "
      f"{pre.get('local_steps', '?')} steps ({pre.get('rounds', '?')} rounds). LoRA on "
      f"{TARGETS}, alpha 8. Local rate of full fine-tuning {res['lr']:g}"
      + (f" (validation: {rates})" if rates else " (given)")
      + (f"; of every adapter row {lora_rate:g}" if lora_rate is not None else "")
      + (" (FedAvg-LoRA r = 4's validation: " + ", ".join(
          f"{k:g}: {v:.4f}" for k, v in sorted(lora_scores.items())) + ")"
         if lora_scores else "") + ".")


def write_report(study: ps.Study, res: dict, out: str, command: str,
                 elapsed: Optional[float] = None) -> str:
  """<out>.md, <out>.json, <out>.png of the study's results (run_study's)."""
  intro = (
      "The text study's transformer pretrained on the Milton texts, then fine-tuned over the "
      "speaking roles: full fine-tuning, LoRA adapters averaged (FedAvg-LoRA), B alone "
      "(FFA-LoRA), kept per role (local-only, personal), each role evaluated on its own test "
      "windows after the last round; each cell is the mean ± std over seeds "
      + ", ".join(map(str, study.seeds)) + " (the base row is one evaluation). Accuracy is "
      "next-character accuracy over all positions of a window; uplink counts what the "
      "clients send (the trainable set, less the personal layers), 32 bits a float.")

  def section(name, study, res, stats):
    return [f"### {name}", "", setting_text(study, res), "",
            table(study.rows, stats, study.skipped), "",
            *[f"- {line}" for line in readings(stats)],
            f"- {dp_text(res['notes']['dp'])}" if "dp" in res.get("notes", {}) else "", ""]

  return ps.write_study_files({NAME: study}, {NAME: res}, out, command, elapsed,
                              "## LoRA on Shakespeare roles", intro, section, row_stats,
                              "accuracy against uplink bytes", plot_fn=plot)


# ---- the pipeline -----------------------------------------------------------------------------
def run_study(base, pretraining, runs_dir: str, rows: Sequence[Row], seeds, lrs,
              tune_seed: int = 0, full_lrs: Sequence[float] = text_study.FULL_LRS,
              pretrained: str = "", dp_clip: float = DP_CLIP, shard: str = "",
              processes: int = 1):
  """(study, results) of the whole pipeline: the pretraining (`pretraining` in
  <runs_dir>/pretrain, or the workdir `pretrained`), the DP plan, the tuning and the runs,
  the base's evaluation. Every step is reused when done; results is None under a shard."""
  workdir = os.path.abspath(pretrained or os.path.join(runs_dir, "pretrain"))
  pre = read_summary(workdir) if pretrained else pretrain(pretraining, workdir)
  base = sweep.configured(base, init_from=workdir)
  facts = setting_facts(base)
  plan = dp_plan(base, facts["clients"], facts["ffa_size"], dp_clip)
  runs_by_key = runs_for(base, facts["clients"], dp_clip)
  labels = {r.label for r in rows}
  trained = [r for r in rows if r.label != "base" and (r.label != "dp_ffa" or plan["useful"])]
  study = ps.Study(NAME, base, trained, seeds, lrs, tune_seed, 0, None, full_lrs=full_lrs,
                   runs_by_key=runs_by_key)
  study.rows = list(rows)  # the report's rows: the base and a DP row that does not train too
  if "dp_ffa" in labels and not plan["useful"]:
    study.skipped["dp_ffa"] = (f"the noise norm on the averaged update is "
                               f"{plan['noise_norm_over_clip']:.3g} C at ε = {EPSILON:g}; it "
                               f"needs an expected cohort of {plan['cohort_needed']:,}")
  results = ps.run_studies({NAME: study}, runs_dir, "experiments.lora_study", shard, processes)
  if results is None:
    return study, None
  res = results[NAME]
  if "base" in labels:
    res["runs"]["base"] = [evaluate_base(study.config(runs_by_key["fedavg"], res["lr"],
                                                      seeds[0]),
                                         os.path.join(runs_dir, NAME, "base"))]
  res["notes"] = {"dp": plan, "clients": facts["clients"], "pretrained": workdir,
                  "pretrain": {k: pre.get(k) for k in (
                      "final_test_accuracy", "final_test_loss", "final_test_bits_per_token",
                      "rounds", "local_steps", "wall_seconds")}}
  return study, res


QUICK_SEEDS, QUICK_LRS = (0,), (1.0,)


def main(argv) -> None:
  del argv
  from fedjax_lama.cli import logs  # pylint: disable=g-import-not-at-top
  logs.progress_only()
  rows = select_rows(FLAGS.methods)
  seeds, lrs, grid, runs_dir = ps.seeds_rates_and_runs(FLAGS, QUICK_SEEDS, QUICK_LRS,
                                                       text_study.FULL_LRS)
  start = time.perf_counter()
  study, res = run_study(study_config(FLAGS.data_dir, FLAGS.rounds, FLAGS.quick),
                         pretrain_config(FLAGS.data_dir, FLAGS.quick), runs_dir, rows, seeds,
                         lrs, FLAGS.tune_seed, grid, FLAGS.pretrained, FLAGS.dp_clip,
                         FLAGS.shard, FLAGS.processes)
  if res is not None:
    print(write_report(study, res, FLAGS.out, ps.command_line("experiments.lora_study"),
                       time.perf_counter() - start))


if __name__ == "__main__":
  from absl import app, flags  # pylint: disable=g-import-not-at-top

  FLAGS = flags.FLAGS
  ps.define_flags(flags, "experiments/results/lora", ["0.3", "1.0", "3.0"],
                  "FedAvg's local-rate grid, tuned for full fine-tuning and for LoRA r = 4 "
                  f"(widened into {ps.grid_text(text_study.FULL_LRS)} at an edge); one rate is "
                  "used as given.",
                  "A smoke run: a few roles, the quick transformer pretrained 20 steps, 2 "
                  "rounds, seed 0, rate 1.0 (overrides --seeds, --lrs).")
  flags.DEFINE_list("methods", [], "Rows (default all): " + ", ".join(ROW_LABELS) + ".")
  flags.DEFINE_string("pretrained", "", "A finished pretraining workdir to start from "
                      "(default: pretrain into <runs_dir>/pretrain, reused when there).")
  flags.DEFINE_float("dp_clip", DP_CLIP, "The DP row's clip C (not tuned).")
  app.run(main)
