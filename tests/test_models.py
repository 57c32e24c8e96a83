"""Tests of the model zoo: shapes, parameter counts, init styles, options.

Known answers are the papers' exact parameter counts (and their code's); every kernel set
gives the same parameter tree. The kernels' values against lax are in tests/kernels/.
"""

import functools
import math

import flax.linen as nn
from hypothesis import given, settings, strategies as st
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_lama import kernels as kernels_lib
from fedjax_lama import models
from fedjax_lama.models import init
from fedjax_lama.models import resnet

CIFAR = (32, 32, 3)
MNIST = (28, 28, 1)

# name, num_classes, input shape, options, params, tensors, kernels
# (the papers' tables and their code's models).
COUNTS = [
    ("resnet20", 10, CIFAR, {}, 272_762, 68, 23),
    ("resnet20", 100, CIFAR, {}, 278_612, 68, 23),
    ("wrn28_10", 100, CIFAR, {}, 36_539_124, 86, 29),
    ("wrn28_10", 100, CIFAR, {"variant": "preact"}, 36_536_884, 80, 29),
    ("wrn28_10", 10, CIFAR, {"variant": "preact"}, 36_479_194, 80, 29),
    ("leaf_cnn", 62, MNIST, {}, 6_603_710, 8, 4),
    ("fedat_cnn", 10, CIFAR, {}, 122_570, 10, 5),
    ("fedat_cnn", 10, MNIST, {}, 93_322, 10, 5),
    ("fedat_cnn", 10, CIFAR, {"variant": "same_pool3"}, 122_570, 10, 5),
    ("fedat_cnn", 10, MNIST, {"variant": "same_pool3"}, 93_322, 10, 5),
    ("mnist_mlp", 10, MNIST, {}, 159_010, 4, 2),
    ("mnist_cnn", 10, MNIST, {}, 21_840, 8, 4),
    ("cifar_cnn", 10, CIFAR, {}, 122_570, 10, 5),
    ("cifar_lenet", 10, CIFAR, {}, 62_006, 10, 5),
    ("fedspeed_lenet", 10, CIFAR, {}, 797_962, 10, 5),
    ("resnet9", 10, CIFAR, {}, 4_903_242, 38, 13),
    ("resnet9", 10, CIFAR, {"variant": "dawnbench"}, 6_573_120, 25, 9),
    # Stated from the built model (torchvision's ResNet-18 has 11,689,512 for
    # 1000 classes; GroupNorm has as many parameters as BatchNorm).
    ("resnet18_gn", 10, CIFAR, {}, 11_181_642, 62, 21),
    ("resnet18_gn", 100, CIFAR, {}, 11_227_812, 62, 21),
    ("logreg", 2, (5000,), {"vocab_size": 5000}, 5000 * 2 + 2, 2, 1),
    # Stated from the built model: embedding 1,280,000 + LSTM 131,584 + BN 256
    # + dense 1,290,000.
    ("lstm_lm", 10_000, (20,), {}, 2_701_840, 17, 9),
    ("mlp", 10, (8, 8, 1), {"hidden_sizes": (32, 16)}, 2_778, 6, 3),
]

# Running statistics (non-trainable) by (name, variant): floats and tensors.
BATCH_STATS = {("resnet20", None): (1_600, 44),
               ("wrn28_10", None): (20_192, 56),
               ("wrn28_10", "preact"): (17_952, 50),
               ("resnet9", None): (5_760, 24),
               ("resnet9", "dawnbench"): (4_480, 16),
               ("lstm_lm", None): (256, 2)}

CONV_MODELS = ["resnet20", "wrn28_10", "leaf_cnn", "fedat_cnn", "mnist_cnn",
               "cifar_cnn", "cifar_lenet", "fedspeed_lenet", "resnet9",
               "resnet18_gn"]

