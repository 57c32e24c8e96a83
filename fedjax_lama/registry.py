"""The one registry: config.algorithm, config.<name>.*, config.schedule -> what to run.

Every algorithm name is written once, in its module's SPECS; the config sections
(config.<name>.<key>) are made from their Hparams defaults. The registry never reads a
config: fedjax_lama.config reads config.algorithm, config.schedule and the sections they
name once, at validation, into typed `AlgorithmOptions`, and the registry builds and checks
the algorithm from those.
What an algorithm cannot do is declared on its Spec (`layerwise`, `carry`), never tested by
its name here.

FedLAMA (fedjax_lama.fedlama) is an aggregation schedule over any layer-wise
algorithm: config.schedule="fedlama" with config.algorithm=<base>;
config.algorithm="fedlama" is the alias for config.fedlama.local_algorithm (FedAvg by
default) under that schedule.

Runs on the simulated clock (FedAT, Chai et al. 2021; fedjax_lama.simulation): config.algorithm
in CLOCK_METHODS (FedAT, TiFL, FedAsync, ASO-Fed, FedBuff) always runs there, and the registry's
FedAvg and FedProx run there with config.system.clock=True (fedjax_lama.config reads
config.system and config.<method> into the simulation's typed options).
"""
import dataclasses
from typing import Any, NamedTuple, Optional

from fedjax_lama import compression
from fedjax_lama import algorithms
from fedjax_lama.algorithms import common
from fedjax_lama.engine.algorithm import Algorithm
from fedjax_lama.errors import ConfigError
from fedjax_lama.fedlama import options as fedlama_options

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


class Selection(NamedTuple):
  """What config.algorithm / config.schedule resolve to."""
  base: str                          # the registered algorithm that runs
  schedule: str                      # "none" | "fedlama"
  fedlama: Optional[fedlama_options.FedLamaOptions]


def reads_fedlama(name: str, schedule: str) -> bool:
  """Whether config.algorithm=`name` with config.schedule=`schedule` (both accepted names)
  reads config.fedlama: the schedule, or its alias."""
  return name not in CLOCK_METHODS and fedlama_options.NAME in (name, schedule)


def select(name: str, schedule: str,
           fedlama: Optional[fedlama_options.FedLamaOptions] = None) -> Selection:
  """Resolves the accepted algorithm name and schedule (`fedlama`: config.fedlama typed, where
  `reads_fedlama`); ConfigError on a local algorithm that is not registered."""
  if not reads_fedlama(name, schedule):
    return Selection(name, "none", None)
  base = fedlama.local_algorithm if name == fedlama_options.NAME else name
  if base not in SPECS:
    raise ConfigError(f"config.fedlama.local_algorithm={base!r} is not accepted; accepted: "
                      f"{', '.join(map(repr, sorted(SPECS)))}")
  return Selection(base, fedlama_options.NAME, fedlama)


@dataclasses.dataclass(frozen=True)
class CompressorOptions:
  """config.compressor as given: "auto" (the algorithm's own) or a COMPRESSORS name."""
  name: str = "auto"
  levels: int = 16
  block: str = "leaf"


@dataclasses.dataclass(frozen=True)
class AlgorithmOptions:
  """A synchronous run's algorithm as the config asks for it, typed (fedjax_lama.config reads
  it once, at validation): the registry builds and checks the algorithm from this alone."""
  name: str                          # config.algorithm as given (the alias "fedlama" included)
  selection: Selection
  hparams: Any                       # config.<base> as SPECS[selection.base].hparams
  common: common.Common              # the shared fields (the federation's are set at build)
  local_optimizer_state: str         # "reset" | "carry"
  compressor: CompressorOptions


