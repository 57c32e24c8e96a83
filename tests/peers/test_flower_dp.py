"""Our user-level DP stage beside Flower's central DP with server-side fixed clipping (slow;
needs flwr).

    pip install flwr==1.42.0   # requirements-peers.txt; into a virtual environment of its own
    python -m pytest -q -n 0 -m slow tests/peers/test_flower_dp.py -s

Identical inputs, float64 on both sides: the same initial arrays and, in every round, the
same fixed client uploads (each client's model after local training). Flower's
DifferentialPrivacyServerSideFixedClipping wraps FedAvg and gets the uploads through
configure_fit and aggregate_fit (third_party/flower_peer.py `run_dp_fixed_clipping`). Ours
drives the stage of config.privacy (privacy/mechanisms.py `user_level_dp`) as the engine does: the
stage's client part clips each update y_i - x against the current server model x, the
clipped updates are summed over the real clients of a padded cohort (padded slots hold NaN
and weigh 0), the server part divides the sum by the expected cohort, and FedAvg adds the
result to x (server learning rate 1). sigma = 0 in the compared runs: noise is random on
both sides and drawn from different generators.

Conventions (McMahan et al., ICLR 2018, DP-FedAvg with a fixed clip):
  * Clipping: both clip the update relative to the model the server sent, flat over the
    whole model, scale min(1, C / ||update||). Our norm (the library's one, tree.global_norm)
    accumulates in the update's dtype, at least float32: float64 here, as Flower's, so the two
    agree to float64 rounding (checked). With float32 uploads the norm is float32 and a
    clipped update moves by float32 rounding of it (a relative 1e-7).
    A zero update: ours keeps it (scale 1); Flower's scale divides by its norm (0/0).
  * Weights: Flower's FedAvg weights the clipped updates by example counts; ours weighs every
    client 1 (a weight would reveal a client's data size and unbound its effect). The
    compared runs give Flower equal counts; the distance under unequal counts is checked
    below as a number.
  * Denominator: Flower divides the sum by the k clients that came (FedAvg's mean); ours by
    the expected cohort m (a fixed denominator bounds one client's effect by C / m). Equal
    when all m sampled clients come; with k < m the conversion m / k on our update
    reproduces Flower, and the unconverted distance is checked as a number.
  * Noise: Flower adds N(0, (sigma C / m)^2) to the averaged model, m its
    num_sampled_clients, whatever k; ours adds N(0, sigma^2 C^2) to the sum and divides by
    m: the same stddev, checked on samples of both.
"""
import numpy as np
import pytest

flwr = pytest.importorskip(
    "flwr",
    reason="Flower (flwr) is not installed: pip install flwr==1.42.0 (requirements-peers.txt)")

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position

from fedjax_lama.engine import stages  # pylint: disable=wrong-import-position
from fedjax_lama.privacy import dp_options, mechanisms  # pylint: disable=wrong-import-position
from third_party import flower_peer  # pylint: disable=wrong-import-position

pytestmark = pytest.mark.slow

ROUNDS = 4
COHORT = 5              # m: Flower's num_sampled_clients, our fixed cohort size
POPULATION = 50         # N (the stage reads only m; the options need a population)
CLIP = 1.0              # C, exact in float32 (the stage keeps its clip in float32)
SHAPES = {"kernel": (6, 4), "bias": (4,)}  # Flower's list order: kernel, bias
KEYS = ("kernel", "bias")
# Spread of each client's upload around the moving centre: update norms from about 0.3 to 5,
# so two of the five stay under C = 1 and three are clipped.
SPREADS = (0.05, 0.1, 0.3, 0.6, 1.0)
EQUAL_COUNTS = (40,) * COHORT
UNEQUAL_COUNTS = (30, 50, 20, 100, 40)
# Slots of our padded stack (7): the clients in order, NaN in slots 1 and 5.
SLOTS = (0, None, 1, 2, 3, None, 4)
# Largest |ours - Flower| after ROUNDS rounds when Flower's FedAvg weights the clipped updates
# by UNEQUAL_COUNTS and ours weighs them uniformly (sigma = 0, all clients come), measured
# with flwr 1.42.0.
UNIFORM_VS_EXAMPLE_WEIGHTS = 1.06983e-1
# Largest |ours - Flower| after one round in which client 4 did not come (k = 4 of m = 5):
# Flower's mean over 4 against our sum / 5, measured with flwr 1.42.0.
EXPECTED_VS_ARRIVED_DENOMINATOR = 6.22906e-2
# float64 norms on both sides: the server models agree to float64 rounding.
FLOAT64_TOLERANCE = 1e-13


