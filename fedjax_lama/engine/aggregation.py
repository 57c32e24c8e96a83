"""The step between the clients' uploads and the server update: the algorithm's declared
aggregation (Algorithm.aggregate) with the run's chain of stages (RunOptions.aggregator,
engine/stages.py) around the aggregate of the model upload.

Per group of clients (inside the vmapped client computation, engine/local.py):

    uploads = decode(uploads)                       the chain's uplink codec, keys per
                                                    (round, client id, upload, leaf)
    uploads[model] = run.client(uploads[model])     the chain's client part (a clip)
    v_i = reduction.fn(uploads_i, info_i)           each declared aggregate
    running sums: (sum_i a_i v_i, sum_i a_i)        added over chunks and shards (ChunkSums)
    the stack: Stack(v, p, mask, ids)               concatenated over chunks (C x d floats)

Once per round (`RoundAggregation.finish`): each aggregate's server parts in order (the
chain's, then the declared stage's unless the chain reduces: `around`), giving the
`Aggregates` the algorithm's server update reads, the stages' new state (kept in the
program state, checkpointed) and scalars for the metrics.

Keys: the codec draws from rng.STREAM_UPLINK; the stages from rng.STREAM_AGGREGATE: client
parts from (round, client id), server parts from the round, the run's chain from member 0
and declared aggregate number i from member i + 1.
"""
from typing import Any, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lama import compression, rng
from fedjax_lama.engine import reduce, stages
from fedjax_lama.engine.algorithm import MODEL_UPLOAD, Aggregates, Algorithm, ClientInfo
from fedjax_lama.errors import ConfigError
from fedjax_lama.tree import PyTree

EMPTY_STATE: dict = {}


class ChunkSums(NamedTuple):
  """A round's aggregates before the server parts: add chunks, finish once."""
  values: dict          # name -> sum_i a_i v_i (a_i = p_i, or the client mask for SUM)
  model_state: PyTree   # sum_i p_i s_i (BatchNorm statistics)
  weight: jax.Array     # sum_i p_i
  participants: jax.Array  # sum_i client_mask_i
  # name -> stages.Stack of the whole-cohort aggregates ({} when there are none): the
  # cohort's per-client values, concatenated over chunks.
  stacks: dict = EMPTY_STATE


def add_sums(a: ChunkSums, b: ChunkSums) -> ChunkSums:
  """Sums add; whole-cohort stacks are concatenated along the client axis."""
  out = jax.tree.map(jnp.add, a._replace(stacks={}), b._replace(stacks={}))
  if not a.stacks:
    return out
  return out._replace(stacks=jax.tree.map(lambda x, y: jnp.concatenate([x, y]),
                                          a.stacks, b.stacks))


def mean_model_state(sums: ChunkSums) -> PyTree:
  denom = jnp.where(sums.weight > 0, sums.weight, 1.0)
  return jax.tree.map(lambda s: s / denom, sums.model_state)


def stage_key_roots(seed, round_idx):
  """(root of the clients' keys, the server key) of a round's stages (rng.STREAM_AGGREGATE)."""
  base = jax.random.fold_in(rng.root_key(seed), rng.STREAM_AGGREGATE)
  return (jax.random.fold_in(jax.random.fold_in(base, 0), round_idx),
          jax.random.fold_in(jax.random.fold_in(base, 1), round_idx))


def apply_client(stage: stages.Stage, state: PyTree, keys: jax.Array, value: PyTree) -> PyTree:
  """A stage's client part on every client's value (leaves [C, ...], keys [C])."""
  return jax.vmap(stage.client, in_axes=(0, None, 0))(value, state, keys)


class _Member(NamedTuple):
  """One stage of an aggregate's chain, as the engine keys it."""
  state_key: str       # its state's entry: "run" (the run's stage) or the aggregate's name
  key_index: int       # its keys: fold_in(stream key, key_index)
  stage: stages.Stage


class _Resolved(NamedTuple):
  """One aggregate: fn(uploads_i, info_i) of each client, then its chain of stages."""
  fn: Any
  members: tuple       # _Member...: the run's stage around the declared one (`around`)

  def _first_server(self) -> stages.Stage:
    return next(m.stage for m in self.members if m.stage.server is not None)

  @property
  def consumes(self) -> str:
    return self._first_server().consumes

  @property
  def weights(self) -> str:
    return self._first_server().weights


def around(run: Optional[stages.Stage], declared: stages.Stage) -> tuple:
  """The run's stage wrapped around an aggregate's declared stage (TFF's factory wrapping):
  a reducing run stage replaces the declared one; a transform runs before it
  (`stages.check_order` refuses an order that cannot run, naming both)."""
  if run is None:
    return (declared,)
  if run.reduces:
    return (run,)
  stages.check_order(run, declared)
  return (run, declared)


