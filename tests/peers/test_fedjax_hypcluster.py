"""hypcluster beside FedJAX 0.0.17's `fedjax.algorithms.hyp_cluster` on identical inputs (slow;
needs fedjax).

    pip install --no-deps --target /tmp/peers -r requirements-peers.txt   # FedJAX, haiku, ...
    FEDJAX_LAMA_PEERS_PATH=/tmp/peers python -m pytest -q -n 0 -m slow tests/peers -s

Identical inputs, float64 on both sides: our model zoo's "mlp" (4-5-3, ReLU) in a FedJAX
loss on FedJAX's side (third_party/fedjax_peer.py), the same k = 3 initial cluster models
(our x_2, x_3 replaced by the peer's), clients 0 and 1 in round 0 and all three in rounds 1
to 4, client SGD at lr 0.1, server SGD(1.0) on each cluster's example-weighted mean.
Compared after every round: the k cluster models and each client's chosen cluster.

Per-client evaluation beside FedJAX's `HypClusterEvaluator`: each client served the cluster
model of lowest mean loss over its whole training part and evaluated on its test part; the
per-client accuracy and mean loss agree to 1e-12 (float64; FedJAX's choice uses its train-mode
loss, ours the evaluation mode, the same on this model without dropout or BatchNorm).

The convention difference in training: FedJAX chooses a client's cluster by the mean loss
over all of its examples before training; ours by the loss on the client's first local batch
(what the client trains on first). Two settings:
- one batch per client (8 examples; 2 local epochs, so 2 steps on it): the first batch is
  all of the client's data, the choices are the same, and the runs agree to 1e-13;
- 2, 3 and 4 batches of 4 examples per client (one epoch): the choices may differ; the
  distance (choices that differ, largest cluster-model difference) is checked as a number.
"""
import numpy as np
import pytest

from tests.peers import fedjax_import
from third_party import fedjax_peer

fedjax = fedjax_import.fedjax_or_skip()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position

from fedjax_lama import algorithms  # pylint: disable=wrong-import-position
from fedjax_lama.algorithms import hypcluster  # pylint: disable=wrong-import-position
# pylint: disable-next=wrong-import-position
from fedjax_lama.engine import client_store, evaluate, personal_eval, sharding
from fedjax_lama.models import zoo  # pylint: disable=wrong-import-position
from tests.peers import engine_rounds  # pylint: disable=wrong-import-position
from tests.peers.engine_rounds import largest  # pylint: disable=wrong-import-position

pytestmark = pytest.mark.slow

LR, K_CLUSTERS = 0.1, 3
D_IN, HIDDEN, CLASSES = 4, 5, 3
COHORTS = ((0, 1),) + ((0, 1, 2),) * 4
# setting -> (batches per client, batch size, local epochs, how far the clients lean apart,
# the spread of x_2..x_k around x_1: None, drawn independently)
SETTINGS = {"one_batch": ((1, 1, 1), 8, 2, 1.0, None),
            "minibatches": ((2, 3, 4), 4, 1, 0.0, 0.05)}
# Minibatches, measured with fedjax 0.0.17 (checked to 0.1%): client-rounds whose choice
# differs out of 14, and the largest |ours - FedJAX| over the cluster models after 5 rounds.
MINIBATCH_DISTANCE = (4, 0.1905)


def model():
  return zoo.get("mlp", CLASSES, hidden_sizes=(HIDDEN,))


def inputs(setting, seed=0):
  per_client, batch, _, lean, spread = SETTINGS[setting]
  rng = np.random.default_rng(seed)

  def draw(shift):
    return {"Dense_0": {"kernel": rng.normal(scale=0.5, size=(D_IN, HIDDEN)) + shift,
                        "bias": rng.normal(scale=0.1, size=HIDDEN)},
            "Dense_1": {"kernel": rng.normal(scale=0.5, size=(HIDDEN, CLASSES)),
                        "bias": rng.normal(scale=0.1, size=CLASSES)}}

  clusters = [draw(0.0) for _ in range(K_CLUSTERS)]
  if spread is not None:  # near x_1, so that one batch's losses can rank them otherwise
    clusters = [clusters[0]] + [jax.tree.map(lambda w: w + spread * rng.normal(size=w.shape),
                                             clusters[0]) for _ in range(K_CLUSTERS - 1)]
  # Clients whose inputs and labels lean to different classes (lean 1) or not at all (0,
  # where a client's batches disagree more often on its cluster).
  batches = [[(rng.normal(size=(batch, D_IN)) + lean * c,
               np.where(rng.random(batch) < 0.7 * lean, c, rng.integers(0, CLASSES, batch)))
              for _ in range(n)] for c, n in enumerate(per_client)]
  return clusters, batches