INPUT = {"leaf_cnn": MNIST, "mnist_cnn": MNIST, "mnist_mlp": MNIST,
         "logreg": (50,), "lstm_lm": (7,), "transformer_lm": (7,), "mlp": (8, 8, 1)}


def _sample(name, batch=2, seed=0):
  shape = INPUT.get(name, CIFAR)
  rng = np.random.default_rng(seed)
  if name in ("lstm_lm", "transformer_lm"):  # token ids
    return jnp.asarray(rng.integers(0, 10_000, size=(batch,) + shape))
  return jnp.asarray(rng.normal(size=(batch,) + shape), jnp.float32)


def _abstract_init(model, x):
  rngs = {"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)}
  return jax.eval_shape(lambda x: model.init(rngs, x), x)


def _numpy_variables(model, x, seed=0):
  """Variables of the right tree and shapes, filled from numpy.

  Much cheaper than `model.init` on CPU (no threefry kernels to compile), which
  keeps the suite short; `init` itself is tested on a few small models.
  """
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    name = path[-1].key
    if name == "var":
      return jnp.ones(leaf.shape, leaf.dtype)
    if name == "mean":
      return jnp.zeros(leaf.shape, leaf.dtype)
    if name == "scale":
      return jnp.asarray(1 + 0.1 * rng.normal(size=leaf.shape), leaf.dtype)
    fan_in = math.prod(leaf.shape[:-1]) if leaf.ndim > 1 else 10
    return jnp.asarray(rng.normal(size=leaf.shape) / math.sqrt(fan_in),
                       leaf.dtype)

  return jax.tree.map_with_path(fill, _abstract_init(model, x))


def _size(tree):
  return sum(math.prod(l.shape) for l in jax.tree.leaves(tree))


def _leaf_names(tree):
  return [path[-1].key for path, _ in
          jax.tree.leaves_with_path(tree)]


@pytest.mark.parametrize(
    "name,num_classes,shape,opts,params,tensors,kernels", COUNTS,
    ids=[f"{c[0]}-{c[1]}-{'x'.join(map(str, c[2]))}-{c[3]}" for c in COUNTS])
def test_exact_parameter_counts(name, num_classes, shape, opts, params,
                                tensors, kernels):
  model = models.get(name, num_classes, **opts)
  dtype = jnp.int32 if name == "lstm_lm" else jnp.float32
  variables = _abstract_init(model, jax.ShapeDtypeStruct((1,) + shape, dtype))
  p = variables["params"]
  assert _size(p) == params
  assert len(jax.tree.leaves(p)) == tensors
  assert _leaf_names(p).count("kernel") == kernels
  floats, count = BATCH_STATS.get((name, opts.get("variant")), (0, 0))
  assert _size(variables.get("batch_stats", {})) == floats
  assert len(jax.tree.leaves(variables.get("batch_stats", {}))) == (
      count)


def test_resnet20_kernel_shapes_match_spec_table():
  """FedLAMA's reference ResNet20 (Lee et al. 2023): the HWIO kernel shapes and their multiplicities."""
  model = models.get("resnet20", 10)
  p = _abstract_init(model, jnp.zeros((1,) + CIFAR))["params"]
  shapes = sorted(tuple(l.shape) for path, l in
                  jax.tree.leaves_with_path(p)
                  if path[-1].key == "kernel")
  expected = sorted(
      [(3, 3, 3, 16)] + [(3, 3, 16, 16)] * 6 + [(1, 1, 16, 16)]
      + [(3, 3, 16, 32)] + [(3, 3, 32, 32)] * 5 + [(1, 1, 16, 32)]
      + [(3, 3, 32, 64)] + [(3, 3, 64, 64)] * 5 + [(1, 1, 32, 64)]
      + [(64, 10)])
  assert shapes == expected
  assert sum(math.prod(s) for s in shapes) == 271_152


@pytest.mark.parametrize("name", models.names())
def test_leaf_names_and_kernel_ranks(name):
  """Conv/dense weights are "kernel" leaves (FedLAMA's kernel mask)."""
  model = models.get(name, 10)
  x = _sample(name, batch=1)
  p = _abstract_init(model, x)["params"]
  for path, leaf in jax.tree.leaves_with_path(p):
    key = path[-1].key
    assert key in ("kernel", "bias", "scale", "embedding"), path
    if leaf.ndim >= 2:
      assert key in ("kernel", "embedding"), path
    else:
      assert key != "kernel", path


@pytest.mark.parametrize("name", CONV_MODELS)
def test_kernel_sets_share_the_parameter_tree(name):
  shapes = {}
  impls = (kernels_lib.KERNELS if name in ("fedat_cnn", "resnet20")
           else ("lax", "patches"))
  for impl in impls:
    model = models.get(name, 10, kernels=impl)
    variables = _abstract_init(model, _sample(name, batch=1))
    shapes[impl] = jax.tree.map(lambda l: (l.shape, l.dtype),
                                variables)
  for impl in impls:
    assert shapes[impl] == shapes["lax"], impl


def _loss_and_grads(model, variables, x, train):
  y = jnp.arange(x.shape[0]) % 10

  def loss(params):
    v = {**variables, "params": params}
    if train and "batch_stats" in variables:
      logits, _ = model.apply(v, x, train=True, mutable=["batch_stats"])
    else:
      logits = model.apply(v, x, train=False)
    return optax.softmax_cross_entropy_with_integer_labels(
        logits, y).mean(), logits

  return jax.jit(jax.value_and_grad(loss, has_aux=True))(variables["params"])



@pytest.mark.parametrize("name,num_classes,out", [
    ("fedat_cnn", 10, (2, 10)), ("mnist_cnn", 10, (2, 10)),
    ("mnist_mlp", 10, (2, 10)), ("logreg", 2, (2, 2)),
    ("lstm_lm", 10_000, (2, 7, 10_000)), ("mlp", 10, (2, 10)),
    pytest.param("cifar_lenet", 10, (2, 10), marks=pytest.mark.slow),
    pytest.param("resnet20", 10, (2, 10), marks=pytest.mark.slow),
    pytest.param("leaf_cnn", 62, (2, 62), marks=pytest.mark.slow),
    pytest.param("resnet9", 10, (2, 10), marks=pytest.mark.slow)])
def test_output_shapes_and_deterministic_apply(name, num_classes, out):
  model = models.get(name, num_classes, kernels="patches")
  x = _sample(name)
  variables = _numpy_variables(model, x)
  apply = jax.jit(model.apply)
  y = apply(variables, x)
  assert y.shape == out and y.dtype == jnp.float32
  assert np.all(np.isfinite(y))
  np.testing.assert_array_equal(y, apply(variables, x))


@pytest.mark.parametrize("name", ["mlp"])
def test_init_is_a_function_of_the_key(name):
  model = models.get(name, 10)
  x = _sample(name)
  init = jax.jit(model.init)
  v1, v2, v3 = (init(jax.random.PRNGKey(k), x) for k in (3, 3, 4))
  jax.tree.map(np.testing.assert_array_equal, v1, v2)
  assert all(not np.array_equal(a, b) for a, b in zip(
      jax.tree.leaves(v1["params"]),
      jax.tree.leaves(v3["params"])) if np.any(a != 0))


@pytest.mark.parametrize("name,shape", [
    ("resnet18_gn", CIFAR), ("wrn28_10", CIFAR)])
@pytest.mark.slow
def test_output_shapes_of_big_models_abstractly(name, shape):
  model = models.get(name, 100)
  x = jax.ShapeDtypeStruct((2,) + shape, jnp.float32)
  variables = _abstract_init(model, x)
  out = jax.eval_shape(
      lambda v, x: model.apply(v, x, train=True, mutable=["batch_stats"],
                               rngs={"dropout": jax.random.PRNGKey(0)}),
      variables, x)
  assert out[0].shape == (2, 100)


def test_batchnorm_train_updates_running_stats_eval_uses_them():
  """Train mode normalises with batch statistics and updates the running ones
  with Keras momentum 0.99 (FedLAMA's reference code); eval mode uses the running ones.

  A narrow, shallow instance of the resnet20 class keeps the test fast.
  """
  model = resnet.ResNet20(10, widths=(4, 8), blocks=1)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 12, 12, 3)) * 2
                  + 0.5, jnp.float32)
  variables = _numpy_variables(model, x)
  with pytest.raises(Exception):  # batch_stats must be declared mutable.
    model.apply(variables, x, train=True)
  train_apply = jax.jit(functools.partial(model.apply, train=True,
                                          mutable=["batch_stats"]))
  eval_apply = jax.jit(model.apply)
  logits, updates = train_apply(variables, x)
  new = updates["batch_stats"]
  # The stem BN's new mean is 0.99 * 0 + 0.01 * the batch mean of the stem conv.
  stem = lax.conv_general_dilated(
      x, variables["params"]["Conv_0"]["kernel"], (1, 1), "SAME",
      dimension_numbers=("NHWC", "HWIO", "NHWC"))
  np.testing.assert_allclose(new["BatchNorm_0"]["mean"],
                             0.01 * stem.mean(axis=(0, 1, 2)), rtol=1e-4,
                             atol=1e-7)
  np.testing.assert_allclose(
      new["BatchNorm_0"]["var"], 0.99 + 0.01 * stem.var(axis=(0, 1, 2)),
      rtol=1e-4)
  eval_logits = eval_apply(variables, x)  # train=False: running stats.
  assert not np.allclose(eval_logits, logits)
  # Eval mode treats examples independently; train mode does not.
  other = x.at[1:].set(-x[1:])
  np.testing.assert_allclose(eval_apply(variables, other)[0], eval_logits[0],
                             rtol=1e-5, atol=1e-6)
  assert not np.allclose(train_apply(variables, other)[0][0], logits[0])


