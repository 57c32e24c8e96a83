"""The parts a RunSpec describes: data, federation, model, client mesh and round program.

`prepare(spec)` loads the data, checks it against the model and partition, holds out the
validation split, normalises, partitions and builds the model; `program(spec, parts)` builds
the round program of the algorithm (and schedule) on the devices its clients are split over.
Bad options and mismatches raise ConfigError naming the config fields.
"""
import dataclasses
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lama import config as config_lib
from fedjax_lama import data as fdata
from fedjax_lama import federation, models, progress, rng
from fedjax_lama.data import augment
from fedjax_lama.engine import local, sharding, traffic as traffic_lib
from fedjax_lama.models import lora
from fedjax_lama.errors import ConfigError
from fedjax_lama.privacy import dp_options, dp_stage as privacy_stage
from fedjax_lama.programs.fedlama import FedLamaProgram
from fedjax_lama.programs.round_program import RunOptions, trainable_part
from fedjax_lama.programs.sync import SyncProgram
from fedjax_lama.robust import robust_stage
from fedjax_lama.run import pretrained as pretrained_lib, spec as spec_lib

# Partitions that read one class label per example.
_LABEL_PARTITIONS = ("dirichlet", "dirichlet_balanced", "shards", "class_cyclic", "one_class")


class Parts(NamedTuple):
  fed: federation.Federation
  model: object
  params: object
  model_state: object


def prepare(spec) -> Parts:
  """Data, federation and model of a RunSpec."""
  data = spec.data
  pretrained = None
  if spec.model.init_from:  # read before the data: a wrong path stops at once
    with progress.Phase(f"reading the initial parameters from {spec.model.init_from}"):
      pretrained = pretrained_lib.load(spec.model.init_from)
  data_dir = federation.resolve_data_dir(data.data_dir)
  with progress.Phase(f"loading data: {data.name} from {data_dir}"):
    dataset = load_dataset(data, data_dir)
  config_lib.check_classes_per_client(data.partition, data.classes_per_client, data.name,
                                      dataset.num_classes)
  validation = None
  if data.validation_fraction > 0:  # held out before partitioning and normalisation
    dataset, validation = fdata.split_validation(dataset, data.validation_fraction, data.seed)
  with progress.Phase(f"partitioning into {client_count(spec.federation, dataset)} clients "
                      f"({spec.federation.name})"):
    dataset, validation = augment.normalize_dataset(dataset, data.normalization, validation)
    fed = dataclasses.replace(build_federation(spec.federation, dataset), validation=validation)
  with progress.Phase(f"building the model ({spec.model.name})"):
    model, params, model_state = build_model(spec.model, dataset, spec.plan.kernels)
  if pretrained is not None:  # config.init_from: the model starts from those parameters
    params, model_state = pretrained_lib.initial_params(params, model_state, pretrained)
  return Parts(fed, model, params, model_state)


def client_count(partition: federation.PartitionSpec, dataset) -> int:
  """The clients the partition makes: config.num_clients, but for the natural partition one
  per natural client id of the training split (a role, a writer), whatever num_clients says."""
  if partition.name == "natural" and dataset.train_client_ids is not None:
    return len(np.unique(dataset.train_client_ids))
  return partition.num_clients


def load_dataset(data, data_dir: str) -> "fdata.Dataset":
  """`load_dataset` with the reader's options, checked against the model and partition.

  Bad options and model/dataset mismatches raise ConfigError naming the fields;
  next-token padding targets become local.PAD_TARGET (see `_pad_targets`).
  """
  try:
    dataset = fdata.load_dataset(data.name, data_dir=data_dir, source=data.source,
                                 options=data.options or None)
  except (fdata.DataError, ConfigError):
    raise
  except ValueError as e:  # unknown option or bad value: a config problem, not a file problem
    raise ConfigError(
        f"config.dataset={data.name!r}, config.data_source={data.source!r}, "
        f"config.dataset_options={data.options!r}: {e}") from e
  _check_model_and_partition(data, dataset)
  return _pad_targets(dataset)


