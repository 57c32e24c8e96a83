"""LoRA adapters (Hu et al., ICLR 2022) on the zoo's Dense layers, the trainable set and the
merged export (fedjax_lama/models/lora.py).

Known answers: with B = 0 the adapted model is the base model bit for bit; the forward pass
and its gradient in A and B against a float64 numpy reference written here; the trainable
set's size counted by hand from the layer sizes; split and merge exact inverses; the
merged export read by the model without adapters.
"""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fedjax_lama import config as config_lib
from fedjax_lama import models
from fedjax_lama.errors import ConfigError
from fedjax_lama.models import lora, param_layers
from fedjax_lama.tree import leaf_names

KEYS = {"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)}
D, R, V = 16, 2, 81  # transformer width, adapter rank, vocabulary
TRANSFORMER = dict(width=D, depth=2, heads=2, max_len=12)
PROJECTIONS = "*/attention/*,*/mlp_*"


def _tokens(batch=3, time=12, seed=0):
  return jax.random.randint(jax.random.PRNGKey(seed), (batch, time), 0, V)


# name, options, adapter targets, input
CASES = {
    "transformer_lm": (TRANSFORMER, PROJECTIONS, _tokens()),
    "mlp": ({"hidden_sizes": (7, 5)}, "*", jnp.linspace(-1, 1, 4 * 9).reshape(4, 9)),
    "lstm_lm": ({"vocab_size": V, "embed_size": 4, "hidden_size": 6, "batch_norm": False,
                 "dropout": 0.0}, "Dense_0", _tokens(2, 5)),
    "fedat_cnn": ({}, "Dense_*", jnp.linspace(0, 1, 2 * 28 * 28).reshape(2, 28, 28, 1)),
}


def _classes(name):
  return 10 if name in ("mlp", "fedat_cnn") else V


@functools.lru_cache(maxsize=None)
def _models(name, rank=R, alpha=8.0, dropout=0.0):
  options, targets, _ = CASES[name]
  spec = {"rank": rank, "alpha": alpha, "targets": targets, "dropout": dropout}
  return (models.get(name, _classes(name), **options),
          models.get(name, _classes(name), **options, lora=spec))


@functools.lru_cache(maxsize=None)
def _jitted(model, method="apply", **kwargs):
  """The model's jitted apply (one compilation per model and keyword set)."""
  return jax.jit(functools.partial(getattr(model, method), **kwargs))


def _draw(shapes, seed=0, scale=0.3):
  """Leaves of `shapes` drawn from N(0, scale^2) (no init to compute), lora_b zero."""
  rng = np.random.default_rng(seed)
  return jax.tree.map_with_path(
      lambda path, x: jnp.zeros(x.shape, x.dtype) if path[-1].key == lora.ADAPTER_B
      else jnp.asarray(rng.normal(0, scale, x.shape), x.dtype), shapes)


def _pair(name, **spec):
  """(base model, adapted model, base params, adapted params, input): random base leaves,
  shared by both, random A, B = 0, as the adapters are initialised."""
  base, adapted = _models(name, **spec)
  x = CASES[name][2]
  shapes = lambda model: jax.eval_shape(model.init, KEYS, x)["params"]
  params = _draw(shapes(adapted))
  return base, adapted, lora.base_of(params), params, x


def _random_b(params, seed=0, scale=0.3):
  """`params` with every lora_b drawn from N(0, scale^2)."""
  rng = np.random.default_rng(seed)
  return jax.tree.map_with_path(
      lambda path, x: jnp.asarray(rng.normal(0, scale, x.shape), x.dtype)
      if path[-1].key == lora.ADAPTER_B else x, params)


# ---- B = 0: the base model exactly ------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CASES))
def test_zero_b_is_the_base_model_bit_for_bit(name):
  base, adapted, base_params, params, x = _pair(name)
  added = sorted(set(leaf_names(params)) - set(leaf_names(base_params)))
  assert added and all(n.endswith(("/lora_a", "/lora_b")) for n in added)
  assert jax.tree.structure(base_params) == jax.tree.structure(
      jax.eval_shape(base.init, KEYS, x)["params"])
  np.testing.assert_array_equal(_jitted(adapted)({"params": params}, x),
                                _jitted(base)({"params": base_params}, x))
  if name == "mlp":  # op by op too
    np.testing.assert_array_equal(adapted.apply({"params": params}, x),
                                  base.apply({"params": base_params}, x))


@pytest.mark.parametrize("name", ["mlp", "transformer_lm"])
@pytest.mark.slow
def test_initialised_adapters_leave_the_base_initialisation_as_it_is(name):
  """From the same key the base leaves are the base model's, A random, B zero."""
  base, adapted = _models(name)
  x = CASES[name][2]
  if name == "transformer_lm":  # one block: the initialisation is computed op by op
    base, adapted = (models.get(name, V, **{**TRANSFORMER, "depth": 1}, **extra)
                     for extra in ({}, {"lora": {"rank": R, "targets": PROJECTIONS}}))
  base_params, params = base.init(KEYS, x)["params"], adapted.init(KEYS, x)["params"]
  assert jax.tree.structure(lora.base_of(params)) == jax.tree.structure(base_params)
  for ours, theirs in zip(jax.tree.leaves(lora.base_of(params)), jax.tree.leaves(base_params)):
    np.testing.assert_array_equal(ours, theirs)
  adapters = [(n, leaf) for n, leaf in zip(leaf_names(params), jax.tree.leaves(params))
              if "lora" in n]
  assert adapters and all(not np.any(leaf) if n.endswith("lora_b") else np.std(leaf) > 0
                          for n, leaf in adapters)


def test_zero_b_with_adapter_dropout_in_training_is_the_base_model():
  base, adapted, base_params, params, x = _pair("transformer_lm", dropout=0.5)
  rngs = {"dropout": jax.random.PRNGKey(3)}
  np.testing.assert_array_equal(
      _jitted(adapted, train=True)({"params": params}, x, rngs=rngs),
      _jitted(base, train=True)({"params": base_params}, x, rngs=rngs))


def test_targets_select_by_name_prefix_and_glob():
  _, adapted, _, params, _ = _pair("transformer_lm")
  adapted_layers = lambda p: sorted({n.rsplit("/", 1)[0] for n in leaf_names(p)
                                     if n.endswith("lora_a")})
  assert adapted_layers(params) == sorted(
      f"block_{i}/{layer}" for i in range(2) for layer in
      ("attention/query", "attention/key", "attention/value", "attention/out", "mlp_in",
       "mlp_out"))
  for targets, want in (("block_1/attention/query", ["block_1/attention/query"]),
                        ("block_0/mlp_in,Dense_0", ["Dense_0", "block_0/mlp_in"]),
                        ("block_1/attention", [f"block_1/attention/{n}" for n in
                                               ("key", "out", "query", "value")])):
    model = models.get("transformer_lm", V, **TRANSFORMER, lora={"rank": 1, "targets": targets})
    assert adapted_layers(jax.eval_shape(model.init, KEYS, _tokens())["params"]) == want


# ---- the forward pass and its gradient against numpy (float64) --------------------------------
class _OneDense(nn.Module):
  lora: lora.LoRA

  @nn.compact
  def __call__(self, x):
    return param_layers.Dense(5, lora=self.lora, name="proj")(x)


def _reference(x, w, b, a, bb, scale, keep=None, p=0.0):
  """h = x W + b + s (dropout(x) A) B, and the gradients of sum(h * g) in A and B."""
  xd = x if keep is None else np.where(keep, x / (1.0 - p), 0.0)
  h = x @ w + b + scale * (xd @ a) @ bb
  rows = lambda m: m.reshape(-1, m.shape[-1])   # the batch and time axes as one
  return h, (lambda g: (scale * rows(xd).T @ rows(g @ bb.T),
                        scale * rows(xd @ a).T @ rows(g)))


@pytest.mark.parametrize("shape", [(4, 6), (2, 3, 6)])
def test_forward_and_gradient_against_numpy(shape):
  rng = np.random.default_rng(0)
  rank, alpha = 3, 5.0
  with jax.enable_x64(True):
    spec = lora.LoRA(rank, ("proj",), alpha)
    x = rng.normal(size=shape)
    params = {"proj": {"kernel": rng.normal(size=(6, 5)), "bias": rng.normal(size=5),
                       "lora_a": rng.normal(size=(6, rank)),
                       "lora_b": rng.normal(size=(rank, 5))}}
    g = rng.normal(size=shape[:-1] + (5,))
    p = params["proj"]
    want, grads = _reference(x, p["kernel"], p["bias"], p["lora_a"], p["lora_b"], alpha / rank)
    model = _OneDense(spec)
    got = model.apply({"params": params}, jnp.asarray(x))
    assert got.dtype == jnp.float64
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    grad = jax.grad(lambda q: jnp.sum(model.apply({"params": q}, x) * g))(params)["proj"]
    want_a, want_b = grads(g)
    np.testing.assert_allclose(grad["lora_a"], want_a, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad["lora_b"], want_b, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad["kernel"], x.reshape(-1, 6).T @ g.reshape(-1, 5),
                               rtol=1e-12)

    # Dropout on the adapter's input only, inverted (kept entries / (1 - p)), and only when
    # the call carries a "dropout" rng.
    dropping = _OneDense(lora.LoRA(rank, ("proj",), alpha, dropout=0.4))
    np.testing.assert_allclose(dropping.apply({"params": params}, x), want, rtol=1e-13)
    out, seen = dropping.apply({"params": params}, x, rngs={"dropout": jax.random.PRNGKey(5)},
                               capture_intermediates=True, mutable=["intermediates"])
    keep = np.asarray(seen["intermediates"]["proj"]["lora_dropout"]["__call__"][0]) != 0
    assert 0 < keep.mean() < 1
    want_dropped, _ = _reference(x, p["kernel"], p["bias"], p["lora_a"], p["lora_b"],
                                 alpha / rank, keep, 0.4)
    np.testing.assert_allclose(out, want_dropped, rtol=1e-12, atol=1e-12)


def test_a_initializations():
  fan_in, rank = 1024, 64
  for a_init, std in (("gaussian", 1 / np.sqrt(fan_in)),
                      ("kaiming_uniform", 1 / np.sqrt(3 * fan_in))):
    model = _OneDense(lora.LoRA(rank, ("proj",), a_init=a_init))
    a = model.init(KEYS, jnp.ones((1, fan_in)))["params"]["proj"]["lora_a"]
    assert a.shape == (fan_in, rank)
    assert abs(np.std(a) / std - 1) < 0.02  # 65,536 draws
    if a_init == "kaiming_uniform":
      assert np.max(np.abs(a)) <= 1 / np.sqrt(fan_in)


# ---- the trainable set ----------------------------------------------------------------------
def test_trainable_set_sizes_counted_by_hand():
  _, _, _, params, _ = _pair("transformer_lm")
  depth, mlp = 2, 4 * D
  lora_a = depth * (4 * D * R + D * R + mlp * R)   # q, k, v, out; mlp_in; mlp_out
  lora_b = depth * (4 * R * D + R * mlp + R * D)
  assert lora.trainable_set(params, "lora").size == lora_a + lora_b == 1152
  assert lora.trainable_set(params, ["lora_b"]).size == lora_b == 576   # FFA-LoRA
  biases = depth * (4 * D + mlp + D + 2 * D) + D + V   # projections, norms; final norm, head
  norm_scales = depth * 2 * D + D
  head_kernel = D * V
  assert lora.trainable_set(params, "bias").size == biases
  chosen = lora.trainable_set(params, ("lora", "bias", "norm", "Dense_0"))
  assert chosen.size == lora_a + lora_b + biases + norm_scales + head_kernel == 2977
  everything = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  assert lora.trainable_set(params, "*").size == everything
  assert everything == models.transformer.parameter_count(
      V, **{k: TRANSFORMER[k] for k in ("width", "depth")}, max_len=12) + lora_a + lora_b


@pytest.mark.parametrize("names", ["lora", "lora_b", "lora,bias,norm,Dense_0",
                                   "block_1/*,lora_a", "*"])
def test_split_and_merge_are_exact_inverses(names):
  _, _, _, params, _ = _pair("transformer_lm")
  params = _random_b(params)
  chosen = lora.trainable_set(params, names)
  trainable, frozen = chosen.split(params)
  assert sorted(leaf_names(trainable)) == sorted(chosen.trainable_names)
  assert not set(leaf_names(trainable)) & set(leaf_names(frozen))
  assert sorted(leaf_names(trainable) + leaf_names(frozen)) == sorted(leaf_names(params))
  assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(trainable)) == chosen.size
  for back in (chosen.merge(trainable, frozen), jax.jit(chosen.merge)(trainable, frozen)):
    assert jax.tree.structure(back) == jax.tree.structure(params)
    for ours, theirs in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
      assert ours.dtype == theirs.dtype
      np.testing.assert_array_equal(np.asarray(ours).view(np.uint32),
                                    np.asarray(theirs).view(np.uint32))
  with pytest.raises(ValueError, match="does not match this trainable set"):
    chosen.merge(frozen, trainable) if frozen else chosen.merge({}, trainable)


