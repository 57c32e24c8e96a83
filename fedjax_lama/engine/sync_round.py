"""One synchronous round of any algorithm, as the two jitted pieces every round program shares.

    sums, rows, stats = train_chunk(server, rows, data, cohort, round[, agg_state, frozen])
    server = server_update(server, sums added over the chunks[, agg_state])      # once

`train_chunk` runs the clients (engine/clients.py's ClientPhase), applies the run's
aggregation chain to their uploads (the uplink codec, then the chain's client part) and
reduces them into the algorithm's aggregates
(engine/aggregation.py) as (weighted sum, weight) pairs, so chunked, sharded and single-call
runs reduce the same quantities, plus the cohort's stack for a whole-cohort stage;
`server_update` finishes the aggregates once and runs the algorithm's server update. The
layer-wise schedule (fedjax_lama.fedlama) uses the same pieces with per-leaf masks
(engine/leafwise.py).
"""
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from fedjax_lama import rng
from fedjax_lama.engine import aggregation, local, reduce, stages
from fedjax_lama.engine.aggregation import ChunkSums
from fedjax_lama.engine.algorithm import Algorithm, ServerState
from fedjax_lama.engine.clients import (ClientPhase, client_contexts, client_stats,
                                        fresh_state_axes, fresh_states)
from fedjax_lama.engine.cohort import Cohort
from fedjax_lama.engine.plan import PlatformPlan


def make_round_fns(loss_fn: local.LossFn, algorithm: Algorithm, learning_rate: Callable, *,
                   seed: int, weighting: str, local_steps: int, population: int, unroll=1,
                   augment: Optional[Callable] = None, poison: Optional[Callable] = None,
                   jit: bool = True,
                   client_devices: Optional[int] = None, plan: Optional[PlatformPlan] = None,
                   aggregator: Optional[stages.Stage] = None, name: str = "this algorithm"):
  """Returns (train_chunk, server_update), both jitted, for a synchronous round.

  local_steps: the static step axis of a round (the global step count of round r's first
  step is r * local_steps, for the learning rate). population: N, for the
  algorithms' 1/N global means. seed may be traced and the learning rate may close over traced
  values when jit=False (several runs vmapped over a run axis, programs/vectorized.py).
  client_devices: the size of the mesh the client axis is split over (default every device).
  plan: the run's platform plan (client map, scan groups, compiler options; None: the
  default backend's).
  aggregator: the run's aggregation chain (run/spec.py `run_chain`: its uplink codec on every
  upload, the rest around the model upload's aggregate; None: the algorithm's declaration
  alone); its state, `aggregation.RoundAggregation.init`, is passed
  as `agg_state` to both functions. server_update(server, sums) gives the new server state;
  server_update(server, sums, agg_state, round_idx) gives (server, agg_state, scalars); the
  round index keys the stages' server-side draws. `frozen` (train_chunk's last argument):
  the parameters outside the trainable set, which the server state's params are (a LoRA
  run's base, models/lora.py; engine/clients.py `ClientPhase.train`). poison: a data attack on the clients'
  batches inside the local step (local.make_client_train).
  """
  phase = ClientPhase(loss_fn, algorithm, learning_rate, unroll=unroll,
                      augment=augment, poison=poison, state_axes=fresh_state_axes(algorithm), client_devices=client_devices,
                      plan=plan)
  agg = aggregation.RoundAggregation(algorithm, aggregator, seed=seed, weighting=weighting,
                                     name=name)

  def train_chunk(server: ServerState, rows, data_x, data_y, cohort: Cohort, round_idx,
                  agg_state=None, frozen=None):
    num = cohort.indices.shape[0]
    ctx = client_contexts(algorithm.shared(server), rows, cohort)
    state = fresh_states(algorithm, ctx, server.model_state, num, batched=False)
    keys = rng.client_keys(rng.round_key(seed, rng.STREAM_TRAIN, round_idx), cohort.client_ids)
    step_offset = round_idx * local_steps
    weights = reduce.client_weights(cohort.client_mask, cohort.num_examples, weighting)

    def finish_and_reduce(final, stats, ctx, extras):
      # One group of clients at a time: the round keeps their rows and statistics and
      # only the sums of their uploads, never every client's final model.
      group, group_weights = extras
      info = phase.info(stats, group, step_offset)
      uploads, rows = phase.finish(final, ctx, info)
      uploads = agg.decode(uploads, group.client_ids, round_idx)
      uploads = agg.on_clients(uploads, group.client_ids, round_idx, agg_state)
      sums = agg.reduce(uploads, info, final.model_state, group_weights, group.client_mask,
                        agg_state, round_idx)
      # A whole-cohort stage's values are kept per client (stacked over the groups).
      return (rows, client_stats(stats), sums.stacks), sums._replace(stacks={})

    per_client = cohort._replace(indices=None, example_mask=None, step_mask=None)
    (rows, stats, stacks), sums = phase.train(state, ctx, data_x, data_y, cohort, keys,
                                              step_offset, reduce_group=finish_and_reduce,
                                              extras=(per_client, weights), frozen=frozen)
    return sums._replace(stacks=stacks), rows, stats

  def server_update(server: ServerState, sums: ChunkSums, agg_state=None, round_idx=0):
    aggregates, new_state, scalars = agg.finish(sums, population, agg_state, round_idx)
    new = algorithm.server.update(server, aggregates)
    new = new._replace(model_state=aggregation.mean_model_state(sums))
    # An empty cohort (Bernoulli sampling can draw none) leaves the server as it was.
    has = sums.weight > 0
    keep = lambda a, b: jnp.where(has, a, b)
    new = jax.tree.map(keep, new, server)
    if agg_state is None:
      return new
    return new, jax.tree.map(keep, new_state, agg_state), scalars

  if not jit:
    return train_chunk, server_update
  return local.jit_training(train_chunk, plan=plan), jax.jit(server_update)


