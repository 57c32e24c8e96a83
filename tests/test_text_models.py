"""The text models and metrics: `lstm_lm` (one or more layers: FedAT's Reddit model, the
FedAvg paper's and LEAF's character LSTM) and `transformer_lm`; next-token metrics; the
per-client evaluation of text against the pooled evaluation.

Parameter counts are worked out here from the layer sizes; the transformer's forward pass
is written out in numpy (attention by hand); causal masking is checked by changing a
future token; the metrics against an example computed by hand; runs go through
`training.train_and_evaluate` on tiny LEAF-format Shakespeare files.
"""
import json
import math
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fedjax_lama import config as config_lib
from fedjax_lama import models, training
from fedjax_lama.engine import evaluate, local, personal_eval, sharding
from fedjax_lama.errors import ConfigError
from fedjax_lama.algorithms import layer_partition
from fedjax_lama.fedlama import layer_units
from fedjax_lama.run import records
from fedjax_lama.tree import leaf_paths
from tests.test_text_training import _PLAY, _leaf, _write_json

V = 81  # LEAF's 80 Shakespeare characters + one for any other


def _count(tree) -> int:
  return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(tree))


def _shapes(model, length=80, batch=1):
  rngs = {"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)}
  x = jax.ShapeDtypeStruct((batch, length), jnp.int32)
  return jax.eval_shape(lambda x: model.init(rngs, x), x)


def _random_variables(model, x, seed=0, scale=0.5):
  """Every parameter drawn from N(0, scale^2) (no init to compile); running variances 1."""
  shapes = _shapes(model, x.shape[1], x.shape[0])
  rng = np.random.default_rng(seed)
  draw = lambda path, leaf: jnp.asarray(
      np.ones(leaf.shape) if path[-1].key == "var" else
      np.zeros(leaf.shape) if path[-1].key == "mean" else rng.normal(0, scale, leaf.shape),
      jnp.float32)
  return jax.tree.map_with_path(draw, shapes)


# ---- parameter counts -----------------------------------------------------------------------
def _lstm_layer(inputs: int, hidden: int) -> int:
  """Four gates, each an input kernel, a recurrent kernel and one bias."""
  return 4 * (inputs * hidden + hidden * hidden + hidden)


def test_lstm_lm_paper_variant_parameter_count():
  """McMahan et al. 2017 / LEAF: embedding 8, two LSTMs of 256, softmax over characters."""
  model = models.get("lstm_lm", V, vocab_size=V, embed_size=8, hidden_size=256,
                     num_layers=2, dropout=0.0, batch_norm=False)
  variables = _shapes(model)
  want = V * 8 + _lstm_layer(8, 256) + _lstm_layer(256, 256) + (256 * V + V)
  assert want == 648 + 271_360 + 525_312 + 20_817 == 818_137
  assert _count(variables["params"]) == want
  assert "batch_stats" not in variables  # no batch normalisation in the paper's model
  # LEAF's TF model predicts its 80 characters (no out-of-table id): 817,872.
  leaf = models.get("lstm_lm", 80, vocab_size=80, embed_size=8, hidden_size=256,
                    num_layers=2, dropout=0.0, batch_norm=False)
  assert _count(_shapes(leaf)["params"]) == 80 * 8 + 796_672 + 256 * 80 + 80 == 817_872
  # The paper's 866,578 is 265 V + 796,672 for no whole V (one bias per gate).
  assert (866_578 - _lstm_layer(8, 256) - _lstm_layer(256, 256)) % (8 + 256 + 1) != 0


def test_lstm_lm_layers_option_and_the_default_model_unchanged():
  default = _shapes(models.get("lstm_lm", 10_000), length=20)
  assert _count(default["params"]) == 2_701_840  # FedAT's Reddit model, one layer
  assert _count(default["batch_stats"]) == 256
  three = _shapes(models.get("lstm_lm", 12, vocab_size=12, embed_size=4, hidden_size=6,
                             num_layers=3), length=5)
  assert _count(three["params"]) == (12 * 4 + _lstm_layer(4, 6) + 2 * _lstm_layer(6, 6)
                                     + 2 * 6 + 6 * 12 + 12)
  assert sorted(k for k in three["params"] if k.startswith("OptimizedLSTMCell")) == [
      "OptimizedLSTMCell_0", "OptimizedLSTMCell_1", "OptimizedLSTMCell_2"]
  for bad in ({"num_layers": 0}, {"batch_norm": "yes"}, {"hidden_size": 2.5}):
    with pytest.raises(ValueError, match=list(bad)[0]):
      models.get("lstm_lm", 12, **bad)


def _numpy_lstm_lm(params, tokens, num_layers, tanh_outputs):
  """The LSTM LM written out in numpy: i, f, g, o gates from the input kernels (no bias)
  plus the recurrent kernels and one bias per gate; c = f c + i g, h = o tanh(c)."""
  sigmoid = lambda z: 1 / (1 + np.exp(-z))
  x = np.asarray(params["Embed_0"]["embedding"], np.float64)[tokens]
  for k in range(num_layers):
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params[f"OptimizedLSTMCell_{k}"])
    batch, hidden = x.shape[0], p["hi"]["kernel"].shape[0]
    h, c, outputs = np.zeros((batch, hidden)), np.zeros((batch, hidden)), []
    for t in range(x.shape[1]):
      gate = {g: x[:, t] @ p["i" + g]["kernel"] + h @ p["h" + g]["kernel"] + p["h" + g]["bias"]
              for g in "ifgo"}
      c = sigmoid(gate["f"]) * c + sigmoid(gate["i"]) * np.tanh(gate["g"])
      h = sigmoid(gate["o"]) * np.tanh(c)
      outputs.append(np.tanh(h) if tanh_outputs else h)
    x = np.stack(outputs, 1)
  return x @ np.asarray(params["Dense_0"]["kernel"]) + np.asarray(params["Dense_0"]["bias"])