class RoundAggregation:
  """An algorithm's declared aggregation with the run's chain, for the engine to call.

  `stage`: the run's chain (run/spec.py `run_chain`; None: exactly the algorithm's
  declaration). Its uplink codec (`stage.codec`) decodes every vector upload (`decode`); the
  rest applies to the model upload (MODEL_UPLOAD, "delta"): its client part to the decoded
  upload before any aggregate reads it (`on_clients`), its server part around the aggregate
  of that name (`around`). The run's stage is keyed "run" (state) and 0 (keys), the declared
  stage of aggregate number i by its name and i + 1. `weighting`: the run's p_i (config
  weighting), reported in Aggregates.weighting.
  """

  def __init__(self, algorithm: Algorithm, stage: Optional[stages.Stage] = None, *,
               seed=0, weighting: str = "examples", name: str = "this algorithm"):
    self.algorithm, self.seed, self.weighting = algorithm, seed, weighting
    self.codec = stage.codec if stage is not None else None
    self.stage = stage if stage is not None and stage.acts else None
    self.name = name  # the algorithm's registry name, for refusals

  @property
  def model_upload(self) -> str:
    return MODEL_UPLOAD

  @property
  def every_round(self) -> bool:
    """The run's stage releases something every round (DP's noise): a round that drew no
    client still runs it (programs/sync.py runs one chunk of padding)."""
    return self.stage is not None and self.stage.every_round

  def resolve(self, upload_names) -> dict:
    declared = self.algorithm.aggregations_for(upload_names)
    if self.stage is not None and self.model_upload not in declared:
      raise ConfigError(f"aggregator {self.stage.name!r} cannot run config.algorithm="
                        f"{self.name!r}: it uploads no model displacement "
                        f"{self.model_upload!r} (y - x) for the stage to apply to; accepted: "
                        "algorithms whose upload 'delta' is y - x")
    out = {}
    for i, (name, red) in enumerate(declared.items()):
      run = self.stage if name == self.model_upload else None
      members = [_Member("run", 0, s) if s is run else _Member(name, i + 1, s)
                 for s in around(run, red.stage)]
      out[name] = _Resolved(red.fn, tuple(members))
    return out

  def whole_cohort(self, upload_names) -> bool:
    """Whether some aggregate needs the cohort's stack (gathered across chunks)."""
    return any(r.consumes == stages.STACK for r in self.resolve(upload_names).values())

  # ---- state -------------------------------------------------------------------------------
  def init(self, params: PyTree, upload_names) -> dict:
    """The stages' state: {"run": the run stage's, name: each declared stage's}; only the
    entries with arrays are kept, so a run with no stateful stage has the state {}."""
    state = {}
    for r in self.resolve(upload_names).values():
      for m in r.members:
        state[m.state_key] = m.stage.init(params)
    return {k: v for k, v in state.items() if jax.tree.leaves(v)}

  def _state(self, states: Optional[dict], member: _Member):
    """A member's state; a stage without arrays of state (left out of `init`'s dict) gets its
    empty state again (its init needs no params)."""
    states = states or {}
    key = member.state_key
    return states[key] if key in states else member.stage.init(None)

  # ---- per group of clients ----------------------------------------------------------------
  def decode(self, uploads: dict, client_ids: jax.Array, round_idx) -> dict:
    """Every vector upload of every client (leaves [C, ...]) as the server decodes it through
    the uplink codec (none: the uploads as they are).

    Upload number u of the dict (declaration order) draws from fold_in(base key, u), then
    (round, client id) and the compressor's own per-leaf folds, so several uploads (SCAFFOLD's
    delta and dc) never share draws and no key depends on the cohort's padding or order.
    All-scalar uploads (FedNova's ||a_i||_1) stay 32-bit floats.
    """
    if compression.is_identity(self.codec):
      return uploads
    base_key = compression.base_key(self.seed)
    out = {}
    for u, (name, value) in enumerate(uploads.items()):
      if compression.is_scalar_upload(jax.tree.map(lambda x: x[0], value)):
        out[name] = value
        continue
      round_key = jax.random.fold_in(jax.random.fold_in(base_key, u), round_idx)
      keys = rng.client_keys(round_key, client_ids)
      out[name] = jax.vmap(self.codec.roundtrip)(keys, value)
    return out

  def _client_keys(self, round_idx, client_ids, index: int) -> jax.Array:
    client_root, _ = stage_key_roots(self.seed, round_idx)
    return jax.vmap(lambda k: jax.random.fold_in(k, index))(
        rng.client_keys(client_root, client_ids))

  def on_clients(self, uploads: dict, client_ids: jax.Array, round_idx, states=None,
                 leaf_mask: Optional[PyTree] = None) -> dict:
    """The run stage's client part on the decoded model upload (leaves [C, ...]).
    `leaf_mask` (a params-shaped pytree of booleans, a layer-wise schedule's synchronised
    leaves): the stage sees those leaves only, the others as zeros (clipped by the norm of
    the leaves being synchronised; a whole-cohort reducer's values outside them are
    discarded)."""
    if self.stage is None:
      return uploads
    value = uploads[self.model_upload]
    if leaf_mask is not None:
      value = jax.tree.map(lambda m, x: jnp.where(m, x, jnp.zeros_like(x)), leaf_mask, value)
    if self.stage.client is not None:
      run = _Member("run", 0, self.stage)
      value = apply_client(self.stage, self._state(states, run),
                           self._client_keys(round_idx, client_ids, 0), value)
    return {**uploads, self.model_upload: value}

  def reduce(self, uploads: dict, info: ClientInfo, model_state: PyTree, weights: jax.Array,
             client_mask: jax.Array, states=None, round_idx=0) -> ChunkSums:
    """The aggregates of a group's decoded uploads: (sum, weight) pairs for those whose chain
    consumes running sums, the group's stack for those that consume the stack."""
    values, stacks = {}, {}
    for name, r in self.resolve(uploads).items():
      per_client = jax.vmap(r.fn)(uploads, info)
      for m in r.members:  # the run's client part has run on the upload (`on_clients`)
        if m.state_key != "run" and m.stage.client is not None:
          per_client = apply_client(m.stage, self._state(states, m),
                                    self._client_keys(round_idx, info.client_id, m.key_index),
                                    per_client)
      if r.consumes == stages.STACK:
        stacks[name] = stages.Stack(per_client, weights, client_mask,
                                    info.client_id.astype(jnp.int32))
      else:
        a = weights if r.weights == stages.ROUND_WEIGHTS else client_mask
        values[name] = reduce.weighted_sum(per_client, a)
    return ChunkSums(values, reduce.weighted_sum(model_state, weights), jnp.sum(weights),
                     jnp.sum(client_mask), stacks)

  # ---- once per round ------------------------------------------------------------------------
  def finish(self, sums: ChunkSums, population: int, states=None,
             round_idx=0) -> tuple[Aggregates, dict, dict]:
    """(Aggregates, the stages' new state, scalars) from a round's summed ChunkSums."""
    states = dict(states or {})
    _, server_key = stage_key_roots(self.seed, round_idx)
    names = list(sums.values) + list(sums.stacks)
    values, scalars = {}, {}
    for name, r in self.resolve(names).items():
      if name in sums.stacks:
        reduced = sums.stacks[name]
      else:
        a = sums.weight if r.weights == stages.ROUND_WEIGHTS else sums.participants
        reduced = stages.Sums(sums.values[name], a)
      for m in r.members:
        if m.stage.server is None:
          continue
        reduced, new, more = m.stage.server(reduced, self._state(states, m),
                                            jax.random.fold_in(server_key, m.key_index))
        if m.state_key in states:
          states[m.state_key] = new
        scalars.update(more)
      values[name] = reduced
    return (Aggregates(values, sums.participants, population, self.weighting), states,
            scalars)


