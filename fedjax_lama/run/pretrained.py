"""Another run's parameters: where a run starts from (config.init_from) and the merged export.

Pretrain, then federate: a central run (one client holding a public corpus,
experiments/pretrain.py) writes checkpoints like every run; `config.init_from` starts any
run from them, and `export` writes a run's model as plain parameters with a small JSON of
the model that reads them.

`load(path)` reads the parameters a path holds, as `Pretrained`, and nothing else:
* a run's workdir (its latest checkpoint), or one of its `checkpoints/<step>` directories:
  the server's global model (`ServerState.params` and its BatchNorm statistics), checked
  against the step's checksums and never written to (the checkpoints are read-only), with
  the run's config (its config.json);
* an export file written by `export` (flax msgpack) beside its JSON (`<file>.json`).
`whole(pretrained)` is the source run's model as plain parameters: a checkpoint that holds
only a trainable set (config.trainable) gets its frozen rest, derived again from the run's
config as its own resume derives it; a run trained with LoRA adapters (the model option
lora) has every adapted kernel merged, W + (alpha / r) A B (`lora.merged`).

`initial_params(params, model_state, pretrained)` is the run's start: the whole pretrained
model's parameters in place of the fresh ones, leaf for leaf, bit for bit. A model with LoRA
adapters takes them as its base (`lora.with_base`) and keeps its fresh adapters (B = 0, so
its first forward pass is the pretrained model's). A parameter missing on either side, or of
another shape or dtype, stops with one ConfigError naming the path and that parameter.

The merged export (experiments/export.py): a run's model as plain parameters of the model
built without the lora option (`export_variables`, adapters merged by `lora.merged`),
written as `out` (flax msgpack of the params and any BatchNorm statistics) and `out.json`
(the model's name, number of classes, options and input shape) by `write_export`, which
refuses an existing file unless asked; `read_export` turns them back into (model,
variables) for the model's own `apply`.
"""
import dataclasses
import json
import os
from typing import Any, Optional

import flax.serialization
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_lama import checkpointing, models
from fedjax_lama import config as config_lib
from fedjax_lama.errors import ConfigError, DataError, WorkdirError
from fedjax_lama.models import lora as lora_lib
from fedjax_lama.tree import check_fits, leaf_dict, with_leaves

FORMAT = "fedjax_lama.export/1"   # the JSON's "format": what `read_export` accepts
JSON_SUFFIX = ".json"
_ACCEPTED = ("accepted: a run's workdir (with checkpoints/), one of its checkpoints/<step> "
             "directories, or a file written by experiments.export (with its .json beside it)")


@dataclasses.dataclass(frozen=True)
class Pretrained:
  """Parameters read from `source`, with what is known of the model that trained them."""
  params: dict                 # nested dicts of numpy arrays (as read; see `whole`)
  model_state: dict            # BatchNorm statistics ({} for a model without them)
  source: str                  # the path read (a checkpoint step directory, or a file)
  model: Optional[str] = None  # the model's name, where known (config.json, export JSON)
  options: Optional[dict] = None  # its model options
  config: Optional[ml_collections.ConfigDict] = None  # the run's config, where it has one
  # A checkpoint of a run with a trainable set holds only that set, and records the digest
  # of its frozen rest (checkpointing.tree_digest); None: it holds every parameter.
  frozen_digest: Optional[str] = None

  def describe(self) -> str:
    if self.model is None:
      return ""
    given = {k: v for k, v in (self.options or {}).items() if k != "kernels"}
    return f" (it holds config.model={self.model!r} with model_options {given})"


# ---- reading -------------------------------------------------------------------------------
def workdir_config(workdir: str) -> Optional[ml_collections.ConfigDict]:
  """The config of the run in `workdir` (its config.json over today's defaults), or None."""
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    return None
  try:
    with open(path) as f:
      given = json.load(f)
  except (OSError, ValueError) as e:
    raise DataError(f"{path} cannot be read ({e}); it is the config of the run whose "
                    "parameters are read") from e
  config = config_lib.base_config()
  try:
    config.update(config_lib.rename_old_fields(given))
  except (TypeError, ValueError, AttributeError) as e:
    raise DataError(f"{path} is not a run's config ({type(e).__name__}: {e})") from e
  return config


def checkpoint_of(path: str) -> tuple[str, int]:
  """(checkpoints directory, step) that `path` names: a workdir (its latest step), a
  checkpoints directory, or one step directory. Raises ConfigError otherwise."""
  path = os.path.abspath(path)
  candidates = [(os.path.join(path, "checkpoints"), None), (path, None)]
  name = os.path.basename(path)
  if name.isdigit():
    candidates.insert(0, (os.path.dirname(path), int(name)))
  for directory, step in candidates:
    if not os.path.isdir(directory):
      continue
    steps = sorted(int(n) for n in os.listdir(directory)
                   if n.isdigit() and os.path.isdir(os.path.join(directory, n)))
    if step is None and steps:
      return directory, steps[-1]
    if step is not None and step in steps:
      return directory, step
  raise ConfigError(f"config.init_from={path} holds no checkpoint; {_ACCEPTED}")


