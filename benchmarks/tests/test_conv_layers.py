"""benchmarks.conv.conv_layers: the per-layer measurement tool reads a model's layers and picks
right, and every plan it times computes lax's gradients (no timing is checked)."""
import jax

import pytest

from benchmarks.conv import conv_layers

pytestmark = pytest.mark.slow  # a measurement tool: its tests run with -m slow


def test_reads_the_layers_of_a_model_and_the_plan_patches_picks():
  found = conv_layers.conv_layers("mnist_cnn")
  assert found == [((28, 28, 1), (5, 5, 1, 10), (1, 1), "VALID"),
                   ((12, 12, 10), (5, 5, 10, 20), (1, 1), "VALID")]
  assert conv_layers.picked_plan((4, 28, 28, 1), (5, 5, 1, 10), (1, 1), "VALID") == \
      "channel_major"
  assert conv_layers.picked_plan((4, 16, 16, 16), (3, 3, 16, 16), (1, 1), "SAME") == \
      "row_shift"
  assert conv_layers.picked_plan((4, 14, 14, 32), (3, 3, 32, 64), (1, 1), "SAME") == "im2col"
  assert conv_layers.picked_plan((4, 16, 16, 32), (3, 3, 32, 64), (1, 1), "SAME") == (
      "winograd" if jax.default_backend() == "cpu" else "row_shift")


def test_times_every_plan_and_each_matches_lax():
  row = conv_layers.time_layer((8, 7, 3), (3, 3, 3, 4), (2, 1), ((1, 1), (0, 2)), False,
                               batch=2, steps=2, plans=["im2col", "channel_major", "row_shift",
                                                        "winograd", "standard_layout", "lax"],
                               repeats=1)
  # row_shift needs stride 1 along H, winograd a 3x3 stride-1 layer: left out, not failed.
  assert set(row["ms"]) == {"im2col", "channel_major", "standard_layout", "lax", "lax_outside"}
  assert all(v > 0 for v in row["ms"].values())
  assert max(row["max_rel_grad_diff"].values()) < 1e-5
  assert row["picked"] == "channel_major"


def test_times_winograd_where_it_applies():
  row = conv_layers.time_layer((6, 6, 4), (3, 3, 4, 5), (1, 1), "SAME", False, batch=2, steps=2,
                               plans=["winograd", "lax"], repeats=1)
  assert set(row["ms"]) == {"winograd", "lax", "lax_outside"}
  assert row["max_rel_grad_diff"]["winograd"] < 1e-5
