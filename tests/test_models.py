"""Tests of the model zoo (algorithms.md section 8) and the CPU conv plans.

Known answers are the spec's exact parameter counts; the "patches" plan is
checked against lax convolutions (outputs and gradients), and the engine shape
jit(vmap(scan)) with "patches" against a per-step loop with "lax".
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

from fedjax_lama import models
from fedjax_lama.models import layers
from fedjax_lama.models import resnet

CIFAR = (32, 32, 3)
MNIST = (28, 28, 1)

# name, num_classes, input shape, options, params, tensors, kernels
# (algorithms.md section 8 and the sections it points to).
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
         "logreg": (50,), "lstm_lm": (7,), "mlp": (8, 8, 1)}


def _sample(name, batch=2, seed=0):
  shape = INPUT.get(name, CIFAR)
  rng = np.random.default_rng(seed)
  if name == "lstm_lm":
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

  return jax.tree_util.tree_map_with_path(fill, _abstract_init(model, x))


def _size(tree):
  return sum(math.prod(l.shape) for l in jax.tree_util.tree_leaves(tree))


def _leaf_names(tree):
  return [path[-1].key for path, _ in
          jax.tree_util.tree_leaves_with_path(tree)]


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
  assert len(jax.tree_util.tree_leaves(p)) == tensors
  assert _leaf_names(p).count("kernel") == kernels
  floats, count = BATCH_STATS.get((name, opts.get("variant")), (0, 0))
  assert _size(variables.get("batch_stats", {})) == floats
  assert len(jax.tree_util.tree_leaves(variables.get("batch_stats", {}))) == (
      count)


def test_resnet20_kernel_shapes_match_spec_table():
  """algorithms.md 1.6.4: the HWIO kernel shapes and their multiplicities."""
  model = models.get("resnet20", 10)
  p = _abstract_init(model, jnp.zeros((1,) + CIFAR))["params"]
  shapes = sorted(tuple(l.shape) for path, l in
                  jax.tree_util.tree_leaves_with_path(p)
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
  for path, leaf in jax.tree_util.tree_leaves_with_path(p):
    key = path[-1].key
    assert key in ("kernel", "bias", "scale", "embedding"), path
    if leaf.ndim >= 2:
      assert key in ("kernel", "embedding"), path
    else:
      assert key != "kernel", path


@pytest.mark.parametrize("name", CONV_MODELS)
def test_conv_impls_share_the_parameter_tree(name):
  shapes = {}
  impls = (models.CONV_IMPLS if name in ("fedat_cnn", "resnet20")
           else ("lax", "patches"))
  for impl in impls:
    model = models.get(name, 10, conv_impl=impl)
    variables = _abstract_init(model, _sample(name, batch=1))
    shapes[impl] = jax.tree_util.tree_map(lambda l: (l.shape, l.dtype),
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


@pytest.mark.parametrize("name,with_grads", [
    ("fedat_cnn", False),
    pytest.param("fedat_cnn", True, marks=pytest.mark.slow),
    pytest.param("mnist_cnn", True, marks=pytest.mark.slow),
    pytest.param("resnet20", True, marks=pytest.mark.slow),
    pytest.param("leaf_cnn", False, marks=pytest.mark.slow),
    ("pfl_cnn", True),  # Winograd's F(4x4, 3x3) on its 28x28 32 -> 64 layer.
    pytest.param("resnet9", False, marks=pytest.mark.slow),
    pytest.param("resnet18_gn", False, marks=pytest.mark.slow),
    pytest.param("fedspeed_lenet", False, marks=pytest.mark.slow),
    ("mlp", True),  # `dense_dot`'s small-kernel gradient on CPU.
    ("mnist_mlp", True)])
def test_patches_matches_lax_outputs_and_gradients(name, with_grads):
  x = _sample(name, batch=3)
  ref_model = models.get(name, 10, conv_impl="lax")
  variables = _numpy_variables(ref_model, x)
  train = "batch_stats" in variables  # Batch statistics in the forward pass.
  (ref_loss, ref_logits), ref_grads = _loss_and_grads(ref_model, variables, x,
                                                      train)
  model = models.get(name, 10, conv_impl="patches")
  (loss, logits), grads = _loss_and_grads(model, variables, x, train)
  np.testing.assert_allclose(logits, ref_logits, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  if with_grads:
    for g, r in zip(jax.tree_util.tree_leaves(grads),
                    jax.tree_util.tree_leaves(ref_grads)):
      np.testing.assert_allclose(g, r, rtol=1e-3,
                                 atol=1e-4 * float(jnp.max(jnp.abs(r))) + 1e-6)


# (input HxW, cin, cout, kernel, strides, padding): the cases the zoo uses
# (SAME stride 2 pads (0, 1) like TF; PyTorch-style explicit padding; 1x1
# stride-2 projections; 7x7/2 stem) plus odd shapes.
CONV_CASES = [
    ((9, 10), 3, 4, (3, 3), (1, 1), "SAME"),
    ((9, 10), 2, 3, (3, 3), (2, 2), "SAME"),
    ((8, 8), 2, 3, (3, 3), (2, 2), ((1, 1), (1, 1))),
    ((9, 9), 3, 2, (1, 1), (2, 2), "VALID"),
    ((9, 9), 3, 2, (1, 1), (2, 2), "SAME"),
    ((11, 12), 1, 3, (5, 5), (1, 1), "VALID"),
    ((11, 12), 2, 2, (5, 5), (1, 1), "SAME"),
    ((13, 11), 3, 2, (7, 7), (2, 2), ((3, 3), (3, 3))),
    ((7, 8), 2, 2, (2, 3), (1, 2), ((0, 2), (1, 0))),
    # Tall maps with >= 8 input and <= 32 output channels take the row-shift
    # path of "patches".
    ((16, 10), 8, 4, (3, 3), (1, 1), "SAME"),
    ((18, 9), 8, 3, (3, 3), (1, 2), "VALID"),
    # 32 -> 64 channels: im2col on 10x10 outputs; on 20x21 Winograd's F(4x4, 3x3) on CPU
    # (tiles that overhang the map on both axes), the row shift elsewhere.
    ((10, 10), 32, 64, (3, 3), (1, 1), "SAME"),
    ((21, 20), 32, 64, (3, 3), (1, 1), ((0, 1), (2, 1))),
]
_ROW_SHIFT_CASES = [c for c in CONV_CASES if c[4][0] == 1]
_WINOGRAD_CASES = [c for c in CONV_CASES if c[3] in ((3, 3), (5, 5)) and c[4] == (1, 1)]


def _conv_case_args(case):
  hw, cin, cout, k, _, _ = case
  rng = np.random.default_rng(CONV_CASES.index(case))
  # Kernels scaled by 1/sqrt(fan-in) keep outputs O(1) for every channel count, so the
  # float32 rounding of sums over many channels stays within the tolerance.
  return (jnp.asarray(rng.normal(size=(2,) + hw + (cin,)), jnp.float32),
          jnp.asarray(rng.normal(size=k + (cin, cout)) / np.sqrt(k[0] * k[1] * cin),
                      jnp.float32))


def _conv_values_and_grads(impl, cases):
  """sin(conv).sum() of every case and its gradients, in one jit, one plan."""
  conv = {"row_shift": layers.row_shift_conv,
          "winograd2": functools.partial(layers.winograd_conv, tile=2),
          "channel_major": layers.channel_major_conv,
          "standard_layout": layers.standard_layout_conv}.get(
              impl, functools.partial(layers.conv, impl=impl))

  def loss(args):
    values = [jnp.sum(jnp.sin(conv(x, w, s, p)))
              for (x, w), (_, _, _, _, s, p) in zip(args, cases)]
    return sum(values), values

  (_, values), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(
      [_conv_case_args(c) for c in cases])
  return list(zip(values, grads))


def _assert_conv_plan_matches_lax(impl, cases, reference):
  missing = [c for c in cases if c not in reference]
  if missing:
    reference.update(zip(missing, _conv_values_and_grads("lax", missing)))
  got = _conv_values_and_grads(impl, cases)
  for case, (v, (gx, gw)) in zip(cases, got):
    rv, (rgx, rgw) = reference[case]
    np.testing.assert_allclose(v, rv, rtol=1e-4, atol=1e-4, err_msg=str(case))
    # Within 1e-4 of the largest entry: Winograd's rounding grows with the largest value
    # it sums (a kernel gradient of entries up to 30 is off by up to 3e-4 in its small ones).
    for g, r in ((gx, rgx), (gw, rgw)):
      np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(r).max())),
                                 err_msg=str(case))


@pytest.fixture(scope="module")
def lax_conv_reference():
  """case -> lax values and gradients, filled on demand (one jit per batch)."""
  return {}


# The 5x5 SAME and 7x7/2 cases compile slowly; they run with -m slow.
_FAST_CONV_CASES = [c for c in CONV_CASES if c[3][0] < 5 or c[5] == "VALID"]


@pytest.mark.parametrize("impl,cases", [
    ("patches", _FAST_CONV_CASES),
    pytest.param("patches", CONV_CASES, marks=pytest.mark.slow),
    # "patches" takes the channel-major path for 1 to 3 input channels, the
    # row-shift path for the two 8-channel cases, im2col and the standard layout
    # for the last two.
    ("im2col", _FAST_CONV_CASES),
    ("channel_major", _FAST_CONV_CASES),
    pytest.param("channel_major", CONV_CASES, marks=pytest.mark.slow),
    ("standard_layout", _FAST_CONV_CASES),
    pytest.param("standard_layout", CONV_CASES, marks=pytest.mark.slow),
    ("row_shift", [c for c in _ROW_SHIFT_CASES if c in _FAST_CONV_CASES]),
    pytest.param("row_shift", _ROW_SHIFT_CASES, marks=pytest.mark.slow),
    # Winograd on every 3x3 and 5x5 stride-1 case, "patches" on the others.
    ("winograd", _FAST_CONV_CASES),
    ("winograd2", [c for c in _WINOGRAD_CASES if c in _FAST_CONV_CASES]),
    # The benchmark-only plans, on the cheaper cases (compile time).
    pytest.param("patches_xla", CONV_CASES[:5] + CONV_CASES[-3:],
                 marks=pytest.mark.slow),
    pytest.param("shifted_sum", CONV_CASES[:5] + CONV_CASES[-3:],
                 marks=pytest.mark.slow)])
def test_conv_plans_equal_lax_conv(impl, cases, lax_conv_reference):
  """Every plan computes the same convolution, input and kernel gradients."""
  _assert_conv_plan_matches_lax(impl, cases, lax_conv_reference)


@pytest.mark.parametrize("window,ones", [((3, 3), False), ((5, 5), True), ((2, 3), False)])
def test_stride1_patches_gradient_is_a_numpy_col2im(window, ones):
  """im2col's stride-1 patches and their written-out gradient: each patch channel (i, j, c)
  of output pixel (h, w) is x[h + i, w + j, c], so dx[h', w', c] sums the cotangent over
  every (h, w, i, j) with h + i = h', w + j = w' (numpy loops here); the ones column of a
  folded bias gets no gradient. Under vmap too, and without autodiff's pads."""
  kh, kw = window
  rng = np.random.default_rng(kh)
  x = rng.normal(size=(2, 3, 7, 6, 4)).astype(np.float32)  # clients, batch, h, w, cin
  ho, wo = 7 - kh + 1, 6 - kw + 1
  dp = rng.normal(size=(2, 3, ho, wo, kh * kw * 4 + ones)).astype(np.float32)
  patches, vjp = jax.vjp(lambda x: layers._stride1_patches(x, window, ones), x[0])
  for i in range(kh):
    for j in range(kw):
      np.testing.assert_array_equal(patches[..., (i * kw + j) * 4:(i * kw + j + 1) * 4],
                                    x[0][:, i:i + ho, j:j + wo])
  if ones:
    np.testing.assert_array_equal(patches[..., -1], 1.0)
  expected = np.zeros_like(x)
  for i in range(kh):
    for j in range(kw):
      expected[:, :, i:i + ho, j:j + wo] += dp[..., (i * kw + j) * 4:(i * kw + j + 1) * 4]
  np.testing.assert_allclose(vjp(dp[0])[0], expected[0], rtol=1e-6, atol=1e-6)
  batched = jax.jit(jax.vmap(lambda x, dp: jax.vjp(
      lambda x: layers._stride1_patches(x, window, ones), x)[1](dp)[0]))(x, dp)
  np.testing.assert_allclose(batched, expected, rtol=1e-6, atol=1e-6)
  backward = str(jax.make_jaxpr(vjp)(dp[0]))
  assert "scatter-add" in backward and " pad[" not in backward  # in place, no pads


