r"""The algorithms side by side at one local-step budget, each at its own tuned learning rate.

  python -m experiments.compare_algorithms --config=configs/baselines_fmnist_cnn.py \
      --config.data_dir=/path/to/data --out=experiments/results/baselines_fmnist \
      --runs=/tmp/baselines_fmnist_runs

For every algorithm: the local learning rate is picked from --lrs by its validation accuracy
(the mean of its last 3 evaluations on the split held out of the training data,
config.validation_fraction; never the test set) with seed --tune_seed, then the chosen rate
runs with every seed of --seeds. The report gives final and best test accuracy (mean ± std
over seeds), floats sent up and down per participating client and round (in units of the
model size d), the wall time, and every validation score of the tuning. --server_lrs adds
the sensitivity of the algorithms named in --server_lr_algorithms to their server rate (at
their tuned local rate, the seeds of --server_lr_seeds, default --seeds). Runs live in --runs
(default <out>_runs) and are reused or resumed, so an interrupted sweep continues where it
stopped. Writes <out>.md, <out>.json and <out>.png.
"""
import sys

from absl import app, flags
from ml_collections import config_flags

from experiments import baselines_study
from fedjax_lama.cli import logs

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "configs/baselines_fmnist_cnn.py", "Base config.")
flags.DEFINE_list("algorithms", ["fedavg", "fedprox", "scaffold", "fednova", "fedavgm",
                                 "fedadam", "fedyogi", "fedadagrad", "feddyn", "fedcm",
                                 "fedadmm", "fedsgd", "fedpaq", "fedcom"], "Algorithms.")
flags.DEFINE_list("lrs", ["0.01", "0.03", "0.1", "0.3"], "Local learning-rate grid (log).")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds of the final runs.")
flags.DEFINE_integer("tune_seed", 0, "Seed of the tuning runs (reused as a final run).")
flags.DEFINE_list("server_lrs", ["0.001", "0.01", "0.03", "0.1", "1"], "Server rates of "
                  "the sensitivity table (three decades, so that both failure ends show).")
flags.DEFINE_list("server_lr_seeds", [], "Seeds of the sensitivity runs (default: --seeds).")
flags.DEFINE_list("server_lr_algorithms", ["fedadam"], "Algorithms of the sensitivity table.")
flags.DEFINE_string("overrides", "", "Per-algorithm settings, e.g. "
                    "'fedadam:server_lr=0.03;fedprox:fedprox.mu=0.01'.")
flags.DEFINE_string("out", None, "Report prefix: writes <out>.md, <out>.json, <out>.png.")
flags.DEFINE_string("runs", None, "Directory of the runs' workdirs (default: <out>_runs).")
flags.mark_flags_as_required(["out"])


def main(argv):
  del argv
  logs.progress_only()
  print(baselines_study.compare(
      FLAGS.config, FLAGS.algorithms, [float(x) for x in FLAGS.lrs],
      [int(x) for x in FLAGS.seeds], FLAGS.tune_seed,
      baselines_study.parse_overrides(FLAGS.overrides), FLAGS.server_lr_algorithms,
      [float(x) for x in FLAGS.server_lrs], [int(x) for x in FLAGS.server_lr_seeds],
      FLAGS.out, FLAGS.runs or FLAGS.out + "_runs",
      command=" ".join(["python -m experiments.compare_algorithms"] + sys.argv[1:])))


if __name__ == "__main__":
  app.run(main)
