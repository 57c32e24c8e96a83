"""FedJAX (Ro, Suresh and Wu, "FedJAX: Federated learning simulation with JAX", 2021,
arXiv:2108.02117) as the peer of `python -m benchmarks.benchmark --peers=fedjax`: FedJAX
0.0.17's `fed_avg` on this project's model, data and shapes.

FedJAX is installed apart, without its dependencies, so that this project's jax stays as it
is (requirements-peers.txt: `pip install --no-deps --target DIR -r requirements-peers.txt`,
then `--peers_path=DIR`).
"""
import functools
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
  # removed from JAX in 0.6; it is `jax.tree.map`.
  if "tree_map" not in vars(jax):
    jax.tree_map = jax.tree.map
  try:
    import fedjax  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return fedjax


@functools.lru_cache(maxsize=None)
def _fed_avg_algorithm(fedjax, fmodel, batch: int, lr: float):
  """FedJAX's fed_avg for `fmodel`, built once per model, batch and rate, so that runs on
  the same shapes reuse its compiled steps."""
  return fedjax.algorithms.fed_avg.federated_averaging(
      grad_fn=fedjax.model_grad(fmodel), client_optimizer=fedjax.optimizers.sgd(lr),
      server_optimizer=fedjax.optimizers.sgd(1.0),
      client_batch_hparams=fedjax.ShuffleRepeatBatchHParams(
          batch_size=batch, num_epochs=1, skip_shuffle=True, drop_remainder=True))


def _fed_avg(fedjax, fmodel, params, clients_xy, batch: int, lr: float):
  """FedJAX's fed_avg on `fmodel` (a `fedjax.Model`) over the clients' (x, y) arrays, each
  trained in order in batches of `batch` (`skip_shuffle`, one epoch): run() -> new server
  params. Client SGD(lr), server SGD(1.0) on the mean delta weighted by each client's
  number of examples: FedAvg (McMahan et al., 2017, Algorithm 1)."""
  algorithm = _fed_avg_algorithm(fedjax, fmodel, batch, lr)
  datasets = [fedjax.ClientDataset({"x": np.asarray(x), "y": np.asarray(y)})
              for x, y in clients_xy]
  rngs = jax.random.split(jax.random.PRNGKey(0), len(datasets))
  cohort = [(str(c).encode(), d, rngs[c]) for c, d in enumerate(datasets)]
  server = algorithm.init(params)

  def run():
    state, _ = algorithm.apply(server, cohort)
    return state.params

  return run


def fed_avg_round(fedjax, model, params, model_state, x, y, indices, lr: float):
  """FedJAX's fed_avg on our model, data and shapes: returns run() -> new server params.

  The model is our flax module in a `fedjax.Model`, FedJAX's own model container, so the
  computation is identical by construction; clients are `fedjax.ClientDataset`s of numpy
  arrays in our step order (`skip_shuffle`; `indices[c, k]` are the examples of client c's
  step k), so FedJAX's step k of client c trains on the same batch as ours. Client SGD(lr),
  server SGD(1.0) on the example-weighted mean delta: FedAvg (McMahan et al., 2017,
  Algorithm 1) with equal client sizes, the same update as the benchmark's loop.
  """
  if jax.tree.leaves(model_state):
    raise ValueError("the FedJAX peer runs models without BatchNorm statistics only")

  def apply_for_train(p, b, rng=None):
    rngs = {"dropout": rng} if rng is not None else {}
    return model.apply({"params": p}, b["x"], train=True, rngs=rngs)

  def apply_for_eval(p, b):
    return model.apply({"params": p}, b["x"], train=False)

  def train_loss(b, preds):
    return optax.softmax_cross_entropy_with_integer_labels(preds, b["y"])

  fmodel = fedjax.Model(init=lambda rng: params, apply_for_train=apply_for_train,
                        apply_for_eval=apply_for_eval, train_loss=train_loss, eval_metrics={})
  host_x, host_y = np.asarray(x), np.asarray(y)
  clients_xy = [(host_x[indices[c].reshape(-1)], host_y[indices[c].reshape(-1)])
                for c in range(indices.shape[0])]
  return _fed_avg(fedjax, fmodel, params, clients_xy, indices.shape[2], lr)


# ---- FedJAX's Shakespeare task ----------------------------------------------------------

def shakespeare_model(fedjax, embed_size: int = 8, hidden_size: int = 256,
                      num_layers: int = 2):
  """FedJAX's Shakespeare model, `fedjax.models.shakespeare.create_lstm_model()`, by default
  with its defaults: the FedAvg paper's character LSTM in haiku over FedJAX's 90 ids (86 characters,
  PAD 0, its model's BOS/EOS 87/88, OOV 89): embedding 8, two `hk.LSTM(256)` each followed
  by a tanh (`hk.DeepRNN`), a time-major static unroll, a dense output over all 90 ids.
  Training scores every id: the mask of its four special logits is applied only inside its
  `accuracy_in_vocab` metric. Its train loss is the sum of the per-token cross-entropies of
  non-PAD targets over the window length; `fedjax.model_grad` averages it over the batch.
  """
  del fedjax  # imported by the caller (import_fedjax), which this needs first
  from fedjax.models import shakespeare  # pylint: disable=g-import-not-at-top
  # The shim it needs on current JAX: it builds its logits mask from jnp.NINF, which JAX
  # removed; the module's `jnp` becomes jax.numpy with NINF = -inf.
  shakespeare.jnp = _OldJaxNumpy()
  return shakespeare.create_lstm_model(embed_size=embed_size, lstm_hidden_size=hidden_size,
                                       lstm_num_layers=num_layers)


