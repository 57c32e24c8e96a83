"""FedBuff on the virtual clock (Nguyen et al., "Federated Learning with Buffered
Asynchronous Aggregation", AISTATS 2022, Algorithm 1).

Known answers are worked out by hand in the comments from the timeline of the
configuration; the equivalences with FedAsync and FedAvg are bitwise and the
tests say which settings make them exact.
"""
import copy
import dataclasses
import math
from fractions import Fraction as F

import jax
import numpy as np
import pytest

from fedjax_lama.simulation import (ComputeModel, FedAsync, FedAsyncConfig, FedAvg, FedAvgConfig,
                                    FedBuff, FedBuffConfig, NetworkModel, SystemConfig)
from fedjax_lama.simulation import streams
from fedjax_lama.simulation.interfaces import TrainResult
from fedjax_lama.simulation.latency import job_steps
from fedjax_lama.simulation.pytree import trees_equal
from fedjax_lama.simulation.testing import RoundingCodec, ShiftTrainer, make_simulator

NO_DELAY = ((0.0, 0.0),)


class AddTrainer:
  """v = start + step[k]: every job of client k adds the same amount (float64)."""

  def __init__(self, steps, num_examples, batch_size):
    self.steps, self.num_examples, self.batch_size = steps, num_examples, batch_size

  def train(self, jobs):
    return [TrainResult({"w": job.start_model["w"] + self.steps[job.client_id]},
                        job_steps(self.num_examples[job.client_id], self.batch_size,
                                  job.num_epochs)) for job in jobs]


def trace_config(durations, **overrides):
  """Client k's jobs last durations[k] seconds; no network time, no delay, no drop-out."""
  base = dict(num_clients=len(durations), num_unstable=0, num_tiers=1, straggler_ranges=NO_DELAY,
              compute_model=ComputeModel(kind="trace", trace_s=[[d] for d in durations]),
              max_virtual_time_s=100.0, eval_interval_s=50.0, local_epochs=1, batch_size=10)
  base.update(overrides)
  return SystemConfig(**base)


def arrivals(sim):
  return [(e[1], e[3], e[4], e[5]) for e in sim.event_log if e[2] == "arrival"]


def dispatches(sim):
  return [(e[1], e[3], e[4], e[5]) for e in sim.event_log if e[2] == "dispatch"]


# ----------------------------------------------------------------------------- the rule


def test_staleness_weight_is_the_papers_inverse_square_root():
  method = FedBuff()  # defaults: polynomial with a = 0.5, i.e. s(tau) = 1 / sqrt(1 + tau)
  assert [method.staleness_weight(t) for t in (0, 1, 3, 8)] == pytest.approx(
      [1.0, 2 ** -0.5, 0.5, 1 / 3], abs=1e-15)
  assert method.staleness_weight(0) == 1.0 and method.staleness_weight(3) == 0.5
  constant = FedBuff(FedBuffConfig(staleness="constant"))
  assert [constant.staleness_weight(t) for t in (0, 5, 50)] == [1.0, 1.0, 1.0]
  hinge = FedBuff(FedBuffConfig(staleness="hinge", hinge_a=2.0, hinge_b=1.0))
  # 1 up to tau = b = 1, then 1 / (2 (tau - 1) + 1): tau = 2 -> 1/3, tau = 3 -> 1/5.
  assert [hinge.staleness_weight(t) for t in (0, 1, 2, 3)] == [1.0, 1.0, 1 / 3, 1 / 5]


@pytest.mark.parametrize("field, value", [("concurrency", 0), ("buffer_size", 0),
                                          ("server_lr", 0.0), ("staleness", "exponential"),
                                          ("poly_a", 0.0), ("rho", -1.0),
                                          ("compression_precision", 23)])
def test_bad_options_name_the_field(field, value):
  with pytest.raises(ValueError, match=field):
    FedBuffConfig(**{field: value})


