"""LoRA adapters on the zoo's Dense layers, the trainable set, and the merged export.

LoRA: E. J. Hu, Y. Shen, P. Wallis, Z. Allen-Zhu, Y. Li, S. Wang, L. Wang, W. Chen, "LoRA:
Low-Rank Adaptation of Large Language Models", ICLR 2022, Sec. 4.1. A Dense layer with
kernel W [in, out] computes

    h = x W + b + (alpha / r) (dropout(x) A) B,      A [in, r] random, B [r, out] zero,

so at initialization the model equals the model without adapters bit for bit (the adapter
term is an exact zero). The adapter term is computed as (x A) B, never as x (W + s A B):
under a vmapped client axis W stays one shared array and only A, B and the activations
are per client. Dropout is on the adapter's input only (as Hugging Face PEFT places it);
it runs when the apply call is given a "dropout" rng (the engine's training step; its
evaluation and `init` give none or ignore it), since a Dense layer is not told `train`.

Options (the zoo's model option `lora`, a dict; `LoRA.parse`): `rank` r, `alpha`, `dropout`,
`targets`, `a_init`. `targets` names the Dense layers to adapt, as FedLAMA and the
personalization options name layers (the "/"-joined path of a flax module,
"block_0/attention/query"): a name selects that layer and every layer under it
("block_0"), and a glob (fnmatch; `*` also crosses "/") selects the layers it matches
("*/attention/*", "*/mlp_*", "Dense_*", "*" for every Dense layer). `a_init`: "gaussian"
(Hu et al.: A ~ N(0, 1/in)) or "kaiming_uniform" (PEFT's default, A ~ U(-1/sqrt(in),
1/sqrt(in))). The adapters are leaves `lora_a` [in, r] and `lora_b` [r, out] of the Dense
module they adapt; the rest of the parameter tree is the base model's, so a checkpoint of
the base model loads into it (`with_base`), and the base leaves are initialised with the
same values as the base model's from the same key.

The trainable set (`trainable_set`) is declared by names: "lora" (both adapter matrices),
"lora_a", "lora_b", "bias" (every leaf named bias), "norm" (every leaf of a module whose
name contains "norm": LayerNorm_0, attention_norm, BatchNorm_0), or any layer name or glob
as above ("Dense_0", the transformer's output layer; "*" for every leaf: full
fine-tuning). FFA-LoRA (Y. Sun, Z. Li, Y. Li, B. Ding, "Improving LoRA in
Privacy-preserving Federated Learning", ICLR 2024) trains B only, A staying at its random
initialization: the trainable set ("lora_b",). `split` and `merge` move between the whole
parameter tree and (trainable, frozen) parts; `size` is the trainable floats.

`merged` writes W + (alpha / r) A B into the kernels and drops the adapters: plain
parameters of the model built without the `lora` option.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lama.errors import ConfigError
from fedjax_lama.tree import PyTree, leaf_paths, with_leaves

Array = jax.Array
ADAPTER_A, ADAPTER_B = "lora_a", "lora_b"
A_INITS = ("gaussian", "kaiming_uniform")
# Trainable-set keywords: name -> leaf predicate over the leaf's path (a tuple of keys).
_KEYWORDS = {
    "lora": lambda path: path[-1] in (ADAPTER_A, ADAPTER_B),
    "lora_a": lambda path: path[-1] == ADAPTER_A,
    "lora_b": lambda path: path[-1] == ADAPTER_B,
    "bias": lambda path: path[-1] == "bias",
    "norm": lambda path: any("norm" in key.lower() for key in path[:-1]),
}
_OPTION_KEYS = ("rank", "alpha", "dropout", "targets", "a_init")


# ---- names ----------------------------------------------------------------------------------
def selects(name: str, path: str) -> bool:
  """Whether a layer name or glob selects `path` ("/"-joined module or leaf path): the
  name itself, anything under it, or a match of the glob or of the glob followed by "/*"."""
  return fnmatch.fnmatchcase(path, name) or fnmatch.fnmatchcase(path, name + "/*")


def layer_names(params: PyTree) -> tuple:
  """The model's layers: the "/"-joined module paths of its leaves, in leaf order (a leaf
  at the root of params by its own name), as FedLAMA's module granularity names them."""
  names = {}
  for path in leaf_paths(params):
    names.setdefault("/".join(path[:-1]) or path[0], None)
  return tuple(names)


def _names(value: Any, field: str) -> tuple:
  """A comma-separated string or a list of strings, as a tuple of stripped names."""
  items = value.split(",") if isinstance(value, str) else value
  if not (isinstance(items, (list, tuple)) and all(isinstance(n, str) for n in items)
          and any(n.strip() for n in items)):
    raise ConfigError(f"{field}={value!r} is not accepted; accepted: names, comma-separated "
                      f"or a list (e.g. '*/attention/*')")
  return tuple(n.strip() for n in items if n.strip())


