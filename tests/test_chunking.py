"""A cohort run as chunks of clients equals the same cohort in one chunk (docs/design.md).

Chunks accumulate (weighted sum, weight) pairs and keys are derived from client
ids, so only the order of float additions differs: allclose at 1e-6.
"""
import math

import jax
import numpy as np
import pytest

from fedjax_lama import federation
from fedjax_lama.engine import sharding
from tests import test_sharding as helpers

MESH = sharding.client_mesh(jax.devices()[:1])


def _run(chunk, rounds=3, with_rows=True, **overrides):
  config = helpers.tiny_config(rounds=rounds, **{"engine.clients_per_chunk": chunk}, **overrides)
  program = helpers.build(config, MESH, with_rows=with_rows)
  calls = []
  train_chunk = program.train_chunk

  def counted(*args):
    calls.append(args[-1])  # the round index
    return train_chunk(*args)

  program.train_chunk = counted
  state, outs = helpers.run(program)
  rows = program.store.to_numpy() if with_rows else {}
  return program, state["server"].params, rows, outs, calls


def _assert_close(a, b):
  jax.tree.map(
      lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-6),
      a, b)


@pytest.mark.parametrize("sampling", ["fixed", "bernoulli"])
def test_chunks_of_three_equal_one_chunk(sampling):
  overrides = {"client_sampling": sampling, "active_ratio": 0.3}
  one, params1, rows1, outs1, calls1 = _run(0, **overrides)
  three, params3, rows3, outs3, calls3 = _run(3, **overrides)
  assert three.chunk_size == 3 and one.chunk_size >= 12
  sizes = [len(three.opts.sampler.sample(r)) for r in range(3)]
  assert [o.extra["clients"] for o in outs3] == sizes
  if sampling == "bernoulli":
    assert len(set(sizes)) > 1  # the draw varies, the compiled chunk shape does not
  # One jitted chunk call per chunk: ceil(cohort / 3) per round, 1 per round unchunked.
  assert calls3 == [r for r, n in enumerate(sizes) for _ in range(math.ceil(n / 3))]
  assert calls1 == [r for r, n in enumerate(sizes) if n]
  _assert_close(params3, params1)
  _assert_close(rows3, rows1)
  np.testing.assert_allclose([o.train_loss for o in outs3], [o.train_loss for o in outs1],
                             rtol=1e-6)
  assert [o.train_count for o in outs3] == [o.train_count for o in outs1]


def test_empty_bernoulli_round_leaves_the_server_and_rows_unchanged():
  # With p small some rounds draw nobody: no chunk runs, the server and the rows stay put.
  config = helpers.tiny_config(client_sampling="bernoulli", active_ratio=0.03, rounds=20)
  sampler = federation.Sampler(config.client_sampling, config.active_ratio, helpers.NUM_CLIENTS,
                              config.seed)
  sizes = [len(sampler.sample(r)) for r in range(20)]
  empty = next(r for r in range(1, 20) if sizes[r] == 0 and sizes[r - 1] > 0)
  program = helpers.build(config, MESH, with_rows=True)
  state = program.init_state()
  for r in range(empty - 1, empty + 1):  # a round that trains, then an empty one
    before = jax.tree.map(np.asarray, state["server"].params)
    rows_before = program.store.to_numpy()
    state, out = program.run_round(state, r)
  assert out.train_count == 0 and out.extra["clients"] == 0
  assert not np.array_equal(rows_before["n"], np.zeros_like(rows_before["n"]))
  jax.tree.map(np.testing.assert_array_equal, before,
               jax.tree.map(np.asarray, state["server"].params))
  jax.tree.map(np.testing.assert_array_equal, rows_before, program.store.to_numpy())
