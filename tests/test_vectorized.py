"""Runs differing in seed and learning rate, trained as one computation with a run axis, equal
the same runs trained one after another (issue 19, vectorized sweeps)."""
import chex
import jax
import numpy as np
import pytest

from fedjax_lama import training
from fedjax_lama.engine import sharding
from fedjax_lama.programs.vectorized import VectorizedSyncProgram
from tests import test_sharding as helpers

MESH = sharding.client_mesh(jax.devices()[:1])
RUNS = [(0, 0.1), (1, 0.1), (2, 0.05)]  # (seed, local lr)


def _config(algorithm, seed, lr, **overrides):
  c = helpers.tiny_config(algorithm=algorithm, seed=seed, local_lr=lr, rounds=3,
                          active_ratio=0.25, **overrides)
  return c


def _pieces(c):
  fed = helpers.tiny_federation(seed=c.seed)  # each seed its own partition of the data
  model = helpers.TinyMLP()
  params = model.init(jax.random.PRNGKey(c.seed), fed.dataset.train_x[:1])["params"]
  return model, params, fed


# fedsgd: one full-batch step, whose batch is each run's largest client (seeds differ).
# fedper: per-client rows that are only some layers, and a per-client start (Algorithm.start).
@pytest.mark.parametrize("algorithm", ["fedavg"] + [
    pytest.param(name, marks=pytest.mark.slow)
    for name in ("scaffold", "fedadam", "fedsgd", "fedper")])
def test_vectorized_runs_equal_sequential_runs(algorithm):
  configs = [_config(algorithm, s, lr) for s, lr in RUNS]
  sequential = []
  for c in configs:
    program = helpers.build(c, MESH, fed=_pieces(c)[2])
    state, outs = helpers.run(program)
    rows = program.store.to_numpy() if program.store is not None else {}
    sequential.append((state["server"], rows, [o.train_loss for o in outs]))

  pieces = [_pieces(c) for c in configs]
  opts = [training.run_options(c, p[2]) for c, p in zip(configs, pieces)]
  algo = training.build_program(configs[0], *pieces[0][:2], {}, pieces[0][2], MESH).algorithm
  vec = VectorizedSyncProgram(opts, algo, pieces[0][0], [p[1] for p in pieces], [{}] * 3,
                              [p[2] for p in pieces], MESH)
  state = vec.init_state()
  losses = []
  for r in range(vec.num_rounds):
    state, outs = vec.run_round(state, r)
    losses.append([o.train_loss for o in outs])
  for i, (server, rows, loss) in enumerate(sequential):
    run = vec.run_state(state, i)
    chex.assert_trees_all_close(run["server"], jax.tree.map(np.asarray, server),
                                rtol=2e-5, atol=2e-6)
    if rows:
      chex.assert_trees_all_close(run["rows"], rows, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose([l[i] for l in losses], loss, rtol=2e-5)
  # The runs really differ (different seeds and rates), so the comparison is not vacuous.
  assert not np.allclose(jax.tree.leaves(vec.run_state(state, 0)["server"].params)[0],
                         jax.tree.leaves(vec.run_state(state, 2)["server"].params)[0])


def test_runs_that_differ_in_more_than_seed_and_rate_are_refused():
  configs = [_config("fedavg", 0, 0.1), _config("fedavg", 1, 0.1, local_steps=3)]
  pieces = [_pieces(c) for c in configs]
  opts = [training.run_options(c, p[2]) for c, p in zip(configs, pieces)]
  algo = training.build_program(configs[0], *pieces[0][:2], {}, pieces[0][2], MESH).algorithm
  with pytest.raises(ValueError, match="local_steps"):
    VectorizedSyncProgram(opts, algo, pieces[0][0], [p[1] for p in pieces], [{}] * 2,
                          [p[2] for p in pieces], MESH)


def _records(workdir):
  import json  # pylint: disable=g-import-not-at-top
  with open(f"{workdir}/metrics.jsonl") as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow
def test_train_many_writes_what_train_and_evaluate_writes(tmp_path):
  from tests.test_training import tiny_config  # pylint: disable=g-import-not-at-top
  configs = [tiny_config(seed=s, local_lr=lr, validation_fraction=0.2) for s, lr in RUNS]
  vec_dirs = [str(tmp_path / f"vec{i}") for i in range(len(configs))]
  summaries = training.train_many(configs, vec_dirs)
  assert all(s["vectorized_runs"] == len(configs) for s in summaries)
  for i, c in enumerate(configs):
    seq = training.train_and_evaluate(c, str(tmp_path / f"seq{i}"))
    a, b = _records(vec_dirs[i]), _records(tmp_path / f"seq{i}")
    assert [r["round"] for r in a] == [r["round"] for r in b]
    for key in ("test_loss", "val_loss", "train_loss", "comm_floats_up", "comm_bytes"):
      np.testing.assert_allclose([r[key] for r in a], [r[key] for r in b], rtol=1e-4, err_msg=key)
    assert summaries[i]["final_test_accuracy"] == pytest.approx(seq["final_test_accuracy"],
                                                                abs=0.01)


def test_train_many_falls_back_to_one_after_another(tmp_path):
  from tests.test_training import tiny_config  # pylint: disable=g-import-not-at-top
  configs = [tiny_config(seed=0), tiny_config(seed=0, local_steps=2)]
  summaries = training.train_many(configs, [str(tmp_path / "a"), str(tmp_path / "b")])
  assert all("vectorized_runs" not in s for s in summaries)
