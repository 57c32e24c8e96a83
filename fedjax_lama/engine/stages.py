"""Aggregation stages: the declared step between the clients' uploads and the server update.

A stage is a bundle of pure functions, composed like optax transforms and wrapped like
TensorFlow Federated's aggregation factories (a clipping factory around a noising factory
around a mean):

    state = stage.init(params)                                  kept in the program state
    value = stage.client(value, state, key)                     one client, inside the vmapped
                                                                client computation (optional)
    reduced = Sums(sum_i a_i v_i, sum_i a_i)                    stage.reduction == "streaming"
            | Stack(v [C, ...], weights [C], mask [C], ids [C]) stage.reduction == "whole_cohort"
    out, state, scalars = stage.server(reduced, state, key)     once per round

Streaming stages see (weighted sum, weight) pairs, which the engine accumulates over chunks
of clients and shards of the client axis in any order (docs/design.md, "The engine"); the
weights a_i are the round's weights p_i (RunOptions.weighting: examples or uniform) or 1 per
participant (`weights=PARTICIPANTS`). Whole-cohort stages (a coordinate median, Krum) see the
cohort's stack of per-client values, which the engine gathers across chunks (C x d floats
per aggregate); padded clients have weight and mask 0 and must be ignored.

A stage either reduces (`reduction` set: its server turns `Sums`/`Stack` into the
aggregate) or transforms (`reduction` None: a client-side clip, the uplink compressor, or a
server-side step that maps `Sums` to `Sums` or `Stack` to `Stack`, such as noise added to a
sum). `chain(transform, ..., reducer)` composes them. Keys are per (round, client id) for
the client part and per round for the server part (engine/aggregation.py derives them from
the seed, rng.STREAM_AGGREGATE); inside a chain member i draws from fold_in(key, i).
"""
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_lama.errors import ConfigError

PyTree = Any

STREAMING = "streaming"
WHOLE_COHORT = "whole_cohort"
REDUCTIONS = (STREAMING, WHOLE_COHORT)

# Which per-client weights a streaming reducer sums with.
ROUND_WEIGHTS = "round"          # p_i of the run (examples or uniform; Aggregates.weighting)
PARTICIPANTS = "participants"    # 1 per real client (sums over the participants)
WEIGHTINGS = (ROUND_WEIGHTS, PARTICIPANTS)


class Sums(NamedTuple):
  """What a streaming stage's server receives: sum_i a_i v_i and sum_i a_i."""
  total: PyTree
  weight: jax.Array


class Stack(NamedTuple):
  """What a whole-cohort stage's server receives: the cohort's per-client values."""
  values: PyTree       # leaves [C, ...], padded clients included
  weights: jax.Array   # [C]: the round's weights p_i, 0 for padded clients
  mask: jax.Array      # [C]: 1 for real clients, 0 for padded ones
  # [C] int32: each row's client id (a stage that treats clients by who they are: the run's
  # malicious clients, the ids a selecting rule kept); None where the caller has none.
  client_ids: Optional[jax.Array] = None


ClientFn = Callable[[PyTree, PyTree, jax.Array], PyTree]
ServerFn = Callable[[Any, PyTree, jax.Array], tuple[Any, PyTree, dict]]


def _no_state(params: PyTree) -> tuple:
  del params
  return ()


class Stage(NamedTuple):
  """One aggregation stage (see the module docstring)."""
  name: str
  init: Callable[[PyTree], PyTree] = _no_state
  client: Optional[ClientFn] = None
  reduction: Optional[str] = None      # STREAMING | WHOLE_COHORT; None: a transform
  server: Optional[ServerFn] = None
  weights: str = ROUND_WEIGHTS         # streaming reducers: which a_i (WEIGHTINGS)

  @property
  def reduces(self) -> bool:
    return self.reduction is not None


def _check(stage: Stage) -> Stage:
  if stage.reduction not in REDUCTIONS + (None,):
    raise ConfigError(f"stage {stage.name!r}: reduction={stage.reduction!r}; accepted: "
                      f"{', '.join(REDUCTIONS)} or None (a transform)")
  if stage.weights not in WEIGHTINGS:
    raise ConfigError(f"stage {stage.name!r}: weights={stage.weights!r}; accepted: "
                      f"{', '.join(WEIGHTINGS)}")
  if stage.reduces and stage.server is None:
    raise ConfigError(f"stage {stage.name!r} reduces ({stage.reduction}) but has no server "
                      "function")
  return stage


def make(name: str, **fields) -> Stage:
  """A checked stage."""
  return _check(Stage(name, **fields))