def test_ffa_lora_trains_b_over_a_frozen_shared_base():
  """FFA-LoRA's trainable set: one SGD step on B moves B only; the clients' steps vmapped
  with the frozen part (A and the base) given once, not per client, equal each client's
  own step."""
  _, adapted, _, params, _ = _pair("mlp")
  chosen = lora.trainable_set(params, "lora_b")
  trainable, frozen = chosen.split(params)
  assert {n.rsplit("/", 1)[1] for n in leaf_names(trainable)} == {"lora_b"}

  def loss(trainable, frozen, x, y):
    logits = adapted.apply({"params": chosen.merge(trainable, frozen)}, x)
    return jnp.mean(-jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], -1))

  def step(trainable, frozen, x, y):
    grads = jax.grad(loss)(trainable, frozen, x, y)
    return jax.tree.map(lambda t, g: t - 0.5 * g, trainable, grads)

  rng = np.random.default_rng(1)
  xs, ys = jnp.asarray(rng.normal(size=(3, 4, 9)), jnp.float32), jnp.asarray(
      rng.integers(0, 10, (3, 4)))
  clients = jax.jit(jax.vmap(step, in_axes=(None, None, 0, 0)))(trainable, frozen, xs, ys)
  for k in range(3):
    one = jax.jit(step)(trainable, frozen, xs[k], ys[k])
    for ours, theirs in zip(jax.tree.leaves(clients), jax.tree.leaves(one)):
      np.testing.assert_allclose(ours[k], theirs, rtol=1e-5, atol=1e-6)
  moved = jax.tree.map(lambda a, b: bool(np.any(a != b)), trainable,
                       jax.tree.map(lambda x: x[0], clients))
  assert all(jax.tree.leaves(moved))