@pytest.mark.parametrize(
    "name", ["mnist_mlp", pytest.param("mnist_cnn", marks=pytest.mark.slow)])
def test_dropout_uses_the_dropout_rng_in_train_mode_only(name):
  model = models.get(name, 10)
  x = _sample(name, batch=4)
  variables = _numpy_variables(model, x)
  apply = jax.jit(functools.partial(model.apply, train=True))
  train = lambda k: apply(variables, x, rngs={"dropout": jax.random.PRNGKey(k)})
  np.testing.assert_array_equal(train(1), train(1))
  assert not np.allclose(train(1), train(2))
  assert not np.allclose(train(1), jax.jit(model.apply)(variables, x))
  with pytest.raises(Exception):  # No dropout rng in train mode.
    apply(variables, x)


def test_mnist_cnn_dropout_drops_whole_channels():
  """Channel dropout (the Fed-LAMB code's Dropout2d): a dropped feature map is zero everywhere."""
  model = models.get("mnist_cnn", 10)
  x = _sample("mnist_cnn", batch=2)
  variables = _numpy_variables(model, x)
  # The second conv's output, as the dropout layer sees it.
  _, state = jax.jit(functools.partial(
      model.apply, train=True, capture_intermediates=True,
      rngs={"dropout": jax.random.PRNGKey(0)}))(variables, x)
  inter = state["intermediates"]
  before = inter["Conv_1"]["__call__"][0]
  y = inter["Dropout_0"]["__call__"][0]
  np.testing.assert_allclose(y[y != 0], 2 * before[y != 0], rtol=1e-6)
  y = jnp.where(y != 0, 2.0, 0.0)
  per_map = y.reshape(2, 64, 20)
  dropped, kept = (per_map == 0).all(axis=1), (per_map == 2).all(axis=1)
  assert np.all(dropped | kept) and dropped.any() and kept.any()


