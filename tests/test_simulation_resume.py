"""Exact resume of the simulation (issue 18).

A run interrupted at arbitrary events, saved with `state_dict`, restored into a
fresh Simulator (fresh method, trainer, evaluator) and continued must equal the
uninterrupted run: event log, message log, tick records and final models.
"""
import copy
import dataclasses

import jax
import numpy as np
import pytest

from fedjax_lama.simulation import (ASOFed, ComputeModel, FedAsync, FedAT, FedATConfig, FedAvg,
                                    FedProx, NetworkModel, SystemConfig, TiFL, TiFLConfig)
from fedjax_lama.simulation.pytree import trees_equal
from fedjax_lama.simulation.testing import RoundingCodec, make_simulator

CONFIG = SystemConfig(
    num_clients=20, num_unstable=4, dropout_horizon_s=150.0, max_virtual_time_s=200.0,
    eval_interval_s=25.0, max_clients_per_call=7,
    compute_model=ComputeModel(kind="uniform", step_cost_range_s=(0.02, 0.06)),
    network_model=NetworkModel(kind="uniform", latency_range_down_s=(0.0, 0.3),
                               latency_range_up_s=(0.0, 0.3),
                               bandwidth_range_down_bytes_per_s=(20.0, 200.0),
                               bandwidth_range_up_bytes_per_s=(20.0, 200.0)))

METHODS = {
    "fedat": lambda: FedAT(FedATConfig(clients_per_round=3, compression_precision=2)),
    "fedat_reported": lambda: FedAT(FedATConfig(clients_per_round=3, cross_tier_set="reported")),
    "fedavg": lambda: FedAvg(),
    "fedprox": lambda: FedProx(),
    "tifl": lambda: TiFL(TiFLConfig(clients_per_round=3, tifl_interval=3)),
    "fedasync": lambda: FedAsync(),
    "asofed": lambda: ASOFed(),
}


def build(make_method):
  return make_simulator(CONFIG, make_method(), codec=RoundingCodec())


def outputs(sim):
  ticks = [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in t.items()
            if k != "wall_time"} for t in sim.ticks]
  return sim.event_log, sim.messages, ticks, sim.participation.tolist(), sim.stop_reason


def assert_plain(value, path="state"):
  """Only dicts with str keys, lists, numbers, strings, None and numpy arrays."""
  if isinstance(value, dict):
    for key, item in value.items():
      assert isinstance(key, str), f"{path}: key {key!r}"
      assert_plain(item, f"{path}.{key}")
  elif isinstance(value, list):
    for i, item in enumerate(value):
      assert_plain(item, f"{path}[{i}]")
  else:
    assert value is None or isinstance(value, (bool, int, float, str, np.ndarray, np.generic)), (
        f"{path}: {type(value).__name__}")


@pytest.mark.parametrize("name", list(METHODS))
def test_interrupted_then_resumed_equals_uninterrupted(name):
  reference = build(METHODS[name])
  assert reference.run()
  assert len(reference.ticks) == 9 and reference.method.global_updates > 5

  num_events = sum(1 for e in reference.event_log if e[0] >= 0)
  sim = build(METHODS[name])
  stops, job_states = 0, set()
  while not sim.run(max_events=max(1, num_events // 7) + stops):  # irregular stopping points
    state = copy.deepcopy(sim.state_dict())  # nothing may alias the live run
    assert_plain(state)
    job_states |= {job["status"] for job in state["jobs"]}
    stops += 1
    sim = build(METHODS[name])
    sim.load_state_dict(state)
  assert stops >= 5
  # Saved states held queued, trained-not-yet-done and uploading jobs.
  assert job_states == {"pending", "trained", "uploading"}
  assert outputs(sim) == outputs(reference)
  assert trees_equal(sim.method.global_model(), reference.method.global_model())
  ref_state, state = reference.method.state_dict(), sim.method.state_dict()
  assert ref_state.keys() == state.keys()
  ref_leaves = jax.tree.leaves(ref_state)
  assert len(ref_leaves) == len(jax.tree.leaves(state))
  for a, b in zip(ref_leaves, jax.tree.leaves(state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_resume_by_virtual_time_and_between_ticks():
  reference = build(METHODS["fedat"])
  reference.run()
  sim = build(METHODS["fedat"])
  for until in (0.0, 12.5, 60.0, 60.0, 137.25):
    assert not sim.run(until=until)
    assert sim.now <= until
    state = sim.state_dict()
    sim = build(METHODS["fedat"])
    sim.load_state_dict(state)
  sim.run()
  assert outputs(sim) == outputs(reference)
  assert sim.summary(target=0.5).keys() == reference.summary(target=0.5).keys()


def test_state_is_rejected_by_a_different_run():
  sim = build(METHODS["fedavg"])
  sim.run(max_events=50)
  state = sim.state_dict()
  other = make_simulator(dataclasses.replace(CONFIG, seed=1), FedAvg(), codec=RoundingCodec())
  with pytest.raises(ValueError, match="SystemConfig"):
    other.load_state_dict(state)
  with pytest.raises(ValueError, match="method"):
    build(METHODS["fedasync"]).load_state_dict(state)
