"""Config defaults and validation: the only place that knows every field.

`validate(config)` runs before anything touches the workdir or loads data and raises
`ConfigError` naming the field and what is accepted: an unknown field (in the config, in
config.dataset_options or config.model_options) is named with the closest accepted names.
The algorithm sections (config.<algorithm>.<key>) come from the algorithms' typed
hyper-parameters through the registry, which also validates them.

`check_overrides(config, paths)` is for the fields a user set on the command line: one
that the chosen algorithm or mode never reads is refused, naming both fields. A config
file may still set every method's section (a study's config serves several methods).

A field renamed since runs were first written is listed in RENAMED_FIELDS: a workdir's
config.json that still uses the old name is read back under the new one
(`rename_old_fields`), while a config file or a command line that uses it stops with one
line naming the new field (`renamed_field_message`).
"""
import copy
import dataclasses
import math
from typing import NamedTuple, Optional

import ml_collections

from fedjax_lama.kernels import KERNELS
from fedjax_lama import registry
from fedjax_lama.algorithms import common
from fedjax_lama.fedlama import options as fedlama_options
from fedjax_lama.simulation import run_options
from fedjax_lama.simulation import system_config as sim_config
from fedjax_lama.engine.plan import CLIENT_MAPS
from fedjax_lama.errors import ConfigError, closest

DATASETS = ("digits", "mnist", "fashion_mnist", "cifar10", "cifar100", "emnist", "femnist",
            "sentiment140", "shakespeare", "reddit", "tinyimagenet", "synthetic",
            "shakespeare_roles", "milton")
AUGMENTATIONS = ("none", "crop_flip")
DATA_SOURCES = ("auto", "files", "tfds", "builtin")
PARTITIONS = ("iid", "dirichlet", "dirichlet_balanced", "shards", "class_cyclic", "one_class", "natural",
              "femnist_writers")
SAMPLINGS = ("fixed", "bernoulli")
WEIGHTINGS = ("examples", "uniform")
LR_DECAYS = ("constant", "cosine", "step", "exponential")
SCHEDULES = registry.SCHEDULES
# config.max_loss_growth's default: a training loss 1000 times its starting value is a run that
# has left any useful region (the default config under DP at epsilon 2, whose noise is 119
# times the clip, passes it in its second round), while a healthy run's loss falls.
MAX_LOSS_GROWTH = 1000.0

# Fields renamed since runs were first written, old dotted path -> current one: the kernel
# set is called "kernels" everywhere, and "schedule" is FedLAMA's aggregation schedule only
# (the local learning rate's decay is config.local_lr_decay).
RENAMED_FIELDS = {
    "engine.conv_impl": "engine.kernels",
    "model_options.conv_impl": "model_options.kernels",
    "local_lr_schedule": "local_lr_decay",
}


def renamed_field_message(old: str) -> str:
  """The one line for a config file or command line that sets the renamed field `old`."""
  return (f"config.{old} was renamed config.{RENAMED_FIELDS[old]} (same values); set "
          f"config.{RENAMED_FIELDS[old]} instead")


def rename_old_fields(config: dict) -> dict:
  """A copy of the plain dict `config` (a workdir's config.json) with every field of
  RENAMED_FIELDS under its current name; a field already under its current name is kept."""
  config = copy.deepcopy(config)
  for old, new in RENAMED_FIELDS.items():
    *old_parents, old_key = old.split(".")
    *new_parents, new_key = new.split(".")
    section = config
    for key in old_parents:
      section = section.get(key) if isinstance(section, dict) else None
    if not isinstance(section, dict) or old_key not in section:
      continue
    value = section.pop(old_key)
    target = config
    for key in new_parents:
      target = target.setdefault(key, {})
    target.setdefault(new_key, value)
  return _unread_old_defaults(config)


