"""FedAT and the baselines on the virtual clock (Chai et al., SC'21, Sec. 4 and 6).

The Eq. 5 known answers are worked out by hand from Eq. 5 under each reading; TiFL's ChangeProbs and
FedAsync's staleness values are computed by hand in the comments.
"""
import importlib.util
import math
from fractions import Fraction as F

import numpy as np
import pytest

from fedjax_lama.simulation import (ASOFed, ASOFedConfig, FedAsync, FedAsyncConfig, FedAT,
                                    FedATConfig, FedAvg, FedProx, FedProxConfig,
                                    NetworkModel, NumpyAlgebra, PolylineCodec, SystemConfig, TiFL,
                                    TiFLConfig, cross_tier_fractions, cross_tier_weights)
from fedjax_lama.simulation.methods import change_probs, select_tier, staleness_weight
from fedjax_lama.simulation.pytree import trees_equal
from fedjax_lama.simulation.testing import RoundingCodec, ShiftTrainer, make_simulator

READINGS = {"literal": ("eq5", "all"), "renormalised": ("eq5", "reported"),
            "uniform": ("uniform", "all"), "uniform_reported": ("uniform", "reported")}

# known answers in tests/test_fedat_engine.py, transcribed: counts -> reading -> (exact weights,
# float64 weights).
KNOWN_ANSWERS = {
    (10, 7, 5, 3, 1): {
        "literal": ([F(1, 26), F(3, 26), F(5, 26), F(7, 26), F(5, 13)],
                    [0.038461538461538464, 0.11538461538461539, 0.19230769230769232,
                     0.2692307692307692, 0.38461538461538464]),
        "renormalised": ([F(1, 26), F(3, 26), F(5, 26), F(7, 26), F(5, 13)],
                         [0.038461538461538464, 0.11538461538461539, 0.19230769230769232,
                          0.2692307692307692, 0.38461538461538464]),
        "uniform": ([F(1, 5)] * 5, [0.2] * 5),
        "uniform_reported": ([F(1, 5)] * 5, [0.2] * 5),
    },
    (9, 4, 2, 1, 0): {
        "literal": ([F(0), F(1, 16), F(1, 8), F(1, 4), F(9, 16)],
                    [0.0, 0.0625, 0.125, 0.25, 0.5625]),
        "renormalised": ([F(1, 16), F(1, 8), F(1, 4), F(9, 16), F(0)],
                         [0.0625, 0.125, 0.25, 0.5625, 0.0]),
        "uniform": ([F(1, 5)] * 5, [0.2] * 5),
        "uniform_reported": ([F(1, 4)] * 4 + [F(0)], [0.25, 0.25, 0.25, 0.25, 0.0]),
    },
    (3, 0, 0, 0, 0): {
        "literal": ([F(0), F(0), F(0), F(0), F(1)], [0.0, 0.0, 0.0, 0.0, 1.0]),
        "renormalised": ([F(1), F(0), F(0), F(0), F(0)], [1.0, 0.0, 0.0, 0.0, 0.0]),
        "uniform": ([F(1, 5)] * 5, [0.2] * 5),
        "uniform_reported": ([F(1), F(0), F(0), F(0), F(0)], [1.0, 0.0, 0.0, 0.0, 0.0]),
    },
    (4, 6, 2, 2, 1): {
        "literal": ([F(1, 15), F(2, 15), F(2, 15), F(2, 5), F(4, 15)],
                    [0.06666666666666667, 0.13333333333333333, 0.13333333333333333, 0.4,
                     0.26666666666666666]),
        "renormalised": ([F(1, 15), F(2, 15), F(2, 15), F(2, 5), F(4, 15)],
                         [0.06666666666666667, 0.13333333333333333, 0.13333333333333333, 0.4,
                          0.26666666666666666]),
        "uniform": ([F(1, 5)] * 5, [0.2] * 5),
        "uniform_reported": ([F(1, 5)] * 5, [0.2] * 5),
    },
    (7,): {name: ([F(1)], [1.0]) for name in READINGS},
}


def entries(sim, kind):
  return [e for e in sim.event_log if e[2] == kind]


