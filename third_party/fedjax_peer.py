"""FedJAX (Ro, Suresh and Wu, "FedJAX: Federated learning simulation with JAX", 2021,
arXiv:2108.02117) as the peer of `python -m benchmarks.benchmark --peers=fedjax`: FedJAX
0.0.17's `fed_avg` on this project's model, data and shapes.

FedJAX is installed apart, without its dependencies, so that this project's jax stays as it
is (requirements-peers.txt: `pip install --no-deps --target DIR -r requirements-peers.txt`,
then `--peers_path=DIR`).
"""
import sys

import jax
import numpy as np
import optax


def import_fedjax(path: str = ""):
  """The `fedjax` module, or None when it is not installed. `path` is appended to sys.path
  (never prepended: FedJAX's wheel installs top-level `experiments`/`examples` packages that
  must not shadow this project's)."""
  if path and path not in sys.path:
    sys.path.append(path)
  # The one shim FedJAX 0.0.17 needs on current JAX: its tree_util calls `jax.tree_map`,
  # removed from JAX in 0.6; it is `jax.tree_util.tree_map`.
  if "tree_map" not in vars(jax):
    jax.tree_map = jax.tree_util.tree_map
  try:
    import fedjax  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return fedjax


def fed_avg_round(fedjax, model, params, model_state, x, y, indices, lr: float):
  """FedJAX's fed_avg on our model, data and shapes: returns run() -> new server params.

  The model is our flax module in a `fedjax.Model`, FedJAX's own model container, so the
  computation is identical by construction; clients are `fedjax.ClientDataset`s of numpy
  arrays in our step order (`skip_shuffle`; `indices[c, k]` are the examples of client c's
  step k), so FedJAX's step k of client c trains on the same batch as ours. Client SGD(lr),
  server SGD(1.0) on the example-weighted mean delta: FedAvg (McMahan et al., 2017,
  Algorithm 1) with equal client sizes, the same update as the benchmark's loop.
  """
  if jax.tree_util.tree_leaves(model_state):
    raise ValueError("the FedJAX peer runs models without BatchNorm statistics only")
  clients, _, batch = indices.shape

  def apply_for_train(p, b, rng=None):
    rngs = {"dropout": rng} if rng is not None else {}
    return model.apply({"params": p}, b["x"], train=True, rngs=rngs)

  def apply_for_eval(p, b):
    return model.apply({"params": p}, b["x"], train=False)

  def train_loss(b, preds):
    return optax.softmax_cross_entropy_with_integer_labels(preds, b["y"])

  fmodel = fedjax.Model(init=lambda rng: params, apply_for_train=apply_for_train,
                        apply_for_eval=apply_for_eval, train_loss=train_loss, eval_metrics={})
  algorithm = fedjax.algorithms.fed_avg.federated_averaging(
      grad_fn=fedjax.model_grad(fmodel), client_optimizer=fedjax.optimizers.sgd(lr),
      server_optimizer=fedjax.optimizers.sgd(1.0),
      client_batch_hparams=fedjax.ShuffleRepeatBatchHParams(
          batch_size=batch, num_epochs=1, skip_shuffle=True, drop_remainder=True))
  host_x, host_y = np.asarray(x), np.asarray(y)
  datasets = [fedjax.ClientDataset({"x": host_x[indices[c].reshape(-1)],
                                    "y": host_y[indices[c].reshape(-1)]})
              for c in range(clients)]
  rngs = jax.random.split(jax.random.PRNGKey(0), clients)
  cohort = [(str(c).encode(), datasets[c], rngs[c]) for c in range(clients)]
  server = algorithm.init(params)

  def run():
    state, _ = algorithm.apply(server, cohort)
    return state.params

  return run