def _server_state(state: dict, where: str) -> dict:
  """The global model's server state in a round program's checkpointed state: sync
  programs keep it under "server", FedLAMA's under "fedlama"."""
  server = state.get("server")
  if server is None and isinstance(state.get("fedlama"), dict):
    server = state["fedlama"].get("server")
  if not isinstance(server, dict) or "params" not in server:
    raise DataError(f"{where}: holds no server state with params; accepted: a checkpoint "
                    f"of a run with rounds (those of runs on the simulated clock are not read)")
  return server


def load(path: str) -> Pretrained:
  """The parameters `path` holds, as read (module docstring). Nothing there is written."""
  if not isinstance(path, str) or not path.strip():
    raise ConfigError(f"config.init_from={path!r} is not accepted; {_ACCEPTED}")
  path = os.path.expanduser(path)
  if os.path.isfile(path):
    return _load_export(path)
  if not os.path.exists(path):
    raise ConfigError(f"config.init_from={path}: no such file or directory; {_ACCEPTED}")
  directory, step = checkpoint_of(path)
  ckpt = checkpointing.Checkpointer(directory, read_only=True)
  try:
    state, meta = ckpt.restore_tree(step)
  finally:
    ckpt.close()
  where = ckpt.step_dir(step)
  server = _server_state(state, where)
  config = workdir_config(os.path.dirname(directory))
  model = options = None
  if config is not None:
    model, options = config.model, config.model_options.to_dict()
  frozen_digest = ((meta or {}).get("program") or {}).get(checkpointing.FROZEN_DIGEST)
  return Pretrained(server["params"], server.get("model_state") or {}, where, model, options,
                    config, frozen_digest)


def whole(pretrained: Pretrained) -> Pretrained:
  """The source run's model as plain parameters (module docstring): its frozen rest added
  when the checkpoint holds only its trainable set, its adapters merged. Without the run's
  config (an export file, a checkpoint without config.json) the parameters are as read."""
  config = pretrained.config
  if config is None:
    return pretrained
  params = pretrained.params
  if pretrained.frozen_digest is not None:
    params = _with_frozen(pretrained)
  options = pretrained.options
  lora = lora_lib.LoRA.parse(options.get("lora"), "model_options.lora")
  if lora is not None:  # the run's model is its base with the adapters merged
    params = jax.tree.map(np.asarray, lora_lib.merged(params, lora))
    options = {k: v for k, v in options.items() if k != "lora"}
  return dataclasses.replace(pretrained, params=params, options=options, config=None,
                             frozen_digest=None)


def _with_frozen(pretrained: Pretrained) -> dict:
  """The whole parameter tree of a run whose checkpoint holds only its trainable set
  (config.trainable, the adapters under LoRA): the frozen rest is the run's start, derived
  again from its config as its own resume derives it (the model's initialisation from
  config.seed, or its config.init_from), so its data must be readable; its digest must be
  the one the checkpoint records."""
  from fedjax_lama.run import parts as parts_lib, spec as spec_lib  # pylint: disable=g-import-not-at-top
  source = spec_lib.build_spec(pretrained.config)
  start = parts_lib.prepare(source).params
  part = lora_lib.trainable_set(start, source.options.trainable, "config.trainable")
  _, frozen = part.split(start)
  try:
    params = part.merge(pretrained.params, frozen)
  except ValueError as e:
    raise DataError(f"{pretrained.source}: {e}") from e
  if checkpointing.tree_digest(frozen) != pretrained.frozen_digest:
    raise DataError(f"{pretrained.source}: the frozen parameters its run's config derives "
                    "again (the base under its trainable set) are not the ones it trained "
                    "on; accepted: a run whose config.json and data are as they were")
  return jax.tree.map(np.asarray, params)


def _load_export(path: str) -> Pretrained:
  info = read_export_info(path)
  with open(path, "rb") as f:
    raw = f.read()
  try:
    variables = flax.serialization.msgpack_restore(raw)
  except Exception as e:  # pylint: disable=broad-except
    raise DataError(f"{path}: not a parameter file written by experiments.export "
                    f"({type(e).__name__})") from e
  if not isinstance(variables, dict) or not isinstance(variables.get("params"), dict):
    raise DataError(f"{path}: holds no 'params'; not a file written by experiments.export")
  as_arrays = lambda tree: jax.tree.map(np.asarray, tree or {})
  return Pretrained(as_arrays(variables["params"]), as_arrays(variables.get("batch_stats")),
                    path, info["model"], info["options"])


def read_export_info(path: str) -> dict:
  """The JSON beside an export file (`path` + ".json"), checked."""
  meta = path + JSON_SUFFIX
  try:
    with open(meta) as f:
      info = json.load(f)
  except FileNotFoundError as e:
    raise DataError(f"{meta}: missing; an export file is read with the JSON written beside "
                    f"it (experiments.export); {_ACCEPTED}") from e
  except (OSError, ValueError) as e:
    raise DataError(f"{meta} cannot be read ({e})") from e
  if not isinstance(info, dict) or info.get("format") != FORMAT or not all(
      k in info for k in ("model", "num_classes", "options", "input_shape", "input_dtype")):
    raise DataError(f"{meta}: not the JSON of an export (format {FORMAT!r} with model, "
                    f"num_classes, options, input_shape, input_dtype)")
  return info