# ---- wrong names: one line listing the model's layers -------------------------------------
def test_wrong_names_stop_with_one_line():
  _, adapted, base_params, params, _ = _pair("transformer_lm")
  spec = lora.LoRA.parse({"rank": R, "targets": "*/attention/query,*/atention/*"})
  lora.check_targets(lora.LoRA.parse({"rank": R, "targets": PROJECTIONS}), params)
  cases = [
      (lambda: lora.check_targets(spec, params), "'*/atention/*' names no Dense layer"),
      (lambda: lora.trainable_set(params, "lora,Dense_9"), "'Dense_9' selects nothing"),
      (lambda: lora.trainable_set(base_params, "lora_b"), "the model has no adapters"),
      (lambda: lora.trainable_set(params, ""), "trainable=''"),
      (lambda: lora.with_base(params, {**base_params, "extra": {"kernel": jnp.ones(2)}}),
       "has the parameter 'extra/kernel', which the model does not have"),
  ]
  for call, message in cases:
    with pytest.raises(ConfigError) as e:
      call()
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    if "selects nothing" in message or "names no" in message:
      assert "block_1/attention/value" in str(e.value) and "final_norm" in str(e.value)


@pytest.mark.parametrize("value,message", [
    ({"rank": 0, "targets": "*"}, "lora.rank=0"),
    ({"rank": 2, "targets": "*", "alpha": -1}, "lora.alpha=-1"),
    ({"rank": 2, "targets": "*", "dropout": 1.0}, "lora.dropout=1.0"),
    ({"rank": 2, "targets": "*", "a_init": "zeros"}, "lora.a_init='zeros'"),
    ({"rank": 2}, "missing targets"),
    ({"rank": 2, "targets": "*", "r": 4}, "unknown key(s) r"),
    ({"rank": 2, "targets": []}, "lora.targets=[]"),
    ("yes", "lora='yes'"),
])
def test_bad_options_stop_with_one_line(value, message):
  with pytest.raises(ValueError) as e:
    models.get("transformer_lm", V, **TRANSFORMER, lora=value)
  assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_option_accepted_by_every_model_but_logreg_and_by_runs():
  assert all("lora" in models.options(name) for name in models.names() if name != "logreg")
  with pytest.raises(ValueError, match="unknown option"):
    models.get("logreg", 2, lora={"rank": 1, "targets": "*"})
  spec = ml_collections.ConfigDict({"rank": 2, "targets": ("*/attention/*",)})
  assert lora.LoRA.parse(spec) == lora.LoRA(2, ("*/attention/*",))
  c = config_lib.base_config()
  c.model, c.model_options.lora = "transformer_lm", spec
  config_lib.validate(c)  # runs train the trainable set (tests/test_lora_runs.py)
  assert config_lib.trainable_names(c) == "lora"


