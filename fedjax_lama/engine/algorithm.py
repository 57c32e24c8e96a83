"""The algorithm interface: the pure functions the one engine calls.

An algorithm is a frozen `Algorithm` record built by a builder that closes over
typed hyper-parameters (fedjax_lama.algorithms.*). It never loops, vmaps, scans,
shards or chunks: the engine (engine/local.py, engine/sync_round.py) calls its
functions for ONE client or ONE server, and adds the client axis itself.

One synchronous round, and which function the engine calls where:

    rule    = algorithm.server                                    the ServerRule
    server  = rule.init(params, model_state)                      once, at the run's start
    shared  = {name: server value for name in rule.downloads}    what goes down
    ctx     = ClientContext(shared, row, num_examples, client_id)
    state   = LocalState(shared["params"], server stats, local.init_state(ctx))
    state   = personal.start(state, ctx, loss on the first batch)   personalized methods only
    for each local step k (a lax.scan, vmapped over clients):
      (loss, aux), g, opt = grad(value_and_grad_at_this_batch, params, ctx, opt)
      direction, opt = local.tx.update(g, opt, params, ctx=ctx)  optax; the engine applies -lr
                       (a correction -- proximal pull, control variates -- is the head of
                        this chain: `corrected`, which reads the context from `ctx`)
    uploads, new_row = finish(final_state, ctx, info)             what goes up; the client's row
    uploads = decode(encode(uploads))                             the run's uplink compressor
    aggregates[name] = stage(reduction.fn(uploads_i, info_i))   engine/aggregation.py
    server = rule.update(server, Aggregates)                      the algorithm's server rule
    eval_params, scalars = rule.report(server)                    what the run evaluates and logs
    params_i, stats_i = personal.serve(server, row_i, loss_at)    each client's own model

Conventions:
- Sign: the upload named "delta" (MODEL_UPLOAD) is the model displacement y - x;
  server optimizers receive the pseudo-gradient G = -mean(delta) (`apply_server_tx`).
  FedLAMA's layer discrepancy reads it when it is there (else y - x from the slots).
- Communication follows from the declaration: every upload travels (floats up
  = their sizes; all-scalar uploads are 32 bits each and are never compressed),
  every name in `ServerRule.downloads` travels down. `personal.exchanged` narrows the
  accounting of the params-shaped ones to the leaves that travel (the personalization
  methods' shared layers), up and down; it does not narrow what the engine hands a client
  (the simulation passes the server's whole tree), so the other leaves of a params-shaped
  upload must be zeros, and a client must not read their downloaded values unless the
  server never changes them (FedBABU's head, frozen at its initialisation, which every
  client holds from the start).
  `aggregate`s are computed from the decoded uploads and `ClientInfo`, which the server
  knows without transmission (step counts, learning rates, example counts, ids).
- Aggregation: `aggregate` declares each aggregate's reduction as an engine/stages.py
  stage (MEAN with the run's weights p_i, examples or uniform: Aggregates.weighting; SUM
  over the participants); undeclared uploads are averaged under their own names. A
  run-level stage (clipping, a robust reducer) wraps the aggregate of the model upload.
- Layer-wise schedules (FedLAMA) apply the server update, the rows and the
  uploads leaf by leaf. That needs every upload, row and server-state entry to
  be params-shaped (or absent); the algorithm's registry entry (`Spec.layerwise`,
  fedjax_lama/algorithms/common.py) says whether the rules are also meaningful per leaf.
"""
import dataclasses
from typing import Any, Callable, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_lama.engine import stages

PyTree = Any
Shared = Mapping[str, PyTree]


class LocalState(NamedTuple):
  """One client's carry through its local steps."""
  params: PyTree
  model_state: PyTree  # e.g. BatchNorm running statistics ({} when none)
  opt_state: PyTree


class ClientContext(NamedTuple):
  """What one client holds during its round: the downloads, its row, its own facts."""
  shared: Shared        # {"params": x^t, other downloads}
  row: PyTree           # its persistent row ({} when the algorithm keeps none)
  num_examples: jax.Array
  client_id: jax.Array


