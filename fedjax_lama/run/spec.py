"""The run specification: a validated config read once into typed parts.

`build_spec(config)` is, with validation (fedjax_lama.config, which reads the algorithm's
choice into the registry's typed options), the one reader of a config: it validates the
config as given (the file and every command-line override), decides the run's mode once
("synchronous", "fedlama" or "clock"), and turns every field the run reads into a typed part:
config.privacy into DpOptions (`privacy_options`), config.robust into a RobustSpec
(`robust_options`). Everything downstream (the registry, the privacy and robust modules, the
workdir checks, the run's parts, the loop and its records) reads the RunSpec, never the config
nor its JSON copy. The algorithm, whose defaults may depend on the clients' number and sizes,
is built by the registry from its typed options once the federation is known; every check
that needs no data runs here, before any data is loaded.
"""
import copy
import dataclasses
import functools
import json
from typing import Any, Callable, Optional

import ml_collections

from fedjax_lama import compression
from fedjax_lama import config as config_lib
from fedjax_lama import data as fdata
from fedjax_lama import errors, federation, models, registry
from fedjax_lama.engine import plan as plan_lib
from fedjax_lama.engine import stages
from fedjax_lama.fedlama import options as fedlama_options
from fedjax_lama.privacy import dp_options, dp_stage as privacy_stage
from fedjax_lama.privacy import mechanisms
from fedjax_lama.programs.round_program import LearningRate, RunOptions
from fedjax_lama.robust import defences, robust_stage
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
  init_from: str = ""          # config.init_from: another run's parameters ("": none)


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
  # config.local_test_fraction: > 0 gives every client a local test part (personal metrics).
  local_test_fraction: float = 0.0
  # config.privacy.target_epsilon of a DP run whose sigma was calibrated to it for
  # config.rounds rounds (None: sigma given, or no DP): such a run cannot be extended.
  target_epsilon: Optional[float] = None


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
  method = config_lib.validate(config)  # config.algorithm's options, typed
  clock = method.clock is not None  # FedAT (Chai et al. 2021) and its baselines
  selection = None if clock else method.algorithm.selection
  mode = "clock" if clock else "fedlama" if selection.fedlama is not None else "synchronous"
  privacy = privacy_options(config, mode)  # None: config.privacy is off
  plan = platform_plan(config)  # built once; the programs read it
  robust = robust_options(config, mode)
  algorithm = None if clock else AlgorithmSpec(
      config.algorithm, selection, functools.partial(registry.build_algorithm, method.algorithm),
      method.resolved.compressor)
  if robust is not None:  # a defence over the algorithm's own aggregate: before the data loads
    robust_stage.check_algorithm(robust, algorithm.build(), config.algorithm)
  records = record_options(config)
  return RunSpec(
      mode=mode, data=data_spec(config), federation=_partition(config, mode),
      model=model_spec(config), plan=plan,
      records=dataclasses.replace(
          records, privacy=privacy, backdoor=robust.backdoor if robust is not None else None,
          robust_label=robust_label(robust),
          target_epsilon=config.privacy.target_epsilon if privacy is not None else None),
      algorithm=algorithm,
      options=None if clock else _run_options(config, plan, method.resolved.run_facts,
                                              method.trainable),
      clock=dataclasses.replace(method.clock, platform=plan) if clock else None,
      robust=robust)


def platform_plan(config) -> plan_lib.PlatformPlan:
  """The engine's plan for JAX's default backend, from config.engine.kernels,
  config.engine.client_map and whether the model rematerialises (config.model_options.remat)."""
  return plan_lib.plan(kernels=config.engine.kernels,
                       client_map=config.engine.get("client_map", "auto"),
                       remat=bool((config.get("model_options") or {}).get("remat", False)))


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
  return _partition(config, "clock" if config_lib.runs_on_clock(config) else "synchronous")