def test_hand_written_timeline_buffer_staleness_and_refill():
  # Three clients, all in flight (concurrency 3), K = 2, eta_g = 0.5, s = 1/sqrt(1 + tau).
  # Client k's jobs last (1, 1.5, 4) s and add (1, 10, 100) to w; w0 = 0, so every
  # update is Delta = w^tau - v = -step_k. Timeline:
  #   t=1.0  c0 j0 (from v0, tau 0, s 1)       buffer [c0]      c0 j1 starts from v0
  #   t=1.5  c1 j0 (from v0, tau 0, s 1)       step: w1 = 0 + 0.5/2 (1 + 10) = 2.75
  #                                                             c1 j1 starts from v1
  #   t=2.0  c0 j1 (from v0, tau 1, s 1/sqrt2) buffer [c0]      c0 j2 starts from v1
  #   t=3.0  c1 j1 (from v1, tau 0, s 1)       step: w2 = w1 + 0.25 (1/sqrt2 + 10)
  #                                                             c1 j2 starts from v2
  #   t=3.0  c0 j2 (from v1, tau 1, s 1/sqrt2) buffer [c0]      c0 j3 starts from v2
  #   t=4.0  c2 j0 (from v0, tau 2, s 1/sqrt3) step: w3 = w2 + 0.25 (1/sqrt2 + 100/sqrt3)
  # (At t=3.0 c1's compute-done event was queued first, so it arrives first.)
  config = trace_config([1.0, 1.5, 4.0], max_global_updates=3)
  num_examples = np.full(3, 400)
  sim = make_simulator(config, FedBuff(FedBuffConfig(concurrency=3, buffer_size=2,
                                                     server_lr=0.5)),
                       num_examples=num_examples, initial_model={"w": np.zeros(1)},
                       trainer=AddTrainer([1.0, 10.0, 100.0], num_examples, 10))
  seen = []
  while not sim.run(max_events=1):
    seen.append((sim.now, sim.method.version, float(sim.method.model["w"][0]),
                 len(sim.method.buffer), dict(sim.method.in_flight)))
  method = sim.method
  w1 = 0.25 * 11.0
  w2 = w1 + 0.25 * (2 ** -0.5 + 10.0)
  w3 = w2 + 0.25 * (2 ** -0.5 + 100.0 / math.sqrt(3.0))
  assert arrivals(sim) == [(1.0, 0, 0, (0, 0)), (1.5, 1, 0, (0, 0)), (2.0, 0, 1, (0, 0)),
                           (3.0, 1, 1, (0, 1)), (3.0, 0, 2, (0, 1)), (4.0, 2, 0, (0, 0))]
  # Each freed slot restarts at the arrival's time with the model after the arrival.
  assert dispatches(sim) == [(0.0, 0, 0, (0, 0)), (0.0, 1, 0, (0, 0)), (0.0, 2, 0, (0, 0)),
                             (1.0, 0, 1, (0, 0)), (1.5, 1, 1, (0, 1)), (2.0, 0, 2, (0, 1)),
                             (3.0, 1, 2, (0, 2)), (3.0, 0, 3, (0, 2)), (4.0, 2, 1, (0, 3))]
  assert method.version == 3 and sim.stop_reason == "max_global_updates"
  np.testing.assert_allclose(method.model["w"], [w3], rtol=0, atol=1e-14)
  after_arrivals = [s for s in seen if s[0] in (1.0, 1.5, 2.0, 3.0)]
  # (time, version, w, buffered, in flight) after each arrival's event.
  by_time = {}
  for s in after_arrivals:
    by_time[s[0]] = s  # the last event at each time
  assert by_time[1.0][1:4] == (0, 0.0, 1) and by_time[1.5][1:4] == (1, w1, 0)
  assert by_time[2.0][1:4] == (1, w1, 1)
  assert by_time[3.0][1] == 2 and by_time[3.0][3] == 1
  np.testing.assert_allclose(by_time[3.0][2], w2, rtol=0, atol=1e-14)
  assert by_time[3.0][4] == {0: 2, 1: 2, 2: 0}
  # Only the versions still referenced are kept: c0 and c1 are in flight from v2, c2 from v3.
  assert method.in_flight == {0: 2, 1: 2, 2: 3} and sorted(method.models) == [2, 3]


