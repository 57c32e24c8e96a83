"""Polyline codec of FedAT (Chai et al., SC'21, Sec. 4.3): known answers, tolerance, fast path,
bytes.

Every expected string and value below is Google's worked example of the Encoded Polyline
Algorithm Format or was worked out by hand from its steps, never computed with the code
under test.
"""
import random
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lama.compression import polyline as pl
from fedjax_lama.compression.polyline import (decode_tree, encode_tree, polyline_decode,
                                              polyline_encode, polyline_roundtrip,
                                              roundtrip_tree, tree_message_bytes)

# Google's example, pairs mode, precision 5.
GOOGLE_POINTS = [(38.5, -120.2), (40.7, -120.95), (43.252, -126.453)]
GOOGLE_STRING = '_p~iF~ps|U_ulLnnqC_mqNvxq`@'

# Single values: (value, precision, value * 10^p in binary64, rounded n, encoded string, decoded
# value)
SINGLE_VALUES = [
    (0.0, 5, 0.0, 0, '?', 0.0),
    (-0.0, 5, -0.0, 0, '?', 0.0),
    (-179.9832104, 5, -17998321.04, -17998321, '`~oia@', -179.98321),
    (5e-05, 5, 5.0, 5, 'I', 5e-05),
    (-5e-05, 5, -5.0, -5, 'H', -5e-05),
    (4.9e-05, 5, 4.8999999999999995, 5, 'I', 5e-05),
    (0.00015, 5, 14.999999999999998, 15, ']', 0.00015),
    (-0.00015, 5, -14.999999999999998, -15, '\\', -0.00015),
    (0.00025, 5, 25.0, 25, 'q@', 0.00025),
    (0.015625, 5, 1562.5, 1563, 'u`B', 0.01563),
    (-0.015625, 5, -1562.5, -1563, 't`B', -0.01563),
    (0.03125, 5, 3125.0, 3125, 'ibE', 0.03125),
    (-0.03125, 5, -3125.0, -3125, 'hbE', -0.03125),
    (1.0, 5, 100000.0, 100000, '_ibE', 1.0),
    (-1.0, 5, -100000.0, -100000, '~hbE', -1.0),
    (0.0, 4, 0.0, 0, '?', 0.0),
    (-0.0, 4, -0.0, 0, '?', 0.0),
    (-179.9832104, 4, -1799832.1039999998, -1799832, 'nhzlB', -179.9832),
    (5e-05, 4, 0.5, 1, 'A', 0.0001),
    (-5e-05, 4, -0.5, -1, '@', -0.0001),
    (4.9e-05, 4, 0.49, 0, '?', 0.0),
    (0.00015, 4, 1.4999999999999998, 1, 'A', 0.0001),
    (-0.00015, 4, -1.4999999999999998, -1, '@', -0.0001),
    (0.00025, 4, 2.5, 3, 'E', 0.0003),
    (0.015625, 4, 156.25, 156, 'wH', 0.0156),
    (-0.015625, 4, -156.25, -156, 'vH', -0.0156),
    (0.03125, 4, 312.5, 313, 'qR', 0.0313),
    (-0.03125, 4, -312.5, -313, 'pR', -0.0313),
    (1.0, 4, 10000.0, 10000, '_pR', 1.0),
    (-1.0, 4, -10000.0, -10000, '~oR', -1.0),
]

# A precision-4 vector, flat mode.
VEC4 = [0.1234, -0.5678, 0.03125, -0.40625, 0.0, 1.5, -0.0001, 0.9999]
VEC4_STRING = 'clA~nLmuJnpG}|Foh\\ph\\_pR'
VEC4_DECODED = [0.1234, -0.5678, 0.0313, -0.4063, 0.0, 1.5, -0.0001, 0.9999]

# By hand: FedAT's CIFAR-10 CNN ("tf_tutorial"), Flax layouts (HWIO kernels, (in, out) dense).
CIFAR10_CNN_SHAPES = {
    "conv1": {"kernel": (3, 3, 3, 32), "bias": (32,)},
    "conv2": {"kernel": (3, 3, 32, 64), "bias": (64,)},
    "conv3": {"kernel": (3, 3, 64, 64), "bias": (64,)},
    "dense1": {"kernel": (4 * 4 * 64, 64), "bias": (64,)},
    "dense2": {"kernel": (64, 10), "bias": (10,)},
}
CIFAR10_CNN_PARAMS = 122_570
CIFAR10_CNN_METADATA_BYTES = 124


