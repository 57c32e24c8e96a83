"""HypCluster: k cluster models; each client trains the one of lowest loss on its data.

Y. Mansour, M. Mohri, J. Ro, A. T. Suresh, "Three Approaches for Personalization with
Applications to Federated Learning", arXiv 2002.10619, 2020, Sec. 4 (HypCluster), as FedJAX
0.0.17 runs it (`fedjax.algorithms.hyp_cluster`).

The server keeps k models x_1..x_k (ServerState.params is x_1, extra["others"] stacks
x_2..x_k with their server optimizer states in extra["others_opt"]). In a round every
participating client i downloads the k models and
  c_i = argmin_j f_i(x_j; xi_0)                              (its cluster; ties: lowest j),
with xi_0 its first local batch; it then runs the run's local optimizer from x_(c_i) exactly
as FedAvg runs it from x, and uploads its displacement y_i - x_(c_i) and c_i. The server
forms, for every cluster j chosen by some client,
  Delta_j = sum_(i: c_i = j) p_i (y_i - x_(c_i)) / sum_(i: c_i = j) p_i
(p_i the run's weights, examples by default) and steps x_j with its own server optimizer
state on the pseudo-gradient -Delta_j (server_lr 1: x_j + Delta_j); a cluster nobody chose
keeps its model and optimizer state. With k = 1 this is FedAvg, bit for bit.

Where this differs from FedJAX 0.0.17 (whose maximization step averages the loss over the
client's whole data, in padded batches, before training): the choice here is made on the
first local batch alone, inside the client's round, so that it reads only what local
training reads and needs no second pass over the data. With one batch holding all of a
client's examples the two choices are the same; with smaller batches they can differ.

The initial models: x_1 is the run's initial model, and x_j (j >= 2) is x_1 plus Gaussian
noise of standard deviation `init_scale` drawn from `init_seed` (FedJAX draws each cluster
from the model's initializer, `random_init`, or by k-means++ over trained clients; models
that start equal would all tie and every client would choose x_1).

The per-client choice is kept in each client's row ("cluster", -1 before its first round).
The run evaluates x_1 as its global model. Per-client evaluation serves each client the
cluster model of lowest mean loss over its whole training part, chosen again from the
current k models (`Personalization.serve`; ties: lowest j), as FedJAX's
`HypClusterEvaluator` does, so a client never sampled is served its best cluster too. The
clusters share the server's normalisation statistics (one set, averaged over every client as
FedAvg averages it).

Traffic: k models down, one model and one 32-bit scalar (c_i) up.
"""
import dataclasses

import jax
import jax.numpy as jnp
import optax

from fedjax_lama.algorithms import personal
from fedjax_lama.algorithms.common import (Common, Spec, local_optimizer, require,
                                           require_nonnegative, safe_positive, server_sgd)
from fedjax_lama.engine.algorithm import (MEAN, MODEL_UPLOAD, Algorithm, Personalization,
                                          Reduction, ServerRule, server_opt)
from fedjax_lama.tree import tree_where

CLUSTER_UPLOAD = "cluster"   # c_i, as a float32 scalar
OTHERS = "others"            # the downloads and server state of clusters 2..k (stacked)
OTHERS_DELTA = "others_delta"


@dataclasses.dataclass(frozen=True)
class Hparams:
  num_clusters: int = 2      # k
  init_scale: float = 0.01   # the noise between the initial cluster models
  init_seed: int = 0         # the noise's seed

  def __post_init__(self):
    require(isinstance(self.num_clusters, int) and not isinstance(self.num_clusters, bool)
            and self.num_clusters >= 1, "num_clusters", self.num_clusters, "an integer >= 1")
    require_nonnegative("init_scale", self.init_scale)
    require(isinstance(self.init_seed, int) and not isinstance(self.init_seed, bool),
            "init_seed", self.init_seed, "an integer")


def stacked(first, others):
  """The k cluster models stacked on a leading axis: x_1, then the stacked x_2..x_k."""
  return jax.tree.map(lambda a, b: jnp.concatenate([a[None], b.astype(a.dtype)]), first, others)


def cluster_model(shared, index):
  """x_(index) of the downloads ({"params": x_1, "others": x_2..x_k})."""
  return jax.tree.map(lambda s: s[index], stacked(shared["params"], shared[OTHERS]))


def initial_others(params, hp: Hparams):
  """x_2..x_k: the initial model plus N(0, init_scale^2) noise, key (init_seed, j, leaf)."""
  base = jax.random.PRNGKey(hp.init_seed)
  leaves, treedef = jax.tree.flatten(params)

  def one(j):
    key = jax.random.fold_in(base, j)
    return treedef.unflatten([
        (p + hp.init_scale * jax.random.normal(jax.random.fold_in(key, n), jnp.shape(p),
                                               jnp.result_type(p))).astype(jnp.result_type(p))
        for n, p in enumerate(leaves)])

  models = [one(j) for j in range(2, hp.num_clusters + 1)]
  if not models:
    return jax.tree.map(lambda p: jnp.zeros((0,) + jnp.shape(p), jnp.result_type(p)), params)
  return jax.tree.map(lambda *xs: jnp.stack(xs), *models)


