"""The training loop: the only reader of a config, and the only loop.

`train_and_evaluate(config, workdir)` builds the federation, the model and the
algorithm's round program, then runs rounds with evaluation, metrics, plots,
communication accounting and orbax checkpoints. Running it again on the same
workdir resumes from the last checkpoint; the resumed run ends with exactly
the parameters and metrics of an uninterrupted one, because everything not in a
checkpoint (cohorts, batches, keys) is derived from (seed, round). Running it with a
larger config.rounds extends a finished run to what an uninterrupted run of that
length gives.

Every input is checked before any data is loaded where it can be: the config's fields,
then the workdir (a directory that can be written, or a path where one can be made),
then the config against the run already in the workdir. Nothing in a workdir is
removed or overwritten by a run that stops on an error.
"""
import copy
import dataclasses
import errno
import json
import os
import shutil
import tempfile
import time
from typing import Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_lama import checkpointing, comm, divergence, errors, federation, metrics, models
from fedjax_lama import plots, progress, rng
from fedjax_lama import config as config_lib
from fedjax_lama import data as fdata
from fedjax_lama import registry
from fedjax_lama.data import augment
from fedjax_lama.engine import evaluate as evaluation
from fedjax_lama.engine import local
from fedjax_lama.engine import plan as plan_lib
from fedjax_lama.engine import sharding
from fedjax_lama.errors import TrainingError, WorkdirError
from fedjax_lama.fedlama.schedule import FedLamaProgram
from fedjax_lama.programs.round_program import LrSchedule, RunOptions
from fedjax_lama.programs.sync import SyncProgram

# Fields that may change between a run and its resumption without changing results.
RESUMABLE_CHANGES = ("checkpoint_every", "plots", "data_dir", "per_client_eval", "tensorboard")


class DivergenceError(errors.TrainingDiverged):
  """A training loss, evaluation metric or parameter became non-finite: the run stops.
  Deterministic: resuming the same config diverges again at the same round."""


def _server_lr_text(config) -> str:
  """config.server_lr as the user reads it: None is the algorithm's own default rate."""
  return "the algorithm's default" if config.server_lr is None else str(config.server_lr)


def _config_dict(config) -> dict:
  return json.loads(config.to_json_best_effort(sort_keys=True))


# Free bytes below which a workdir's filesystem counts as full (a checkpoint of the
# smallest model needs more).
MIN_FREE_BYTES = 1 << 20


def check_workdir_usable(workdir) -> None:
  """Refuses a workdir that cannot hold a run, before any data is loaded: not a string,
  empty, a file, under a file, unwritable, or on a full filesystem. Writes nothing that
  stays: a workdir that does not exist yet is made only once every check passed."""
  if not isinstance(workdir, (str, os.PathLike)):
    raise WorkdirError(f"workdir={workdir!r} is not accepted; accepted: a directory path")
  workdir = os.fspath(workdir)
  if not workdir.strip():
    raise WorkdirError("workdir is empty (--workdir=); accepted: a directory path")
  probe_dir = os.path.abspath(workdir)
  while not os.path.exists(probe_dir):  # the directory that would hold the new workdir
    parent = os.path.dirname(probe_dir)
    if parent == probe_dir:
      break
    probe_dir = parent
  if not os.path.isdir(probe_dir):
    what = "is a file" if probe_dir == os.path.abspath(workdir) else f"is under a file ({probe_dir})"
    raise WorkdirError(f"workdir {workdir} {what}; accepted: a directory, or a path where one "
                       "can be made")
  try:  # os.access answers for the user, not for the filesystem (read-only mounts, quotas)
    with tempfile.NamedTemporaryFile(dir=probe_dir, prefix=".fedjax_lama_probe_") as f:
      f.write(b"\0" * 4096)
      f.flush()
      os.fsync(f.fileno())
  except OSError as e:
    why = "the filesystem is full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
    raise WorkdirError(f"workdir {workdir} cannot be written ({probe_dir}: {why}); accepted: a "
                       "writable directory") from e
  free = shutil.disk_usage(probe_dir).free
  if free < MIN_FREE_BYTES:
    raise WorkdirError(f"workdir {workdir}: the filesystem of {probe_dir} is full ({free} bytes "
                       "free); free some space or use another --workdir")


def _read_workdir_config(workdir: str) -> Optional[dict]:
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise config_lib.ConfigError(f"{path} is not valid JSON ({e}); move it away or use a new "
                                 "--workdir") from e
  except OSError as e:
    raise WorkdirError(f"{path} cannot be read ({e.strerror})") from e


_ABSENT = object()


def _changed(old: dict, new: dict, defaults: dict, key: str) -> bool:
  """Whether field `key` differs between a workdir's config and this one. A field or a
  section added to the config after the run started (config.system, a new option of an
  algorithm's section) is no change while it keeps its default."""
  a, b = old.get(key, _ABSENT), new.get(key, _ABSENT)
  if a is _ABSENT:
    return b != defaults.get(key, _ABSENT)
  if isinstance(a, dict) and isinstance(b, dict):
    inner = defaults.get(key) if isinstance(defaults.get(key), dict) else {}
    return any(_changed(a, b, inner, k) for k in set(a) | set(b))
  return a != b


