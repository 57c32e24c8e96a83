"""FedPer, FedRep, LG-FedAvg and FedBN (algorithms/layer_partition.py) against numpy
references of their papers' rounds, their reductions to FedAvg, their traffic, the exact
resume of the personal rows (device and host stores) and their refusals.

The references run the two-client least-squares problem of test_algorithm_reference with
a model that has a body and a head: f_i(W, v) = 0.5 ||A_i W v - b_i||^2, W [2, 2] the body
("Dense_0"), v [2] the head ("Dense_1").
"""
import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lama import algorithms, training
from fedjax_lama import config as config_lib
from fedjax_lama.engine import personal_eval, sharding, traffic as traffic_lib
from fedjax_lama.errors import ConfigError, HparamError
from tests import test_algorithm_contract as contract
from tests import test_algorithm_reference as ref
from tests import test_personal_eval, test_sharding as helpers

A, B, ETA, P, N = ref.A, ref.B, ref.ETA, ref.P, ref.N
W0 = np.array([[0.5, -0.2], [0.1, 0.3]])
V0 = np.array([0.4, -0.6])
TWO_LAYERS = {"Dense_0": {"kernel": W0}, "Dense_1": {"kernel": V0}}
ATOL = 1e-12


def two_layer_loss(params, model_state, x, y, example_mask, key):
  """0.5 sum_j (a_j W v - b_j)^2 over the batch rows."""
  del key
  r = x @ params["Dense_0"]["kernel"] @ params["Dense_1"]["kernel"] - y
  return 0.5 * jnp.sum(example_mask * r * r), (model_state, jnp.zeros(()))


def grads(i, w, v):
  """(d/dW, d/dv) of f_i at (W, v)."""
  r = A[i] @ w @ v - B[i]
  return np.outer(A[i].T @ r, v), w.T @ A[i].T @ r


def build(name, **hparams):
  return ref.build(name, **hparams)


def run(alg, rounds, **kw):
  return ref.engine(alg, rounds, x0=TWO_LAYERS, loss=two_layer_loss, **kw)


def _bits(tree):
  return [np.asarray(x).tobytes() for x in jax.tree.leaves(tree)]


# ---- numpy references ----------------------------------------------------------------------
def ref_partition(rounds, personal_head, participants=((0, 1),) * 3, steps=2, head_steps=None):
  """The shared layer averaged over the round's clients, the personal one kept per client.

  personal_head: the head v is personal (FedPer, FedRep) or the body W (LG-FedAvg).
  head_steps: FedRep's split (the first head_steps steps move v only, the rest W only);
  None: every step moves both (FedPer, LG-FedAvg)."""
  w, v = W0.copy(), V0.copy()
  own = [(V0 if personal_head else W0).copy() for _ in range(N)]
  for r in range(rounds):
    moves = []
    for i in participants[r]:
      wi, vi = (w.copy(), own[i].copy()) if personal_head else (own[i].copy(), v.copy())
      for k in range(steps):
        gw, gv = grads(i, wi, vi)
        move_w = head_steps is None or k >= head_steps
        move_v = head_steps is None or k < head_steps
        wi, vi = wi - ETA * gw * move_w, vi - ETA * gv * move_v
      if personal_head:
        moves.append(wi - w)
        own[i] = vi
      else:
        moves.append(vi - v)
        own[i] = wi
    mean = sum(moves) / len(moves)  # uniform weights over the round's participants
    if personal_head:
      w = w + mean
    else:
      v = v + mean
  return w, v, np.stack(own)


@pytest.mark.parametrize("participants", [pytest.param(((0, 1),) * 3, marks=pytest.mark.slow),
                                          ((0, 1), (1,), (0, 1))])
def test_fedper_matches_its_rounds(participants):
  w, v, heads = ref_partition(3, True, participants)
  server, rows = run(build("fedper"), 3, participants=participants)
  np.testing.assert_allclose(server.params["Dense_0"]["kernel"], w, atol=ATOL)
  # The server's copy of the head is never updated; each client's is in its row.
  np.testing.assert_array_equal(server.params["Dense_1"]["kernel"], V0)
  np.testing.assert_allclose(rows["params"]["Dense_1"]["kernel"], heads, atol=ATOL)
  assert set(rows["params"]) == {"Dense_1"}


