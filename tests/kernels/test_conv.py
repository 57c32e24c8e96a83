"""The convolution and pooling kernels against lax (values and both gradients), numpy
references of their written-out gradients, and the patches plan's per-layer rule."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lama import kernels
from fedjax_lama.kernels import conv
from fedjax_lama.kernels import pool
from fedjax_lama.kernels import winograd


def _conv(x, w, strides=(1, 1), padding="SAME", impl="lax", bias=None):
  """One layer under a kernel set, or under im2col alone (one of the patches plan's picks)."""
  if impl == "im2col":
    return conv.im2col_conv(x, w, tuple(strides), padding, bias)
  return kernels.get(impl).conv(x, w, tuple(strides), padding, bias)


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
  layer = {"row_shift": conv.row_shift_conv,
           "winograd": winograd.winograd_conv,
           "winograd2": functools.partial(winograd.winograd_conv, tile=2),
           "channel_major": conv.channel_major_conv}.get(
               impl, functools.partial(_conv, impl=impl))

  def loss(args):
    values = [jnp.sum(jnp.sin(layer(x, w, s, p)))
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
    # row-shift path for the 8-channel cases, Winograd (on CPU) or the row shift and
    # im2col for the last two; each pick is checked alone too.
    ("im2col", _FAST_CONV_CASES),
    ("channel_major", _FAST_CONV_CASES),
    pytest.param("channel_major", CONV_CASES, marks=pytest.mark.slow),
    ("row_shift", [c for c in _ROW_SHIFT_CASES if c in _FAST_CONV_CASES]),
    pytest.param("row_shift", _ROW_SHIFT_CASES, marks=pytest.mark.slow),
    ("winograd", [c for c in _WINOGRAD_CASES if c in _FAST_CONV_CASES]),
    pytest.param("winograd", _WINOGRAD_CASES, marks=pytest.mark.slow),
    ("winograd2", [c for c in _WINOGRAD_CASES if c in _FAST_CONV_CASES])])
def test_conv_plans_equal_lax_conv(impl, cases, lax_conv_reference):
  """The patches plan and each of its picks compute the same convolution, input and kernel gradients."""
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
  patches, vjp = jax.vjp(lambda x: conv._stride1_patches(x, window, ones), x[0])
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
      lambda x: conv._stride1_patches(x, window, ones), x)[1](dp)[0]))(x, dp)
  np.testing.assert_allclose(batched, expected, rtol=1e-6, atol=1e-6)
  backward = str(jax.make_jaxpr(vjp)(dp[0]))
  assert "scatter-add" in backward and " pad[" not in backward  # in place, no pads


@pytest.mark.parametrize("strides,platform,written_out", [
    ((1, 1), "cpu", True), ((1, 1), "gpu", False), ((2, 2), "cpu", False)])
def test_im2col_takes_the_written_out_gradient_on_cpu_at_stride_1(strides, platform,
                                                                  written_out):
  """`_stride1_patches` only at stride 1 on CPU; a GPU keeps autodiff's gradient."""
  program = str(jax.make_jaxpr(jax.grad(lambda x: jnp.sum(conv.im2col_conv(
      x, jnp.ones((3, 3, 4, 2)), strides, "SAME", platform=platform))))(jnp.ones((1, 8, 8, 4))))
  assert ("scatter-add" in program) == written_out


@pytest.mark.parametrize("window,strides,padding", [
    ((2, 2), (2, 2), "VALID"), ((3, 3), (2, 2), ((1, 1), (1, 1))),
    ((3, 3), (1, 1), "SAME"), ((2, 2), (2, 2), "SAME")])
def test_max_pool_plans_agree(window, strides, padding):
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 9, 11, 3)),
                  jnp.float32)
  f = lambda max_pool: jax.jit(jax.value_and_grad(lambda x: jnp.sum(jnp.sin(
      max_pool(x, window, strides, padding)))))(x)
  (v, g), (rv, rg) = f(pool.patches_max_pool), f(pool.lax_max_pool)
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
  pooled, vjp = jax.vjp(lambda x: pool.patches_max_pool(x, (k, k)), jnp.asarray(x))
  np.testing.assert_array_equal(
      pooled, x[:, :3 * k, :2 * k].reshape(2, 3, k, 2, k, 3).max(axis=(2, 4)))
  np.testing.assert_allclose(vjp(jnp.asarray(g))[0], _numpy_block_max_pool_grad(x, g, k),
                             rtol=1e-6)
  # Under vmap (several clients in one call) and jit, the same numbers.
  batched = jax.jit(jax.vmap(lambda x, g: jax.vjp(
      lambda x: pool.patches_max_pool(x, (k, k)), x)[1](g)[0]))
  np.testing.assert_allclose(batched(jnp.asarray(x)[:, None], jnp.asarray(g)[:, None])[:, 0],
                             _numpy_block_max_pool_grad(x, g, k), rtol=1e-6)