def _unread_old_defaults(config: dict) -> dict:
  """config.robust.f defaulted to 0 before it became required with the defences that read it
  (None otherwise): a workdir's f = 0 that its defence never read is the unset f of today."""
  robust = config.get("robust")
  if isinstance(robust, dict) and robust.get("f") == 0:
    from fedjax_lama.robust import robust_stage  # pylint: disable=g-import-not-at-top
    if "f" not in robust_stage.fields_read(robust.get("defence"), "none"):
      robust["f"] = None
  return config


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.algorithm = "fedavg"   # fedjax_lama.algorithms.names()
  c.schedule = "none"      # "fedlama": FedLAMA's layer-wise intervals over config.algorithm
  c.seed = 0
  # Data and federation.
  c.dataset = "digits"
  c.data_dir = ""  # "" -> $FEDJAX_LAMA_DATA_DIR, else ./data (fedjax_lama.data.resolve_data_dir)
  c.data_source = "auto"
  # Reader options (fedjax_lama.data.DATASET_OPTIONS), e.g. {"vocab_size": 10000}.
  c.dataset_options = ml_collections.ConfigDict()
  # Input normalisation and on-device training augmentation (fedjax_lama.data.augment):
  # "crop_flip" is the CIFAR recipe (pad 4, random crop, horizontal flip, fresh per client
  # and step); "per_channel" standardises with the training split's channel mean and std,
  # "per_pixel" with its per-pixel statistics (the FedLAMA reference code).
  c.augmentation = "none"
  c.normalization = "none"
  c.partition = "dirichlet"
  c.dirichlet_concentration = 0.5
  c.min_client_size = 10
  c.classes_per_client = 2
  c.femnist_num_writers = 256
  c.femnist_writers_per_client = 2
  c.local_test_fraction = 0.0
  # Held out of the training split (before partitioning) and evaluated as val_accuracy /
  # val_loss beside the test metrics: tune on it, never on the test set.
  c.validation_fraction = 0.0
  c.num_clients = 32
  c.client_sampling = "fixed"
  c.active_ratio = 1.0
  # Model.
  c.model = "mlp"
  c.model_options = ml_collections.ConfigDict()
  # The run's initial parameters: "" the model's own initialization from config.seed, else
  # a path to another run's parameters (fedjax_lama/run/pretrained.py): its workdir (the
  # latest checkpoint), one of its checkpoints/<step> directories, or a file written by
  # experiments.export. With the model option lora they are the base; the adapters start
  # fresh (B = 0).
  c.init_from = ""
  # The parameters the run trains, aggregates and sends (models/lora.py `trainable_set`):
  # "" is every parameter, or the adapters under model_options.lora; else comma-separated
  # names: "lora", "lora_a", "lora_b" (FFA-LoRA: B only), "bias", "norm", layer names or
  # globs ("Dense_0", "*/attention/*"). The rest stays frozen, one copy per device.
  c.trainable = ""
  # Local training.
  c.rounds = 50
  c.local_steps = 10
  c.local_epochs = 0  # > 0 trains E epochs per round instead of local_steps
  c.batch_size = 32
  c.local_lr = 0.1
  c.local_lr_decay = "constant"  # how the local learning rate decays over the run: LR_DECAYS
  c.local_lr_warmup_steps = 0
  c.local_lr_decay_steps = ()  # "step": boundaries in local steps
  c.local_lr_decay_factor = 0.1  # "step": factor per boundary; "exponential": factor per round
  c.local_momentum = 0.0
  # The local optimizer's state across rounds: "reset" (a fresh state every round, or every
  # FedLAMA window) or "carry" (kept; only under config.schedule="fedlama", where each slot
  # keeps its optimizer for the whole run as FedLAMA's reference code does).
  c.local_optimizer_state = "reset"
  c.weight_decay = 0.0
  c.label_smoothing = 0.0
  # Server.
  # None: the algorithm's own default (1.0; FedAdam, FedYogi 0.01 and FedAdagrad 0.1).
  c.server_lr = ml_collections.FieldReference(None, field_type=float)
  c.weighting = "examples"
  # Algorithm-specific keys, one section per algorithm (and config.fedlama for the schedule),
  # with the defaults of their typed hyper-parameters.
  for name, defaults in registry.hparam_defaults().items():
    c[name] = ml_collections.ConfigDict(defaults)
  # Runs on the simulated clock (FedAT, Chai et al. 2021): config.system (the simulated system and the
  # run's options; config.system.clock=True runs fedavg / fedprox there) and the sections of
  # the clock-only methods (fedat, tifl, fedasync, asofed), from their typed configs.
  for name, section in clock_sections().items():
    c[name] = section
  # Uplink compressor of the client updates (QSGD, Alistarh et al. 2017). "auto": the
  # algorithm's own (QSGD with config.fedpaq.levels for fedpaq/fedcom), else "identity".
  # FedPAQ + FedLAMA (AAAI Table 4b) is algorithm="fedlama" with name="qsgd".
  c.compressor = ml_collections.ConfigDict({"name": "auto", "levels": 16, "block": "leaf"})
  # Byzantine-robust aggregation of the model updates and the attacks it is tested against,
  # off by default; read once by fedjax_lama/robust/robust_stage.py (docs/guide.md, "Robust
  # aggregation and attacks"). An option the defence and the attack do not read is refused
  # when set on the command line (check_overrides).
  c.robust = ml_collections.ConfigDict({
      "defence": "none",        # robust.defences.DEFENCES
      # Byzantine clients per cohort the defence must tolerate: required by every defence
      # with a bound on it (all but norm_bounding), no default.
      "f": ml_collections.FieldReference(None, field_type=int),
      "num_selected": 0,        # multi_krum: updates averaged (0: n - f)
      "beta": 0.1,              # trimmed_mean: fraction cut from each side, floor(beta n) >= f
      "iterations": 0,          # geometric_median (0: 4), centered_clipping (0: 1)
      "nu": 1e-6,               # geometric_median: smoothing of the Weiszfeld weights
      "radius": 1.0,            # centered_clipping: clipping radius tau
      "momentum": 0.0,          # centered_clipping: momentum of the centre, in [0, 1)
      "bound": 1.0,             # norm_bounding: L2 bound of each update
      "attack": "none",         # robust.attacks.ATTACKS
      "malicious_fraction": 0.0,  # floor(fraction * clients) malicious, fixed by config.seed
      "malicious_count": 0,     # or this many (set exactly one of the two with an attack)
      "scale": 1.0,             # sign_flip: the update sent is -scale * the honest one
      "std": 1.0,               # gaussian: std of the coordinates sent
      "z": 0.0,                 # alie: mean - z std (0: Baruch et al.'s z_max for the cohort)
      "epsilon": 0.5,           # ipm: -epsilon * the honest mean
      "target_label": 0,        # backdoor: the class triggered images are sent to
      "poison_fraction": 0.5,   # backdoor: share of each malicious client's examples, (0, 1]
      "boost": 0.0,             # backdoor: upload boost gamma (0: n / (server_lr m), replacement)
      "trigger_size": 3,        # backdoor: side of the checkerboard trigger, in pixels
  })
  # User-level differential privacy over the model updates (DP-FedAvg, McMahan et al.,
  # ICLR 2018), off by default; read once into privacy.DpOptions (fedjax_lama/privacy/dp_stage.py).
  # Set noise_multiplier (sigma) or target_epsilon (sigma calibrated for config.rounds).
  c.privacy = ml_collections.ConfigDict({
      "enabled": False,
      "noise_multiplier": ml_collections.FieldReference(None, field_type=float),
      "target_epsilon": ml_collections.FieldReference(None, field_type=float),
      "clip_norm": 1.0,          # C: L2 clip of each client's update (the initial clip if adaptive)
      "clipping": "flat",        # "flat" | "per_layer"
      "layer_split": "equal",    # per_layer: "equal", "size" or shares "0.25,0.75" (C_l^2 / C^2)
      "delta": 1e-5,
      "accountant": "rdp",       # "rdp" | "pld" (pld: Poisson cohorts only)
      "adaptive": ml_collections.ConfigDict({
          "enabled": False,      # Andrew et al., NeurIPS 2021: the clip tracks a norm quantile
          "target_quantile": 0.5,
          "learning_rate": 0.2,
          # std of the noise on the count of unclipped clients; None: expected cohort / 20
          "count_stddev": ml_collections.FieldReference(None, field_type=float),
      }),
  })
  # Run.
  # A round whose training loss exceeds this multiple of the run's starting training loss
  # (its first round's, or first clock tick's) stops the run as diverged, with the same one
  # line as a NaN; 0 turns the check off. Healthy runs stay far below it (docs/guide.md).
  c.max_loss_growth = MAX_LOSS_GROWTH
  c.eval_every = 1
  c.checkpoint_every = 10
  c.eval_batch_size = 1000
  c.per_client_eval = "final"  # "final" | "every" | "never"
  # Personalized evaluation (synchronous runs with per-client test parts,
  # config.local_test_fraction > 0): before each per-client evaluation every client
  # fine-tunes its model with this many steps of local SGD (batch config.batch_size) on its
  # own training part, at finetune_lr (None: config.local_lr). 0: no fine-tuning.
  c.finetune_steps = 0
  c.finetune_lr = ml_collections.FieldReference(None, field_type=float)
  # The layers fine-tuning moves: "" every layer, else comma-separated layer names
  # ("Dense_2" for the head alone, FedBABU's reading); the others stay as served.
  c.finetune_layers = ""
  c.plots = True
  c.tensorboard = False  # also write TensorBoard event files to <workdir>/tensorboard
  # kernels: the kernel set the models' layers compute with, "auto" (the platform's
  # measured best), "lax" or "patches" (fedjax_lama.kernels.KERNELS); client_map: how local
  # training adds the client axis, "auto" (the platform's measured best), "vmap" or "scan"
  # (fedjax_lama.engine.plan.CLIENT_MAPS).
  c.engine = ml_collections.ConfigDict({"kernels": "auto", "unroll": 1, "clients_per_chunk": 0,
                                        "client_state_on_host": False, "client_map": "auto"})
  return c


