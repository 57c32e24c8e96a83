"""Personalization by layer partition: each client keeps some layers of the model its own.

The model's layers are split into shared layers, trained by every client and averaged by
the server as in FedAvg, and personal layers, which never leave the client: they live in
the client's row (engine/client_store.py), the client starts its local training from the
downloaded shared layers with its own personal layers (`Personalization.start`), uploads
the shared layers' displacement only, writes its personal layers back to its row, and is
served the shared layers with its own personal ones (`Personalization.serve`). Only the
shared layers travel: floats up and down per client are d minus the personal layers' size
(`Personalization.exchanged`).

- FedPer: M. G. Arivazhagan, V. Aggarwal, A. K. Singh, S. Choudhary, "Federated Learning
  with Personalization Layers", arXiv 1912.00818 (2019). Base layers shared, the
  personalization layers (the classifier head by default) personal; every local step
  trains all layers jointly.
- FedRep: L. Collins, H. Hassani, A. Mokhtari, S. Shakkottai, "Exploiting Shared
  Representations for Personalized Federated Learning", ICML 2021. The representation
  (body) shared, the head personal; a client first updates its head with the body fixed
  (many local updates), then its body with the head fixed (their Algorithm 1). Here the
  round's local steps are split: the first `head_steps` real steps move the head only,
  the rest the body only.
- LG-FedAvg: P. P. Liang, T. Liu, L. Ziyin, N. B. Allen, R. P. Auerbach, D. Brent,
  R. Salakhutdinov, L.-P. Morency, "Think Locally, Act Globally: Federated Learning with
  Local and Global Representations", arXiv 2001.01523 (2020). The lower layers (local
  representations) personal, the top layers shared (their Algorithm 1): by default every
  layer but the classifier head is personal.
- FedBN: X. Li, M. Jiang, X. Zhang, M. Kamp, Q. Dou, "FedBN: Federated Learning on
  Non-IID Features via Local Batch Normalization", ICLR 2021. The batch normalization
  layers' parameters and running statistics stay local, everything else is averaged
  (their Algorithm 1). On a model without normalization layers it is FedAvg.

Layers are named as FedLAMA names them (fedjax_lama/fedlama/layer_units.py): the
"/"-joined path of a flax module ("Dense_1", "_PostActBlock_0/BatchNorm_0") or of one
tensor ("Dense_1/kernel"); a name selects every tensor under it. The default head is the
model's top-level Dense module with the highest index: flax numbers modules of one type
in call order, so that is the last dense layer applied, the classifier of every model of
the zoo (fedjax_lama/models/).

Under FedLAMA (config.schedule="fedlama") FedPer, FedRep and LG-FedAvg synchronise their
shared layers on the schedule's intervals and never their personal ones
(fedjax_lama/programs/fedlama.py); FedBN's local statistics do not compose with the
schedule's per-slot statistics and it is refused there.

The server's copies of the personal layers are never updated (the uploads are zero
there): the global model's evaluation uses them as initialised, and only the personalized
evaluation (each client's own layers) measures these methods.
"""
import dataclasses
import re
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_lama.algorithms.common import (Common, Spec, local_optimizer, require, server_sgd)
from fedjax_lama.engine.algorithm import (MODEL_UPLOAD, Algorithm, LocalOptimizer,
                                          Personalization, server_opt)
from fedjax_lama.errors import ConfigError
from fedjax_lama.fedlama import layer_units
from fedjax_lama.tree import PyTree, leaf_paths

# personal_layers values: the model's default, or no personal layer at all.
DEFAULT, NONE = "", "none"
# FedBN's normalization layers: flax modules whose name starts with one of these.
BATCH_NORM = "BatchNorm"
_DENSE = re.compile(r"^Dense_(\d+)$")
_FEDBN_NOT_LAYERWISE = ("its normalization statistics stay on the clients, which the schedule "
                        "keeps per slot and averages (config.fedlama.bn_stats_sync); run it "
                        "with config.schedule='none'")


def names(value: str) -> tuple:
  """The layer names of a comma-separated string ("Dense_1, Conv_0/kernel")."""
  return tuple(n.strip() for n in value.split(",") if n.strip())


