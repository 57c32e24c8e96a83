"""System model of the FedAT simulation (Chai et al., SC'21, Sec. 6-7).

Expected values are recomputed in the tests from the definitions of the system model
(numpy's default_rng on [seed, STREAM_ID, *index]), not taken from the code under test.
"""
import dataclasses
import math

import numpy as np
import pytest

from fedjax_lama.simulation import (ComputeModel, FedAsync, FedAT, FedATConfig, FedAvg,
                                    FedAvgConfig, NetworkModel, Stream, SystemConfig, tick_times)
from fedjax_lama.simulation import streams
from fedjax_lama.simulation.testing import RoundingCodec, ShiftTrainer, make_simulator, small_model

PAPER_RANGES = [(0.0, 0.0), (0.0, 5.0), (6.0, 10.0), (11.0, 15.0), (20.0, 30.0)]
EVENT_CLASS = {"dropout": 0, "compute_done": 1, "arrival": 1, "timer": 1, "tick": 2}


# ----------------------------------------------------------------------------- helpers


def u(seed, stream_id, *index):
  """The first uniform of a stream, straight from its definition."""
  return np.random.default_rng([seed, stream_id, *index]).random()


def expected_parts(seed, num_clients, num_parts):
  keys = np.random.default_rng([seed, 3]).random(num_clients)
  order = np.argsort(keys, kind="stable")
  parts = np.empty(num_clients, int)
  sizes = [num_clients // num_parts + (1 if p < num_clients % num_parts else 0)
           for p in range(num_parts)]
  start = 0
  for p, size in enumerate(sizes):
    parts[order[start:start + size]] = p
    start += size
  return parts


def expected_delay(seed, parts, ranges, k, j):
  lo, hi = ranges[parts[k]]
  return lo + (hi - lo) * u(seed, 6, k, j)


def popped(sim):
  return [e for e in sim.event_log if e[0] >= 0]


def entries(sim, kind):
  return [e for e in sim.event_log if e[2] == kind]


def small_config(**overrides):
  base = dict(num_clients=20, num_unstable=0, max_virtual_time_s=300.0, eval_interval_s=50.0)
  base.update(overrides)
  return SystemConfig(**base)


def comparable_ticks(sim):
  return [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in t.items()
           if k != "wall_time"} for t in sim.ticks]


# ----------------------------------------------------------------------------- streams


def test_streams_are_seeded_by_seed_stream_and_index():
  ids = {s.name: int(s) for s in Stream}
  assert ids == {"DATA": 1, "INIT": 2, "PARTS": 3, "UNSTABLE": 4, "PROFILE": 5, "DELAY": 6,
                 "COMPUTE": 7, "NETWORK": 8, "SAMPLE": 9, "BATCH": 10, "TIFL": 11, "PROX_E": 12}
  assert streams.uniform(5, Stream.DELAY, 3, 2) == u(5, 6, 3, 2)
  assert streams.uniform(5, Stream.NETWORK, 3, 2, 1) == u(5, 8, 3, 2, 1)


def test_sampling_takes_the_candidates_with_the_smallest_keys():
  candidates = [2, 3, 5, 7, 11, 13, 17]
  keys = np.random.default_rng([4, 9, 1, 6]).random(len(candidates))
  expected = sorted(candidates[i] for i in np.argsort(keys, kind="stable")[:3])
  assert streams.sample_clients(4, 1, 6, candidates, 3) == expected
  assert streams.sample_clients(4, 1, 6, candidates, 10) == candidates
  assert streams.sample_clients(4, 1, 6, [], 3) == []
  # Ties break by position (= id order).
  assert streams.smallest_keys([4, 8, 9], np.array([0.5, 0.5, 0.1]), 2) == [9, 4]


# ----------------------------------------------------------------------------- setup


