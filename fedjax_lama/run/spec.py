"""The run specification: a validated config read once into typed parts.

`build_spec(config)` is the one reader of a config after validation: it validates the config
as given (the file and every command-line override), decides the run's mode once
("synchronous", "fedlama" or "clock"), and turns every field the run reads into a typed part.
Everything downstream (the workdir checks, the run's parts, the loop and its records) reads
the RunSpec. The parts that need the data to exist (the algorithm, whose defaults may depend on
the clients' number and sizes) are built by the registry from the config captured here.
"""
import copy
import dataclasses
import functools
import json
from typing import Any, Callable, Optional

import ml_collections

from fedjax_lama import compression
from fedjax_lama import config as config_lib
from fedjax_lama import federation, registry
from fedjax_lama.engine import plan as plan_lib
from fedjax_lama.engine import stages
from fedjax_lama.fedlama import options as fedlama_options
from fedjax_lama.privacy import dp_stage as privacy_stage
from fedjax_lama.privacy import mechanisms
from fedjax_lama.programs.round_program import LearningRate, RunOptions
from fedjax_lama.robust import robust_stage
from fedjax_lama.simulation import run_options as clock_lib

MODES = ("synchronous", "fedlama", "clock")


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """The dataset, how it is read and prepared, and what it must fit."""
  name: str
  data_dir: str                # config.data_dir as given ("" -> $FEDJAX_LAMA_DATA_DIR, ./data)
  source: str
  options: dict                # the reader's options (config.dataset_options)
  normalization: str
  augmentation: str
  validation_fraction: float
  seed: int
  model: str                   # the inputs it must give (data and model are checked together)
  partition: str               # the labels it must give
  classes_per_client: int      # at most the dataset's classes (shards, class_cyclic)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  name: str
  options: dict                # config.model_options; the vocabulary is the dataset's if unset
  seed: int
  dataset: str                 # named in the errors of a model that does not fit the data


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """config.algorithm and config.schedule resolved; the Algorithm is built once the
  federation is known (`build(num_clients, mean_client_examples)`)."""
  name: str                    # as given (an alias such as "fedlama" included)
  selection: registry.Selection
  build: Callable              # (num_clients, mean_client_examples) -> Algorithm
  compressor: Any              # the uplink Compressor (config.compressor)


@dataclasses.dataclass(frozen=True)
class RecordOptions:
  """How the run is recorded: evaluation, checkpoints, plots, and the workdir's config."""
  rounds: int
  eval_every: int
  eval_batch_size: int
  checkpoint_every: int
  per_client_eval: str
  plots: bool
  tensorboard: bool
  algorithm: str
  dataset: str
  model: str
  schedule: str
  local_lr: float
  server_lr_text: str          # config.server_lr as the user reads it
  local_lr_decay: str       # what an extension of the run must not depend on
  fedlama_total_steps: Optional[int]
  config_json: dict            # config.json of the workdir
  base_json: dict              # base_config()'s: fields added later that keep their default
  privacy: Optional[object] = None  # privacy.DpOptions of a DP run: its epsilon is recorded
  # robust_stage.Backdoor of a run under the backdoor attack: its success rate is recorded.
  backdoor: Optional[object] = None
  # Per-client evaluation on local test parts (run/personal_eval.py): fine-tuning steps
  # before it, their learning rate and batch size, and the seed of their batches.
  finetune_steps: int = 0
  finetune_lr: float = 0.0
  finetune_layers: str = ""    # the layers fine-tuning moves ("": every layer)
  batch_size: int = 1
  seed: int = 0
  # A training loss above this multiple of the run's starting one stops it as diverged (0: off).
  max_loss_growth: float = config_lib.MAX_LOSS_GROWTH
  # The attack and defence of the run as the figures' titles name them (`robust_label`).
  robust_label: str = ""