def test_step_coefficients_are_exact_and_drop_a_cancelled_model():
  method = FedBuff(FedBuffConfig(buffer_size=3, server_lr=1.0, staleness="constant"))
  method.version = 4
  method.buffer = [(2, 0, 4, 1.0, "v2"), (0, 0, 4, 1.0, "v0"), (1, 3, 2, 1.0, "v1")]
  versions, version_coefs, upload_coefs = method.update_coefficients()
  # w^5 = w^4 - 1/3 [(w^4 - v0) + (w^4 - v2) + (w^2 - v1)] = 1/3 w^4 - 1/3 w^2 + (v0 + v1 + v2)/3
  assert versions == [2, 4]
  assert version_coefs == [F(-1, 3), F(1, 3)] and upload_coefs == [F(1, 3)] * 3
  method.buffer = [(2, 0, 4, 1.0, "v2"), (0, 0, 4, 1.0, "v0"), (1, 3, 4, 1.0, "v1")]
  assert method.update_coefficients()[1] == [F(0)]  # every update fresh: w^4 cancels exactly


def test_slots_refill_from_idle_alive_clients_and_after_departures():
  config = SystemConfig(num_clients=8, num_unstable=4, dropout_horizon_s=60.0,
                        max_virtual_time_s=80.0, eval_interval_s=40.0, num_tiers=2,
                        compute_model=ComputeModel(kind="uniform",
                                                   step_cost_range_s=(0.01, 0.05)))
  sim = make_simulator(config, FedBuff(FedBuffConfig(concurrency=3, buffer_size=2)))
  method = sim.method
  draws, refills_after_departure = 0, 0
  while True:
    before = dict(method.in_flight)
    log_length = len(sim.event_log)
    finished = sim.run(max_events=1)
    new = sim.event_log[log_length:]
    started = [(e[1], e[3], e[5][1]) for e in new if e[2] == "dispatch"]
    if started:  # one draw of stream SAMPLE (0, d) among the alive clients not in flight
      kept = {k for k in method.in_flight if k not in {c for _, c, _ in started}}
      idle = [k for k in sim.alive_clients() if k not in kept]
      assert [c for _, c, _ in started] == streams.sample_clients(sim.seed, 0, draws, idle,
                                                                  3 - len(kept))
      assert all(t == sim.now and v == method.version for t, _, v in started)
      draws += 1
      if new[0][2] == "dropout":
        refills_after_departure += 1
        assert new[0][3] in before and new[0][3] not in method.in_flight
    assert len(method.in_flight) == min(3, len(sim.alive_clients()))
    if finished:
      break
  assert method.draws == draws and refills_after_departure >= 1
  assert method.global_updates > 5


# ----------------------------------------------------------------------------- equivalences


def test_buffer_of_one_with_constant_weight_is_fedasync_when_nothing_is_stale():
  """Exact (bitwise, whole run) with one client: every update is fresh, and FedBuff's step
  w - alpha (w - v) is then FedAsync's (1 - alpha) w + alpha v with the same rounding."""
  config = SystemConfig(num_clients=1, num_unstable=0, num_tiers=1, straggler_ranges=((0.0, 5.0),),
                        max_virtual_time_s=200.0, eval_interval_s=20.0)
  fedasync = make_simulator(config, FedAsync(FedAsyncConfig(alpha=0.6, staleness="constant")))
  fedbuff = make_simulator(config, FedBuff(FedBuffConfig(
      concurrency=1, buffer_size=1, server_lr=0.6, staleness="constant", rho=0.005)))
  fedasync.run(), fedbuff.run()
  assert fedbuff.method.global_updates == fedasync.method.global_updates > 10
  assert fedbuff.event_log == fedasync.event_log and fedbuff.messages == fedasync.messages
  assert trees_equal(fedbuff.method.global_model(), fedasync.method.global_model())
  strip = lambda ticks: [{k: v for k, v in t.items() if k not in ("wall_time", "client_accuracy")}
                         for t in ticks]
  assert strip(fedbuff.ticks) == strip(fedasync.ticks)