# ---- base checkpoints and the merged export -------------------------------------------------
@pytest.mark.parametrize("name", ["transformer_lm", "mlp"])
def test_merged_export_is_read_by_the_model_without_adapters(name):
  base, adapted, base_params, params, x = _pair(name)
  spec = lora.LoRA.parse({"rank": R, "targets": CASES[name][1]})
  # B = 0: the merged parameters are the base parameters, bit for bit.
  plain = lora.merged(params, spec)
  assert jax.tree.structure(plain) == jax.tree.structure(base_params)
  for ours, theirs in zip(jax.tree.leaves(plain), jax.tree.leaves(base_params)):
    np.testing.assert_array_equal(ours, theirs)
  np.testing.assert_array_equal(_jitted(base)({"params": plain}, x),
                                _jitted(adapted)({"params": params}, x))
  # Trained adapters: the model without adapters reads the merged kernels.
  trained = _random_b(params)
  want = _jitted(adapted)({"params": trained}, x)
  assert np.max(np.abs(want - _jitted(base)({"params": base_params}, x))) > 1e-2
  np.testing.assert_allclose(_jitted(base)({"params": lora.merged(trained, spec)}, x), want,
                             rtol=1e-5, atol=2e-5)


def test_a_base_checkpoint_loads_under_the_adapters():
  base, adapted, base_params, params, x = _pair("transformer_lm")
  pretrained = jax.tree.map(lambda p: p + 0.01, base_params)
  loaded = lora.with_base(params, pretrained)
  np.testing.assert_array_equal(_jitted(adapted)({"params": loaded}, x),
                                _jitted(base)({"params": pretrained}, x))
  bad = jax.tree.map_with_path(
      lambda path, p: jnp.ones((3,)) if path[-1].key == "bias" and path[0].key == "Dense_0"
      else p, pretrained)
  with pytest.raises(ConfigError, match="parameter 'Dense_0/bias' is float32\\[3\\] there; the model expects"):
    lora.with_base(params, bad)