def check_layer_names(field: str, value) -> None:
  """An Hparams check of a layer-names option (HparamError naming `field`)."""
  require(isinstance(value, str), field, value,
          f"a string: comma-separated layer names, {NONE!r}, or {DEFAULT!r} (the model's "
          "default)")


@dataclasses.dataclass(frozen=True)
class PersonalHparams:
  """FedPer's and LG-FedAvg's keys."""
  # Comma-separated layer names ("Dense_1", "Conv_0/kernel"); "" the model's default
  # (FedPer: the classifier head; LG-FedAvg: every layer but the head); "none": no layer.
  personal_layers: str = DEFAULT

  def __post_init__(self):
    check_layer_names("personal_layers", self.personal_layers)


@dataclasses.dataclass(frozen=True)
class FedRepHparams:
  personal_layers: str = DEFAULT   # the head; "" the model's classifier head
  # The first head_steps real local steps of a round train the head only, the rest the
  # body only (5: half of the default 10 local steps; the paper gives the head the larger
  # share of the local work).
  head_steps: int = 5

  def __post_init__(self):
    check_layer_names("personal_layers", self.personal_layers)
    require(isinstance(self.head_steps, int) and not isinstance(self.head_steps, bool)
            and self.head_steps >= 0, "head_steps", self.head_steps, "an integer >= 0")


@dataclasses.dataclass(frozen=True)
class FedBNHparams:
  # Comma-separated prefixes of the flax module names that are normalization layers.
  norm_layers: str = BATCH_NORM

  def __post_init__(self):
    require(isinstance(self.norm_layers, str) and names(self.norm_layers), "norm_layers",
            self.norm_layers, "comma-separated flax module name prefixes (e.g. 'BatchNorm')")


# ---- which leaves are personal --------------------------------------------------------------
def layer_names(params: PyTree) -> tuple:
  """The model's layers as FedLAMA names them at module granularity (a tensor at the root
  of params by its own name)."""
  modules = layer_units.layer_spec(params, "module").names
  roots = [path[0] for path in leaf_paths(params) if len(path) == 1]
  return tuple(n for n in modules if n) + tuple(roots)


def classifier_head(params: PyTree, field: str) -> tuple:
  """The top-level Dense module with the highest index (the last dense layer applied)."""
  found = [(int(m.group(1)), key) for key in params for m in [_DENSE.match(str(key))] if m]
  if not found:
    raise ConfigError(f"{field}='' (the model's default, its classifier head) finds no "
                      f"top-level Dense_<n> module; name the layers, one of: "
                      f"{', '.join(layer_names(params))}")
  return (max(found)[1],)


def select_names(params: PyTree, layers: tuple, field: str, value: str,
                 otherwise: str = f"{NONE!r}, or {DEFAULT!r} (the model's default)"
                 ) -> np.ndarray:
  """bool [num_leaves]: the leaves under any of `layers` ("/"-joined path prefixes); a name
  that is not a layer of the model stops with a ConfigError naming `field` and what it
  accepts (the model's layers, or `otherwise`)."""
  paths = leaf_paths(params)
  chosen = np.zeros(len(paths), bool)
  for name in layers:
    parts = tuple(name.split("/"))
    hit = np.array([path[:len(parts)] == parts for path in paths], bool)
    if not hit.any():
      raise ConfigError(f"{field}={value!r}: {name!r} is not a layer of the model; accepted: "
                        f"comma-separated layer names ({', '.join(layer_names(params))}), "
                        f"{otherwise}")
    chosen |= hit
  return chosen


def named_layers(value: str, default, field: str):
  """params -> bool [num_leaves] of the personal leaves: `value` names them, "none" none,
  "" `default(params, field)` (names)."""

  def personal(params):
    if value.strip() == NONE:
      return np.zeros(len(jax.tree.leaves(params)), bool)
    chosen = names(value) if value.strip() else default(params, field)
    return select_names(params, chosen, field, value)

  return personal