def check_workdir(workdir: str, config) -> Optional[int]:
  """Refuses to mix runs: an existing config.json must match (RESUMABLE_CHANGES aside).

  A larger config.rounds extends the run in the workdir (see `check_extension`); returns
  the rounds of the run being extended, else None.
  """
  old = _read_workdir_config(workdir)
  if old is None:
    return None
  new = _config_dict(config)
  defaults = _config_dict(config_lib.base_config())
  diff = sorted(k for k in set(old) | set(new)
                if k not in RESUMABLE_CHANGES and _changed(old, new, defaults, k))
  extended = None
  if diff == ["rounds"] and isinstance(old.get("rounds"), int) and new["rounds"] > old["rounds"]:
    check_extension(config, old["rounds"])
    extended, diff = old["rounds"], []
  if diff:
    raise config_lib.ConfigError(
        f"--workdir={workdir} holds a run with a different config (fields: "
        f"{', '.join(diff)}); use a new --workdir, the same config to "
        "resume, or a larger config.rounds alone to extend it")
  return extended


def check_extension(config, old_rounds: int) -> None:
  """A run of `old_rounds` extended to config.rounds equals an uninterrupted run of
  config.rounds only where nothing depends on the total: refuses the others, naming why."""
  def refuse(why):
    raise config_lib.ConfigError(
        f"config.rounds={config.rounds} cannot extend the run of {old_rounds} rounds in this "
        f"workdir: {why}; use a new --workdir")
  if registry.runs_on_clock(config):
    refuse("runs on the simulated clock have no rounds")
  if config.local_lr_schedule == "cosine":
    refuse("config.local_lr_schedule='cosine' decays over the total number of local steps")
  if registry.select(config).fedlama is not None and config.fedlama.get("total_steps"):
    refuse(f"config.fedlama.total_steps={config.fedlama.total_steps} sets the run's length")
  if old_rounds % config.eval_every:
    refuse(f"its last round ({old_rounds}) is not a multiple of config.eval_every="
           f"{config.eval_every}, so its final evaluation restarted the training-loss average "
           "that an uninterrupted run carries on")


# What each model consumes (fedjax_lama.data.INPUT_KINDS); the others take images only.
_MODEL_INPUTS = {
    "logreg": (fdata.INPUT_BOW_COUNTS, fdata.INPUT_BOW_TOKENS),
    "lstm_lm": (fdata.INPUT_TOKENS,),
    "mlp": (fdata.INPUT_IMAGE, fdata.INPUT_BOW_COUNTS),
}
# Partitions that read one class label per example.
_LABEL_PARTITIONS = ("dirichlet", "dirichlet_balanced", "shards", "class_cyclic", "one_class")


def _model_inputs(model: str) -> tuple:
  return _MODEL_INPUTS.get(model, (fdata.INPUT_IMAGE,))


def _load_dataset(config, data_dir: str) -> "fdata.Dataset":
  """`load_dataset` with config.dataset_options, checked against the model and partition.

  Bad options and model/dataset mismatches raise ConfigError naming the fields;
  next-token padding targets become local.PAD_TARGET (see `_pad_targets`).
  """
  opts = config.get("dataset_options")
  options = opts.to_dict() if isinstance(opts, ml_collections.ConfigDict) else dict(opts or {})
  try:
    dataset = fdata.load_dataset(config.dataset, data_dir=data_dir, source=config.data_source,
                                 options=options or None)
  except (fdata.DataError, config_lib.ConfigError):
    raise
  except ValueError as e:  # unknown option or bad value: a config problem, not a file problem
    raise config_lib.ConfigError(
        f"config.dataset={config.dataset!r}, config.data_source={config.data_source!r}, "
        f"config.dataset_options={options!r}: {e}") from e
  _check_model_and_partition(config, dataset)
  return _pad_targets(dataset)


def _check_model_and_partition(config, dataset) -> None:
  kind = dataset.input_kind
  if kind not in _model_inputs(config.model):
    fits = [m for m in models.names() if kind in _model_inputs(m)]
    raise config_lib.ConfigError(
        f"config.model={config.model!r} takes {'/'.join(_model_inputs(config.model))} inputs, but "
        f"config.dataset={config.dataset!r} gives {kind!r} inputs of shape "
        f"{np.shape(dataset.train_x)[1:]} per example; accepted for this dataset: config.model in "
        f"{', '.join(repr(m) for m in fits)}")
  if np.ndim(dataset.train_y) != 1 and config.partition in _LABEL_PARTITIONS:
    raise config_lib.ConfigError(
        f"config.partition={config.partition!r} needs one class label per example, but "
        f"config.dataset={config.dataset!r} has next-token targets of shape "
        f"{np.shape(dataset.train_y)[1:]} per example; accepted: 'natural', 'iid'")