def test_init_styles():
  shapes = ((3, 3, 32, 64), (1024, 64))

  def sample(key):
    out = {}
    for style in ("torch", "keras"):
      out[style] = []
      for shape in shapes:
        kernel_init, bias_init = init.initializers(style,
                                                     math.prod(shape[:-1]))
        out[style].append((kernel_init(key, shape),
                           bias_init(key, shape[-1:])))
    return out

  draws = jax.jit(sample)(jax.random.PRNGKey(0))
  for shape, (kernel, bias) in zip(shapes, draws["torch"]):
    # U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for kernels and biases alike.
    bound = 1 / math.sqrt(math.prod(shape[:-1]))
    assert np.abs(kernel).max() <= bound and np.abs(bias).max() <= bound
    assert np.abs(kernel).max() > 0.9 * bound and np.any(bias != 0)
  for shape, (kernel, bias) in zip(shapes, draws["keras"]):
    # Glorot-uniform, zero biases.
    fan_in, fan_out = math.prod(shape[:-1]), math.prod(shape[:-2]) * shape[-1]
    bound = math.sqrt(6 / (fan_in + fan_out))
    assert np.abs(kernel).max() <= bound and np.all(bias == 0)
    assert np.abs(kernel).max() > 0.9 * bound


@settings(max_examples=10, deadline=None)
@given(vocab=st.integers(1, 3000), classes=st.integers(1, 5))
def test_logreg_count_is_vocab_times_classes_plus_classes(vocab, classes):
  model = models.get("logreg", classes, vocab_size=vocab)
  p = _abstract_init(model, jnp.zeros((1, vocab)))["params"]
  assert _size(p) == vocab * classes + classes


