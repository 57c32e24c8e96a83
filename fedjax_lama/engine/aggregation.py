"""The step between the clients' uploads and the server update: the algorithm's declared
aggregation (Algorithm.aggregate) with the run's stage (RunOptions.aggregator) around the
aggregate of the model upload.

Per group of clients (inside the vmapped client computation, engine/local.py):

    uploads = uplink(uploads)                       the compressor (stages.uplink), keys per
                                                    (round, client id, upload, leaf)
    uploads[model] = run.client(uploads[model])     the run stage's client part (a clip)
    v_i = reduction.fn(uploads_i, info_i)           each declared aggregate
    streaming: (sum_i a_i v_i, sum_i a_i)           added over chunks and shards (ChunkSums)
    whole cohort: Stack(v, p, mask)                 concatenated over chunks (C x d floats)

Once per round (`RoundAggregation.finish`): each aggregate's server part, giving the
`Aggregates` the algorithm's server update reads, the stages' new state (kept in the
program state, checkpointed) and scalars for the metrics.

Keys: the uplink draws from rng.STREAM_UPLINK as before; the stages from
rng.STREAM_AGGREGATE: client parts from (round, client id), server parts from the round,
the run stage from member 0 and declared aggregate number i from member i + 1.
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


def uplink_uploads(compressor: Optional[compression.Compressor], base_key: jax.Array,
                   round_idx, client_ids: jax.Array, uploads: dict) -> dict:
  """Every vector upload of every client (leaves [C, ...]) as the server decodes it: the
  compressor as a client transform (stages.uplink).

  Upload number u of the dict (declaration order) draws from fold_in(base_key, u), then
  (round, client id) and the compressor's own per-leaf folds, so several uploads (SCAFFOLD's
  delta and dc) never share draws and no key depends on the cohort's padding or order.
  All-scalar uploads (FedNova's ||a_i||_1) stay 32-bit floats.
  """
  if compression.is_identity(compressor):
    return uploads
  stage = stages.uplink(compressor)
  out = {}
  for u, (name, value) in enumerate(uploads.items()):
    if compression.is_scalar_upload(jax.tree.map(lambda x: x[0], value)):
      out[name] = value
      continue
    round_key = jax.random.fold_in(jax.random.fold_in(base_key, u), round_idx)
    out[name] = apply_client(stage, (), rng.client_keys(round_key, client_ids), value)
  return out


class _Resolved(NamedTuple):
  fn: Any                  # (uploads, info) -> one client's value
  stage: stages.Stage      # the declared stage
  run: Optional[stages.Stage]  # the run stage around it (the model upload's aggregate only)

  @property
  def reducer(self) -> stages.Stage:
    return self.run if self.run is not None and self.run.reduces else self.stage


class RoundAggregation:
  """An algorithm's declared aggregation with the run's stage, for the engine to call.

  `stage`: the run-level stage (None: exactly the algorithm's declaration). It applies to the
  model upload (MODEL_UPLOAD, "delta"): its client part to the decoded upload before any
  aggregate reads it, its server part around the aggregate of that name (`stages.around`: a
  reducing stage replaces the declared reducer, a transform runs before it).
  `weighting`: the run's p_i (config weighting), reported in Aggregates.weighting.
  """

  def __init__(self, algorithm: Algorithm, stage: Optional[stages.Stage] = None, *,
               seed=0, weighting: str = "examples", name: str = "this algorithm"):
    self.algorithm, self.stage, self.seed, self.weighting = algorithm, stage, seed, weighting
    self.name = name  # the algorithm's registry name, for refusals

  @property
  def model_upload(self) -> str:
    return MODEL_UPLOAD

  def resolve(self, upload_names) -> dict:
    declared = self.algorithm.aggregations_for(upload_names)
    if self.stage is not None and self.model_upload not in declared:
      raise ConfigError(f"aggregator {self.stage.name!r} cannot run config.algorithm="
                        f"{self.name!r}: it uploads no model displacement "
                        f"{self.model_upload!r} (y - x) for the stage to apply to; accepted: "
                        "algorithms whose upload 'delta' is y - x")
    return {name: _Resolved(red.fn, red.stage,
                            self.stage if name == self.model_upload else None)
            for name, red in declared.items()}

  def whole_cohort(self, upload_names) -> bool:
    """Whether some aggregate needs the cohort's stack (gathered across chunks)."""
    return any(r.reducer.reduction == stages.WHOLE_COHORT
               for r in self.resolve(upload_names).values())

  # ---- state -------------------------------------------------------------------------------
  def init(self, params: PyTree, upload_names) -> dict:
    """The stages' state: {"run": the run stage's, name: each declared stage's}; only the
    entries with arrays are kept, so a run with no stateful stage has the state {}."""
    state = {}
    if self.stage is not None:
      state["run"] = self.stage.init(params)
    for name, r in self.resolve(upload_names).items():
      if not (r.run is not None and r.run.reduces):
        state[name] = r.stage.init(params)
    return {k: v for k, v in state.items() if jax.tree_util.tree_leaves(v)}

  def _state(self, states: Optional[dict], key: str, stage: stages.Stage):
    """The state of `key`; a stage without arrays of state (left out of `init`'s dict)
    gets its empty state again (its init needs no params)."""
    states = states or {}
    return states[key] if key in states else stage.init(None)

  # ---- per group of clients ----------------------------------------------------------------
  def on_clients(self, uploads: dict, client_ids: jax.Array, round_idx, states=None,
                 leaf_mask: Optional[PyTree] = None) -> dict:
    """The run stage's client part on the model upload (leaves [C, ...]). `leaf_mask`
    (a params-shaped pytree of booleans, a layer-wise schedule's synchronised leaves): the
    stage sees those leaves only, the others as zeros (clipped by the norm of the leaves
    being synchronised; a whole-cohort reducer's values outside them are discarded)."""
    if self.stage is None:
      return uploads
    value = uploads[self.model_upload]
    if leaf_mask is not None:
      value = jax.tree.map(lambda m, x: jnp.where(m, x, jnp.zeros_like(x)), leaf_mask, value)
    if self.stage.client is not None:
      client_root, _ = stage_key_roots(self.seed, round_idx)
      keys = jax.vmap(lambda k: jax.random.fold_in(k, 0))(
          rng.client_keys(client_root, client_ids))
      value = apply_client(self.stage, self._state(states, "run", self.stage), keys, value)
    return {**uploads, self.model_upload: value}

  def reduce(self, uploads: dict, info: ClientInfo, model_state: PyTree, weights: jax.Array,
             client_mask: jax.Array, states=None, round_idx=0) -> ChunkSums:
    """The aggregates of a group's decoded uploads: (sum, weight) pairs for the streaming
    ones, the group's stack for the whole-cohort ones."""
    values, stacks = {}, {}
    for i, (name, r) in enumerate(self.resolve(uploads).items()):
      per_client = jax.vmap(r.fn)(uploads, info)
      if r.stage.client is not None and not (r.run is not None and r.run.reduces):
        client_root, _ = stage_key_roots(self.seed, round_idx)
        keys = jax.vmap(lambda k, i=i: jax.random.fold_in(k, i + 1))(
            rng.client_keys(client_root, info.client_id))
        per_client = apply_client(r.stage, self._state(states, name, r.stage), keys,
                                  per_client)
      reducer = r.reducer
      if reducer.reduction == stages.WHOLE_COHORT:
        stacks[name] = stages.Stack(per_client, weights, client_mask,
                                    info.client_id.astype(jnp.int32))
      else:
        a = weights if reducer.weights == stages.ROUND_WEIGHTS else client_mask
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
    for i, (name, r) in enumerate(self.resolve(names).items()):
      if name in sums.stacks:
        reduced = sums.stacks[name]
      else:
        a = sums.weight if r.reducer.weights == stages.ROUND_WEIGHTS else sums.participants
        reduced = stages.Sums(sums.values[name], a)
      if r.run is not None and r.run.server is not None:
        run_key = jax.random.fold_in(server_key, 0)
        reduced, new, more = r.run.server(reduced, self._state(states, "run", r.run), run_key)
        if "run" in states:
          states["run"] = new
        scalars.update(more)
      if not (r.run is not None and r.run.reduces):
        reduced, new, more = r.stage.server(reduced, self._state(states, name, r.stage),
                                            jax.random.fold_in(server_key, i + 1))
        if name in states:
          states[name] = new
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