def _check_model_and_partition(data, dataset) -> None:
  kind = dataset.input_kind
  if kind not in models.inputs(data.model):
    fits = [m for m in models.names() if kind in models.inputs(m)]
    raise ConfigError(
        f"config.model={data.model!r} takes {'/'.join(models.inputs(data.model))} inputs, but "
        f"config.dataset={data.name!r} gives {kind!r} inputs of shape "
        f"{np.shape(dataset.train_x)[1:]} per example; accepted for this dataset: config.model in "
        f"{', '.join(repr(m) for m in fits)}")
  if np.ndim(dataset.train_y) != 1 and data.partition in _LABEL_PARTITIONS:
    raise ConfigError(
        f"config.partition={data.partition!r} needs one class label per example, but "
        f"config.dataset={data.name!r} has next-token targets of shape "
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


def build_federation(partition: federation.PartitionSpec, dataset) -> federation.Federation:
  """The clients of config.partition; a split the data cannot give names the fields."""
  try:
    return federation.build_federation(partition, dataset)
  except ValueError as e:
    if isinstance(e, (ConfigError, fdata.DataError)):
      raise
    raise ConfigError(
        f"config.partition={partition.name!r} with config.num_clients={partition.num_clients!r} "
        f"on config.dataset={partition.dataset_name!r} ({len(dataset.train_y)} training "
        f"examples): {e}") from e


def _dataset_vocab_size(model: str, dataset) -> Optional[int]:
  """The vocabulary size `model` must be built with for `dataset`, or None if none applies."""
  if models.inputs(model) == (fdata.INPUT_TOKENS,):
    return int(dataset.num_classes)  # token ids and next-token classes share one vocabulary
  if model == "logreg" and dataset.input_kind == fdata.INPUT_BOW_COUNTS:
    return int(np.shape(dataset.train_x)[1])
  if model == "logreg" and dataset.input_kind == fdata.INPUT_BOW_TOKENS:
    return int(dataset.info.get("vocab_size") or len(dataset.vocab))
  return None


def model_options(model_spec, dataset, kernels: str) -> dict:
  """config.model_options, with the vocabulary size taken from the dataset when unset and the
  platform plan's kernel set for the layers that have one."""
  options = dict(model_spec.options)
  vocab = _dataset_vocab_size(model_spec.name, dataset)
  if vocab is not None:
    given = options.setdefault("vocab_size", vocab)
    if given != vocab:
      how = (" (set by config.dataset_options.vocab_size)"
             if "vocab_size" in fdata.DATASET_OPTIONS.get(model_spec.dataset, {}) else "")
      raise ConfigError(
          f"config.model_options.vocab_size={given!r} is not accepted for config.model="
          f"{model_spec.name!r} on config.dataset={model_spec.dataset!r}; accepted: {vocab}, the "
          f"dataset's vocabulary{how}, or leave it unset")
  if model_spec.name == "transformer_lm":  # positions: the dataset's window unless given
    length = int(np.shape(dataset.train_x)[1])
    given = options.setdefault("max_len", length)
    if isinstance(given, int) and not isinstance(given, bool) and given < length:
      raise ConfigError(
          f"config.model_options.max_len={options['max_len']!r} is not accepted for "
          f"config.model='transformer_lm' on config.dataset={model_spec.dataset!r}, whose "
          f"windows have {length} tokens; accepted: an int >= {length}, or leave it unset")
  # The layers' plan (convolutions, the dense layers); logreg and lstm_lm ignore it.
  options.setdefault("kernels", kernels)
  return options


def build_model(model_spec, dataset, kernels: str):
  """(model, params, model_state) of config.model, initialised from config.seed."""
  name = model_spec.name
  if name not in models.names():
    raise ConfigError(f"config.model={name!r} is not accepted; accepted: "
                      f"{', '.join(map(repr, models.names()))}")
  options = model_options(model_spec, dataset, kernels)
  try:
    model = models.get(name, num_classes=dataset.num_classes, **options)
  except ValueError as e:  # options of another model left in config.model_options, bad values
    given = {k: v for k, v in options.items() if k != "kernels"}
    raise ConfigError(
        f"config.model_options={given!r} is not accepted for config.model={name!r}: "
        f"{e}. Accepted options of {name!r} (defaults): "
        f"{models.options(name)}; remove the others from config.model_options "
        f"(e.g. use a config written for {name!r})") from e
  sample = jnp.asarray(dataset.train_x[:1])
  key = rng.root_key(model_spec.seed)
  variables = model.init({"params": key, "dropout": key}, sample, train=False)
  adapters = lora.LoRA.parse(options.get("lora"), "config.model_options.lora")
  if adapters is not None:  # every target adapts a layer, else one line listing them
    lora.check_targets(adapters, variables["params"], "config.model_options.lora.targets")
  return model, variables["params"], variables.get("batch_stats", {})


def federated_options(opts: RunOptions, augmentation: str, fed) -> RunOptions:
  """A RunSpec's round-program options on this federation: its clients are sampled, its
  dataset augmented (config.augmentation)."""
  return dataclasses.replace(
      opts, sampler=dataclasses.replace(opts.sampler, num_clients=fed.num_clients),
      augment=augment.augmentation(augmentation, fed.dataset))


def client_mesh(batch_size: int, parts: Parts, cohort: Optional[int] = None):
  """The devices the run's clients are split over (`sharding.client_devices`, which on CPU
  weighs the model's size, one local step's values and `cohort`, the clients of a call)."""
  fed, params, model_state = parts.fed, parts.params, parts.model_state
  batch = lambda a, dtype: jax.ShapeDtypeStruct((batch_size,) + a.shape[1:], dtype)
  x = batch(fed.dataset.train_x, fed.dataset.train_x.dtype)
  y = batch(fed.dataset.train_y, jnp.int32)  # as the programs place them
  loss_fn = local.make_loss_fn(parts.model, bool(jax.tree.leaves(model_state)))
  step_bytes = local.step_bytes(loss_fn, params, model_state, x, y)
  return sharding.client_mesh(sharding.client_devices(params, step_bytes, cohort))


def chunk_cap(opts: RunOptions) -> int:
  """Clients of one training call of a synchronous run (SyncProgram's chunk before padding)."""
  return opts.clients_per_chunk or opts.sampler.max_cohort


def program(spec, parts: Parts, mesh=None):
  """The round program of the RunSpec's algorithm (and schedule) on this federation, on `mesh`
  (default: the devices `client_mesh` picks for one training call)."""
  fed = robust_stage.poisoned(spec.robust, parts.fed)  # what the clients train on
  opts = federated_options(spec.options, spec.data.augmentation, fed)
  opts = dataclasses.replace(opts, aggregator=spec_lib.run_chain(spec, fed.num_clients))
  opts = robust_stage.with_poison(spec.robust, opts, fed)  # the backdoor's trigger
  if mesh is None:
    mesh = client_mesh(opts.batch_size, parts, chunk_cap(opts))
  algorithm = spec.algorithm.build(fed.num_clients, float(np.mean(fed.client_sizes)))
  if spec.records.privacy is not None:  # what the noise covers, before any training
    # On the parameters the clients send: the trainable set (the program's params).
    trainable = trainable_part(opts.trainable, parts.params)
    sent = trainable.split(parts.params)[0] if trainable is not None else parts.params
    check_privacy(spec, algorithm, fed, sent, parts.model_state)
  fedlama = spec.algorithm.selection.fedlama
  if fedlama is not None:
    built = FedLamaProgram(opts, fedlama, algorithm, parts.model, parts.params,
                           parts.model_state, fed, mesh)
  else:
    built = SyncProgram(opts, algorithm, parts.model, parts.params, parts.model_state, fed,
                        mesh)
  return built


def check_privacy(spec, algorithm, fed, params, model_state) -> None:
  """DP's checks of the run (config.privacy) on the parameters the clients send."""
  privacy_stage.check_federation(spec.records.privacy, fed.num_clients)
  privacy_stage.check_layer_split(spec.records.privacy, params)
  row = algorithm.row_init(params) if algorithm.row_init is not None else {}
  uploads = traffic_lib.traffic(algorithm, algorithm.server.init(params, model_state), row)
  privacy_stage.check_uploads(uploads.upload_shapes, spec.records.algorithm,
                              algorithm.aggregations_for(uploads.upload_shapes))
  privacy_stage.check_model_state(model_state, spec.model.name)
  # What the noise does to the averaged update, before the first round: a setting whose
  # noise outweighs any update says so here rather than in a loss that grows for hours.
  progress.info("%s", dp_options.noise_statement(
      spec.records.privacy, sum(int(np.size(x)) for x in jax.tree.leaves(params))))
