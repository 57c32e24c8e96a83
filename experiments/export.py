r"""The merged export: a run's latest model as plain parameters of the zoo model.

  python -m experiments.export --workdir=/tmp/text_tf_lora --out=/tmp/text_tf.msgpack
  python -m experiments.export --workdir=/tmp/milton --out=/tmp/milton.msgpack --overwrite

Writes FILE (flax msgpack: {"params": ..., "batch_stats": ...}) and FILE.json (the model's
name, number of classes, options and input shape). A run trained with LoRA adapters (the
model option lora) is written merged: every adapted kernel W becomes W + (alpha / r) A B and
the adapters are dropped, so the model built without the lora option reads the file with
its own `apply`; any other run's parameters are written as they are.
`fedjax_lama.run.pretrained.read_export(FILE)` returns (model, variables); a run starts from
the file with --config.init_from=FILE.

The model's vocabulary and window are the run's, taken from its dataset as the run took them,
so the run's data must be where its config.data_dir (or $FEDJAX_LAMA_DATA_DIR) says. An
existing FILE or FILE.json is refused unless --overwrite; the workdir is only read. A mistake
stops with one "error: ..." line and exit status 2, as experiments/main.py.
"""
import dataclasses
import os

from absl import app, flags

from experiments.main import fail  # also defines the required --workdir

FLAGS = flags.FLAGS


def export(workdir: str, out: str, overwrite: bool = False) -> dict:
  """Writes the latest model of the run in `workdir` to `out` (module docstring); returns
  the JSON written beside it."""
  from fedjax_lama import federation  # pylint: disable=g-import-not-at-top
  from fedjax_lama.errors import ConfigError, WorkdirError  # pylint: disable=g-import-not-at-top
  from fedjax_lama.run import parts as parts_lib, pretrained, spec as spec_lib  # pylint: disable=g-import-not-at-top
  if not os.path.isdir(workdir):
    raise WorkdirError(f"--workdir={workdir}: not a directory; accepted: a run's workdir")
  config = pretrained.workdir_config(workdir)
  if config is None:
    raise WorkdirError(f"--workdir={workdir} holds no config.json; accepted: a run's workdir")
  try:
    directory, step = pretrained.checkpoint_of(workdir)
  except ConfigError as e:
    raise WorkdirError(f"--workdir={workdir} holds no checkpoint yet; train it first") from e
  pretrained.check_writable(out, overwrite)  # before anything is read
  # The whole model: a trainable set's frozen rest added, the adapters merged.
  latest = pretrained.whole(pretrained.load(os.path.join(directory, str(step))))
  data = spec_lib.data_spec(config)
  dataset = parts_lib.load_dataset(data, federation.resolve_data_dir(data.data_dir))
  # The run's model as it built it, without the adapters.
  plain = dataclasses.replace(spec_lib.model_spec(config), options=dict(latest.options))
  options = parts_lib.model_options(plain, dataset, "auto")
  _, fresh, fresh_stats = parts_lib.build_model(plain, dataset, "auto")
  params, stats = pretrained.initial_params(fresh, fresh_stats, latest, "--workdir")
  info = {"model": config.model, "num_classes": int(dataset.num_classes),
          "options": {k: v for k, v in options.items() if k != "kernels"},
          "input_shape": list(dataset.train_x.shape[1:]),
          "input_dtype": dataset.train_x.dtype.name,
          "workdir": os.path.abspath(workdir), "round": step + 1,
          "lora_merged": config.model_options.to_dict().get("lora")}
  pretrained.write_export(out, pretrained.export_variables(params, stats, None), info,
                          overwrite)
  return info


def main(argv):
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")
  from fedjax_lama.cli import logs  # pylint: disable=g-import-not-at-top
  from fedjax_lama.errors import FedjaxLamaError  # pylint: disable=g-import-not-at-top
  logs.progress_only()
  try:
    info = export(FLAGS.workdir, FLAGS.out, FLAGS.overwrite)
  except FedjaxLamaError as e:
    fail(str(e), e)
  merged = " (LoRA adapters merged)" if info["lora_merged"] else ""
  print(f"exported: {FLAGS.out} and {FLAGS.out}.json, model {info['model']} after round "
        f"{info['round']} of {FLAGS.workdir}{merged}")


if __name__ == "__main__":
  # Defined here, not at import: the tests import `export` beside other commands that define
  # their own --out.
  flags.DEFINE_string("out", None, "The parameter file to write (FILE and FILE.json).")
  flags.DEFINE_bool("overwrite", False, "Replace an existing FILE and FILE.json.")
  flags.mark_flags_as_required(["out"])
  app.run(main)
