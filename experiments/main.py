r"""Command-line entry point: one experiment per command.

  python -m experiments.main --config=configs/default.py --workdir=/tmp/run \
      [--config.rounds=5 --config.local_lr=0.05 ...]

Running the same command again on the same --workdir resumes the run.

Past one machine (BUILD.md "Multi-host"): every process runs the same command with
--distributed, on a --workdir every process sees (a shared filesystem):

  python -m experiments.main --distributed --config=... --workdir=/shared/run
  # explicit, where nothing is auto-detected (here process 0 of 2):
  python -m experiments.main --distributed --coordinator_address=host0:1234 \
      --num_processes=2 --process_id=0 --config=... --workdir=/shared/run

--distributed calls `jax.distributed.initialize()` before any other JAX call; with no
address flags it auto-detects the cluster (Cloud TPU pods, SLURM, Open MPI). The
"clients" mesh then spans every device of every process; only process 0 writes the plain
files (config.json, metrics.jsonl, summary.json, plots); checkpoints are written by
every process together (orbax).
"""
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from fedjax_lama.cli import cpu_devices, logs
from fedjax_lama import progress

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "configs/default.py", "Experiment config file.",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for config.json, metrics, plots, checkpoints.")
flags.mark_flags_as_required(["workdir"])
flags.DEFINE_bool("distributed", False, "Join JAX's multi-process runtime "
                  "(jax.distributed.initialize) before any other JAX call; every process runs "
                  "the same command.")
flags.DEFINE_string("coordinator_address", None, "--distributed: host:port of process 0's "
                    "coordinator (default: auto-detected on TPU pods, SLURM, Open MPI).")
flags.DEFINE_integer("num_processes", None, "--distributed: number of processes (default: "
                     "auto-detected).")
flags.DEFINE_integer("process_id", None, "--distributed: this process's id in "
                     "[0, num_processes) (default: auto-detected).")
flags.DEFINE_enum("cpu_collectives", "gloo", ["gloo", "mpi", "none"], "--distributed: the "
                  "collectives of CPU devices across processes (JAX's "
                  "jax_cpu_collectives_implementation; accelerators use their own).")


def initialize_distributed() -> None:
  """jax.distributed.initialize with the given flags; the rest auto-detected.

  Must run before anything touches a JAX backend (importing jax is fine: nothing this
  command imports before it creates arrays).
  """
  import jax  # pylint: disable=g-import-not-at-top
  if FLAGS.cpu_collectives != "none":
    jax.config.update("jax_cpu_collectives_implementation", FLAGS.cpu_collectives)
  given = {"coordinator_address": FLAGS.coordinator_address,
           "num_processes": FLAGS.num_processes, "process_id": FLAGS.process_id}
  jax.distributed.initialize(**{k: v for k, v in given.items() if v is not None})
  logging.warning("process %d of %d: %d local of %d devices", jax.process_index(),
                  jax.process_count(), jax.local_device_count(), jax.device_count())


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not FLAGS.distributed and any(FLAGS[f].present for f in (
      "coordinator_address", "num_processes", "process_id")):
    raise app.UsageError("--coordinator_address, --num_processes and --process_id need "
                         "--distributed")
  logs.progress_only()
  progress.info("starting: --config=%s --workdir=%s; loading JAX and the libraries ...",
                flags.FLAGS["config"].config_filename, FLAGS.workdir)
  cpu_devices.split_cpu()
  if FLAGS.distributed:
    initialize_distributed()
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
  if FLAGS.distributed:
    import jax  # pylint: disable=g-import-not-at-top
    if jax.process_index() != 0:
      return
  print(f"final_test_accuracy={summary['final_test_accuracy']:.4f} "
        f"best_test_accuracy={summary['best_test_accuracy']:.4f} "
        f"wall_seconds={summary['wall_seconds']:.1f} workdir={FLAGS.workdir}")


if __name__ == "__main__":
  app.run(main)