def _fail(field: str, value, accepted: str):
  raise ConfigError(f"config.{field}={value!r} is not accepted; accepted: {accepted}")


def _one_of(c, field, choices):
  value = c[field] if "." not in field else c[field.split(".")[0]][field.split(".")[1]]
  if value not in choices:
    _fail(field, value, ", ".join(repr(x) for x in choices))


def _positive_int(c, field, allow_zero=False):
  value = c[field]
  ok = isinstance(value, int) and not isinstance(value, bool) and (value >= 0 if allow_zero else value > 0)
  if not ok:
    _fail(field, value, "an integer >= 0" if allow_zero else "an integer >= 1")


# Dicts whose keys are options of the chosen dataset or model rather than fields.
_OPTION_DICTS = ("dataset_options", "model_options")


def _check_known_fields(c, base, path: str = "") -> None:
  """Every field of `c` exists in `base` (base_config()), recursively."""
  for key in c.keys():
    where = f"{path}{key}"
    if where in RENAMED_FIELDS:
      raise ConfigError(renamed_field_message(where))
    if key not in base:
      raise ConfigError(f"config.{where} is not a field; {closest(key, base.keys())}")
    if key in _OPTION_DICTS and not path:
      continue
    if isinstance(base[key], ml_collections.ConfigDict) and isinstance(
        c[key], ml_collections.ConfigDict):
      _check_known_fields(c[key], base[key], where + ".")
  missing = sorted(set(base.keys()) - set(c.keys()))
  if missing:
    raise ConfigError(f"config.{path}{missing[0]} is missing; start from "
                      "fedjax_lama.config.base_config(), which sets every field")