@dataclasses.dataclass(frozen=True)
class RunSpec:
  mode: str                    # one of MODES, decided here once
  data: DataSpec
  federation: federation.PartitionSpec
  model: ModelSpec
  algorithm: Optional[AlgorithmSpec]        # None on the clock (its method is in `clock`)
  options: Optional[RunOptions]             # the round programs' (synchronous, fedlama)
  clock: Optional[clock_lib.ClockOptions]   # the simulation's (clock)
  records: RecordOptions
  plan: plan_lib.PlatformPlan
  # config.robust (None: neither a defence nor an attack); its stages join the run's chain
  # on the federation (`run_chain`; its data attacks: parts.program).
  robust: Optional[robust_stage.RobustSpec] = None


def config_json(config) -> dict:
  return json.loads(config.to_json_best_effort(sort_keys=True))


def _plain(section) -> dict:
  if isinstance(section, ml_collections.ConfigDict):
    return section.to_dict()
  return dict(section or {})


def build_spec(config: ml_collections.ConfigDict) -> RunSpec:
  """Validates `config` (ConfigError naming the first field not accepted) and reads it."""
  if not isinstance(config, ml_collections.ConfigDict):
    raise config_lib.ConfigError(
        f"config must be an ml_collections.ConfigDict (fedjax_lama.config.base_config() or a "
        f"config file's get_config()), got {type(config).__name__}")
  config = copy.deepcopy(config)
  config_lib.validate(config)
  clock = registry.runs_on_clock(config)  # FedAT (Chai et al. 2021) and its baselines
  selection = None if clock else registry.select(config)
  mode = "clock" if clock else "fedlama" if selection.fedlama is not None else "synchronous"
  privacy = privacy_stage.options_from_config(config, mode)  # None: config.privacy is off
  clock_options = registry.clock_options(config) if clock else None
  plan = plan_lib.plan(kernels=config.engine.kernels,  # built once; the programs read it
                       client_map=config.engine.get("client_map", "auto"))
  robust = robust_stage.read(config, mode)
  return RunSpec(
      mode=mode, data=data_spec(config), federation=partition_spec(config),
      model=model_spec(config), plan=plan,
      records=dataclasses.replace(record_options(config), privacy=privacy,
                                  backdoor=robust.backdoor if robust is not None else None,
                                  robust_label=robust_label(robust)),
      algorithm=None if clock else AlgorithmSpec(
          config.algorithm, selection, functools.partial(registry.build_algorithm, config),
          registry.uplink_compressor(config)),
      options=None if clock else run_options(config, plan),
      clock=dataclasses.replace(clock_options, platform=plan) if clock else None,
      robust=robust)


def robust_label(robust: Optional[robust_stage.RobustSpec]) -> str:
  """The defence and the attack of a run in a few words ("" without either), e.g.
  "defence median (f=4), attack sign_flip (4 malicious clients)"."""
  if robust is None:
    return ""
  defence = ("no defence" if robust.defence == "none"
             else f"defence {robust.defence} (f={robust.f})")
  if robust.attack == "none":
    return f"{defence}, no attack"
  count = robust.malicious_count
  who = (f"{count} malicious client{'' if count == 1 else 's'}" if count
         else f"{robust.malicious_fraction:g} of the clients malicious")
  return f"{defence}, attack {robust.attack} ({who})"


def data_spec(config) -> DataSpec:
  return DataSpec(
      name=config.dataset, data_dir=config.data_dir, source=config.data_source,
      options=_plain(config.get("dataset_options")), normalization=config.normalization,
      augmentation=config.augmentation, validation_fraction=config.validation_fraction,
      seed=config.seed, model=config.model, partition=config.partition,
      classes_per_client=config.classes_per_client)