@pytest.mark.parametrize("tanh_outputs", [False, True])
def test_lstm_lm_against_numpy(tanh_outputs):
  """Two layers, with and without a tanh on each layer's outputs (FedJAX's Shakespeare
  model has one): the logits equal the numpy LSTM's, and the option changes them."""
  model = models.get("lstm_lm", 11, vocab_size=11, embed_size=3, hidden_size=5, num_layers=2,
                     dropout=0.0, batch_norm=False, tanh_outputs=tanh_outputs)
  tokens = np.random.default_rng(1).integers(0, 11, (2, 6)).astype(np.int32)
  params = _random_variables(model, tokens)["params"]
  logits = np.asarray(model.apply({"params": params}, jnp.asarray(tokens)))
  np.testing.assert_allclose(logits, _numpy_lstm_lm(params, tokens, 2, tanh_outputs),
                             atol=2e-5)
  other = _numpy_lstm_lm(params, tokens, 2, not tanh_outputs)
  assert np.max(np.abs(logits - other)) > 1e-2
  with pytest.raises(ValueError, match="tanh_outputs"):
    models.get("lstm_lm", 11, tanh_outputs="yes")


def _transformer_count(vocab, width, depth, mlp_ratio, max_len, classes, tied):
  """By layer: embeddings; per block two LayerNorms (scale, bias), four attention
  projections and two MLP projections (kernel, bias); a final LayerNorm; the head."""
  d, hidden = width, mlp_ratio * width
  layer_norm = 2 * d
  attention = 4 * (d * d + d)
  mlp = (d * hidden + hidden) + (hidden * d + d)
  head = 0 if tied else d * classes + classes
  return vocab * d + max_len * d + depth * (2 * layer_norm + attention + mlp) + layer_norm + head