def _pad_targets(dataset) -> "fdata.Dataset":
  """Next-token targets equal to dataset.pad_id (Reddit's <PAD> 0) -> local.PAD_TARGET.

  The engine treats targets < 0 as padding (local.make_loss_fn, evaluate), so
  the jitted programs need no per-dataset pad id. Inputs are left as they are:
  <PAD> stays a token the model embeds.
  """
  pad = dataset.pad_id
  if np.ndim(dataset.train_y) != 2 or pad is None or pad < 0:
    return dataset
  remap = lambda y: np.where(y == pad, local.PAD_TARGET, y).astype(np.int32)
  return dataclasses.replace(dataset, train_y=remap(dataset.train_y),
                             test_y=remap(dataset.test_y))


def _dataset_vocab_size(model: str, dataset) -> Optional[int]:
  """The vocabulary size `model` must be built with for `dataset`, or None if none applies."""
  if model == "lstm_lm":
    return int(dataset.num_classes)  # token ids and next-token classes share one vocabulary
  if model == "logreg" and dataset.input_kind == fdata.INPUT_BOW_COUNTS:
    return int(np.shape(dataset.train_x)[1])
  if model == "logreg" and dataset.input_kind == fdata.INPUT_BOW_TOKENS:
    return int(dataset.info.get("vocab_size") or len(dataset.vocab))
  return None


def _model_options(config, dataset) -> dict:
  """config.model_options, with the vocabulary size taken from the dataset when unset."""
  options = dict(config.model_options.to_dict()) if config.model_options else {}
  vocab = _dataset_vocab_size(config.model, dataset)
  if vocab is not None:
    given = options.setdefault("vocab_size", vocab)
    if given != vocab:
      how = (" (set by config.dataset_options.vocab_size)"
             if "vocab_size" in fdata.DATASET_OPTIONS.get(config.dataset, {}) else "")
      raise config_lib.ConfigError(
          f"config.model_options.vocab_size={given!r} is not accepted for config.model="
          f"{config.model!r} on config.dataset={config.dataset!r}; accepted: {vocab}, the "
          f"dataset's vocabulary{how}, or leave it unset")
  # The layers' plan (convolutions, the MLPs' dense layers), the platform plan's kernel set;
  # logreg and lstm_lm ignore it.
  options.setdefault("conv_impl", platform_plan(config).kernels)
  return options


def _build_model(config, dataset):
  if config.model not in models.names():
    raise config_lib.ConfigError(f"config.model={config.model!r} is not accepted; accepted: "
                                 f"{', '.join(map(repr, models.names()))}")
  options = _model_options(config, dataset)
  try:
    model = models.get(config.model, num_classes=dataset.num_classes, **options)
  except ValueError as e:  # options of another model left in config.model_options, bad values
    given = {k: v for k, v in options.items() if k != "conv_impl"}
    raise config_lib.ConfigError(
        f"config.model_options={given!r} is not accepted for config.model={config.model!r}: "
        f"{e}. Accepted options of {config.model!r} (defaults): "
        f"{models.options(config.model)}; remove the others from config.model_options "
        f"(e.g. use a config written for {config.model!r})") from e
  sample = jnp.asarray(dataset.train_x[:1])
  variables = model.init({"params": rng.root_key(config.seed), "dropout": rng.root_key(config.seed)},
                         sample, train=False)
  params = variables["params"]
  model_state = variables.get("batch_stats", {})
  return model, params, model_state


def partition_spec(config) -> federation.PartitionSpec:
  return federation.PartitionSpec(
      name=config.partition, num_clients=config.num_clients, seed=config.seed,
      dirichlet_concentration=config.dirichlet_concentration,
      min_client_size=config.min_client_size, classes_per_client=config.classes_per_client,
      femnist_num_writers=config.femnist_num_writers,
      femnist_writers_per_client=config.femnist_writers_per_client,
      local_test_fraction=config.local_test_fraction, dataset_name=config.dataset)


def run_options(config, fed) -> RunOptions:
  """The typed options every round program takes (programs/round_program.py)."""
  return RunOptions(
      seed=config.seed, rounds=config.rounds, local_steps=config.local_steps,
      local_epochs=config.local_epochs, batch_size=config.batch_size, weighting=config.weighting,
      eval_every=config.eval_every,
      lr=LrSchedule(float(config.local_lr), config.local_lr_schedule,
                    config.local_lr_warmup_steps, tuple(config.local_lr_decay_steps),
                    float(config.local_lr_decay_factor)),
      sampler=federation.Sampler(config.client_sampling, float(config.active_ratio),
                                 fed.num_clients, config.seed),
      label_smoothing=config.label_smoothing, unroll=config.engine.unroll,
      clients_per_chunk=config.engine.clients_per_chunk,
      client_state_on_host=_on_host(config),
      augment=augment.augmentation(config.augmentation, fed.dataset),
      platform=platform_plan(config), **registry.run_facts(config))