def test_buffer_of_one_with_stale_updates_differs_from_fedasync_by_the_staleness():
  """With many clients the schedules are the same (everyone in flight, the arrived client
  restarts), but a stale update is applied as a delta from the model it started from
  (FedBuff, and FLSim's 'fed_buff_aggregation'), not mixed with the current model (Xie et
  al.): w^(t+1) = w^t + alpha (v - w^tau). Fresh updates match FedAsync bit for bit."""
  config = SystemConfig(num_clients=6, num_unstable=0, num_tiers=2, max_virtual_time_s=120.0,
                        eval_interval_s=60.0, straggler_ranges=((0.0, 2.0), (3.0, 9.0)))
  fedasync = make_simulator(config, FedAsync(FedAsyncConfig(alpha=0.5, staleness="constant")))
  sim = make_simulator(config, FedBuff(FedBuffConfig(concurrency=6, buffer_size=1, server_lr=0.5,
                                                     staleness="constant", rho=0.005)))
  fedasync.run()
  history = {0: sim.initial_model}
  stale = fresh = 0
  sim.run(until=0.0)  # the start: every client in flight from w0
  while sim.queue and sim.queue.peek().time <= config.max_virtual_time_s:
    event = sim.queue.peek()
    is_arrival = event.cls == 1 and event.payload[0] == 1
    if is_arrival:
      job = sim.jobs[event.payload[1]]
      before, version = sim.method.model, sim.method.version
    sim.run(max_events=1)
    if not is_arrival:
      continue
    start = job.context[1]
    v = job.upload_model
    expected = {k: np.float32(before[k].astype(np.float64) + 0.5 * (
        v[k].astype(np.float64) - history[start][k].astype(np.float64))) for k in before}
    for k in before:
      np.testing.assert_allclose(sim.method.model[k], expected[k], rtol=0, atol=1e-6)
    if start == version:
      fresh += 1
      assert trees_equal(sim.method.model, {k: np.float32(0.5 * before[k].astype(np.float64)
                                                          + 0.5 * v[k].astype(np.float64))
                                            for k in before})
    else:
      stale += 1
    history[sim.method.version] = sim.method.model
  assert stale > 0 and fresh > 0
  assert [e for e in sim.event_log if e[2] != "tick"] == [
      e for e in fedasync.event_log if e[2] != "tick"]


@pytest.mark.parametrize("num_clients", [3, 4, 7])
def test_one_buffer_of_every_fresh_update_is_a_fedavg_round(num_clients):
  """Exact (bitwise) for the first step when K = concurrency = every client, eta_g = 1, all
  n_k equal (FedBuff's mean is uniform, FedAvg's n_k-weighted) and every first job arrives
  before any client's second job (so the buffer holds every concurrent update, none stale)."""
  durations = [1.0 + 0.1 * k for k in range(num_clients)]  # all below 2 x the fastest
  config = trace_config(durations, max_global_updates=1)
  fedavg = make_simulator(config, FedAvg(FedAvgConfig(clients_per_round=num_clients)))
  fedbuff = make_simulator(config, FedBuff(FedBuffConfig(concurrency=num_clients,
                                                         buffer_size=num_clients)))
  fedavg.run(), fedbuff.run()
  assert fedavg.method.global_updates == fedbuff.method.global_updates == 1
  assert trees_equal(fedbuff.method.global_model(), fedavg.method.global_model())
  assert not trees_equal(fedbuff.method.global_model(), fedbuff.initial_model)


# ----------------------------------------------------------------------------- resume