class ClientInfo(NamedTuple):
  """What the engine knows of one client's round, without any transmission.

  `effective_step` is the client's effective step size under its local optimizer: the sum
  of the coefficients with which its (corrected) gradients enter its displacement,
  y - x = -sum_k a_k g_k, i.e. ||a_i||_1 of Wang et al. 2020 ("Tackling the Objective
  Inconsistency Problem in Heterogeneous Federated Optimization", Sec. 4) with the
  learning rates inside a. Plain SGD gives the sum of the learning rates of the real
  steps (K_i * lr at a constant rate); heavy-ball momentum beta at a constant rate gives
  lr * sum_{k=1..K_i} (1 - beta^k) / (1 - beta), up to 1 / (1 - beta) times more.
  (x - y) / effective_step is then the a-weighted mean of the gradients the client used
  (SCAFFOLD's option II, FedCM's direction, FedNova's normalisation). Computed in the
  local scan from `Algorithm.local.rule`; nan when the local optimizer has none.

  Under a layer-wise schedule `steps` and `effective_step` are params-shaped pytrees of
  scalars (counted since each leaf was last synchronised); otherwise scalars.
  `leafwise(info.steps, tree)` gives a params-shaped view in both cases.
  """
  steps: PyTree           # K_i: real (unpadded) local steps, float32
  effective_step: PyTree  # ||a_i||_1 with the learning rates inside (see above)
  lr: jax.Array           # learning rate of the round's first step
  num_examples: jax.Array
  client_id: jax.Array


class ServerState(NamedTuple):
  params: PyTree
  model_state: PyTree   # aggregated BatchNorm statistics, if any
  opt_state: PyTree     # state of the algorithm's server optax transform
  extra: dict           # algorithm state: SCAFFOLD's c, FedDyn's h, Fed-LAMB's v_hat, ...


# The upload that is the model displacement y - x, by convention (FedLAMA's d_l reads it).
MODEL_UPLOAD = "delta"

# The two reducers algorithms declare (engine/stages.py): the round's weighted mean, and the
# sum over the participants (for 1/N means over the federation).
MEAN = stages.mean()   # sum_i p_i f_i / sum_i p_i, the round's p_i (Aggregates.weighting)
SUM = stages.total()   # sum_i f_i over the participants


@dataclasses.dataclass(frozen=True)
class Reduction:
  """One aggregate: fn(decoded uploads, ClientInfo) of each client, reduced by `stage`
  (an engine/stages.py Stage: MEAN, SUM, or any composition such as a clipped mean)."""
  fn: Callable[[dict, ClientInfo], PyTree]
  stage: stages.Stage = MEAN

  def __post_init__(self):
    if not isinstance(self.stage, stages.Stage):
      raise ValueError(f"Reduction.stage={self.stage!r}; accepted: an engine.stages.Stage "
                       "(MEAN, SUM, or a composition of stages)")


def upload(name: str, stage: stages.Stage = MEAN) -> Reduction:
  """The aggregate of one upload as it is (the common case)."""
  return Reduction(lambda uploads, info: uploads[name], stage)


class Aggregates(NamedTuple):
  """The reduced aggregates of one round, as the server update sees them.

  `weighting` says what the MEAN reductions were weighted by: "examples" (p_i = n_i, the
  client's number of training examples; the default) or "uniform" (p_i = 1), the run's
  config.weighting. SUM reductions are unweighted sums over the participants either way.
  """
  values: dict              # name -> mean or sum
  participants: jax.Array   # M, real clients of the round (float32)
  population: int           # N, clients in the federation (static): 1/N global means
  weighting: str = "examples"  # p_i of the MEAN reductions: "examples" or "uniform"

  def __getitem__(self, name: str) -> PyTree:
    return self.values[name]

  def replaced(self, **values) -> "Aggregates":
    """These aggregates with some values replaced (a rescaled displacement for a rule that
    steps with `server_opt`)."""
    return self._replace(values={**self.values, **values})


# Signatures (one client, one server; no client axis anywhere).
ValueAndGrad = Callable[[PyTree], tuple[tuple[jax.Array, Any], PyTree]]
# (value_and_grad, params, ctx, opt_state) -> ((loss, aux), grads, opt_state). One or more
# gradients on the step's batch; the context (downloads, row) and the local optimizer state
# are there for oracles whose extra gradient depends on them (FedGamma's corrected ascent,
# FedSMOO's dual kept across steps), and every other oracle passes opt_state through.
GradOracle = Callable[[ValueAndGrad, PyTree, ClientContext, PyTree],
                      tuple[tuple[jax.Array, Any], PyTree, PyTree]]
