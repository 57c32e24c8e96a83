r"""The algorithms side by side at one local-step budget, each at its own tuned learning rate.

  python -m experiments.compare_algorithms --config=configs/baselines_fmnist_cnn.py \
      --config.data_dir=../shared/data --out=experiments/results/baselines_fmnist \
      --runs=/tmp/baselines_fmnist_runs

For every algorithm: the local learning rate is picked from --lrs by its validation accuracy
(the mean of its last 3 evaluations on the split held out of the training data,
config.validation_fraction; never the test set) with seed --tune_seed, then the chosen rate
runs with every seed of --seeds. The report gives final and best test accuracy (mean ± std
over seeds), floats sent up and down per participating client and round (in units of the
model size d), the wall time, and every validation score of the tuning. --server_lrs adds
the sensitivity of the algorithms named in --server_lr_algorithms to their server rate (at
their tuned local rate, every seed). Runs live in --out/runs and are reused or resumed, so an
interrupted sweep continues where it stopped (--runs, default <out>_runs). Writes <out>.md,
<out>.json and <out>.png.
"""
import json
import os

from absl import app, flags
from ml_collections import config_flags
import numpy as np

from experiments import logs, sweep

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "configs/baselines_fmnist_cnn.py", "Base config.")
flags.DEFINE_list("algorithms", ["fedavg", "fedprox", "scaffold", "fednova", "fedavgm",
                                 "fedadam", "fedyogi", "fedadagrad", "feddyn", "fedcm",
                                 "fedadmm", "fedsgd", "fedpaq", "fedcom"], "Algorithms.")
flags.DEFINE_list("lrs", ["0.01", "0.03", "0.1"], "Local learning-rate grid (log).")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds of the final runs.")
flags.DEFINE_integer("tune_seed", 0, "Seed of the tuning runs (reused as a final run).")
flags.DEFINE_list("server_lrs", ["0.003", "0.01", "0.03", "0.1"], "Server rates of the "
                  "sensitivity table.")
flags.DEFINE_list("server_lr_algorithms", ["fedadam"], "Algorithms of the sensitivity table.")
flags.DEFINE_string("overrides", "", "Per-algorithm settings, e.g. "
                    "'fedadam:server_lr=0.03;fedprox:fedprox.mu=0.01'.")
flags.DEFINE_string("out", None, "Report prefix: writes <out>.md, <out>.json, <out>.png.")
flags.DEFINE_string("runs", None, "Directory of the runs' workdirs (default: <out>_runs).")
flags.mark_flags_as_required(["out"])

# Settings that are not learning rates, fixed before tuning (5.5: Reddi et al.'s server rate
# is tuned with tau = 1e-3; the sensitivity table varies it).
DEFAULT_OVERRIDES = {"fedadam": {"server_lr": 0.03}, "fedyogi": {"server_lr": 0.03},
                     "fedadagrad": {"server_lr": 0.03}}


def parse_overrides(text: str) -> dict:
  out = {name: dict(v) for name, v in DEFAULT_OVERRIDES.items()}
  for part in filter(None, (p.strip() for p in text.split(";"))):
    name, assignments = part.split(":", 1)
    for assignment in assignments.split(","):
      key, value = assignment.split("=")
      out.setdefault(name, {})[key] = json.loads(value)
  return out


def run_study(base, algorithms, lrs, seeds, tune_seed, root, overrides, server_lrs=(),
              server_lr_algorithms=()):
  """Tunes and runs every algorithm (workdirs under `root`); returns results, sensitivity."""
  def config_of(name, extra=None):
    return lambda lr, seed: sweep.configured(base, {**overrides.get(name, {}), **(extra or {})},
                                             algorithm=name, local_lr=lr, seed=seed)

  def workdir_of(label):
    return lambda lr, seed: os.path.join(root, label, f"lr{lr:g}", f"seed{seed}")

  results = {}
  for name in algorithms:
    tuned = sweep.tune(config_of(name), lrs, tune_seed, workdir_of(name))
    runs = [sweep.run(config_of(name)(tuned.value, s), workdir_of(name)(tuned.value, s))
            for s in seeds]
    results[name] = {"lr": tuned.value, "scores": tuned.scores, "runs": runs}
    print(f"{name}: lr {tuned.value:g}, final test accuracy "
          f"{sweep.mean_std([r['final_test_accuracy'] for r in runs])}", flush=True)
  sensitivity = {}
  for name in server_lr_algorithms:
    lr = results[name]["lr"] if name in results else sweep.tune(
        config_of(name), lrs, tune_seed, workdir_of(name)).value
    for server_lr in server_lrs:
      label = f"{name}_server_lr{server_lr:g}"
      make = config_of(name, {"server_lr": server_lr})
      sensitivity[label] = {"name": name, "server_lr": server_lr, "lr": lr, "runs": [
          sweep.run(make(lr, s), workdir_of(label)(lr, s)) for s in seeds]}
  return results, sensitivity