def platform_plan(config) -> plan_lib.PlatformPlan:
  """The engine's plan for JAX's default backend, from config.engine.conv_impl and
  config.engine.client_map (built here once; the programs only read it)."""
  return plan_lib.plan(conv_impl=config.engine.conv_impl,
                           client_map=config.engine.get("client_map", "auto"))


def _on_host(config) -> bool:
  on_host = config.engine.get("client_state_on_host", False)
  if not isinstance(on_host, bool):
    raise config_lib.ConfigError(f"config.engine.client_state_on_host={on_host!r} is not "
                                 "accepted; accepted: True or False")
  return on_host


def build_program(config, model, params, model_state, fed, mesh):
  """The round program of config.algorithm (and config.schedule) on this federation."""
  selection = registry.select(config)
  algorithm = registry.build_algorithm(config, fed.num_clients,
                                       float(np.mean(fed.client_sizes)))
  compressor = registry.uplink_compressor(config, algorithm)
  opts = run_options(config, fed)
  if selection.fedlama is not None:
    return FedLamaProgram(opts, selection.fedlama, algorithm, model, params, model_state, fed,
                          mesh, compressor)
  return SyncProgram(opts, algorithm, model, params, model_state, fed, mesh, compressor)


def _client_mesh(config, fed, model, params, model_state, cohort=None):
  """The devices the run's clients are split over (`sharding.client_devices`, which on CPU
  weighs the model's size, one local step's values and `cohort`, the clients of a call)."""
  batch = lambda a, dtype: jax.ShapeDtypeStruct((config.batch_size,) + a.shape[1:], dtype)
  x = batch(fed.dataset.train_x, fed.dataset.train_x.dtype)
  y = batch(fed.dataset.train_y, jnp.int32)  # as the programs place them
  loss_fn = local.make_loss_fn(model, bool(jax.tree_util.tree_leaves(model_state)))
  step_bytes = local.step_bytes(loss_fn, params, model_state, x, y)
  return sharding.client_mesh(sharding.client_devices(params, step_bytes, cohort))


def _chunk_cap(config, fed) -> int:
  """Clients of one training call of a synchronous run (SyncProgram's chunk before padding)."""
  opts = run_options(config, fed)
  return opts.clients_per_chunk or opts.sampler.max_cohort


def _build_federation(config, dataset) -> federation.Federation:
  """The clients of config.partition; a split the data cannot give names the fields."""
  try:
    return federation.build_federation(partition_spec(config), dataset)
  except ValueError as e:
    if isinstance(e, (config_lib.ConfigError, fdata.DataError)):
      raise
    raise config_lib.ConfigError(
        f"config.partition={config.partition!r} with config.num_clients={config.num_clients!r} "
        f"on config.dataset={config.dataset!r} ({len(dataset.train_y)} training examples): "
        f"{e}") from e


def _prepare(config):
  """Data, federation, model of a validated config: (fed, model, params, model_state)."""
  data_dir = federation.resolve_data_dir(config.data_dir)
  with progress.Phase(f"loading data: {config.dataset} from {data_dir}"):
    dataset = _load_dataset(config, data_dir)
  config_lib.validate(config, num_classes=dataset.num_classes)
  validation = None
  with progress.Phase(f"partitioning into {config.num_clients} clients ({config.partition})"):
    if config.validation_fraction > 0:  # held out before partitioning and normalisation
      dataset, validation = fdata.split_validation(dataset, config.validation_fraction,
                                                   config.seed)
    dataset, validation = augment.normalize_dataset(dataset, config.normalization, validation)
    fed = dataclasses.replace(_build_federation(config, dataset), validation=validation)
  with progress.Phase(f"building the model ({config.model})"):
    model, params, model_state = _build_model(config, dataset)
  return fed, model, params, model_state


