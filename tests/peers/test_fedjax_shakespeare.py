"""FedJAX 0.0.17's Shakespeare task beside ours: one FedAvg round of its LSTM on identical
weights and windows (slow; needs fedjax).

    pip install --no-deps --target /tmp/peers -r requirements-peers.txt   # FedJAX, haiku, ...
    FEDJAX_LAMA_PEERS_PATH=/tmp/peers python -m pytest -q -n 0 -m slow \
        tests/peers/test_fedjax_shakespeare.py -s

FedJAX's side is its own model, `fedjax.models.shakespeare.create_lstm_model()` (haiku),
trained by its `fed_avg` (client SGD, server SGD(1.0) on the mean delta weighted by each
client's number of examples); ours is `lstm_lm` trained by the engine's round
(engine/sync_round.py, `weighting="examples"`), from FedJAX's initial weights mapped into
our layout (`fedjax_peer.flax_from_haiku`). FedJAX's dataset module downloads TFF's files,
so both sides train on our windows: three roles of a hand-copied Hamlet scene, each role's
lines joined by LEAF's rule and cut into windows with next-character targets
(`shakespeare_roles.gather_windows`, every 9th window of 20 characters: SEQ_LEN below), 2, 3
and 1 batches of 4 windows, lr 0.5.

Conventions, each either mapped exactly or its distance checked as a number:
- Gates and biases (mapped exactly): haiku's LSTM has one dense layer on [x, h] with one
  bias, gates in the order i, g, f, o, and adds 1 to the forget gate's pre-activation in its
  forward pass; flax's OptimizedLSTMCell has per-gate input kernels without bias, recurrent
  kernels with the bias, gates i, f, g, o. The adapter splits the rows and the columns and
  puts the +1 into the forget bias.
- A tanh after each LSTM layer (FedJAX's DeepRNN is [LSTM, tanh] x 2; the FedAvg paper and
  LEAF have none): our option `tanh_outputs=True`. Without it: `DISTANCE["no_tanh"]`.
- Vocabulary: FedJAX has 90 ids (PAD 0, 86 characters at 3..88, OOV 89; its model calls 87
  and 88 BOS and EOS, which its dataset gives to '9' and carriage return, and gives BOS and
  EOS the ids 1 and 2); LEAF's table has 80 characters and our id 80 for any other. Our
  windows are mapped id by id (`fedjax_peer.leaf_to_fedjax_ids`: '>' and '}' and our 80 go
  to its OOV) and our model is built over its 90 ids. With LEAF's 81-way softmax instead
  (the same rows and columns for the characters used, the LSTMs compared):
  `DISTANCE["leaf_vocabulary"]`.
- Special logits: FedJAX's training softmax covers all 90 ids, as ours does; its mask of
  ids 0, 87, 88, 89 enters only its `accuracy_in_vocab` metric. Its `token_loss` and
  `accuracy_no_eos` equal our evaluation's loss and accuracy on these windows (no PAD or id
  88 targets); so does `accuracy_in_vocab` after the round, whose model never ranks a
  masked id first here. With id 87 ('9' in FedJAX's data) pushed to the top of every
  position, `accuracy_in_vocab` keeps the accuracy before (the mask removes the character
  '9' from its predictions) and ours and `accuracy_no_eos` fall to 0.
- Loss normalisation: FedJAX's per-window loss is the sum over non-PAD targets divided by
  the window length, averaged over the batch; ours is the mean over scored targets. The
  same on our windows, which are never padded; FedJAX's own preprocessing pads each
  client's last window: with the last 8 targets of one window per batch padded (PAD in
  FedJAX, -1 in ours): `DISTANCE["padded_targets"]`.
Distances are the largest |ours - FedJAX| over the parameters after the round (float64),
measured with fedjax 0.0.17 and checked to 0.1%.
"""
import numpy as np
import pytest

from tests.peers import fedjax_import
from third_party import fedjax_peer

fedjax = fedjax_import.fedjax_or_skip()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position

from fedjax_lama import algorithms, models  # pylint: disable=wrong-import-position
from fedjax_lama.data import gutenberg, leaf_text  # pylint: disable=wrong-import-position
from fedjax_lama.data import shakespeare_roles  # pylint: disable=wrong-import-position
from fedjax_lama.engine import evaluate  # pylint: disable=wrong-import-position
from tests.peers import engine_rounds  # pylint: disable=wrong-import-position
from tests.peers.engine_rounds import largest  # pylint: disable=wrong-import-position