def report(base, results, sensitivity, lrs, seeds, tune_seed, out, wall) -> str:
  rows = []
  for name, r in results.items():
    runs = r["runs"]
    d = runs[0]["num_parameters"]
    participations = runs[0]["rounds"] * max(1, int(round(base.active_ratio * base.num_clients)))
    rows.append([
        name, f"{r['lr']:g}", f"{r['scores'][r['lr']]:.4f}",
        sweep.mean_std([x["final_test_accuracy"] for x in runs]),
        sweep.mean_std([x["best_test_accuracy"] for x in runs]),
        f"{runs[0]['comm_floats_up'] / (d * participations):.4g}",
        f"{runs[0]['comm_floats_down'] / (d * participations):.4g}",
        f"{runs[0]['comm_bits_up'] / (32 * d * participations):.4g}",
        f"{np.mean([x['wall_seconds'] for x in runs]):.0f}"])
  text = [f"# Algorithms at one local-step budget: {base.dataset}, {base.model}", "",
          f"Setting: partition {base.partition} (concentration {base.dirichlet_concentration}) "
          f"over {base.num_clients} clients, {base.active_ratio:.0%} participation, "
          f"{base.local_steps} local steps of batch {base.batch_size} per round, {base.rounds} "
          f"rounds (the same {base.rounds * base.local_steps} local steps for every algorithm, "
          f"FedSGD's one full-batch step per round aside), weighting {base.weighting}, "
          f"validation split {base.validation_fraction:.0%} of the training data.",
          f"Learning rate: picked from {{{', '.join(f'{x:g}' for x in lrs)}}} per algorithm by "
          f"the mean validation accuracy of the last 3 evaluations, seed {tune_seed}; then seeds "
          f"{', '.join(map(str, seeds))} at that rate. Test accuracy is reported, mean ± std "
          "over seeds. Floats are per participating client and round, in units of d "
          "(parameters); 'bits up / 32d' is the uplink in float32-equivalents.",
          f"Machine: {sweep.machine()}. Total wall time of this report's runs: "
          f"{wall / 60:.0f} min (other jobs shared the cores).", "",
          sweep.markdown_table(["algorithm", "lr", "val score", "final test acc",
                                "best test acc", "floats up / d", "floats down / d",
                                "bits up / 32d", "wall s / run"], rows), ""]
  text += ["Validation scores of the tuning runs:", "",
           sweep.markdown_table(["algorithm"] + [f"lr {x:g}" for x in lrs],
                                [[n] + [f"{r['scores'][x]:.4f}" for x in lrs]
                                 for n, r in results.items()]), ""]
  if sensitivity:
    text += ["Server learning-rate sensitivity (at the tuned local rate):", "",
             sweep.markdown_table(["algorithm", "server lr", "local lr", "final test acc",
                                   "best test acc"],
                                  [[s["name"], f"{s['server_lr']:g}", f"{s['lr']:g}",
                                    sweep.mean_std([x["final_test_accuracy"] for x in s["runs"]]),
                                    sweep.mean_std([x["best_test_accuracy"] for x in s["runs"]])]
                                   for s in sensitivity.values()]), ""]
  return "\n".join(text)


def main(argv):
  del argv
  logs.progress_only()
  base = FLAGS.config
  lrs = [float(x) for x in FLAGS.lrs]
  seeds = [int(x) for x in FLAGS.seeds]
  with sweep.Timer() as timer:
    results, sensitivity = run_study(
        base, FLAGS.algorithms, lrs, seeds, FLAGS.tune_seed, FLAGS.runs or FLAGS.out + "_runs",
        parse_overrides(FLAGS.overrides), [float(x) for x in FLAGS.server_lrs],
        FLAGS.server_lr_algorithms)
  wall = sum(x["wall_seconds"] for r in results.values() for x in r["runs"])
  text = report(base, results, sensitivity, lrs, seeds, FLAGS.tune_seed, FLAGS.out, wall)
  os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
  with open(FLAGS.out + ".md", "w") as f:
    f.write(text + "\n")
  slim = {n: {"lr": r["lr"], "scores": r["scores"],
              "runs": [{k: v for k, v in x.items() if k != "records"} for x in r["runs"]]}
          for n, r in results.items()}
  with open(FLAGS.out + ".json", "w") as f:
    json.dump({"results": slim, "sweep_seconds": timer.seconds}, f, indent=1, default=str)
  sweep.plot_curves(FLAGS.out + ".png", {n: [x["records"] for x in r["runs"]]
                                         for n, r in results.items()},
                    title=f"test accuracy, mean over seeds ({base.dataset})")
  print(text)


if __name__ == "__main__":
  app.run(main)