def test_parts_and_unstable_clients_follow_their_streams():
  seed, num_clients = 3, 100
  sim = make_simulator(SystemConfig(num_clients=num_clients, seed=seed, max_virtual_time_s=1000.0,
                                    dropout_horizon_s=800.0), FedAvg())
  parts = expected_parts(seed, num_clients, 5)
  np.testing.assert_array_equal(sim.setup.parts, parts)
  assert np.bincount(parts).tolist() == [20] * 5
  gen = np.random.default_rng([seed, 4])
  keys = gen.random(num_clients)
  unstable = np.sort(np.argsort(keys, kind="stable")[:10])
  times = 800.0 * gen.random(10)
  expected = np.full(num_clients, np.inf)
  expected[unstable] = times
  np.testing.assert_array_equal(sim.dropout_times, expected)


def test_every_delay_lies_in_its_part_and_part_one_has_none():
  seed = 1
  sim = make_simulator(SystemConfig(num_clients=50, seed=seed), FedAvg())
  parts = expected_parts(seed, 50, 5)
  for k in range(50):
    for j in range(6):
      delay = sim.latency.delay(k, j)
      lo, hi = PAPER_RANGES[parts[k]]
      assert lo <= delay <= hi
      assert delay == expected_delay(seed, parts, PAPER_RANGES, k, j)
      if parts[k] == 0:
        assert delay == 0.0


def test_profiling_puts_each_straggler_part_in_its_tier():
  for seed in (0, 1):
    sim = make_simulator(SystemConfig(num_clients=100, seed=seed), FedAT())
    np.testing.assert_array_equal(sim.setup.tiers, expected_parts(seed, 100, 5))
    assert np.all(np.diff([sim.setup.profiled_latency[sim.setup.tiers == m].mean()
                           for m in range(5)]) > 0)


def test_tiering_by_parts_and_uneven_tier_sizes():
  sim = make_simulator(SystemConfig(num_clients=23, tiering="parts"), FedAT())
  np.testing.assert_array_equal(sim.setup.tiers, sim.setup.parts)
  assert np.bincount(sim.setup.parts).tolist() == [5, 5, 5, 4, 4]
  sim = make_simulator(SystemConfig(num_clients=23, num_tiers=3), FedAT())
  assert np.bincount(sim.setup.tiers).tolist() == [8, 8, 7]
  # Tier 0 holds the clients with the smallest profiled latencies.
  lat = sim.setup.profiled_latency
  assert lat[sim.setup.tiers == 0].max() <= lat[sim.setup.tiers == 1].min()


@pytest.mark.parametrize("field, kwargs", [
    ("num_clients", dict(num_clients=0)),
    ("tiering", dict(tiering="latency")),
    ("num_tiers", dict(tiering="parts", num_tiers=4)),
    ("straggler_ranges", dict(straggler_ranges=[])),
    ("straggler_ranges", dict(straggler_ranges=[(5.0, 1.0)])),
    ("num_unstable", dict(num_unstable=101)),
    ("seed", dict(seed=-1)),
    ("eval_interval_s", dict(eval_interval_s=0.0)),
    ("max_clients_per_call", dict(max_clients_per_call=0)),
    ("compute_model.trace_s", dict(compute_model=ComputeModel(kind="trace", trace_s=[[1.0]]))),
    ("network_model.bandwidth_up_bytes_per_s",
     dict(network_model=NetworkModel(kind="fixed", bandwidth_up_bytes_per_s=0.0))),
    ("network_model.latency_range_down_s",
     dict(network_model=NetworkModel(kind="uniform", latency_range_down_s=(1.0, 2.0, 3.0)))),
])
def test_config_validation_names_the_field(field, kwargs):
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    SystemConfig(**kwargs)


def test_method_config_validation_names_the_field():
  with pytest.raises(ValueError, match=r"compute_model\.kind"):
    ComputeModel(kind="gaussian")
  with pytest.raises(ValueError, match="cross_tier_weights"):
    FedATConfig(cross_tier_weights="rank")
  with pytest.raises(ValueError, match="compression_precision"):
    FedATConfig(compression_precision=-1)
  with pytest.raises(ValueError, match="clients_per_round"):
    FedAvgConfig(clients_per_round=0)