def _check_options(c) -> None:
  """config.dataset_options and config.model_options hold options of the chosen dataset and
  model (checked again, with their values, when the data and model are built)."""
  from fedjax_lama import models  # pylint: disable=g-import-not-at-top
  from fedjax_lama.data import DATASET_OPTIONS  # pylint: disable=g-import-not-at-top
  given = {k: v for k, v in (c.get("dataset_options") or {}).items()}
  accepted = DATASET_OPTIONS.get(c.dataset, {})
  for key in sorted(given):
    if key not in accepted:
      raise ConfigError(f"config.dataset_options.{key} is not an option of config.dataset="
                        f"{c.dataset!r}; {closest(key, accepted)}")
  if c.model not in models.names():
    _fail("model", c.model, ", ".join(map(repr, models.names())))
  accepted = models.options(c.model)
  for key in sorted((c.get("model_options") or {}).keys()):
    if f"model_options.{key}" in RENAMED_FIELDS:
      raise ConfigError(renamed_field_message(f"model_options.{key}"))
    if key not in accepted:
      raise ConfigError(f"config.model_options.{key} is not an option of config.model="
                        f"{c.model!r}; {closest(key, accepted)} (remove the others, e.g. "
                        f"use a config written for {c.model!r})")
  _check_trainable(c)


# ---- the trainable set (LoRA adapters over a frozen base, models/lora.py) ----------------
def uses_lora(c) -> bool:
  return (c.get("model_options") or {}).get("lora") is not None


def trainable_names(c) -> str:
  """The trainable set config.trainable declares: "lora" (the adapters) when it is "" under
  config.model_options.lora, "" (every parameter) otherwise."""
  given = c.get("trainable", "")
  return given if given.strip() else ("lora" if uses_lora(c) else "")