def tolerance(x, precision):
  """Error bound on |x - x_hat| for the float64 result."""
  return 0.5 * 10.0 ** -precision + 8 * 2.0 ** -53 * np.maximum(1.0, np.abs(x))


# --- Google's example -----------------------------------------------------------------------------


def test_google_example_pairs():
  assert polyline_encode(GOOGLE_POINTS, 5, mode="pairs") == GOOGLE_STRING
  decoded = polyline_decode(GOOGLE_STRING, 5, mode="pairs")
  assert decoded.dtype == np.float64 and decoded.shape == (3, 2)
  assert decoded.tolist() == [list(p) for p in GOOGLE_POINTS]  # exact floats
  assert polyline_encode(np.asarray(GOOGLE_POINTS), 5, mode="pairs") == GOOGLE_STRING


def test_package_decode_example():
  assert polyline_decode('u{~vFvyys@fS]', 5, mode="pairs").tolist() == [
      [40.63179, -8.65708], [40.62855, -8.65693]]


def test_google_points_other_precisions():
  assert polyline_encode(GOOGLE_POINTS, 4, mode="pairs") == 'o}nV~sjhA_~i@vsM_zp@jnjB'
  assert polyline_encode(GOOGLE_POINTS, 6, mode="pairs") == '_izlhA~rlgdF_{geC~ywl@_kwzCn`{nI'


def test_flat_differs_from_pairs():
  interleaved = [38.5, -120.2, 40.7, -120.95, 43.252, -126.453]
  assert polyline_encode(interleaved, 5) == '_p~iF~asg]_x`u]ngsy]ouei^foxj_@'
  assert polyline_encode(interleaved, 5, mode="flat") != GOOGLE_STRING
  # "pairs mode is flat coding with a delta stride of 2": same shape of input either way.
  assert polyline_encode(np.reshape(interleaved, (3, 2)), 5, mode="pairs") == GOOGLE_STRING


# --- single values --------------------------------------------------------------------------------


@pytest.mark.parametrize("value,precision,scaled,rounded,encoded,decoded", SINGLE_VALUES)
def test_single_values(value, precision, scaled, rounded, encoded, decoded):
  # The binary64 product the rounding sees (a property of IEEE arithmetic the table relies on).
  assert value * 10.0 ** precision == scaled
  assert polyline_encode([value], precision) == encoded
  out = polyline_decode(encoded, precision)
  assert out.tolist() == [decoded]
  if decoded == 0.0:
    assert not np.signbit(out[0])  # -0.0 decodes to +0.0
  # The decoded value is the rounded integer over 10^p (a float64 division).
  assert decoded == rounded / 10.0 ** precision
  fast, num_chars = polyline_roundtrip([value], precision)
  assert fast.tolist() == [decoded] and num_chars == len(encoded)
  # A one-value flat string equals the first coordinate of a pairs string.
  assert polyline_encode([(value, 0.0)], precision, mode="pairs") == encoded + '?'


# --- a vector ------------------------------------------------------------------------------------


def test_precision4_vector():
  assert polyline_encode(VEC4, 4) == VEC4_STRING
  assert len(VEC4_STRING) == 24
  assert polyline_decode(VEC4_STRING, 4).tolist() == VEC4_DECODED
  assert polyline_encode(np.asarray(VEC4, np.float32), 4) == VEC4_STRING
  assert polyline_encode(jnp.asarray(VEC4, jnp.float32), 4) == VEC4_STRING
  # Flat mode flattens any shape in C order.
  assert polyline_encode(np.reshape(VEC4, (2, 4)), 4) == VEC4_STRING
  assert polyline_encode(np.asfortranarray(np.reshape(VEC4, (2, 2, 2))), 4) == VEC4_STRING
  fast, num_chars = polyline_roundtrip(np.reshape(VEC4, (4, 2)), 4)
  assert fast.shape == (4, 2) and fast.ravel().tolist() == VEC4_DECODED and num_chars == 24


def test_precision4_vector_characters_per_value():
  """The vector's table: each value's characters, delta by delta."""
  characters = ['clA', '~nL', 'muJ', 'npG', '}|F', 'oh\\', 'ph\\', '_pR']
  assert ''.join(characters) == VEC4_STRING
  # The first value alone is its own delta against 0.
  assert polyline_encode(VEC4[:1], 4) == characters[0]
  for i in range(1, len(VEC4) + 1):
    assert polyline_encode(VEC4[:i], 4) == ''.join(characters[:i])


