"""Local training: one `lax.scan` over local steps, vmapped over clients.

The body is one masked step of the algorithm's local rule (engine/algorithm.py). A padded step (step_mask 0) leaves the
whole carry -- parameters, normalisation statistics and optimiser moments --
bit-for-bit unchanged (a `jnp.where` on the carry, not a zero-gradient step,
which would still move momentum and weight decay).
"""
import math
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_lama.engine import plan as plan_lib
from fedjax_lama.engine.algorithm import Algorithm, ClientContext, LocalState
from fedjax_lama.tree import PyTree, tree_where

# loss_fn(params, model_state, x, y, example_mask, key[, frozen])
#   -> (loss, (new_model_state, num_correct))
# `frozen`: the parameters that do not train (a LoRA run's base, models/lora.py), given to
# a loss built over a trainable set (`make_loss_fn(..., merge=...)`); the engine passes it
# only when it has leaves (`bind_frozen`), so a six-argument loss runs as it always did.
LossFn = Callable[..., tuple[jax.Array, tuple[PyTree, jax.Array]]]


def bind_frozen(loss_fn: LossFn, frozen: PyTree) -> LossFn:
  """The six-argument loss of `loss_fn` over the trainable set with the frozen rest
  `frozen`: `loss_fn` itself when `frozen` has no leaves (every parameter trains)."""
  if not jax.tree.leaves(frozen):
    return loss_fn
  return lambda params, model_state, x, y, example_mask, key: loss_fn(
      params, model_state, x, y, example_mask, key, frozen)


def jit_training(fn: Callable, plan: Optional[plan_lib.PlatformPlan] = None,
                 **jit_kwargs) -> Callable:
  """`jax.jit(fn, **jit_kwargs)` for a function that runs local training, with the compiler
  options of the run's platform `plan` (default: the plan of JAX's default backend)."""
  plan = plan if plan is not None else plan_lib.plan(client_map="auto")
  return jax.jit(fn, compiler_options=plan.jit_compiler_options(), **jit_kwargs)


class StepStats(NamedTuple):
  loss_sum: jax.Array  # sum over real examples of the per-example loss
  correct: jax.Array
  count: jax.Array
  steps: jax.Array     # real (unpadded) steps
  effective_step: jax.Array  # ||a||_1 of these steps from a fresh optimizer (ClientInfo)
  # For a schedule that counts the effective step across calls (FedLAMA, per leaf since
  # its last synchronisation): with a unit momentum M carried into this call (the
  # momentum the optimizer would hold had every earlier gradient been 1), the call's
  # effective step is effective_step + carry_gain * M and M becomes
  # unit_momentum + unit_decay * M. Exact without a proximal pull (LocalSGD.pull = 0).
  carry_gain: jax.Array
  unit_momentum: jax.Array
  unit_decay: jax.Array


class ClientBatch(NamedTuple):
  """One client's slice of a packed cohort (engine/cohort.py's Cohort): the rows of the
  training arrays each local step reads, which are real, and the client's key."""
  indices: jax.Array       # int32 [S, B]: rows of data_x, data_y
  example_mask: jax.Array  # float32 [S, B]: 1 for real examples
  step_mask: jax.Array     # float32 [S]: 1 for real steps (padded steps leave the carry as is)
  key: jax.Array           # the client's key of the round; step s uses fold_in(key, offset + s)


class UnitState(NamedTuple):
  """The local optimizer run on a scalar whose every gradient is 1 (FedNova's ||a||_1)."""
  displacement: jax.Array  # e: -e is the effective step so far
  momentum: jax.Array      # m: the unit momentum from a fresh state
  decay: jax.Array         # p: what is left of a unit momentum carried in (momentum^k)
  carry_gain: jax.Array    # b: the effective step per unit of momentum carried in


