"""The one registry: config.algorithm, config.<name>.*, config.schedule -> what to run.

Besides the training entry point this is the only reader of a config. Every
algorithm name is written once, in its module's SPECS; the config sections
(config.<name>.<key>) are made from their Hparams defaults, and an unknown name or
a value a module refuses stops with a ConfigError naming the field.

FedLAMA (fedjax_lama.fedlama) is an aggregation schedule over any layer-wise
algorithm: config.schedule="fedlama" with config.algorithm=<base>;
config.algorithm="fedlama" is the alias for config.fedlama.local_algorithm (FedAvg by
default) under that schedule.

Runs on the simulated clock (FedAT, Chai et al. 2021; fedjax_lama.simulation): config.algorithm
in CLOCK_METHODS (FedAT, TiFL, FedAsync, ASO-Fed, FedBuff) always runs there, and the registry's
FedAvg and FedProx run there with config.system.clock=True. `clock_options` turns
config.system.* and config.<method>.* into the simulation's typed configs.
"""
import dataclasses
import math
from typing import NamedTuple, Optional

import ml_collections

from fedjax_lama import compression
from fedjax_lama import algorithms
from fedjax_lama.algorithms import common
from fedjax_lama.engine.algorithm import Algorithm
from fedjax_lama.errors import ConfigError
from fedjax_lama.fedlama import options as fedlama_options
from fedjax_lama.simulation import system_config as sim_config
from fedjax_lama.simulation import run_options

SPECS = algorithms.SPECS
SCHEDULES = ("none", fedlama_options.NAME)
COMPRESSOR_NAMES = ("auto",) + tuple(compression.COMPRESSORS)


# Methods that exist only on the simulated clock, and registry algorithms that also run there.
CLOCK_METHODS = ("fedat", "tifl", "fedasync", "asofed", "fedbuff")
CLOCK_SYNC = ("fedavg", "fedprox")


def names() -> list[str]:
  """Every accepted config.algorithm."""
  return sorted(SPECS) + [fedlama_options.NAME] + list(CLOCK_METHODS)


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
  return _typed_values(cls, _section(config, name), name)


def _typed_values(cls, values: dict, path: str, prefix: Optional[str] = None):
  """cls(**values) with ConfigErrors naming config.<path>.<field> (the dataclass's own message
  names the field; `prefix` replaces `path` in it for nested sections)."""
  fields = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(values) - fields)
  if unknown:
    raise ConfigError(f"config.{path}.{unknown[0]} is not a field; accepted: "
                      f"{', '.join(sorted(fields)) or 'none'}")
  values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
  try:
    return cls(**values)
  except (ValueError, TypeError) as e:  # HparamError, and the simulation's ValueErrors
    raise ConfigError(f"config.{prefix or path}.{e}") from e


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
  if name in CLOCK_METHODS:
    if schedule != "none":
      raise ConfigError(f"config.schedule={schedule!r} is not accepted with config.algorithm="
                        f"{name!r} (a method on the simulated clock); accepted: 'none'")
    return Selection(name, "none", None)
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
  """The shared fields as `Common`; server_lr None stays None (the algorithm's default)."""
  server_lr = config.get("server_lr")
  try:
    return common.Common(local_momentum=float(config.local_momentum),
                         weight_decay=float(config.weight_decay),
                         server_lr=None if server_lr is None else float(server_lr),
                         num_clients=int(num_clients),
                         mean_client_examples=float(mean_client_examples))
  except common.HparamError as e:
    raise ConfigError(f"config.{e}") from e


