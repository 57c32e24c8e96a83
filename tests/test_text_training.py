"""Text datasets end to end: Sentiment140 (logreg, counts and token ids), LEAF
Shakespeare and Reddit (lstm_lm), the per-token sequence loss, and bad combinations.

Every dataset is written in its release's real format into tmp_path (tiny: a few
users, short rows), then trained through `training.train_and_evaluate`.
"""
import csv
import io
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from configs import fedat_sentiment140_logreg, shakespeare_lstm
from fedjax_lama import config as config_lib
from fedjax_lama import data, models, training
from fedjax_lama.data import sentiment140
from fedjax_lama.engine import evaluate, local

# ----------------------------------------------------------------------------
# Tiny files in the releases' formats.
# ----------------------------------------------------------------------------

_POS = ("love", "great", "happy", "good")
_NEG = ("hate", "awful", "sad", "bad")


def _tweet(rng, positive: bool) -> str:
  words = list(rng.choice(_POS if positive else _NEG, size=3)) + ["the", "day"]
  rng.shuffle(words)
  return " ".join(words) + ("!" if positive else ".")


def _write_sentiment140(directory, num_users=6, per_user=8, seed=0):
  """Sentiment140's two latin-1 CSVs (polarity, id, date, query, user, text)."""
  rng = np.random.default_rng(seed)
  os.makedirs(directory, exist_ok=True)

  def rows(users, n, neutral):
    out = []
    for u in users:
      for i in range(n):
        positive = bool((i + len(u)) % 2)
        out.append(("4" if positive else "0", str(len(out)), "Mon Apr 06 2009",
                    "NO_QUERY", u, _tweet(rng, positive)))
    out += [("2", "999", "d", "q", users[0], "meh")] * neutral
    return out

  for name, table in ((sentiment140.TRAIN_FILE,
                       rows([f"user{i}" for i in range(num_users)], per_user, 0)),
                      (sentiment140.TEST_FILE, rows(["user0", "newbie"], 5, 1))):
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(table)
    with open(os.path.join(directory, name), "wb") as f:
      f.write(buf.getvalue().encode("latin-1"))


_PLAY = ("to be or not to be that is the question whether tis nobler in the mind to suffer "
         "the slings and arrows of outrageous fortune or to take arms against a sea of troubles "
         "and by opposing end them to die to sleep no more and by a sleep to say we end ")


def _write_json(path, obj):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(obj, f)


def _leaf(users: dict) -> dict:
  return {"users": list(users), "num_samples": [len(v["y"]) for v in users.values()],
          "user_data": users}


def _write_shakespeare(root, width=16):
  """LEAF Shakespeare: per role, windows of `width` characters and the next one."""
  def role(start, n):
    return {"x": [_PLAY[i:i + width] for i in range(start, start + n)],
            "y": [_PLAY[i + width] for i in range(start, start + n)]}
  _write_json(os.path.join(root, "train", "all_data_niid_0_train_9.json"),
              _leaf({"HAMLET": role(0, 12), "OPHELIA": role(40, 9), "GHOST": role(90, 6)}))
  _write_json(os.path.join(root, "test", "all_data_niid_0_test_9.json"),
              _leaf({"HAMLET": role(150, 4), "OPHELIA": role(170, 3)}))


def _reddit_user(*texts, seq_len=6):
  """LEAF reddit: per comment, <BOS> words <EOS> padded to seq_len, and its targets."""
  xs, ys = [], []
  for text in texts:
    w = text.split()
    c, t = ["<BOS>"] + w + ["<EOS>"], w + ["<EOS>", "<PAD>"]
    c += ["<PAD>"] * (-len(c) % seq_len)
    t += ["<PAD>"] * (-len(t) % seq_len)
    rows = lambda v: [v[i:i + seq_len] for i in range(0, len(v), seq_len)]
    xs.append(rows(c))
    ys.append({"target_tokens": rows(t), "score": 1})
  return {"x": xs, "y": ys}


def _write_reddit(root):
  _write_json(os.path.join(root, "train", "r_train.json"), _leaf({
      "ann": _reddit_user("the cat sat", "the dog sat on the mat today"),
      "bob": _reddit_user("a cat and a dog", "the end")}))
  _write_json(os.path.join(root, "test", "r_test.json"),
              _leaf({"ann": _reddit_user("the cat")}))