# (g, params, ctx) -> g: a gradient correction, the head of the local optimizer's chain
# (`corrected`): FedProx's pull, SCAFFOLD's control variates, FedDyn's linear term.
Correction = Callable[[PyTree, PyTree, ClientContext], PyTree]
LocalInit = Callable[[ClientContext], PyTree]                            # ctx -> opt_state
Finish = Callable[[LocalState, ClientContext, ClientInfo], tuple[dict, PyTree]]
# (params, model_state) -> the server state at the run's start.
ServerInit = Callable[[PyTree, PyTree], ServerState]
ServerUpdate = Callable[[ServerState, Aggregates], ServerState]
# server -> (the params the run evaluates, {metric name: scalar} for the round's record)
Report = Callable[[ServerState], tuple[PyTree, Mapping[str, jax.Array]]]
# (state, ctx, loss_at) -> state: where one client's local training starts, rewritten from
# the default start (the downloaded model, the server's statistics, a fresh local optimizer)
# once, before the first step. FedPer's downloaded body with the client's own head from its
# row, FedBN's own normalisation layers and statistics, HypCluster's choice of the cluster
# model of lowest loss. loss_at(params) is the training loss of `params` on the client's
# first local batch (the batch, augmentation, poisoning and dropout key of step 0), so the
# choice reads no example the client does not train on; it costs nothing unless called.
Start = Callable[[LocalState, ClientContext, Callable[[PyTree], jax.Array]], LocalState]
# (server, one client's row, loss_at) -> (that client's params, model_state): the model a
# personalized method serves the client in per-client evaluation (FedPer's shared body with
# the client's own head, Ditto's personal model, APFL's mixture, HypCluster's cluster model).
# loss_at(params) is the mean loss of `params` over the client's whole training part
# (evaluation mode); it costs nothing unless called.
Serve = Callable[[ServerState, PyTree, Callable[[PyTree], jax.Array]], tuple[PyTree, PyTree]]
# params -> a params-shaped pytree of Python bools (static): the leaves that travel.
Exchanged = Callable[[PyTree], PyTree]


@dataclasses.dataclass(frozen=True)
class Personalization:
  """What a personalized method adds to its record: the model each client is served, where
  each client's local training starts, and which layers travel.

  `serve` (None: the global model, then the run's fine-tuning if any) gives every client its
  own model in per-client evaluation (engine/personal_eval.py).
  `start` (None: the default start) rewrites a client's starting state (see `Start`).
  `exchanged` (None: all) names the params leaves that travel up and down. It narrows the
  accounting (the ledger's floats and bits, the compressor's input, FedLAMA's
  synchronisation), not the values: params-shaped uploads must hold zeros on the other
  leaves, and the downloads a client is handed still hold the server's values there, which
  a client may read only if the server never changes them (see the module docstring).
  """
  serve: Optional[Serve] = None
  start: Optional[Start] = None
  exchanged: Optional[Exchanged] = None


def single_gradient(value_and_grad: ValueAndGrad, params: PyTree, ctx: ClientContext,
                    opt_state: PyTree):
  """The plain minibatch gradient at the iterate (the context is not needed)."""
  del ctx
  (loss, aux), grads = value_and_grad(params)
  return (loss, aux), grads, opt_state


def displacement(final: LocalState, ctx: ClientContext) -> PyTree:
  """y - x: how far the client moved from the downloaded model (Delta_i)."""
  return jax.tree.map(jnp.subtract, final.params, ctx.shared["params"])


def upload_delta(final: LocalState, ctx: ClientContext, info: ClientInfo):
  """FedAvg's upload: the displacement y - x; the row is kept."""
  del info
  return {MODEL_UPLOAD: displacement(final, ctx)}, ctx.row


def apply_server_tx(tx: optax.GradientTransformation, server: ServerState,
                    delta: PyTree) -> ServerState:
  """x <- x + tx(G) with the pseudo-gradient G = -delta (optax minimises).

  With tx = optax.sgd(1.0) this is exactly x + delta, FedAvg.
  """
  pseudo_grad = jax.tree.map(jnp.negative, delta)
  updates, opt_state = tx.update(pseudo_grad, server.opt_state, server.params)
  return server._replace(params=optax.apply_updates(server.params, updates), opt_state=opt_state)


def report_model(server: ServerState):
  """The default report: the server's model is evaluated and nothing else is logged."""
  return server.params, {}


@dataclasses.dataclass(frozen=True)
class ServerRule:
  """The server's half of an algorithm: where its state starts, how a round's aggregates
  update it, which of its entries go down to the clients, and what the run evaluates.

  `server_opt(tx)` is the common rule, FedAvg's with tx = optax.sgd(1.0). An algorithm
  with state of its own (SCAFFOLD's c, FedDyn's h) writes its `init` and `update` around
  it: `server_opt(tx).init(params, model_state)._replace(extra=...)`, and its update calls
  `server_opt(tx).update(server, agg)` for the model's step.
  """
  init: ServerInit
  update: ServerUpdate
  downloads: tuple = ("params",)   # names of the server state that go down (extra's keys)
  report: Report = report_model    # what the run evaluates, and scalars it logs

  def __post_init__(self):
    if "params" not in self.downloads:
      raise ValueError(f"ServerRule.downloads={self.downloads!r} must include 'params'")

  def shared(self, server: ServerState) -> dict:
    """What goes down: the declared downloads of the server state."""
    return {name: server.params if name == "params" else server.extra[name]
            for name in self.downloads}