def build_algorithm(config, num_clients: int = 1, mean_client_examples: float = 1.0
                    ) -> Algorithm:
  """The Algorithm that config asks for (the base algorithm under a schedule)."""
  selection = select(config)
  if selection.base in CLOCK_METHODS:
    raise ConfigError(f"config.algorithm={selection.base!r} runs only on the simulated clock "
                      "(train_and_evaluate dispatches it there); it has no synchronous Algorithm")
  spec = SPECS[selection.base]
  hparams = _typed(spec.hparams, config, spec.name)
  opts = common_options(config, num_clients, mean_client_examples)
  try:
    algorithm = spec.make(hparams, opts)
  except common.HparamError as e:  # a shared field the module cannot combine with
    raise ConfigError(f"config.{e} (with config.algorithm={spec.name!r})") from e
  if config.get("local_optimizer_state", "reset") == "carry" and selection.schedule == "none":
    raise ConfigError(
        "config.local_optimizer_state='carry' is not accepted with config.schedule='none' "
        "(synchronous rounds start every client's local optimizer afresh); accepted: 'reset', "
        "or 'carry' with config.schedule='fedlama' (each slot keeps its optimizer)")
  if config.get("local_optimizer_state", "reset") == "carry" and spec.name == "fedrep":
    raise ConfigError(
        "config.local_optimizer_state='carry' is not accepted with config.algorithm='fedrep' "
        "(its local optimizer counts the head's steps from the start of each window); "
        "accepted: 'reset'")
  layerwise = spec.layerwise_for(hparams)
  if selection.schedule != "none" and layerwise is not True:
    raise ConfigError(
        f"config.schedule={selection.schedule!r} cannot run config.algorithm="
        f"{config.algorithm!r}{' (config.fedlama.local_algorithm=' + repr(spec.name) + ')' if config.algorithm != spec.name else ''}: "
        f"{layerwise}")
  return algorithm


def uplink_compressor(config) -> compression.Compressor:
  """config.compressor.name: "auto" is the algorithm's Spec default (`Spec.uplink`; the
  identity if none)."""
  cfg = config.compressor
  if cfg.name not in COMPRESSOR_NAMES:
    raise ConfigError(f"config.compressor.name={cfg.name!r} is not accepted; accepted: "
                      f"{', '.join(map(repr, COMPRESSOR_NAMES))}")
  if cfg.name == "auto":
    spec = SPECS.get(select(config).base)
    if spec is None or spec.uplink is None:
      return compression.identity()
    return spec.uplink(_typed(spec.hparams, config, spec.name))
  try:
    return compression.COMPRESSORS[cfg.name](cfg.levels, cfg.block)
  except ValueError as e:
    raise ConfigError(f"config.compressor: {e}") from e


def run_facts(config) -> dict:
  """The run options an algorithm's Spec and the shared config fields decide (RunOptions
  fields): FedSGD's one step per round (`Spec.one_step`), the local optimizer state across
  rounds, and the name the algorithm is reported under (`Spec.run_name`)."""
  selection = select(config)
  facts = {"local_optimizer_state": config.get("local_optimizer_state", "reset")}
  spec = SPECS.get(selection.base)
  if spec is None:  # a method of the simulated clock: no synchronous round program
    return {**facts, "algorithm_name": selection.base}
  hparams = _typed(spec.hparams, config, spec.name)
  return {**facts, "one_step": spec.one_step_kind(hparams),
          "algorithm_name": spec.run_name(hparams)}


def validate(config) -> None:
  """Every algorithm, schedule and compressor field of `config` (no data needed)."""
  if runs_on_clock(config):
    clock_options(config)
    return
  selection = select(config)
  build_algorithm(config)
  uplink_compressor(config)
  if selection.schedule == fedlama_options.NAME and config.compressor.name == "qsgd" and (
      config.compressor.block != "leaf"):
    raise ConfigError(f"config.compressor.block={config.compressor.block!r} is not accepted; "
                      "accepted: 'leaf' with the fedlama schedule (a partial synchronisation "
                      "sends whole leaves)")


# ---- runs on the simulated clock (FedAT, Chai et al. 2021) ---------------------------------------------
_UNLIMITED_BANDWIDTH = ("bandwidth_down_bytes_per_s", "bandwidth_up_bytes_per_s")
# config.system: the simulated system (SystemConfig) without the fields the top level
# already has (num_clients, seed, local_epochs, batch_size), plus the run's own options.
_SYSTEM_FROM_TOP = ("num_clients", "seed", "local_epochs", "batch_size")
_SYSTEM_EXTRAS = {
    "clock": False,                  # True: run config.algorithm (fedavg, fedprox) on the clock
    "local_optimizer": "adam",       # FedAT's local Adam(local_lr, 0.9, 0.999, 1e-7); or "sgd"
    "polyline_mode": "flat",         # how FedAT's polyline encoding walks a model
    "call_size_multiple": 10,        # trainer calls padded to a multiple of this many clients
    "target_accuracy": None,         # time and bytes to this accuracy (None: not measured)
    "fedprox_variable_epochs": True,  # FedProx's jobs run 1..E epochs (Li et al. 2020) (stream PROX_E)
    "baseline_compression_precision": None,  # FedAvg / FedProx messages (None: raw float32)
}