# --- errors and edge cases ------------------------------------------------------------------


def test_empty():
  assert polyline_encode([], 4) == ''
  assert len(polyline_decode('', 4)) == 0
  assert polyline_decode('', 4).dtype == np.float64
  assert polyline_encode([], 5, mode="pairs") == ''
  assert polyline_decode('', 5, mode="pairs").shape == (0, 2)
  fast, num_chars = polyline_roundtrip(np.zeros((0, 3)), 4)
  assert fast.shape == (0, 3) and num_chars == 0


@pytest.mark.parametrize("text", ['_', '{', '??_', '_pR_'])
def test_truncated_raises(text):
  with pytest.raises(ValueError, match="truncated"):
    polyline_decode(text, 5)


@pytest.mark.parametrize("text", [' ', '??? ', '?>', '?\x7f', '?é', '\n'])
def test_invalid_character_raises(text):
  with pytest.raises(ValueError, match=r"invalid character.*accepted: '\?' \(63\) to '~' \(126\)"):
    polyline_decode(text, 5)


def test_odd_count_in_pairs_mode_raises():
  with pytest.raises(ValueError, match="even number"):
    polyline_decode('???', 5, mode="pairs")


@pytest.mark.parametrize("bad", [float('nan'), float('inf'), -float('inf')])
def test_non_finite_raises(bad):
  with pytest.raises(ValueError, match="finite"):
    polyline_encode([bad], 4)
  with pytest.raises(ValueError, match="finite"):
    polyline_encode([0.5, bad], 4, mode="flat")
  with pytest.raises(ValueError, match="finite"):
    polyline_roundtrip(np.asarray([bad], np.float32), 4)
  with pytest.raises(ValueError, match="finite"):
    tree_message_bytes({"w": np.asarray([bad])}, 4)


def test_scaled_magnitude_limit():
  """|s| >= 2^52 raises; the largest integer below it round-trips exactly."""
  largest = 2.0 ** 52 - 1
  for value in (largest, -largest):
    assert polyline_decode(polyline_encode([value], 0), 0).tolist() == [value]
  assert polyline_decode(polyline_encode([largest, -largest], 0), 0).tolist() == [largest, -largest]
  for value, precision in [(2.0 ** 52, 0), (-2.0 ** 52, 0), (2.0 ** 52 / 1e4, 4), (1e12, 4)]:
    with pytest.raises(ValueError, match="2\\^52"):
      polyline_encode([value], precision)


def test_decoder_refuses_what_the_encoder_cannot_produce():
  # 12 characters: more than the 11 that integers below 2^52 can need.
  with pytest.raises(ValueError, match="at most 11"):
    polyline_decode('~' * 11 + '?', 0)
  # Two maximal positive deltas sum past 2^52.
  text = polyline_encode([2.0 ** 52 - 1], 0)
  with pytest.raises(ValueError, match="2\\^52"):
    polyline_decode(text + text, 0)


@pytest.mark.parametrize("precision", [-1, 4.0, 4.5, "4", None, True, 23])
def test_bad_precision_raises(precision):
  with pytest.raises(ValueError, match="precision"):
    polyline_encode([0.5], precision)
  with pytest.raises(ValueError, match="precision"):
    polyline_decode('?', precision)
  with pytest.raises(ValueError, match="precision"):
    polyline_roundtrip([0.5], precision)


def test_numpy_integer_precision_accepted():
  assert polyline_encode([1.0], np.int64(4)) == '_pR'


def test_bad_mode_and_inputs_raise():
  with pytest.raises(ValueError, match="'flat', 'pairs'"):
    polyline_encode([0.5], 4, mode="pair")
  with pytest.raises(ValueError, match="'flat', 'pairs'"):
    polyline_decode('?', 4, mode="xy")
  with pytest.raises(ValueError, match=r"\(n, 2\)"):
    polyline_encode([(1.0, 2.0, 3.0)], 5, mode="pairs")
  with pytest.raises(ValueError, match=r"\(n, 2\)"):
    polyline_encode([1.0, 2.0], 5, mode="pairs")
  with pytest.raises(ValueError, match="rectangular"):
    polyline_encode([[1.0], [2.0, 3.0]], 5)
  with pytest.raises(ValueError, match="real"):
    polyline_encode([1 + 2j], 5)
  with pytest.raises(ValueError, match="real"):
    polyline_encode(["1.0"], 5)
  with pytest.raises(ValueError, match="str"):
    polyline_decode(123, 5)