pytestmark = pytest.mark.slow

LR, BATCH, STRIDE, PADDED = 0.5, 4, 9, 8
# Our windows at `seq_len` 20, not LEAF's 80: FedJAX unrolls its LSTM statically, one copy
# of the cell per position, and its training step at 80 positions took over 15 minutes to
# compile on a 2-core CPU (at 20: about 75 s). The benchmark runs both at 80
# (`python -m benchmarks.benchmark --model=lstm_lm --peers=fedjax,torch`).
SEQ_LEN = 20
BATCHES_PER_CLIENT = (2, 3, 1)
FEDJAX_IDS, LEAF_IDS = 90, len(leaf_text.SHAKESPEARE_VOCAB)
# Hamlet, Act III, Scene 1 (public domain), three roles.
ROLES = {
    "HAMLET": [
        "To be, or not to be, that is the question:",
        "Whether 'tis nobler in the mind to suffer",
        "The slings and arrows of outrageous fortune,",
        "Or to take arms against a sea of troubles,",
        "And by opposing end them? To die: to sleep;",
        "No more; and by a sleep to say we end",
        "The heart-ache and the thousand natural shocks",
        "That flesh is heir to, 'tis a consummation",
        "Devoutly to be wish'd. To die, to sleep;"],
    "OPHELIA": [
        "Good my lord,",
        "How does your honour for this many a day?",
        "My lord, I have remembrances of yours,",
        "That I have longed long to re-deliver;",
        "I pray you, now receive them.",
        "My honour'd lord, you know right well you did;",
        "And, with them, words of so sweet breath composed",
        "As made the things more rich: their perfume lost,",
        "Take these again; for to the noble mind",
        "Rich gifts wax poor when givers prove unkind.",
        "There, my lord."],
    "POLONIUS": [
        "Ophelia, walk you here. Gracious, so please you,",
        "We will bestow ourselves. Read on this book;",
        "That show of such an exercise may colour",
        "Your loneliness. We are oft to blame in this,--",
        "'Tis too much proved--that with devotion's visage",
        "And pious action we do sugar o'er",
        "The devil himself."],
}
# Largest |ours - FedJAX| over the parameters after the round, float64, one convention
# changed at a time (module docstring); measured with fedjax 0.0.17.
DISTANCE = {"no_tanh": 4.695e-4, "leaf_vocabulary": 7.352e-3, "padded_targets": 2.083e-2}


def leaf_batches() -> list[list[tuple[np.ndarray, np.ndarray]]]:
  """Each role's windows (LEAF ids, next-character targets), cut into its batches."""
  out = []
  for lines, n in zip(ROLES.values(), BATCHES_PER_CLIENT):
    stream = leaf_text.shakespeare_ids(gutenberg.normalize_whitespace(lines))
    windows = n * BATCH
    assert len(stream) > (windows - 1) * STRIDE + SEQ_LEN
    x, y, _ = shakespeare_roles.gather_windows([stream], [(0, windows * STRIDE, STRIDE)],
                                               seq_len=SEQ_LEN)
    out.append([(x[k * BATCH:(k + 1) * BATCH], y[k * BATCH:(k + 1) * BATCH])
                for k in range(n)])
  return out


def our_model(vocabulary=FEDJAX_IDS, tanh_outputs=True):
  return models.get("lstm_lm", vocabulary, vocab_size=vocabulary, embed_size=8,
                    hidden_size=256, num_layers=2, dropout=0.0, batch_norm=False,
                    tanh_outputs=tanh_outputs)


def our_round(model, params, batches):
  """The engine's FedAvg round (every client once, weighted by its examples)."""
  alg = algorithms.build("fedavg")
  server = alg.server.init(params, {})
  (_, server, _), = engine_rounds.rounds(alg, model, batches, (tuple(range(len(batches))),),
                                         server, LR)
  return jax.tree.map(np.asarray, server.params)


def fedjax_round(fmodel, haiku_params, batches):
  return jax.tree.map(np.asarray, fedjax_peer.shakespeare_fed_avg_round(
      fedjax, fmodel, haiku_params, batches, LR)())


