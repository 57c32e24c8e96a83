"""An algorithm's `report` reaches the run: its scalars are written into each round's record
of metrics.jsonl, and the run evaluates the params it names (FedExP's average of the last
two iterates); the default report evaluates the server's params and adds nothing."""
import json
import os

import jax
import numpy as np

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