# ---- the option -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LoRA:
  """LoRA on the Dense layers `targets` selects: rank r, scale alpha / r (module docstring).

  Hashable, so the zoo's models built with it compare equal and jit caches on them.
  """
  rank: int
  targets: tuple
  alpha: float = 8.0
  dropout: float = 0.0
  a_init: str = "gaussian"

  @property
  def scale(self) -> float:
    """alpha / r, Hu et al.'s scaling (PEFT's default; rsLoRA's alpha / sqrt(r) is not it)."""
    return self.alpha / self.rank

  def adapts(self, module_path: tuple) -> bool:
    """Whether the Dense module at `module_path` (its flax scope path) gets adapters."""
    path = "/".join(module_path)
    return any(selects(name, path) for name in self.targets)

  def a_initializer(self, fan_in: int):
    bound = 1.0 / math.sqrt(fan_in)
    if self.a_init == "gaussian":
      return nn.initializers.normal(stddev=bound)
    return lambda key, shape, dtype=jnp.float32: jax.random.uniform(
        key, shape, dtype, -bound, bound)

  @classmethod
  def parse(cls, value: Any, field: str = "lora") -> Optional["LoRA"]:
    """The option's value: None (no adapters), a `LoRA`, or a dict (or ConfigDict) with
    `rank` and `targets` and optionally `alpha` (default 8), `dropout` (0), `a_init`
    ("gaussian"). Raises ConfigError with one line naming the key."""
    if value is None or isinstance(value, cls):
      return value
    if hasattr(value, "to_dict"):  # ml_collections.ConfigDict
      value = value.to_dict()
    if not isinstance(value, Mapping):
      raise ConfigError(f"{field}={value!r} is not accepted; accepted: None or a dict with "
                        f"keys {', '.join(_OPTION_KEYS)} (rank and targets required)")
    unknown = sorted(set(value) - set(_OPTION_KEYS))
    missing = [k for k in ("rank", "targets") if k not in value]
    if unknown or missing:
      raise ConfigError(f"{field}: {'unknown key(s) ' + ', '.join(unknown) if unknown else ''}"
                        f"{'; ' if unknown and missing else ''}"
                        f"{'missing ' + ', '.join(missing) if missing else ''}; accepted "
                        f"keys: {', '.join(_OPTION_KEYS)} (rank and targets required)")
    rank, alpha = value["rank"], value.get("alpha", cls.alpha)
    dropout, a_init = value.get("dropout", cls.dropout), value.get("a_init", cls.a_init)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
      raise ConfigError(f"{field}.rank={rank!r} is not accepted; accepted: an int >= 1")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
      raise ConfigError(f"{field}.alpha={alpha!r} is not accepted; accepted: a number > 0 "
                        f"(the adapter is scaled by alpha / rank)")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not (
        0.0 <= dropout < 1.0):
      raise ConfigError(f"{field}.dropout={dropout!r} is not accepted; accepted: a number "
                        f"in [0, 1)")
    if a_init not in A_INITS:
      raise ConfigError(f"{field}.a_init={a_init!r} is not accepted; accepted: "
                        f"{', '.join(map(repr, A_INITS))}")
    return cls(rank, _names(value["targets"], f"{field}.targets"), float(alpha),
               float(dropout), a_init)


def adapter_term(module: nn.Module, lora: LoRA, x: Array, features: int,
                 dtype: Any) -> Array:
  """(alpha / r) (dropout(x) A) B inside the Dense `module` (called from its compact
  `__call__` after its own parameters, so theirs keep the base model's init rngs)."""
  a = module.param(ADAPTER_A, lora.a_initializer(x.shape[-1]), (x.shape[-1], lora.rank),
                   dtype)
  b = module.param(ADAPTER_B, nn.initializers.zeros, (lora.rank, features), dtype)
  deterministic = (lora.dropout == 0.0 or module.is_initializing()
                   or not module.has_rng("dropout"))
  x = nn.Dropout(lora.dropout, name="lora_dropout")(x, deterministic=deterministic)
  return ((x @ a) @ b) * lora.scale


def check_targets(lora: LoRA, params: PyTree, field: str = "lora.targets") -> None:
  """Every target adapts at least one layer of the initialised `params`; otherwise one
  line listing the model's layers."""
  adapted = ["/".join(path[:-1]) for path in leaf_paths(params) if path[-1] == ADAPTER_A]
  for name in lora.targets:
    if not any(selects(name, path) for path in adapted):
      raise ConfigError(f"{field}: {name!r} names no Dense layer of the model; its layers: "
                        f"{', '.join(layer_names(params))}")