def _config(tmp_path, **overrides):
  c = config_lib.base_config()
  c.data_dir = str(tmp_path / "data")
  c.partition = "natural"
  c.rounds = 4
  c.local_steps = 3
  c.batch_size = 4
  c.eval_every = 2
  c.checkpoint_every = 4
  c.eval_batch_size = 4  # test and per-client evaluation share one compiled batch shape
  c.plots = False
  for k, v in overrides.items():
    c[k] = ml_collections.ConfigDict(v) if isinstance(v, dict) else v
  return c


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


# ----------------------------------------------------------------------------
# End to end.
# ----------------------------------------------------------------------------


@pytest.mark.slow
def test_sentiment140_logreg_counts_and_tokens_train_alike(tmp_path):
  _write_sentiment140(tmp_path / "data" / "sentiment140")
  out = {}
  for rep in ("counts", "tokens"):
    c = _config(tmp_path, dataset="sentiment140", model="logreg", local_lr=0.5,
                local_test_fraction=0.25,
                dataset_options={"vocab_size": 12, "representation": rep})
    workdir = tmp_path / rep
    summary = training.train_and_evaluate(c, str(workdir))
    assert (workdir / "summary.json").exists()
    assert summary["num_parameters"] == 12 * 2 + 2
    rows = _records(workdir)
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert 0.0 <= summary["final_test_accuracy"] <= 1.0
    assert 0.0 <= summary["client_test_accuracy_mean"] <= 1.0
    out[rep] = rows
  # Token ids sum the same kernel rows as counts @ kernel: the same run up to rounding.
  for a, b in zip(out["counts"], out["tokens"]):
    assert a["test_accuracy"] == b["test_accuracy"]
    np.testing.assert_allclose(a["test_loss"], b["test_loss"], rtol=1e-5)
    np.testing.assert_allclose(a["train_loss"], b["train_loss"], rtol=1e-5)


@pytest.mark.slow
def test_shakespeare_lstm_trains(tmp_path):
  _write_shakespeare(str(tmp_path / "data" / "shakespeare" / "data"))
  c = _config(tmp_path, dataset="shakespeare", model="lstm_lm", local_lr=0.5,
              model_options={"embed_size": 4, "hidden_size": 8})
  summary = training.train_and_evaluate(c, str(tmp_path / "w"))
  assert (tmp_path / "w" / "summary.json").exists()
  # vocab_size came from the dataset: 81 ids in, 81 classes out.
  emb = 81 * 4
  lstm = 4 * (4 * 8 + 8 * 8 + 8)
  assert summary["num_parameters"] == emb + lstm + 2 * 8 + 8 * 81 + 81
  rows = _records(tmp_path / "w")
  assert rows[-1]["train_loss"] < rows[0]["train_loss"]
  for r in rows:
    assert 0.0 <= r["test_accuracy"] <= 1.0 and np.isfinite(r["test_loss"])
  assert 0.0 <= summary["client_train_accuracy_mean"] <= 1.0


@pytest.mark.slow
def test_reddit_padding_targets_are_not_scored(tmp_path):
  _write_reddit(str(tmp_path / "data" / "reddit_leaf"))
  c = _config(tmp_path, dataset="reddit", model="lstm_lm", local_lr=0.5, rounds=2,
              per_client_eval="never",
              model_options={"embed_size": 4, "hidden_size": 8},
              dataset_options={"vocab_size": 12})
  ds = training.load_dataset(c, c.data_dir)
  raw = data.load_dataset("reddit", c.data_dir, options={"vocab_size": 12})
  assert raw.pad_id == 0 and np.any(raw.train_y == 0)
  np.testing.assert_array_equal(ds.train_y, np.where(raw.train_y == 0, -1, raw.train_y))
  np.testing.assert_array_equal(ds.train_x, raw.train_x)  # <PAD> stays an input token
  summary = training.train_and_evaluate(c, str(tmp_path / "w"))
  assert 0.0 <= summary["final_test_accuracy"] <= 1.0
  assert np.isfinite(summary["final_test_loss"])