def _check_trainable(c) -> None:
  """config.trainable: a string of names (the model's layers are only known once it is
  built: a name that selects nothing stops there, listing them); runs on the simulated
  clock train every parameter."""
  given = c.get("trainable", "")
  if not isinstance(given, str):
    _fail("trainable", given, "a string: '' (the adapters under config.model_options.lora, "
          "else every parameter) or comma-separated names: 'lora', 'lora_a', 'lora_b' "
          "(FFA-LoRA), 'bias', 'norm', layer names or globs")
  if (given.strip() or uses_lora(c)) and runs_on_clock(c):
    what = "config.model_options.lora" if uses_lora(c) else f"config.trainable={given!r}"
    raise ConfigError(f"{what} is not accepted on the simulated clock (config.algorithm="
                      f"{c.algorithm!r}), which trains every parameter; accepted: synchronous "
                      f"rounds or the fedlama schedule")


def validate(c: ml_collections.ConfigDict, num_classes: int | None = None) -> "Method":
  """Raises ConfigError for the first field that is not accepted; returns what
  config.algorithm runs, typed (`method`)."""
  if not isinstance(c, ml_collections.ConfigDict):
    raise ConfigError(f"config must be an ml_collections.ConfigDict (e.g. "
                      f"fedjax_lama.config.base_config() or a config file's get_config()), got "
                      f"{type(c).__name__}")
  _check_known_fields(c, base_config())
  _one_of(c, "dataset", DATASETS)
  _check_options(c)
  if isinstance(c.seed, bool) or not isinstance(c.seed, int) or c.seed < 0:
    _fail("seed", c.seed, "an integer >= 0")
  if not isinstance(c.init_from, str):
    _fail("init_from", c.init_from, "'' (the model's own initialization) or a path: a run's "
          "workdir, one of its checkpoints/<step> directories, or an export file")
  _one_of(c, "dataset", DATASETS)
  _one_of(c, "data_source", DATA_SOURCES)
  _one_of(c, "partition", PARTITIONS)
  _one_of(c, "client_sampling", SAMPLINGS)
  _one_of(c, "weighting", WEIGHTINGS)
  _one_of(c, "local_lr_decay", LR_DECAYS)
  _one_of(c, "per_client_eval", ("final", "every", "never"))
  if c.engine.kernels not in KERNELS:
    _fail("engine.kernels", c.engine.kernels, ", ".join(map(repr, KERNELS)))
  client_map = c.engine.get("client_map", "auto")
  if client_map not in CLIENT_MAPS:
    _fail("engine.client_map", client_map, ", ".join(map(repr, CLIENT_MAPS)))
  for field in ("rounds", "batch_size", "num_clients", "eval_every", "checkpoint_every",
                "eval_batch_size"):
    _positive_int(c, field)
  _positive_int(c, "local_steps", allow_zero=c.local_epochs > 0)
  _positive_int(c, "local_epochs", allow_zero=True)
  _positive_int(c, "local_lr_warmup_steps", allow_zero=True)
  _positive_int(c, "min_client_size", allow_zero=True)
  if not isinstance(c.engine.clients_per_chunk, int) or c.engine.clients_per_chunk < 0:
    _fail("engine.clients_per_chunk", c.engine.clients_per_chunk, "an integer >= 0 (0: one chunk)")
  if not (0.0 < c.active_ratio <= 1.0):
    _fail("active_ratio", c.active_ratio, "a participation fraction in (0, 1]")
  if c.partition in ("dirichlet", "dirichlet_balanced") and not c.dirichlet_concentration > 0:
    _fail("dirichlet_concentration", c.dirichlet_concentration, "a Dirichlet alpha > 0")
  if c.partition in ("shards", "class_cyclic"):
    _positive_int(c, "classes_per_client")
  if num_classes is not None:
    check_classes_per_client(c.partition, c.classes_per_client, c.dataset, num_classes)
  if not (0.0 <= c.local_test_fraction < 1.0):
    _fail("local_test_fraction", c.local_test_fraction, "a fraction in [0, 1)")
  _positive_int(c, "finetune_steps", allow_zero=True)
  if c.finetune_lr is not None and not (math.isfinite(c.finetune_lr) and c.finetune_lr > 0):
    _fail("finetune_lr", c.finetune_lr, "a finite number > 0 or None (config.local_lr)")
  if c.finetune_steps > 0 and c.per_client_eval == "never":
    _fail("finetune_steps", c.finetune_steps,
          "0 while config.per_client_eval='never' (fine-tuning is part of the per-client "
          "evaluation)")
  if not isinstance(c.finetune_layers, str):
    _fail("finetune_layers", c.finetune_layers,
          "a string: '' (every layer) or comma-separated layer names")
  if c.finetune_layers.strip() and c.finetune_steps == 0:
    _fail("finetune_layers", c.finetune_layers,
          "'' while config.finetune_steps=0 (it names the layers fine-tuning moves)")
  if c.finetune_steps > 0 and c.local_test_fraction == 0 and c.partition != "femnist_writers":
    _fail("finetune_steps", c.finetune_steps,
          "0 without per-client test parts; set config.local_test_fraction > 0")
  if not (0.0 <= c.validation_fraction < 1.0):
    _fail("validation_fraction", c.validation_fraction, "a fraction in [0, 1)")
  for field in ("local_lr", "server_lr"):
    if field == "server_lr" and c[field] is None:
      continue  # the algorithm's default
    if not (isinstance(c[field], (int, float)) and math.isfinite(c[field]) and c[field] > 0):
      _fail(field, c[field], "a finite number > 0" + (
          " or None (the algorithm's default)" if field == "server_lr" else ""))
  if not 0.0 <= c.local_momentum < 1.0:
    _fail("local_momentum", c.local_momentum, "a momentum in [0, 1)")
  _one_of(c, "local_optimizer_state", ("reset", "carry"))
  _one_of(c, "augmentation", AUGMENTATIONS)
  _one_of(c, "normalization", ("none", "per_channel", "per_pixel"))
  if c.weight_decay < 0:
    _fail("weight_decay", c.weight_decay, "a number >= 0")
  growth = c.max_loss_growth
  if not (isinstance(growth, (int, float)) and not isinstance(growth, bool)
          and math.isfinite(growth) and (growth == 0 or growth > 1)):
    _fail("max_loss_growth", growth, "a finite number > 1 (a multiple of the starting training "
          "loss), or 0 to turn the check off")
  return method(c)


