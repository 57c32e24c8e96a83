"""FedAT's polyline compression: Google's Encoded Polyline Algorithm Format (Chai et al., SC'21,
Sec. 4.3).

FedAT (Chai et al., "FedAT: A High-Performance and Communication-Efficient Federated Learning
System with Asynchronous Tiers", SC'21, Sec. 4.3)
compresses both the uplink and the downlink by flattening every layer's weights, encoding the list
with Google's Encoded Polyline Algorithm Format
(developers.google.com/maps/documentation/utilities/polylinealgorithm) and sending each layer's
dimensions with it; the receiver decodes and reshapes.

Codec. A value x is scaled once in binary64, s = float64(x) * 10^p, and rounded half
away from zero, n = sign(s) * floor(|s| + 0.5). Deltas are taken between the *rounded* integers
(never a rounded delta), so errors do not accumulate along the sequence. Each delta d becomes the
zig-zag code z = 2d (d >= 0) or -2d - 1 (d < 0), cut into 5-bit chunks, least significant first;
every chunk but the last gets the continuation bit 0x20 and each is emitted as chr(chunk + 63),
so every character lies in '?'..'~'. Decoding divides the integer sum by 10^p (a float64
division, as Google's decoders do).

- mode="flat" (default, FedAT's layers): the values are flattened in C order and each is
  delta-coded against the previous one (the first against 0).
- mode="pairs" (Google's maps): (lat, lng) points; each coordinate is delta-coded against the
  same coordinate of the previous point. Byte-identical to Google's format and to the PyPI
  `polyline` package.

Error bound: in exact arithmetic |x - x_hat| <= 0.5 * 10^-p per value. In floating point
the scaling and the division add a few ulps:
|x - x_hat| <= 0.5 * 10^-p + 8 * 2^-53 * max(1, |x|) for the float64 result, plus 2^-24 * |x_hat|
when the result is cast back to float32.

Everything is vectorised numpy on int64: there is no Python loop per value or per character, only
loops over the (at most 11) 5-bit chunk positions and over the leaves of a pytree.

Pytrees: a message carries every leaf in `jax.tree.leaves` order; each leaf is flattened in C
order and encoded in flat mode with the delta restarting at 0, and the leaf strings are
concatenated without separators (values are self-delimiting; the shapes give the counts). Its size
is sum(len(leaf string)) + sum(4 * (1 + ndim)) bytes (rank and dimensions as uint32). Precision
None means raw float32: 4 bytes per parameter, no metadata. The simulator's fast path,
`roundtrip_tree`, computes the decoded values and the exact size without building strings.

Public API:

    polyline_encode(values, precision, *, mode="flat") -> str
    polyline_decode(text, precision, *, mode="flat") -> np.ndarray (float64)
    polyline_roundtrip(values, precision, *, mode="flat") -> (decoded float64 array, num_chars)
    encode_tree(tree, precision) -> (PolylineMessage, num_bytes)
    decode_tree(message, like_tree) -> tree
    roundtrip_tree(tree, precision) -> (tree_hat, num_bytes)       # fast path, no strings
    tree_message_bytes(tree, precision) -> int                      # fast path, no strings
"""
import operator
from typing import Any, NamedTuple, Optional, Union

import jax
import numpy as np

from fedjax_lama.tree import tree_size

PyTree = Any
MODES = ("flat", "pairs")

# 10^p is exactly representable in binary64 only up to p = 22; beyond it the "one multiplication
# by an exact power of ten" rule no longer holds, and FedAT uses 3-6 anyway.
MAX_PRECISION = 22
# |s| >= 2^52 is refused: the rounded integers must stay exact in binary64.
LIMIT = 2 ** 52
# Deltas of integers below 2^52 have |d| < 2^53, so z < 2^54 needs at most 11 chunks of 5 bits.
MAX_CHARS_PER_VALUE = 11
_CHAR_OFFSET = 63
_CONTINUATION = 0x20
_CHUNK_MASK = 0x1F
_CHUNK_BITS = 5
# Shape metadata per leaf: the rank and each dimension as uint32 (a choice of this project).
_METADATA_BYTES_PER_FIELD = 4
_RAW_BYTES_PER_PARAMETER = 4  # float32


def _check_precision(precision) -> int:
  """Returns precision as an int, or raises ValueError naming what is accepted."""
  if isinstance(precision, (bool, np.bool_)) or not isinstance(precision, (int, np.integer)):
    raise ValueError(
        f"polyline: precision must be an int (decimal digits kept: 4 for FedAT, 5 for Google's "
        f"maps), from 0 to {MAX_PRECISION}; got {precision!r} of type {type(precision).__name__}")
  precision = operator.index(precision)
  if not 0 <= precision <= MAX_PRECISION:
    raise ValueError(
        f"polyline: precision must be between 0 and {MAX_PRECISION} (10^p must be exact in "
        f"binary64); got {precision}")
  return precision