class _Run:
  """One run's workdir: config.json, metrics.jsonl (and TensorBoard events), orbax
  checkpoints, the communication ledger and the host counters.

  `program` is the run's round program, or a view of one run of a vectorized program: it
  answers eval_fn, eval_params(state), local_steps_done(r), num_rounds, eval_every,
  host_state(), load_host_state(d), summary(state, ledger) and plot(workdir, ledger).
  """

  def __init__(self, config, workdir: str, program, fed, params):
    self.config, self.workdir, self.program, self.fed = config, workdir, program, fed
    self.primary = jax.process_index() == 0  # multi-host: one writer of the plain files
    try:
      os.makedirs(workdir, exist_ok=True)
    except OSError as e:
      raise WorkdirError(f"workdir {workdir} cannot be made ({e.strerror})") from e
    config_path = os.path.join(workdir, "config.json")
    if self.primary and not os.path.exists(config_path):
      metrics.write_json(config_path, _config_dict(config))
    self.ledger = comm.Ledger(*comm.layer_table(params))
    self.writer = metrics.JsonlWriter(os.path.join(workdir, "metrics.jsonl"))
    self.ckpt_dir = os.path.join(workdir, "checkpoints")
    self.ckpt = checkpointing.Checkpointer(self.ckpt_dir)
    self.start_round, self.wall_offset = 0, 0.0
    self.host = {"best_test_accuracy": None, "loss_sum": 0.0, "loss_count": 0.0}
    self.records, self.tensorboard = [], None

  def restore(self, state, extended_from: Optional[int] = None):
    """The state to continue from: the latest checkpoint's, else `state` (a fresh start).

    extended_from: the rounds of the finished run that config.rounds now extends; the
    final round's extra records are dropped so that the records equal an uninterrupted run's.
    """
    latest = self.ckpt.latest_step()
    if latest is not None:
      with progress.Phase(f"restoring the checkpoint of round {latest + 1} from {self.workdir}"):
        state, meta = self.ckpt.restore(latest, state)
      self.start_round = meta["round"] + 1
      self.wall_offset = meta["wall_seconds"]
      self.ledger.load(meta["ledger"])
      self.host = meta["host"]
      self.program.load_host_state(meta.get("program", {}))
      self.records = _records_up_to(self.writer, meta["round"] + 1, self.primary)
      if extended_from is not None:
        self._forget_final_evaluation(extended_from)
        progress.info("extending the run of %d rounds in %s to %d rounds", extended_from,
                      self.workdir, self.config.rounds)
      progress.info("resuming after round %d of %d", meta["round"] + 1, self.program.num_rounds)
    else:
      self.records = _records_up_to(self.writer, -1, self.primary)
    if self.primary and self.config.tensorboard:
      self.tensorboard = metrics.TensorBoardWriter(
          os.path.join(self.workdir, "tensorboard"),
          purge_step=metrics.resume_purge_step(self.records) if latest is not None else None)
    self.t_start = time.perf_counter()
    self.train_seconds, self.eval_seconds, self.first_round_seconds = 0.0, None, 0.0
    return state

  def _forget_final_evaluation(self, old_rounds: int) -> None:
    """The per-client evaluation of a run's last round (config.per_client_eval="final") is
    no longer the last one once the run goes on: its record loses those fields."""
    if self.config.per_client_eval != "final" or not self.records:
      return
    last = self.records[-1]
    if last["round"] != old_rounds or not any(k.startswith("client_") for k in last):
      return
    self.records[-1] = {k: v for k, v in last.items() if not k.startswith("client_")}
    if self.primary:  # the records were read back from this file: plain JSON values
      tmp = self.writer.path + ".tmp"
      with open(tmp, "w") as f:
        f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in self.records)
      os.replace(tmp, self.writer.path)  # atomic, as every rewrite of the records

  def wall(self) -> float:
    return self.wall_offset + time.perf_counter() - self.t_start

  def _evaluations_after(self, round_idx: int) -> int:
    """Evaluations still to come after round `round_idx` (the last round always evaluates)."""
    program = self.program
    total = program.num_rounds
    regular = sum(1 for r in range(round_idx + 1, total) if (r + 1) % program.eval_every == 0)
    return regular + (0 if total % program.eval_every == 0 or round_idx >= total - 1 else 1)

  def before_round(self, round_idx: int) -> None:
    if round_idx == self.start_round:
      progress.info("round %d/%d: compiling the round program, then training (the first "
                    "round of a process includes the one-time compilation)", round_idx + 1,
                    self.program.num_rounds)
    self.round_started = time.perf_counter()

  def _diverged(self, where: str, quantities: dict, state) -> None:
    """Stops the run when a quantity or the global model is not finite (before any checkpoint
    of this round is written, so every checkpoint on disk is finite)."""
    def rerun():
      latest = self.ckpt.latest_step()
      return divergence.rerun_statement(None if latest is None else f"round {latest + 1}",
                                        self.ckpt_dir)

    divergence.check(
        where, quantities, self.program.eval_params(state), rerun,
        f"try a smaller config.local_lr (now {self.config.local_lr}) or config.server_lr "
        f"(now {_server_lr_text(self.config)})", error=DivergenceError)

  def after_round(self, state, round_idx: int, out) -> None:
    """Accounting, divergence checks, evaluation and checkpoint of a finished round."""
    config, program = self.config, self.program
    seconds = time.perf_counter() - self.round_started
    self.train_seconds += seconds
    if round_idx == self.start_round:
      self.first_round_seconds = seconds
      progress.info("round %d/%d: trained in %.1fs (compilation included)", round_idx + 1,
                    program.num_rounds, seconds)
    self._diverged(f"round {round_idx + 1}", {"train_loss": out.train_loss}, state)
    self.ledger.add(out.floats_up_per_layer, out.floats_down_per_layer, out.bytes, out.bits_up,
                    out.floats_up_other, out.floats_down_other)
    self.host["loss_sum"] += out.train_loss * out.train_count
    self.host["loss_count"] += out.train_count
    total = program.num_rounds
    last = round_idx == total - 1
    if (round_idx + 1) % program.eval_every == 0 or last:
      per_client = (config.per_client_eval == "every" or
                    (last and config.per_client_eval == "final"))
      first = self.eval_seconds is None
      progress.info("round %d/%d: evaluating%s%s", round_idx + 1, total,
                    " (the first evaluation compiles)" if first else "",
                    ", with per-client accuracy" if per_client else "")
      started = time.perf_counter()
      record = _evaluate(config, program, state, self.fed, round_idx, out, self.host,
                         self.ledger, self.wall(), per_client=per_client)
      self.eval_seconds = time.perf_counter() - started
      self._diverged(f"round {round_idx + 1}",
                     {k: record.get(k) for k in ("test_loss", "test_accuracy", "val_loss",
                                                 "val_accuracy")}, state)
      self.records.append(record)
      if self.primary:
        self.writer.write(record)
        if self.tensorboard is not None:
          self.tensorboard.write(record)
      done = round_idx + 1 - self.start_round
      # The rate of the rounds after the first: the first one's compilation does not recur.
      trained = (self.train_seconds - self.first_round_seconds, done - 1) if done > 1 else (
          self.train_seconds, done)
      eta = progress.eta_seconds(*trained, total - round_idx - 1, self.eval_seconds,
                                 self._evaluations_after(round_idx))
      progress.info("round %d/%d  test_acc %.4f  test_loss %.4f  train_loss %.4f  %.1fs  "
                    "ETA %.1fs", round_idx + 1, total, record["test_accuracy"],
                    record["test_loss"], record["train_loss"], record["wall_seconds"], eta)
    if (round_idx + 1) % config.checkpoint_every == 0 or last:
      self.ckpt.save(round_idx, state, {"round": round_idx, "wall_seconds": self.wall(),
                                        "ledger": self.ledger.dump(), "host": self.host,
                                        "program": program.host_state()})

  def close(self) -> None:
    self.ckpt.close()
    if self.tensorboard is not None:
      self.tensorboard.close()

  def finish(self, state) -> dict:
    """summary.json and the plots of a completed run."""
    summary = _summary(self.config, self.records, self.ledger, self.program, state, self.wall())
    if self.primary:
      with progress.Phase(f"writing {os.path.join(self.workdir, 'summary.json')}"):
        metrics.write_json(os.path.join(self.workdir, "summary.json"), summary)
    if self.primary and self.config.plots:
      with progress.Phase(f"writing plots to {self.workdir}"):
        schedule = self.config.get("schedule", "none")
        method = self.config.algorithm + ("" if schedule == "none" else f" + {schedule}")
        plots.run_plots(self.workdir, self.records, title=f"{method} / {self.config.dataset}")
        self.program.plot(self.workdir, self.ledger)
    return summary


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       stop_after_round: Optional[int] = None) -> dict:
  """Runs (or resumes) the experiment described by `config`, writing into `workdir`.

  stop_after_round: stop after that round as if interrupted (used to test resume).
  Returns the summary dict (also written to workdir/summary.json).
  """
  if not isinstance(config, ml_collections.ConfigDict):
    raise config_lib.ConfigError(
        f"config must be an ml_collections.ConfigDict (fedjax_lama.config.base_config() or a "
        f"config file's get_config()), got {type(config).__name__}")
  config = copy.deepcopy(config)
  config_lib.validate(config)
  check_workdir_usable(workdir)
  workdir = os.fspath(workdir)
  if registry.runs_on_clock(config):  # FedAT (Chai et al. 2021) and its baselines
    check_workdir(workdir, config)
    return _train_on_clock(config, workdir, stop_after_tick=stop_after_round)
  check_workdir(workdir, config)  # before data: a mismatched workdir is refused at once
  fed, model, params, model_state = _prepare(config)
  with progress.Phase(f"building the {config.algorithm} round program"):
    program = build_program(config, model, params, model_state, fed,
                            _client_mesh(config, fed, model, params, model_state,
                                         _chunk_cap(config, fed)))
  extended = check_workdir(workdir, config)  # every check passes before the workdir is written
  run = _Run(config, workdir, program, fed, params)
  state = run.restore(program.init_state(), extended_from=extended)
  try:
    for round_idx in range(run.start_round, program.num_rounds):
      run.before_round(round_idx)
      state, out = program.run_round(state, round_idx)
      run.after_round(state, round_idx, out)
      if stop_after_round is not None and round_idx >= stop_after_round:
        return {"interrupted_after_round": round_idx}
  finally:
    run.close()
  return run.finish(state)