@pytest.mark.parametrize("size,want", [
    ({"width": 64, "depth": 4, "heads": 4}, 215_633),
    ({"width": 128, "depth": 4, "heads": 4}, 824_401),
    ({"width": 256, "depth": 6, "heads": 8}, 4_801_105),
    ({"width": 256, "depth": 12, "heads": 8}, 9_539_665),
])
def test_transformer_named_sizes(size, want):
  assert _transformer_count(V, size["width"], size["depth"], 4, 80, V, False) == want
  assert _count(_shapes(models.get("transformer_lm", V, **size))["params"]) == want


def test_transformer_options_change_the_count_as_the_layers_say():
  opts = dict(width=24, depth=3, heads=3, mlp_ratio=2, max_len=50)
  untied = models.get("transformer_lm", 30, vocab_size=40, **opts)
  assert _count(_shapes(untied, 50)["params"]) == _transformer_count(40, 24, 3, 2, 50, 30,
                                                                      False)
  tied = models.get("transformer_lm", 40, tied_output=True, **opts)
  params = _shapes(tied, 50)["params"]
  assert _count(params) == _transformer_count(40, 24, 3, 2, 50, 40, True)
  assert not any(k.startswith("Dense") for k in params)  # the embedding is the head
  for bad, match in (({"width": 10, "heads": 4}, "multiple of heads"),
                     ({"tied_output": True, "vocab_size": 7}, "tied_output"),
                     ({"depth": 0}, "depth"), ({"dropout": 1.0}, "dropout")):
    with pytest.raises(ValueError, match=match):
      models.get("transformer_lm", 30, **bad)
  with pytest.raises(ValueError, match="max_len"):
    _shapes(models.get("transformer_lm", 5, width=8, heads=2, max_len=4), length=6)


# ---- the transformer against numpy ----------------------------------------------------------
def _layer_norm(x, p, eps=1e-5):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _gelu(x):  # the tanh approximation (GPT-2's, and jax.nn.gelu's default)
  return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def _dense(x, p):
  return x @ p["kernel"] + p["bias"]


def _numpy_transformer(params, tokens, heads, tied):
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  batch, length = tokens.shape
  h = p["token_embed"]["embedding"][tokens] + p["position_embed"]["embedding"][:length]
  blocks = sorted((k for k in p if k.startswith("block_")), key=lambda k: int(k[6:]))
  for name in blocks:
    blk = p[name]
    a = _layer_norm(h, blk["attention_norm"])
    width = a.shape[-1]
    dh = width // heads
    q, k, v = (_dense(a, blk["attention"][n]).reshape(batch, length, heads, dh)
               for n in ("query", "key", "value"))
    out = np.zeros((batch, length, heads, dh))
    for b in range(batch):
      for n in range(heads):
        for t in range(length):  # position t attends to positions 0..t
          scores = np.array([q[b, t, n] @ k[b, s, n] for s in range(t + 1)]) / np.sqrt(dh)
          weights = np.exp(scores - scores.max())
          weights /= weights.sum()
          out[b, t, n] = sum(weights[s] * v[b, s, n] for s in range(t + 1))
    h = h + _dense(out.reshape(batch, length, width), blk["attention"]["out"])
    m = _gelu(_dense(_layer_norm(h, blk["mlp_norm"]), blk["mlp_in"]))
    h = h + _dense(m, blk["mlp_out"])
  h = _layer_norm(h, p["final_norm"])
  if tied:
    return h @ p["token_embed"]["embedding"].T
  return _dense(h, p["Dense_0"])


@pytest.mark.parametrize("tied,kernels", [(False, "patches"), (True, "lax")])
def test_transformer_equals_a_numpy_forward_pass(tied, kernels):
  model = models.get("transformer_lm", 7, width=8, depth=2, heads=2, mlp_ratio=2,
                     max_len=6, tied_output=tied, kernels=kernels)
  tokens = np.random.default_rng(0).integers(0, 7, (2, 5)).astype(np.int32)
  # Random LayerNorm scales and biases too, so that every parameter is exercised.
  params = _random_variables(model, tokens, seed=1)["params"]
  got = np.asarray(jax.jit(model.apply)({"params": params}, tokens))
  want = _numpy_transformer(params, tokens, heads=2, tied=tied)
  assert got.shape == (2, 5, 7)
  np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