def _check_mode(mode) -> int:
  """Returns the delta stride of a mode: 1 for 'flat', 2 for 'pairs'."""
  if mode == "flat":
    return 1
  if mode == "pairs":
    return 2
  raise ValueError(f"polyline: mode must be one of {MODES}; got {mode!r}")


def _as_float64(values) -> np.ndarray:
  """Real array-like -> float64 ndarray (float32 and ints are widened exactly)."""
  try:
    array = np.asarray(values)
  except (ValueError, TypeError) as error:  # ragged nested sequences
    raise ValueError(f"polyline: values must be a rectangular array of real numbers ({error})")
  if array.dtype.kind in "cUSOMm":
    raise ValueError(
        f"polyline: values must be real numbers (bool, int or float); got dtype {array.dtype}")
  try:
    # Also covers ml_dtypes such as bfloat16, whose numpy kind is 'V'.
    return array.astype(np.float64)
  except (ValueError, TypeError) as error:
    raise ValueError(
        f"polyline: values must be real numbers; dtype {array.dtype} cannot be cast to float64 "
        f"({error})")


def _pairs_to_flat(values) -> np.ndarray:
  """(n, 2) points -> their coordinates interleaved, lat0, lng0, lat1, ..."""
  points = _as_float64(values)
  if points.size == 0:
    return points.reshape(-1)
  if points.ndim != 2 or points.shape[1] != 2:
    raise ValueError(
        f"polyline: mode='pairs' accepts a sequence of (lat, lng) pairs or an (n, 2) array; got "
        f"shape {points.shape}")
  return points.reshape(-1)


def _round_half_away(flat: np.ndarray, precision: int) -> np.ndarray:
  """n = sign(s) * floor(|s| + 0.5), s = x * 10^p in binary64, as int64."""
  bad = ~np.isfinite(flat)
  if bad.any():
    index = int(np.flatnonzero(bad)[0])
    raise ValueError(
        f"polyline: values must be finite; value {index} is {flat[index]!r} (NaN and +-inf are "
        f"not encodable)")
  scaled = flat * float(10 ** precision)  # one binary64 multiplication; 10^p is exact
  too_large = np.abs(scaled) >= LIMIT
  if too_large.any():
    index = int(np.flatnonzero(too_large)[0])
    raise ValueError(
        f"polyline: value {index} ({flat[index]!r}) is too large for precision {precision}: "
        f"|value| * 10^{precision} must be below 2^52 (accepted: |value| < "
        f"{LIMIT / 10**precision:g})")
  # The same binary64 operations as the reference (including |s| + 0.5 rounding up to the next
  # integer for |s| just below a half); -0.0 becomes 0.
  return np.copysign(np.floor(np.abs(scaled) + 0.5), scaled).astype(np.int64)


def _deltas(rounded: np.ndarray, stride: int) -> np.ndarray:
  """Differences against the value `stride` places earlier (0 before the start)."""
  deltas = rounded.copy()
  deltas[stride:] -= rounded[:-stride]
  return deltas


def _zigzag(deltas: np.ndarray) -> np.ndarray:
  """Steps 4-5 of Google's encoding: 2d for d >= 0, -2d - 1 = ~(2d) for d < 0."""
  doubled = deltas << 1
  return np.where(deltas < 0, ~doubled, doubled)


def _chars_per_value(zigzag: np.ndarray) -> np.ndarray:
  """c(z) = 1 + #{i >= 1 : z >= 32^i}, as int64."""
  counts = np.ones(zigzag.shape, np.int64)
  if zigzag.size == 0:
    return counts
  largest = int(zigzag.max())
  chunk = 1
  while largest >= 32 ** chunk:  # at most MAX_CHARS_PER_VALUE - 1 passes
    counts += zigzag >= 32 ** chunk
    chunk += 1
  return counts


def _encode_deltas(deltas: np.ndarray) -> str:
  """Concatenated polyline characters of int64 deltas (steps 4-9 of Google's encoding)."""
  if deltas.size == 0:
    return ""
  zigzag = _zigzag(deltas)
  width = int(_chars_per_value(zigzag).max())
  chars = np.empty((zigzag.size, width), np.uint8)
  present = np.empty((zigzag.size, width), bool)
  for position in range(width):
    rest = zigzag >> (_CHUNK_BITS * position)
    more = (rest >> _CHUNK_BITS) != 0  # a later chunk follows: set the continuation bit
    chars[:, position] = ((rest & _CHUNK_MASK) | np.where(more, _CONTINUATION, 0)) + _CHAR_OFFSET
    # Chunk 0 always exists (z = 0 is '?'); chunk k > 0 exists while bits remain.
    present[:, position] = (rest != 0) if position else True
  # Row-major boolean indexing keeps value order and, within a value, chunk order.
  return chars[present].tobytes().decode("ascii")