# ---- the start of a run ----------------------------------------------------------------------
def initial_params(params: Any, model_state: Any, pretrained: Pretrained,
                   field: str = "config.init_from") -> tuple[Any, Any]:
  """(params, model_state) of a run that starts from `pretrained` (module docstring):
  the leaves of its whole model (`whole`) in place of the fresh ones, as jax arrays of the
  same values; a model with LoRA adapters keeps its fresh adapters over the pretrained
  base (`lora.with_base`). A mismatch names `field`={pretrained.source}."""
  hint, head = pretrained.describe(), f"{field}={pretrained.source}"
  pretrained = whole(pretrained)
  on_device = lambda tree: jax.tree.map(jnp.asarray, tree)
  # A model with adapters keeps them over the pretrained base (`lora.with_base`).
  start = with_leaves(params, pretrained.params, lora_lib.is_adapter, head, hint)
  fresh_stats, given_stats = leaf_dict(model_state), leaf_dict(pretrained.model_state)
  check_fits(fresh_stats, given_stats, "BatchNorm statistic", head, hint)
  if not fresh_stats:
    return on_device(start), model_state
  # The model's own tree structure for the statistics (the checkpoint's are plain dicts).
  stats = jax.tree.unflatten(jax.tree.structure(model_state),
                             [given_stats[p] for p in fresh_stats])
  return on_device(start), on_device(stats)


# ---- the merged export -----------------------------------------------------------------------
def export_variables(params: Any, model_state: Any, lora: Optional[lora_lib.LoRA]) -> dict:
  """{"params": ..., "batch_stats": ...} of the model without adapters: the adapters merged
  into their kernels (`lora.merged`) when `lora` is given, else the params as they are;
  numpy leaves."""
  if lora is not None:
    params = lora_lib.merged(params, lora)
  variables = {"params": params}
  if jax.tree.leaves(model_state):
    variables["batch_stats"] = model_state
  return jax.tree.map(np.asarray, variables)


def check_writable(out: str, overwrite: bool = False) -> None:
  """Refuses an export path whose file or JSON exists (unless `overwrite`), is a
  directory, or lies in no directory."""
  if not isinstance(out, str) or not out.strip():
    raise WorkdirError(f"--out={out!r} is not accepted; accepted: a file path")
  for path in (out, out + JSON_SUFFIX):
    if os.path.isdir(path):
      raise WorkdirError(f"--out={out}: {path} is a directory; accepted: a file path")
    if os.path.exists(path) and not overwrite:
      raise WorkdirError(f"--out={out}: {path} exists; choose another --out or pass "
                         "--overwrite")
  folder = os.path.dirname(os.path.abspath(out))
  if not os.path.isdir(folder):
    raise WorkdirError(f"--out={out}: the directory {folder} does not exist")


def write_export(out: str, variables: dict, info: dict, overwrite: bool = False) -> None:
  """Writes `out` (flax msgpack of `variables`) and `out.json` (`info` and the format);
  refuses an existing file unless `overwrite` (`check_writable`). Each file is written
  whole or not at all."""
  check_writable(out, overwrite)
  meta = out + JSON_SUFFIX
  try:
    for path, data in ((out, flax.serialization.msgpack_serialize(variables)),
                       (meta, (json.dumps({"format": FORMAT, **info}, indent=2,
                                          sort_keys=True) + "\n").encode())):
      with open(path + ".tmp", "wb") as f:
        f.write(data)
      os.replace(path + ".tmp", path)
  except OSError as e:
    raise WorkdirError(f"--out={out} cannot be written ({e.strerror or e})") from e


def read_export(path: str) -> tuple[Any, dict, dict]:
  """(model, variables, info) of an export file: the zoo model its JSON names, built
  without adapters, and the variables its `apply` takes. The file's parameters must be
  those of that model (ConfigError naming the first that is not)."""
  pretrained = _load_export(path)
  info = read_export_info(path)
  try:
    model = models.get(info["model"], num_classes=info["num_classes"], **info["options"])
  except (TypeError, ValueError, KeyError) as e:
    raise DataError(f"{path}{JSON_SUFFIX}: its model cannot be built ({e})") from e
  sample = jnp.zeros([1] + list(info["input_shape"]), info["input_dtype"])
  shapes = jax.eval_shape(lambda x: model.init({"params": jax.random.PRNGKey(0),
                                                "dropout": jax.random.PRNGKey(0)},
                                               x, train=False), sample)
  expected_stats = shapes.get("batch_stats", {})
  params, stats = initial_params(shapes["params"], expected_stats, pretrained, "export file")
  variables = {"params": params, **({"batch_stats": stats} if jax.tree.leaves(stats) else {})}
  return model, variables, info