def test_config_defaults_are_the_papers_setup():
  c = SystemConfig()
  assert (c.num_clients, c.num_unstable, c.num_tiers, c.tiering, c.profile_rounds, c.seed) == (
      100, 10, 5, "profile", 5, 0)
  assert c.straggler_ranges == tuple(PAPER_RANGES)
  assert (c.max_virtual_time_s, c.eval_interval_s, c.max_clients_per_call) == (20000.0, 50.0, 128)
  assert c.dropout_horizon == 20000.0
  assert (c.compute_model.kind, c.compute_model.step_cost_s, c.network_model.kind) == (
      "fixed", 0.05, "none")
  f = FedATConfig()
  assert (f.clients_per_round, f.lam, f.cross_tier_weights, f.cross_tier_set,
          f.compression_precision) == (10, 0.4, "eq5", "all", 4)
  hash(c)  # frozen and hashable


# ----------------------------------------------------------------------------- the clock


def test_tick_times():
  assert tick_times(small_config(max_virtual_time_s=120.0)) == [0.0, 50.0, 100.0, 120.0]
  assert tick_times(small_config(max_virtual_time_s=100.0)) == [0.0, 50.0, 100.0]
  assert tick_times(small_config(max_virtual_time_s=0.0)) == [0.0]


@pytest.mark.parametrize("network", ["none", "uniform"])
def test_events_pop_in_time_class_seq_order(network):
  config = small_config(num_clients=30, num_unstable=5, dropout_horizon_s=200.0,
                        network_model=NetworkModel(kind=network, latency_range_down_s=(0.0, 1.0),
                                                   latency_range_up_s=(0.0, 1.0)))
  for method in (FedAT(FedATConfig(compression_precision=None)), FedAvg(), FedAsync()):
    sim = make_simulator(config, method)
    sim.run()
    keys = [(t, EVENT_CLASS[kind], seq) for seq, t, kind, *_ in popped(sim)]
    assert all(a < b for a, b in zip(keys, keys[1:]))
    if network == "none":  # e.g. the zero-delay tier's clients all finish together
      assert any(a[:2] == b[:2] for a, b in zip(keys, keys[1:]))
    assert [e[1] for e in entries(sim, "tick")] == tick_times(config)
    assert len(sim.ticks) == len(tick_times(config))


def expected_network_time(seed, network, k, j, direction, num_bytes):
  """A job's transfer time from the definitions: latency + bytes / bandwidth."""
  if network["kind"] == "fixed":
    latency, bandwidth = network["latency"][direction][k], network["bandwidth"][direction][k]
  elif network["kind"] == "uniform":
    gen = np.random.default_rng([seed, 8, k, j, {"down": 0, "up": 1}[direction]])
    (l_lo, l_hi), (b_lo, b_hi) = network["latency"][direction], network["bandwidth"][direction]
    latency = l_lo + (l_hi - l_lo) * gen.random()
    bandwidth = b_lo + (b_hi - b_lo) * gen.random()
  else:
    trace = network["trace"][direction][k]
    latency, bandwidth = trace[j % len(trace)]
  return latency + num_bytes / bandwidth


def expected_compute_time(seed, compute, k, j, steps):
  if compute["kind"] == "trace":
    return compute["trace"][k][j % len(compute["trace"][k])]
  lo, hi = compute["range"][k]
  return (lo + (hi - lo) * u(seed, 7, k, j)) * steps


