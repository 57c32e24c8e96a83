"""The clients' half of a round: fresh local states, and `ClientPhase`, which runs the
vmapped local scan and the algorithm's `finish` for a group of clients (what happens to
their uploads next, the uplink codec included, is the aggregation's: engine/aggregation.py)."""
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_lama.engine import local
from fedjax_lama.engine.algorithm import Algorithm, ClientContext, ClientInfo, LocalState
from fedjax_lama.engine.cohort import Cohort
from fedjax_lama.engine.plan import PlatformPlan
from fedjax_lama.tree import PyTree, broadcast_clients


class ClientStats(NamedTuple):
  loss_sum: jax.Array  # [C]
  correct: jax.Array   # [C]
  count: jax.Array     # [C]


def client_contexts(shared, rows, cohort: Cohort) -> ClientContext:
  """The contexts of a cohort's clients (leaves [C, ...]; `shared` as given)."""
  return ClientContext(shared, rows, cohort.num_examples, cohort.client_ids)


def fresh_state_axes(algorithm: Algorithm, shared_per_client: bool = False) -> LocalState:
  """Which fields of `fresh_states(..., batched=False)` have the client axis (0) and which
  are one value for every client (None): `local.vmap_clients`'s `state_axes`."""
  per_client_opt = algorithm.local.init is not None or shared_per_client
  # A personalized start (Algorithm.start) runs inside each client's training, from this
  # common state.
  return LocalState(0 if shared_per_client else None, None, 0 if per_client_opt else None)


def fresh_states(algorithm: Algorithm, ctx: ClientContext, model_state, num: int,
                 shared_per_client: bool = False, batched: bool = True) -> LocalState:
  """Every client starts its round at the downloaded model with the server's statistics
  and a fresh local optimizer (local optimizer state "reset", the only rule synchronous
  rounds run); a personalized start (`Algorithm.start`) rewrites it inside the client's
  training (engine/local.py).

  batched=False leaves the fields every client shares without the client axis
  (`fresh_state_axes` says which), for a ClientPhase built with those `state_axes`.
  """
  axes = fresh_state_axes(algorithm, shared_per_client)
  if axes.opt_state == 0:
    opt = jax.vmap(algorithm.local.init_state,
                   in_axes=(local.context_axes(shared_per_client),))(ctx)
  else:  # the same fresh state for everyone: built once
    opt = algorithm.local.tx.init(ctx.shared["params"])
  state = LocalState(ctx.shared["params"], model_state, opt)
  if not batched:
    return state
  return LocalState(*(broadcast_clients(v, num) if a is None else v
                      for v, a in zip(state, axes)))


class ClientPhase:
  """A group of clients' local training and finish, vectorized (callers jit).

    final, stats = phase.train(state, ctx, data_x, data_y, cohort, keys, step_offset, key_offset)
    info = phase.info(stats, cohort, step_offset)          # or a schedule's own per-leaf info
    uploads, rows = phase.finish(final, ctx, info)

  `uploads` are what the clients send (`RoundAggregation.decode` gives what the server
  decodes). `client_devices`: the devices the client axis is split over (the run's mesh
  size; default every device), `local.vmap_clients`.
  `plan`: the run's platform plan, whose client map and scan group bytes add the client
  axis (None: the default backend's choice); `client_map` says
  which map was taken ("vmap" or "scan").
  """

  def __init__(self, loss_fn: local.LossFn, algorithm: Algorithm, learning_rate: Callable, *,
               unroll=1, augment: Optional[Callable] = None,
               poison: Optional[Callable] = None,
               shared_per_client: bool = False, state_axes: Optional[LocalState] = None,
               client_devices: Optional[int] = None, plan: Optional[PlatformPlan] = None):
    self.algorithm, self.learning_rate = algorithm, learning_rate
    self.client_map = local.resolve_client_map(plan.client_map if plan is not None else None)

    def vmapped_train(begins: bool):
      return local.vmap_clients(
          local.make_client_train(loss_fn, algorithm, learning_rate, augment=augment,
                                  unroll=unroll, poison=poison, begins=begins),
          shared_per_client, client_map=self.client_map, state_axes=state_axes,
          devices=client_devices,
          scan_group_bytes=plan.scan_group_bytes if plan is not None else None)

    # A call that begins the clients' round, and one that continues it (FedLAMA's later
    # sub-rounds: no personalized start again); they differ only with Algorithm.start.
    self._train = {True: vmapped_train(True)}
    self._train[False] = (vmapped_train(False) if algorithm.start is not None
                          else self._train[True])
    self._ctx_axes = local.context_axes(shared_per_client)

  def train(self, state: LocalState, ctx: ClientContext, data_x, data_y, cohort: Cohort, keys,
            step_offset, key_offset=0, *, reduce_group: Optional[Callable] = None, extras=None,
            begins: bool = True, frozen=None):
    """(final, stats) stacked over the clients; with `reduce_group(final, stats, ctx,
    extras) -> (kept, sums)`, each group of clients is handed to it as it finishes and
    (kept stacked over the clients, sums added) is returned (`local.vmap_clients`).
    `begins`: these steps begin the clients' round (the personalized start applies).
    `frozen`: the parameters outside the trainable set (a LoRA run's base), one copy
    broadcast to every client and read by the loss (`local.bind_frozen`); None or {}
    when every parameter trains. The state's params are the trainable set."""
    batch = local.ClientBatch(cohort.indices, cohort.example_mask, cohort.step_mask, keys)
    return self._train[bool(begins)](state, ctx, data_x, data_y, batch, step_offset,
                                     key_offset, reduce_group=reduce_group, extras=extras,
                                     frozen=frozen)

  def info(self, stats: local.StepStats, cohort: Cohort, step_offset) -> ClientInfo:
    lr0 = jnp.broadcast_to(jnp.asarray(self.learning_rate(step_offset), jnp.result_type(float)),
                           cohort.client_ids.shape)
    return ClientInfo(stats.steps, stats.effective_step, lr0, cohort.num_examples,
                      cohort.client_ids)

  def finish(self, final: LocalState, ctx: ClientContext,
             info: ClientInfo) -> tuple[dict, PyTree]:
    """(uploads, rows) of every client: the algorithm's `finish`, vmapped."""
    return jax.vmap(self.algorithm.finish, in_axes=(0, self._ctx_axes, 0))(final, ctx, info)


def client_stats(stats: local.StepStats) -> "ClientStats":
  return ClientStats(stats.loss_sum, stats.correct, stats.count)