@pytest.mark.parametrize("strides,platform,written_out", [
    ((1, 1), "cpu", True), ((1, 1), "gpu", False), ((2, 2), "cpu", False)])
def test_im2col_takes_the_written_out_gradient_on_cpu_at_stride_1(strides, platform,
                                                                  written_out):
  """`_stride1_patches` only at stride 1 on CPU; a GPU keeps autodiff's gradient."""
  program = str(jax.make_jaxpr(jax.grad(lambda x: jnp.sum(layers.im2col_conv(
      x, jnp.ones((3, 3, 4, 2)), strides, "SAME", platform=platform))))(jnp.ones((1, 8, 8, 4))))
  assert ("scatter-add" in program) == written_out


@pytest.mark.parametrize("window,strides,padding", [
    ((2, 2), (2, 2), "VALID"), ((3, 3), (2, 2), ((1, 1), (1, 1))),
    ((3, 3), (1, 1), "SAME"), ((2, 2), (2, 2), "SAME")])
def test_max_pool_plans_agree(window, strides, padding):
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 9, 11, 3)),
                  jnp.float32)
  f = lambda impl: jax.jit(jax.value_and_grad(lambda x: jnp.sum(jnp.sin(
      layers.max_pool(x, window, strides, padding, impl)))))(x)
  (v, g), (rv, rg) = f("patches"), f("lax")
  np.testing.assert_allclose(v, rv, rtol=1e-6)
  np.testing.assert_allclose(g, rg, rtol=1e-6, atol=1e-7)