def check_classes_per_client(partition: str, classes_per_client: int, dataset: str,
                             num_classes: int) -> None:
  """The one check that needs the data: a label-sharding partition's classes per client are
  at most the dataset's classes."""
  if partition in ("shards", "class_cyclic") and classes_per_client > num_classes:
    _fail("classes_per_client", classes_per_client,
          f"at most the number of classes of {dataset!r} ({num_classes})")


# ---- fields set on the command line -------------------------------------------------------
# What each mode reads, declared once: a field set on the command line that only a mode
# not running reads has no effect and is refused. Paths name a field or a whole section.
MODE_FIELDS = {
    # Synchronous rounds: the registry's algorithms, round by round.
    "synchronous rounds": (
        "rounds", "local_steps", "eval_every", "per_client_eval", "tensorboard", "schedule",
        "finetune_steps", "finetune_lr", "finetune_layers",
        "weighting", "server_lr", "weight_decay", "local_lr_decay", "local_lr_warmup_steps",
        "local_lr_decay_steps", "local_lr_decay_factor", "validation_fraction", "compressor",
        "engine.clients_per_chunk", "engine.client_state_on_host", "robust", "trainable"),
    # A cohort drawn as a fraction of the clients (synchronous rounds, and FedAvg / FedProx
    # on the simulated clock); FedAT, TiFL, FedAsync and ASO-Fed set their own.
    "a cohort of config.active_ratio": ("client_sampling", "active_ratio"),
    # FedLAMA's layer-wise aggregation schedule (Lee et al. 2023).
    "the FedLAMA schedule": ("fedlama",),
    # The simulated clock: the system and the run's options there.
    "the simulated clock": ("system",),
}


def _active_modes(c) -> set:
  if runs_on_clock(c):
    modes = {"the simulated clock"}
    if c.algorithm in registry.CLOCK_SYNC:
      modes.add("a cohort of config.active_ratio")
    return modes
  modes = {"synchronous rounds", "a cohort of config.active_ratio"}
  if selection(c).schedule != "none":
    modes.add("the FedLAMA schedule")
  return modes


def _active_sections(c) -> set:
  """The algorithm sections config.<name> the run reads."""
  if runs_on_clock(c):  # FedProx there reads config.fedprox.mu, its own section
    return {c.algorithm}
  return {selection(c).base}


def _describe_run(c) -> str:
  how = f"config.algorithm={c.algorithm!r}"
  if runs_on_clock(c):
    if c.algorithm not in registry.CLOCK_METHODS:
      how += " with config.system.clock=True"
    return how + " (a run on the simulated clock)"
  if c.get("schedule", "none") != "none":
    how += f" with config.schedule={c.schedule!r}"
  return how