def latency_models(kind, num_clients):
  rng = np.random.default_rng(123)
  if kind == "trace+fixed":
    compute = {"kind": "trace",
               "trace": [list(rng.uniform(1.0, 9.0, size=1 + k % 4)) for k in range(num_clients)]}
    network = {"kind": "fixed",
               "latency": {d: rng.uniform(0, 0.5, num_clients) for d in ("down", "up")},
               "bandwidth": {d: rng.uniform(50, 500, num_clients) for d in ("down", "up")}}
    config = dict(
        compute_model=ComputeModel(kind="trace", trace_s=compute["trace"]),
        network_model=NetworkModel(
            kind="fixed", latency_down_s=network["latency"]["down"],
            latency_up_s=network["latency"]["up"],
            bandwidth_down_bytes_per_s=network["bandwidth"]["down"],
            bandwidth_up_bytes_per_s=network["bandwidth"]["up"]))
  elif kind == "uniform+trace":
    ranges = [tuple(sorted(rng.uniform(0.01, 0.09, 2))) for _ in range(num_clients)]
    compute = {"kind": "uniform", "range": ranges}
    traces = {d: [[tuple(rng.uniform((0.0, 20.0), (1.0, 90.0))) for _ in range(1 + k % 3)]
                  for k in range(num_clients)] for d in ("down", "up")}
    network = {"kind": "trace", "trace": traces}
    config = dict(compute_model=ComputeModel(kind="uniform", step_cost_range_s=ranges),
                  network_model=NetworkModel(kind="trace", trace_down=traces["down"],
                                             trace_up=traces["up"]))
  else:  # uniform compute (one range) + uniform network
    compute = {"kind": "uniform", "range": [(0.03, 0.06)] * num_clients}
    network = {"kind": "uniform", "latency": {"down": (0.0, 0.4), "up": (0.1, 0.2)},
               "bandwidth": {"down": (10.0, 90.0), "up": (30.0, 40.0)}}
    config = dict(compute_model=ComputeModel(kind="uniform", step_cost_range_s=(0.03, 0.06)),
                  network_model=NetworkModel(kind="uniform", latency_range_down_s=(0.0, 0.4),
                                             latency_range_up_s=(0.1, 0.2),
                                             bandwidth_range_down_bytes_per_s=(10.0, 90.0),
                                             bandwidth_range_up_bytes_per_s=(30.0, 40.0)))
  return compute, network, config


@pytest.mark.parametrize("models", ["trace+fixed", "uniform+trace", "uniform+uniform"])
@pytest.mark.parametrize("method", ["fedasync", "fedat_compressed"])
def test_arrival_times_are_exact(models, method):
  seed, num_clients = 2, 12
  compute, network, model_config = latency_models(models, num_clients)
  config = SystemConfig(num_clients=num_clients, seed=seed, num_unstable=0,
                        max_virtual_time_s=150.0, **model_config)
  if method == "fedasync":  # raw messages: 6 float32 = 24 bytes
    sim, message_bytes = make_simulator(config, FedAsync()), 24
  else:  # RoundingCodec: 2 bytes per value + 4 * (1 + ndim) per leaf = 28 bytes
    sim = make_simulator(config, FedAT(FedATConfig(clients_per_round=2)), codec=RoundingCodec())
    message_bytes = 28
  sim.run()
  parts = expected_parts(seed, num_clients, 5)
  assert {m[2] for m in sim.messages} == {message_bytes}
  dispatched = {(e[3], e[4]): e[1] for e in entries(sim, "dispatch")}
  arrivals = entries(sim, "arrival")
  assert len(arrivals) > 40
  for _, t_arrival, _, k, j, _ in arrivals:
    tau_down = expected_network_time(seed, network, k, j, "down", message_bytes)
    tau_comp = expected_compute_time(seed, compute, k, j, 120)
    delta = expected_delay(seed, parts, PAPER_RANGES, k, j)
    tau_up = expected_network_time(seed, network, k, j, "up", message_bytes)
    assert t_arrival == dispatched[(k, j)] + tau_down + tau_comp + delta + tau_up


def test_job_delays_are_the_same_under_fedavg_and_fedasync():
  seed = 4
  config = small_config(seed=seed)
  parts = expected_parts(seed, 20, 5)
  seen = {}
  for method in (FedAvg(), FedAsync()):
    sim = make_simulator(config, method)
    sim.run()
    dispatched = {(e[3], e[4]): e[1] for e in entries(sim, "dispatch")}
    for _, t_c, _, k, j, _ in entries(sim, "compute_done"):
      delta = expected_delay(seed, parts, PAPER_RANGES, k, j)
      assert t_c == dispatched[(k, j)] + 0.0 + 0.05 * 120 + delta
      seen.setdefault((k, j), set()).add(delta)
  assert all(len(v) == 1 for v in seen.values())