# ---- the trainable set ----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class TrainableSet:
  """Which leaves of a parameter tree train; static metadata (works on traced params).

  `split(params)` -> (trainable, frozen), each a nested dict of its leaves under their own
  paths; `merge(trainable, frozen)` -> params, its exact inverse. `size`: the trainable
  floats (what a client would upload per round).
  """
  names: tuple
  paths: tuple        # every leaf's key path, in leaf order
  mask: tuple         # bool per leaf: trainable
  sizes: tuple        # floats per leaf
  treedef: Any

  @property
  def size(self) -> int:
    return int(sum(s for s, m in zip(self.sizes, self.mask) if m))

  @property
  def trainable_names(self) -> tuple:
    return tuple("/".join(p) for p, m in zip(self.paths, self.mask) if m)

  def split(self, params: PyTree) -> tuple:
    leaves = self._leaves(params, "params")
    return (_nested((p, x) for p, x, m in zip(self.paths, leaves, self.mask) if m),
            _nested((p, x) for p, x, m in zip(self.paths, leaves, self.mask) if not m))

  def merge(self, trainable: PyTree, frozen: PyTree) -> PyTree:
    parts = ({}, {})
    for part, tree, what in zip(parts, (trainable, frozen), ("trainable", "frozen")):
      flat, _ = jax.tree.flatten_with_path(tree)
      part.update(zip(leaf_paths(tree), (leaf for _, leaf in flat)))
      expected = {p for p, m in zip(self.paths, self.mask) if m == (what == "trainable")}
      if set(part) != expected:
        wrong = sorted(set(part) ^ expected)[0]
        raise ValueError(f"the {what} part's leaf {'/'.join(wrong)!r} does not match this "
                         f"trainable set ({', '.join(self.names)})")
    leaves = [parts[0][p] if m else parts[1][p] for p, m in zip(self.paths, self.mask)]
    return jax.tree.unflatten(self.treedef, leaves)

  def _leaves(self, params, what):
    leaves, treedef = jax.tree.flatten(params)
    if treedef != self.treedef:
      raise ValueError(f"{what} do not have the parameter tree this trainable set was "
                       f"built for")
    return leaves


def _nested(items) -> dict:
  out = {}
  for path, leaf in items:
    node = out
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = leaf
  return out


def trainable_set(params: PyTree, names: Any = ("lora",),
                  field: str = "trainable") -> TrainableSet:
  """The trainable set of `params` (or their `jax.eval_shape`) declared by `names`: a
  comma-separated string or a sequence of keywords ("lora", "lora_a", "lora_b", "bias",
  "norm") and layer names or globs. A name selecting nothing stops with one line."""
  names = _names(names, field)
  paths = leaf_paths(params)
  joined = ["/".join(p) for p in paths]
  mask = np.zeros(len(paths), bool)
  for name in names:
    if name in _KEYWORDS:
      hit = np.array([_KEYWORDS[name](p) for p in paths], bool)
    else:
      hit = np.array([selects(name, p) for p in joined], bool)
    if not hit.any():
      why = ("the model has no adapters (build it with the model option lora)"
             if name.startswith("lora") else "it names no layer of the model")
      raise ConfigError(f"{field}: {name!r} selects nothing: {why}; accepted: "
                        f"{', '.join(map(repr, _KEYWORDS))} or layer names or globs, its "
                        f"layers: {', '.join(layer_names(params))}")
    mask |= hit
  return TrainableSet(names, tuple(paths), tuple(bool(m) for m in mask),
                      tuple(int(np.prod(np.shape(x))) for x in jax.tree.leaves(params)),
                      jax.tree.structure(params))


# ---- base checkpoints and the merged export ----------------------------------------------------
def is_adapter(path: tuple) -> bool:
  """Whether a leaf's key path (`tree.leaf_paths`) is an adapter (A or B)."""
  return path[-1] in (ADAPTER_A, ADAPTER_B)


def base_of(params: PyTree) -> dict:
  """The base model's parameters: `params` without the adapter leaves."""
  flat, _ = jax.tree.flatten_with_path(params)
  return _nested((p, leaf) for p, (_, leaf) in zip(leaf_paths(params), flat)
                 if not is_adapter(p))


def with_base(params: PyTree, base: PyTree, head: str = "the base parameters",
              hint: str = "") -> PyTree:
  """`params` whose base leaves (all but the adapters) are `base`'s, as they are (the
  parameters of the model without adapters, e.g. a checkpoint): `tree.with_leaves`, whose
  one line, starting with `head`, names a leaf `base` lacks or has in excess or of
  another shape or dtype."""
  return with_leaves(params, base, is_adapter, head, hint)


def merged(params: PyTree, lora: LoRA) -> dict:
  """Plain parameters of the model without adapters: every adapted kernel W becomes
  W + (alpha / r) (A B) (computed in the kernel's dtype at full matmul precision), the
  adapter leaves dropped. With B = 0 the kernels are W exactly."""
  flat = dict(zip(leaf_paths(params), jax.tree.leaves(params)))
  out = []
  for path, leaf in flat.items():
    if is_adapter(path):
      continue
    module = path[:-1]
    if path[-1] == "kernel" and module + (ADAPTER_A,) in flat:
      a, b = flat[module + (ADAPTER_A,)], flat[module + (ADAPTER_B,)]
      if np.shape(a)[-1] != lora.rank:
        raise ConfigError(f"lora.rank={lora.rank} but the adapters of "
                          f"{'/'.join(module)!r} have rank {np.shape(a)[-1]}")
      product = jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)
      leaf = leaf + (product * lora.scale).astype(leaf.dtype)
    out.append((path, leaf))
  return _nested(out)
