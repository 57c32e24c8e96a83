"""The one registry: config.algorithm, config.<name>.*, config.schedule -> what to run.

Besides the training entry point this is the only reader of a config. Every
algorithm name is written once, in its module's SPECS; the config sections
(config.<name>.<key>) are made from their Hparams defaults, and an unknown name or
a value a module refuses stops with a ConfigError naming the field.

FedLAMA (fedjax_lama.fedlama) is an aggregation schedule over any layer-wise
algorithm: config.schedule="fedlama" with config.algorithm=<base>;
config.algorithm="fedlama" is the alias for config.fedlama.local_algorithm (FedAvg by
default) under that schedule.
"""
import dataclasses
from typing import NamedTuple, Optional

import ml_collections

from fedjax_lama import compression
from fedjax_lama.algorithms import (common, fedadmm, fedavg, fedcm, feddyn, fedlamb, fednova,
                                    fedpaq, fedprox, fedsgd, fedspeed, scaffold, server_opt)
from fedjax_lama.engine.algorithm import Algorithm
from fedjax_lama.errors import ConfigError
from fedjax_lama.fedlama import options as fedlama_options

_MODULES = (fedavg, fedprox, scaffold, fednova, server_opt, feddyn, fedcm, fedadmm, fedsgd,
            fedpaq, fedspeed, fedlamb)
SPECS = {spec.name: spec for module in _MODULES for spec in module.SPECS}
SCHEDULES = ("none", fedlama_options.NAME)
COMPRESSOR_NAMES = ("auto",) + tuple(compression.COMPRESSORS)


def names() -> list[str]:
  """Every accepted config.algorithm."""
  return sorted(SPECS) + [fedlama_options.NAME]


def hparam_defaults() -> dict:
  """config.<name> sections: each algorithm's hyper-parameters with their defaults."""
  sections = {name: dataclasses.asdict(spec.hparams()) for name, spec in SPECS.items()}
  sections[fedlama_options.NAME] = dataclasses.asdict(fedlama_options.FedLamaOptions())
  return sections


def _section(config, name: str) -> dict:
  section = config.get(name)
  if isinstance(section, ml_collections.ConfigDict):
    return section.to_dict()
  return dict(section or {})


def _typed(cls, config, name: str):
  """cls(**config.<name>) with ConfigErrors that name config.<name>.<field>."""
  values = _section(config, name)
  fields = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(values) - fields)
  if unknown:
    raise ConfigError(f"config.{name}.{unknown[0]} is not a field; accepted: "
                      f"{', '.join(sorted(fields)) or 'none'}")
  values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
  try:
    return cls(**values)
  except common.HparamError as e:
    raise ConfigError(f"config.{name}.{e}") from e


class Selection(NamedTuple):
  """What config.algorithm / config.schedule resolve to."""
  base: str                          # the registered algorithm that runs
  schedule: str                      # "none" | "fedlama"
  fedlama: Optional[fedlama_options.FedLamaOptions]


def select(config) -> Selection:
  """Resolves the algorithm name and schedule; raises ConfigError on unknown names."""
  name, schedule = config.algorithm, config.get("schedule", "none")
  if schedule not in SCHEDULES:
    raise ConfigError(f"config.schedule={schedule!r} is not accepted; accepted: "
                      f"{', '.join(map(repr, SCHEDULES))}")
  if name not in names():
    raise ConfigError(f"config.algorithm={name!r} is not accepted; accepted: "
                      f"{', '.join(map(repr, names()))}")
  if name == fedlama_options.NAME or schedule == fedlama_options.NAME:
    options = _typed(fedlama_options.FedLamaOptions, config, fedlama_options.NAME)
    base = options.local_algorithm if name == fedlama_options.NAME else name
    if base not in SPECS:
      raise ConfigError(f"config.fedlama.local_algorithm={base!r} is not accepted; accepted: "
                        f"{', '.join(map(repr, sorted(SPECS)))}")
    return Selection(base, fedlama_options.NAME, options)
  return Selection(name, "none", None)


def common_options(config, num_clients: int = 1, mean_client_examples: float = 1.0
                   ) -> common.Common:
  return common.Common(local_momentum=float(config.local_momentum),
                       weight_decay=float(config.weight_decay), server_lr=float(config.server_lr),
                       num_clients=int(num_clients),
                       mean_client_examples=float(mean_client_examples))


def build_algorithm(config, num_clients: int = 1, mean_client_examples: float = 1.0
                    ) -> Algorithm:
  """The Algorithm that config asks for (the base algorithm under a schedule)."""
  selection = select(config)
  spec = SPECS[selection.base]
  hparams = _typed(spec.hparams, config, spec.name)
  opts = common_options(config, num_clients, mean_client_examples)
  try:
    algorithm = spec.build(hparams, opts)
  except common.HparamError as e:  # a shared field the module cannot combine with
    raise ConfigError(f"config.{e} (with config.algorithm={spec.name!r})") from e
  if selection.schedule != "none" and algorithm.layerwise is not True:
    raise ConfigError(
        f"config.schedule={selection.schedule!r} cannot run config.algorithm="
        f"{config.algorithm!r}{' (config.fedlama.local_algorithm=' + repr(spec.name) + ')' if config.algorithm != spec.name else ''}: "
        f"{algorithm.layerwise}")
  return algorithm


def uplink_compressor(config, algorithm: Algorithm) -> compression.Compressor:
  """config.compressor.name: "auto" is the algorithm's declared default (identity if none)."""
  cfg = config.compressor
  if cfg.name not in COMPRESSOR_NAMES:
    raise ConfigError(f"config.compressor.name={cfg.name!r} is not accepted; accepted: "
                      f"{', '.join(map(repr, COMPRESSOR_NAMES))}")
  if cfg.name == "auto":
    return algorithm.uplink if algorithm.uplink is not None else compression.identity()
  try:
    return compression.COMPRESSORS[cfg.name](cfg.levels, cfg.block)
  except ValueError as e:
    raise ConfigError(f"config.compressor: {e}") from e


def validate(config) -> None:
  """Every algorithm, schedule and compressor field of `config` (no data needed)."""
  selection = select(config)
  algorithm = build_algorithm(config)
  uplink_compressor(config, algorithm)
  if selection.schedule == fedlama_options.NAME and config.compressor.name == "qsgd" and (
      config.compressor.block != "leaf"):
    raise ConfigError(f"config.compressor.block={config.compressor.block!r} is not accepted; "
                      "accepted: 'leaf' with the fedlama schedule (a partial synchronisation "
                      "sends whole leaves)")


def build(name: str, common_opts: Optional[common.Common] = None, **hparams) -> Algorithm:
  """An algorithm by name with keyword hyper-parameters, for use outside the CLI:
  `build("scaffold", Common(local_momentum=0.9), option="II")`."""
  if name not in SPECS:
    raise ValueError(f"algorithm {name!r} is unknown; accepted: {', '.join(sorted(SPECS))}")
  spec = SPECS[name]
  return spec.build(spec.hparams(**hparams), common_opts or common.Common())