# --- round-trip tolerance -------------------------------------------------------------------------


def _random_values(rng, size):
  return np.concatenate([
      rng.normal(0.0, 0.05, size),                      # weight-like
      rng.uniform(-200.0, 200.0, size),                 # map-like
      rng.integers(-4096, 4097, size) / 64.0,           # exact binary ties
      rng.normal(0.0, 1e-5, size),                      # below the resolution
  ])


@pytest.mark.parametrize("precision", [0, 1, 2, 3, 4, 5, 6, 7])
def test_round_trip_tolerance(precision):
  rng = np.random.default_rng(precision)
  for dtype in (np.float64, np.float32):
    values = _random_values(rng, 5000).astype(dtype)
    x = values.astype(np.float64)  # float32 widens exactly
    x_hat = polyline_decode(polyline_encode(values, precision), precision)
    assert np.all(np.abs(x - x_hat) <= tolerance(x, precision))
    x_hat32 = x_hat.astype(np.float32).astype(np.float64)
    assert np.all(np.abs(x - x_hat32) <= tolerance(x, precision) + 2.0 ** -24 * np.abs(x_hat32))


def test_round_trip_exceeds_exact_bound_by_ulps():
  """Tolerance: x = 0.00035 at p = 4 exceeds 0.5e-4 by about 2e-20."""
  x = 0.00035
  x_hat = polyline_decode(polyline_encode([x], 4), 4)[0]
  excess = abs(x - x_hat) - 0.5e-4
  assert 0 < excess < 1e-19
  assert abs(x - x_hat) <= tolerance(x, 4)


# --- against the `polyline` package ---------------------------------------------------------------


@pytest.mark.slow
def test_cross_check_with_polyline_package():
  polyline = pytest.importorskip("polyline")
  rng = random.Random(20240601)
  for _ in range(20000):
    p = rng.choice([1, 2, 3, 4, 5, 6, 7])
    n = rng.randint(1, 12)
    u = rng.random()
    pts = [((rng.uniform(-90, 90), rng.uniform(-180, 180)) if u < 0.4 else
            (rng.gauss(0, 0.05), rng.gauss(0, 0.05)) if u < 0.7 else
            (rng.randint(-4096, 4096) / 64, rng.randint(-4096, 4096) / 32))
           for _ in range(n)]
    s = polyline_encode(pts, p, mode="pairs")
    assert s == polyline.encode(pts, p)
    assert [tuple(r) for r in polyline_decode(s, p, mode="pairs")] == polyline.decode(s, p)


# --- fast path -----------------------------------------------------------------------------


def _random_model(rng, dtype):
  """A small model-like pytree: conv and dense kernels, biases, a scalar, an empty leaf."""
  def glorot(shape, fan_in, fan_out):
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, shape).astype(dtype)
  return {
      "conv": {"kernel": glorot((3, 3, 3, 8), 27, 72), "bias": rng.normal(0, 0.1, 8).astype(dtype)},
      "dense": [glorot((200, 10), 200, 10), (rng.normal(0, 3.0, 10) * 50).astype(dtype)],
      "scale": np.asarray(rng.normal(), dtype),
      "empty": np.zeros((0, 4), dtype),
      "ties": (rng.integers(-4096, 4097, (16, 4)) / 64.0).astype(dtype),
  }


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("precision", [1, 2, 3, 4, 5, 6, 7])
def test_fast_path_equals_codec_on_random_trees(dtype, precision):
  rng = np.random.default_rng(1000 * precision + (dtype == np.float32))
  tree = _random_model(rng, dtype)
  leaves = _leaves(tree)
  expected_bytes = 0
  for leaf in leaves:
    text = polyline_encode(leaf, precision)
    decoded = polyline_decode(text, precision)
    fast, num_chars = polyline_roundtrip(leaf, precision)
    assert fast.shape == leaf.shape and fast.dtype == np.float64
    assert np.array_equal(fast.ravel(), decoded)  # exactly, not merely close
    assert num_chars == len(text)
    expected_bytes += len(text) + 4 * (1 + leaf.ndim)
  # Pairs mode too (delta stride 2).
  points = tree["dense"][0].reshape(-1, 2)
  text = polyline_encode(points, precision, mode="pairs")
  fast, num_chars = polyline_roundtrip(points, precision, mode="pairs")
  assert np.array_equal(fast, polyline_decode(text, precision, mode="pairs"))
  assert num_chars == len(text)

  message, num_bytes = encode_tree(tree, precision)
  assert message.payload == ''.join(polyline_encode(leaf, precision) for leaf in leaves)
  assert num_bytes == message.num_bytes == expected_bytes
  decoded_tree = decode_tree(message, tree)
  fast_tree, fast_bytes = roundtrip_tree(tree, precision)
  assert fast_bytes == expected_bytes
  assert tree_message_bytes(tree, precision) == expected_bytes
  for got, fast_leaf, leaf in zip(_leaves(decoded_tree), _leaves(fast_tree), leaves):
    assert got.dtype == leaf.dtype and fast_leaf.dtype == leaf.dtype
    assert got.shape == leaf.shape
    assert np.array_equal(got, fast_leaf)
    x_hat = polyline_decode(polyline_encode(leaf, precision), precision).astype(leaf.dtype)
    assert np.array_equal(got.ravel(), x_hat)