def _switched_off(c, path: str):
  """The switch that leaves `path` unread, if any: config.privacy.* is read only with
  privacy.enabled, config.privacy.adaptive.* only with privacy.adaptive.enabled too."""
  if not path.startswith("privacy.") or path == "privacy.enabled":
    return None
  if not c.privacy.enabled:
    return "privacy.enabled"
  if (path.startswith("privacy.adaptive.") and path != "privacy.adaptive.enabled"
      and not c.privacy.adaptive.enabled):
    return "privacy.adaptive.enabled"
  return None


def _robust_unread(c, path: str):
  """The refusal of a config.robust.* field that the run's defence and attack never read
  (their registrations declare what they read), or None."""
  if not path.startswith("robust.") or path in ("robust.defence", "robust.attack"):
    return None
  from fedjax_lama.robust import robust_stage  # pylint: disable=g-import-not-at-top
  defence, attack = c.robust.defence, c.robust.attack
  if defence not in robust_stage.DEFENCES or attack not in robust_stage.ATTACKS:
    return None  # validation names the unknown rule
  field = path.split(".")[1]
  if field in robust_stage.fields_read(defence, attack):
    return None
  readers = [f"defence={d!r}" for d in robust_stage.DEFENCES
             if field in robust_stage.fields_read(d, "none")]
  readers += [f"attack={a!r}" for a in robust_stage.ATTACKS
              if field in robust_stage.fields_read("none", a)]
  return (f"config.{path} has no effect with config.robust.defence={defence!r} and "
          f"config.robust.attack={attack!r}: it is read only with "
          f"{', '.join(readers) or 'no defence or attack'}; remove it or choose a defence "
          "or attack that reads it")


def check_overrides(c: ml_collections.ConfigDict, paths) -> None:
  """Refuses a field set on the command line (`paths`, e.g. "fedprox.mu") that the run
  described by `c` never reads, naming both the field and what makes it unread."""
  modes, sections = _active_modes(c), _active_sections(c)
  algorithm_sections = (set(registry.hparam_defaults()) | set(registry.CLOCK_METHODS)) - {
      "fedlama"}
  for path in paths:
    top = path.split(".")[0]
    if path in ("algorithm", "schedule", "system.clock"):
      continue
    unread = _robust_unread(c, path)
    if unread is not None:
      raise ConfigError(unread)
    switch = _switched_off(c, path)
    if switch is not None:
      raise ConfigError(f"config.{path} has no effect while config.{switch}=False; set "
                        f"--config.{switch}=True or remove it")
    if top in algorithm_sections and top not in sections:
      raise ConfigError(
          f"config.{path} has no effect with {_describe_run(c)}: config.{top}.* is read only "
          f"when config.algorithm={top!r} runs; remove it or choose a run that reads it")
    for mode, fields in MODE_FIELDS.items():
      if mode not in modes and any(path == f or path.startswith(f + ".") for f in fields):
        raise ConfigError(
            f"config.{path} has no effect with {_describe_run(c)}: it is read only by "
            f"{mode}; remove it or choose a run that reads it")


# ---- the config read, typed: what the registry and the simulated clock take -------------------
class Method(NamedTuple):
  """What config.algorithm runs, read once at validation: a synchronous algorithm's options
  (the registry builds it once the federation is known) and what the run takes beside it, or
  a run on the simulated clock."""
  algorithm: Optional[registry.AlgorithmOptions]   # None on the simulated clock
  resolved: Optional[registry.Resolved]            # its compressor and run facts
  clock: Optional[run_options.ClockOptions]        # None in synchronous rounds
  trainable: str = ""                              # the trainable set (`trainable_names`)


def method(c) -> Method:
  """config.algorithm and every field it reads, typed and checked (no data needed)."""
  if runs_on_clock(c):
    return Method(None, None, clock_options(c))
  trainable = trainable_names(c)
  options = algorithm_options(c)
  return Method(options, registry.resolve(options), None, trainable)


def typed_values(cls, values: dict, path: str, prefix: Optional[str] = None):
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


def _section(c, name: str) -> dict:
  section = c.get(name)
  if isinstance(section, ml_collections.ConfigDict):
    return section.to_dict()
  return dict(section or {})


def runs_on_clock(c) -> bool:
  """Whether the config asks for a run on the simulated clock."""
  system = c.get("system")
  clock = bool(system.get("clock", False)) if system is not None else False
  return c.algorithm in registry.CLOCK_METHODS or clock