@pytest.mark.parametrize("impl", ["patches", "im2col", "lax"])
@pytest.mark.parametrize("cin,fold_k", [(3, (64, 1024)), (8, (64, 1024)), (8, (0, 72)),
                                         (3, (0, 10**9))])
def test_conv_bias_folded_into_the_matmul_or_added_gives_the_same_numbers(
    impl, cin, fold_k, monkeypatch):
  """A bias through a conv kernel (folded into im2col's matmul as a ones column when the
  patch width is at most _FOLD_BIAS_MAX_K or at least _FOLD_BIAS_MIN_WIDE_K: 3x3x3 = 27
  and 3x3x8 = 72 are folded in the first and third case, added after the matmul in the
  second and fourth) equals the convolution plus the bias, and its gradient is the output
  gradient summed over examples and positions (numpy)."""
  monkeypatch.setattr(conv, "_FOLD_BIAS_MAX_K", fold_k[0])
  monkeypatch.setattr(conv, "_FOLD_BIAS_MIN_WIDE_K", fold_k[1])
  rng = np.random.default_rng(cin)
  x = jnp.asarray(rng.normal(size=(2, 7, 6, cin)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(3, 3, cin, 16)) / np.sqrt(9 * cin), jnp.float32)
  b = jnp.asarray(rng.normal(size=(16,)), jnp.float32)
  g = rng.normal(size=(2, 5, 4, 16)).astype(np.float32)
  y, vjp = jax.vjp(lambda x, w, b: _conv(x, w, (1, 1), "VALID", impl=impl, bias=b),
                   x, w, b)
  plain, plain_vjp = jax.vjp(lambda x, w: _conv(x, w, (1, 1), "VALID", impl="lax"), x, w)
  np.testing.assert_allclose(y, np.asarray(plain) + np.asarray(b), rtol=1e-5, atol=1e-5)
  gx, gw, gb = vjp(jnp.asarray(g))
  for got, ref in zip((gx, gw), plain_vjp(jnp.asarray(g))):
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(gb, g.sum(axis=(0, 1, 2)), rtol=1e-5, atol=1e-5)


def test_conv_patches_orders_patch_channels_as_hwio():
  """Known answer: a 2x2 kernel with one non-zero tap selects that shift."""
  x = jnp.arange(1 * 3 * 3 * 2, dtype=jnp.float32).reshape(1, 3, 3, 2)
  w = jnp.zeros((2, 2, 2, 1)).at[1, 0, 1, 0].set(1.0)  # tap (1, 0), channel 1
  for layer in (conv.im2col_conv, conv.row_shift_conv, conv.channel_major_conv):
    y = layer(x, w, (1, 1), "VALID")
    np.testing.assert_array_equal(y[0, :, :, 0], x[0, 1:, :2, 1])


