"""Nothing compiles after the first round: same shapes, dtypes and placements every round.

Each XLA compilation fires jax.monitoring's backend-compile event; the test
attributes every event to the round running when it fired (evaluation,
per-client evaluation and checkpointing after round r count as round r) and
requires rounds 2..N to compile nothing. Things that would break this: a Python
scalar passed as static, a weakly typed counter coming back strongly typed (or
the reverse), a state whose output placement differs from its input placement,
a cohort whose padded shape changes with the draw.
"""
import collections

import jax
import pytest

from configs import default, fedlama_digits
from fedjax_lama import training
from fedjax_lama.run import parts as parts_lib
from fedjax_lama.programs.sync import SyncProgram
from tests import test_sharding
from tests.conftest import counting_compilations

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileLog:
  """Backend compilations per round of a train_and_evaluate run (key -1: setup)."""

  def __init__(self, monkeypatch, algorithm=None):
    self.by_round = collections.defaultdict(list)
    self._round = -1
    build = parts_lib.program

    def counting_build(spec, parts, mesh=None):
      if algorithm is not None:
        opts = parts_lib.federated_options(spec.options, spec.data.augmentation, parts.fed)
        mesh = parts_lib.client_mesh(opts.batch_size, parts, parts_lib.chunk_cap(opts))
        program = SyncProgram(opts, algorithm, parts.model, parts.params, parts.model_state,
                              parts.fed, mesh)
      else:
        program = build(spec, parts, mesh)
      run_round = program.run_round

      def tracked(state, round_idx):
        self._round = round_idx
        return run_round(state, round_idx)

      program.run_round = tracked
      return program

    monkeypatch.setattr(parts_lib, "program", counting_build)

  def listener(self, event, duration, **kwargs):
    del duration
    if event == COMPILE_EVENT:
      self.by_round[self._round].append(kwargs.get("fun_name", "?"))

  def run(self, config, workdir):
    jax.monitoring.register_event_duration_secs_listener(self.listener)
    try:
      with counting_compilations():
        training.train_and_evaluate(config, workdir)
    finally:
      jax.monitoring.unregister_event_duration_listener(self.listener)
    return {r: names for r, names in self.by_round.items() if r >= 1}


def _sync_config(**overrides):
  c = default.get_config()
  c.rounds = 4
  c.local_steps = 3
  c.num_clients = 8
  c.eval_every = 1
  c.checkpoint_every = 1
  c.per_client_eval = "every"
  c.plots = False
  for k, v in overrides.items():
    if k.startswith("engine."):
      c.engine[k.split(".")[1]] = v
    else:
      c[k] = v
  return c


@pytest.mark.parametrize("overrides,with_rows", [
    ({}, False),
    # Several chunks a round, their number varying with the Bernoulli draw, and
    # per-client rows gathered and scattered on device.
    ({"client_sampling": "bernoulli", "active_ratio": 0.6, "engine.clients_per_chunk": 2}, True),
], ids=["fixed", "bernoulli_chunked_rows"])
def test_fedavg_compiles_only_in_round_one(tmp_path, monkeypatch, overrides, with_rows):
  log = CompileLog(monkeypatch, algorithm=test_sharding.row_algorithm() if with_rows else None)
  later = log.run(_sync_config(**overrides), str(tmp_path))
  assert any("train_chunk" in name for name in log.by_round[0]), log.by_round[0]
  assert later == {}, f"recompiled after round 1: {later}"


def test_fedlama_compiles_only_in_window_one(tmp_path, monkeypatch):
  c = fedlama_digits.get_config()
  c.num_clients = 8
  c.active_ratio = 0.5
  c.fedlama.base_interval = 2
  c.fedlama.total_steps = 16  # 4 windows of phi * tau' = 4 steps
  c.eval_every = 1
  c.checkpoint_every = 1
  c.per_client_eval = "every"
  c.plots = False
  log = CompileLog(monkeypatch)
  later = log.run(c, str(tmp_path))
  assert any("window" in name for name in log.by_round[0]), log.by_round[0]
  assert later == {}, f"recompiled after window 1: {later}"