def round_table(sim):
  """{(group, round): (start, sampled clients, {client: arrival time})} from the event log."""
  rounds = {}
  for _, t, kind, k, _, ctx in sim.event_log:
    if kind == "dispatch":
      start, sampled, arrived = rounds.setdefault(ctx, (t, [], {}))
      assert start == t
      sampled.append(k)
    elif kind == "arrival":
      rounds[ctx][2][k] = t
  return rounds


def test_fedavg_round_lasts_the_maximum_latency_of_its_clients():
  seed = 6
  config = small_config(seed=seed, max_virtual_time_s=400.0)
  sim = make_simulator(config, FedAvg(FedAvgConfig(clients_per_round=5)))
  sim.run()
  parts = expected_parts(seed, 20, 5)
  rounds = round_table(sim)
  participation = {}
  for r in range(len(rounds) - 1):
    start, sampled, arrived = rounds[(0, r)]
    assert len(sampled) == 5 and sorted(arrived) == sampled
    latencies = []
    for k in sampled:
      j = participation.get(k, 0)
      participation[k] = j + 1
      latencies.append(start + 0.0 + 0.05 * 120 + expected_delay(seed, parts, PAPER_RANGES, k, j)
                       + 0.0)
    assert max(latencies) == rounds[(0, r + 1)][0]


def test_dropouts_end_rounds_and_departed_clients_never_report():
  config = small_config(num_clients=30, num_unstable=10, dropout_horizon_s=250.0,
                        max_virtual_time_s=300.0)
  for method in (FedAvg(FedAvgConfig(clients_per_round=8)),
                 FedAT(FedATConfig(clients_per_round=4, compression_precision=None)), FedAsync()):
    sim = make_simulator(config, method)
    sim.run()
    dropout = sim.dropout_times
    assert len(entries(sim, "dropout")) == 10
    lost = entries(sim, "lost")
    assert lost, "some jobs must be lost with these drop-out times"
    for _, t, kind, k, _, _ in sim.event_log:
      if k >= 0 and t >= dropout[k]:
        assert kind == "dropout" and t == dropout[k], (method.name, kind, k, t)
    for t, direction, _, k, _ in sim.messages:
      if direction == "up":
        assert t < dropout[k]
    # Synchronous rounds end at max over sampled clients of min(arrival, D_k) .
    if method.name in ("fedavg", "fedat"):
      rounds = round_table(sim)
      for (group, r), (_, sampled, arrived) in rounds.items():
        if (group, r + 1) in rounds:
          end = max(arrived.get(k, dropout[k]) for k in sampled)
          assert rounds[(group, r + 1)][0] == end
    # Uploads are counted for delivered jobs only.
    ups = [m for m in sim.messages if m[1] == "up"]
    assert len(ups) == len(entries(sim, "arrival"))
    assert sim.bytes_up == 24 * len(ups)


def test_fedat_rounds_of_a_tier_never_overlap():
  config = small_config(num_clients=25, max_virtual_time_s=200.0)
  sim = make_simulator(config, FedAT(FedATConfig(clients_per_round=3, compression_precision=None)))
  sim.run()
  rounds = round_table(sim)
  for tier in range(5):
    r = 0
    while (tier, r + 1) in rounds:
      start, sampled, arrived = rounds[(tier, r)]
      assert sorted(arrived) == sampled and set(sampled) <= set(sim.setup.tier_members(tier))
      next_start = rounds[(tier, r + 1)][0]
      assert next_start == max(arrived.values()) and start < next_start
      r += 1
    assert r >= 5


def test_timeline_does_not_depend_on_the_models():
  config = small_config(num_clients=20, num_unstable=4, dropout_horizon_s=250.0)

  def timeline(trainer_scale, initial_model, method):
    sim = make_simulator(config, method, initial_model=initial_model,
                         trainer=ShiftTrainer(np.full(20, 400), 10, scale=trainer_scale))
    sim.run()
    return sim.event_log, sim.messages

  other = {"b": np.ones(2, np.float32), "w": np.full(4, -3.0, np.float32)}
  for make in (lambda: FedAT(FedATConfig(compression_precision=None)), FedAvg, FedAsync):
    reference = timeline(1.0, small_model(), make())
    assert timeline(0.0, small_model(), make()) == reference
    assert timeline(1.0, other, make()) == reference