# ---- causal masking -------------------------------------------------------------------------
_CAUSAL_MODELS = {
    "lstm_lm": dict(vocab_size=11, embed_size=4, hidden_size=8, num_layers=2),
    "transformer_lm": dict(width=16, depth=2, heads=2, max_len=12),
}


@pytest.mark.parametrize("name", sorted(_CAUSAL_MODELS))
def test_a_future_token_changes_no_earlier_prediction(name):
  model = models.get(name, 11, **_CAUSAL_MODELS[name])
  rng = np.random.default_rng(3)
  x = rng.integers(0, 11, (3, 12)).astype(np.int32)
  variables = _random_variables(model, x)
  apply = jax.jit(lambda x: model.apply(variables, x))
  base = np.asarray(apply(x))
  for t in (0, 5, 11):
    changed = x.copy()
    changed[:, t] = (changed[:, t] + 1 + rng.integers(0, 10, 3)) % 11
    out = np.asarray(apply(changed))
    np.testing.assert_array_equal(out[:, :t], base[:, :t])  # the past: bit for bit
    assert np.all(np.abs(out[:, t] - base[:, t]).max(-1) > 0)  # position t reads token t


def test_transformer_dropout_draws_from_the_dropout_key_in_training_only():
  model = models.get("transformer_lm", 11, width=16, depth=1, heads=2, max_len=8, dropout=0.5)
  plain = models.get("transformer_lm", 11, width=16, depth=1, heads=2, max_len=8)
  x = np.random.default_rng(0).integers(0, 11, (2, 8)).astype(np.int32)
  variables = _random_variables(model, x)
  apply = jax.jit(model.apply, static_argnames="train")
  evaluated = np.asarray(apply(variables, x, train=False))
  np.testing.assert_array_equal(evaluated, np.asarray(jax.jit(plain.apply)(variables, x)))
  trained = [np.asarray(apply(variables, x, train=True, rngs={"dropout": jax.random.PRNGKey(k)}))
             for k in (0, 0, 1)]
  np.testing.assert_array_equal(trained[0], trained[1])
  assert not np.allclose(trained[0], trained[2]) and not np.allclose(trained[0], evaluated)


# ---- metrics --------------------------------------------------------------------------------
class _Table(nn.Module):
  """logits[b, t] = table[x[b, t]]: per-position logits that the test chooses."""

  @nn.compact
  def __call__(self, x, train=False):
    del train
    return self.param("table", nn.initializers.zeros, (4, 3))[x]


TABLE = np.log(np.array([[0.7, 0.2, 0.1],    # token 0 predicts 0 (p 0.7)
                         [0.1, 0.6, 0.3],    # token 1 predicts 1
                         [0.25, 0.25, 0.5],  # token 2 predicts 2
                         [0.2, 0.5, 0.3]]))  # token 3 predicts 1


def test_next_token_metrics_known_answer():
  x = np.array([[0, 1, 2], [3, 0, 1], [2, 2, 3], [1, 3, 0]], np.int32)
  y = np.array([[0, 2, 2],      # right, wrong, right; last scored: position 2, right
                [1, 0, -1],     # right, right, padded; last scored: position 1, right
                [-1, -1, -1],   # nothing scored
                [1, 2, 1]], np.int32)  # right, wrong (p 0.3), wrong (p 0.2); last wrong
  eval_fn = evaluate.make_eval_fn(_Table(), False)
  params = {"table": jnp.asarray(TABLE, jnp.float32)}
  res = evaluate.evaluate(eval_fn, params, {}, x, y, batch_size=3)  # a padded last batch
  nats = -np.log([0.7, 0.3, 0.5, 0.5, 0.7, 0.6, 0.3, 0.2])  # the 8 scored targets
  assert res.accuracy == pytest.approx(5 / 8)
  assert res.loss == pytest.approx(nats.mean(), rel=1e-6)
  assert res.accuracy_last == pytest.approx(2 / 3)  # rows 0, 1 right, row 3 wrong
  np.testing.assert_allclose(res.example_loss, [nats[:3].sum(), nats[3:5].sum(), 0.0,
                                                nats[5:].sum()], rtol=1e-6)
  record = records.next_token_metrics("test", res)
  assert record == {"test_accuracy_last": res.accuracy_last,
                    "test_bits_per_token": pytest.approx(nats.mean() / math.log(2), rel=1e-6)}
  # One target per window: the last position's logits; accuracy_last is the accuracy.
  last = evaluate.evaluate(eval_fn, params, {}, x, np.array([2, 0, 1, 2], np.int32), 3)
  assert last.accuracy == last.accuracy_last == pytest.approx(2 / 4)