def _text_to_codes(text) -> np.ndarray:
  """Validated chunk codes (character - 63) of a polyline string, as uint8."""
  if isinstance(text, (bytes, bytearray)):
    raw = bytes(text)
  elif isinstance(text, str):
    try:
      raw = text.encode("ascii")
    except UnicodeEncodeError as error:
      raise ValueError(
          f"polyline: invalid character {text[error.start]!r} at index {error.start}; accepted: "
          f"'?' (63) to '~' (126)") from None
  else:
    raise ValueError(f"polyline: text must be a str (or ASCII bytes); got {type(text).__name__}")
  characters = np.frombuffer(raw, np.uint8)
  bad = (characters < _CHAR_OFFSET) | (characters > _CHAR_OFFSET + 63)
  if bad.any():
    index = int(np.flatnonzero(bad)[0])
    raise ValueError(
        f"polyline: invalid character {chr(raw[index])!r} (code {raw[index]}) at index {index}; "
        f"accepted: '?' (63) to '~' (126)")
  return characters - np.uint8(_CHAR_OFFSET)


def _decode_deltas(text) -> np.ndarray:
  """Signed int64 deltas of a polyline string, vectorised."""
  codes = _text_to_codes(text)
  if codes.size == 0:
    return np.zeros(0, np.int64)
  ends = codes < _CONTINUATION  # a chunk without the continuation bit ends a value
  if not ends[-1]:
    raise ValueError(
        f"polyline: truncated input: the last character {chr(int(codes[-1]) + _CHAR_OFFSET)!r} "
        f"has the continuation bit set, so the string ends inside a value; a complete value ends "
        f"with a character from '?' to '^'")
  end_positions = np.flatnonzero(ends)
  starts = np.empty_like(end_positions)
  starts[0] = 0
  starts[1:] = end_positions[:-1] + 1
  lengths = end_positions - starts + 1
  longest = int(lengths.max())
  if longest > MAX_CHARS_PER_VALUE:
    value = int(np.flatnonzero(lengths > MAX_CHARS_PER_VALUE)[0])
    raise ValueError(
        f"polyline: value {value} (from index {starts[value]}) has {lengths[value]} characters; "
        f"accepted: at most {MAX_CHARS_PER_VALUE} (integers below 2^52)")
  # One pass per chunk position (at most 11), each vectorised over the values that have it:
  # cheaper than a per-character gather of every chunk's position.
  zigzag = (codes[starts] & _CHUNK_MASK).astype(np.int64)
  for position in range(1, longest):
    having = np.flatnonzero(lengths > position)
    chunk = (codes[starts[having] + position] & _CHUNK_MASK).astype(np.int64)
    zigzag[having] |= chunk << (_CHUNK_BITS * position)
  # Undo the zig-zag: z >> 1 for even z, ~(z >> 1) for odd z.
  return (zigzag >> 1) ^ -(zigzag & 1)


def _undelta(deltas: np.ndarray, stride: int) -> np.ndarray:
  """Running sums per position class; refuses integers the encoder cannot produce."""
  if stride == 2:
    if deltas.size % 2:
      raise ValueError(
          f"polyline: mode='pairs' needs an even number of values (lat, lng per point); the "
          f"string holds {deltas.size}")
    rounded = np.cumsum(deltas.reshape(-1, 2), axis=0).reshape(-1)
  else:
    rounded = np.cumsum(deltas)
  # Every delta is below 2^54 in magnitude, so the first sum that leaves (-2^52, 2^52) is still
  # computed exactly (no int64 wrap-around before it) and is caught here.
  if rounded.size and np.abs(rounded).max() >= LIMIT:
    raise ValueError(
        "polyline: a decoded integer reaches 2^52; accepted: |integer| < 2^52 (what the encoder "
        "produces)")
  return rounded


def _unscale(rounded: np.ndarray, precision: int) -> np.ndarray:
  return rounded.astype(np.float64) / float(10 ** precision)  # float64 division, like Google's


def _flat_values(values, stride: int) -> np.ndarray:
  if stride == 2:
    return _pairs_to_flat(values)
  return _as_float64(values).reshape(-1)


