"""Message codecs for the simulator: raw float32 and a polyline adapter.

FedAT compresses every download and upload with Google's Encoded Polyline
Algorithm, layer by layer, sending each layer's shape with it (Chai et al.,
SC'21, Sec. 4.3). The codec itself lives in
`fedjax_lama.compression.polyline` (another module of the project); this module
only adapts it to the `Codec` protocol of `interfaces.py`, and provides the raw
codec every uncompressed method uses.

Byte accounting:
- raw (precision None): 4 bytes per parameter (float32), no metadata;
- polyline: sum over leaves of len(encoded string) + 4 * (1 + ndim) bytes of
  shape metadata (rank and each dimension as uint32).
"""
import importlib
from typing import Optional

import jax
import numpy as np

from fedjax_lama.simulation.pytree import PyTree
from fedjax_lama.tree import tree_size

BYTES_PER_FLOAT32 = 4


def raw_num_bytes(tree: PyTree) -> int:
  """Size of an uncompressed message: 4 bytes per parameter."""
  return BYTES_PER_FLOAT32 * tree_size(tree)


def shape_metadata_bytes(tree: PyTree) -> int:
  """Shape metadata of a compressed message: rank + dims as uint32, per leaf."""
  return int(sum(4 * (1 + np.ndim(leaf)) for leaf in jax.tree.leaves(tree)))


class RawCodec:
  """Uncompressed messages only; rejects any other precision."""

  def roundtrip(self, tree: PyTree, precision: Optional[int]) -> tuple[PyTree, int]:
    if precision is not None:
      raise ValueError(
          f"RawCodec cannot encode at compression_precision={precision!r}: inject a codec "
          "(e.g. simulation.message_codecs.PolylineCodec) or set compression_precision=None")
    return tree, raw_num_bytes(tree)


class PolylineCodec:
  """Adapter from `fedjax_lama.compression.polyline` to the `Codec` protocol.

  Flat mode uses the module's vectorised fast path `roundtrip_tree` (
  exactly the decoded values and sizes of the string codec, without building
  strings) when it exists. Otherwise, and in pairs mode, every leaf is encoded
  on its own (the delta restarts at 0) with `polyline_encode(values, precision,
  mode=mode)`, in canonical leaf order, and decoded with `polyline_decode`;
  decoded leaves are reshaped and cast back to the leaf's dtype (the server keeps
  float32). Precision None returns the tree itself, at 4 bytes per parameter.

  Args:
    mode: "flat" (default) or "pairs" (`polyline_mode`).
    fast: use `roundtrip_tree` when available (flat mode only).
    module: where the codec lives.
  """

  def __init__(self, mode: str = "flat", fast: bool = True,
               module: str = "fedjax_lama.compression.polyline"):
    if mode not in ("flat", "pairs"):
      raise ValueError(f"polyline_mode must be 'flat' or 'pairs', got {mode!r}")
    self.mode = mode
    lib = importlib.import_module(module)
    self._encode = getattr(lib, "polyline_encode")
    self._decode = getattr(lib, "polyline_decode")
    self._fast = getattr(lib, "roundtrip_tree", None) if (fast and mode == "flat") else None

  def roundtrip(self, tree: PyTree, precision: Optional[int]) -> tuple[PyTree, int]:
    if precision is None:
      return tree, raw_num_bytes(tree)
    if self._fast is not None:
      decoded, num_bytes = self._fast(tree, precision)
      return decoded, int(num_bytes)
    total = [0]

    def one_leaf(leaf):
      leaf = np.asarray(leaf)
      if self.mode == "pairs" and leaf.size % 2:
        raise ValueError(f"polyline_mode='pairs' needs leaves with an even number of values, "
                         f"got a leaf of shape {leaf.shape}")
      values = leaf.reshape(-1, 2) if self.mode == "pairs" else leaf.reshape(-1)
      text = self._encode(values, precision, mode=self.mode)
      total[0] += len(text)
      decoded = np.asarray(self._decode(text, precision, mode=self.mode))
      return decoded.reshape(leaf.shape).astype(leaf.dtype)

    decoded_tree = jax.tree.map(one_leaf, tree)
    return decoded_tree, total[0] + shape_metadata_bytes(tree)