def unit_step(unit: UnitState, rule, lr) -> UnitState:
  """One local step of the linear rule `rule` (engine.algorithm.LocalSGD) on the unit problem."""
  beta, pull = rule.momentum, rule.pull
  m = beta * unit.momentum + 1.0 + pull * unit.displacement
  p = beta * unit.decay
  if rule.nesterov:
    d, dp = 1.0 + pull * unit.displacement + beta * m, beta * p
  else:
    d, dp = m, p
  return UnitState(unit.displacement - lr * d, m, p, unit.carry_gain + lr * dp)


def fresh_unit() -> UnitState:
  zero = jnp.zeros((), jnp.result_type(float))
  return UnitState(zero, zero, jnp.ones_like(zero), zero)


# Targets below zero are padding, never a class: sequence datasets whose padding
# target is a vocabulary id (Reddit's <PAD> 0) are remapped to it by the training
# code, so the engine needs no per-dataset pad id.
PAD_TARGET = -1


def align_logits(logits: jax.Array, y: jax.Array) -> jax.Array:
  """Per-position logits [B, L, K] with one label per row [B] -> last position.

  That is LEAF's Shakespeare task (predict the character after the window,
  option target='last') with a sequence model; every other pairing passes.
  """
  if logits.ndim == y.ndim + 2:
    return logits[:, -1]
  return logits


def token_mask(y: jax.Array, example_mask: jax.Array,
               pad_id: Optional[int] = None) -> jax.Array:
  """float32 [B, L]: 1 for scored targets of real examples (y >= 0, y != pad_id)."""
  valid = y >= 0
  if pad_id is not None:
    valid = valid & (y != pad_id)
  return example_mask[:, None] * valid.astype(jnp.float32)


def token_losses(logits: jax.Array, y: jax.Array, label_smoothing: float = 0.0) -> jax.Array:
  """Cross-entropy per target position; padded targets get the loss of class 0 (masked later)."""
  safe = jnp.maximum(y, 0)
  if label_smoothing:
    labels = optax.smooth_labels(jax.nn.one_hot(safe, logits.shape[-1]), label_smoothing)
    return optax.softmax_cross_entropy(logits, labels)
  return optax.softmax_cross_entropy_with_integer_labels(logits, safe)


def make_loss_fn(model, has_model_state: bool, label_smoothing: float = 0.0,
                 pad_id: Optional[int] = None, merge: Optional[Callable] = None,
                 remat: bool = False) -> LossFn:
  """Masked mean cross-entropy of a flax module in training mode.

  merge: (trainable, frozen) -> the model's parameters (models/lora.py
  `TrainableSet.merge`): the loss then takes the trainable set as `params` and the frozen
  rest as a seventh argument `frozen`, and merges them inside, so that a gradient is taken
  over the trainable set alone and the frozen leaves are an input of the traced program
  (never a per-client copy under the client vmap). None: `params` are the whole model.
  remat: the whole loss under `jax.checkpoint`: the backward pass recomputes the forward
  pass and then reads all of it, so a step keeps as many values as without it; per-block
  rematerialization (the transformer's option `remat`) is what saves memory
  (docs/performance.md, "LoRA").

  Labels y [B] (one class per example): the mean over real examples
  (example_mask), `num_correct` counts examples.
  Next-token targets y [B, L] (logits [B, L, K]): the mean over scored tokens,
  mask = example_mask[:, None] * (y >= 0) * (y != pad_id); `num_correct`
  counts tokens. Targets < 0 (PAD_TARGET) are always padding; `pad_id` adds a
  vocabulary id that is (None: none). Padded positions change neither the
  loss nor its gradient. Out-of-vocabulary targets (Reddit's <UNK>) are scored
  like any other token; LEAF's Reddit accuracy instead counts a correct <UNK>
  prediction as wrong.
  The engine (make_client_train) weights each step's mean by its number of
  real EXAMPLES, so the reported training loss of sequence data is a mean of
  per-step token means weighted by examples: the per-token mean when every
  row has the same number of scored tokens (Shakespeare), close to it
  otherwise (Reddit's padded rows).
  """

  def loss_fn(params, model_state, x, y, example_mask, key, frozen=None):
    if merge is not None:
      params = merge(params, {} if frozen is None else frozen)
    variables = {"params": params, **({"batch_stats": model_state} if has_model_state else {})}
    rngs = {"dropout": key} if key is not None else {}
    if has_model_state:
      logits, updates = model.apply(variables, x, train=True, mutable=["batch_stats"], rngs=rngs)
      new_state = updates["batch_stats"]
    else:
      logits = model.apply(variables, x, train=True, rngs=rngs)
      new_state = model_state
    logits = align_logits(logits, y)
    if y.ndim == 2:
      mask = token_mask(y, example_mask, pad_id)
      count = jnp.sum(mask)
      loss = jnp.sum(token_losses(logits, y, label_smoothing) * mask) / jnp.maximum(count, 1.0)
      correct = jnp.sum((jnp.argmax(logits, -1) == y) * mask)
      return loss, (new_state, correct)
    num_classes = logits.shape[-1]
    labels = optax.smooth_labels(jax.nn.one_hot(y, num_classes), label_smoothing) \
        if label_smoothing else jax.nn.one_hot(y, num_classes)
    per_example = optax.softmax_cross_entropy(logits, labels)
    count = jnp.sum(example_mask)
    loss = jnp.sum(per_example * example_mask) / jnp.maximum(count, 1.0)
    correct = jnp.sum((jnp.argmax(logits, -1) == y) * example_mask)
    return loss, (new_state, correct)

  return jax.checkpoint(loss_fn) if remat else loss_fn