# Fields vectorized runs may differ in (programs/vectorized.py); the rest must be equal.
VECTORIZABLE_FIELDS = ("seed", "local_lr")


def _vectorizable(configs) -> bool:
  """Runs of one synchronous config differing only in seed and local_lr (and where it lands)."""
  if len(configs) < 2 or any(registry.runs_on_clock(c) for c in configs):
    return False
  if any(registry.select(c).schedule != "none" for c in configs):
    return False
  ignore = set(VECTORIZABLE_FIELDS) | set(RESUMABLE_CHANGES)
  first = {k: v for k, v in _config_dict(configs[0]).items() if k not in ignore}
  return all({k: v for k, v in _config_dict(c).items() if k not in ignore} == first
             for c in configs[1:])


class _RunView:
  """One run of a vectorized program, as the run loop sees a program."""

  def __init__(self, program, index: int):
    self.vec, self.index, self.mesh = program, index, program.mesh
    self.eval_fn, self.num_rounds, self.eval_every = (program.eval_fn, program.num_rounds,
                                                      program.eval_every)

  def eval_params(self, state):
    return self.vec.eval_params(state)

  def local_steps_done(self, round_idx: int) -> int:
    return self.vec.local_steps_done(round_idx)

  def host_state(self) -> dict:
    return {}

  def load_host_state(self, d: dict) -> None:
    del d

  def summary(self, state, ledger) -> dict:
    del state, ledger
    return {"vectorized_runs": self.vec.num_runs}

  def plot(self, workdir, ledger) -> None:
    del workdir, ledger


