"""Per-client rows on device or on host: same results, untouched rows bit-for-bit."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fedjax_lama import checkpointing, federation
from fedjax_lama.engine import client_store, sharding
from tests import test_sharding as helpers

MESH = sharding.client_mesh(jax.devices()[:1])
N, C = 11, 4


def _rows():
  """Rows with values a float sum would not preserve: -0.0, NaN payloads, denormals."""
  rng = np.random.default_rng(0)
  w = rng.normal(size=(N, 3, 2)).astype(np.float32)
  w[0, 0, 0], w[1, 0, 0], w[2, 0, 0] = -0.0, np.nan, np.float32(1e-42)
  return {"w": w, "k": np.arange(N, dtype=np.int32)}


def _bits(tree):
  return jax.tree.map(lambda x: np.asarray(x).view(np.uint8).copy(), tree)


def _assert_bits_equal(a, b):
  jax.tree.map(np.testing.assert_array_equal, _bits(a), _bits(b))


def _new_rows(seed):
  rng = np.random.default_rng(seed)
  return {"w": rng.normal(size=(C, 3, 2)).astype(np.float32),
          "k": rng.integers(100, 200, size=C).astype(np.int32)}


@pytest.mark.parametrize("on_host", [False, True])
def test_gather_scatter_against_numpy(on_host):
  store = client_store.ClientStore(_rows(), MESH, on_host=on_host)
  ids, mask = np.array([7, 2, 9, 2]), np.array([1.0, 1.0, 1.0, 0.0])  # last slot padded
  got = store.gather(ids)
  _assert_bits_equal(got, jax.tree.map(lambda a: a[ids], _rows()))
  assert all(x.sharding.spec == sharding.clients_sharding(MESH).spec
             for x in jax.tree.leaves(got))
  new = _new_rows(1)
  store.scatter(ids, mask, jax.tree.map(jnp.asarray, new))
  expected = _rows()
  for k in expected:
    expected[k][ids[:3]] = new[k][:3]  # the padded slot (id 2 again) writes nothing
  _assert_bits_equal(store.to_numpy(), expected)
  if on_host:
    assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(store.rows))


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(0, N - 1), min_size=C, max_size=C, unique=True),
       st.lists(st.booleans(), min_size=C, max_size=C), st.integers(0, 2**31 - 1))
def test_host_and_device_stores_agree_and_leave_other_rows_alone(ids, mask, seed):
  ids, mask = np.array(ids), np.array(mask, np.float32)
  stores = [client_store.ClientStore(_rows(), MESH, on_host=h) for h in (False, True)]
  new = jax.tree.map(jnp.asarray, _new_rows(seed))
  for s in stores:
    s.scatter(ids, mask, new)
  device, host = (s.to_numpy() for s in stores)
  _assert_bits_equal(device, host)
  untouched = np.setdiff1d(np.arange(N), ids[mask > 0])
  _assert_bits_equal(jax.tree.map(lambda a: a[untouched], host),
                     jax.tree.map(lambda a: a[untouched], _rows()))
  _assert_bits_equal(jax.tree.map(lambda a: a[ids[mask > 0]], host),
                     jax.tree.map(lambda a: np.asarray(a)[mask > 0], new))


def test_create_broadcasts_one_row_and_loads_padded_rows():
  row = {"w": np.full((3, 2), 2.5, np.float32)}
  for on_host in (False, True):
    store = client_store.ClientStore.create(row, N, MESH, on_host=on_host)
    assert store.num_clients == N and store.nbytes == N * 6 * 4
    np.testing.assert_array_equal(store.to_numpy()["w"], np.full((N, 3, 2), 2.5))
  # Rows restored from a device store of a bigger mesh carry padding rows: dropped.
  padded = {"w": np.zeros((16, 3, 2), np.float32)}
  store = client_store.ClientStore(padded, MESH, on_host=True, num_clients=N)
  assert store.rows["w"].shape == (N, 3, 2)


def test_bad_input_is_named():
  with pytest.raises(ValueError, match="client_state_on_host"):
    client_store.ClientStore(_rows(), MESH, on_host="yes")
  with pytest.raises(ValueError, match="leading client axis"):
    client_store.ClientStore({"a": np.zeros((3, 2)), "b": np.zeros((4,))}, MESH)
  store = client_store.ClientStore(_rows(), MESH, on_host=True)
  with pytest.raises(ValueError, match="out of range"):
    store.scatter(np.array([0, 1, 2, N]), np.ones(C), _new_rows(0))


def _run_with_checkpoint(on_host, ckpt_dir):
  """4 rounds straight through (checkpointing after round 2), then rounds 3-4 again from the
  restored checkpoint, on one program."""
  config = helpers.tiny_config(rounds=4, active_ratio=0.25,
                               **{"engine.client_state_on_host": on_host,
                                  "engine.clients_per_chunk": 4})
  program = helpers.build(config, MESH, with_rows=True)
  state = program.init_state()
  initial = program.store.to_numpy()
  ckpt = checkpointing.Checkpointer(str(ckpt_dir))
  touched = set()
  for r in range(4):
    state, _ = program.run_round(state, r)
    touched |= set(program.opts.sampler.sample(r).tolist())
    if r == 1:
      ckpt.save(r, state, {"round": r})
  final = (jax.tree.map(np.asarray, state["server"].params), program.store.to_numpy())
  row_type = type(jax.tree.leaves(program.store.rows)[0])
  state, _ = ckpt.restore(1, program.init_state())
  ckpt.close()
  for r in range(2, 4):
    state, _ = program.run_round(state, r)
  resumed = (jax.tree.map(np.asarray, state["server"].params), program.store.to_numpy())
  return {"initial": initial, "final": final, "resumed": resumed, "touched": sorted(touched),
          "row_type": row_type}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  return {on_host: _run_with_checkpoint(on_host, tmp_path_factory.mktemp("ckpt"))
          for on_host in (False, True)}


def test_rows_live_where_the_config_says(runs):
  assert issubclass(runs[True]["row_type"], np.ndarray)
  assert issubclass(runs[False]["row_type"], jax.Array)


@pytest.mark.parametrize("on_host", [False, True])
def test_never_sampled_clients_keep_their_rows_bit_for_bit(runs, on_host):
  run = runs[on_host]
  rows = run["final"][1]
  never = np.setdiff1d(np.arange(helpers.NUM_CLIENTS), run["touched"])
  assert len(never) and len(run["touched"])
  _assert_bits_equal(jax.tree.map(lambda a: a[never], rows),
                     jax.tree.map(lambda a: a[never], run["initial"]))
  assert np.all(rows["n"][run["touched"]] > 0)  # every sampled client's row moved


@pytest.mark.parametrize("on_host", [False, True])
def test_rows_survive_a_checkpoint(runs, on_host):
  _assert_bits_equal(runs[on_host]["resumed"], runs[on_host]["final"])


def test_host_and_device_placement_give_identical_runs(runs):
  _assert_bits_equal(runs[True]["final"], runs[False]["final"])
