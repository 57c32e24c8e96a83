"""The training entry points, as the README, notebooks and experiments import them.

The run itself lives in fedjax_lama.run (config -> validation -> RunSpec -> loop):
`train_and_evaluate` is fedjax_lama.run.pipeline's, `train_many` fedjax_lama.run.many's. The
functions below build one part of a run straight from a config, for tests, benchmarks and
tools that assemble a run piece by piece; they hand the config to fedjax_lama.run.spec (and
fedjax_lama.config), its only readers, and read nothing of it themselves.
"""
import ml_collections

from fedjax_lama import config as config_lib, registry
from fedjax_lama.errors import TrainingError, WorkdirError
from fedjax_lama.run import parts as parts_lib, spec as spec_lib, workdir as workdir_lib
from fedjax_lama.run.pipeline import train_and_evaluate
from fedjax_lama.run.many import VECTORIZABLE_FIELDS, train_many
from fedjax_lama.run.records import DivergenceError
from fedjax_lama.run.workdir import RESUMABLE_CHANGES, check_workdir_usable

partition_spec = spec_lib.partition_spec
platform_plan = spec_lib.platform_plan


def check_workdir(workdir: str, config: ml_collections.ConfigDict):
  """`fedjax_lama.run.workdir.check_workdir` for the run of `config`."""
  spec = spec_lib.build_spec(config)
  return workdir_lib.check_workdir(workdir, spec.records, spec.mode)


def run_options(config, fed):
  """The round programs' options of `config` on the federation `fed`."""
  opts = spec_lib.run_options(config, platform_plan(config))
  return parts_lib.federated_options(opts, spec_lib.data_spec(config).augmentation, fed)


def build_algorithm(config, num_clients: int = 1, mean_client_examples: float = 1.0):
  """The Algorithm of config.algorithm (the base algorithm under config.schedule) on a
  federation of `num_clients` clients holding `mean_client_examples` examples on average."""
  return registry.build_algorithm(config_lib.algorithm_options(config), num_clients,
                                  mean_client_examples)


def uplink_compressor(config):
  """The uplink compressor of config.compressor ("auto": the algorithm's own)."""
  return registry.uplink_compressor(config_lib.algorithm_options(config))


clock_options = config_lib.clock_options


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
           "WorkdirError", "build_algorithm", "build_model", "build_program", "check_workdir",
           "check_workdir_usable", "config_json", "load_dataset", "model_options",
           "partition_spec", "platform_plan", "run_options", "train_and_evaluate", "train_many",
           "uplink_compressor", "clock_options"]