def _one_after_another(configs, workdirs) -> list:
  outcomes = []
  for c, w in zip(configs, workdirs):
    try:
      outcomes.append(train_and_evaluate(c, w))
    except DivergenceError as e:
      outcomes.append(e)
  return outcomes


def train_many(configs, workdirs) -> list:
  """Several runs, each written to its own workdir exactly as train_and_evaluate writes it.

  Runs of one synchronous config that differ only in seed and local_lr (a paper's seeds and
  learning-rate grid) train together as ONE jitted computation per round, with a run axis
  beside the client axis (programs/vectorized.py); they resume together when every workdir
  stopped at the same round. Any other set of runs, or workdirs at different rounds, runs
  one after another. A run that diverges is returned as its DivergenceError, in its place;
  the others go on.
  """
  from fedjax_lama.programs.vectorized import VectorizedSyncProgram  # pylint: disable=g-import-not-at-top
  configs = [copy.deepcopy(c) for c in configs]
  for c, w in zip(configs, workdirs):
    config_lib.validate(c)
    check_workdir_usable(w)
  if not _vectorizable(configs):
    return _one_after_another(configs, workdirs)
  prepared = [_prepare(c) for c in configs]
  mesh = _client_mesh(configs[0], *prepared[0], _chunk_cap(configs[0], prepared[0][0]))
  programs = [build_program(c, *p[1:], p[0], mesh) for c, p in zip(configs, prepared)]
  if any(type(p).__name__ != "SyncProgram" or p.chunk_size < p.opts.sampler.max_cohort
         for p in programs):  # chunked or scheduled rounds: one after another
    return _one_after_another(configs, workdirs)
  vec = VectorizedSyncProgram([p.opts for p in programs], programs[0].algorithm,
                              prepared[0][1], [p[2] for p in prepared], [p[3] for p in prepared],
                              [p[0] for p in prepared], mesh, programs[0].compressor)
  for c, w in zip(configs, workdirs):
    check_workdir(w, c)
  runs = [_Run(c, w, _RunView(vec, i), p[0], p[2])
          for i, (c, w, p) in enumerate(zip(configs, workdirs, prepared))]
  fresh = vec.init_state()
  states = [run.restore(vec.run_state(fresh, i)) for i, run in enumerate(runs)]
  if len({run.start_round for run in runs}) > 1:  # resumed from different rounds
    for run in runs:
      run.close()
    return _one_after_another(configs, workdirs)
  state = vec.stack_states(states)
  failed = {}  # a diverged run stops alone; the others go on
  try:
    for round_idx in range(runs[0].start_round, vec.num_rounds):
      for i, run in enumerate(runs):
        if i not in failed:
          run.before_round(round_idx)
      state, outs = vec.run_round(state, round_idx)
      for i, (run, out) in enumerate(zip(runs, outs)):
        if i in failed:
          continue
        try:
          run.after_round(vec.run_state(state, i), round_idx, out)
        except DivergenceError as e:
          failed[i] = e
  finally:
    for run in runs:
      run.close()
  return [failed[i] if i in failed else run.finish(vec.run_state(state, i))
          for i, run in enumerate(runs)]


