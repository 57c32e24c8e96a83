"""The training entry points, as the README, notebooks and experiments import them.

The run itself lives in fedjax_lama.run (config -> validation -> RunSpec -> loop):
`train_and_evaluate` is fedjax_lama.run.pipeline's, `train_many` fedjax_lama.run.many's. The
functions below build one part of a run straight from a config, for tests, benchmarks and
tools that assemble a run piece by piece; they read the config through fedjax_lama.run.spec.
"""
import ml_collections

from fedjax_lama.engine import plan as plan_lib
from fedjax_lama.errors import TrainingError, WorkdirError
from fedjax_lama.run import parts as parts_lib, spec as spec_lib, workdir as workdir_lib
from fedjax_lama.run.pipeline import train_and_evaluate
from fedjax_lama.run.many import VECTORIZABLE_FIELDS, train_many
from fedjax_lama.run.records import DivergenceError
from fedjax_lama.run.workdir import RESUMABLE_CHANGES, check_workdir_usable

partition_spec = spec_lib.partition_spec


def platform_plan(config):
  """The engine's plan for JAX's default backend, from config.engine.kernels and
  config.engine.client_map (as `fedjax_lama.run.spec.build_spec` builds it)."""
  return plan_lib.plan(kernels=config.engine.kernels,
                       client_map=config.engine.get("client_map", "auto"))


def check_workdir(workdir: str, config: ml_collections.ConfigDict):
  """`fedjax_lama.run.workdir.check_workdir` for the run of `config`."""
  spec = spec_lib.build_spec(config)
  return workdir_lib.check_workdir(workdir, spec.records, spec.mode)


def run_options(config, fed):
  """The round programs' options of `config` on the federation `fed`."""
  opts = spec_lib.run_options(config, platform_plan(config))
  return parts_lib.federated_options(opts, config.augmentation, fed)


def build_program(config, model, params, model_state, fed, mesh):
  """The round program of config.algorithm (and config.schedule) on this federation."""
  return parts_lib.program(spec_lib.build_spec(config),
                           parts_lib.Parts(fed, model, params, model_state), mesh)


def load_dataset(config, data_dir: str):
  """The dataset of `config`, checked against its model and partition."""
  return parts_lib.load_dataset(spec_lib.data_spec(config), data_dir)


def build_model(config, dataset):
  """(model, params, model_state) of config.model for `dataset`."""
  return parts_lib.build_model(spec_lib.model_spec(config), dataset,
                               platform_plan(config).kernels)


def model_options(config, dataset) -> dict:
  return parts_lib.model_options(spec_lib.model_spec(config), dataset,
                                 platform_plan(config).kernels)


config_json = spec_lib.config_json

__all__ = ["DivergenceError", "RESUMABLE_CHANGES", "TrainingError", "VECTORIZABLE_FIELDS",
           "WorkdirError", "build_model", "build_program", "check_workdir",
           "check_workdir_usable", "config_json", "load_dataset", "model_options",
           "partition_spec", "platform_plan", "run_options", "train_and_evaluate", "train_many"]