def initial() -> list[np.ndarray]:
  rng = np.random.default_rng(1)
  return [rng.normal(size=SHAPES[k]) for k in KEYS]


def uploads(seed: int = 0) -> list[list[list[np.ndarray]]]:
  """ROUNDS rounds of COHORT clients' models: a centre that drifts, plus each client's spread."""
  rng = np.random.default_rng(seed)
  start = initial()
  rounds = []
  for r in range(ROUNDS):
    centre = [x + 0.1 * (r + 1) for x in start]
    rounds.append([[c + s * rng.normal(size=c.shape) for c in centre] for s in SPREADS])
  return rounds


def dp_options_for(noise_multiplier: float) -> dp_options.DpOptions:
  sampling = dp_options.SamplingOptions("fixed", POPULATION, cohort_size=COHORT)
  return dp_options.DpOptions(noise_multiplier=noise_multiplier, clip_norm=CLIP,
                              sampling=sampling)


def as_tree(arrays):
  return {k: jnp.asarray(a) for k, a in zip(KEYS, arrays, strict=True)}


def as_list(tree):
  return [np.asarray(tree[k]) for k in KEYS]


def our_round(dp, state, server_model, clients, present, key):
  """One round of the stage on a padded cohort: client clip, masked sum, server mean.

  Returns:
    (the server's update, the clients' update norms before clipping).
  """
  stack = {k: np.full((len(SLOTS),) + SHAPES[k], np.nan) for k in KEYS}
  mask = np.zeros(len(SLOTS))
  for slot, client in enumerate(SLOTS):
    if client is not None and client in present:
      for j, k in enumerate(KEYS):
        stack[k][slot] = clients[client][j] - np.asarray(server_model[k])
      mask[slot] = 1.0
  keys = jax.random.split(jax.random.fold_in(key, 1), len(SLOTS))
  out = jax.vmap(dp.client, in_axes=(0, None, 0))(
      {k: jnp.asarray(v) for k, v in stack.items()}, state, keys)
  # The engine's participant sum: padded slots weigh 0 (where, not a product: NaN * 0 is NaN).
  total = jax.tree.map(
      lambda v: jnp.sum(jnp.where(mask.reshape((-1,) + (1,) * (v.ndim - 1)) > 0, v, 0.0),
                        axis=0), out)
  update, state, _ = dp.server(stages.Sums(total, jnp.sum(mask)), state,
                               jax.random.fold_in(key, 2))
  norms = [np.sqrt(sum(np.sum((clients[i][j] - np.asarray(server_model[k])) ** 2)
                       for j, k in enumerate(KEYS))) for i in present]
  return update, state, norms


def ours(rounds, present_per_round, *, noise_multiplier=0.0, convert_to_arrived=False):
  """Our server model after each round; `convert_to_arrived` scales each update by m / k."""
  dp = mechanisms.user_level_dp(dp_options_for(noise_multiplier))
  model = as_tree(initial())
  state = dp.init(model)
  history, all_norms = [], []
  for r, (clients, present) in enumerate(zip(rounds, present_per_round, strict=True)):
    update, state, norms = our_round(dp, state, model, clients, present,
                                     jax.random.PRNGKey(r))
    scale = COHORT / len(present) if convert_to_arrived else 1.0
    model = jax.tree.map(lambda x, u: x + scale * u, model, update)
    history.append(as_list(model))
    all_norms += norms
  return history, all_norms


def flowers(rounds, present_per_round, counts, *, noise_multiplier=0.0):
  return flower_peer.run_dp_fixed_clipping(
      initial(), [[clients[i] for i in present] for clients, present in
                  zip(rounds, present_per_round, strict=True)],
      [[counts[i] for i in present] for present in present_per_round],
      noise_multiplier=noise_multiplier, clip_norm=CLIP, num_sampled_clients=COHORT)


ALL = tuple(range(COHORT))


def test_dp_fixed_clipping_sigma_0_equals_flowers_on_identical_uploads():
  rounds = uploads()
  with jax.enable_x64(True):
    mine, norms = ours(rounds, [ALL] * ROUNDS)
  peer = flowers(rounds, [ALL] * ROUNDS, EQUAL_COUNTS)
  distances = [flower_peer.largest_difference(a, b) for a, b in zip(mine, peer, strict=True)]
  print(f"\nDP fixed clipping, sigma 0, vs Flower {flower_peer.version()}, float64: largest "
        "difference per round " + ", ".join(f"{d:.3g}" for d in distances))
  assert all(a.dtype == np.float64 for arrays in mine for a in arrays)
  # Both branches of the clip are exercised in every round.
  assert sum(n > CLIP for n in norms) >= 2 * ROUNDS and sum(n < CLIP for n in norms) >= ROUNDS
  # The norm accumulates in the uploads' float64, as Flower's: float64 rounding apart.
  assert max(distances) < FLOAT64_TOLERANCE
  # Not a trivial agreement: the unclipped FedAvg mean lands far from both.
  plain = [np.mean([c[j] for c in rounds[0]], axis=0) for j in range(len(KEYS))]
  assert flower_peer.largest_difference(plain, peer[0]) > 0.1