@pytest.fixture(scope="module")
def setup():
  to_fedjax = fedjax_peer.leaf_to_fedjax_ids(fedjax, leaf_text.SHAKESPEARE_CHARS)
  leaf = leaf_batches()
  mapped = [[(to_fedjax[x], to_fedjax[y]) for x, y in client] for client in leaf]
  fmodel = fedjax_peer.shakespeare_model(fedjax)
  return {"to_fedjax": to_fedjax, "leaf": leaf, "mapped": mapped, "fmodel": fmodel,
          "haiku": fmodel.init(jax.random.PRNGKey(0))}


@pytest.fixture(scope="module")
def float64_runs(setup):
  """FedJAX's round and ours at its conventions, float64 on both sides."""
  with jax.enable_x64(True):
    haiku = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), setup["haiku"])
    start = fedjax_peer.flax_from_haiku(haiku)
    theirs = fedjax_round(setup["fmodel"], haiku, setup["mapped"])
    ours = our_round(our_model(), start, setup["mapped"])
  assert all(a.dtype == np.float64 for a in jax.tree.leaves(ours))
  return {"haiku": haiku, "start": start, "theirs": theirs, "ours": ours,
          "theirs_mapped": fedjax_peer.flax_from_haiku(theirs)}


def test_vocabulary_map_known_answer(setup):
  to_fedjax = setup["to_fedjax"]
  assert to_fedjax.shape == (LEAF_IDS,)
  chars = leaf_text.SHAKESPEARE_CHARS
  # FedJAX's characters in id order from id 3 (fedjax/datasets/shakespeare.py).
  table = ("dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#'/37;?bfjnrvzBFJNRVZ\"&*.26:\naeimquyAEIMQUY]"
           "!%)-159\r")
  assert len(table) == 86
  for i, char in enumerate(chars):
    assert to_fedjax[i] == (3 + table.index(char) if char in table else 89), char
  assert to_fedjax[chars.index("9")] == 87  # its model's "BOS" (module docstring)
  assert [chars[i] for i in np.flatnonzero(to_fedjax[:-1] == 89)] == [">", "}"]
  assert to_fedjax[leaf_text.SHAKESPEARE_OOV] == 89
  used = to_fedjax[to_fedjax != 89]
  assert len(set(used.tolist())) == 78 and used.min() >= 3 and used.max() <= 88


def test_mapped_weights_compute_fedjax_forward_pass(setup):
  x = setup["mapped"][0][0][0]
  theirs = np.asarray(setup["fmodel"].apply_for_train(setup["haiku"], {"x": x}))
  ours = np.asarray(our_model().apply({"params": fedjax_peer.flax_from_haiku(setup["haiku"])},
                                      jnp.asarray(x)))
  print(f"\nFedJAX {fedjax_peer.version()} Shakespeare LSTM forward pass, float32: largest "
        f"logit difference {np.max(np.abs(ours - theirs)):.3g}")
  assert ours.shape == theirs.shape == (BATCH, SEQ_LEN, FEDJAX_IDS)
  assert np.max(np.abs(ours - theirs)) < 1e-5
  # Without the tanh after each layer the logits differ.
  plain = np.asarray(our_model(tanh_outputs=False).apply(
      {"params": fedjax_peer.flax_from_haiku(setup["haiku"])}, jnp.asarray(x)))
  assert np.max(np.abs(plain - theirs)) > 1e-3


def test_one_round_equals_fedjax_float64(float64_runs):
  runs = float64_runs
  distance = largest(runs["ours"], runs["theirs_mapped"])
  moved = largest(runs["ours"], runs["start"])
  print(f"\nFedAvg round vs FedJAX {fedjax_peer.version()} fed_avg on its Shakespeare LSTM, "
        f"float64: largest parameter difference {distance:.3g} (the round moved them "
        f"{moved:.3g})")
  assert distance < 1e-12
  assert moved > 1e-2


def test_one_round_equals_fedjax_float32(setup):
  start = fedjax_peer.flax_from_haiku(setup["haiku"])
  theirs = fedjax_peer.flax_from_haiku(fedjax_round(setup["fmodel"], setup["haiku"],
                                                    setup["mapped"]))
  ours = our_round(our_model(), start, setup["mapped"])
  assert all(a.dtype == np.float32 for a in jax.tree.leaves(ours))
  distance = largest(ours, theirs)
  print(f"\nFedAvg round vs FedJAX {fedjax_peer.version()} fed_avg, float32: largest "
        f"parameter difference {distance:.3g}")
  assert distance < 2e-5
  assert largest(ours, start) > 1e-2