def _train_on_clock(config, workdir: str, stop_after_tick: Optional[int]) -> dict:
  """A run on the simulated clock: data, partition and model as above, then
  fedjax_lama.simulation.clock_run with the registry's typed options.

  stop_after_tick: stop after the checkpoint that follows that evaluation tick (tests).
  """
  from fedjax_lama.simulation import clock_run  # pylint: disable=g-import-not-at-top
  options = dataclasses.replace(registry.clock_options(config), platform=platform_plan(config))
  data_dir = federation.resolve_data_dir(config.data_dir)
  with progress.Phase(f"loading data: {config.dataset} from {data_dir}"):
    dataset = _load_dataset(config, data_dir)
  config_lib.validate(config, num_classes=dataset.num_classes)
  with progress.Phase(f"partitioning into {config.num_clients} clients ({config.partition})"):
    dataset, _ = augment.normalize_dataset(dataset, config.normalization)
    fed = _build_federation(config, dataset)
  with progress.Phase(f"building the model ({config.model})"):
    model, params, model_state = _build_model(config, dataset)
  if jax.tree_util.tree_leaves(model_state):
    raise config_lib.ConfigError(
        f"config.model={config.model!r} keeps BatchNorm statistics, which runs on the simulated "
        "clock do not carry (models travel as parameters only); accepted: a model without them")
  check_workdir(workdir, config)  # every check passes before the workdir is written
  try:
    return clock_run.run(options, fed, model, params, workdir, config_json=_config_dict(config),
                         # Calls vary in size: each takes its own devices of this mesh
                         # (engine_adapter.EngineTrainer.call_mesh).
                         mesh=_client_mesh(config, fed, model, params, {}),
                         augment=augment.augmentation(config.augmentation, fed.dataset),
                         stop_after_tick=stop_after_tick,
                         advice=f"try a smaller config.local_lr (now {config.local_lr})")
  except errors.TrainingDiverged as e:  # one error type for every mode (sweeps record it)
    if isinstance(e, DivergenceError):
      raise
    raise DivergenceError(str(e)) from None


def _records_up_to(writer: metrics.JsonlWriter, done: int, primary: bool) -> list:
  """The records the checkpoint covers (rounds <= done); later ones are dropped from disk."""
  try:
    if primary:
      return writer.truncate_after(done)
    return [r for r in writer.read() if r["round"] <= done]
  except ValueError as e:
    raise TrainingError(f"cannot resume: {e}") from e


def _evaluate(config, program, state, fed, round_idx, out, host, ledger, wall_seconds, per_client):
  params, model_state = program.eval_params(state)
  ds = fed.dataset
  res = evaluation.evaluate(program.eval_fn, params, model_state, ds.test_x, ds.test_y,
                            config.eval_batch_size)
  best = host["best_test_accuracy"]
  host["best_test_accuracy"] = res.accuracy if best is None else max(best, res.accuracy)
  train_loss = host["loss_sum"] / max(host["loss_count"], 1.0)
  host["loss_sum"], host["loss_count"] = 0.0, 0.0
  record = {
      "round": round_idx + 1, "local_steps": program.local_steps_done(round_idx),
      "test_accuracy": res.accuracy, "test_loss": res.loss, "train_loss": train_loss,
      "wall_seconds": wall_seconds, **ledger.totals(), **out.extra}
  if fed.validation is not None:
    val = evaluation.evaluate(program.eval_fn, params, model_state, fed.validation.x,
                              fed.validation.y, config.eval_batch_size)
    record.update(val_accuracy=val.accuracy, val_loss=val.loss)
  if per_client:
    record.update(_per_client(config, program, params, model_state, fed))
  return record


def _per_client(config, program, params, model_state, fed) -> dict:
  """Global model accuracy per client: on each client's held-out split when there is one
  (FedAT's 80/20), else on its training data; mean and variance across clients."""
  ds = fed.dataset
  split = fed.client_test if fed.client_test is not None else fed.client_train
  key = "client_test_accuracy" if fed.client_test is not None else "client_train_accuracy"
  on_test = fed.client_test is not None and fed.client_test_in == "test"
  x, y = (ds.test_x, ds.test_y) if on_test else (ds.train_x, ds.train_y)
  res = evaluation.evaluate(program.eval_fn, params, model_state, x, y, config.eval_batch_size)
  acc = evaluation.per_client_accuracy(res.correct, split)
  acc = acc[np.isfinite(acc)]
  return {f"{key}_mean": float(acc.mean()), f"{key}_var": float(acc.var()),
          f"{key}_min": float(acc.min())}


def _summary(config, records, ledger, program, state, wall_seconds) -> dict:
  accs = [r["test_accuracy"] for r in records]
  last = records[-1]
  summary = {
      "algorithm": config.algorithm, "dataset": config.dataset, "model": config.model,
      "final_test_accuracy": accs[-1], "best_test_accuracy": max(accs),
      "final_test_loss": last["test_loss"], "rounds": program.num_rounds,
      "local_steps": last["local_steps"], "wall_seconds": wall_seconds,
      "num_parameters": int(sum(ledger.sizes)), "client_devices": program.mesh.size,
      **ledger.totals(), "comm_floats_up_per_layer": dict(zip(ledger.names, ledger.up.tolist())),
      "comm_floats_down_per_layer": dict(zip(ledger.names, ledger.down.tolist())),
  }
  if "val_accuracy" in last:
    val = [r["val_accuracy"] for r in records]
    summary.update(final_val_accuracy=val[-1], best_val_accuracy=max(val),
                   final_val_loss=last["val_loss"])
  summary.update({k: v for k, v in last.items() if k.startswith("client_")})
  summary.update(program.summary(state, ledger))
  return summary