def build_algorithm(options: AlgorithmOptions, num_clients: int = 1,
                    mean_client_examples: float = 1.0) -> Algorithm:
  """The Algorithm that the options ask for (the base algorithm under a schedule)."""
  selection = options.selection
  if selection.base in CLOCK_METHODS:
    raise ConfigError(f"config.algorithm={selection.base!r} runs only on the simulated clock "
                      "(train_and_evaluate dispatches it there); it has no synchronous Algorithm")
  spec = SPECS[selection.base]
  try:
    opts = dataclasses.replace(options.common, num_clients=int(num_clients),
                               mean_client_examples=float(mean_client_examples))
  except common.HparamError as e:
    raise ConfigError(f"config.{e}") from e
  try:
    algorithm = spec.make(options.hparams, opts)
  except common.HparamError as e:  # a shared field the module cannot combine with
    raise ConfigError(f"config.{e} (with config.algorithm={spec.name!r})") from e
  if options.local_optimizer_state == "carry" and selection.schedule == "none":
    raise ConfigError(
        "config.local_optimizer_state='carry' is not accepted with config.schedule='none' "
        "(synchronous rounds start every client's local optimizer afresh); accepted: 'reset', "
        "or 'carry' with config.schedule='fedlama' (each slot keeps its optimizer)")
  if options.local_optimizer_state == "carry" and spec.carry is not True:
    raise ConfigError(
        f"config.local_optimizer_state='carry' is not accepted with config.algorithm="
        f"{spec.name!r} ({spec.carry}); accepted: 'reset'")
  layerwise = spec.layerwise_for(options.hparams)
  if selection.schedule != "none" and layerwise is not True:
    raise ConfigError(
        f"config.schedule={selection.schedule!r} cannot run config.algorithm="
        f"{options.name!r}{' (config.fedlama.local_algorithm=' + repr(spec.name) + ')' if options.name != spec.name else ''}: "
        f"{layerwise}")
  return algorithm


def uplink_compressor(options: AlgorithmOptions) -> compression.Compressor:
  """config.compressor.name: "auto" is the algorithm's Spec default (`Spec.uplink`; the
  identity if none)."""
  cfg = options.compressor
  if cfg.name not in COMPRESSOR_NAMES:
    raise ConfigError(f"config.compressor.name={cfg.name!r} is not accepted; accepted: "
                      f"{', '.join(map(repr, COMPRESSOR_NAMES))}")
  if cfg.name == "auto":
    spec = SPECS.get(options.selection.base)
    if spec is None or spec.uplink is None:
      return compression.identity()
    return spec.uplink(options.hparams)
  try:
    return compression.COMPRESSORS[cfg.name](cfg.levels, cfg.block)
  except ValueError as e:
    raise ConfigError(f"config.compressor: {e}") from e


def run_facts(options: AlgorithmOptions) -> dict:
  """The run options an algorithm's Spec and the shared config fields decide (RunOptions
  fields): FedSGD's one step per round (`Spec.one_step`), the local optimizer state across
  rounds, and the name the algorithm is reported under (`Spec.run_name`)."""
  facts = {"local_optimizer_state": options.local_optimizer_state}
  spec = SPECS.get(options.selection.base)
  if spec is None:  # a method of the simulated clock: no synchronous round program
    return {**facts, "algorithm_name": options.selection.base}
  return {**facts, "one_step": spec.one_step_kind(options.hparams),
          "algorithm_name": spec.run_name(options.hparams)}


class Resolved(NamedTuple):
  """What a run takes from its algorithm's options beside the algorithm (`resolve`)."""
  compressor: compression.Compressor   # the uplink compressor (`uplink_compressor`)
  run_facts: dict                      # RunOptions fields (`run_facts`)


def resolve(options: AlgorithmOptions) -> Resolved:
  """Every refusal of the algorithm, schedule and compressor that needs no data (the
  algorithm built on one client), and what the run takes beside the algorithm."""
  build_algorithm(options)
  compressor = uplink_compressor(options)
  if options.selection.schedule == fedlama_options.NAME and options.compressor.name == "qsgd" and (
      options.compressor.block != "leaf"):
    raise ConfigError(f"config.compressor.block={options.compressor.block!r} is not accepted; "
                      "accepted: 'leaf' with the fedlama schedule (a partial synchronisation "
                      "sends whole leaves)")
  return Resolved(compressor, run_facts(options))