def test_lg_fedavg_matches_its_rounds():
  w, v, bodies = ref_partition(3, False)
  server, rows = run(build("lg_fedavg"), 3)   # default: every layer but the head
  np.testing.assert_allclose(server.params["Dense_1"]["kernel"], v, atol=ATOL)
  np.testing.assert_array_equal(server.params["Dense_0"]["kernel"], W0)
  np.testing.assert_allclose(rows["params"]["Dense_0"]["kernel"], bodies, atol=ATOL)


@pytest.mark.parametrize("head_steps", [pytest.param(0, marks=pytest.mark.slow), 2,
                                        pytest.param(3, marks=pytest.mark.slow)])
def test_fedrep_moves_the_head_then_the_body(head_steps):
  w, v, heads = ref_partition(2, True, steps=3, head_steps=head_steps)
  server, rows = run(build("fedrep", head_steps=head_steps), 2, steps=(3, 3))
  np.testing.assert_allclose(server.params["Dense_0"]["kernel"], w, atol=ATOL)
  np.testing.assert_allclose(rows["params"]["Dense_1"]["kernel"], heads, atol=ATOL)
  if head_steps == 3:  # every step is a head step: the body never moves
    np.testing.assert_array_equal(server.params["Dense_0"]["kernel"], W0)


def test_fedrep_with_momentum_keeps_each_part_s_momentum_to_its_own_steps():
  """Head and body run as two optimizers: heavy ball beta on the head's steps, then a fresh
  momentum on the body's steps (none of the head phase's gradients carried over)."""
  beta, steps, head_steps = 0.5, 4, 2
  w, v = W0.copy(), V0.copy()
  moves, heads = [], []
  for i in range(N):
    wi, vi, mw, mv = w.copy(), v.copy(), np.zeros_like(w), np.zeros_like(v)
    for k in range(steps):
      gw, gv = grads(i, wi, vi)
      if k < head_steps:
        mv = beta * mv + gv
        vi = vi - ETA * mv
      else:
        mw = beta * mw + gw
        wi = wi - ETA * mw
    moves.append(wi - w)
    heads.append(vi)
  alg = ref.build("fedrep", common=ref.Common(local_momentum=beta), head_steps=head_steps)
  server, rows = run(alg, 1, steps=(steps, steps))
  np.testing.assert_allclose(server.params["Dense_0"]["kernel"], w + sum(moves) / N, atol=ATOL)
  np.testing.assert_allclose(rows["params"]["Dense_1"]["kernel"], np.stack(heads), atol=ATOL)


# FedBN: a "normalization layer" BatchNorm_0 (a scale s and running statistics of the input)
# in front of a linear layer w: prediction ((a - running mean) * s) . w.
BN_PARAMS = {"BatchNorm_0": {"scale": np.array([1.0, 0.5])}, "Dense_0": {"kernel": V0}}
BN_STATS = {"BatchNorm_0": {"mean": np.zeros(2), "var": np.ones(2)}}
MOMENTUM = 0.9


def bn_loss(params, model_state, x, y, example_mask, key):
  del key
  stats = model_state["BatchNorm_0"]
  z = (x - stats["mean"]) * params["BatchNorm_0"]["scale"]
  r = z @ params["Dense_0"]["kernel"] - y
  count = jnp.sum(example_mask)
  batch_mean = jnp.sum(example_mask[:, None] * x, 0) / count
  batch_var = jnp.sum(example_mask[:, None] * (x - batch_mean) ** 2, 0) / count
  new = {"BatchNorm_0": {"mean": MOMENTUM * stats["mean"] + (1 - MOMENTUM) * batch_mean,
                         "var": MOMENTUM * stats["var"] + (1 - MOMENTUM) * batch_var}}
  return 0.5 * jnp.sum(example_mask * r * r), (new, jnp.zeros(()))


