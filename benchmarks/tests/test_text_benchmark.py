"""The text models in `benchmarks.benchmark` (`--model=lstm_lm|transformer_lm`) and the
suite's text table: what the figures are made of, on tiny sizes; never how large a speed is.
"""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import benchmark, benchmark_tables
from fedjax_lama import models

TINY = dict(clients=2, steps=2, batch=4, repeats=1, matmul_size=64, min_sample_s=0,
            central_impls=("engine",))
LSTM = {"embed_size": 4, "hidden_size": 32}
TRANSFORMER = {"width": 16, "depth": 1, "heads": 2}


def _lstm_forward_matmul_flops(embed, hidden, layers, classes) -> int:
  """Per token: each layer's four gates (input and recurrent kernels), the output layer."""
  gates = sum(4 * ((embed if k == 0 else hidden) + hidden) * hidden for k in range(layers))
  return 2 * (gates + hidden * classes)


def test_lstm_flop_count_counts_every_position():
  """XLA counts a loop's body once; the benchmark counts it once per position. Training is
  about 3x the forward matmuls (forward, two gradients) plus the gates' elementwise work."""
  per_token = benchmark.training_flops_per_sample("lstm_lm", 4, options=LSTM) / 80
  matmuls = _lstm_forward_matmul_flops(4, 32, 2, 81)
  assert 3 * matmuls <= per_token <= 1.3 * 3 * matmuls
  # What XLA's count alone gives (the loop's body once): far below.
  model, _ = benchmark._model("lstm_lm", "lax", LSTM)
  params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                             jnp.zeros((1, 80), jnp.int32)))["params"]
  tokens = jax.ShapeDtypeStruct((4, 80), jnp.int32)
  once = benchmark._cost_flops(benchmark._sgd_step(model, False).lower(
      params, {}, tokens, tokens).compile()) / 4 / 80
  assert once < 0.5 * per_token
  # On 6 positions the fully unrolled step (no loop) is counted alike, to its bookkeeping.
  short = benchmark.training_flops_per_sample("lstm_lm", 4, input_shape=(6,), options=LSTM)
  unrolled = benchmark._cost_flops(benchmark._sgd_step(model.clone(unroll=6), False).lower(
      params, {}, jax.ShapeDtypeStruct((4, 6), jnp.int32),
      jax.ShapeDtypeStruct((4, 6), jnp.int32)).compile()) / 4
  assert short == pytest.approx(unrolled, rel=0.1)


def test_transformer_flop_count_is_about_six_per_parameter_and_token():
  options = {"width": 64, "depth": 2, "heads": 4}
  per_token = benchmark.training_flops_per_sample("transformer_lm", 4, options=options) / 80
  model, _ = benchmark._model("transformer_lm", "lax", options)
  params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                             jnp.zeros((1, 80), jnp.int32)))["params"]
  embeddings = (81 + 80) * 64  # gathered, not multiplied
  dense = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params)) - embeddings
  # 6 N per token for the dense layers, plus attention's scores and mixing and the norms.
  assert 6 * dense <= per_token <= 1.6 * 6 * dense


@pytest.fixture(scope="module")
def text_rows():
  peers_path = os.environ.get("FEDJAX_LAMA_PEERS_PATH", "")
  return [benchmark.run("lstm_lm", model_options=LSTM, peers=("fedjax", "torch"),
                        peers_path=peers_path, window=8, **TINY),
          benchmark.run("transformer_lm", model_options=TRANSFORMER, peers=("fedjax",),
                        peers_path=peers_path, **TINY)]


def test_text_rows_report_tokens_and_mfu(text_rows):
  for r in text_rows:
    r = json.loads(json.dumps(r))  # the JSON line round-trips
    window = 8 if r["model"] == "lstm_lm" else 80
    assert r["tokens_per_sample"] == window
    assert r["engine_tokens_per_s"] == pytest.approx(r["engine_samples_per_s"] * window)
    assert r["flops_per_token"] == pytest.approx(r["flops_per_sample"] / window)
    assert r["mfu"] == pytest.approx(r["flops_per_sample"] * r["engine_samples_per_s"] /
                                     r["peak_flops_per_s"])
    assert r["ratio"] == pytest.approx(r["engine_samples_per_s"] / r["loop_samples_per_s"])
    assert "tokens/s" in benchmark.summary_line(r)
  lstm, transformer = text_rows
  # The recurrence's two matmul rates, for the LSTM only.
  for key in ("recurrence_chained_flops_per_s", "recurrence_batched_flops_per_s"):
    assert lstm[key] > 0 and key not in transformer
  assert lstm["recurrence_chained_vs_peak"] == pytest.approx(
      lstm["recurrence_chained_flops_per_s"] / lstm["peak_flops_per_s"])
  assert "LSTM" in transformer["peers_skipped"]["fedjax"]


def test_lstm_peers_compute_the_same_round_or_say_why_not(text_rows):
  lstm = text_rows[0]
  for peer in ("fedjax", "torch"):
    if peer in lstm.get("peers_skipped", {}):
      assert f"engine_vs_{peer}" not in lstm
      continue
    assert lstm[f"engine_vs_{peer}"] == pytest.approx(lstm["engine_samples_per_s"] /
                                                      lstm[f"{peer}_samples_per_s"])
    assert lstm[f"{peer}_max_param_diff"] < 1e-5  # the same batches, float32 rounding
  if "fedjax_model" in lstm:  # every arm then computes FedJAX's Shakespeare model
    assert lstm["model_options"]["vocab_size"] == 90
    assert lstm["model_options"]["tanh_outputs"] is True


def test_text_table(text_rows):
  table = benchmark_tables.text_table(text_rows)
  assert table.count("\n| lstm_lm |") == table.count("\n| transformer_lm |") == 1
  assert "chained over 8 positions" in table
  lstm, transformer = text_rows
  assert (f"{transformer['engine_flops_per_s'] / lstm['engine_flops_per_s']:.2f}x the time "
          "per FLOP") in table


def test_text_options_are_refused_for_image_models():
  with pytest.raises(ValueError, match="model_options"):
    benchmark._model("fedat_cnn", "lax", {"width": 3})
  assert isinstance(benchmark._model("lstm_lm", "lax", {"hidden_size": 5})[0],
                    type(models.get("lstm_lm", 81)))