def server_opt(tx: Optional[optax.GradientTransformation] = None,
               upload: str = MODEL_UPLOAD) -> ServerRule:
  """The server rule x <- x + tx(G) with G = -agg[upload], the mean of the uploaded
  displacements (`apply_server_tx`); its state is tx's, and nothing but the model goes
  down. tx None: optax.sgd(1.0), FedAvg's average.
  """
  tx = optax.sgd(1.0) if tx is None else tx

  def init(params: PyTree, model_state: PyTree) -> ServerState:
    return ServerState(params, model_state, tx.init(params), {})

  def update(server: ServerState, agg: Aggregates) -> ServerState:
    return apply_server_tx(tx, server, agg[upload])

  return ServerRule(init, update)


class LocalSGD(NamedTuple):
  """The local optimizer as a linear rule, for the effective step (ClientInfo).

  Step k moves by -lr_k d_k with m_k = momentum m_(k-1) + g_k (+ pull e_k) and
  d_k = m_k, or g_k + momentum m_k with nesterov (optax.trace). Weight decay counts as
  part of the gradient. `pull` is a proximal coefficient mu counted as part of the
  optimizer, FedNova's "general rule" (Wang et al. 2020, Sec. 4): the gradient of
  mu/2 ||y - x||^2 enters as mu e_k with e_k the displacement so far.
  """
  momentum: float = 0.0
  nesterov: bool = False
  pull: float = 0.0


@dataclasses.dataclass(frozen=True)
class LocalOptimizer:
  """A client's local optimizer: the optax transform the engine steps with (it scales the
  direction by -lr), the same optimizer as a linear rule for the effective step, and how
  its state starts each round.

  The engine calls `tx.update(g, opt_state, params, ctx=ctx)`: the client's ClientContext
  is an optax extra argument, which a gradient correction at the head of the chain reads
  (`corrected`); a plain optax.GradientTransformation ignores it.
  Build SGD with `local_sgd`, which makes the transform and the rule from the same numbers
  so they cannot disagree; an adaptive optimizer (Fed-LAMB's AMSGrad) is
  `LocalOptimizer(tx)`, without a rule, and ClientInfo.effective_step is then nan.
  `init` (ctx -> opt_state) replaces `tx.init(ctx.shared["params"])` for a state that
  starts from the downloads or the row (Fed-LAMB's v-hat, FedSMOO's dual).
  """
  tx: optax.GradientTransformation = dataclasses.field(default_factory=optax.identity)
  rule: Optional[LocalSGD] = None
  init: Optional[LocalInit] = None

  def init_state(self, ctx: ClientContext) -> PyTree:
    if self.init is not None:
      return self.init(ctx)
    return self.tx.init(ctx.shared["params"])