def partition_spec(config) -> federation.PartitionSpec:
  return federation.PartitionSpec(
      name=config.partition, num_clients=config.num_clients, seed=config.seed,
      dirichlet_concentration=config.dirichlet_concentration,
      min_client_size=config.min_client_size, classes_per_client=config.classes_per_client,
      femnist_num_writers=config.femnist_num_writers,
      femnist_writers_per_client=config.femnist_writers_per_client,
      local_test_fraction=config.local_test_fraction,
      local_split="random" if registry.runs_on_clock(config) else "stratified",
      dataset_name=config.dataset)


def model_spec(config) -> ModelSpec:
  options = dict(config.model_options.to_dict()) if config.model_options else {}
  return ModelSpec(config.model, options, config.seed, config.dataset)


def run_chain(spec: RunSpec, num_clients: int) -> Optional[stages.Stage]:
  """The run's one aggregation chain (engine/stages.py), built once from the spec on a
  federation of `num_clients` clients: the uplink codec of every upload (config.compressor,
  the algorithm's own under "auto"), then user-level DP's clip and noise (config.privacy) or
  the upload attack and the defence (config.robust) around the model upload's aggregate.
  None: each algorithm's declared aggregation alone."""
  members = []
  if not compression.is_identity(spec.algorithm.compressor):
    members.append(stages.uplink(spec.algorithm.compressor))
  if spec.records.privacy is not None:
    members.append(mechanisms.user_level_dp(spec.records.privacy))
  members += robust_stage.run_stages(spec.robust, num_clients)
  return stages.chain(*members) if members else None


def run_options(config, plan: plan_lib.PlatformPlan) -> RunOptions:
  """The typed options every round program takes (programs/round_program.py). The sampler's
  clients and the augmentation are the federation's (`parts.federated_options`), and so is
  the aggregation chain (`run_chain`)."""
  on_host = config.engine.get("client_state_on_host", False)
  if not isinstance(on_host, bool):
    raise config_lib.ConfigError(f"config.engine.client_state_on_host={on_host!r} is not "
                                 "accepted; accepted: True or False")
  return RunOptions(
      seed=config.seed, rounds=config.rounds, local_steps=config.local_steps,
      local_epochs=config.local_epochs, batch_size=config.batch_size, weighting=config.weighting,
      eval_every=config.eval_every,
      learning_rate=LearningRate(float(config.local_lr), config.local_lr_decay,
                                 config.local_lr_warmup_steps, tuple(config.local_lr_decay_steps),
                                 float(config.local_lr_decay_factor)),
      sampler=federation.Sampler(config.client_sampling, float(config.active_ratio),
                                 config.num_clients, config.seed),
      label_smoothing=config.label_smoothing, unroll=config.engine.unroll,
      clients_per_chunk=config.engine.clients_per_chunk, client_state_on_host=on_host,
      augment=None, platform=plan, trainable=config_lib.trainable_names(config),
      **registry.run_facts(config))


def record_options(config) -> RecordOptions:
  fedlama = config.get(fedlama_options.NAME)
  return RecordOptions(
      rounds=config.rounds, eval_every=config.eval_every, eval_batch_size=config.eval_batch_size,
      checkpoint_every=config.checkpoint_every, per_client_eval=config.per_client_eval,
      plots=config.plots, tensorboard=config.tensorboard, algorithm=config.algorithm,
      dataset=config.dataset, model=config.model, schedule=config.get("schedule", "none"),
      local_lr=config.local_lr,
      server_lr_text=("the algorithm's default" if config.server_lr is None
                      else str(config.server_lr)),
      local_lr_decay=config.local_lr_decay,
      fedlama_total_steps=fedlama.get("total_steps") if fedlama is not None else None,
      config_json=config_json(config), base_json=config_json(config_lib.base_config()),
      finetune_steps=config.get("finetune_steps", 0),
      finetune_lr=float(config.local_lr if config.get("finetune_lr") is None
                        else config.finetune_lr),
      finetune_layers=config.get("finetune_layers", ""),
      batch_size=config.batch_size, seed=config.seed,
      max_loss_growth=float(config.max_loss_growth))