def _partition(config, mode: str) -> federation.PartitionSpec:
  return federation.PartitionSpec(
      name=config.partition, num_clients=config.num_clients, seed=config.seed,
      dirichlet_concentration=config.dirichlet_concentration,
      min_client_size=config.min_client_size, classes_per_client=config.classes_per_client,
      femnist_num_writers=config.femnist_num_writers,
      femnist_writers_per_client=config.femnist_writers_per_client,
      local_test_fraction=config.local_test_fraction,
      local_split="random" if mode == "clock" else "stratified",
      dataset_name=config.dataset)


def model_spec(config) -> ModelSpec:
  options = dict(config.model_options.to_dict()) if config.model_options else {}
  return ModelSpec(config.model, options, config.seed, config.dataset, config.init_from)


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
  return _run_options(config, plan,
                      registry.run_facts(config_lib.algorithm_options(config)),
                      config_lib.trainable_names(config))


def _run_options(config, plan: plan_lib.PlatformPlan, run_facts: dict,
                 trainable: str) -> RunOptions:
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
      augment=None, platform=plan, trainable=trainable, **run_facts)


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
      max_loss_growth=float(config.max_loss_growth),
      local_test_fraction=float(config.local_test_fraction))


# ---- config.privacy and config.robust, read once ------------------------------------------------
def sampling_options(config) -> dp_options.SamplingOptions:
  """The cohorts the run draws, as the accountant sees them.

  config.client_sampling="bernoulli" is Poisson sampling with q = config.active_ratio (the
  federation's Bernoulli sampler, the same draws); "fixed" is round(active_ratio N) clients
  without replacement, accounted as such (replace-one adjacency), never as Poisson.
  """
  if config.client_sampling == "bernoulli":
    return dp_options.SamplingOptions("poisson", config.num_clients,
                                      rate=float(config.active_ratio))
  sampler = federation.Sampler("fixed", float(config.active_ratio), config.num_clients,
                               config.seed)
  return dp_options.SamplingOptions("fixed", config.num_clients,
                                    cohort_size=sampler.cohort_size)


def privacy_options(config, mode: str) -> Optional[dp_options.DpOptions]:
  """config.privacy as DpOptions (None when off), or one ConfigError naming the field.

  `mode`: the run's mode (MODES); DP is accounted in synchronous rounds only. With a target
  epsilon, sigma is calibrated before training for config.rounds rounds with the configured
  accountant.
  """
  section = config.privacy
  if not isinstance(section.enabled, bool):
    raise config_lib.ConfigError(f"config.privacy.enabled={section.enabled!r} is not "
                                 "accepted; accepted: True or False")
  if not section.enabled:
    return None
  # The accountant reports every evaluation: a missing dp-accounting stops the run here,
  # before any data is loaded, with its one-line install hint.
  from fedjax_lama.privacy import accounting  # pylint: disable=g-import-not-at-top
  if mode == "clock":
    raise config_lib.ConfigError(
        "config.privacy.enabled=True is not accepted on the simulated clock (its asynchronous "
        "updates are not accounted); accepted: synchronous rounds")
  if mode == "fedlama":
    # The accountant counts one Gaussian release of the whole model per round; FedLAMA
    # synchronises each layer set on its own interval, and every such synchronisation would be
    # a release of its own to compose.
    raise config_lib.ConfigError(
        f"config.privacy.enabled=True is not accepted with config.schedule={config.schedule!r}: "
        "each synchronisation of a layer set is a separate release that the accountant (one "
        "release of the whole model per round) would have to count; accepted: "
        "config.schedule='none'")
  if config.weighting != "uniform":
    raise config_lib.ConfigError(
        f"config.weighting={config.weighting!r} is not accepted with "
        "config.privacy.enabled=True (a client's weight would reveal its data size and unbound "
        "its effect); accepted: 'uniform'")
  sigma, target = section.noise_multiplier, section.target_epsilon
  if (sigma is None) == (target is None):
    raise config_lib.ConfigError(f"config.privacy.noise_multiplier={sigma!r} and "
                                 f"config.privacy.target_epsilon={target!r}: set exactly one "
                                 "of them")
  try:
    sampling = sampling_options(config)
    adaptive = None
    if section.adaptive.enabled:
      count_stddev = section.adaptive.count_stddev
      if count_stddev is None:
        count_stddev = privacy_stage.COUNT_STDDEV_PER_CLIENT * sampling.expected_cohort
      adaptive = dp_options.AdaptiveClipOptions(
          section.adaptive.target_quantile, section.adaptive.learning_rate, float(count_stddev))
    if target is not None:
      sigma = accounting.calibrate_noise_multiplier(sampling, target, section.delta,
                                                    config.rounds, section.accountant)
    return dp_options.DpOptions(
        noise_multiplier=sigma, clip_norm=section.clip_norm, sampling=sampling,
        delta=section.delta, clipping=section.clipping,
        layer_split=privacy_stage.layer_split(section.layer_split), adaptive=adaptive,
        accountant=section.accountant)
  except errors.HparamError as e:  # its message names privacy.<field>
    raise config_lib.ConfigError(f"config.{e}") from None