def polyline_encode(values, precision: int, *, mode: str = "flat") -> str:
  """Encodes values as a polyline string.

  Args:
    values: for mode="flat", any real array-like (flattened in C order); for mode="pairs", a
      sequence of (lat, lng) pairs or an (n, 2) array.
    precision: decimal digits kept, an int from 0 to 22 (FedAT uses 4, Google's maps 5).
    mode: "flat" (delta against the previous value) or "pairs" (delta against the same
      coordinate of the previous point; Google's format).

  Returns:
    The ASCII string; "" for empty input.

  Raises:
    ValueError: non-finite values, |value| * 10^precision >= 2^52, a bad precision or mode, or
      pairs that are not (n, 2).
  """
  precision = _check_precision(precision)
  stride = _check_mode(mode)
  flat = _flat_values(values, stride)
  return _encode_deltas(_deltas(_round_half_away(flat, precision), stride))


def polyline_decode(text: str, precision: int, *, mode: str = "flat") -> np.ndarray:
  """Decodes a polyline string.

  Args:
    text: the polyline string (characters '?' to '~').
    precision: the precision it was encoded with.
    mode: "flat" or "pairs", as encoded.

  Returns:
    float64 values: shape (n,) in flat mode, (n, 2) in pairs mode.

  Raises:
    ValueError: a character outside '?'..'~', a string ending inside a value, an odd number of
      values in pairs mode, a value beyond what the encoder produces, a bad precision or mode.
  """
  precision = _check_precision(precision)
  stride = _check_mode(mode)
  decoded = _unscale(_undelta(_decode_deltas(text), stride), precision)
  return decoded.reshape(-1, 2) if stride == 2 else decoded


def _roundtrip_flat(flat: np.ndarray, precision: int, stride: int):
  """Fast path on flat float64 values: (decoded float64, number of characters)."""
  rounded = _round_half_away(flat, precision)
  num_chars = int(_chars_per_value(_zigzag(_deltas(rounded, stride))).sum())
  return _unscale(rounded, precision), num_chars


def polyline_roundtrip(values, precision: int, *,
                       mode: str = "flat") -> tuple[np.ndarray, int]:
  """Fast path: decode(encode(values)) and len(encode(values)) without the string.

  Args:
    values: as for `polyline_encode`.
    precision: as for `polyline_encode`.
    mode: as for `polyline_encode`.

  Returns:
    (decoded, num_chars): `decoded` is float64 with the shape of `values` (flat mode; equal to
    `polyline_decode(polyline_encode(values, p), p)` after reshaping) or (n, 2) (pairs mode);
    `num_chars` equals `len(polyline_encode(values, p, mode=mode))`.
  """
  precision = _check_precision(precision)
  stride = _check_mode(mode)
  flat = _flat_values(values, stride)
  decoded, num_chars = _roundtrip_flat(flat, precision, stride)
  shape = (-1, 2) if stride == 2 else np.shape(values)
  return decoded.reshape(shape), num_chars


class PolylineMessage(NamedTuple):
  """One encoded model message.

  Attributes:
    precision: decimal digits kept, or None for raw float32.
    shapes: the shape of every leaf, in `jax.tree.leaves` order (sent with the message).
    payload: the leaf strings concatenated without separators (str), or for precision None the
      leaves as little-endian float32 concatenated (bytes).
  """
  precision: Optional[int]
  shapes: tuple[tuple[int, ...], ...]
  payload: Union[str, bytes]

  @property
  def num_bytes(self) -> int:
    """Characters + 4 * (1 + ndim) per leaf; 4 bytes per parameter for raw float32."""
    if self.precision is None:
      return len(self.payload)
    return len(self.payload) + sum(_metadata_bytes(shape) for shape in self.shapes)


def _metadata_bytes(shape) -> int:
  return _METADATA_BYTES_PER_FIELD * (1 + len(shape))


def _leaves(tree) -> list[np.ndarray]:
  return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


def encode_tree(tree: PyTree, precision: Optional[int]) -> tuple[PolylineMessage, int]:
  """Encodes every leaf of a pytree into one message.

  Args:
    tree: a pytree of real arrays (e.g. model parameters).
    precision: decimal digits kept, or None for raw float32.

  Returns:
    (message, message.num_bytes).
  """
  leaves = _leaves(tree)
  shapes = tuple(tuple(int(d) for d in leaf.shape) for leaf in leaves)
  if precision is None:
    payload = b"".join(leaf.astype("<f4").tobytes() for leaf in leaves)
  else:
    precision = _check_precision(precision)
    # Delta coding restarts at 0 in every leaf; one vectorised pass then writes all characters.
    deltas = [_deltas(_round_half_away(_as_float64(leaf).reshape(-1), precision), 1)
              for leaf in leaves]
    payload = _encode_deltas(np.concatenate(deltas) if deltas else np.zeros(0, np.int64))
  message = PolylineMessage(precision, shapes, payload)
  return message, message.num_bytes


