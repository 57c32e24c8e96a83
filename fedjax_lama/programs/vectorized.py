"""Several runs of one synchronous algorithm as one jitted computation: a run axis beside the
client axis (issue 19, "vectorized sweeps").

Runs that share shapes -- the same config but for the seed and the local learning rate, as a
paper's seeds and learning-rate grid are -- train together: each round is ONE jitted call of
`jax.vmap` over runs of the synchronous round (engine/sync_round.py), each run with its own
federation (the partition follows its seed), cohort, batches, keys, initial model, rate,
server state and per-client rows. Every run computes exactly what its sequential run does
(to float rounding: XLA may batch the arithmetic differently), and writes the same files.

The learning rate enters as a traced scale of the run's learning rate built with rate 1
(every decay of programs/round_program.py's `LearningRate` is linear in its base rate), the
seed as a traced key root.
"""
import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lama.engine import aggregation, cohort as cohort_lib, local, sync_round
from fedjax_lama.engine.algorithm import Algorithm
from fedjax_lama.programs.round_program import (ProgramBase, RoundOutput, RunOptions, pack,
                                                steps_per_round)


def _stack(trees):
  return jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *trees)


def _unstack(tree, num: int):
  return [jax.tree.map(lambda x, i=i: x[i], tree) for i in range(num)]


def _same(arrays) -> bool:
  first = arrays[0]
  return all(a is first or (np.shape(a) == np.shape(first) and np.array_equal(a, first))
             for a in arrays[1:])


def _stack_padded(arrays) -> np.ndarray:
  """Stacks the runs' cohort arrays, zero-padded to a common shape. Runs of other seeds have
  other partitions, so a full-batch step (FedSGD) packs a different largest client per run;
  zero padding is the engine's own (masks 0, index 0), which changes nothing."""
  shape = np.max([np.shape(a) for a in arrays], axis=0)
  return np.stack([np.pad(a, [(0, t - n) for n, t in zip(np.shape(a), shape)])
                   for a in arrays])