def ours(clusters, batches, setting) -> list[dict]:
  per_client, _, epochs, _, _ = SETTINGS[setting]
  history = []
  with jax.enable_x64(True):
    alg = algorithms.build("hypcluster", num_clusters=K_CLUSTERS)
    server = alg.server.init(jax.tree.map(jnp.asarray, clusters[0]), {})
    others = jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *clusters[1:])
    server = server._replace(extra={**server.extra, "others": others})
    for cohort_ids, server, store in engine_rounds.rounds(
        alg, model(), batches, COHORTS, server, LR, steps=[n * epochs for n in per_client]):
      stacked = hypcluster.stacked(server.params, server.extra["others"])
      chosen = np.asarray(store["cluster"])
      history.append({
          "clusters": [jax.tree.map(lambda a, j=j: np.asarray(a[j]), stacked)
                       for j in range(K_CLUSTERS)],
          "chosen": {i: int(chosen[i]) for i in cohort_ids}})
  assert all(a.dtype == np.float64 for a in jax.tree.leaves(history[-1]["clusters"]))
  return history


def peer(clusters, batches, setting) -> list[dict]:
  with jax.enable_x64(True):
    return fedjax_peer.hyp_cluster_rounds(
        fedjax, model(), [jax.tree.map(jnp.asarray, p) for p in clusters], batches, COHORTS,
        LR, num_epochs=SETTINGS[setting][2])


def compare(setting):
  clusters, batches = inputs(setting)
  mine, theirs = ours(clusters, batches, setting), peer(clusters, batches, setting)
  differing = sum(a["chosen"][i] != b["chosen"][i]
                  for a, b in zip(mine, theirs, strict=True) for i in a["chosen"])
  worst = max(largest(a["clusters"], b["clusters"]) for a, b in zip(mine, theirs))
  print(f"\nhypcluster ({setting}) vs FedJAX {fedjax_peer.version()} hyp_cluster, "
        f"{len(COHORTS)} rounds, float64: choices differing {differing}, largest cluster "
        f"difference {worst:.4g}; choices ours {[sorted(a['chosen'].items()) for a in mine]}")
  return mine, theirs, clusters, differing, worst


def test_equals_fedjax_hyp_cluster_when_the_first_batch_is_all_the_data():
  mine, _, clusters, differing, worst = compare("one_batch")
  assert differing == 0
  assert worst < 1e-13
  # Not vacuous: the clients split over clusters, and every cluster chosen moved.
  chosen = {c for record in mine for c in record["chosen"].values()}
  assert len(chosen) >= 2, chosen
  for j in chosen:
    assert largest(mine[-1]["clusters"][j], clusters[j]) > 1e-2


def test_first_batch_choice_distance_from_fedjax():
  _, _, _, differing, worst = compare("minibatches")
  want_differing, want_worst = MINIBATCH_DISTANCE
  assert differing == want_differing
  assert worst == pytest.approx(want_worst, rel=1e-3, abs=1e-13)


def test_per_client_evaluation_equals_fedjax_hyp_cluster_evaluator():
  clusters, _ = inputs("one_batch")
  rng = np.random.default_rng(3)
  sizes = ((7, 5), (9, 4), (6, 6), (8, 3))   # (train, test) examples per client
  data = [[(rng.normal(size=(n, D_IN)) + 0.8 * c,
            np.where(rng.random(n) < 0.6, c % CLASSES, rng.integers(0, CLASSES, n)))
           for n in pair] for c, pair in enumerate(sizes)]
  train, test = [d[0] for d in data], [d[1] for d in data]
  with jax.enable_x64(True):
    choices, theirs = fedjax_peer.hyp_cluster_evaluation(
        fedjax, model(), [jax.tree.map(jnp.asarray, p) for p in clusters], train, test)
    alg = algorithms.build("hypcluster", num_clusters=K_CLUSTERS)
    first = jax.tree.map(jnp.asarray, clusters[0])
    others = jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *clusters[1:])
    server = alg.server.init(first, {})
    server = server._replace(extra={**server.extra, hypcluster.OTHERS: others})
    offsets = np.cumsum([0] + [len(y) for _, y in train])
    test_offsets = np.cumsum([0] + [len(y) for _, y in test])
    mesh = sharding.client_mesh(jax.devices()[:1])
    evaluator = personal_eval.PersonalEvaluator(
        evaluate.make_eval_fn(model(), False), mesh,
        test_x=np.concatenate([x for x, _ in test]),
        test_y=np.concatenate([y for _, y in test]),
        test_parts=[np.arange(a, b) for a, b in zip(test_offsets[:-1], test_offsets[1:])],
        clients_per_chunk=len(sizes), serve=alg.serve,
        train_x=np.concatenate([x for x, _ in train]),
        train_y=np.concatenate([y for _, y in train]),
        train_parts=[np.arange(a, b) for a, b in zip(offsets[:-1], offsets[1:])])
    store = client_store.ClientStore.create(alg.row_init(first), len(sizes), mesh)
    sums = evaluator(first, {}, store, server=server)["personal"]
  ours = {c: {"accuracy": sums.correct[c] / sums.count[c],
              "loss": sums.loss_sum[c] / sums.count[c]} for c in range(len(sizes))}
  print(f"\nhypcluster evaluation vs FedJAX {fedjax_peer.version()} HypClusterEvaluator: "
        f"choices {choices}; ours {ours}; theirs {theirs}")
  assert len(set(choices.values())) >= 2, choices  # not vacuous: the clients differ
  for c in range(len(sizes)):
    assert ours[c]["accuracy"] == pytest.approx(theirs[c]["accuracy"], abs=1e-12)
    assert ours[c]["loss"] == pytest.approx(theirs[c]["loss"], abs=1e-12)