def test_fedbn_keeps_normalization_layers_and_statistics_local():
  w, s0 = V0.copy(), BN_PARAMS["BatchNorm_0"]["scale"]
  own = [(s0.copy(), np.zeros(2), np.ones(2)) for _ in range(N)]
  for _ in range(3):
    moves = []
    for i in range(N):
      wi, (si, mi, vi) = w.copy(), own[i]
      for _ in range(ref.K):
        z = A[i] - mi
        r = (z * si) @ wi - B[i]
        gw, gs = (z * si).T @ r, (z.T @ r) * wi
        wi, si = wi - ETA * gw, si - ETA * gs
        mi = MOMENTUM * mi + (1 - MOMENTUM) * A[i].mean(0)
        vi = MOMENTUM * vi + (1 - MOMENTUM) * ((A[i] - A[i].mean(0)) ** 2).mean(0)
      moves.append(wi - w)
      own[i] = (si, mi, vi)
    w = w + sum(moves) / N
  server, rows = ref.engine(build("fedbn"), 3, x0=BN_PARAMS, loss=bn_loss, model_state=BN_STATS)
  np.testing.assert_allclose(server.params["Dense_0"]["kernel"], w, atol=ATOL)
  np.testing.assert_array_equal(server.params["BatchNorm_0"]["scale"], s0)
  np.testing.assert_allclose(rows["params"]["BatchNorm_0"]["scale"],
                             np.stack([o[0] for o in own]), atol=ATOL)
  np.testing.assert_allclose(rows["batch_stats"]["BatchNorm_0"]["mean"],
                             np.stack([o[1] for o in own]), atol=ATOL)
  np.testing.assert_allclose(rows["batch_stats"]["BatchNorm_0"]["var"],
                             np.stack([o[2] for o in own]), atol=ATOL)
  # The server's statistics (the global model's) are the round's mean of the clients'.
  np.testing.assert_allclose(server.model_state["BatchNorm_0"]["mean"],
                             np.mean([o[1] for o in own], 0), atol=ATOL)


# ---- what each client is served ---------------------------------------------------------
def test_serve_gives_the_shared_layers_with_the_client_s_own():
  alg = build("fedbn")
  server, rows = ref.engine(alg, 2, x0=BN_PARAMS, loss=bn_loss, model_state=BN_STATS)
  for i in range(N):
    row = jax.tree.map(lambda a, i=i: a[i], rows)
    params, stats = alg.serve(server, row, None)
    np.testing.assert_array_equal(params["Dense_0"]["kernel"], server.params["Dense_0"]["kernel"])
    np.testing.assert_array_equal(params["BatchNorm_0"]["scale"],
                                  rows["params"]["BatchNorm_0"]["scale"][i])
    np.testing.assert_array_equal(stats["BatchNorm_0"]["mean"],
                                  rows["batch_stats"]["BatchNorm_0"]["mean"][i])


# ---- reductions to FedAvg, bit for bit -----------------------------------------------------
PARTIAL = ((0, 1), (1,), (0, 1))


@functools.lru_cache(maxsize=None)
def _fedavg_with_partial_participation():
  return run(build("fedavg"), 3, participants=PARTIAL)[0]


@pytest.mark.parametrize("name, hparams", [("fedper", {"personal_layers": "none"}),
                                           ("lg_fedavg", {"personal_layers": "none"}),
                                           ("fedrep", {"personal_layers": "none",
                                                       "head_steps": 0}),
                                           ("fedbn", {})])  # the model has no normalization
def test_nothing_personal_is_fedavg_bitwise(name, hparams):
  want = _fedavg_with_partial_participation()
  got, rows = run(build(name, **hparams), 3, participants=PARTIAL)
  assert rows == {}  # no row, no store
  assert _bits(got.params) == _bits(want.params)


# ---- traffic ----------------------------------------------------------------------------
@pytest.mark.parametrize("name, personal", [("fedper", "Dense_1"), ("fedrep", "Dense_1"),
                                            ("lg_fedavg", "Dense_0")])
def test_only_the_shared_layers_travel(name, personal):
  alg = build(name)
  params = jax.tree.map(jnp.asarray, TWO_LAYERS)
  t = traffic_lib.traffic(alg, alg.server.init(params, {}), alg.row_init(params))
  d = sum(np.size(x) for x in jax.tree.leaves(params))
  d_personal = np.size(TWO_LAYERS[personal]["kernel"])
  assert int(t.up_per_leaf.sum()) == int(t.down_per_leaf.sum()) == d - d_personal
  assert traffic_lib.uplink_bits(t, None) == 32 * (d - d_personal)


# ---- refusals ---------------------------------------------------------------------------
def test_a_wrong_layer_name_stops_listing_the_model_s_layers():
  alg = build("fedper", personal_layers="Dense_1, Head")
  params = jax.tree.map(jnp.asarray, TWO_LAYERS)
  with pytest.raises(ConfigError, match=r"fedper\.personal_layers='Dense_1, Head': 'Head' is "
                     r"not a layer of the model; accepted: .*\(Dense_0, Dense_1\)"):
    alg.row_init(params)