def _numpy_block_max_pool_grad(x, g, k):
  """d sum(g * pool(x)) / dx for non-overlapping k x k windows, ties sharing g equally."""
  out = np.zeros_like(x)
  n, h, w, c = x.shape
  for b in range(n):
    for i in range(h // k):
      for j in range(w // k):
        for ch in range(c):
          win = x[b, i * k:(i + 1) * k, j * k:(j + 1) * k, ch]
          hit = win == win.max()
          out[b, i * k:(i + 1) * k, j * k:(j + 1) * k, ch] = hit * g[b, i, j, ch] / hit.sum()
  return out


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("crop", [(0, 0), (1, 0), (1, 1), (0, 1)])
def test_block_max_pool_gradient_shares_ties_like_a_numpy_reference(k, crop):
  # Small integers: many windows hold several equal maxima (a zero-padded MNIST border's
  # conv outputs are equal like this), the case the custom VJP must get right. A crop
  # (rows or columns past the last whole window) takes the slices forward and gets a zero
  # gradient.
  rng = np.random.default_rng(1)
  x = rng.integers(0, 3, size=(2, 3 * k + crop[0], 2 * k + crop[1], 3)).astype(np.float32)
  g = rng.normal(size=(2, 3, 2, 3)).astype(np.float32)
  pooled, vjp = jax.vjp(lambda x: layers.max_pool(x, (k, k), impl="patches"), jnp.asarray(x))
  np.testing.assert_array_equal(
      pooled, x[:, :3 * k, :2 * k].reshape(2, 3, k, 2, k, 3).max(axis=(2, 4)))
  np.testing.assert_allclose(vjp(jnp.asarray(g))[0], _numpy_block_max_pool_grad(x, g, k),
                             rtol=1e-6)
  # Under vmap (several clients in one call) and jit, the same numbers.
  batched = jax.jit(jax.vmap(lambda x, g: jax.vjp(
      lambda x: layers.max_pool(x, (k, k), impl="patches"), x)[1](g)[0]))
  np.testing.assert_allclose(batched(jnp.asarray(x)[:, None], jnp.asarray(g)[:, None])[:, 0],
                             _numpy_block_max_pool_grad(x, g, k), rtol=1e-6)


def test_vmapped_scan_with_patches_equals_per_step_loop_with_lax():
  """jit(vmap(scan)) under "patches" reproduces FedJAX's per-step loop."""
  clients, steps, batch, lr = 2, 3, 4, 0.05
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(clients, steps, batch) + CIFAR), jnp.float32)
  y = jnp.asarray(rng.integers(0, 10, size=(clients, steps, batch)))

  def sgd(model):
    def step(p, xy):
      g = jax.grad(lambda p: optax.softmax_cross_entropy_with_integer_labels(
          model.apply(p, xy[0]), xy[1]).mean())(p)
      return jax.tree_util.tree_map(lambda a, b: a - lr * b, p, g), None
    return step

  lax_model = models.get("fedat_cnn", 10, conv_impl="lax")
  params = _numpy_variables(lax_model, x[0, 0])
  step = jax.jit(lambda p, xb, yb: sgd(lax_model)(p, (xb, yb))[0])
  expected = []
  for c in range(clients):
    p = params
    for k in range(steps):
      p = step(p, x[c, k], y[c, k])
    expected.append(p)
  expected = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *expected)

  local = lambda p, xs, ys: lax.scan(
      sgd(models.get("fedat_cnn", 10, conv_impl="patches")), p, (xs, ys))[0]
  got = jax.jit(jax.vmap(local, in_axes=(None, 0, 0)))(params, x, y)
  for g, e in zip(jax.tree_util.tree_leaves(got),
                  jax.tree_util.tree_leaves(expected)):
    np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name,num_classes,out", [
    ("fedat_cnn", 10, (2, 10)), ("mnist_cnn", 10, (2, 10)),
    ("mnist_mlp", 10, (2, 10)), ("logreg", 2, (2, 2)),
    ("lstm_lm", 10_000, (2, 7, 10_000)), ("mlp", 10, (2, 10)),
    pytest.param("cifar_lenet", 10, (2, 10), marks=pytest.mark.slow),
    pytest.param("resnet20", 10, (2, 10), marks=pytest.mark.slow),
    pytest.param("leaf_cnn", 62, (2, 62), marks=pytest.mark.slow),
    pytest.param("resnet9", 10, (2, 10), marks=pytest.mark.slow)])