def make_client_train(loss_fn: LossFn, algorithm: Algorithm,
                      learning_rate: Callable[[jax.Array], jax.Array], *,
                      augment: Optional[Callable[[jax.Array, jax.Array], jax.Array]] = None,
                      unroll: int | bool = 1, poison: Optional[Callable] = None,
                      begins: bool = True):
  """Builds `client_train(state, ctx, data_x, data_y, batch, step_offset, key_offset=0,
  frozen=None) -> (state, StepStats summed over steps)` for ONE client (`batch`: its
  ClientBatch). `frozen`: the parameters outside the trainable set (`bind_frozen`), read
  by the loss and never moved; the state's params are the trainable set.

  With `begins` (a call that starts the client's round; False for the later spans of a
  round split into several calls, FedLAMA's sub-rounds), `algorithm.start` (the
  personalized start, engine/algorithm.py), when set, rewrites the given state once, before
  the first step, from the losses it may ask for on step 0's batch (FedPer's own head,
  HypCluster's choice of cluster).
  Each step evaluates `algorithm.grad` (one or more gradients on the step's batch; it may
  also update the local optimizer state) and moves the parameters by -lr * local.tx(g), the
  local optimizer's update with the client's context as optax's extra argument `ctx`, which
  a gradient correction at the head of its chain reads (engine/algorithm.py). Beside it the same
  steps of `algorithm.local.rule` run on the unit problem (`unit_step`), which gives the
  client's effective step (StepStats.effective_step, per client, padded steps skipped, each
  step's own learning rate). step_offset is the global local-step count of the first step
  (for the learning rate); step s uses the key fold_in(batch.key, key_offset + s), so a span
  of steps split into several calls draws the same keys as one call over the whole span.

  batch.indices[S, B] are rows of the device-resident training arrays (data_x, data_y);
  the gather happens inside the step, so only indices cross the host boundary.
  `poison(x, y, indices, client_id) -> (x, y)` (a data attack, the backdoor's trigger) rewrites
  the step's batch after augmentation, so a triggered example keeps the trigger where the
  evaluation stamps it.
  """
  local_tx = optax.with_extra_args_support(algorithm.local.tx)
  grad_oracle = algorithm.grad
  rule = algorithm.local.rule
  start = algorithm.start if begins else None

  def client_train(state: LocalState, ctx: ClientContext, data_x, data_y, batch: ClientBatch,
                   step_offset, key_offset=0, frozen=None):
    num_steps = batch.indices.shape[0]
    bound_loss = bind_frozen(loss_fn, frozen)
    keys = jax.vmap(lambda s: jax.random.fold_in(batch.key, s))(
        key_offset + jnp.arange(num_steps))

    def step_batch(idx, k):
      x = data_x[idx]
      y = data_y[idx]
      if augment is not None:
        x = augment(x, jax.random.fold_in(k, 1))
      if poison is not None:
        x, y = poison(x, y, idx, ctx.client_id)
      return x, y

    if start is not None:
      given = state

      def loss_at(params):
        # Step 0's batch exactly as step 0 trains on it (traced only if the start asks).
        x0, y0 = step_batch(batch.indices[0], keys[0])
        return bound_loss(params, given.model_state, x0, y0, batch.example_mask[0], keys[0])[0]

      state = start(state, ctx, loss_at)

    def step(both, inp):
      carry, unit = both
      idx, emask, smask, k, s = inp
      x, y = step_batch(idx, k)
      value_and_grad = jax.value_and_grad(
          lambda p: bound_loss(p, carry.model_state, x, y, emask, k), has_aux=True)
      (loss, (new_model_state, correct_count)), grads, opt_state = grad_oracle(
          value_and_grad, carry.params, ctx, carry.opt_state)
      direction, new_opt = local_tx.update(grads, opt_state, carry.params, ctx=ctx)
      lr = learning_rate(step_offset + s)
      new_params = jax.tree.map(lambda p, u: p - lr * u, carry.params, direction)
      new = LocalState(new_params, new_model_state, new_opt)
      real = smask > 0
      count = jnp.sum(emask)
      # Step counts and the unit problem in the default float dtype (float64 under
      # jax_enable_x64): SCAFFOLD, FedCM and FedNova divide by them.
      real_f = real.astype(jnp.result_type(float))
      if rule is not None:
        unit = tree_where(real, unit_step(unit, rule, jnp.asarray(lr, real_f.dtype)), unit)
      sums = (loss * count * real, correct_count * real, count * real, real_f)
      return (tree_where(real, new, carry), unit), sums

    (final, unit), sums = jax.lax.scan(
        step, (state, fresh_unit()),
        (batch.indices, batch.example_mask, batch.step_mask, keys, jnp.arange(num_steps)),
        unroll=unroll)
    loss_sum, correct_sum, count, steps = (jnp.sum(a, axis=0) for a in sums)
    if rule is None:  # no linear rule: no effective step
      nan = jnp.full_like(steps, jnp.nan)
      return final, StepStats(loss_sum, correct_sum, count, steps, nan, nan, nan, nan)
    return final, StepStats(loss_sum, correct_sum, count, steps, -unit.displacement,
                            unit.carry_gain, unit.momentum, unit.decay)

  return client_train