def robust_options(config, mode: str) -> Optional[robust_stage.RobustSpec]:
  """config.robust checked (ConfigError naming config.robust.<field>); None when it asks for
  neither a defence nor an attack, so such a run is exactly the run without the section."""
  section = config.get("robust")
  if section is None:  # a config written before the section existed
    return None
  r = section
  if r.defence not in robust_stage.DEFENCES:
    robust_stage.fail("defence", r.defence, ", ".join(map(repr, robust_stage.DEFENCES)))
  if r.attack not in robust_stage.ATTACKS:
    robust_stage.fail("attack", r.attack, ", ".join(map(repr, robust_stage.ATTACKS)))
  if r.defence == "none" and r.attack == "none":
    return None
  if mode == "clock":
    raise config_lib.ConfigError(
        f"config.robust.defence={r.defence!r}, config.robust.attack={r.attack!r} are not "
        "accepted on the simulated clock (config.system); accepted: 'none' there (robust "
        "aggregation runs in synchronous rounds and under the FedLAMA schedule)")
  # Privacy and robustness do not compose yet: the run has one stage around the model upload.
  privacy = config.get("privacy")
  if privacy is not None and privacy.get("enabled", False):
    raise config_lib.ConfigError(
        f"config.robust.defence={r.defence!r}, config.robust.attack={r.attack!r} with "
        "config.privacy.enabled=True are not accepted yet (the noise of DP-FedAvg is "
        "calibrated to a clipped mean, not to a robust aggregate or an attacked cohort); "
        "accepted: config.privacy or config.robust, not both")
  rule = defences.DEFENCES.get(r.defence)
  f = r.get("f")
  if rule is None or rule.bound is None:
    f = None  # read by no rule of this run (config.check_overrides refuses it when set)
  elif f is None:
    raise config_lib.ConfigError(
        f"config.robust.f is not set; accepted with config.robust.defence={r.defence!r}: an "
        f"int >= 0, the Byzantine clients per cohort the rule must tolerate ({r.defence} "
        f"needs {rule.bound.formula}, {rule.bound.paper}; "
        f"{_largest_f(r.defence, rule, config)})")
  elif not (robust_stage.is_count(f) and f >= 0):
    robust_stage.fail("f", f, "an int >= 0 (Byzantine clients per cohort)")
  hparams = {name: r[name] for name in (rule.options if rule is not None else ())}
  fraction = count = None
  if r.attack != "none":
    fraction_set, count_set = r.malicious_fraction != 0, r.malicious_count != 0
    if fraction_set == count_set:
      raise config_lib.ConfigError(
          f"config.robust.malicious_fraction={r.malicious_fraction!r} and "
          f"config.robust.malicious_count={r.malicious_count!r} are not accepted with "
          f"config.robust.attack={r.attack!r}; accepted: exactly one of them set (> 0)")
    if fraction_set:
      if not (robust_stage.is_number(r.malicious_fraction) and 0 < r.malicious_fraction <= 1):
        robust_stage.fail("malicious_fraction", r.malicious_fraction, "a fraction in (0, 1]")
      fraction = float(r.malicious_fraction)
    else:
      if not (robust_stage.is_count(r.malicious_count)
              and 0 < r.malicious_count <= config.num_clients):
        robust_stage.fail("malicious_count", r.malicious_count,
                          f"an int in [1, config.num_clients={config.num_clients}]")
      count = r.malicious_count
  options = {"sign_flip": {"scale": r.scale}, "gaussian": {"std": r.std},
             "alie": {"z": r.z}, "ipm": {"epsilon": r.epsilon},
             "backdoor": {"boost": r.get("boost", 0.0)}}.get(r.attack, {})
  zero_means = {"z": "z_max", "boost": "n / (config.server_lr m), model replacement"}
  for key, value in options.items():
    ok = robust_stage.is_number(value) and (value >= 0 if key in zero_means else value > 0)
    if not ok:
      robust_stage.fail(key, value, f"a number >= 0 (0: {zero_means[key]})"
                        if key in zero_means else "a number > 0")
  backdoor = _backdoor_options(config) if r.attack == "backdoor" else None
  if backdoor is not None:  # eta of the replacement boost n / eta (None: the default, 1)
    options["server_lr"] = 1.0 if config.server_lr is None else float(config.server_lr)
  spec = robust_stage.RobustSpec(r.defence, f, hparams, r.attack, fraction, count, options,
                                 config.seed, config.client_sampling,
                                 float(config.active_ratio), backdoor)
  robust_stage.run_stages(spec, config.num_clients)  # every refusal before any data is loaded
  return spec


