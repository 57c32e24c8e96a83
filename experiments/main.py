r"""Command-line entry point: one experiment per command.

  python -m experiments.main --config=configs/default.py --workdir=/tmp/run \
      [--config.rounds=5 --config.dataset=femnist --config.dataset_options.format=leaf ...]

--config=FILE[:ARG] is loaded by `fedjax_lama.config_file.load`, then every --config.PATH
override is applied in order (a dataset and its options may both be set here); the config as
finally given is validated before any data is loaded. Running the same command again on the
same --workdir resumes the run; a larger --config.rounds extends a finished run.

A mistake in the input (a config field, a config file, the workdir, the data) stops with one
"error: ..." line naming what to change and exit status 2. FEDJAX_LAMA_DEBUG=1 also prints
the traceback.

Past one machine (BUILD.md "Multi-host"): every process runs the same command with
--distributed (and, where nothing is auto-detected, --coordinator_address, --num_processes,
--process_id) on a --workdir every process sees; only process 0 writes the plain files.
"""
import os
import sys
import traceback

from absl import app, flags
from ml_collections import config_flags

from fedjax_lama import progress
from fedjax_lama.cli import cpu_devices, distributed, logs

FLAGS = flags.FLAGS
DEFAULT_CONFIG = "configs/default.py"
DEBUG_ENV = "FEDJAX_LAMA_DEBUG"  # set (e.g. =1): user errors also print their traceback
config_spec = DEFAULT_CONFIG  # the --config given, as given (set by parse_flags)
flags.DEFINE_string("workdir", None, "Directory for config.json, metrics, plots, checkpoints.")
flags.mark_flags_as_required(["workdir"])


def fail(message: str, exc: BaseException | None = None) -> None:
  """The one error path: one "error: ..." line (and the traceback under $FEDJAX_LAMA_DEBUG),
  exit status 2."""
  if exc is not None and os.environ.get(DEBUG_ENV):
    traceback.print_exception(exc)
  print(f"error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
  sys.exit(2)


def split_config_argument(argv) -> tuple[str, list[str]]:
  """The --config=FILE[:ARG] of the command line (DEFAULT_CONFIG if absent), and the rest."""
  spec, rest, args = DEFAULT_CONFIG, [], iter(argv)
  for arg in args:
    if arg.lstrip("-").startswith("config=") and arg.startswith("-"):
      spec = arg.split("=", 1)[1]
    elif arg in ("--config", "-config"):
      spec = next(args, spec)
    else:
      rest.append(arg)
  return spec, rest


def override_paths(argv) -> list[str]:
  """The config fields set on the command line: --config.a.b=v, --config.flag, --noconfig.flag."""
  names = [arg.lstrip("-").split("=", 1)[0] for arg in argv[1:] if arg.startswith("-")]
  names = [name[len("no"):] if name.startswith("noconfig.") else name for name in names]
  return [name[len("config."):] for name in names if name.startswith("config.")]


def parse_flags(argv):
  """The config file, then absl's flags with every --config.PATH override applied in order.

  Overrides may add fields: what the config as finally given holds is checked as a whole
  (config.validate), so a dataset's options are checked against the dataset set beside them.
  """
  from fedjax_lama import config_file  # pylint: disable=g-import-not-at-top
  spec, argv = split_config_argument(argv)
  path, argument = (spec, None) if os.path.isfile(spec) or ":" not in spec else spec.split(":", 1)
  global config_spec
  config_spec = spec
  try:
    config = config_file.load(path, argument)
    config_flags.DEFINE_config_dict("config", config, "The experiment's config (--config=FILE).",
                                    lock_config=False, accept_new_attributes=True, sys_argv=argv)
    return FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except
    fail(str(e) if isinstance(e, (flags.Error, ValueError)) else f"{type(e).__name__}: {e}", e)


def _train(config, workdir) -> dict:
  from fedjax_lama import training  # pylint: disable=g-import-not-at-top
  return training.train_and_evaluate(config, workdir)


def _final_line(summary: dict) -> str:
  return (f"final_test_accuracy={summary['final_test_accuracy']:.4f} "
          f"best_test_accuracy={summary['best_test_accuracy']:.4f} "
          f"wall_seconds={summary['wall_seconds']:.1f} workdir={FLAGS.workdir}")


def main(argv, train=_train, final_line=_final_line):
  """The command: `train(config, workdir)` -> summary, then `final_line(summary)` printed
  (experiments/pretrain.py runs it with its own)."""
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")
  if distributed.misuse():
    fail(distributed.misuse())
  logs.progress_only()
  progress.info("starting: --config=%s --workdir=%s; loading JAX and the libraries ...",
                config_spec, FLAGS.workdir)
  cpu_devices.split_cpu()
  distributed.initialize()
  # Imported here so that --help answers without loading JAX.
  from fedjax_lama import config as config_lib  # pylint: disable=g-import-not-at-top
  from fedjax_lama.errors import FedjaxLamaError  # pylint: disable=g-import-not-at-top
  try:
    # A field the command line set that the run never reads is named before any other
    # problem; train_and_evaluate then validates every field before any data is loaded.
    config_lib.check_overrides(FLAGS.config, override_paths(sys.argv))
    summary = train(FLAGS.config, FLAGS.workdir)
  except FedjaxLamaError as e:
    fail(str(e), e)
  if distributed.is_primary():
    print(final_line(summary))


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
