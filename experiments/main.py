r"""Command-line entry point: one experiment per command.

  python -m experiments.main --config=configs/default.py --workdir=/tmp/run \
      [--config.rounds=5 --config.local_lr=0.05 ...]

Running the same command again on the same --workdir resumes the run.
"""
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from experiments import logs

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "configs/default.py", "Experiment config file.",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for config.json, metrics, plots, checkpoints.")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logs.progress_only()
  # Imported here so that --help answers without loading JAX.
  from fedjax_lama import training  # pylint: disable=g-import-not-at-top
  from fedjax_lama.config import ConfigError  # pylint: disable=g-import-not-at-top
  from fedjax_lama.data import DataError  # pylint: disable=g-import-not-at-top
  try:
    summary = training.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except (ConfigError, DataError, training.TrainingError) as e:
    logging.error("%s", e)
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  print(f"final_test_accuracy={summary['final_test_accuracy']:.4f} "
        f"best_test_accuracy={summary['best_test_accuracy']:.4f} "
        f"wall_seconds={summary['wall_seconds']:.1f} workdir={FLAGS.workdir}")


if __name__ == "__main__":
  app.run(main)
