"""The text evaluation benchmark's figures are made of the windows it says it evaluates."""
import numpy as np

from benchmarks import text_eval_speed


def test_every_way_evaluates_the_same_windows_and_says_how_many_it_pads():
  out = text_eval_speed.run(roles=8, windows=120, model_name="lstm_lm",
                            options={"embed_size": 4, "hidden_size": 8},
                            eval_batch_size=32, repeats=1)
  sizes = text_eval_speed.role_sizes(8, 120)
  evaluated = out["windows_evaluated"]
  assert out["windows"] == evaluated["pooled"] == evaluated["per_client"] == sizes.sum()
  # One width: every client padded to the largest part, in chunks of 32 // largest (>= 1).
  assert evaluated["one_width"] == evaluated["personal_one_width"] == len(sizes) * sizes.max()
  assert sizes.sum() <= evaluated["personal_by_size"] < evaluated["one_width"]
  assert set(out["ratio_to_pooled"]) == set(out["seconds"]) - {"pooled"}
  assert all(np.isfinite(r) and r > 0 for r in out["ratio_to_pooled"].values())


def test_synthetic_windows_are_next_character_targets():
  x, y, parts = text_eval_speed.synthetic_text(np.array([3, 1, 2]))
  assert x.shape == y.shape == (6, text_eval_speed.WINDOW)
  np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
  assert [p.tolist() for p in parts] == [[0, 1, 2], [3], [4, 5]]