def stage_metrics(scalars: Mapping[str, Any], prefix: str = "aggregator_") -> dict:
  """A round's stage scalars (on the host) as metrics.jsonl values, `prefix` + name: a 0-d
  value as a float; an integer vector (client ids, -1 marking an empty slot: the clients a
  selecting rule kept) as the sorted list of its entries >= 0."""
  out = {}
  for name, value in scalars.items():
    value = np.asarray(value)
    if value.ndim == 0:
      out[prefix + name] = float(value)
    elif value.ndim == 1 and np.issubdtype(value.dtype, np.integer):
      out[prefix + name] = sorted(int(i) for i in value if i >= 0)
    else:
      raise ValueError(f"stage scalar {name!r} has shape {value.shape} ({value.dtype}); "
                       "accepted: a 0-d value or a vector of integer ids")
  return out


def reduce_uploads(algorithm: Algorithm, uploads: dict, info: ClientInfo, model_state: PyTree,
                   weights: jax.Array, client_mask: jax.Array) -> ChunkSums:
  """The algorithm's declared aggregates of a group's decoded uploads (no run stage)."""
  return RoundAggregation(algorithm).reduce(uploads, info, model_state, weights, client_mask)


def aggregates(algorithm: Algorithm, sums: ChunkSums, population: int,
               weighting: str = "examples") -> Aggregates:
  """The Aggregates of summed ChunkSums, for an algorithm whose stages keep no state."""
  return RoundAggregation(algorithm, weighting=weighting).finish(sums, population)[0]