@pytest.mark.parametrize("overrides,names", [
    ({"dataset": "shakespeare", "model": "resnet20"}, ("config.model='resnet20'", "'lstm_lm'")),
    ({"dataset": "shakespeare", "model": "mlp"}, ("config.model='mlp'", "'tokens'")),
    ({"dataset": "sentiment140", "model": "lstm_lm"}, ("config.dataset='sentiment140'", "'logreg'")),
    ({"dataset": "shakespeare", "model": "lstm_lm", "partition": "dirichlet"},
     ("config.partition='dirichlet'", "'natural'")),
    ({"dataset": "shakespeare", "model": "lstm_lm", "model_options": {"vocab_size": 100}},
     ("config.model_options.vocab_size=100", "81")),
    ({"dataset": "sentiment140", "model": "logreg", "model_options": {"vocab_size": 7},
      "dataset_options": {"vocab_size": 12, "representation": "tokens"}},
     ("config.model_options.vocab_size=7", "12", "config.dataset_options.vocab_size")),
    ({"dataset": "sentiment140", "model": "logreg", "dataset_options": {"representation": "x"}},
     ("config.dataset_options", "representation")),
])
def test_bad_combinations_stop_before_the_workdir(tmp_path, overrides, names):
  _write_sentiment140(tmp_path / "data" / "sentiment140")
  _write_shakespeare(str(tmp_path / "data" / "shakespeare" / "data"))
  c = _config(tmp_path, **overrides)
  with pytest.raises(config_lib.ConfigError) as info:
    training.train_and_evaluate(c, str(tmp_path / "w"))
  for name in names:
    assert name in str(info.value), str(info.value)
  assert not (tmp_path / "w").exists()


def test_configs_validate():
  for module, dataset, model in ((fedat_sentiment140_logreg, "sentiment140", "logreg"),
                                 (shakespeare_lstm, "shakespeare_roles", "lstm_lm")):
    c = module.get_config()
    config_lib.validate(c)
    assert (c.dataset, c.model, c.partition) == (dataset, model, "natural")
    assert c.data_dir == ""  # resolved from --config.data_dir / $FEDJAX_LAMA_DATA_DIR
    for key in c.dataset_options:
      assert key in data.DATASET_OPTIONS[dataset]
    assert set(c.model_options) <= set(models.options(model))


# ----------------------------------------------------------------------------
# The sequence loss and evaluation.
# ----------------------------------------------------------------------------


class _Table(nn.Module):
  """logits[b, t] = table[x[b, t]]: per-position logits that the test can choose."""
  vocab: int = 5

  @nn.compact
  def __call__(self, x, train=False):
    table = self.param("table", nn.initializers.normal(1.0), (self.vocab, self.vocab))
    return table[x]


def _table_setup():
  model = _Table()
  x = np.array([[0, 1, 2], [3, 4, 0]], np.int32)
  params = model.init(jax.random.PRNGKey(0), x)["params"]
  return model, params, x