def test_distance_of_uniform_weights_from_flowers_example_weights():
  rounds = uploads()
  with jax.enable_x64(True):
    mine, _ = ours(rounds, [ALL] * ROUNDS)
  peer = flowers(rounds, [ALL] * ROUNDS, UNEQUAL_COUNTS)
  distance = flower_peer.largest_difference(mine[-1], peer[-1])
  print(f"\nuniform weights vs Flower {flower_peer.version()}'s example-weighted FedAvg "
        f"(counts {UNEQUAL_COUNTS}), after {ROUNDS} rounds: largest difference {distance:.6g}")
  assert distance == pytest.approx(UNIFORM_VS_EXAMPLE_WEIGHTS, rel=1e-3)


def test_expected_cohort_denominator_converts_to_flowers_arrived_count():
  rounds = uploads()
  present = [ALL, ALL[:-1], ALL, ALL[1:]]  # client 4 misses round 2, client 0 round 4
  with jax.enable_x64(True):
    converted, _ = ours(rounds, present, convert_to_arrived=True)
    unconverted, _ = ours(rounds[1:2], present[1:2])
  peer = flowers(rounds, present, EQUAL_COUNTS)
  distances = [flower_peer.largest_difference(a, b)
               for a, b in zip(converted, peer, strict=True)]
  # One round from the initial model with k = 4: our sum / 5 against Flower's mean over 4.
  peer_one = flowers(rounds[1:2], present[1:2], EQUAL_COUNTS)
  unconverted_distance = flower_peer.largest_difference(unconverted[0], peer_one[0])
  print(f"\nour update x m / k vs Flower {flower_peer.version()} with clients missing: largest "
        "difference per round " + ", ".join(f"{d:.3g}" for d in distances)
        + f"; unconverted (sum / m against Flower's sum / k), one round k = 4: "
        f"{unconverted_distance:.6g}")
  assert max(distances) < FLOAT64_TOLERANCE
  assert unconverted_distance == pytest.approx(EXPECTED_VS_ARRIVED_DENOMINATOR, rel=1e-3)


def test_noise_stddev_is_flowers_sigma_c_over_m():
  """Both sides noise a zero update; the sample stddev of many coordinates is sigma C / m."""
  sigma, coordinates = 1.3, 200_000
  expected = flower_peer.dp_fixed_clipping_stddev(sigma, CLIP, COHORT)
  assert expected == pytest.approx(sigma * CLIP / COHORT, rel=1e-12)
  # Ours: the server part on a zero sum.
  dp = mechanisms.user_level_dp(dp_options_for(sigma))
  zero = {"update": {"w": jnp.zeros(coordinates)}, "unclipped": jnp.float32(0)}
  noised, _, _ = dp.server(stages.Sums(zero, jnp.float32(COHORT)), dp.init(None),
                           jax.random.PRNGKey(7))
  ours_std = float(np.std(np.asarray(noised["w"], np.float64)))
  # Flower: every client uploads the initial model moved by 1e-9 (Flower's clip divides by
  # the update's norm, 0/0 for a zero update; ours scales a zero update by 1), so the new
  # model is that move plus Flower's noise.
  start = [np.zeros(coordinates)]
  moved = [np.full(coordinates, 1e-9)]
  peer = flower_peer.run_dp_fixed_clipping(start, [[moved] * COHORT], [EQUAL_COUNTS],
                                           noise_multiplier=sigma, clip_norm=CLIP,
                                           num_sampled_clients=COHORT, seed=3)
  flower_std = float(np.std(peer[0][0]))
  print(f"\nnoise stddev sigma C / m = {expected:.6g}: ours {ours_std:.6g}, Flower "
        f"{flower_peer.version()} {flower_std:.6g} ({coordinates} coordinates)")
  # The sample stddev of 2e5 normals is within 1% of the true one (its relative error has
  # stddev 1 / sqrt(2 n) = 0.16%).
  assert ours_std == pytest.approx(expected, rel=1e-2)
  assert flower_std == pytest.approx(expected, rel=1e-2)