def hyp_cluster_evaluation(fedjax, model, cluster_params, train, test):
  """FedJAX's `hyp_cluster.HypClusterEvaluator` on our flax model (no BatchNorm statistics).

  train[c], test[c]: client c's (x, y) training and test data. Each client is assigned the
  cluster model of lowest average loss over its whole training data (FedJAX's maximization
  step, one padded batch holding it all) and evaluated with that model on its test data.
  Returns (the choices, {client: {"accuracy", "loss"}} of FedJAX's evaluation: the means
  over the client's test examples).
  """
  from fedjax.algorithms import hyp_cluster  # pylint: disable=g-import-not-at-top

  def apply_for_train(p, b, rng=None):
    rngs = {"dropout": rng} if rng is not None else {}
    return model.apply({"params": p}, b["x"], train=True, rngs=rngs)

  def apply_for_eval(p, b):
    return model.apply({"params": p}, b["x"], train=False)

  def train_loss(b, preds):
    return optax.softmax_cross_entropy_with_integer_labels(preds, b["y"])

  fmodel = fedjax.Model(
      init=lambda rng: cluster_params[0], apply_for_train=apply_for_train,
      apply_for_eval=apply_for_eval, train_loss=train_loss,
      eval_metrics={"accuracy": fedjax.metrics.Accuracy(),
                    "loss": fedjax.metrics.CrossEntropyLoss()})
  as_dataset = lambda xy: fedjax.ClientDataset({"x": np.asarray(xy[0]),
                                                "y": np.asarray(xy[1])})
  rngs = jax.random.split(jax.random.PRNGKey(0), len(train))
  train_clients = [(str(c).encode(), as_dataset(xy), rngs[c]) for c, xy in enumerate(train)]
  test_clients = [(str(c).encode(), as_dataset(xy)) for c, xy in enumerate(test)]
  largest = max(len(xy[1]) for xy in list(train) + list(test))
  batch_hparams = fedjax.PaddedBatchHParams(batch_size=largest)
  choices = hyp_cluster.maximization_step(
      evaluator=fedjax.AverageLossEvaluator(fedjax.model_per_example_loss(fmodel)),
      cluster_params=list(cluster_params), clients=train_clients, batch_hparams=batch_hparams)
  metrics = hyp_cluster.HypClusterEvaluator(fmodel).evaluate_clients(
      list(cluster_params), train_clients, test_clients, batch_hparams)
  return ({int(cid.decode()): int(j) for cid, j in choices.items()},
          {int(cid.decode()): {name: float(v) for name, v in m.items()} for cid, m in metrics})


def version() -> str:
  """The installed FedJAX's version (its package has no __version__)."""
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  return importlib.metadata.version("fedjax")


class _NumpyWithOldClip:
  """jax.numpy, with a `clip` that also takes the keywords a_min and a_max."""

  def __getattr__(self, name):
    return getattr(jax.numpy, name)

  @staticmethod
  def clip(x, a_min=None, a_max=None, **kwargs):
    return jax.numpy.clip(x, kwargs.pop("min", a_min), kwargs.pop("max", a_max), **kwargs)