# ---- per-client evaluation = pooled evaluation ----------------------------------------------
def _skewed_text(seed=0):
  """Windows of roles of very unequal sizes: two large roles, five of 2 windows, one empty."""
  rng = np.random.default_rng(seed)
  sizes = np.array([40, 2, 2, 2, 0, 2, 2, 33])
  n = int(sizes.sum())
  x = rng.integers(0, 11, (n, 12)).astype(np.int32)
  y = np.concatenate([x[:, 1:], rng.integers(0, 11, (n, 1))], axis=1).astype(np.int32)
  y[rng.random(y.shape) < 0.1] = -1  # padded targets (Reddit's <PAD>) are not scored
  parts = np.split(rng.permutation(n), np.cumsum(sizes)[:-1])
  return x, y, parts


def test_per_client_evaluation_equals_the_pooled_evaluation():
  x, y, parts = _skewed_text()
  model = models.get("lstm_lm", 11, vocab_size=11, embed_size=4, hidden_size=8)
  variables = _random_variables(model, x[:1])
  eval_fn = evaluate.make_eval_fn(model, True)
  pooled = evaluate.evaluate(eval_fn, variables["params"], variables["batch_stats"], x, y, 16)
  mesh = sharding.client_mesh(jax.devices()[:1])

  def evaluator(**kw):
    return personal_eval.PersonalEvaluator(eval_fn, mesh, test_x=x, test_y=y,
                                           test_parts=parts, eval_batch_size=16, **kw)

  sums = evaluator(clients_per_chunk=2)(variables["params"], variables["batch_stats"])["global"]
  scored = np.count_nonzero(pooled.correct >= 0)
  assert sums.count.sum() == scored
  assert sums.correct.sum() == np.count_nonzero(pooled.correct == 1)
  np.testing.assert_allclose(sums.loss_sum.sum() / scored, pooled.loss, rtol=1e-6)
  np.testing.assert_array_equal(sums.accuracy[[len(p) > 0 for p in parts]],
                                evaluate.per_client_accuracy(pooled.correct, parts)[
                                    [len(p) > 0 for p in parts]])
  # The personal path (chunks laid out by part size; fine-tuning of 0 steps: the global
  # model) gives the same counts, and the same losses up to float32 rounding (a window's
  # loss is summed over its tokens in another layout).
  layout = personal_eval.chunk_layout([len(p) for p in parts], 2, 16)
  assert sorted({w for _, _, w in layout}) == [2, 40]  # grouped: the small roles apart
  tuned = evaluator(clients_per_chunk=2, loss_fn=local.make_loss_fn(model, True), train_x=x,
                    train_y=y, train_parts=parts, finetune_steps=0)
  both = tuned(variables["params"], variables["batch_stats"], personal=True)
  np.testing.assert_array_equal(both["personal"].correct, both["global"].correct)
  np.testing.assert_array_equal(both["personal"].count, both["global"].count)
  np.testing.assert_allclose(both["personal"].loss_sum, both["global"].loss_sum, rtol=1e-6)


@pytest.mark.parametrize("sizes,chunk,devices", [
    ([60, 1, 2, 33, 5, 0, 17, 3, 9], 2, 1), ([4, 4, 5, 3], 2, 2), ([1000, 1] + [3] * 50, 1, 4),
    ([0, 0], 3, 1), (list(range(1, 200, 7)), 1, 1)])