def context_axes(shared_per_client: bool = False) -> ClientContext:
  """vmap axes of a ClientContext: rows and client facts mapped; the downloads broadcast
  unless `shared_per_client` (asynchronous clients starting from different models)."""
  return ClientContext(0 if shared_per_client else None, 0, 0, 0)


# How the client axis is added (`vmap_clients`; see `plan.CLIENT_MAPS`). A run's plan
# (`plan.PlatformPlan.client_map`, from config.engine.client_map) says which; a caller
# without one gets the default backend's ("auto").
CLIENT_MAPS = plan_lib.CLIENT_MAPS
SCAN_GROUP_BYTES = plan_lib.SCAN_GROUP_BYTES


def resolve_client_map(client_map: Optional[str] = None, platform: Optional[str] = None) -> str:
  """"vmap" or "scan" for `client_map` ("auto", "vmap" or "scan"; None: "auto") on
  `platform` (default jax's)."""
  return plan_lib.resolve_client_map("auto" if client_map is None else client_map, platform)


def _jaxpr_bytes(jaxpr) -> int:
  """Bytes of every value a jaxpr computes, sub-jaxprs (scan bodies, calls) included once."""
  total = 0
  for eqn in jaxpr.eqns:
    for v in eqn.outvars:
      aval = v.aval
      if hasattr(aval, "shape") and hasattr(aval, "dtype"):
        total += math.prod(aval.shape) * getattr(aval.dtype, "itemsize", 4)
    for param in eqn.params.values():
      for sub in (param if isinstance(param, (list, tuple)) else (param,)):
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          total += _jaxpr_bytes(sub)
  return total