def apfl_rounds(fedjax, model, params, batches, cohorts, lr: float, client_coefficient: float):
  """FedJAX's `fedjax.algorithms.apfl` on our flax model: one record per round.

  batches[c] is client c's list of (x, y) batches, one per local step, in order (one local
  epoch, `skip_shuffle`); cohorts[r] the client ids of round r. Client SGD(lr) steps the
  global model's copy, the local model and the mixing weights alike (FedJAX's one client
  optimizer); server SGD(1.0) on the example-weighted mean of x - y. Each record holds the
  server parameters and, for every client seen so far, its local model and its mixing
  weights (one per parameter array).
  """
  def apply_for_train(p, b, rng=None):
    rngs = {"dropout": rng} if rng is not None else {}
    return model.apply({"params": p}, b["x"], train=True, rngs=rngs)

  def apply_for_eval(p, b):
    return model.apply({"params": p}, b["x"], train=False)

  def train_loss(b, preds):
    return optax.softmax_cross_entropy_with_integer_labels(preds, b["y"])

  # fedjax/algorithms/__init__.py does not import its apfl module.
  from fedjax.algorithms import apfl  # pylint: disable=g-import-not-at-top
  # The one shim its APFL needs on current JAX: it clips the mixing weights with
  # jnp.clip(a_min=0, a_max=1), keywords JAX renamed min and max (and then removed); the
  # module's `jnp` becomes jax.numpy with a clip that takes the old keywords.
  apfl.jnp = _NumpyWithOldClip()
  fmodel = fedjax.Model(init=lambda rng: params, apply_for_train=apply_for_train,
                        apply_for_eval=apply_for_eval, train_loss=train_loss, eval_metrics={})
  batch_size = int(np.shape(batches[0][0][0])[0])
  algorithm = apfl.adaptive_personalized_federated_learning(
      grad_fn=fedjax.model_grad(fmodel), client_optimizer=fedjax.optimizers.sgd(lr),
      server_optimizer=fedjax.optimizers.sgd(1.0),
      client_batch_hparams=fedjax.ShuffleRepeatBatchHParams(
          batch_size=batch_size, num_epochs=1, skip_shuffle=True, drop_remainder=True),
      client_coefficient=client_coefficient)
  datasets = [fedjax.ClientDataset({"x": np.concatenate([np.asarray(x) for x, _ in client]),
                                    "y": np.concatenate([np.asarray(y) for _, y in client])})
              for client in batches]
  rngs = jax.random.split(jax.random.PRNGKey(0), len(batches))
  state = algorithm.init(params)
  history = []
  for ids in cohorts:
    state, _ = algorithm.apply(state, [(str(c).encode(), datasets[c], rngs[c]) for c in ids])
    history.append({
        "params": jax.tree_util.tree_map(np.asarray, state.params),
        "clients": {int(cid.decode()): (
            jax.tree_util.tree_map(np.asarray, s.params),
            jax.tree_util.tree_map(np.asarray, s.interpolation_coefficients))
                    for cid, s in state.client_states.items()}})
  return history


def hyp_cluster_rounds(fedjax, model, cluster_params, batches, cohorts, lr: float,
                       num_epochs: int = 1):
  """FedJAX's `fedjax.algorithms.hyp_cluster` on our flax model: one record per round.

  cluster_params: the k initial cluster models (a list). batches[c] is client c's list of
  (x, y) batches in order; each client trains `num_epochs` passes over them (`skip_shuffle`),
  and FedJAX's maximization step averages the loss over all of the client's examples (one
  padded batch holding them all). Client SGD(lr), server SGD(1.0) on each cluster's
  example-weighted mean of x - y. Each record holds the cluster models and the cluster each
  client of the round chose.
  """
  def apply_for_train(p, b, rng=None):
    rngs = {"dropout": rng} if rng is not None else {}
    return model.apply({"params": p}, b["x"], train=True, rngs=rngs)

  def per_example_loss(params, batch, rng):
    return optax.softmax_cross_entropy_with_integer_labels(apply_for_train(params, batch, rng),
                                                           batch["y"])

  from fedjax.algorithms import hyp_cluster  # pylint: disable=g-import-not-at-top
  batch_size = int(np.shape(batches[0][0][0])[0])
  largest = max(sum(int(np.shape(x)[0]) for x, _ in client) for client in batches)
  algorithm = hyp_cluster.hyp_cluster(
      per_example_loss=per_example_loss, client_optimizer=fedjax.optimizers.sgd(lr),
      server_optimizer=fedjax.optimizers.sgd(1.0),
      maximization_batch_hparams=fedjax.PaddedBatchHParams(batch_size=largest),
      expectation_batch_hparams=fedjax.ShuffleRepeatBatchHParams(
          batch_size=batch_size, num_epochs=num_epochs, skip_shuffle=True,
          drop_remainder=True))
  datasets = [fedjax.ClientDataset({"x": np.concatenate([np.asarray(x) for x, _ in client]),
                                    "y": np.concatenate([np.asarray(y) for _, y in client])})
              for client in batches]
  rngs = jax.random.split(jax.random.PRNGKey(0), len(batches))
  state = algorithm.init(list(cluster_params))
  history = []
  for ids in cohorts:
    state, diagnostics = algorithm.apply(
        state, [(str(c).encode(), datasets[c], rngs[c]) for c in ids])
    history.append({
        "clusters": [jax.tree_util.tree_map(np.asarray, p) for p in state.cluster_params],
        "chosen": {int(cid.decode()): int(d["cluster_id"]) for cid, d in diagnostics.items()}})
  return history