def test_output_shapes_and_deterministic_apply(name, num_classes, out):
  model = models.get(name, num_classes, conv_impl="patches")
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
  jax.tree_util.tree_map(np.testing.assert_array_equal, v1, v2)
  assert all(not np.array_equal(a, b) for a, b in zip(
      jax.tree_util.tree_leaves(v1["params"]),
      jax.tree_util.tree_leaves(v3["params"])) if np.any(a != 0))


@pytest.mark.parametrize("name,shape", [
    ("resnet18_gn", CIFAR), ("wrn28_10", CIFAR)])
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
  with Keras momentum 0.99 (1.6.4); eval mode uses the running ones.

  A narrow, shallow instance of the resnet20 class keeps the test fast.
  """
  model = resnet.ResNet20(10, widths=(4, 8), blocks=1, conv_impl="lax")
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
  """Channel dropout (4.5.3): a dropped feature map is zero everywhere."""
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
        kernel_init, bias_init = layers.initializers(style,
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
  with pytest.raises(ValueError, match="conv_impl='cudnn'"):
    models.get("fedat_cnn", 10, conv_impl="cudnn")
  with pytest.raises(ValueError, match="init_style='he'"):
    models.get("cifar_cnn", 10, init_style="he")
  with pytest.raises(ValueError, match="num_classes"):
    models.get("fedat_cnn", 0)
  with pytest.raises(ValueError, match="dropout"):
    models.get("mnist_mlp", 10, dropout=1.5)


def test_every_model_accepts_conv_impl():
  for name in models.names():
    assert "conv_impl" in models.options(name)
    models.get(name, 10, conv_impl="auto")


def test_resolve_conv_impl():
  assert models.resolve_conv_impl("auto", "cpu") == "patches"
  assert models.resolve_conv_impl("auto", "gpu") == "patches"
  assert models.resolve_conv_impl("auto", "tpu") == "lax"
  assert models.resolve_conv_impl("auto") == (
      "lax" if jax.default_backend() == "tpu" else "patches")
  assert models.resolve_conv_impl("lax") == "lax"
  with pytest.raises(ValueError, match="'auto'"):
    models.resolve_conv_impl("fast")


@pytest.mark.parametrize("impl", ["patches", "im2col", "lax"])
@pytest.mark.parametrize("cin,fold_k", [(3, (64, 1024)), (8, (64, 1024)), (8, (0, 72)),
                                         (3, (0, 10**9))])
def test_conv_bias_folded_into_the_matmul_or_added_gives_the_same_numbers(
    impl, cin, fold_k, monkeypatch):
  """A bias through `layers.conv` (folded into im2col's matmul as a ones column when the
  patch width is at most _FOLD_BIAS_MAX_K or at least _FOLD_BIAS_MIN_WIDE_K: 3x3x3 = 27
  and 3x3x8 = 72 are folded in the first and third case, added after the matmul in the
  second and fourth) equals the convolution plus the bias, and its gradient is the output
  gradient summed over examples and positions (numpy)."""
  monkeypatch.setattr(layers, "_FOLD_BIAS_MAX_K", fold_k[0])
  monkeypatch.setattr(layers, "_FOLD_BIAS_MIN_WIDE_K", fold_k[1])
  rng = np.random.default_rng(cin)
  x = jnp.asarray(rng.normal(size=(2, 7, 6, cin)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(3, 3, cin, 16)) / np.sqrt(9 * cin), jnp.float32)
  b = jnp.asarray(rng.normal(size=(16,)), jnp.float32)
  g = rng.normal(size=(2, 5, 4, 16)).astype(np.float32)
  y, vjp = jax.vjp(lambda x, w, b: layers.conv(x, w, (1, 1), "VALID", impl=impl, bias=b),
                   x, w, b)
  plain, plain_vjp = jax.vjp(lambda x, w: layers.conv(x, w, (1, 1), "VALID", impl="lax"), x, w)
  np.testing.assert_allclose(y, np.asarray(plain) + np.asarray(b), rtol=1e-5, atol=1e-5)
  gx, gw, gb = vjp(jnp.asarray(g))
  for got, ref in zip((gx, gw), plain_vjp(jnp.asarray(g))):
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(gb, g.sum(axis=(0, 1, 2)), rtol=1e-5, atol=1e-5)


def test_conv_patches_orders_patch_channels_as_hwio():
  """Known answer: a 2x2 kernel with one non-zero tap selects that shift."""
  x = jnp.arange(1 * 3 * 3 * 2, dtype=jnp.float32).reshape(1, 3, 3, 2)
  w = jnp.zeros((2, 2, 2, 1)).at[1, 0, 1, 0].set(1.0)  # tap (1, 0), channel 1
  for conv in (layers.im2col_conv, layers.row_shift_conv, layers.channel_major_conv):
    y = conv(x, w, (1, 1), "VALID")
    np.testing.assert_array_equal(y[0, :, :, 0], x[0, 1:, :2, 1])


def test_row_shift_conv_rejects_stride_along_h():
  with pytest.raises(ValueError, match="stride 1 along H"):
    layers.row_shift_conv(jnp.zeros((1, 8, 8, 2)), jnp.zeros((3, 3, 2, 2)),
                          (2, 1), "SAME")


@pytest.mark.parametrize("cin,window,cout,expected,size,platform", [
    (1, (5, 5), 10, "channel_major", 16, "cpu"), (3, (3, 3), 6, "channel_major", 16, "cpu"),
    (3, (3, 3), 16, "im2col", 16, "cpu"), (3, (1, 1), 6, "im2col", 16, "cpu"),
    (4, (3, 3), 8, "im2col", 16, "cpu"), (16, (3, 3), 8, "row_shift", 16, "cpu"),
    (32, (3, 3), 64, "winograd", 16, "cpu"), (128, (3, 3), 256, "winograd", 32, "cpu"),
    (32, (3, 3), 64, "row_shift", 16, "gpu"), (128, (3, 3), 256, "row_shift", 16, "gpu"),
    (16, (3, 3), 64, "row_shift", 16, "cpu"), (32, (3, 3), 32, "row_shift", 16, "cpu"),
    (32, (5, 5), 64, "winograd", 10, "cpu"), (32, (5, 5), 64, "row_shift", 16, "gpu"),
    (16, (5, 5), 64, "row_shift", 16, "cpu"), (32, (5, 5), 64, "im2col", 8, "cpu"),
    (32, (7, 7), 64, "row_shift", 16, "cpu"), (32, (1, 1), 64, "im2col", 16, "cpu"),
    (32, (3, 3), 64, "im2col", 14, "cpu"), (64, (3, 3), 64, "im2col", 8, "cpu")])
def test_patches_routes_layers_by_measured_rule(cin, window, cout, expected, size, platform,
                                                monkeypatch):
  """The "patches" plan's per-layer pick (layers.conv_patches) on a size x size map, SAME:
  channel-major patches for an image's 1 to 3 channels into at most 10; on CPU Winograd's
  F(4x4, 3x3) for 3x3 stride-1 layers with outputs of at least 16 x 16, 32 input and 64
  output channels, F(2x2, 5x5) for 5x5 ones from 10 x 10; row shifts for stride 1 along H
  on maps of at least 16 rows with several input channels; im2col otherwise; never the
  standard layout (measured slower on the project's Xeon box, docs/performance.md)."""
  called = []
  for name in ("channel_major", "im2col", "row_shift", "standard_layout", "winograd"):
    real = getattr(layers, f"{name}_conv")
    monkeypatch.setattr(layers, f"{name}_conv",
                        lambda *a, _n=name, _f=real: called.append(_n) or _f(*a))
  jax.eval_shape(lambda x, w: layers.conv_patches(x, w, (1, 1), "SAME", platform=platform),
                 jnp.zeros((1, size, size, cin)), jnp.zeros(window + (cin, cout)))
  assert called == [expected]


def test_patches_on_the_default_backend_takes_winograd_only_on_cpu(monkeypatch):
  """Without `platform`, the pick follows JAX's default backend when traced."""
  called = []
  real = layers.winograd_conv
  monkeypatch.setattr(layers, "winograd_conv", lambda *a: called.append(1) or real(*a))
  layers.conv(jnp.zeros((1, 16, 16, 32)), jnp.zeros((3, 3, 32, 64)), impl="patches")
  assert bool(called) == (jax.default_backend() == "cpu")


@pytest.mark.parametrize("impl,backend,takes_picks", [
    ("patches", "gpu", False), ("patches_cpu", "gpu", True), ("patches", "cpu", True),
    ("patches_cpu", "cpu", True), ("lax", "cpu", False)])
def test_patches_cpu_takes_the_cpu_only_picks_on_every_platform(impl, backend, takes_picks,
                                                                 monkeypatch):
  """The "patches_cpu" measurement plan takes each CPU-only pick of "patches" (a Winograd
  layer, im2col's written-out stride-1 gradient, a small kernel's gradient) by its CPU rule
  on any backend, so one A/B on a GPU measures them there; "patches" on a GPU takes none."""
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  called = []
  for name in ("winograd_conv", "_stride1_patches", "_small_kernel_dot"):
    real = getattr(layers, name)
    monkeypatch.setattr(layers, name, lambda *a, _n=name, _f=real: called.append(_n) or _f(*a))
  conv = lambda shape, cout: jax.eval_shape(
      lambda x: layers.conv(x, jnp.zeros((3, 3, shape[-1], cout)), impl=impl), jnp.zeros(shape))
  conv((1, 16, 16, 32), 64)  # wide enough for Winograd on CPU
  conv((1, 8, 8, 4), 8)  # im2col at stride 1
  jax.eval_shape(lambda x: layers.dense_dot(x, jnp.zeros((32, 10)), impl), jnp.zeros((4, 32)))
  assert called == (["winograd_conv", "_stride1_patches", "_small_kernel_dot"]
                    if takes_picks else [])


@pytest.mark.parametrize("name", ["fedat_cnn", "pfl_cnn", "mlp"])
def test_patches_cpu_on_cpu_is_the_patches_plan(name, monkeypatch):
  """On CPU "patches_cpu" traces to the very program of "patches" (a whole model's
  gradient), so its A/B against "patches" elsewhere isolates the CPU-only picks."""
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  programs = []
  for impl in ("patches", "patches_cpu"):
    model = models.get(name, 10, conv_impl=impl)
    x = _sample(name)
    params = model.init(jax.random.PRNGKey(0), x)
    programs.append(str(jax.make_jaxpr(jax.grad(
        lambda p: jnp.sum(model.apply(p, x))))(params)))
  assert programs[0] == programs[1]


def _numpy_conv(x, w, pads):
  """Direct NHWC x HWIO cross-correlation, stride 1, in float64."""
  x = np.pad(np.asarray(x, np.float64), ((0, 0), *pads, (0, 0)))
  kh, kw = w.shape[:2]
  ho, wo = x.shape[1] - kh + 1, x.shape[2] - kw + 1
  return sum(np.einsum("nhwc,cf->nhwf", x[:, i:i + ho, j:j + wo], np.asarray(w, np.float64)[i, j])
             for i in range(kh) for j in range(kw))


@pytest.mark.parametrize("tile,size", sorted(layers._WINOGRAD_TRANSFORMS))
def test_winograd_transforms_compute_a_1d_correlation(tile, size):
  """Known answer for the tables themselves (Lavin and Gray 2016, eq. 7):
  A^T [(G g) * (B^T d)] is the valid correlation of m + r - 1 inputs d with r taps g."""
  bt, g, at = (np.asarray(t, np.float64) for t in layers._WINOGRAD_TRANSFORMS[tile, size])
  rng = np.random.default_rng(tile)
  for _ in range(5):
    d, taps = rng.normal(size=tile + size - 1), rng.normal(size=size)
    expected = [d[i:i + size] @ taps for i in range(tile)]
    np.testing.assert_allclose(at @ ((g @ taps) * (bt @ d)), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("tile,size,rtol", [(2, 3, 2e-6), (4, 3, 2e-5), (2, 5, 2e-5)])
@pytest.mark.parametrize("hw,pads", [((8, 8), "SAME"), ((7, 9), ((0, 0), (0, 0))),
                                     ((5, 6), ((0, 1), (2, 1))), ((1, 1), "SAME")])
def test_winograd_conv_equals_a_numpy_convolution(tile, size, rtol, hw, pads):
  """Forward against a float64 numpy convolution (maps that are not whole tiles, one pixel,
  asymmetric padding); gradients against the lax plan's."""
  rng = np.random.default_rng(hw[0])
  pads = [(size // 2, size // 2)] * 2 if pads == "SAME" else pads
  x = jnp.asarray(rng.normal(size=(2,) + hw + (5,)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(size, size, 5, 7)) / np.sqrt(5 * size ** 2), jnp.float32)
  winograd = lambda x, w: layers.winograd_conv(x, w, (1, 1), pads, tile)
  # Jitted: one compilation costs less than dispatching the transforms' many ops eagerly.
  y = jax.jit(winograd)(x, w)
  expected = _numpy_conv(x, w, pads)
  scale = np.abs(expected).max()
  np.testing.assert_allclose(y, expected, rtol=0, atol=rtol * scale)
  grads = lambda conv: jax.jit(jax.grad(lambda x, w: jnp.sum(jnp.sin(conv(x, w))), (0, 1)))
  got = grads(winograd)(x, w)
  ref = grads(lambda x, w: layers.conv(x, w, (1, 1), pads, impl="lax"))(x, w)
  for a, b in zip(got, ref):
    np.testing.assert_allclose(a, b, rtol=0, atol=rtol * float(jnp.abs(b).max()))


def test_winograd_conv_under_vmap_equals_each_client_alone():
  """Several clients at once (vmap over inputs and kernels) as the engine runs them."""
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(3, 2, 9, 8, 4)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(3, 3, 3, 4, 6)) / 6, jnp.float32)
  loss = lambda x, w: jnp.sum(jnp.sin(layers.winograd_conv(x, w)))
  one_client = jax.value_and_grad(loss, (0, 1))
  batched = jax.jit(jax.vmap(one_client))(x, w)
  for c in range(3):
    alone = jax.jit(one_client)(x[c], w[c])
    for a, b in zip(jax.tree_util.tree_leaves(batched), jax.tree_util.tree_leaves(alone)):
      np.testing.assert_allclose(a[c], b, rtol=1e-5, atol=1e-5)


def test_winograd_conv_rejects_what_it_cannot_compute():
  for kernel, strides, tile in [((7, 7), (1, 1), None), ((3, 3), (2, 2), None),
                                ((3, 3), (1, 1), 3), ((5, 5), (1, 1), 4), ((3, 5), (1, 1), 2)]:
    with pytest.raises(ValueError, match=r"stride 1 and a \(tile, kernel size\) of \(2, 3\)"):
      layers.winograd_conv(jnp.zeros((1, 8, 8, 2)), jnp.zeros(kernel + (2, 2)), strides,
                           tile=tile)


def test_standard_layout_conv_under_vmap_equals_lax_and_uses_no_convolution():
  """Several clients at once (vmap over per-client inputs and kernels): the same values and
  gradients as lax, computed by the im2col fallback -- no (grouped) convolution in the
  program, which is what XLA:CPU runs slowly inside loops."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 2, 9, 8, 3)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(2, 3, 3, 3, 4)) / 5.0, jnp.float32)

  def loss(conv):
    return lambda x, w: jnp.sum(jnp.sin(conv(x, w, (1, 1), ((1, 1), (0, 2)))))

  per_client = lambda conv: jax.vmap(jax.value_and_grad(loss(conv), argnums=(0, 1)))
  (v, (gx, gw)) = jax.jit(per_client(layers.standard_layout_conv))(x, w)
  (rv, (rgx, rgw)) = jax.jit(per_client(functools.partial(layers.conv, impl="lax")))(x, w)
  for got, want in ((v, rv), (gx, rgx), (gw, rgw)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  program = str(jax.make_jaxpr(per_client(layers.standard_layout_conv))(x, w))
  assert "conv_general_dilated" not in program
  single = str(jax.make_jaxpr(jax.grad(loss(layers.standard_layout_conv), argnums=(0, 1)))(
      x[0], w[0]))
  assert single.count("conv_general_dilated") == 3  # forward, input and kernel gradients


@pytest.mark.parametrize("layout", ["_wide_kernel_dot", "_small_kernel_dot"])
def test_dense_layouts_equal_a_numpy_reference_with_gradients_and_under_vmap(layout,
                                                                            monkeypatch):
  """`dense_dot`'s CPU layouts (a large kernel on few rows; a small kernel's gradient): the
  values of x @ W and the gradients dy W^T and x^T dy, written here in numpy, alone and per
  client under vmap. The wide layout's threshold is lowered so a small kernel takes it."""
  if layout == "_wide_kernel_dot":
    monkeypatch.setattr(layers, "_DENSE_T_MIN_KERNEL", 1)
  called = []
  real = getattr(layers, layout)
  monkeypatch.setattr(layers, layout, lambda *a: called.append(1) or real(*a))
  rng = np.random.default_rng(0)
  x = rng.normal(size=(3, 2, 5, 7)).astype(np.float32)  # clients, batch..., in
  w = rng.normal(size=(3, 7, 4)).astype(np.float32)
  dy = rng.normal(size=(3, 2, 5, 4)).astype(np.float32)

  def value_and_grads(x, w, dy):
    y, vjp = jax.vjp(lambda x, w: layers.dense_dot(x, w, "patches"), x, w)
    return (y, *vjp(dy))

  program = str(jax.make_jaxpr(value_and_grads)(x[0], w[0], dy[0]))
  assert called and "optimization_barrier" in program  # the layout, not jnp.dot
  for got in (value_and_grads(x[0], w[0], dy[0]),
              [g[0] for g in jax.jit(jax.vmap(value_and_grads))(x, w, dy)]):
    y, gx, gw = got
    np.testing.assert_allclose(y, x[0] @ w[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gx, dy[0] @ w[0].T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw, x[0].reshape(-1, 7).T @ dy[0].reshape(-1, 4),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl,rows,kernel_in,expected", [
    ("patches", 32, 2048, True), ("patches", 33, 2048, False), ("patches", 32, 2047, False),
    ("lax", 32, 2048, False)])
def test_dense_dot_routes_by_measured_rule(impl, rows, kernel_in, expected, monkeypatch):
  """The layout of `_wide_kernel_dot` only under the CPU plan, for a kernel of at least
  4M elements on at most 32 rows (docs/performance.md); the lax plan is always jnp.dot."""
  called = []
  real = layers._wide_kernel_dot
  monkeypatch.setattr(layers, "_wide_kernel_dot", lambda *a: called.append(1) or real(*a))
  y = jax.eval_shape(lambda x, w: layers.dense_dot(x, w, impl),
                     jax.ShapeDtypeStruct((rows, kernel_in), jnp.float32),
                     jax.ShapeDtypeStruct((kernel_in, 2048), jnp.float32))
  assert y.shape == (rows, 2048)
  assert bool(called) == expected


@pytest.mark.parametrize("impl,kernel_in,platform,expected", [
    ("patches", 128, "cpu", True), ("patches", 129, "cpu", False),
    ("patches", 128, "gpu", False), ("lax", 128, "cpu", False)])
def test_dense_dot_takes_the_small_kernel_gradient_by_measured_rule(impl, kernel_in, platform,
                                                                    expected, monkeypatch):
  """`_small_kernel_dot` only under the patches plan on CPU, for a kernel of at most
  16,384 elements (here 128 x 128; docs/performance.md)."""
  called = []
  real = layers._small_kernel_dot
  monkeypatch.setattr(layers, "_small_kernel_dot", lambda *a: called.append(1) or real(*a))
  y = jax.eval_shape(lambda x, w: layers.dense_dot(x, w, impl, platform),
                     jax.ShapeDtypeStruct((4, 32, kernel_in), jnp.float32),
                     jax.ShapeDtypeStruct((kernel_in, 128), jnp.float32))
  assert y.shape == (4, 32, 128)
  assert bool(called) == expected


# Threefry-2x32 (20 rounds) known answers from Random123's kat_vectors, the test vectors of
# Salmon et al. 2011: (key, counter) -> output, each a pair of uint32 words.
THREEFRY_KNOWN_ANSWERS = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


@pytest.mark.parametrize("key, counter, expected", THREEFRY_KNOWN_ANSWERS)
def test_unrolled_threefry_gives_the_published_answers(key, counter, expected):
  u32 = lambda v: jnp.asarray(v, jnp.uint32)
  out = layers._threefry2x32(u32(key[0]), u32(key[1]), u32([counter[0]]), u32([counter[1]]))
  assert [int(w[0]) for w in out] == list(expected)


@pytest.fixture
def unrolled_from_any_size(monkeypatch):
  monkeypatch.setattr(layers, "_UNROLLED_BITS_MIN_SIZE", 1)


@pytest.mark.parametrize("shape", [(), (5,), (3, 7, 1, 2), (4, 32, 32, 16)])
@pytest.mark.parametrize("key", [jax.random.PRNGKey(0), jax.random.PRNGKey(2**31 + 5),
                                 jax.random.key(7)], ids=["raw0", "raw_big", "typed"])
def test_bernoulli_under_the_cpu_plan_gives_jaxs_values_without_its_rolled_loop(
    shape, key, unrolled_from_any_size):
  for p in (0.7, 0.5, 0.01):
    fast = layers.bernoulli(key, p, shape, "patches")
    assert fast.dtype == jnp.bool_ and fast.shape == shape
    np.testing.assert_array_equal(fast, jax.random.bernoulli(key, p, shape))
  # Under vmap over keys (clients) too.
  keys = jax.random.split(key, 3)
  np.testing.assert_array_equal(
      jax.vmap(lambda k: layers.bernoulli(k, 0.3, shape, "patches"))(keys),
      jax.vmap(lambda k: jax.random.bernoulli(k, 0.3, shape))(keys))
  # The CPU plan computes the bits itself; "lax" is JAX's own sampler.
  jaxpr = lambda impl: str(jax.make_jaxpr(lambda k: layers.bernoulli(k, 0.5, shape, impl))(key))
  assert "random_bits" not in jaxpr("patches")
  assert "random_bits" in jaxpr("lax")


def test_bernoulli_falls_back_to_jax_where_its_bits_differ(unrolled_from_any_size):
  rbg = jax.random.key(3, impl="rbg")
  np.testing.assert_array_equal(layers.bernoulli(rbg, 0.5, (64,), "patches"),
                                jax.random.bernoulli(rbg, 0.5, (64,)))
  assert "random_bits" in str(jax.make_jaxpr(
      lambda k: layers.bernoulli(k, 0.5, (64,), "patches"))(rbg))


def test_bernoulli_computes_its_own_bits_only_for_large_masks():
  uses_jax = lambda shape: "random_bits" in str(jax.make_jaxpr(
      lambda k: layers.bernoulli(k, 0.5, shape, "patches"))(jax.random.PRNGKey(0)))
  assert uses_jax((32, 50))  # mnist_cnn's dense mask: measured slower unrolled
  assert not uses_jax((32, 32, 32, 32))  # 1M values: faster unrolled
  np.testing.assert_array_equal(layers.bernoulli(jax.random.PRNGKey(4), 0.7, (32, 32, 32, 32),
                                                 "patches"),
                                jax.random.bernoulli(jax.random.PRNGKey(4), 0.7, (32, 32, 32, 32)))


@pytest.mark.parametrize("broadcast_dims", [(), (1, 2)])
def test_dropout_layer_masks_exactly_like_flax_dropout(broadcast_dims, unrolled_from_any_size):
  """The same name, so the same 'dropout' key, and the same mask bit for bit."""
  x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 6, 6, 8)), jnp.float32)

  def net(dropout):
    class Net(nn.Module):
      @nn.compact
      def __call__(self, x):
        x = nn.Dense(8)(x)
        return dropout(0.4, broadcast_dims=broadcast_dims)(x, deterministic=False)
    return Net()

  variables = net(nn.Dropout).init(jax.random.PRNGKey(0), x)
  rngs = {"dropout": jax.random.PRNGKey(11)}
  want = net(nn.Dropout).apply(variables, x, rngs=rngs)
  for impl in ("patches", "lax"):
    got = net(functools.partial(layers.Dropout, impl=impl)).apply(variables, x, rngs=rngs)
    np.testing.assert_array_equal(got, want)
  assert (want == 0).any() and (want != 0).any()
  deterministic = layers.Dropout(0.4, impl="patches").apply({}, x, deterministic=True)
  np.testing.assert_array_equal(deterministic, x)