def build(hp: Hparams, common: Common) -> Algorithm:
  k = hp.num_clusters
  server_tx = server_sgd(common)          # the server optimizer, one state per cluster
  first_cluster = server_opt(server_tx)   # x_1's rule: ServerState.params and opt_state
  local = personal.holding_optimizer(local_optimizer(common),
                                     lambda ctx: jnp.zeros((), jnp.int32))

  def lowest_loss(clusters, loss_at):
    """(the cluster model of lowest loss, its index); ties: the lowest index."""
    choice = jnp.argmin(jax.vmap(loss_at)(clusters)).astype(jnp.int32)
    return jax.tree.map(lambda s: s[choice], clusters), choice

  def start(state, ctx, loss_at):
    params, choice = lowest_loss(stacked(ctx.shared["params"], ctx.shared[OTHERS]), loss_at)
    return state._replace(params=params,
                          opt_state=personal.with_held(state.opt_state, choice))

  def finish(final, ctx, info):
    del info
    choice = personal.held(final.opt_state)
    start = cluster_model(ctx.shared, choice)
    delta = jax.tree.map(jnp.subtract, final.params, start)
    return ({MODEL_UPLOAD: delta, CLUSTER_UPLOAD: choice.astype(jnp.float32)},
            {"cluster": choice.astype(jnp.float32)})

  def one_hot(uploads):
    return jax.nn.one_hot(uploads[CLUSTER_UPLOAD].astype(jnp.int32), k, dtype=jnp.float32)

  def masked_delta(cluster):
    def fn(uploads, info):
      del info
      mask = one_hot(uploads)[cluster]
      return jax.tree.map(lambda d: (mask * d).astype(d.dtype), uploads[MODEL_UPLOAD])
    return fn

  def others_delta(uploads, info):
    del info
    mask = one_hot(uploads)[1:]
    return jax.tree.map(
        lambda d: (mask.reshape((k - 1,) + (1,) * d.ndim) * d[None]).astype(d.dtype),
        uploads[MODEL_UPLOAD])

  # The MEANs of one-hot x delta and of the one-hot give each cluster's weighted mean: their
  # ratio divides the common sum of weights out.
  aggregate = {MODEL_UPLOAD: Reduction(masked_delta(0), MEAN),
               OTHERS_DELTA: Reduction(others_delta, MEAN),
               CLUSTER_UPLOAD: Reduction(lambda uploads, info: one_hot(uploads), MEAN)}

  def server_init(params, model_state):
    others = initial_others(params, hp)
    return first_cluster.init(params, model_state)._replace(
        extra={OTHERS: others, "others_opt": jax.vmap(server_tx.init)(others)})

  def server_update(state, agg):
    share = agg[CLUSTER_UPLOAD]   # [k]: the weight that chose each cluster / the round's
    chosen = share > 0
    delta = jax.tree.map(lambda d: d / safe_positive(share[0]).astype(d.dtype),
                         agg[MODEL_UPLOAD])
    updated = first_cluster.update(state, agg.replaced(**{MODEL_UPLOAD: delta}))
    first = tree_where(chosen[0], (updated.params, updated.opt_state),
                       (state.params, state.opt_state))

    def step_other(params, opt_state, d, s, c):
      d = jax.tree.map(lambda v: v / safe_positive(s).astype(v.dtype), d)
      updates, new_opt = server_tx.update(jax.tree.map(jnp.negative, d), opt_state, params)
      return tree_where(c, (optax.apply_updates(params, updates), new_opt),
                        (params, opt_state))

    others, others_opt = jax.vmap(step_other)(state.extra[OTHERS], state.extra["others_opt"],
                                              agg[OTHERS_DELTA], share[1:], chosen[1:])
    return state._replace(params=first[0], opt_state=first[1],
                          extra={**state.extra, OTHERS: others, "others_opt": others_opt})

  def row_init(params):
    del params
    return {"cluster": jnp.full((), -1.0, jnp.float32)}

  def serve(server, row, loss_at):
    del row  # chosen again, on the client's whole training part
    params, _ = lowest_loss(stacked(server.params, server.extra[OTHERS]), loss_at)
    return params, server.model_state

  return Algorithm(local=local, finish=finish, aggregate=aggregate, row_init=row_init,
                   server=ServerRule(server_init, server_update, downloads=("params", OTHERS)),
                   personal=Personalization(serve, start=start))


SPECS = (Spec("hypcluster", Hparams, build,
              "k cluster models; each client trains the one of lowest loss on its first "
              "batch, each cluster averages its own clients' updates",
              layerwise="its k cluster models are chosen whole, per client"),)