def step_bytes(loss_fn: LossFn, params: PyTree, model_state: PyTree, x, y) -> int:
  """Bytes of every value of one local step's loss and gradient on a batch shaped like x, y
  (arrays or jax.ShapeDtypeStructs): traced, never run. A measure of a step's work."""
  def grad(p, s, bx, by):
    key = jax.random.PRNGKey(0)  # for dropout; only its shape matters here
    return jax.grad(lambda q: loss_fn(q, s, bx, by, jnp.ones(bx.shape[:1]), key)[0])(p)
  return _jaxpr_bytes(jax.make_jaxpr(grad)(params, model_state, x, y).jaxpr)


def scan_group(num_clients: int, step_bytes: int, budget: int = None,
               devices: Optional[int] = None) -> int:
  """Clients per scan iteration: a multiple of the devices the client axis may be split
  over (base = gcd(C, devices); `devices` default: every device) dividing C, the largest
  whose clients per device keep within `budget` bytes (SCAN_GROUP_BYTES), at least base."""
  budget = SCAN_GROUP_BYTES if budget is None else budget
  base = math.gcd(num_clients, jax.device_count() if devices is None else devices)
  best = base
  for per_device in range(1, num_clients // base + 1):
    if (num_clients // base) % per_device == 0 and per_device * step_bytes <= budget:
      best = base * per_device
  return best


def vmap_clients(client_train, shared_per_client: bool = False, client_map: Optional[str] = None,
                 state_axes: Optional[LocalState] = None, devices: Optional[int] = None,
                 scan_group_bytes: Optional[int] = None):
  """Adds the client axis: state, context and ClientBatch mapped; the training data and the
  offsets broadcast.

  `client_map` ("auto", "vmap", "scan"; default `resolve_client_map()`'s) picks the plan,
  see `platform.CLIENT_MAPS`. With "scan" and groups of `width` clients the C clients are viewed as
  [width, C / width] (client c = w * C / width + s, so a client axis split into contiguous
  blocks over the devices stays split over w), scanned over s and vmapped over w.
  `devices`: how many devices the client axis is split over (the run's mesh; default every
  device), and `scan_group_bytes` the values one group may hold per device (default
  SCAN_GROUP_BYTES), for the scan map's group width (`scan_group`).
  `state_axes`: a LocalState of 0 (the field has the client axis) or None (one value every
  client starts from, `clients.fresh_states(..., batched=False)`); default all 0. Why: a start
  shared by every client need not be copied C times before the round. With the scan map the
  copy and its transpose into scan order were 13 % of the operations' time in a trace of a
  leaf_cnn round (6.6 M parameters); without them rounds ran 1.03x to 1.04x faster
  (a profiled leaf_cnn round).

  The returned function gives (final, stats) stacked over the clients; called with
  `reduce_group` (and `extras`, per-client arrays mapped like the batches), it gives
  instead `(kept, sums)`: reduce_group(final, stats, ctx, extras) -> (kept, sums) runs on
  each group of clients (leaves with a leading group axis; the whole cohort for "vmap"),
  `kept` is stacked over the clients and `sums` is added over the groups. Why: a round
  that only needs its clients' weighted sums then never holds every client's final model
  at once; with the scan map each client's result is folded into the running sums where
  it is made, instead of being written into a [C, ...] buffer, masked and reduced
  afterwards.
  """
  state_axes = LocalState(0, 0, 0) if state_axes is None else state_axes
  # The training data, the offsets and the frozen parameters are broadcast: one copy for
  # every client.
  in_axes = (state_axes, context_axes(shared_per_client), None, None, 0, None, None, None)
  vmapped = jax.vmap(client_train, in_axes=in_axes)

  def vmapped_reduced(state, ctx, data_x, data_y, batch, step_offset, key_offset=0,
                      reduce_group=None, extras=None, frozen=None):
    out = vmapped(state, ctx, data_x, data_y, batch, step_offset, key_offset, frozen)
    return out if reduce_group is None else reduce_group(*out, ctx, extras)

  if resolve_client_map(client_map) == "vmap":
    return vmapped_reduced

  def scanned(state, ctx, data_x, data_y, batch, step_offset, key_offset=0, reduce_group=None,
              extras=None, frozen=None):
    num = batch.indices.shape[0]
    # Fields every client shares are closed over, not scanned.
    common = state._replace(**{f: None for f, a in zip(state._fields, state_axes) if a == 0})
    own = state._replace(**{f: None for f, a in zip(state._fields, state_axes) if a is None})
    mapped = (own, ctx if shared_per_client else ctx._replace(shared=None), batch, extras)
    one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype),
                                 mapped[:-1])
    rest = jax.tree.map(lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)),
                        (data_x, data_y, step_offset, key_offset, frozen))

    def with_common(st):
      return LocalState(*(c if a is None else o for c, o, a in zip(common, st, state_axes)))

    def with_shared(cx):
      return cx if shared_per_client else cx._replace(shared=ctx.shared)

    def one_client(st, cx, bt, dx, dy, so, ko, fz):
      return client_train(with_common(st), with_shared(cx), dx, dy, bt, so, ko, fz)

    client_jaxpr, client_out = jax.make_jaxpr(one_client, return_shape=True)(*one, *rest)
    width = scan_group(num, _jaxpr_bytes(client_jaxpr.jaxpr), budget=scan_group_bytes,
                       devices=devices)
    if width >= num:
      return vmapped_reduced(state, ctx, data_x, data_y, batch, step_offset, key_offset,
                             reduce_group, extras, frozen)
    split = lambda a: jnp.swapaxes(a.reshape((width, num // width) + a.shape[1:]), 0, 1)
    merge = lambda a: jnp.swapaxes(a, 0, 1).reshape((num,) + a.shape[2:])

    def group(xs):
      st, cx, bt, ex = xs
      group_ctx = with_shared(cx)
      if width == 1:
        # One client per iteration: no vmap at all, so convolutions keep their plain
        # (ungrouped) form, the one XLA:CPU runs fast inside loops (fedjax_lama/kernels).
        one = jax.tree.map(lambda a: a[0], (st, cx, bt))
        out = one_client(*one, data_x, data_y, step_offset, key_offset, frozen)
        out = jax.tree.map(lambda a: a[None], out)
      else:
        out = vmapped(with_common(st), group_ctx, data_x, data_y, bt, step_offset, key_offset,
                      frozen)
      return (out, None) if reduce_group is None else reduce_group(*out, group_ctx, ex)

    def body(sums, xs):
      kept, group_sums = group(xs)
      if reduce_group is not None:
        sums = jax.tree.map(jnp.add, sums, group_sums)
      return sums, kept

    groups = jax.tree.map(split, mapped)
    sums = None
    if reduce_group is not None:
      # The sums' shapes from one group's reduction alone (the training was traced above).
      group_out = jax.tree.map(
          lambda a: jax.ShapeDtypeStruct((width,) + a.shape, a.dtype), client_out)
      group_ctx, group_extras = jax.tree.map(
          lambda a: jax.ShapeDtypeStruct((width,) + a.shape[1:], a.dtype), (mapped[1], extras))
      shapes = jax.eval_shape(lambda out, cx, ex: reduce_group(*out, with_shared(cx), ex)[1],
                              group_out, group_ctx, group_extras)
      sums = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)
    sums, kept = jax.lax.scan(body, sums, groups)
    kept = jax.tree.map(merge, kept)
    return kept if reduce_group is None else (kept, sums)

  return scanned