def _leaves(tree):
  """The leaves of a `_random_model` tree in jax.tree.leaves order (sorted keys), by hand."""
  return [tree["conv"]["bias"], tree["conv"]["kernel"], tree["dense"][0], tree["dense"][1],
          tree["empty"], tree["scale"], tree["ties"]]


def test_fast_path_accepts_jax_leaves():
  rng = np.random.default_rng(7)
  host = {"a": rng.normal(0, 0.05, (5, 7)).astype(np.float32), "b": np.float32(0.25)}
  device = {"a": jnp.asarray(host["a"]), "b": jnp.asarray(host["b"])}
  tree_hat, num_bytes = roundtrip_tree(device, 4)
  host_hat, host_bytes = roundtrip_tree(host, 4)
  assert num_bytes == host_bytes == encode_tree(host, 4)[1]
  assert np.array_equal(tree_hat["a"], host_hat["a"]) and tree_hat["a"].dtype == np.float32


# --- marshalling and byte accounting------------------------------------------------


def test_tree_message_literal():
  """Leaves in jax.tree.leaves order (sorted dict keys), C order, delta restarting per leaf.

  With the single-value strings at p = 4: 1.0 -> '_pR', -1.0 -> '~oR', and a zero delta -> '?'.
  """
  tree = {"w": np.array([[1.0, 1.0], [0.0, -1.0]], np.float32), "b": np.array([1.0], np.float32)}
  message, num_bytes = encode_tree(tree, 4)
  # b = [1]: '_pR'. w = [1, 1, 0, -1]: deltas 1, 0, -1, -1 (x 10^4). A delta carried over from b
  # would have turned w's first '_pR' into '?'.
  assert message.payload == '_pR' + '_pR?~oR~oR'
  assert message.shapes == ((1,), (2, 2))
  assert num_bytes == 13 + 4 * (1 + 1) + 4 * (1 + 2) == 33
  assert tree_message_bytes(tree, 4) == 33
  # Fortran-ordered storage does not change the C-order flattening.
  assert encode_tree({"w": np.asfortranarray(tree["w"]), "b": tree["b"]}, 4)[0] == message
  decoded = decode_tree(message, tree)
  assert decoded["w"].tolist() == [[1.0, 1.0], [0.0, -1.0]] and decoded["w"].dtype == np.float32
  assert decoded["b"].tolist() == [1.0]


def test_cifar10_cnn_bytes():
  """Metadata 124 bytes for FedAT's CIFAR-10 CNN; raw float32 = 4 bytes per parameter."""
  tree = {layer: {name: np.zeros(shape, np.float32) for name, shape in params.items()}
          for layer, params in CIFAR10_CNN_SHAPES.items()}
  assert sum(leaf.size for layer in tree.values() for leaf in layer.values()) == CIFAR10_CNN_PARAMS
  # All-zero weights: every value is one '?' character.
  for precision in (3, 4, 6):
    assert tree_message_bytes(tree, precision) == CIFAR10_CNN_PARAMS + CIFAR10_CNN_METADATA_BYTES
    assert roundtrip_tree(tree, precision)[1] == 122_694
  message, num_bytes = encode_tree(tree, 4)
  assert num_bytes == 122_694 and message.payload == '?' * CIFAR10_CNN_PARAMS
  assert tree_message_bytes(tree, None) == 4 * CIFAR10_CNN_PARAMS == 490_280
  assert roundtrip_tree(tree, None)[1] == 490_280
  assert encode_tree(tree, None)[1] == 490_280