def every_layer_but_the_head(params: PyTree, field: str) -> tuple:
  """LG-FedAvg's default: every top-level module but the classifier head."""
  head = classifier_head(params, field)
  return tuple(str(key) for key in params if str(key) not in head)


def norm_layers(prefixes: tuple):
  """params -> bool [num_leaves]: leaves inside a module whose name starts with a prefix."""

  def personal(params):
    return np.array([any(part.startswith(prefixes) for part in path[:-1])
                     for path in leaf_paths(params)], bool)

  return personal


# ---- pytrees of some leaves ----------------------------------------------------------------
def take(tree: PyTree, mask: np.ndarray) -> dict:
  """The leaves of `tree` where `mask` is set, as nested dicts under their own paths."""
  out = {}
  for path, leaf, keep in zip(leaf_paths(tree), jax.tree.leaves(tree), mask):
    if keep:
      node = out
      for key in path[:-1]:
        node = node.setdefault(key, {})
      node[path[-1]] = leaf
  return out


def put(tree: PyTree, part: PyTree, what: str = "params") -> PyTree:
  """`tree` with the leaves that `part` (from `take`) holds replaced by part's."""
  given = dict(zip(leaf_paths(part), jax.tree.leaves(part)))
  paths = leaf_paths(tree)
  missing = sorted(set(given) - set(paths))
  if missing:
    raise ValueError(f"the client row's {what} {'/'.join(missing[0])!r} is not in the "
                     f"model's {what}; accepted: {', '.join('/'.join(p) for p in paths)}")
  leaves = [given.get(path, leaf) for path, leaf in zip(paths, jax.tree.leaves(tree))]
  return jax.tree.unflatten(jax.tree.structure(tree), leaves)


def batch_norm_stats(params: PyTree, mask: np.ndarray) -> dict:
  """Initial running statistics of the personal flax BatchNorm modules, as flax makes them
  (mean 0, var 1, shaped like the module's scale or bias): a row is built from params."""
  stats = {}
  for path, leaf, keep in zip(leaf_paths(params), jax.tree.leaves(params), mask):
    in_batch_norm = len(path) >= 2 and path[-2].startswith(BATCH_NORM)
    if keep and in_batch_norm and path[-1] in ("scale", "bias"):
      node = stats
      for key in path[:-1]:
        node = node.setdefault(key, {})
      node["mean"] = jnp.zeros(jnp.shape(leaf), jnp.result_type(leaf))
      node["var"] = jnp.ones(jnp.shape(leaf), jnp.result_type(leaf))
  return stats


def _row(params_part: dict, stats_part: dict) -> dict:
  """{"params": ..., "batch_stats": ...} without empty parts ({} when nothing is personal,
  so that no client store is built)."""
  row = {}
  if jax.tree.leaves(params_part):
    row["params"] = params_part
  if jax.tree.leaves(stats_part):
    row["batch_stats"] = stats_part
  return row


def as_tree(mask: np.ndarray, like: PyTree) -> PyTree:
  """bool [num_leaves] as a pytree shaped like `like` of Python bools (what
  `Personalization.exchanged` and `engine.algorithm.freeze` take)."""
  return jax.tree.unflatten(jax.tree.structure(like), [bool(m) for m in mask])


# ---- FedRep's alternating local steps --------------------------------------------------------
def head_then_body(inner: optax.GradientTransformation, head_steps: int, personal):
  """The local optimizer `inner` run on the head (personal leaves) for the first
  `head_steps` steps and on the body afterwards; the other part does not move and its
  optimizer state (momentum) is not touched, as two separate optimizers would."""

  def init(params):
    return (jnp.zeros((), jnp.int32), inner.init(params), inner.init(params))

  def update(updates, state, params=None):
    count, head_state, body_state = state
    head_phase = count < head_steps
    head_dir, new_head = inner.update(updates, head_state, params)
    body_dir, new_body = inner.update(updates, body_state, params)
    is_head = as_tree(personal(updates), updates)
    direction = jax.tree.map(
        lambda h, b, own: jnp.where(head_phase, h if own else jnp.zeros_like(h),
                                    jnp.zeros_like(b) if own else b),
        head_dir, body_dir, is_head)
    pick = lambda new, old, keep: jax.tree.map(lambda n, o: jnp.where(keep, n, o), new, old)
    return direction, (count + 1, pick(new_head, head_state, head_phase),
                       pick(new_body, body_state, ~head_phase))

  return optax.GradientTransformation(init, update)