RESUME_CONFIG = SystemConfig(
    num_clients=20, num_unstable=4, dropout_horizon_s=150.0, max_virtual_time_s=200.0,
    eval_interval_s=25.0, max_clients_per_call=7,
    compute_model=ComputeModel(kind="uniform", step_cost_range_s=(0.02, 0.06)),
    network_model=NetworkModel(kind="uniform", latency_range_down_s=(0.0, 0.3),
                               latency_range_up_s=(0.0, 0.3),
                               bandwidth_range_down_bytes_per_s=(20.0, 200.0),
                               bandwidth_range_up_bytes_per_s=(20.0, 200.0)))


def build_resumable():
  return make_simulator(RESUME_CONFIG, FedBuff(FedBuffConfig(
      concurrency=8, buffer_size=3, server_lr=0.8, compression_precision=2)),
      codec=RoundingCodec())


def outputs(sim):
  ticks = [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in t.items()
            if k != "wall_time"} for t in sim.ticks]
  return sim.event_log, sim.messages, ticks, sim.participation.tolist(), sim.stop_reason


def test_interrupted_then_resumed_equals_uninterrupted():
  reference = build_resumable()
  assert reference.run()
  assert reference.method.global_updates > 10
  num_events = sum(1 for e in reference.event_log if e[0] >= 0)
  sim = build_resumable()
  stops, buffered, stale_versions = 0, 0, 0
  while not sim.run(max_events=max(1, num_events // 9) + stops):
    state = copy.deepcopy(sim.state_dict())
    buffered += bool(state["method_state"]["buffer"])
    stale_versions += len(state["method_state"]["models"]) > 1
    stops += 1
    sim = build_resumable()
    sim.load_state_dict(state)
  assert stops >= 5 and buffered > 0 and stale_versions > 0  # saved mid-buffer, stale in flight
  assert outputs(sim) == outputs(reference)
  assert trees_equal(sim.method.global_model(), reference.method.global_model())
  a, b = reference.method.state_dict(), sim.method.state_dict()
  assert a.keys() == b.keys() and a["in_flight"] == b["in_flight"] and a["draws"] == b["draws"]
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_state_of_another_method_is_refused():
  sim = build_resumable()
  sim.run(max_events=30)
  other = make_simulator(RESUME_CONFIG, FedAsync(), codec=RoundingCodec())
  with pytest.raises(ValueError, match="method"):
    other.load_state_dict(sim.state_dict())
  changed = make_simulator(dataclasses.replace(RESUME_CONFIG, seed=3),
                           FedBuff(FedBuffConfig(concurrency=8, buffer_size=3)),
                           codec=RoundingCodec())
  with pytest.raises(ValueError, match="SystemConfig"):
    changed.load_state_dict(sim.state_dict())


@pytest.mark.slow
def test_engine_run_interrupted_then_resumed_equals_uninterrupted(tmp_path):
  """Through the training entry point: checkpoints keep the buffer and the versions in flight."""
  # pylint: disable=g-import-not-at-top
  from fedjax_lama import training
  from fedjax_lama.simulation import clock_run
  from tests.test_fedat_engine import clock_config, clock_setup
  c = clock_config(algorithm="fedbuff", **{"fedbuff.concurrency": 6, "fedbuff.buffer_size": 3,
                                           "fedbuff.server_lr": 0.8})
  whole, split = str(tmp_path / "whole"), str(tmp_path / "split")
  summary = training.train_and_evaluate(c, whole)
  assert training.train_and_evaluate(c, split, stop_after_round=1) == {
      "interrupted_after_tick": 1}
  resumed = training.train_and_evaluate(c, split)
  wall = ("wall_seconds", "wall_time")
  assert {k: v for k, v in summary.items() if k not in wall} == {
      k: v for k, v in resumed.items() if k not in wall}
  assert summary["global_updates"] >= 3
  params = clock_setup()[2]
  a, b = clock_run.latest_state(whole, params), clock_run.latest_state(split, params)
  assert a["event_log"] == b["event_log"] and a["method_state"]["version"] >= 3
  for x, y in zip(jax.tree.leaves(a["method_state"]), jax.tree.leaves(b["method_state"]),
                  strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
