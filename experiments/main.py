r"""Command-line entry point: one experiment per command.

  python -m experiments.main --config=configs/default.py --workdir=/tmp/run \
      [--config.rounds=5 --config.local_lr=0.05 ...]

Running the same command again on the same --workdir resumes the run; the same command
with a larger --config.rounds extends a finished run.

A mistake in the input (a config field, a config file, the workdir, the data) stops with
one "error: ..." line naming what to change and exit status 2, before any data is loaded
where it can be checked without data. FEDJAX_LAMA_DEBUG=1 also prints the traceback.

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
import importlib.util
import os
import sys
import traceback

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


DEBUG_ENV = "FEDJAX_LAMA_DEBUG"  # set (e.g. =1): user errors also print their traceback


def fail(message: str, exc: BaseException | None = None) -> None:
  """Prints one "error: ..." line (the traceback too under $FEDJAX_LAMA_DEBUG), exits 2."""
  if exc is not None and os.environ.get(DEBUG_ENV):
    traceback.print_exception(exc)
  line = " ".join(str(message).split())
  print(f"error: {line}", file=sys.stderr, flush=True)
  sys.exit(2)


def _config_spec(argv) -> str:
  """The --config value of the command line (the flag's default if absent)."""
  spec = FLAGS["config"].default_as_str.strip("'\"")
  for i, arg in enumerate(argv[1:], start=1):
    if arg.startswith("--config="):
      spec = arg[len("--config="):]
    elif arg == "--config" and i + 1 < len(argv):
      spec = argv[i + 1]
  return spec


def override_paths(argv) -> list[str]:
  """The config fields set on the command line: --config.a.b=v, --config.flag, --noconfig.flag."""
  paths = []
  for arg in argv[1:]:
    name = arg.lstrip("-").split("=", 1)[0]
    if arg.startswith("--noconfig.") or arg.startswith("-noconfig."):
      name = name[len("no"):]
    if name.startswith("config."):
      paths.append(name[len("config."):])
  return paths


def load_config_file(spec: str):
  """get_config() of a config file, as --config loads it; one-line errors name the file.

  `spec` is PATH or PATH:ARG (get_config(ARG)), as ml_collections' config_flags accepts."""
  path, arg = spec, None
  if not os.path.isfile(path) and ":" in spec:
    path, arg = spec.split(":", 1)
  if not path:
    raise UsageFailure("--config is empty; accepted: a Python file with get_config()")
  if not os.path.isfile(path):
    raise UsageFailure(f"--config={path}: no such file" if not os.path.isdir(path)
                       else f"--config={path} is a directory; accepted: a Python file "
                       "with get_config()")
  try:
    module_spec = importlib.util.spec_from_file_location("_fedjax_lama_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
  except Exception as e:  # the file is the user's: whatever it raises is its problem
    raise UsageFailure(f"--config={path} cannot be loaded: {_exception_line(e)}") from e
  if not callable(getattr(module, "get_config", None)):
    raise UsageFailure(f"--config={path} has no get_config(); accepted: a Python file "
                       "defining get_config() that returns an ml_collections.ConfigDict")
  try:
    return module.get_config() if arg is None else module.get_config(arg)
  except Exception as e:
    raise UsageFailure(f"--config={spec}: get_config() raised {_exception_line(e)}") from e


class UsageFailure(Exception):
  """A command line that cannot be parsed; its message is the one line to print."""


def _exception_line(e: BaseException) -> str:
  if isinstance(e, SyntaxError):
    return f"SyntaxError: {e.msg} (line {e.lineno})"
  return f"{type(e).__name__}: {e}"


def _explain_parse_error(argv, exc: BaseException) -> str:
  """One line for a command line that absl could not parse, naming the flag or the file."""
  from fedjax_lama.errors import closest  # pylint: disable=g-import-not-at-top
  spec = _config_spec(argv)
  config = load_config_file(spec)  # raises UsageFailure naming the file
  from fedjax_lama import config as config_lib  # pylint: disable=g-import-not-at-top
  for path in override_paths(argv):
    if path in config_lib.RENAMED_FIELDS:
      return config_lib.renamed_field_message(path)
    node, walked = config, []
    for key in path.split("."):
      keys = list(node.keys()) if hasattr(node, "keys") else []
      if key not in keys:
        where = ".".join(["config"] + walked + [key])
        if walked == ["dataset_options"] or walked == ["model_options"]:
          return _unset_option(config, walked[0], key, spec)
        return f"{where} is not a field; {closest(key, keys)}"
      node, walked = node[key], walked + [key]
  message = str(exc)
  if isinstance(exc, flags.Error):
    return message
  return f"{type(exc).__name__}: {message}"


def _unset_option(config, section: str, key: str, spec: str) -> str:
  """The line for --config.dataset_options.KEY (or model_options) that the file does not set."""
  if section == "dataset_options":
    from fedjax_lama.data import DATASET_OPTIONS  # pylint: disable=g-import-not-at-top
    owner, accepted = f"config.dataset={config.dataset!r}", DATASET_OPTIONS.get(config.dataset, {})
  else:
    from fedjax_lama import models  # pylint: disable=g-import-not-at-top
    owner = f"config.model={config.model!r}"
    accepted = models.options(config.model) if config.model in models.names() else {}
  if key not in accepted:
    from fedjax_lama.errors import closest  # pylint: disable=g-import-not-at-top
    return f"config.{section}.{key} is not an option of {owner}; {closest(key, accepted)}"
  return (f"config.{section}.{key} is an option of {owner} that --config={spec} does not set: "
          "the command line can change the options a config file sets, not add them; set it "
          "in the config file")


def parse_flags(argv):
  """absl's flag parsing, with any failure turned into one "error:" line and exit 2."""
  try:
    rest = FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except
    try:
      message = _explain_parse_error(argv, e)
    except UsageFailure as failure:
      message = str(failure)
    fail(message, e)
  import ml_collections  # pylint: disable=g-import-not-at-top
  if not isinstance(FLAGS.config, ml_collections.ConfigDict):  # config_flags defers a missing file
    try:
      load_config_file(_config_spec(argv))
    except UsageFailure as e:
      fail(str(e), e)
    fail(f"--config={_config_spec(argv)} did not give an ml_collections.ConfigDict")
  return rest


def main(argv):
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")
  if not FLAGS.distributed and any(FLAGS[f].present for f in (
      "coordinator_address", "num_processes", "process_id")):
    fail("--coordinator_address, --num_processes and --process_id need --distributed")
  logs.progress_only()
  progress.info("starting: --config=%s --workdir=%s; loading JAX and the libraries ...",
                flags.FLAGS["config"].config_filename, FLAGS.workdir)
  cpu_devices.split_cpu()
  if FLAGS.distributed:
    initialize_distributed()
  # Imported here so that --help answers without loading JAX.
  from fedjax_lama import training  # pylint: disable=g-import-not-at-top
  from fedjax_lama import config as config_lib  # pylint: disable=g-import-not-at-top
  from fedjax_lama.errors import FedjaxLamaError  # pylint: disable=g-import-not-at-top
  try:
    # Checked here, before any data is loaded: what the command line set (a field the run
    # never reads is named before any other problem of that run), then every field.
    config_lib.check_overrides(FLAGS.config, override_paths(sys.argv))
    config_lib.validate(FLAGS.config)
    summary = training.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except FedjaxLamaError as e:
    fail(str(e), e)
  if FLAGS.distributed:
    import jax  # pylint: disable=g-import-not-at-top
    if jax.process_index() != 0:
      return
  print(f"final_test_accuracy={summary['final_test_accuracy']:.4f} "
        f"best_test_accuracy={summary['best_test_accuracy']:.4f} "
        f"wall_seconds={summary['wall_seconds']:.1f} workdir={FLAGS.workdir}")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