# ---- the record --------------------------------------------------------------------------
def partition(common: Common, personal, *, personal_stats: bool = False,
              local: Optional[LocalOptimizer] = None) -> Algorithm:
  """FedAvg on the shared layers, the personal ones (`personal(params)` -> bool per leaf)
  kept in each client's row; with `personal_stats` the running statistics of the personal
  BatchNorm modules too (FedBN)."""

  def row_init(params):
    mask = personal(params)
    return _row(take(params, mask), batch_norm_stats(params, mask) if personal_stats else {})

  def own_layers(params, model_state, row):
    """The shared layers and statistics given, with the client's own personal ones."""
    return (put(params, row.get("params", {})),
            put(model_state, row.get("batch_stats", {}), "batch_stats"))

  def start(state, ctx, loss_at):
    del loss_at
    params, model_state = own_layers(ctx.shared["params"], state.model_state, ctx.row)
    return state._replace(params=params, model_state=model_state)

  def finish(final, ctx, info):
    del info
    mask = personal(final.params)
    delta = jax.tree.map(lambda y, x, own: jnp.zeros_like(y) if own else y - x, final.params,
                         ctx.shared["params"], as_tree(mask, final.params))
    stats = {}
    if personal_stats:
      stats = take_like(final.model_state, ctx.row.get("batch_stats", {}))
    return {MODEL_UPLOAD: delta}, _row(take(final.params, mask), stats)

  def serve(server, row, loss_at):
    del loss_at
    return own_layers(server.params, server.model_state, row)

  def exchanged(params):
    return as_tree(~personal(params), params)

  return Algorithm(local=local if local is not None else local_optimizer(common),
                   server=server_opt(server_sgd(common)), row_init=row_init, finish=finish,
                   personal=Personalization(serve, start=start, exchanged=exchanged))


def take_like(tree: PyTree, part: PyTree) -> dict:
  """The leaves of `tree` at the paths `part` holds, nested like `part`."""
  wanted = set(leaf_paths(part))
  return take(tree, np.array([p in wanted for p in leaf_paths(tree)], bool))


def build_fedper(hp: PersonalHparams, common: Common) -> Algorithm:
  return partition(common, named_layers(hp.personal_layers, classifier_head,
                                        "fedper.personal_layers"))


def build_lg_fedavg(hp: PersonalHparams, common: Common) -> Algorithm:
  return partition(common, named_layers(hp.personal_layers, every_layer_but_the_head,
                                        "lg_fedavg.personal_layers"))


def build_fedrep(hp: FedRepHparams, common: Common) -> Algorithm:
  personal = named_layers(hp.personal_layers, classifier_head, "fedrep.personal_layers")
  sgd = local_optimizer(common)
  # No linear rule: the head and the body move on different steps, so no one effective
  # step describes the displacement (ClientInfo.effective_step is nan).
  local = LocalOptimizer(head_then_body(sgd.tx, hp.head_steps, personal))
  return partition(common, personal, local=local)


def build_fedbn(hp: FedBNHparams, common: Common) -> Algorithm:
  return partition(common, norm_layers(names(hp.norm_layers)), personal_stats=True)


SPECS = (
    Spec("fedper", PersonalHparams, build_fedper,
         "FedAvg on the base layers; personal head in each client's row"),
    Spec("fedrep", FedRepHparams, build_fedrep,
         "personal head steps, then shared body steps; body averaged",
         carry="its local optimizer counts the head's steps from the start of each window"),
    Spec("lg_fedavg", PersonalHparams, build_lg_fedavg,
         "personal lower layers, shared top layers averaged"),
    Spec("fedbn", FedBNHparams, build_fedbn,
         "FedAvg with local batch-norm layers and statistics",
         layerwise=_FEDBN_NOT_LAYERWISE),
)