def _largest_f(defence: str, rule, config) -> str:
  """What the run's smallest cohort allows of f, for the refusal of an unset f."""
  spec = robust_stage.RobustSpec(defence, 0, {}, "none", None, None, {}, config.seed,
                                 config.client_sampling, float(config.active_ratio))
  n, how = spec.smallest_cohort(config.num_clients)
  options = {name: config.robust[name] for name in rule.options}
  try:
    allowed = [g for g in range(n + 1) if rule.bound.holds(n, g, **options)]
  except errors.HparamError:  # an option the bound reads is itself refused later, naming it
    allowed = []
  return (f"{how}, which allows f <= {max(allowed)}" if allowed else how)


def _backdoor_options(config) -> robust_stage.Backdoor:
  """config.robust's backdoor options checked as far as the config allows (the classes and
  the image size are checked on the data, `Backdoor.check_data`)."""
  r = config.robust
  if fdata.INPUT_IMAGE not in models.inputs(config.model):  # no pixel to stamp a trigger on
    raise config_lib.ConfigError(
        f"config.robust.attack='backdoor' is not accepted with config.model={config.model!r}"
        f" on config.dataset={config.dataset!r}, which reads text or tokens; accepted: an "
        "image dataset and model (the trigger is a pixel pattern)")
  target, fraction, size = (r.get("target_label", 0), r.get("poison_fraction", 0.5),
                            r.get("trigger_size", 3))
  if not (robust_stage.is_count(target) and target >= 0):
    robust_stage.fail("target_label", target, "a class: an int >= 0 below the dataset's classes")
  if not (robust_stage.is_number(fraction) and 0 < fraction <= 1):
    robust_stage.fail("poison_fraction", fraction, "a fraction in (0, 1]")
  if not (robust_stage.is_count(size) and size >= 1):
    robust_stage.fail("trigger_size", size, "an int >= 1 (pixels)")
  return robust_stage.Backdoor(target, float(fraction), size)
