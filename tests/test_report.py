"""An algorithm's `report` reaches the run: its scalars are written into each round's record
of metrics.jsonl, and the run evaluates the params it names (FedExP's average of the last
two iterates); the default report evaluates the server's params and adds nothing."""
import json
import os

import jax
import numpy as np
import pytest

from fedjax_lama import training
from tests import test_sharding as helpers
from tests.test_algorithm_contract import MESH
from tests.test_training import tiny_config


def test_fedexp_logs_its_server_step_in_metrics(tmp_path):
  config = tiny_config(algorithm="fedexp", rounds=2, eval_every=1)
  training.train_and_evaluate(config, str(tmp_path))
  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert [r["round"] for r in rows] == [1, 2]
  for row in rows:
    assert row["fedexp_eta_g"] >= 1.0  # eta_g = max(1, ...)
  fedavg_dir = tmp_path / "fedavg"
  training.train_and_evaluate(tiny_config(rounds=1, eval_every=1),
                              str(fedavg_dir))
  with open(fedavg_dir / "metrics.jsonl") as f:
    assert not any(k.startswith("fedexp") for k in json.loads(f.readline()))


def test_programs_evaluate_the_reported_params():
  config = helpers.tiny_config(algorithm="fedexp")
  config.fedexp.eval_average_last_two = True
  program = helpers.build(config, MESH)
  state, outs = helpers.run(program)
  server = state["server"]
  evaluated, _ = program.eval_params(state)
  for a, x, previous in zip(jax.tree.leaves(evaluated), jax.tree.leaves(server.params),
                            jax.tree.leaves(server.extra["previous"])):
    np.testing.assert_allclose(np.asarray(a), (np.asarray(x) + np.asarray(previous)) / 2,
                               rtol=1e-6)
  assert not np.array_equal(np.asarray(jax.tree.leaves(evaluated)[0]),
                            np.asarray(jax.tree.leaves(server.params)[0]))
  assert outs[-1].extra["fedexp_eta_g"] == float(server.extra["eta_g"])
  plain = helpers.build(helpers.tiny_config(algorithm="fedavg"), MESH)
  plain_state, plain_outs = helpers.run(plain)
  assert plain.eval_params(plain_state)[0] is plain_state["server"].params
  assert set(plain_outs[-1].extra) == {"clients"}


@pytest.mark.slow
def test_vectorized_runs_report_each_runs_scalars_and_params():
  """The vectorized program reports per run what each run's own program reports."""
  from fedjax_lama.programs.vectorized import VectorizedSyncProgram  # pylint: disable=g-import-not-at-top
  from tests import test_vectorized as vectorized  # pylint: disable=g-import-not-at-top
  configs = [vectorized._config("fedexp", s, lr) for s, lr in vectorized.RUNS[:2]]  # pylint: disable=protected-access
  for c in configs:
    c.fedexp.eval_average_last_two = True
  pieces = [vectorized._pieces(c) for c in configs]  # pylint: disable=protected-access
  sequential = []
  for c, p in zip(configs, pieces):
    program = helpers.build(c, MESH, fed=p[2])
    state, outs = helpers.run(program)
    sequential.append(([o.extra["fedexp_eta_g"] for o in outs], program.eval_params(state)[0]))
  opts = [training.run_options(c, p[2]) for c, p in zip(configs, pieces)]
  algo = training.build_program(configs[0], *pieces[0][:2], {}, pieces[0][2], MESH).algorithm
  vec = VectorizedSyncProgram(opts, algo, pieces[0][0], [p[1] for p in pieces], [{}] * 2,
                              [p[2] for p in pieces], MESH)
  state, etas = vec.init_state(), []
  for r in range(vec.num_rounds):
    state, outs = vec.run_round(state, r)
    etas.append([o.extra["fedexp_eta_g"] for o in outs])
  for i, (eta_seq, params_seq) in enumerate(sequential):
    np.testing.assert_allclose([e[i] for e in etas], eta_seq, rtol=2e-5)
    evaluated, _ = vec.eval_params(vec.run_state(state, i))
    for a, b in zip(jax.tree.leaves(evaluated), jax.tree.leaves(params_seq)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)
