"""Aggregation stages: the one type for every step between the clients' uploads and the server
update (the uplink codec, DP's clip and noise, an upload attack, a robust rule, the mean).

A stage is a bundle of pure functions, composed like optax transforms (`chain`) and wrapped
like TensorFlow Federated's aggregation factories (a clip around a noise around a mean):

    state = stage.init(params)                                  kept in the program state
    value = stage.client(value, state, key)                     one client's upload, inside
                                                                the vmapped client computation
    reduced = Sums(sum_i a_i v_i, sum_i a_i)                    stage.consumes == SUMS
            | Stack(v [C, ...], weights [C], mask [C], ids [C]) stage.consumes == STACK
    out, state, scalars = stage.server(reduced, state, key)     once per round

What a stage consumes is declared: `client` reads each client's upload; `server` reads what
`consumes` names. Running sums are (weighted sum, weight) pairs, which the engine accumulates
over chunks of clients and shards of the client axis in any order (docs/design.md, "The
engine"); the weights a_i are the round's p_i (RunOptions.weighting: examples or uniform) or 1
per participant (`weights=PARTICIPANTS`). The stack is the cohort's per-client values, which
the engine gathers across chunks (C x d floats); padded clients have weight and mask 0 and
must be ignored. A stage either reduces (`reduces`: its server makes the aggregate) or
transforms (its server maps Sums to Sums or Stack to Stack, its client part maps one
client's value). An uplink stage (`uplink(compressor)`) is the codec of every vector upload:
its `codec` is the compressor, which the programs read for the communication ledger.

`chain(a, b, ...)` runs the client parts in order on each client's value, then the server
parts in order, and refuses, naming both members, an order that cannot run: a per-client
stage after one whose server part has already reduced the uploads, a stage reading running
sums after one handing on the stack (or the reverse), anything after a reducer, and an uplink
codec anywhere but first. Keys are per (round, client id) for the client parts and per round
for the server parts (engine/aggregation.py derives them from the seed, rng.STREAM_AGGREGATE);
inside a chain member i draws from fold_in(key, i), the uplink codec from its own stream.
"""
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_lama.errors import ConfigError

PyTree = Any

# What a stage's server part reads.
SUMS = "sums"      # running (sum_i a_i v_i, sum_i a_i) pairs: streams over chunks and shards
STACK = "stack"    # the cohort's stack of per-client values (gathered across chunks)
CONSUMES = (SUMS, STACK)
_WHAT = {SUMS: "the running sums", STACK: "the cohort's stack"}

# Which per-client weights the sums are taken with.
ROUND_WEIGHTS = "round"          # p_i of the run (examples or uniform; Aggregates.weighting)
PARTICIPANTS = "participants"    # 1 per real client (sums over the participants)
WEIGHTINGS = (ROUND_WEIGHTS, PARTICIPANTS)


class Sums(NamedTuple):
  """What a SUMS stage's server receives: sum_i a_i v_i and sum_i a_i."""
  total: PyTree
  weight: jax.Array


class Stack(NamedTuple):
  """What a STACK stage's server receives: the cohort's per-client values."""
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
  client: Optional[ClientFn] = None    # each client's upload, inside the vmapped computation
  server: Optional[ServerFn] = None    # once per round, on what `consumes` names
  consumes: Optional[str] = None       # SUMS | STACK: what `server` reads (None: no server)
  reduces: bool = False                # `server` returns the aggregate: last in a chain
  weights: str = ROUND_WEIGHTS         # SUMS: which a_i (WEIGHTINGS)
  # The server part runs in every round, one that drew no client included (user-level DP
  # releases its noise every round, as its accountant counts them).
  every_round: bool = False
  # The uplink codec (compression.Compressor) applied to every vector upload before anything
  # else reads it; a chain carries its first member's.
  codec: Any = None

  @property
  def reads(self) -> tuple:
    """What the stage consumes, in the order it reads them: "uploads" (its client part),
    then its server's SUMS or STACK."""
    return (("uploads",) if self.client is not None else ()) + (
        (self.consumes,) if self.server is not None else ())

  @property
  def acts(self) -> bool:
    """Whether the stage has a client or a server part (an uplink stage alone has neither:
    the engine applies its codec)."""
    return self.client is not None or self.server is not None


def _check(stage: Stage) -> Stage:
  if stage.server is not None and stage.consumes not in CONSUMES:
    raise ConfigError(f"stage {stage.name!r}: consumes={stage.consumes!r}; accepted: "
                      f"{', '.join(map(repr, CONSUMES))} (what its server part reads)")
  if stage.server is None and (stage.consumes is not None or stage.reduces):
    raise ConfigError(f"stage {stage.name!r} declares consumes={stage.consumes!r}, "
                      f"reduces={stage.reduces} but has no server function")
  if stage.weights not in WEIGHTINGS:
    raise ConfigError(f"stage {stage.name!r}: weights={stage.weights!r}; accepted: "
                      f"{', '.join(WEIGHTINGS)}")
  return stage


