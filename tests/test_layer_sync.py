"""Tests of layer bookkeeping and the layer-masked aggregation (Lee et al., AAAI 2023, Algorithm
2)."""

import functools
import os
import subprocess
import sys
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lama.engine import reduce
from fedjax_lama.fedlama import layer_units as layers
from fedjax_lama.fedlama import layer_sync

NUM_CLIENTS = 5


class _Block(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(4)(x)


class _Tiny(nn.Module):
  """Conv + BatchNorm + a nested block + Dense: kernels, biases, scales."""

  @nn.compact
  def __call__(self, x):
    x = nn.Conv(4, (3, 3))(x)
    x = nn.BatchNorm(use_running_average=True)(x)
    x = _Block()(x.mean(axis=(1, 2)))
    return nn.Dense(3)(x)


def _param_shapes():
  variables = jax.eval_shape(_Tiny().init, jax.random.key(0),
                             jnp.zeros((1, 6, 6, 2)))
  return variables["params"]


PARAM_SHAPES = _param_shapes()

TENSOR_NAMES = ("BatchNorm_0/bias", "BatchNorm_0/scale", "Conv_0/bias",
                "Conv_0/kernel", "Dense_0/bias", "Dense_0/kernel",
                "_Block_0/Dense_0/bias", "_Block_0/Dense_0/kernel")
TENSOR_SIZES = (4, 4, 4, 72, 3, 12, 4, 16)


def _random_params(rng, shapes, lead=()):
  return jax.tree.map(
      lambda s: rng.normal(size=lead + s.shape).astype(np.float32), shapes)


def _stacked(seed=0, num_clients=NUM_CLIENTS):
  rng = np.random.default_rng(seed)
  return _random_params(rng, PARAM_SHAPES, (num_clients,))


# ------------------------------------------------------------------ layers


def test_layer_spec_tensor_granularity():
  spec = layers.layer_spec(PARAM_SHAPES)
  assert spec.names == TENSOR_NAMES
  assert spec.granularity == "tensor"
  np.testing.assert_array_equal(spec.sizes, TENSOR_SIZES)
  assert spec.sizes.dtype == np.int64
  np.testing.assert_array_equal(
      spec.is_kernel, [n.endswith("/kernel") for n in TENSOR_NAMES])
  assert spec.is_kernel.dtype == np.bool_
  np.testing.assert_array_equal(spec.leaf_to_layer, np.arange(8))
  assert spec.leaf_to_layer.dtype == np.int32
  assert spec.num_layers == spec.num_leaves == 8


def test_layer_spec_module_granularity():
  spec = layers.layer_spec(PARAM_SHAPES, "module")
  assert spec.names == ("BatchNorm_0", "Conv_0", "Dense_0",
                        "_Block_0/Dense_0")
  np.testing.assert_array_equal(spec.sizes, [8, 76, 15, 20])
  np.testing.assert_array_equal(spec.is_kernel, [False, True, True, True])
  np.testing.assert_array_equal(spec.leaf_to_layer, [0, 0, 1, 1, 2, 2, 3, 3])
  assert spec.sizes.sum() == sum(TENSOR_SIZES)


def test_layer_spec_order_is_first_leaf_order():
  """Module units are ordered by their first leaf, even if interleaved."""
  params = [{"kernel": np.zeros(2)}, np.zeros(3), {"bias": np.zeros(1)}]
  spec = layers.layer_spec(params, "module")
  assert spec.names == ("0", "", "2")
  np.testing.assert_array_equal(spec.sizes, [2, 3, 1])
  np.testing.assert_array_equal(spec.is_kernel, [True, False, False])


def test_layer_spec_variables_wrapper_and_arrays_are_readonly():
  spec = layers.layer_spec({"params": PARAM_SHAPES})
  assert spec.names == tuple("params/" + n for n in TENSOR_NAMES)
  with pytest.raises(ValueError):
    spec.sizes[0] = 1
  with pytest.raises(ValueError, match="fedlama.layer_granularity"):
    layers.layer_spec(PARAM_SHAPES, "layer")


def test_per_leaf():
  spec = layers.layer_spec(PARAM_SHAPES, "module")
  tree = layers.per_leaf(spec, jnp.array([10, 11, 12, 13]), PARAM_SHAPES)
  assert jax.tree.structure(tree) == jax.tree.structure(
      PARAM_SHAPES)
  assert [int(v) for v in jax.tree.leaves(tree)] == [
      10, 10, 11, 11, 12, 12, 13, 13]
  with pytest.raises(ValueError, match="shape"):
    layers.per_leaf(spec, jnp.zeros(3), PARAM_SHAPES)


# -------------------------------------------------------------- reference


def _np_reference(stacked, weights, mask, tau, prev_d, prev_g, l2l):
  """Float64 numpy restatement of the layer-wise averaging."""
  xs = [np.asarray(x, np.float64) for x in jax.tree.leaves(stacked)]
  us = [np.asarray(u) for u in jax.tree.leaves(prev_g)]
  w = np.asarray(weights, np.float64)
  w = w / w.sum()
  num_layers = len(mask)
  sq = np.zeros(num_layers)
  size = np.zeros(num_layers)
  new_x, new_u = [], []
  for x, u, l in zip(xs, us, l2l):
    live = w > 0
    mean = np.tensordot(w[live], x[live], axes=1)
    dist = ((x[live] - mean) ** 2).reshape(live.sum(), -1).sum(axis=1)
    sq[l] += np.dot(w[live], dist)
    size[l] += x[0].size
    new_x.append(np.broadcast_to(mean, x.shape) if mask[l] else x)
    new_u.append(mean if mask[l] else u)
  d = np.where(mask, sq / (np.asarray(tau) * size), prev_d)
  return new_x, new_u, d


WEIGHTS = {"uniform": np.ones(NUM_CLIENTS), "examples": [3, 1, 0.5, 2, 7]}


def _inputs(spec, seed):
  rng = np.random.default_rng(seed)
  num_layers = spec.num_layers
  mask = np.arange(num_layers) % 2 == 0
  mask[-1] = True
  tau = rng.integers(1, 5, size=num_layers) * 10
  prev_d = rng.uniform(size=num_layers).astype(np.float32)
  prev_g = _random_params(rng, PARAM_SHAPES)
  return mask, tau, prev_d, prev_g


@functools.lru_cache(maxsize=None)
def _masked_mean_fn(granularity, jit):
  """One (jitted) function per granularity, so compiled programs are reused."""
  spec = layers.layer_spec(PARAM_SHAPES, granularity)
  fn = lambda *a: layer_sync.layer_masked_mean(*a, spec.leaf_to_layer)
  return jax.jit(fn) if jit else fn


def _call(spec, stacked, weights, mask, tau, prev_d, prev_g, jit=True):
  fn = _masked_mean_fn(spec.granularity, jit)
  return fn(stacked, jnp.asarray(weights, jnp.float32), mask, tau, prev_d,
            prev_g)


@pytest.mark.parametrize("granularity", ("tensor", "module"))
@pytest.mark.parametrize("weights", sorted(WEIGHTS))
def test_matches_numpy_reference(granularity, weights):
  spec = layers.layer_spec(PARAM_SHAPES, granularity)
  stacked = _stacked(1)
  mask, tau, prev_d, prev_g = _inputs(spec, 2)
  new_x, new_u, d = _call(spec, stacked, WEIGHTS[weights], mask, tau, prev_d,
                          prev_g)
  ref_x, ref_u, ref_d = _np_reference(stacked, WEIGHTS[weights], mask, tau,
                                      prev_d, prev_g, spec.leaf_to_layer)
  assert d.dtype == jnp.float32 and d.shape == (spec.num_layers,)
  np.testing.assert_allclose(d, ref_d, rtol=2e-6)
  for got, want in zip(jax.tree.leaves(new_x), ref_x):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  for got, want in zip(jax.tree.leaves(new_u), ref_u):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("granularity", ("tensor", "module"))
def test_unsynced_layers_untouched_bit_for_bit(granularity):
  spec = layers.layer_spec(PARAM_SHAPES, granularity)
  stacked = _stacked(3)
  mask, tau, prev_d, prev_g = _inputs(spec, 4)
  new_x, new_u, d = _call(spec, stacked, WEIGHTS["examples"], mask, tau,
                          prev_d, prev_g)
  triples = zip(jax.tree.leaves(stacked),
                jax.tree.leaves(new_x),
                spec.leaf_to_layer)
  for (old, new, l), u_old, u_new in zip(triples,
                                         jax.tree.leaves(prev_g),
                                         jax.tree.leaves(new_u)):
    if mask[l]:
      assert np.all(np.asarray(new) == np.asarray(new)[0])  # all rows = mean
      np.testing.assert_array_equal(np.asarray(new)[0], u_new)
    else:
      np.testing.assert_array_equal(new, old)
      np.testing.assert_array_equal(u_new, u_old)
  np.testing.assert_array_equal(np.asarray(d)[~mask], prev_d[~mask])


def test_padded_client_changes_nothing():
  spec = layers.layer_spec(PARAM_SHAPES, "module")
  mask, tau, prev_d, prev_g = _inputs(spec, 5)
  real = _stacked(6)
  weights = np.array(WEIGHTS["examples"] + [0.0])

  def with_row(value):
    return jax.tree.map(
        lambda x: np.concatenate([x, np.full((1,) + x.shape[1:], value,
                                             np.float32)]), real)

  outs = [_call(spec, with_row(v), weights, mask, tau, prev_d, prev_g)
          for v in (np.nan, np.inf, 1e30, 0.0)]
  garbage, *others = outs
  for other in others:
    for a, b in zip(jax.tree.leaves(garbage[1:]),
                    jax.tree.leaves(other[1:])):
      np.testing.assert_array_equal(a, b)  # new_global and d: bit for bit
    for a, b in zip(jax.tree.leaves(garbage[0]),
                    jax.tree.leaves(other[0])):
      np.testing.assert_array_equal(np.asarray(a)[:-1], np.asarray(b)[:-1])
  # The padded row: the mean where synced, its own (garbage) value elsewhere.
  for x, l in zip(jax.tree.leaves(garbage[0]), spec.leaf_to_layer):
    x = np.asarray(x)
    if mask[l]:
      np.testing.assert_array_equal(x[-1], x[0])
    else:
      assert np.all(np.isnan(x[-1]))
  # And the result equals the run without the padded client.
  unpadded = _call(spec, real, weights[:-1], mask, tau, prev_d, prev_g)
  for a, b in zip(jax.tree.leaves(garbage[1:]),
                  jax.tree.leaves(unpadded[1:])):
    np.testing.assert_allclose(a, b, rtol=1e-6)


@pytest.mark.parametrize("weights", sorted(WEIGHTS))
def test_all_synced_equals_weighted_mean(weights):
  spec = layers.layer_spec(PARAM_SHAPES)
  stacked = _stacked(7)
  _, tau, prev_d, prev_g = _inputs(spec, 8)
  mask = np.ones(spec.num_layers, bool)
  w = jnp.asarray(WEIGHTS[weights], jnp.float32)
  for jit in (True, False):  # compared within one mode: XLA may fuse
    # (and so round) a jitted program differently from op-by-op execution.
    new_x, new_u, _ = _call(spec, stacked, w, mask, tau, prev_d, prev_g, jit)
    fn = jax.jit(reduce.weighted_mean) if jit else reduce.weighted_mean
    mean = fn(stacked, w)
    for m, u, x in zip(jax.tree.leaves(mean),
                       jax.tree.leaves(new_u),
                       jax.tree.leaves(new_x)):
      np.testing.assert_array_equal(m, u)
      np.testing.assert_array_equal(np.broadcast_to(m, x.shape), x)


def test_weighted_mean_known_answer():
  stacked = {"a": jnp.array([[1.0, 2.0], [3.0, 6.0]]),
             "b": jnp.array([4.0, 8.0])}
  mean = reduce.weighted_mean(stacked, jnp.array([1.0, 3.0]))
  np.testing.assert_allclose(mean["a"], [2.5, 5.0])
  np.testing.assert_allclose(mean["b"], [7.0])


def test_discrepancy_known_answer():
  """Two clients, one 2-scalar layer: d = (1/2)(1 + 1 + 4 + 4) / (10 * 2)."""
  stacked = {"w": jnp.array([[0.0, 2.0], [2.0, 6.0]])}
  _, u, d = layer_sync.layer_masked_mean(
      stacked, jnp.ones(2), jnp.array([True]), jnp.array([10]),
      jnp.zeros(1), {"w": jnp.zeros(2)}, np.array([0]))
  np.testing.assert_allclose(u["w"], [1.0, 4.0])
  np.testing.assert_allclose(d, [0.25])


def test_jit_matches_eager():
  spec = layers.layer_spec(PARAM_SHAPES, "module")
  stacked = _stacked(9)
  args = (WEIGHTS["examples"],) + _inputs(spec, 10)
  eager = _call(spec, stacked, *args, jit=False)
  jitted = _call(spec, stacked, *args, jit=True)
  for a, b in zip(jax.tree.leaves(eager),
                  jax.tree.leaves(jitted)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_errors():
  spec = layers.layer_spec(PARAM_SHAPES)
  stacked = _stacked(11)
  mask, tau, prev_d, prev_g = _inputs(spec, 12)
  w = np.ones(NUM_CLIENTS)
  call = layer_sync.layer_masked_mean
  with pytest.raises(ValueError, match="leaf_to_layer"):
    call(stacked, w, mask, tau, prev_d, prev_g, spec.leaf_to_layer[:-1])
  with pytest.raises(ValueError, match="leaf_to_layer"):
    call(stacked, w, mask, tau, prev_d, prev_g, spec.leaf_to_layer + 1)
  with pytest.raises(ValueError, match="weights"):
    call(stacked, np.ones(3), mask, tau, prev_d, prev_g, spec.leaf_to_layer)
  with pytest.raises(ValueError, match="prev_global"):
    call(stacked, w, mask, tau, prev_d, {"x": 1}, spec.leaf_to_layer)
  with pytest.raises(ValueError, match="shape"):
    call(stacked, w, mask[:-1], tau, prev_d, prev_g, spec.leaf_to_layer)
  with pytest.raises(ValueError, match="weights"):
    reduce.weighted_mean(stacked, np.ones((NUM_CLIENTS, 1)))


_SHARDED_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from fedjax_lama.fedlama import layer_sync
    assert jax.device_count() == 4, jax.devices()
    rng = np.random.default_rng(0)
    stacked = {"a": rng.normal(size=(8, 3, 5)).astype(np.float32),
               "b": rng.normal(size=(8, 7)).astype(np.float32)}
    glob = {"a": np.zeros((3, 5), np.float32), "b": np.zeros(7, np.float32)}
    w = np.array([1, 2, 3, 4, 0, 1, 2, 0], np.float32)
    args = (w, np.array([True, False]), np.array([10, 20]),
            np.array([0.5, 0.25], np.float32), glob)
    fn = jax.jit(lambda s, *a: layer_sync.layer_masked_mean(
        s, *a, np.array([0, 1])))
    mesh = Mesh(np.array(jax.devices()), ("clients",))
    shard = NamedSharding(mesh, P("clients"))
    sharded = jax.device_put(stacked, shard)
    w_sharded = jax.device_put(w, shard)
    out = fn(sharded, w_sharded, *args[1:])
    want = fn(stacked, *args)
    for a, b in zip(jax.tree.leaves(out),
                    jax.tree.leaves(want)):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert out[0]["a"].sharding.is_equivalent_to(shard, 3)
    print("SHARDED_OK")
""")


def test_sharded_client_axis_matches_single_device():
  """Clients sharded over 4 fake CPU devices give the same result."""
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
             JAX_PLATFORMS="cpu")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run([sys.executable, "-c", _SHARDED_SCRIPT], cwd=root,
                        env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "SHARDED_OK" in proc.stdout