def _dataclass_section(cls, skip=()) -> ml_collections.ConfigDict:
  section = ml_collections.ConfigDict()
  for field in dataclasses.fields(cls):
    if field.name in skip:
      continue
    default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    if dataclasses.is_dataclass(default):
      section[field.name] = _dataclass_section(type(default))
    elif field.type in (int, float, str, bool, tuple) and default is not None:
      section[field.name] = default
    else:  # Optional[...] or a scalar-or-per-client union
      section[field.name] = ml_collections.FieldReference(default, field_type=object)
  return section


def clock_sections() -> dict:
  """config.system and the sections of the clock-only methods, with their defaults."""
  system = _dataclass_section(sim_config.SystemConfig, skip=_SYSTEM_FROM_TOP)
  for name, default in _SYSTEM_EXTRAS.items():
    system[name] = (ml_collections.FieldReference(default, field_type=object)
                    if default is None else default)
  for name in _UNLIMITED_BANDWIDTH:  # config.json cannot hold inf: None means unlimited
    system.network_model[name] = None
  sections = {"system": system}
  for name in CLOCK_METHODS:
    sections[name] = _dataclass_section(run_options.METHOD_CONFIGS[name])
  return sections


def runs_on_clock(config) -> bool:
  """Whether config asks for a run on the simulated clock."""
  system = config.get("system")
  clock = bool(system.get("clock", False)) if system is not None else False
  return config.algorithm in CLOCK_METHODS or clock


def _clock_shared_fields(config) -> None:
  """Shared fields that runs on the clock do not silently ignore."""
  def refuse(ok, field, accepted):
    if not ok:
      raise ConfigError(f"config.{field}={config[field]!r} is not accepted on the simulated "
                        f"clock (config.algorithm={config.algorithm!r}); accepted: {accepted}")
  refuse(isinstance(config.local_epochs, int) and config.local_epochs >= 1, "local_epochs",
         "an integer >= 1 (E local epochs per job)")
  refuse(config.weighting == "examples", "weighting", "'examples' (n_k-weighted means)")
  refuse(config.local_lr_decay == "constant", "local_lr_decay", "'constant'")
  refuse(config.local_lr_warmup_steps == 0, "local_lr_warmup_steps", "0")
  refuse(config.server_lr in (None, 1.0), "server_lr",
         "None or 1.0 (the simulation's server rules)")
  refuse(config.get("local_optimizer_state", "reset") == "reset", "local_optimizer_state",
         "'reset' (each job starts its local optimizer afresh)")
  refuse(config.get("schedule", "none") == "none", "schedule", "'none'")
  refuse(config.validation_fraction == 0.0, "validation_fraction", "0.0")
  refuse(config.get("finetune_steps", 0) == 0, "finetune_steps",
         "0 (fine-tuning before evaluation runs in synchronous rounds)")
  refuse(0.0 < config.local_test_fraction < 1.0, "local_test_fraction",
         "a fraction in (0, 1): every client's local test split is evaluated (FedAT's 80/20 split)")
  if config.compressor.name not in ("auto", "identity"):
    raise ConfigError(f"config.compressor.name={config.compressor.name!r} is not accepted on the "
                      "simulated clock; accepted: 'auto' or 'identity' (messages are compressed "
                      "with polyline: config.<method>.compression_precision)")


def clock_options(config) -> run_options.ClockOptions:
  """The typed options of a run on the clock; ConfigErrors name the config field."""
  name = config.algorithm
  if name not in CLOCK_METHODS + CLOCK_SYNC:
    accepted = ", ".join(map(repr, CLOCK_SYNC + CLOCK_METHODS))
    raise ConfigError(f"config.algorithm={name!r} cannot run on the simulated clock "
                      f"(config.system.clock=True); accepted there: {accepted}")
  _clock_shared_fields(config)
  values = _section(config, "system")
  extras = {k: values.pop(k, default) for k, default in _SYSTEM_EXTRAS.items()}
  _clock_extras(config, extras)
  return run_options.ClockOptions(
      method=name, method_config=_clock_method_config(config, name, extras),
      system=_clock_system(config, values), local_lr=float(config.local_lr),
      local_optimizer=extras["local_optimizer"], local_momentum=float(config.local_momentum),
      polyline_mode=extras["polyline_mode"], call_size_multiple=extras["call_size_multiple"],
      target_accuracy=(None if extras["target_accuracy"] is None
                       else float(extras["target_accuracy"])),
      checkpoint_every_ticks=config.checkpoint_every, eval_batch_size=config.eval_batch_size,
      label_smoothing=float(config.label_smoothing), unroll=config.engine.unroll,
      plots=bool(config.plots), algorithm=name, dataset=config.dataset, model=config.model)