def test_logreg_rejects_a_mismatched_vocabulary():
  model = models.get("logreg", 2, vocab_size=10)
  with pytest.raises(ValueError, match="vocab_size=10"):
    model.init(jax.random.PRNGKey(0), jnp.zeros((1, 11)))


def test_lstm_lm_rejects_float_input():
  with pytest.raises(ValueError, match="int tokens"):
    models.get("lstm_lm", 10_000).init(jax.random.PRNGKey(0),
                                       jnp.zeros((1, 5)))


def test_unknown_name_lists_known_models():
  with pytest.raises(ValueError, match="unknown model 'resnet21'.*resnet20"):
    models.get("resnet21", 10)


def test_unknown_or_bad_options_are_named():
  with pytest.raises(ValueError, match="unknown option.*widht.*accepted"):
    models.get("resnet20", 10, widht=3)
  with pytest.raises(ValueError, match="variant='wide'.*'reference'"):
    models.get("wrn28_10", 100, variant="wide")
  with pytest.raises(ValueError, match="variant.*'dawnbench'"):
    models.get("resnet9", 10, variant="resnet9")
  with pytest.raises(ValueError, match="kernels='cudnn'"):
    models.get("fedat_cnn", 10, kernels="cudnn")
  with pytest.raises(ValueError, match="init_style='he'"):
    models.get("cifar_cnn", 10, init_style="he")
  with pytest.raises(ValueError, match="num_classes"):
    models.get("fedat_cnn", 0)
  with pytest.raises(ValueError, match="dropout"):
    models.get("mnist_mlp", 10, dropout=1.5)


def test_every_model_accepts_kernels():
  for name in models.names():
    assert "kernels" in models.options(name)
    models.get(name, 10, kernels="auto")


def test_resolve_kernels():
  assert kernels_lib.resolve("auto", "cpu") == "patches"
  assert kernels_lib.resolve("auto", "gpu") == "patches"
  assert kernels_lib.resolve("auto", "tpu") == "lax"
  assert kernels_lib.resolve("auto") == (
      "lax" if jax.default_backend() == "tpu" else "patches")
  assert kernels_lib.resolve("lax") == "lax"
  with pytest.raises(ValueError, match="'auto'"):
    kernels_lib.resolve("fast")