def small_config(**overrides):
  base = dict(num_clients=20, num_unstable=0, max_virtual_time_s=300.0, eval_interval_s=50.0)
  base.update(overrides)
  return SystemConfig(**base)


class RecordingTrainer(ShiftTrainer):
  """Keeps every TrainJob it receives."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.jobs = []

  def train(self, jobs):
    self.jobs.extend(jobs)
    return super().train(jobs)


class CountingCodec(RoundingCodec):
  def __init__(self):
    self.calls = []

  def roundtrip(self, tree, precision):
    self.calls.append(precision)
    return super().roundtrip(tree, precision)


# ----------------------------------------------------------------------------- Eq. 5


@pytest.mark.parametrize("counts", list(KNOWN_ANSWERS))
@pytest.mark.parametrize("reading", list(READINGS))
def test_cross_tier_weights_known_answers(counts, reading):
  exact, floats = KNOWN_ANSWERS[counts][reading]
  weights, tier_set = READINGS[reading]
  assert cross_tier_fractions(list(counts), weights, tier_set) == exact
  got = cross_tier_weights(list(counts), weights, tier_set)
  assert got == floats and all(type(w) is float for w in got)
  assert sum(exact) == 1


def test_cross_tier_weights_before_any_report_are_none():
  for weights, tier_set in READINGS.values():
    assert cross_tier_weights([0, 0, 0, 0, 0], weights, tier_set) is None
  with pytest.raises(ValueError):
    cross_tier_weights([1, -1])
  with pytest.raises(ValueError):
    cross_tier_weights([1.5, 2])
  with pytest.raises(ValueError, match="cross_tier_set"):
    cross_tier_weights([1, 2], "eq5", "some")


def test_cross_tier_weighted_sum_of_scalar_tier_models():
  algebra = NumpyAlgebra()
  models = [np.float32(v) for v in (1, 2, 3, 4, 5)]
  for counts, reading, expected in (((10, 7, 5, 3, 1), "literal", 3.8461538461538463),
                                    ((9, 4, 2, 1, 0), "literal", 4.3125),
                                    ((9, 4, 2, 1, 0), "renormalised", 3.3125)):
    got = algebra.weighted_sum(models, cross_tier_weights(counts, *READINGS[reading]))
    assert got.dtype == np.float32 and abs(float(got) - expected) <= 1e-6


# ----------------------------------------------------------------------------- FedAT


def degenerate_config(**overrides):
  base = dict(num_clients=20, num_tiers=1, tiering="parts", straggler_ranges=[(0.0, 0.0)],
              num_unstable=0, max_virtual_time_s=200.0, eval_interval_s=20.0)
  base.update(overrides)
  return SystemConfig(**base)


@pytest.mark.parametrize("tiering", ["parts", "profile"])
def test_fedat_with_one_tier_equals_fedavg(tiering):
  num_examples = 380 + 3 * np.arange(20)  # different n_k: the weights and latencies matter
  config = degenerate_config(tiering=tiering)
  fedat = make_simulator(config, FedAT(FedATConfig(lam=0.0, compression_precision=None)),
                         num_examples=num_examples)
  fedavg = make_simulator(config, FedAvg(), num_examples=num_examples)
  models_compared = 0
  while not (fedat.finished and fedavg.finished):
    fedat.run(max_events=1)
    fedavg.run(max_events=1)
    assert fedat.event_log == fedavg.event_log
    assert trees_equal(fedat.method.global_model(), fedavg.method.global_model())
    models_compared += 1
  assert fedat.method.global_updates == fedavg.method.global_updates > 10
  assert fedat.messages == fedavg.messages
  for a, b in zip(fedat.ticks, fedavg.ticks):
    assert a["accuracy"] == b["accuracy"] and a["global_updates"] == b["global_updates"]
  assert models_compared > 100
  # lambda != 0 or compression makes them differ.
  fedat_prox = make_simulator(config, FedAT(FedATConfig(lam=0.4, compression_precision=None)),
                              num_examples=num_examples)
  fedat_prox.run()
  assert not trees_equal(fedat_prox.method.global_model(), fedavg.method.global_model())


def test_fedat_literal_reading_keeps_w0_until_a_slow_tier_reports():
  sim = make_simulator(SystemConfig(num_clients=50, num_unstable=0, max_virtual_time_s=60.0),
                       FedAT(FedATConfig(compression_precision=None)))
  w0 = sim.initial_model
  saw_fast_only = False
  while not sim.run(max_events=1):
    counts = sim.method.tier_updates()
    if sum(counts[2:]) == 0:
      saw_fast_only |= counts[0] > 0
      assert trees_equal(sim.method.global_model(), w0)  # exactly w0, weights (0, 0, 0, 0, 1)
    if counts[4] == 0 and sum(counts) > 0:
      # Tier 1's model has weight T_tier5 / T = 0 until tier 5 reports.
      assert cross_tier_weights(counts)[0] == 0.0
  assert saw_fast_only and sim.method.tier_updates()[4] > 0


def test_fedat_renormalised_reading_uses_the_reported_tiers():
  sim = make_simulator(SystemConfig(num_clients=50, num_unstable=0, max_virtual_time_s=40.0),
                       FedAT(FedATConfig(compression_precision=None, cross_tier_set="reported")))
  checked = False
  while not sim.run(max_events=1):
    counts = sim.method.tier_updates()
    if counts[0] > 0 and sum(counts[1:]) == 0:
      np.testing.assert_array_equal(sim.method.global_model()["w"],
                                    sim.method.tier_models[0]["w"])
      checked = True
  assert checked


def test_fedat_compresses_both_directions_through_the_codec():
  codec = CountingCodec()
  num_examples = np.full(20, 400)
  trainer = RecordingTrainer(num_examples, 10)
  config = small_config(max_virtual_time_s=100.0)
  sim = make_simulator(config, FedAT(FedATConfig(clients_per_round=3, compression_precision=2)),
                       codec=codec, trainer=trainer)
  sim.run()
  model_bytes = 2 * 6 + 4 * (1 + 1) * 2  # RoundingCodec: 2 bytes per value + shape metadata
  assert {m[2] for m in sim.messages} == {model_bytes}
  dispatches, rounds = entries(sim, "dispatch"), {e[5] for e in entries(sim, "dispatch")}
  uploads = entries(sim, "compute_done")
  # One download encoding per round (counted once per client), one per upload.
  assert codec.calls.count(2) == len(rounds) + len(uploads)
  assert len([m for m in sim.messages if m[1] == "down"]) == len(dispatches)
  for job in trainer.jobs:
    assert job.anchor is job.start_model and job.prox_coeff == 0.4 and job.num_epochs == 3
    for leaf in job.start_model.values():
      np.testing.assert_array_equal(
          leaf, (np.round(leaf.astype(np.float64) * 100) / 100).astype(np.float32))


def test_fedat_tier_models_are_sample_weighted_means():
  num_examples = 350 + 10 * np.arange(20)
  trainer = ShiftTrainer(num_examples, 10)
  config = degenerate_config(max_virtual_time_s=10.0)
  sim = make_simulator(config, FedAT(FedATConfig(clients_per_round=4, compression_precision=None)),
                       num_examples=num_examples, trainer=trainer)
  sim.run(until=0.0)
  sampled = [e[3] for e in entries(sim, "dispatch")]
  while sim.method.global_updates == 0:
    sim.run(max_events=1)
  # The round's models are w0 + shift: 0.01 (k + 1) + 0.001 j + 0.0001 E - 0.01 lambda with
  # j = 0, E = 3, lambda = 0.4; the weights are n_k / sum n_k.
  weights = num_examples[sampled] / num_examples[sampled].sum()
  expected = sum(w * (np.arange(4) * np.float32(0.1)).astype(np.float64) for w in weights) + sum(
      w * (0.01 * (k + 1) + 0.0003 - 0.004) for w, k in zip(weights, sampled))
  np.testing.assert_allclose(sim.method.global_model()["w"], expected, rtol=1e-6)


def test_polyline_codec_in_fedat_when_available():
  if importlib.util.find_spec("fedjax_lama.compression.polyline") is None:
    pytest.skip("fedjax_lama.compression.polyline is not available")
  try:
    fast, slow = PolylineCodec(), PolylineCodec(fast=False)
  except ImportError as err:  # the module exists but does not import yet
    pytest.skip(f"polyline codec does not import: {err}")
  rng = np.random.default_rng(0)
  tree = {"k": (0.1 * rng.normal(size=(3, 3, 2))).astype(np.float32),
          "b": np.zeros(4, np.float32), "d": rng.normal(size=7)}
  for precision in (1, 3, 4, 6):
    (a, na), (b, nb) = fast.roundtrip(tree, precision), slow.roundtrip(tree, precision)
    assert na == nb and trees_equal(a, b)
    assert np.abs(a["k"] - tree["k"]).max() <= 0.5 * 10.0 ** -precision + 1e-6
  raw, raw_bytes = fast.roundtrip(tree, None)
  assert raw is tree and raw_bytes == 4 * (18 + 4 + 7)
  sim = make_simulator(small_config(max_virtual_time_s=60.0), FedAT(), codec=fast)
  sim.run()
  assert sim.method.global_updates > 0
  sizes = {m[2] for m in sim.messages}
  assert len(sizes) > 1  # polyline sizes depend on the values


# ----------------------------------------------------------------------------- FedProx


def test_fedprox_epochs_and_compute_times_come_from_prox_e():
  seed = 5
  num_examples = np.full(20, 400)
  trainer = RecordingTrainer(num_examples, 10)
  config = small_config(seed=seed, straggler_ranges=[(0.0, 0.0)], num_tiers=1,
                        max_virtual_time_s=100.0)
  sim = make_simulator(config, FedProx(), trainer=trainer)
  sim.run()
  epochs = {}
  for job in trainer.jobs:
    u = np.random.default_rng([seed, 12, job.client_id, job.index]).random()
    assert job.num_epochs == 1 + math.floor(3 * u) and job.prox_coeff == 0.4
    epochs[(job.client_id, job.index)] = job.num_epochs
  assert set(epochs.values()) == {1, 2, 3}
  dispatched = {(e[3], e[4]): e[1] for e in entries(sim, "dispatch")}
  for _, t_c, _, k, j, _ in entries(sim, "compute_done"):
    assert t_c == dispatched[(k, j)] + 0.0 + 0.05 * (40 * epochs[(k, j)]) + 0.0
  fixed = RecordingTrainer(num_examples, 10)
  make_simulator(config, FedProx(FedProxConfig(variable_epochs=False, mu=0.1)),
                 trainer=fixed).run()
  assert {(j.num_epochs, j.prox_coeff) for j in fixed.jobs} == {(3, 0.1)}


# ----------------------------------------------------------------------------- TiFL


def test_change_probs_hand_computed():
  acc = [0.5, 0.7, 0.6, 0.9, 0.8]
  # Ascending accuracy: tiers 0, 2, 1, 4, 3 get ranks 1..5; D = 5 * 4 / 2 = 10.
  assert change_probs(acc, [True] * 5, "paper") == [F(4, 10), F(2, 10), F(3, 10), F(0), F(1, 10)]
  # Tier 0 without credits: n = 4, D = 6; ranks 1..4 are tiers 2, 1, 4, 3.
  assert change_probs(acc, [False] + [True] * 4, "paper") == [F(0), F(2, 6), F(3, 6), F(0),
                                                                F(1, 6)]
  # all_positive: D = 5 * 6 / 2 = 15, i = 0..4 -> (5 - i) / 15.
  assert change_probs(acc, [True] * 5, "all_positive") == [F(5, 15), F(3, 15), F(4, 15),
                                                            F(1, 15), F(2, 15)]
  # One credited tier gets everything; ties break by tier index.
  assert change_probs(acc, [False, False, True, False, False]) == [0, 0, 1, 0, 0]
  assert change_probs([0.5, 0.5, 0.5], [True] * 3) == [F(2, 3), F(1, 3), F(0)]


def test_select_tier_hand_computed():
  probs = [F(4, 10), F(2, 10), F(3, 10), F(0), F(1, 10)]
  # Cumulative: 0.4, 0.6, 0.9, 0.9, 1.0.
  assert [select_tier(probs, [True] * 5, u) for u in (0.0, 0.39, 0.4, 0.65, 0.9, 0.95)] == [
      0, 0, 1, 2, 4, 4]
  # Tier 2 without credits: renormalise over 0.4 + 0.2 + 0.1 = 0.7 -> cumulative 4/7, 6/7, 1.
  assert select_tier(probs, [True, True, False, True, True], 0.6) == 1
  assert select_tier(probs, [True, True, False, True, True], 0.86) == 4
  # Only zero-probability tiers left: equally likely.
  assert select_tier(probs, [False, False, False, True, False], 0.3) == 3
  assert select_tier(probs, [False] * 5, 0.3) is None


def test_tifl_credits_probes_and_tier_rounds():
  config = small_config(num_clients=25, max_virtual_time_s=2000.0)
  sim = make_simulator(config, TiFL(TiFLConfig(clients_per_round=3, tifl_rounds=10,
                                               tifl_interval=3)))
  sim.run()
  method = sim.method
  assert method.stopped and method.credits == [0] * 5 and method.global_updates == 10
  rounds = {}
  for _, _, _, k, _, (group, r) in entries(sim, "dispatch"):
    assert group == 0
    rounds.setdefault(r, set()).add(int(sim.setup.tiers[k]))
  assert sorted(rounds) == list(range(10)) and all(len(t) == 1 for t in rounds.values())
  assert sorted(min(t) for t in rounds.values()).count(0) == 2  # two credits per tier
  # Accuracy collection at r = 0, 3, 6, 9: 25 raw downloads and 25 * 8 bytes up each time.
  probes = [m for m in sim.messages if m[4] == "accuracy_probe"]
  assert sorted(method.accuracy_history) == [0, 3, 6, 9]
  assert len(probes) == 4 * 2 * 25
  assert {(m[1], m[2]) for m in probes} == {("down", 24), ("up", 8)}


@pytest.mark.parametrize("require", [True, False])
def test_tifl_probabilities_follow_changeprobs_on_stagnation(require):
  interval = 2
  config = small_config(num_clients=25, max_virtual_time_s=1500.0)
  sim = make_simulator(config, TiFL(TiFLConfig(clients_per_round=3, tifl_interval=interval,
                                               tifl_require_stagnation=require)))
  method = sim.method
  outcomes = set()
  while True:
    r_before, cur, probs = method.round_index, method.current_tier, list(method.probs)
    eligible = [c > 0 for c in method.credits]  # every client stays alive here
    if sim.run(max_events=1):
      break
    r = method.round_index
    if r == r_before or r % interval or r < interval:
      continue
    latest, earlier = method.accuracy_history[r], method.accuracy_history[r - interval]
    stagnated = latest[cur] <= earlier[cur]
    expected = change_probs(latest, eligible, "paper") if (stagnated or not require) else probs
    assert method.probs == expected
    outcomes.add(stagnated)
  assert outcomes == {True, False}  # both branches were exercised


def test_tifl_probe_downloads_take_time_with_a_network_model():
  config = small_config(num_clients=25, max_virtual_time_s=300.0,
                        network_model=NetworkModel(kind="fixed", latency_down_s=1.5,
                                                   bandwidth_down_bytes_per_s=24.0))
  sim = make_simulator(config, TiFL(TiFLConfig(clients_per_round=3, tifl_interval=4)))
  sim.run()
  timers = entries(sim, "timer")
  assert [e[4] for e in timers] == [4 * i for i in range(len(timers))] and len(timers) >= 2
  # Round r starts 1.5 + 24 / 24 = 2.5 s after the probe of round r.
  first_dispatch = entries(sim, "dispatch")[0]
  assert timers[0][1] == 2.5 and first_dispatch[1] == 2.5


# ----------------------------------------------------------------------------- FedAsync


def test_staleness_functions_hand_computed():
  assert staleness_weight(1, "constant") == 1.0 and staleness_weight(9, "constant") == 1.0
  # (d + 1)^-0.5: d = 1 -> 1/sqrt(2), d = 3 -> 1/2, d = 8 -> 1/3.
  assert staleness_weight(1, "polynomial", poly_a=0.5) == 2 ** -0.5
  assert staleness_weight(3, "polynomial", poly_a=0.5) == 0.5
  assert staleness_weight(8, "polynomial", poly_a=0.5) == pytest.approx(1 / 3, abs=1e-15)
  assert staleness_weight(3, "polynomial", poly_a=2.0) == 1 / 16
  # hinge a = 10, b = 4: 1 up to d = 4, then 1 / (10 (d - 4) + 1).
  assert [staleness_weight(d, "hinge", hinge_a=10, hinge_b=4) for d in (1, 4, 5, 6)] == [
      1.0, 1.0, 1 / 11, 1 / 21]
  with pytest.raises(ValueError, match="staleness"):
    staleness_weight(1, "exponential")


def test_fedasync_mixes_each_arrival_and_redispatches_the_client():
  config = small_config(max_virtual_time_s=40.0)
  algebra = NumpyAlgebra()
  sim = make_simulator(config, FedAsync(FedAsyncConfig(alpha=0.5, staleness="hinge", hinge_a=2.0,
                                                       hinge_b=1.0)))
  sim.run(until=0.0)
  assert len(entries(sim, "dispatch")) == 20  # everyone starts at time 0 from version 0
  arrivals, stale = 0, 0
  while sim.queue and sim.queue.peek().time <= config.max_virtual_time_s:
    event = sim.queue.peek()
    is_arrival = event.cls == 1 and event.payload[0] == 1
    if is_arrival:
      job = sim.jobs[event.payload[1]]
      before, version = sim.method.model, sim.method.version
    log_length = len(sim.event_log)
    sim.run(max_events=1)
    if not is_arrival:
      continue
    arrivals += 1
    tau = job.context[1]
    staleness = version + 1 - tau
    stale += staleness > 1
    # hinge a = 2, b = 1: s = 1 for staleness <= 1, else 1 / (2 (staleness - 1) + 1).
    alpha_t = 0.5 * (1.0 if staleness <= 1 else 1.0 / (2.0 * (staleness - 1) + 1.0))
    expected = algebra.weighted_sum([before, job.upload_model], [1.0 - alpha_t, alpha_t])
    assert trees_equal(sim.method.model, expected) and sim.method.version == version + 1
    arrival, redispatch = sim.event_log[log_length:log_length + 2]
    assert arrival[2:5] == ("arrival", job.client, job.index)
    assert redispatch[1:5] == (arrival[1], "dispatch", job.client, job.index + 1)
    assert redispatch[5] == (0, version + 1)
  assert arrivals == sim.method.global_updates > 20 and stale > 0


# ----------------------------------------------------------------------------- ASO-Fed


def test_asofed_global_model_is_the_data_weighted_mean_of_client_copies():
  num_examples = 300 + 20 * np.arange(20)
  sim = make_simulator(small_config(max_virtual_time_s=30.0), ASOFed(ASOFedConfig()),
                       num_examples=num_examples)
  sim.run()
  method = sim.method
  arrived = {e[3] for e in entries(sim, "arrival")}
  assert 0 < len(arrived) < 20
  for k in range(20):
    if k not in arrived:
      assert method.copies[k] is sim.initial_model
  shares = num_examples / num_examples.sum()
  expected = sum(s * method.copies[k]["w"].astype(np.float64) for k, s in enumerate(shares))
  np.testing.assert_allclose(method.model["w"], expected, rtol=1e-6)
  assert method.global_updates == len(entries(sim, "arrival"))


@pytest.mark.parametrize("method", [ASOFed, FedAsync, FedAT, FedAvg, FedProx, TiFL])
def test_every_method_defaults_its_config_and_refuses_another_type(method):
  assert isinstance(method().config, method.config_type)
  other = FedAsyncConfig() if method is not FedAsync else FedATConfig()
  with pytest.raises(ValueError, match=f"{method.name}: config must be a "
                     f"{method.config_type.__name__}, got {type(other).__name__}"):
    method(other)