def corrected(correction: Optional[Correction],
              tx: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
  """`tx` applied to the corrected gradient: the chain g -> correction(g, params, ctx) -> tx,
  with ctx the client's ClientContext (the extra argument the engine passes).

  The correction keeps no state, so the chain's state is tx's own (the same structure as
  without it: a checkpointed local state restores either way). correction None: tx.
  """
  inner = optax.with_extra_args_support(tx)
  if correction is None:
    return inner

  def update(updates, state, params=None, *, ctx: ClientContext, **extra_args):
    return inner.update(correction(updates, params, ctx), state, params, ctx=ctx,
                        **extra_args)

  return optax.GradientTransformationExtraArgs(inner.init, update)


def local_sgd(momentum: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0,
              pull: float = 0.0, weight_decay_mask: Optional[Any] = None,
              correction: Optional[Correction] = None) -> LocalOptimizer:
  """Local SGD: the gradient `correction` (if any), decayed weights, then a momentum trace
  (optax), and its linear rule.

  The learning rate is applied outside the transform, so that a schedule indexed by the
  global local-step count is evaluated inside the scan without rebuilding the optimizer
  state. `pull` is a proximal coefficient inside the correction (FedProx's mu) that the
  effective step counts as part of the optimizer (LocalSGD).
  """
  parts = []
  if weight_decay:
    parts.append(optax.add_decayed_weights(weight_decay, mask=weight_decay_mask))
  if momentum:
    parts.append(optax.trace(decay=momentum, nesterov=nesterov))
  tx = optax.chain(*parts) if parts else optax.identity()
  if correction is not None:
    tx = corrected(correction, tx)
  return LocalOptimizer(tx, LocalSGD(float(momentum), bool(nesterov), float(pull)))


def freeze(local: LocalOptimizer, frozen: Exchanged) -> LocalOptimizer:
  """`local` with the leaves `frozen(params)` marks True (a params-shaped tree of Python
  bools) held where they start: their direction is set to zero after every other transform
  (weight decay and momentum included), so they stay bit for bit. The linear rule is
  `local`'s: it describes the leaves that move. (FedBABU's head during training; the layers
  fine-tuning leaves alone at evaluation.)"""
  zero = optax.masked(optax.set_to_zero(), frozen)
  init = None
  if local.init is not None:
    init = lambda ctx: (local.init(ctx), zero.init(ctx.shared["params"]))
  return LocalOptimizer(optax.chain(local.tx, zero), local.rule, init)


@dataclasses.dataclass(frozen=True)
class Algorithm:
  """What one algorithm decides; see the module docstring for the call order.

  Fields left at their defaults give FedAvg's behaviour for that piece (docs/algorithms.md
  lists them). What the run decides (the uplink compressor, FedSGD's one full-batch step,
  whether a layer-wise schedule may run it, whether local optimizer states carry over
  rounds) and the registry name are not here: they belong to the algorithm's `Spec` and the
  run options.

  Example: FedAvg with server momentum, and FedProx's clients::

    Algorithm(local=local_sgd(momentum=0.9), server=server_opt(optax.sgd(1.0, momentum=0.9)))
    pull = lambda g, params, ctx: jax.tree.map(
        lambda gi, p, x: gi + 0.01 * (p - x), g, params, ctx.shared["params"])
    Algorithm(local=local_sgd(correction=pull))
  """
  # The client's optimizer; a gradient correction is the head of its chain (`corrected`).
  local: LocalOptimizer = dataclasses.field(default_factory=local_sgd)
  grad: GradOracle = single_gradient
  row_init: Optional[Callable[[PyTree], PyTree]] = None   # params -> one client's row
  finish: Finish = upload_delta
  # The declared aggregation: name -> Reduction. Every upload not named here is aggregated
  # by MEAN under its own name (so declaring some never drops another's default).
  aggregate: Optional[Mapping[str, Reduction]] = None
  # The server's state, update, downloads and report; default FedAvg's server_opt().
  server: ServerRule = dataclasses.field(default_factory=server_opt)
  # Each client's own model, start and exchanged layers (the personalization methods); None:
  # every client starts from and is served the global model, and every leaf travels.
  personal: Optional[Personalization] = None

  def __post_init__(self):
    if not isinstance(self.local, LocalOptimizer):
      raise ValueError(f"Algorithm.local={self.local!r} is not accepted; accepted: a "
                       "LocalOptimizer (local_sgd(...), or LocalOptimizer(tx) for an adaptive one)")
    if not isinstance(self.server, ServerRule):
      raise ValueError(f"Algorithm.server={self.server!r} is not accepted; accepted: a "
                       "ServerRule (server_opt(tx), or ServerRule(init, update, ...))")

  # ---- the engine's view, defaults resolved ------------------------------------------------
  @property
  def start(self) -> Optional[Start]:
    """The personalized start (`Personalization.start`), or None: the default start."""
    return self.personal.start if self.personal is not None else None

  @property
  def exchanged(self) -> Optional[Exchanged]:
    """The leaves that travel (`Personalization.exchanged`), or None: all."""
    return self.personal.exchanged if self.personal is not None else None

  @property
  def serve(self) -> Optional[Serve]:
    """Each client's own model (`Personalization.serve`), or None: the global model."""
    return self.personal.serve if self.personal is not None else None

  def shared(self, server: ServerState) -> dict:
    """What goes down: the declared downloads of the server state (`ServerRule.shared`)."""
    return self.server.shared(server)

  def aggregations_for(self, upload_names) -> dict:
    """The declared aggregates, then the MEAN of every other upload under its own name."""
    declared = dict(self.aggregate or {})
    return {**declared, **{name: upload(name) for name in upload_names if name not in declared}}


def leafwise(value: PyTree, like: PyTree) -> PyTree:
  """A params-shaped view of a ClientInfo field: scalars are broadcast over the leaves of
  `like`; per-leaf pytrees (under a layer-wise schedule) pass through."""
  if jax.tree.structure(value) == jax.tree.structure(like):
    return value
  return jax.tree.map(lambda _: value, like)