def _check(name, value):
  print(f"\n{name}: {value:.4g} (FedJAX {fedjax_peer.version()})")
  if DISTANCE[name] is None:
    pytest.fail(f"record DISTANCE[{name!r}] = {value:.4g}")
  assert value == pytest.approx(DISTANCE[name], rel=1e-3)


def test_distance_without_fedjax_tanh(float64_runs, setup):
  with jax.enable_x64(True):
    ours = our_round(our_model(tanh_outputs=False), float64_runs["start"], setup["mapped"])
  _check("no_tanh", largest(ours, float64_runs["theirs_mapped"]))


def test_distance_with_leaf_vocabulary(float64_runs, setup):
  """Our model over LEAF's 81 ids, on the LEAF-id windows: its embedding rows and output
  columns are FedJAX's of the same characters; the LSTMs are compared."""
  to_fedjax = setup["to_fedjax"]
  start = dict(float64_runs["start"])
  start["Embed_0"] = {"embedding": start["Embed_0"]["embedding"][to_fedjax]}
  start["Dense_0"] = {"kernel": start["Dense_0"]["kernel"][:, to_fedjax],
                      "bias": start["Dense_0"]["bias"][to_fedjax]}
  with jax.enable_x64(True):
    ours = our_round(our_model(LEAF_IDS), start, setup["leaf"])
  cells = lambda p: {k: v for k, v in p.items() if k.startswith("OptimizedLSTMCell")}
  _check("leaf_vocabulary", largest(cells(ours), cells(float64_runs["theirs_mapped"])))


def test_distance_on_padded_targets(float64_runs, setup):
  """The last PADDED targets of each batch's first window padded: FedJAX divides that
  window's loss by the window length, ours by its scored targets."""
  pad = lambda y, value: np.concatenate(
      [np.concatenate([y[:1, :-PADDED], np.full((1, PADDED), value, y.dtype)], 1), y[1:]])
  theirs_batches = [[(x, pad(y, 0)) for x, y in client] for client in setup["mapped"]]
  ours_batches = [[(x, pad(y, -1)) for x, y in client] for client in setup["mapped"]]
  with jax.enable_x64(True):
    theirs = fedjax_peer.flax_from_haiku(fedjax_round(setup["fmodel"], float64_runs["haiku"],
                                                      theirs_batches))
    ours = our_round(our_model(), float64_runs["start"], ours_batches)
  _check("padded_targets", largest(ours, theirs))


def test_metrics_beside_fedjax(float64_runs, setup):
  """FedJAX's evaluation of the round's model on all the windows beside ours (FedJAX's
  accuracies are float32 means)."""
  x = np.concatenate([x for client in setup["mapped"] for x, _ in client])
  y = np.concatenate([y for client in setup["mapped"] for _, y in client])
  eval_batch = evaluate.make_eval_fn(our_model(), False)
  with jax.enable_x64(True):
    theirs = fedjax_peer.shakespeare_metrics(fedjax, setup["fmodel"], float64_runs["theirs"],
                                             x, y, BATCH)
    ours = evaluate.evaluate(eval_batch, float64_runs["ours"], {}, x, y)
    # Id 87 first at every position: FedJAX's in-vocabulary accuracy masks it out.
    pushed = jax.tree.map(np.array, float64_runs["theirs"])
    pushed["linear"]["b"][87] += 1e3
    theirs_pushed = fedjax_peer.shakespeare_metrics(fedjax, setup["fmodel"], pushed, x, y,
                                                    BATCH)
    ours_pushed = evaluate.evaluate(eval_batch, fedjax_peer.flax_from_haiku(pushed), {}, x, y)
  print(f"\nFedJAX metrics {theirs}; ours: loss {ours.loss:.6f}, accuracy {ours.accuracy:.6f}")
  assert theirs["num_tokens"] == x.size
  assert theirs["token_loss"] == pytest.approx(ours.loss, abs=1e-12)
  assert theirs["accuracy_no_eos"] == pytest.approx(ours.accuracy, abs=1e-7)
  assert theirs["accuracy_in_vocab"] == pytest.approx(ours.accuracy, abs=1e-7)
  assert 0.05 < ours.accuracy < 1
  assert not np.any(y == 87)
  assert ours_pushed.accuracy == theirs_pushed["accuracy_no_eos"] == 0
  assert theirs_pushed["accuracy_in_vocab"] == pytest.approx(ours.accuracy, abs=1e-7)