def test_cifar10_cnn_glorot_characters_per_parameter():
  """Sanity figure: about 1.8, 2.4 and 3.8 characters per parameter at p = 3, 4, 6."""
  rng = np.random.default_rng(0)
  tree = {}
  for layer, params in CIFAR10_CNN_SHAPES.items():
    kernel = params["kernel"]
    fan_in, fan_out = int(np.prod(kernel[:-1])), kernel[-1]
    if len(kernel) == 4:  # receptive field counts in both fans (Keras' Glorot)
      fan_out *= kernel[0] * kernel[1]
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    tree[layer] = {"kernel": rng.uniform(-limit, limit, kernel).astype(np.float32),
                   "bias": np.zeros(params["bias"], np.float32)}
  for precision, per_parameter in [(3, 1.8), (4, 2.4), (6, 3.8)]:
    chars = tree_message_bytes(tree, precision) - CIFAR10_CNN_METADATA_BYTES
    assert abs(chars / CIFAR10_CNN_PARAMS - per_parameter) < 0.06


def test_raw_float32_message_round_trip():
  tree = {"a": np.array([0.1, -2.5], np.float64), "b": np.array([[1.5]], np.float32)}
  message, num_bytes = encode_tree(tree, None)
  assert num_bytes == 12 and message.precision is None
  decoded = decode_tree(message, tree)
  assert decoded["a"].dtype == np.float64
  assert decoded["a"].tolist() == [float(np.float32(0.1)), -2.5]  # raw float32 on the wire
  fast, fast_bytes = roundtrip_tree(tree, None)
  assert fast_bytes == 12 and np.array_equal(fast["a"], decoded["a"])


def test_decode_tree_rejects_mismatches():
  tree = {"a": np.zeros((2, 3), np.float32)}
  message, _ = encode_tree(tree, 4)
  with pytest.raises(ValueError, match="shapes"):
    decode_tree(message, {"a": np.zeros((3, 2), np.float32)})
  with pytest.raises(ValueError, match="shapes"):
    decode_tree(message, {"a": np.zeros((2, 3)), "b": np.zeros(1)})
  with pytest.raises(ValueError, match="holds 5 values"):
    decode_tree(message._replace(payload='?????'), tree)


# --- vectorisation (no wall-clock) -----------------------------------------------------------


def _lines_executed_in_module(fn):
  """Number of Python lines of the polyline module executed while fn() runs."""
  count = 0
  module_file = pl.__file__

  def tracer(frame, event, arg):
    nonlocal count
    if frame.f_code.co_filename != module_file:
      return None
    if event == "line":
      count += 1
    return tracer

  sys.settrace(tracer)
  try:
    fn()
  finally:
    sys.settrace(None)
  return count


def test_work_in_python_does_not_grow_with_input_size():
  """A loop per value or per character would execute more Python lines for more values.

  VEC4 repeated keeps the same widest value (3 characters), so the per-chunk-position loops run
  the same number of times for 8 and for 200,000 values.
  """
  small = np.asarray(VEC4)
  large = np.tile(small, 25_000)
  small_text, large_text = polyline_encode(small, 4), polyline_encode(large, 4)
  small_tree = {"a": small.reshape(2, 4), "b": small}
  large_tree = {"a": large.reshape(-1, 4), "b": large}
  for fn in (lambda v, t, tree: polyline_encode(v, 4),
             lambda v, t, tree: polyline_decode(t, 4),
             lambda v, t, tree: polyline_roundtrip(v, 4),
             lambda v, t, tree: decode_tree(encode_tree(tree, 4)[0], tree),
             lambda v, t, tree: roundtrip_tree(tree, 4),
             lambda v, t, tree: tree_message_bytes(tree, 4)):
    lines_small = _lines_executed_in_module(lambda: fn(small, small_text, small_tree))
    lines_large = _lines_executed_in_module(lambda: fn(large, large_text, large_tree))
    assert 0 < lines_small == lines_large