def decode_tree(message: PolylineMessage, like_tree: PyTree) -> PyTree:
  """Decodes a message into the structure of `like_tree`.

  Args:
    message: from `encode_tree`.
    like_tree: a pytree with the structure, shapes and dtypes to decode into (its values are not
      used).

  Returns:
    A pytree of numpy arrays, each with the dtype of the corresponding leaf of `like_tree`.

  Raises:
    ValueError: the message's leaf count, shapes or number of values do not match, or the
      payload is malformed.
  """
  like_leaves, treedef = jax.tree.flatten(like_tree)
  like_leaves = [np.asarray(leaf) for leaf in like_leaves]
  shapes = tuple(tuple(int(d) for d in leaf.shape) for leaf in like_leaves)
  if tuple(map(tuple, message.shapes)) != shapes:
    raise ValueError(
        f"polyline: message shapes {message.shapes} do not match like_tree's leaf shapes "
        f"{shapes}")
  sizes = [int(np.prod(shape, dtype=np.int64)) for shape in shapes]
  boundaries = np.cumsum([0] + sizes)
  if message.precision is None:
    values = np.frombuffer(message.payload, "<f4")
  else:
    precision = _check_precision(message.precision)
    deltas = _decode_deltas(message.payload)
    if deltas.size != boundaries[-1]:
      raise ValueError(
          f"polyline: the payload holds {deltas.size} values; the shapes need {boundaries[-1]}")
    values = np.concatenate(
        [np.zeros(0)] + [_unscale(_undelta(deltas[lo:hi], 1), precision)
                         for lo, hi in zip(boundaries[:-1], boundaries[1:])])
  if values.size != boundaries[-1]:
    raise ValueError(
        f"polyline: the payload holds {values.size} values; the shapes need {boundaries[-1]}")
  leaves = [values[lo:hi].reshape(leaf.shape).astype(leaf.dtype)
            for lo, hi, leaf in zip(boundaries[:-1], boundaries[1:], like_leaves)]
  return jax.tree.unflatten(treedef, leaves)


def roundtrip_tree(tree: PyTree, precision: Optional[int]) -> tuple[PyTree, int]:
  """Fast path for a model: decode_tree(encode_tree(tree)) and its size, no strings.

  Args:
    tree: a pytree of real arrays.
    precision: decimal digits kept, or None for raw float32.

  Returns:
    (tree_hat, num_bytes), equal to `decode_tree(m, tree)` and `num_bytes` of
    `m, num_bytes = encode_tree(tree, precision)`; leaves are numpy arrays of the input dtypes.
  """
  leaves, treedef = jax.tree.flatten(tree)
  leaves = [np.asarray(leaf) for leaf in leaves]
  if precision is None:
    hats = [leaf.astype(np.float32).astype(leaf.dtype) for leaf in leaves]
    return (jax.tree.unflatten(treedef, hats),
            _RAW_BYTES_PER_PARAMETER * tree_size(leaves))
  precision = _check_precision(precision)
  hats, num_bytes = [], 0
  for leaf in leaves:
    decoded, num_chars = _roundtrip_flat(_as_float64(leaf).reshape(-1), precision, 1)
    hats.append(decoded.reshape(leaf.shape).astype(leaf.dtype))
    num_bytes += num_chars + _metadata_bytes(leaf.shape)
  return jax.tree.unflatten(treedef, hats), num_bytes


def tree_message_bytes(tree: PyTree, precision: Optional[int]) -> int:
  """Size in bytes of the message `encode_tree(tree, precision)` would build.

  Args:
    tree: a pytree of real arrays.
    precision: decimal digits kept, or None for raw float32 (4 bytes per parameter, no
      metadata).

  Returns:
    sum over leaves of len(leaf string) + 4 * (1 + ndim), computed without building strings.
  """
  leaves = _leaves(tree)
  if precision is None:
    return _RAW_BYTES_PER_PARAMETER * tree_size(leaves)
  precision = _check_precision(precision)
  num_bytes = 0
  for leaf in leaves:
    rounded = _round_half_away(_as_float64(leaf).reshape(-1), precision)
    num_bytes += int(_chars_per_value(_zigzag(_deltas(rounded, 1))).sum())
    num_bytes += _metadata_bytes(leaf.shape)
  return num_bytes