def selection(c) -> registry.Selection:
  """config.algorithm and config.schedule resolved (config.fedlama typed where read)."""
  name, schedule = c.algorithm, c.get("schedule", "none")
  if schedule not in registry.SCHEDULES:
    _fail("schedule", schedule, ", ".join(map(repr, registry.SCHEDULES)))
  if name not in registry.names():
    _fail("algorithm", name, ", ".join(map(repr, registry.names())))
  if name in registry.CLOCK_METHODS and schedule != "none":
    raise ConfigError(f"config.schedule={schedule!r} is not accepted with config.algorithm="
                      f"{name!r} (a method on the simulated clock); accepted: 'none'")
  fedlama = None
  if name not in registry.CLOCK_METHODS and fedlama_options.NAME in (name, schedule):
    fedlama = typed_values(fedlama_options.FedLamaOptions,
                                    _section(c, fedlama_options.NAME), fedlama_options.NAME)
  return registry.select(name, schedule, fedlama)


def algorithm_options(c) -> registry.AlgorithmOptions:
  """The synchronous algorithm the config asks for: its selection, config.<base> as its
  Hparams, the shared fields as `Common` and config.compressor; ConfigErrors name the field."""
  chosen = selection(c)
  spec = registry.SPECS.get(chosen.base)
  hparams = None
  if spec is not None:  # (a method of the simulated clock has no section here)
    hparams = typed_values(spec.hparams, _section(c, spec.name), spec.name)
  server_lr = c.get("server_lr")
  try:
    shared = common.Common(local_momentum=float(c.local_momentum),
                           weight_decay=float(c.weight_decay),
                           server_lr=None if server_lr is None else float(server_lr))
  except common.HparamError as e:
    raise ConfigError(f"config.{e}") from e
  compressor = c.compressor
  return registry.AlgorithmOptions(
      name=c.algorithm, selection=chosen, hparams=hparams, common=shared,
      local_optimizer_state=c.get("local_optimizer_state", "reset"),
      compressor=registry.CompressorOptions(compressor.name, compressor.levels,
                                            compressor.block))


# Runs on the simulated clock (FedAT, Chai et al. 2021): config.system and config.<method>.
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
  for name in registry.CLOCK_METHODS:
    sections[name] = _dataclass_section(run_options.METHOD_CONFIGS[name])
  return sections


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
  if name not in registry.CLOCK_METHODS + registry.CLOCK_SYNC:
    accepted = ", ".join(map(repr, registry.CLOCK_SYNC + registry.CLOCK_METHODS))
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
    nested[field] = typed_values(cls, given, f"system.{field}", prefix="system")
  top = {k: config[k] for k in _SYSTEM_FROM_TOP}
  if not isinstance(top["seed"], int) or top["seed"] < 0:
    raise ConfigError(f"config.seed={top['seed']!r} is not accepted on the simulated clock; "
                      "accepted: an integer >= 0")
  allowed = {f.name for f in dataclasses.fields(sim_config.SystemConfig)} - set(top)
  unknown = sorted(set(values) - allowed)
  if unknown:
    raise ConfigError(f"config.system.{unknown[0]} is not a field; accepted: "
                      f"{', '.join(sorted(allowed | set(_SYSTEM_EXTRAS)))}")
  return typed_values(sim_config.SystemConfig, {**values, **nested, **top}, "system")


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
  if name in registry.CLOCK_METHODS:
    return typed_values(run_options.METHOD_CONFIGS[name], _section(config, name), name)
  if config.client_sampling != "fixed":
    raise ConfigError(f"config.client_sampling={config.client_sampling!r} is not accepted on the "
                      "simulated clock; accepted: 'fixed' (round(active_ratio * num_clients) "
                      "clients per round)")
  cohort = max(1, int(round(config.active_ratio * config.num_clients)))
  fields = {"clients_per_round": cohort,
            "compression_precision": extras["baseline_compression_precision"]}
  if name == "fedprox":
    hparams = typed_values(registry.SPECS["fedprox"].hparams,
                                    _section(config, "fedprox"), "fedprox")
    fields.update(mu=float(hparams.mu),
                  variable_epochs=extras["fedprox_variable_epochs"])
  try:
    return run_options.METHOD_CONFIGS[name](**fields)
  except ValueError as e:  # the only field a user sets here is the precision
    raise ConfigError(f"config.system.baseline_{e}") from e