def test_chunk_layout_evaluates_every_client_once(sizes, chunk, devices):
  layout = personal_eval.chunk_layout(sizes, chunk, 16, devices)
  seen, widths = [], {w for _, _, w in layout}
  for ids, real, width in layout:
    assert len(ids) % devices == 0 and 1 <= real <= len(ids)
    assert np.all(ids[real:] == ids[0])
    assert all(sizes[i] <= width <= max(sizes) for i in ids[:real])
    seen += list(ids[:real])
  assert sorted(seen) == [i for i, s in enumerate(sizes) if s > 0]
  assert len(widths) <= personal_eval.MAX_WIDTHS
  real = sum(sizes)
  padded = sum(len(ids) * width for ids, _, width in layout)
  one_width = -(-len(seen) // (-(-chunk // devices) * devices)) * (
      -(-chunk // devices) * devices) * max(sizes or [0])
  if one_width <= personal_eval.MAX_PADDING * real:  # one width: the chunks as given
    assert widths <= {max(sizes)} and padded == one_width
  else:  # grouped by size: fewer examples evaluated than with one width
    assert len(widths) > 1 and padded < one_width


# ---- runs -----------------------------------------------------------------------------------
def _write_roles(root, width=10):
  """LEAF Shakespeare files: four roles of unequal sizes, each with test windows."""
  def role(start, n):
    return {"x": [_PLAY[i:i + width] for i in range(start, start + n)],
            "y": [_PLAY[i + width] for i in range(start, start + n)]}
  _write_json(os.path.join(root, "train", "a_train.json"), _leaf(
      {"HAMLET": role(0, 30), "OPHELIA": role(40, 12), "GHOST": role(90, 6),
       "HORATIO": role(110, 8)}))
  _write_json(os.path.join(root, "test", "a_test.json"), _leaf(
      {"HAMLET": role(150, 6), "OPHELIA": role(170, 3), "GHOST": role(190, 1),
       "HORATIO": role(200, 2)}))


_TINY = {"width": 16, "depth": 2, "heads": 2, "mlp_ratio": 2}


def _text_config(tmp_path, **overrides):
  _write_roles(str(tmp_path / "data" / "shakespeare" / "data"))
  c = config_lib.base_config()
  c.data_dir = str(tmp_path / "data")
  c.dataset, c.model, c.partition = "shakespeare", "transformer_lm", "natural"
  c.model_options = ml_collections.ConfigDict(_TINY)
  c.rounds, c.local_steps, c.batch_size, c.local_lr = 2, 3, 4, 0.3
  c.eval_every, c.checkpoint_every, c.eval_batch_size, c.plots = 2, 2, 8, False
  c.local_test_fraction = 0.1  # natural roles: each role's own LEAF test windows
  for key, value in overrides.items():
    if isinstance(value, dict):
      for k, v in value.items():
        c[key][k] = v
    else:
      c[key] = value
  return c


def _last_record(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f][-1]


@pytest.mark.slow
def test_transformer_trains_under_fedavg_with_the_next_token_metrics(tmp_path):
  c = _text_config(tmp_path, model_options={"depth": 1})
  summary = training.train_and_evaluate(c, str(tmp_path / "w"))
  # vocab_size and max_len came from the dataset: 81 characters, windows of 10.
  assert summary["num_parameters"] == _transformer_count(V, 16, 1, 2, 10, V, False)
  last = _last_record(tmp_path / "w")
  assert np.isfinite(last["train_loss"]) and 0.0 <= last["test_accuracy"] <= 1.0
  assert 0.0 <= last["test_accuracy_last"] <= 1.0
  assert last["test_bits_per_token"] == pytest.approx(last["test_loss"] / math.log(2))
  with open(tmp_path / "w" / "summary.json") as f:
    written = json.load(f)
  for key in ("final_test_accuracy_last", "best_test_accuracy_last",
              "final_test_bits_per_token"):
    assert written[key] == summary[key]
  assert summary["final_test_accuracy_last"] == last["test_accuracy_last"]
  assert 0.0 <= summary["client_test_accuracy/global/mean"] <= 1.0


def _tiny_params():
  return _shapes(models.get("transformer_lm", V, max_len=10, **_TINY), 10)["params"]


def test_transformer_layer_names_for_fedlama_and_the_personalization_options():
  params = _tiny_params()
  spec = layer_units.layer_spec(params, "module")
  blocks = [f"block_{i}/{name}" for i in range(2) for name in (
      "attention/query", "attention/key", "attention/value", "attention/out",
      "attention_norm", "mlp_in", "mlp_out", "mlp_norm")]
  assert sorted(spec.names) == sorted(
      blocks + ["Dense_0", "final_norm", "position_embed", "token_embed"])
  kernels = {n for n, k in zip(spec.names, spec.is_kernel) if k}
  assert kernels == {n for n in blocks if "norm" not in n} | {"Dense_0"}
  paths = ["/".join(p) for p in leaf_paths(params)]
  # FedPer's and FedRep's default head: the output projection; LG-FedAvg's default: the rest.
  head = layer_partition.named_layers("", layer_partition.classifier_head, "f")(params)
  assert [p for p, h in zip(paths, head) if h] == ["Dense_0/bias", "Dense_0/kernel"]
  lower = layer_partition.named_layers("", layer_partition.every_layer_but_the_head, "f")(
      params)
  assert np.array_equal(lower, ~head)
  # A layer named by hand: the attention of the last block.
  named = layer_partition.named_layers("block_1/attention", None, "f")(params)
  assert [p for p, h in zip(paths, named) if h] == [
      f"block_1/attention/{n}/{leaf}" for n in ("key", "out", "query", "value")
      for leaf in ("bias", "kernel")]


@pytest.mark.slow
def test_transformer_trains_under_fedlama_and_fedper(tmp_path):
  params = _tiny_params()
  # FedLAMA's schedule over FedAvg: per-layer intervals on the transformer's layers.
  c = _text_config(tmp_path, schedule="fedlama", rounds=1,
                   fedlama={"base_interval": 2, "phi": 2, "total_steps": 8,
                            "layer_granularity": "module"})
  summary = training.train_and_evaluate(c, str(tmp_path / "lama"))
  assert "block_0/attention/out" in summary["fedlama_layer_names"]
  assert np.isfinite(summary["final_test_loss"])
  # FedPer: the output projection (the default head) stays on each role; only the body
  # travels.
  c = _text_config(tmp_path, algorithm="fedper")
  summary = training.train_and_evaluate(c, str(tmp_path / "per"))
  sizes = {"/".join(path): leaf.size for path, leaf in zip(
      leaf_paths(params), jax.tree.leaves(params))}
  for way in ("up", "down"):
    floats = summary[f"comm_floats_{way}_per_layer"]
    assert set(floats) == set(sizes)
    assert floats["Dense_0/kernel"] == floats["Dense_0/bias"] == 0
    trips = {name: floats[name] / size for name, size in sizes.items()
             if not name.startswith("Dense_0/")}
    assert len(set(trips.values())) == 1 and min(trips.values()) > 0, trips
  assert 0.0 <= summary["client_test_accuracy/personal/mean"] <= 1.0


def test_transformer_refusals_name_the_field(tmp_path):
  c = _text_config(tmp_path, model_options={"max_len": 5})
  with pytest.raises(ConfigError, match="config.model_options.max_len=5.*>= 10"):
    training.train_and_evaluate(c, str(tmp_path / "w"))
  # Tied output: no head of its own, so FedPer's default head is refused by name.
  c = _text_config(tmp_path, algorithm="fedper", model_options={"tied_output": True})
  with pytest.raises(ConfigError, match="fedper.personal_layers.*token_embed"):
    training.train_and_evaluate(c, str(tmp_path / "t"))
  assert not (tmp_path / "w").exists()