def _clock_system(config, values: dict) -> sim_config.SystemConfig:
  """SystemConfig from config.system (its own fields) and the top-level shared fields."""
  nested = {}
  for field, cls in (("compute_model", sim_config.ComputeModel),
                     ("network_model", sim_config.NetworkModel)):
    given = dict(values.pop(field, {}) or {})
    if field == "network_model":
      given.update({k: math.inf for k in _UNLIMITED_BANDWIDTH if given.get(k, 0) is None})
    nested[field] = _typed_values(cls, given, f"system.{field}", prefix="system")
  top = {k: config[k] for k in _SYSTEM_FROM_TOP}
  if not isinstance(top["seed"], int) or top["seed"] < 0:
    raise ConfigError(f"config.seed={top['seed']!r} is not accepted on the simulated clock; "
                      "accepted: an integer >= 0")
  allowed = {f.name for f in dataclasses.fields(sim_config.SystemConfig)} - set(top)
  unknown = sorted(set(values) - allowed)
  if unknown:
    raise ConfigError(f"config.system.{unknown[0]} is not a field; accepted: "
                      f"{', '.join(sorted(allowed | set(_SYSTEM_EXTRAS)))}")
  return _typed_values(sim_config.SystemConfig, {**values, **nested, **top}, "system")


def _clock_extras(config, extras: dict) -> None:
  """The run options of config.system that are not part of the simulated system."""
  def refuse(field, accepted):
    raise ConfigError(f"config.system.{field}={extras[field]!r} is not accepted; accepted: "
                      f"{accepted}")
  if not isinstance(extras["clock"], bool):
    refuse("clock", "True or False")
  optimizer = extras["local_optimizer"]
  if optimizer not in run_options.LOCAL_OPTIMIZERS:
    refuse("local_optimizer", ", ".join(map(repr, run_options.LOCAL_OPTIMIZERS)))
  for field in ("local_momentum", "weight_decay") if optimizer == "adam" else ("weight_decay",):
    if config[field] != 0:
      raise ConfigError(f"config.{field}={config[field]!r} is not accepted with "
                        f"config.system.local_optimizer={optimizer!r}; accepted: 0.0")
  if extras["polyline_mode"] not in run_options.POLYLINE_MODES:
    refuse("polyline_mode", ", ".join(map(repr, run_options.POLYLINE_MODES)))
  multiple = extras["call_size_multiple"]
  if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
    refuse("call_size_multiple", "an integer >= 1")
  target = extras["target_accuracy"]
  if target is not None and not (isinstance(target, (int, float)) and not isinstance(target, bool)
                                 and 0.0 < target <= 1.0):
    refuse("target_accuracy", "None or an accuracy in (0, 1]")
  if not isinstance(extras["fedprox_variable_epochs"], bool):
    refuse("fedprox_variable_epochs", "True or False")


def _clock_method_config(config, name: str, extras: dict):
  """The typed config of the method: config.<name> for the clock-only methods; FedAvg and
  FedProx take their cohort from config.active_ratio and mu from config.fedprox."""
  if name in CLOCK_METHODS:
    return _typed_values(run_options.METHOD_CONFIGS[name], _section(config, name), name)
  if config.client_sampling != "fixed":
    raise ConfigError(f"config.client_sampling={config.client_sampling!r} is not accepted on the "
                      "simulated clock; accepted: 'fixed' (round(active_ratio * num_clients) "
                      "clients per round)")
  cohort = max(1, int(round(config.active_ratio * config.num_clients)))
  fields = {"clients_per_round": cohort,
            "compression_precision": extras["baseline_compression_precision"]}
  if name == "fedprox":
    fields.update(mu=float(_typed(SPECS["fedprox"].hparams, config, "fedprox").mu),
                  variable_epochs=extras["fedprox_variable_epochs"])
  try:
    return run_options.METHOD_CONFIGS[name](**fields)
  except ValueError as e:  # the only field a user sets here is the precision
    raise ConfigError(f"config.system.baseline_{e}") from e
