"""Communication accounting: floats sent up and down per layer, per round, cumulative.

Floats are counted per participating client and direction, the convention
of every algorithm's comm ledger; bytes are 4 per float32 unless an encoding reports its own.
"""
import numpy as np

from fedjax_lama.tree import leaf_names, leaf_sizes

BYTES_PER_FLOAT = 4


def layer_table(params) -> tuple[list[str], np.ndarray]:
  return leaf_names(params), leaf_sizes(params)


class Ledger:
  """Cumulative per-layer counters of one run (checkpointed with it)."""

  def __init__(self, names, sizes):
    self.names = list(names)
    self.sizes = np.asarray(sizes, np.int64)
    self.up = np.zeros(len(self.names), np.int64)
    self.down = np.zeros(len(self.names), np.int64)
    self.up_other = 0    # floats not shaped like the model (FedNova's scalar), both ways
    self.down_other = 0
    self.bytes = 0
    self.bits_up = 0

  def add(self, up_per_layer, down_per_layer, num_bytes=None, bits_up=None, up_other=0,
          down_other=0) -> None:
    """Floats per layer (model-shaped messages) and other floats; bits_up: what an uplink
    compressor sent (compression/core.py), None for float32."""
    up = np.asarray(up_per_layer, np.int64)
    down = np.asarray(down_per_layer, np.int64)
    self.up += up
    self.down += down
    self.up_other += int(up_other)
    self.down_other += int(down_other)
    floats_up = int(up.sum()) + int(up_other)
    bits = int(bits_up) if bits_up is not None else floats_up * 8 * BYTES_PER_FLOAT
    self.bits_up += bits
    self.bytes += (int(num_bytes) if num_bytes is not None else
                   -(-bits // 8) + (int(down.sum()) + int(down_other)) * BYTES_PER_FLOAT)

  def totals(self) -> dict:
    return {"comm_floats_up": int(self.up.sum()) + self.up_other,
            "comm_floats_down": int(self.down.sum()) + self.down_other,
            "comm_bits_up": int(self.bits_up), "comm_bytes": int(self.bytes)}

  def dump(self) -> dict:
    return {"up": self.up.tolist(), "down": self.down.tolist(), "bytes": self.bytes,
            "bits_up": self.bits_up, "up_other": self.up_other, "down_other": self.down_other}

  def load(self, d: dict) -> None:
    self.up = np.asarray(d["up"], np.int64)
    self.down = np.asarray(d["down"], np.int64)
    self.bytes = int(d["bytes"])
    self.bits_up = int(d.get("bits_up", int(self.up.sum()) * 8 * BYTES_PER_FLOAT))
    self.up_other = int(d.get("up_other", 0))
    self.down_other = int(d.get("down_other", 0))