def test_a_model_without_a_dense_head_needs_named_layers():
  alg = build("fedrep")
  with pytest.raises(ConfigError, match=r"fedrep\.personal_layers=''.*finds no top-level "
                     r"Dense_<n> module; name the layers, one of: w"):
    alg.row_init({"w": jnp.zeros(2)})


@pytest.mark.parametrize("name, field, value", [
    ("fedrep", "head_steps", -1), ("fedbn", "norm_layers", " , ")])
def test_bad_hyper_parameters_name_the_field(name, field, value):
  c = config_lib.base_config()
  c.algorithm = name
  c[name][field] = value
  with pytest.raises(ConfigError, match=rf"config\.{name}\.{field}="):
    config_lib.validate(c)


@pytest.mark.parametrize("name, field, value", [
    ("fedrep", "head_steps", 1.5), ("fedrep", "head_steps", True),
    ("fedper", "personal_layers", 3), ("lg_fedavg", "personal_layers", None)])
def test_values_of_the_wrong_type_are_refused(name, field, value):
  with pytest.raises(HparamError, match=rf"^{field}={value!r} is not accepted; accepted: "):
    algorithms.build(name, **{field: value})


def test_fedbn_under_the_fedlama_schedule_is_refused():
  c = config_lib.base_config()
  c.algorithm, c.schedule = "fedbn", "fedlama"
  with pytest.raises(ConfigError, match=r"config\.schedule='fedlama' cannot run "
                     r"config\.algorithm='fedbn': its normalization statistics stay on the "
                     r"clients"):
    config_lib.validate(c)


def test_fedrep_refuses_a_carried_local_optimizer_state():
  c = config_lib.base_config()
  c.algorithm, c.schedule, c.local_optimizer_state = "fedrep", "fedlama", "carry"
  with pytest.raises(ConfigError, match=r"config\.local_optimizer_state='carry' is not "
                     r"accepted with config\.algorithm='fedrep'"):
    config_lib.validate(c)


def test_fedlama_needs_one_cohort_per_window_for_a_personal_start():
  c = helpers.tiny_config(algorithm="fedper", schedule="fedlama", active_ratio=0.25)
  c.fedper.personal_layers = "none"  # no rows at all: the start alone needs the window's cohort
  c.fedlama.client_sampling = "round"
  with pytest.raises(ConfigError, match=r"fedlama\.client_sampling='round'.*fedper"):
    helpers.build(c, sharding.client_mesh(jax.devices()[:1]))


@pytest.mark.slow
def test_fedlama_over_fedper_never_synchronises_the_head():
  """phi = 2: the body's layers follow FedLAMA's intervals, the head never leaves a client
  (no synchronisation, no traffic) and each client's head is in its row."""
  c = helpers.tiny_config(algorithm="fedper", schedule="fedlama", active_ratio=0.25, rounds=3)
  c.fedlama.total_steps = 3 * c.fedlama.phi * c.fedlama.base_interval
  program = helpers.build(c, sharding.client_mesh(jax.devices()[:1]))
  state, outs = helpers.run(program)
  names = list(program.spec.names)
  head = [names.index("Dense_1/bias"), names.index("Dense_1/kernel")]
  counts = np.asarray(state["fedlama"].sync_counts)
  assert np.all(counts[head] == 0) and np.all(np.delete(counts, head) > 0)
  for out in outs:
    assert np.all(out.floats_up_per_layer[head] == 0)
    assert np.all(out.floats_down_per_layer[head] == 0)
    assert np.all(np.delete(out.floats_up_per_layer, head) > 0)
  server = state["fedlama"].server
  assert _bits(server.params["Dense_1"]) == _bits(program.params["Dense_1"])
  heads = program.store.to_numpy()["params"]["Dense_1"]["kernel"]
  sampled = sorted({int(i) for r in range(3) for i in program.opts.sampler.sample(r)})
  assert len({heads[i].tobytes() for i in sampled}) == len(sampled)  # each its own head


# ---- runs with a batch-normalized model: resume and chunking ---------------------------------
class TinyBN(nn.Module):
  """Dense, BatchNorm, relu, Dense: FedBN's normalization layer and statistics."""

  @nn.compact
  def __call__(self, x, train=False):
    x = nn.Dense(8)(x.reshape((x.shape[0], -1)))
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
    return nn.Dense(3)(nn.relu(x))