def test_deferred_training_one_call_per_round_in_dispatch_order():
  config = small_config(num_clients=20)
  trainer = ShiftTrainer(np.full(20, 400), 10)
  sim = make_simulator(config, FedAvg(), trainer=trainer)
  sim.run()
  rounds = len({e[5] for e in entries(sim, "compute_done")})  # rounds that needed training
  assert rounds >= 5 and trainer.call_sizes == [10] * rounds
  dispatched = [(e[3], e[4]) for e in entries(sim, "dispatch")]
  assert trainer.trained == dispatched[:len(trainer.trained)]
  # Smaller calls: same order, same timeline, same models.
  small = ShiftTrainer(np.full(20, 400), 10)
  sim2 = make_simulator(dataclasses.replace(config, max_clients_per_call=4), FedAvg(),
                        trainer=small)
  sim2.run()
  assert small.call_sizes == [4, 4, 2] * rounds
  assert small.trained == trainer.trained
  assert sim2.event_log == sim.event_log
  assert comparable_ticks(sim2) == comparable_ticks(sim)


def test_runs_are_deterministic_for_a_seed():
  def run(seed, method):
    config = small_config(
        num_clients=25, seed=seed, num_unstable=5, dropout_horizon_s=250.0,
        compute_model=ComputeModel(kind="uniform", step_cost_range_s=(0.03, 0.07)),
        network_model=NetworkModel(kind="uniform", latency_range_down_s=(0.0, 0.5),
                                   latency_range_up_s=(0.1, 0.2),
                                   bandwidth_range_down_bytes_per_s=(10.0, 100.0),
                                   bandwidth_range_up_bytes_per_s=(10.0, 100.0)))
    sim = make_simulator(config, method, codec=RoundingCodec())
    sim.run()
    return sim.event_log, sim.messages, comparable_ticks(sim), sim.summary(target=0.5)

  for make in (lambda: FedAT(FedATConfig(clients_per_round=3)), FedAvg, FedAsync):
    a, b, c = run(0, make()), run(0, make()), run(1, make())
    assert a[:3] == b[:3]
    assert {k: v for k, v in a[3].items() if k != "wall_time"} == {
        k: v for k, v in b[3].items() if k != "wall_time"}
    assert a[0] != c[0]


def test_max_global_updates_stops_the_run_with_a_final_record():
  config = small_config(max_global_updates=7)
  sim = make_simulator(config, FedAvg())
  assert sim.run()
  assert sim.stop_reason == "max_global_updates" and sim.method.global_updates == 7
  assert sim.ticks[-1]["final"] and sim.ticks[-1]["global_updates"] == 7
  assert sim.ticks[-1]["virtual_time"] == sim.now < config.max_virtual_time_s


def test_num_examples_and_trainer_step_counts_are_checked():
  with pytest.raises(ValueError, match="num_examples"):
    make_simulator(small_config(), FedAvg(), num_examples=np.full(19, 400))

  class WrongSteps(ShiftTrainer):
    def train(self, jobs):
      return [r._replace(num_steps=r.num_steps + 1) for r in super().train(jobs)]

  sim = make_simulator(small_config(), FedAvg(), trainer=WrongSteps(np.full(20, 400), 10))
  with pytest.raises(RuntimeError, match="valid steps"):
    sim.run()


def test_unequal_example_counts_set_compute_time():
  num_examples = np.arange(20) * 7 + 300  # 300..433 examples: 30..44 steps per epoch
  sim = make_simulator(small_config(straggler_ranges=[(0.0, 0.0)], num_tiers=1), FedAvg(),
                       num_examples=num_examples)
  sim.run(until=50.0)
  dispatched = {(e[3], e[4]): e[1] for e in entries(sim, "dispatch")}
  for _, t_c, _, k, j, _ in entries(sim, "compute_done"):
    assert t_c == dispatched[(k, j)] + 0.0 + 0.05 * (3 * math.ceil(num_examples[k] / 10)) + 0.0