def leaf_to_fedjax_ids(fedjax, chars: str) -> np.ndarray:
  """int32 [len(chars) + 1]: the FedJAX id (`fedjax.datasets.shakespeare.TABLE`: 86
  characters at ids 3 to 88, OOV 89) of each id of a table of `chars` followed by one id for
  any other character (LEAF's: `leaf_text.SHAKESPEARE_CHARS`, 80 characters, and 80). LEAF's
  '>' and '}', absent from FedJAX's table, and the other-character id go to FedJAX's OOV;
  FedJAX's '@ $ _ # / * %' and carriage return never occur."""
  del fedjax
  from fedjax.datasets import shakespeare as data  # pylint: disable=g-import-not-at-top
  return np.array([data.TABLE[ord(c)] for c in chars] + [data.OOV], np.int32)


HAIKU_GATES = "igfo"  # hk.LSTM splits its one dense layer's 4h outputs as i, g, f, o


def flax_from_haiku(haiku_params, num_layers: int = 2) -> dict:
  """FedJAX's (haiku's) Shakespeare LSTM parameters in `lstm_lm`'s layout, exactly.

  hk.LSTM has one dense layer on [x, h] with a bias, output columns in gate order i, g, f,
  o, and adds 1 to the forget gate's pre-activation in its forward pass; flax's
  OptimizedLSTMCell has per-gate input kernels `i<gate>` (no bias) and recurrent kernels
  `h<gate>` with the bias. So the rows of x and of h split the kernel, the columns split
  the gates, and the forget bias carries the +1. Embedding and output layer map as they
  are (`embed` -> Embed_0, `linear` -> Dense_0).
  """
  out = {"Embed_0": {"embedding": haiku_params["embed"]["embeddings"]},
         "Dense_0": {"kernel": haiku_params["linear"]["w"],
                     "bias": haiku_params["linear"]["b"]}}
  for k in range(num_layers):
    dense = haiku_params["lstm/linear" if k == 0 else f"lstm_{k}/linear"]
    w, b = dense["w"], dense["b"]
    hidden = b.shape[0] // 4
    inputs = w.shape[0] - hidden
    cell = {}
    for j, gate in enumerate(HAIKU_GATES):
      cols = slice(j * hidden, (j + 1) * hidden)
      cell["i" + gate] = {"kernel": w[:inputs, cols]}
      cell["h" + gate] = {"kernel": w[inputs:, cols],
                          "bias": b[cols] + (1.0 if gate == "f" else 0.0)}
    out[f"OptimizedLSTMCell_{k}"] = cell
  return out


def shakespeare_fed_avg_round(fedjax, fmodel, haiku_params, batches, lr: float):
  """FedJAX's fed_avg with its Shakespeare model (`shakespeare_model`): run() -> the new
  server parameters (haiku's layout). batches[c]: client c's list of (x, y) batches of
  FedJAX ids [batch, time], trained in order, one local epoch."""
  batch = int(np.shape(batches[0][0][0])[0])
  clients_xy = [(np.concatenate([np.asarray(x) for x, _ in client]),
                 np.concatenate([np.asarray(y) for _, y in client])) for client in batches]
  return _fed_avg(fedjax, fmodel, haiku_params, clients_xy, batch, lr)


def shakespeare_metrics(fedjax, fmodel, haiku_params, x, y, batch: int) -> dict:
  """FedJAX's evaluation metrics of its Shakespeare model (`fedjax.evaluate_model`) on the
  windows x, y (FedJAX ids), in batches of `batch`."""
  batches = [{"x": np.asarray(x[i:i + batch]), "y": np.asarray(y[i:i + batch])}
             for i in range(0, len(x), batch)]
  return {k: float(v) for k, v in fedjax.evaluate_model(fmodel, haiku_params,
                                                         batches).items()}


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


class _OldJaxNumpy:
  """jax.numpy with two names FedJAX 0.0.17 uses and JAX removed: `clip` also taking the
  keywords a_min and a_max, and NINF (-inf)."""
  NINF = -float("inf")

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
  apfl.jnp = _OldJaxNumpy()
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
        "params": jax.tree.map(np.asarray, state.params),
        "clients": {int(cid.decode()): (
            jax.tree.map(np.asarray, s.params),
            jax.tree.map(np.asarray, s.interpolation_coefficients))
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
        "clusters": [jax.tree.map(np.asarray, p) for p in state.cluster_params],
        "chosen": {int(cid.decode()): int(d["cluster_id"]) for cid, d in diagnostics.items()}})
  return history
