"""--distributed and its address flags: JAX's multi-process runtime for the commands that train
(BUILD.md "Multi-host"). No JAX import at module level, so the commands' --help stays fast."""
from absl import flags, logging

FLAGS = flags.FLAGS
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
_ADDRESS_FLAGS = ("coordinator_address", "num_processes", "process_id")


def misuse() -> str:
  """What is wrong with the flags given (address flags without --distributed), or ""."""
  if not FLAGS.distributed and any(FLAGS[f].present for f in _ADDRESS_FLAGS):
    return "--coordinator_address, --num_processes and --process_id need --distributed"
  return ""


def initialize() -> None:
  """jax.distributed.initialize with the given flags, the rest auto-detected, if --distributed.

  Must run before anything touches a JAX backend (importing jax is fine: nothing the commands
  import before it creates arrays).
  """
  if not FLAGS.distributed:
    return
  import jax  # pylint: disable=g-import-not-at-top
  if FLAGS.cpu_collectives != "none":
    jax.config.update("jax_cpu_collectives_implementation", FLAGS.cpu_collectives)
  given = {name: FLAGS[name].value for name in _ADDRESS_FLAGS}
  jax.distributed.initialize(**{k: v for k, v in given.items() if v is not None})
  logging.warning("process %d of %d: %d local of %d devices", jax.process_index(),
                  jax.process_count(), jax.local_device_count(), jax.device_count())


def is_primary() -> bool:
  """Whether this process prints the run's outcome (process 0, or the only one)."""
  if not FLAGS.distributed:
    return True
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index() == 0