MESH = sharding.client_mesh(jax.devices()[:1])


def _program(name, **overrides):
  config = helpers.tiny_config(**{"active_ratio": 0.25, "rounds": 3, **overrides})
  config.algorithm = name
  fed = helpers.tiny_federation()
  model = TinyBN()
  variables = model.init(jax.random.PRNGKey(config.seed), fed.dataset.train_x[:1])
  return training.build_program(config, model, variables["params"], variables["batch_stats"],
                                fed, MESH)


@pytest.mark.parametrize("on_host", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_fedbn_rows_resume_exactly_and_chunks_change_nothing(tmp_path, on_host):
  program = _program("fedbn", **{"engine.client_state_on_host": on_host})
  run = contract.run_resumed(program, tmp_path)
  straight, resumed = run["straight"], run["resumed"]
  assert _bits(resumed) == _bits(straight)
  server, rows = straight
  # The rows hold the BatchNorm layer's scale and bias and its running statistics; the
  # server's BatchNorm parameters never move (they are not exchanged).
  assert set(rows) == {"params", "batch_stats"}
  assert set(rows["params"]) == set(rows["batch_stats"]) == {"BatchNorm_0"}
  fresh = program.init_state()["server"]
  assert _bits(server.params["BatchNorm_0"]) == _bits(
      jax.tree.map(np.asarray, fresh.params["BatchNorm_0"]))
  assert not np.allclose(server.params["Dense_0"]["kernel"],
                         np.asarray(fresh.params["Dense_0"]["kernel"]))
  sampled = {int(i) for r in range(3) for i in program.opts.sampler.sample(r)}
  means = rows["batch_stats"]["BatchNorm_0"]["mean"]
  assert all(np.any(means[i] != 0) for i in sampled)
  assert all(np.all(means[i] == 0) for i in set(range(helpers.NUM_CLIENTS)) - sampled)
  if not on_host:
    chunked = _program("fedbn", **{"engine.clients_per_chunk": 3})
    assert chunked.chunk_size == 3
    state, _ = helpers.run(chunked)
    chex.assert_trees_all_close(contract._server_and_rows(chunked, state), straight,
                                rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fedper", "fedrep", "lg_fedavg"])
def test_personal_rows_resume_exactly_on_a_host_store(tmp_path, name):
  program = _program(name, **{"engine.client_state_on_host": True})
  run = contract.run_resumed(program, tmp_path)
  straight, resumed = run["straight"], run["resumed"]
  assert _bits(resumed) == _bits(straight)


def test_fedlama_counts_the_shared_tensors_of_a_partly_personal_module():
  """Module granularity, the head's kernel personal and its bias shared: the module is never
  relaxed, its bias synchronises and is counted, its kernel never."""
  c = helpers.tiny_config(algorithm="fedper", schedule="fedlama", active_ratio=0.25, rounds=2)
  c.fedper.personal_layers = "Dense_1/kernel"
  c.fedlama.layer_granularity = "module"
  c.fedlama.total_steps = 2 * c.fedlama.phi * c.fedlama.base_interval
  program = helpers.build(c, sharding.client_mesh(jax.devices()[:1]))
  state, outs = helpers.run(program)
  assert list(program.spec.names) == ["Dense_0", "Dense_1"]
  assert np.all(np.asarray(state["fedlama"].sync_counts) > 0)
  leaves = ["Dense_0/bias", "Dense_0/kernel", "Dense_1/bias", "Dense_1/kernel"]
  for out in outs:
    per_leaf = dict(zip(leaves, out.floats_up_per_layer))
    assert per_leaf["Dense_1/kernel"] == 0 and per_leaf["Dense_1/bias"] > 0
  heads = program.store.to_numpy()["params"]["Dense_1"]
  assert set(heads) == {"kernel"}


@pytest.mark.slow
def test_per_client_evaluation_under_fedlama_serves_each_client_its_head(tmp_path):
  """Through train_and_evaluate with the FedLAMA schedule: the evaluator reads the schedule's
  server state and rows, and each client's model is its own head on the shared body (the
  global model's head stays as initialised, so the two differ)."""
  config = test_personal_eval._tiny(algorithm="fedper", schedule="fedlama", active_ratio=1.0)
  summary = training.train_and_evaluate(config, str(tmp_path))
  personal = summary[personal_eval.metric_name("personal", "mean")]
  assert personal > summary[personal_eval.metric_name("global", "mean")] + 0.2