def make(name: str, **fields) -> Stage:
  """A checked stage."""
  return _check(Stage(name, **fields))


# ---- composition ---------------------------------------------------------------------------
def check_order(*stages: Stage) -> None:
  """Refuses (ConfigError naming both members) an order of stages that cannot run: client
  parts all run before the reduction, and each server part reads what the one before it
  hands on."""
  for i, s in enumerate(stages[1:], 1):
    if s.codec is not None:
      raise ConfigError(f"chain: {s.name!r} is the uplink codec of every upload but comes "
                        f"after {stages[i - 1].name!r}; accepted: the uplink codec first")
  before = None  # the last member with a server part
  for s in stages:
    if before is not None and before.reduces and s.acts:
      raise ConfigError(f"chain: stage {before.name!r} reduces ({_WHAT[before.consumes]} to "
                        f"the aggregate) but is not last: {s.name!r} comes after it; "
                        "accepted: transforms first, at most one reducer, last")
    if s.client is not None and before is not None:
      raise ConfigError(f"chain: {s.name!r} works on each client's upload but comes after "
                        f"{before.name!r}, whose server part has already taken "
                        f"{_WHAT[before.consumes]}; accepted: the stages on each client's "
                        "upload first")
    if s.server is None:
      continue
    if before is not None and s.consumes != before.consumes:
      raise ConfigError(f"chain: {s.name!r} reads {_WHAT[s.consumes]} but {before.name!r} "
                        f"hands on {_WHAT[before.consumes]}; accepted: a stage that reads "
                        f"{_WHAT[before.consumes]} after it")
    if (before is not None and s.consumes == SUMS and s.weights != before.weights):
      raise ConfigError(f"chain: {s.name!r} sums with weights={s.weights!r} but "
                        f"{before.name!r} with weights={before.weights!r}; accepted: one "
                        "weighting per chain")
    before = s


def chain(*stages: Stage) -> Stage:
  """The stages in order as one stage (`check_order` refuses an order that cannot run).

  Client parts run in order on each client's value; server parts run in order on the reduced
  value. The state is the tuple of the members' states. A first member that is an uplink
  codec (`uplink`) is carried as the chain's `codec` and is not a member: the chain of
  `uplink(c), b` is `b` with codec c (its state and keys are b's).
  """
  if not stages:
    raise ConfigError("chain() needs at least one stage")
  check_order(*stages)
  codec = stages[0].codec
  if codec is not None and len(stages) > 1:
    return chain(*stages[1:])._replace(codec=codec)
  if len(stages) == 1:
    return stages[0]
  servers = [s for s in stages if s.server is not None]

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
  if servers:
    def server(reduced, state, key):
      new_states, scalars = [], {}
      for i, (s, st) in enumerate(zip(stages, state)):
        if s.server is not None:
          reduced, st, more = s.server(reduced, st, jax.random.fold_in(key, i))
          scalars.update(more)
        new_states.append(st)
      return reduced, tuple(new_states), scalars

  name = "(" + ", ".join(s.name for s in stages) + ")"
  return make(name, init=init, client=client, server=server,
              consumes=servers[0].consumes if servers else None,
              reduces=any(s.reduces for s in stages),
              weights=servers[0].weights if servers else ROUND_WEIGHTS,
              every_round=any(s.every_round for s in stages))


# ---- the reducers every algorithm declares (engine/algorithm.py: MEAN, SUM) ---------------
def _safe(weight: jax.Array) -> jax.Array:
  return jnp.where(weight > 0, weight, 1.0)


def mean() -> Stage:
  """sum_i p_i v_i / sum_i p_i with the round's weights (an empty round divides by 1)."""
  def server(sums: Sums, state, key):
    del key
    denom = _safe(sums.weight)
    return jax.tree.map(lambda s: s / denom, sums.total), state, {}
  return make("mean", server=server, consumes=SUMS, reduces=True)


def total() -> Stage:
  """sum_i v_i over the participants (for the 1/N means over the federation)."""
  def server(sums: Sums, state, key):
    del key
    return sums.total, state, {}
  return make("sum", server=server, consumes=SUMS, reduces=True, weights=PARTICIPANTS)


# ---- the uplink codec ------------------------------------------------------------------------
def uplink(compressor) -> Stage:
  """The uplink compressor as the codec of every vector upload: the engine replaces each
  client's upload by what the server decodes, compressor.roundtrip(key, v) =
  decode(encode(key, v)) (fedjax_lama.compression; FedPAQ's QSGD), with keys per (round,
  client id, upload) from rng.STREAM_UPLINK, before any other stage or aggregate reads it.
  First in a chain; all-scalar uploads (FedNova's ||a_i||_1) are sent as they are."""
  return make(f"uplink[{compressor.name}]", codec=compressor)