def test_row_shift_conv_rejects_stride_along_h():
  with pytest.raises(ValueError, match="stride 1 along H"):
    conv.row_shift_conv(jnp.zeros((1, 8, 8, 2)), jnp.zeros((3, 3, 2, 2)),
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
  """The "patches" plan's per-layer pick (conv.patches_conv) on a size x size map, SAME:
  channel-major patches for an image's 1 to 3 channels into at most 10; on CPU Winograd's
  F(4x4, 3x3) for 3x3 stride-1 layers with outputs of at least 16 x 16, 32 input and 64
  output channels, F(2x2, 5x5) for 5x5 ones from 10 x 10; row shifts for stride 1 along H
  on maps of at least 16 rows with several input channels; im2col otherwise."""
  called = []
  for name in ("channel_major", "im2col", "row_shift", "winograd"):
    module = winograd if name == "winograd" else conv
    real = getattr(module, f"{name}_conv")
    monkeypatch.setattr(module, f"{name}_conv",
                        lambda *a, _n=name, _f=real: called.append(_n) or _f(*a))
  jax.eval_shape(lambda x, w: conv.patches_conv(x, w, (1, 1), "SAME", platform=platform),
                 jnp.zeros((1, size, size, cin)), jnp.zeros(window + (cin, cout)))
  assert called == [expected]


def test_patches_on_the_default_backend_takes_winograd_only_on_cpu(monkeypatch):
  """Without `platform`, the pick follows JAX's default backend when traced."""
  called = []
  real = winograd.winograd_conv
  monkeypatch.setattr(winograd, "winograd_conv", lambda *a: called.append(1) or real(*a))
  _conv(jnp.zeros((1, 16, 16, 32)), jnp.zeros((3, 3, 32, 64)), impl="patches")
  assert bool(called) == (jax.default_backend() == "cpu")


def _numpy_conv(x, w, pads):
  """Direct NHWC x HWIO cross-correlation, stride 1, in float64."""
  x = np.pad(np.asarray(x, np.float64), ((0, 0), *pads, (0, 0)))
  kh, kw = w.shape[:2]
  ho, wo = x.shape[1] - kh + 1, x.shape[2] - kw + 1
  return sum(np.einsum("nhwc,cf->nhwf", x[:, i:i + ho, j:j + wo], np.asarray(w, np.float64)[i, j])
             for i in range(kh) for j in range(kw))


@pytest.mark.parametrize("tile,size", sorted(winograd._WINOGRAD_TRANSFORMS))
def test_winograd_transforms_compute_a_1d_correlation(tile, size):
  """Known answer for the tables themselves (Lavin and Gray 2016, eq. 7):
  A^T [(G g) * (B^T d)] is the valid correlation of m + r - 1 inputs d with r taps g."""
  bt, g, at = (np.asarray(t, np.float64) for t in winograd._WINOGRAD_TRANSFORMS[tile, size])
  rng = np.random.default_rng(tile)
  for _ in range(5):
    d, taps = rng.normal(size=tile + size - 1), rng.normal(size=size)
    expected = [d[i:i + size] @ taps for i in range(tile)]
    np.testing.assert_allclose(at @ ((g @ taps) * (bt @ d)), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("tile,size,rtol", [
    (2, 3, 2e-6), pytest.param(4, 3, 2e-5, marks=pytest.mark.slow),
    pytest.param(2, 5, 2e-5, marks=pytest.mark.slow)])
@pytest.mark.parametrize("hw,pads", [((8, 8), "SAME"), ((7, 9), ((0, 0), (0, 0))),
                                     ((5, 6), ((0, 1), (2, 1))), ((1, 1), "SAME")])
def test_winograd_conv_equals_a_numpy_convolution(tile, size, rtol, hw, pads):
  """Forward against a float64 numpy convolution (maps that are not whole tiles, one pixel,
  asymmetric padding); gradients against the lax plan's."""
  rng = np.random.default_rng(hw[0])
  pads = [(size // 2, size // 2)] * 2 if pads == "SAME" else pads
  x = jnp.asarray(rng.normal(size=(2,) + hw + (5,)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(size, size, 5, 7)) / np.sqrt(5 * size ** 2), jnp.float32)
  by_winograd = lambda x, w: winograd.winograd_conv(x, w, (1, 1), pads, tile)
  # Jitted: one compilation costs less than dispatching the transforms' many ops eagerly.
  y = jax.jit(by_winograd)(x, w)
  expected = _numpy_conv(x, w, pads)
  scale = np.abs(expected).max()
  np.testing.assert_allclose(y, expected, rtol=0, atol=rtol * scale)
  grads = lambda conv: jax.jit(jax.grad(lambda x, w: jnp.sum(jnp.sin(conv(x, w))), (0, 1)))
  got = grads(by_winograd)(x, w)
  ref = grads(lambda x, w: _conv(x, w, (1, 1), pads, impl="lax"))(x, w)
  for a, b in zip(got, ref):
    np.testing.assert_allclose(a, b, rtol=0, atol=rtol * float(jnp.abs(b).max()))


def test_winograd_conv_under_vmap_equals_each_client_alone():
  """Several clients at once (vmap over inputs and kernels) as the engine runs them."""
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(3, 2, 9, 8, 4)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(3, 3, 3, 4, 6)) / 6, jnp.float32)
  loss = lambda x, w: jnp.sum(jnp.sin(winograd.winograd_conv(x, w)))
  one_client = jax.value_and_grad(loss, (0, 1))
  batched = jax.jit(jax.vmap(one_client))(x, w)
  for c in range(3):
    alone = jax.jit(one_client)(x[c], w[c])
    for a, b in zip(jax.tree.leaves(batched), jax.tree.leaves(alone)):
      # Batched and single products sum in different orders; Winograd's transforms amplify
      # float32 rounding about tenfold, so the bound scales with the largest value.
      np.testing.assert_allclose(a[c], b, rtol=0, atol=2e-5 * float(jnp.abs(b).max()))


def test_winograd_conv_rejects_what_it_cannot_compute():
  for kernel, strides, tile in [((7, 7), (1, 1), None), ((3, 3), (2, 2), None),
                                ((3, 3), (1, 1), 3), ((5, 5), (1, 1), 4), ((3, 5), (1, 1), 2)]:
    with pytest.raises(ValueError, match=r"stride 1 and a \(tile, kernel size\) of \(2, 3\)"):
      winograd.winograd_conv(jnp.zeros((1, 8, 8, 2)), jnp.zeros(kernel + (2, 2)), strides,
                           tile=tile)