def test_sequence_loss_known_answer():
  model, params, x = _table_setup()
  y = np.array([[1, 2, -1], [4, 4, 2]], np.int32)  # one padded target
  emask = np.array([1.0, 1.0], np.float32)
  loss_fn = jax.jit(local.make_loss_fn(model, has_model_state=False), static_argnums=5)
  loss, (_, correct) = loss_fn(params, {}, x, y, emask, None)
  logp = np.asarray(jax.nn.log_softmax(np.asarray(params["table"])[x]))
  picks = [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
  want = -np.mean([logp[b, t, y[b, t]] for b, t in picks])
  np.testing.assert_allclose(loss, want, rtol=1e-6)
  pred = logp.argmax(-1)
  assert correct == sum(pred[b, t] == y[b, t] for b, t in picks)
  # Masking the second example leaves its three tokens out.
  loss1, _ = loss_fn(params, {}, x, y, np.array([1.0, 0.0], np.float32), None)
  np.testing.assert_allclose(loss1, -np.mean([logp[0, 0, 1], logp[0, 1, 2]]), rtol=1e-6)


@pytest.mark.parametrize("pad", [-1, 3])
def test_appended_padding_changes_nothing(pad):
  """Pad tokens (targets < 0, or == pad_id) appended to each row: same loss and gradient."""
  model, params, x = _table_setup()
  y = np.array([[1, 2, 0], [4, 4, 2]], np.int32)
  emask = np.ones(2, np.float32)
  extra_x = np.concatenate([x, np.full((2, 4), 3, np.int32)], axis=1)
  extra_y = np.concatenate([y, np.full((2, 4), pad, np.int32)], axis=1)
  pad_id = pad if pad >= 0 else None
  for smoothing in (0.0, 0.1):
    base = local.make_loss_fn(model, False, smoothing)
    padded = local.make_loss_fn(model, False, smoothing, pad_id=pad_id)
    grad = lambda f: jax.jit(jax.value_and_grad(f, has_aux=True), static_argnums=5)
    (l0, (_, c0)), g0 = grad(base)(params, {}, x, y, emask, None)
    (l1, (_, c1)), g1 = grad(padded)(params, {}, extra_x, extra_y, emask, None)
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    assert c0 == c1
    np.testing.assert_allclose(g1["table"], g0["table"], rtol=1e-6, atol=1e-7)


def test_last_target_uses_the_last_position():
  """Shakespeare target='last' (y [B]) with per-position logits = the [B] loss on logits[:, -1]."""
  model, params, x = _table_setup()
  y_last = np.array([3, 1], np.int32)
  loss_fn = jax.jit(local.make_loss_fn(model, False), static_argnums=5)
  loss, (_, correct) = loss_fn(params, {}, x, y_last, np.ones(2, np.float32), None)
  logits = np.asarray(params["table"])[x][:, -1]
  want = optax.softmax_cross_entropy_with_integer_labels(logits, y_last).mean()
  np.testing.assert_allclose(loss, want, rtol=1e-6)
  assert correct == np.sum(logits.argmax(-1) == y_last)


def test_evaluate_pools_tokens_and_clients():
  model, params, _ = _table_setup()
  rng = np.random.default_rng(0)
  x = rng.integers(0, 5, size=(7, 4)).astype(np.int32)
  y = rng.integers(0, 5, size=(7, 4)).astype(np.int32)
  y[rng.random(y.shape) < 0.3] = -1
  y[2] = -1  # an example with no scored token
  eval_fn = evaluate.make_eval_fn(model, False)
  res = evaluate.evaluate(eval_fn, params, {}, x, y, batch_size=3)  # last batch padded
  logp = np.asarray(jax.nn.log_softmax(np.asarray(params["table"])[x]))
  scored = y >= 0
  hit = (logp.argmax(-1) == y) & scored
  np.testing.assert_allclose(res.accuracy, hit.sum() / scored.sum(), rtol=1e-12)
  nll = -np.take_along_axis(logp, np.maximum(y, 0)[..., None], -1)[..., 0]
  np.testing.assert_allclose(res.loss, nll[scored].mean(), rtol=1e-5)
  assert res.correct.shape == (7, 4) and np.all((res.correct == -1) == ~scored)
  clients = [np.array([0, 1, 2]), np.array([2]), np.array([], np.int64), np.array([3, 4, 5, 6])]
  acc = evaluate.per_client_accuracy(res.correct, clients)
  np.testing.assert_allclose(acc[0], hit[:3].sum() / scored[:3].sum())
  assert np.isnan(acc[1]) and np.isnan(acc[2])
  np.testing.assert_allclose(acc[3], hit[3:].sum() / scored[3:].sum())
  # Labels [N] keep the per-example path.
  labels = evaluate.evaluate(eval_fn, params, {}, x, y[:, 0].clip(0), batch_size=3)
  assert labels.correct.shape == (7,) and labels.correct.dtype == bool


# ----------------------------------------------------------------------------
# Logistic regression on token ids = on counts.
# ----------------------------------------------------------------------------


def test_logreg_token_ids_equal_counts():
  vocab, classes = 11, 2
  rng = np.random.default_rng(0)
  ids = rng.integers(0, vocab, size=(6, 9)).astype(np.int32)
  ids[:, 0] = ids[:, 1]  # duplicates are counted
  ids[rng.random(ids.shape) < 0.3] = -1
  ids[4] = -1  # an empty tweet
  counts = data.bag_of_words(ids, vocab)
  model = models.get("logreg", classes, vocab_size=vocab)
  p_tok = model.init(jax.random.PRNGKey(3), jnp.asarray(ids))
  p_cnt = model.init(jax.random.PRNGKey(3), jnp.asarray(counts))
  same = jax.tree.map(lambda a, b: bool(jnp.all(a == b)), p_tok, p_cnt)
  assert all(jax.tree.leaves(same))  # one parameter tree, one init
  assert sum(a.size for a in jax.tree.leaves(p_tok)) == vocab * classes + classes
  # A random bias and kernel, so both terms are exercised.
  params = jax.tree.map(
      lambda a: jnp.asarray(rng.normal(size=a.shape), a.dtype), p_tok)
  np.testing.assert_allclose(model.apply(params, jnp.asarray(ids)),
                             model.apply(params, jnp.asarray(counts)), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(model.apply(params, jnp.asarray(ids))[4],
                             params["params"]["Dense_0"]["bias"], rtol=0, atol=0)
  grad = lambda x: jax.grad(lambda p: jnp.sum(jnp.sin(model.apply(p, x))))(params)
  for a, b in zip(jax.tree.leaves(grad(jnp.asarray(ids))),
                  jax.tree.leaves(grad(jnp.asarray(counts)))):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_logreg_token_ids_need_vocab_size():
  with pytest.raises(ValueError, match="vocab_size"):
    models.get("logreg", 2).init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))