# ---- composition ---------------------------------------------------------------------------
def chain(*stages: Stage) -> Stage:
  """Transforms applied in order, then (optionally) one reducer, as one stage.

  Client parts run in order on each client's value; server parts run in order on the
  reduced value (transforms map Sums->Sums or Stack->Stack, the reducer makes the
  aggregate). The state is the tuple of the members' states.
  """
  if not stages:
    raise ConfigError("chain() needs at least one stage")
  for s in stages[:-1]:
    if s.reduces:
      raise ConfigError(f"chain: stage {s.name!r} reduces ({s.reduction}) but is not last; "
                        "accepted: transforms first, at most one reducer, last")
  if len(stages) == 1:
    return stages[0]
  last = stages[-1]

  def init(params):
    return tuple(s.init(params) for s in stages)

  client = None
  if any(s.client is not None for s in stages):
    def client(value, state, key):
      for i, (s, st) in enumerate(zip(stages, state)):
        if s.client is not None:
          value = s.client(value, st, jax.random.fold_in(key, i))
      return value

  server = None
  if any(s.server is not None for s in stages):
    def server(reduced, state, key):
      new_states, scalars = [], {}
      for i, (s, st) in enumerate(zip(stages, state)):
        if s.server is not None:
          reduced, st, more = s.server(reduced, st, jax.random.fold_in(key, i))
          scalars.update(more)
        new_states.append(st)
      return reduced, tuple(new_states), scalars

  name = "(" + ", ".join(s.name for s in stages) + ")"
  return make(name, init=init, client=client, reduction=last.reduction, server=server,
              weights=last.weights)


def around(outer: Stage, inner: Stage) -> Stage:
  """`outer` wrapped around `inner` (TFF's factory wrapping): a reducing `outer` replaces
  `inner` altogether; a transform runs before it, `chain(outer, inner)`."""
  return outer if outer.reduces else chain(outer, inner)


# ---- the reducers every algorithm declares (engine/algorithm.py: MEAN, SUM) ---------------
def _safe(weight: jax.Array) -> jax.Array:
  return jnp.where(weight > 0, weight, 1.0)


def mean() -> Stage:
  """sum_i p_i v_i / sum_i p_i with the round's weights (an empty round divides by 1)."""
  def server(sums: Sums, state, key):
    del key
    denom = _safe(sums.weight)
    return jax.tree.map(lambda s: s / denom, sums.total), state, {}
  return make("mean", reduction=STREAMING, server=server)


def total() -> Stage:
  """sum_i v_i over the participants (for the 1/N means over the federation)."""
  def server(sums: Sums, state, key):
    del key
    return sums.total, state, {}
  return make("sum", reduction=STREAMING, server=server, weights=PARTICIPANTS)


# ---- transforms ----------------------------------------------------------------------------
def uplink(compressor) -> Stage:
  """The uplink compressor as a client transform: what the server decodes,
  decode(encode(key, v)) (fedjax_lama.compression; FedPAQ's QSGD)."""
  return make(f"uplink[{compressor.name}]",
              client=lambda value, state, key: compressor.roundtrip(key, value))


def global_norm(tree: PyTree) -> jax.Array:
  """||v||_2 over every leaf of one client's value (accumulated in float32 at least)."""
  leaves = jax.tree_util.tree_leaves(tree)
  acc = jnp.result_type(float)
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.promote_types(x.dtype, acc))))
                      for x in leaves))


def clip_norm(max_norm: float) -> Stage:
  """Each client's value scaled to L2 norm at most `max_norm` over the whole value,
  v * min(1, C / ||v||) (the per-client clip of user-level DP-FedAvg, McMahan et al.,
  ICLR 2018, Algorithm 1; norm bounding against model replacement, Sun et al. 2019)."""
  if not max_norm > 0:
    raise ConfigError(f"clip_norm: max_norm={max_norm!r}; accepted: a positive number")

  def client(value, state, key):
    del state, key
    norm = global_norm(value)
    scale = jnp.minimum(1.0, max_norm / jnp.where(norm > 0, norm, 1.0))
    return jax.tree.map(lambda x: (x * scale).astype(x.dtype), value)

  return make(f"clip_norm[{max_norm:g}]", client=client)


# ---- whole-cohort reducers -------------------------------------------------------------------
def masked_median(values: jax.Array, mask: jax.Array) -> jax.Array:
  """The coordinate-wise median over axis 0 of the rows with mask > 0 (the mean of the two
  middle values for an even count; 0 when no row is real). Padded rows are sorted past the
  real ones, so their contents (even NaN) never enter."""
  real = (mask > 0).reshape((-1,) + (1,) * (values.ndim - 1))
  count = jnp.sum(mask > 0)
  # Padded rows to +inf (sorted last); real NaN stays NaN (sorted after +inf by jnp.sort).
  ordered = jnp.sort(jnp.where(real, values, jnp.inf), axis=0)
  lo = jnp.maximum((count - 1) // 2, 0)
  hi = jnp.maximum(count // 2, 0)
  pick = lambda i: jax.lax.dynamic_index_in_dim(ordered, i, axis=0, keepdims=False)
  med = 0.5 * (pick(lo) + pick(hi))
  return jnp.where(count > 0, med, jnp.zeros_like(med)).astype(values.dtype)


def coordinate_median() -> Stage:
  """The coordinate-wise median of the participants' values, unweighted (Yin et al.,
  ICML 2018, "Byzantine-Robust Distributed Learning", Option I)."""
  def server(stack: Stack, state, key):
    del key
    return jax.tree.map(lambda v: masked_median(v, stack.mask), stack.values), state, {}
  return make("coordinate_median", reduction=WHOLE_COHORT, server=server)


# The run-level stages by name (RunOptions.aggregator; the run helper fills it from the
# config): name -> builder of keyword hyper-parameters.
STAGES = {"clip_norm": clip_norm, "coordinate_median": coordinate_median}