class VectorizedSyncProgram(ProgramBase):
  """R synchronous runs trained together (see the module docstring).

  opts_list[r] are the runs' options: equal but for seed and learning_rate.lr (checked); feds,
  params and model_states are per run. Each run takes the whole static cohort as one chunk.
  What the runs share (the algorithm's traffic, the chain's codec, the model's loss) is built
  by the one program constructor from run 0.
  """

  def __init__(self, opts_list: Sequence[RunOptions], algorithm: Algorithm, model,
               params_list, model_state_list, feds, mesh):
    self.num_runs = len(opts_list)
    base = opts_list[0]
    for i, o in enumerate(opts_list):
      differ = [k for k in ("rounds", "local_steps", "local_epochs", "batch_size", "weighting",
                            "eval_every", "label_smoothing", "unroll")
                if getattr(o, k) != getattr(base, k)]
      stage_name = lambda opts: opts.aggregator.name if opts.aggregator is not None else None
      if stage_name(o) != stage_name(base):
        differ.append("aggregator")
      if (differ or o.learning_rate.decay != base.learning_rate.decay
          or o.sampler.kind != base.sampler.kind):
        raise ValueError(f"run {i} differs from run 0 in "
                         f"{differ or 'the learning rate decay or sampling'}; vectorized runs "
                         "may differ only in seed and local learning rate")
    if base.trainable:
      raise ValueError(f"RunOptions.trainable={base.trainable!r}: vectorized runs train every "
                       "parameter (each run's frozen base would be its own); run them one by "
                       "one")
    super().__init__(base, algorithm, model, params_list[0], model_state_list[0], feds[0],
                     mesh)
    self.opts_list, self.feds = list(opts_list), feds
    self.num_rounds = base.rounds
    self.num_steps = max(steps_per_round(o, f) for o, f in zip(opts_list, feds))
    self.chunk_size = max(o.sampler.max_cohort for o in opts_list)
    learning_rate = dataclasses.replace(base.learning_rate, lr=1.0).build(
        base.rounds * self.num_steps, self.num_steps)
    self.params_list, self.model_state_list = list(params_list), list(model_state_list)
    num_clients = feds[0].num_clients
    # Training arrays: shared when every run has the same (no seed-dependent validation split).
    xs = [np.asarray(f.dataset.train_x) for f in feds]
    ys = [np.asarray(f.dataset.train_y, np.int32) for f in feds]
    self.data_shared = _same(xs) and _same(ys)
    self.data_x = jnp.asarray(xs[0]) if self.data_shared else jnp.stack(xs)
    self.data_y = jnp.asarray(ys[0]) if self.data_shared else jnp.stack(ys)
    data_axis = None if self.data_shared else 0
    plan, loss_fn = self.plan, self.loss_fn
    weighting, steps, augment, unroll = base.weighting, self.num_steps, base.augment, base.unroll
    aggregator = base.aggregator

    def one_run(server, store, agg_state, data_x, data_y, cohort, round_idx, seed, lr):
      train_chunk, server_update = sync_round.make_round_fns(
          loss_fn, algorithm, lambda step: learning_rate(step) * lr, seed=seed, weighting=weighting,
          local_steps=steps, population=num_clients, unroll=unroll, augment=augment, jit=False,
          client_devices=self.mesh.size, plan=plan, aggregator=aggregator,
          name=base.algorithm_name)
      rows = cohort_lib.gather_rows(store, cohort.client_ids) if store else {}
      sums, new_rows, stats = train_chunk(server, rows, data_x, data_y, cohort, round_idx,
                                          agg_state)
      if store:
        store = cohort_lib.scatter_rows(store, cohort.client_ids, cohort.client_mask, new_rows)
      new, new_agg, scalars = server_update(server, sums, agg_state, round_idx)
      has = sums.weight > 0
      server = jax.tree.map(lambda a, b: jnp.where(has, a, b), new, server)
      return server, store, new_agg, scalars, jnp.sum(stats.loss_sum), jnp.sum(stats.count)

    self._round = local.jit_training(
        jax.vmap(one_run, in_axes=(0, 0, 0, data_axis, data_axis, 0, None, 0, 0)),
        plan=plan, donate_argnums=(0, 1, 2))
    self.seeds = jnp.asarray([o.seed for o in opts_list], jnp.int32)
    self.lrs = jnp.asarray([o.learning_rate.lr for o in opts_list], jnp.float32)
    # Each run's stage state starts from its own seed (an attack's malicious clients).
    self.aggregations = [aggregation.RoundAggregation(algorithm, o.aggregator, seed=o.seed,
                                                      weighting=o.weighting,
                                                      name=o.algorithm_name)
                         for o in opts_list]

  def init_state(self):
    servers = [self.algorithm.server.init(p, s)
               for p, s in zip(self.params_list, self.model_state_list)]
    stores = [{}] * self.num_runs
    if self.algorithm.row_init is not None:
      stores = [jax.tree.map(
          lambda r: jnp.broadcast_to(r, (f.num_clients,) + jnp.shape(r)),
          self.algorithm.row_init(p)) for p, f in zip(self.params_list, self.feds)]
    state = {"server": _stack(servers), "rows": _stack(stores) if stores[0] else {}}
    agg_states = [a.init(p, self.traffic.upload_shapes)
                  for a, p in zip(self.aggregations, self.params_list)]
    if agg_states[0]:  # only a stage with state adds to the checkpointed state
      state["aggregation"] = _stack(agg_states)
    return state

  def run_round(self, state, round_idx: int):
    cohorts, sizes = [], []
    for opts, fed in zip(self.opts_list, self.feds):
      ids = opts.sampler.sample(round_idx)
      if len(ids) > self.chunk_size:
        raise ValueError(f"a Bernoulli cohort of {len(ids)} clients exceeds the static "
                         f"{self.chunk_size}: run it sequentially (chunks)")
      cohorts.append(pack(opts, fed, ids, round_idx, self.chunk_size, self.num_steps))
      sizes.append(len(ids))
    cohort = cohort_lib.Cohort(*[_stack_padded(x) for x in zip(*cohorts)])
    agg_state = state.get("aggregation", {})
    server, rows, agg_state, scalars, loss, count = self._round(
        state["server"], state["rows"], agg_state, self.data_x, self.data_y, cohort, round_idx,
        self.seeds, self.lrs)
    loss, count = np.asarray(loss), np.asarray(count)
    scalars = {k: np.asarray(v) for k, v in jax.device_get(scalars).items()}
    t = self.traffic
    reports = ([{}] * self.num_runs if self.reporter.default else
               [self.reporter.scalars(self.run_state({"server": server}, i)["server"])
                for i in range(self.num_runs)])
    outs = [RoundOutput(float(l / c) if c else 0.0, float(c), t.up_per_leaf * n,
                        t.down_per_leaf * n, None,
                        {"clients": n, **report,
                         **aggregation.stage_metrics({k: v[i] for k, v in scalars.items()})},
                        bits_up=self.bits_up_per_client * n, floats_up_other=t.up_other * n,
                        floats_down_other=t.down_other * n)
            for i, (l, c, n, report) in enumerate(zip(loss, count, sizes, reports))]
    new_state = {"server": server, "rows": rows}
    if "aggregation" in state:
      new_state["aggregation"] = agg_state
    return new_state, outs

  def run_state(self, state, run: int):
    """The state of one run, as its sequential program would hold it (for checkpoints)."""
    return jax.tree.map(lambda x: x[run], state)

  def stack_states(self, states):
    return _stack(states)

  def run_eval_params(self, state, run: int):
    """(params, model_state) of one run, for evaluate.evaluate with self.eval_fn."""
    return self.eval_params(self.run_state(state, run))

  def eval_params(self, run_state):
    """(params, model_state) that one run's state is evaluated with (the algorithm's report)."""
    server = run_state["server"]
    return self.reporter.eval_params(server), server.model_state

  def local_steps_done(self, round_idx: int) -> int:
    return (round_idx + 1) * self.num_steps

