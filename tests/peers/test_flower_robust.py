"""Our robust rules beside Flower's robust aggregate functions on identical uploads (slow;
needs flwr).

    pip install flwr==1.42.0   # requirements-peers.txt; into a virtual environment of its own
    python -m pytest -q -n 0 -m slow tests/peers/test_flower_robust.py -s

Identical inputs, float64 on both sides: the uploads of 11 clients (two of them far off,
playing Byzantine) with unequal example counts. Flower gets the list of the real clients'
arrays (third_party/flower_peer.py `robust_aggregate`); ours gets the same rows stacked into
[C, ...] leaves with padded slots holding NaN and a client mask, so the comparison also checks
that the padding changes nothing. A second cohort drops two clients (n = 9) under the same
compiled shape.

Conventions. Krum's neighbour count (n - f - 2, at least 1 inside Bulyan's late recursions),
Bulyan's theta = n - 2f and beta = theta - 2f, the coordinate median (the mean of the two
middle values for an even count) and the trimmed mean's floor(beta n) per side agree. One
differs: Flower's Multi-Krum averages the m selected uploads weighted by their example counts;
Blanchard et al. (NeurIPS 2017) average them uniformly. Ours takes the weights it is given:
example counts reproduce Flower, the mask reproduces the paper, and the distance between the
two readings is stated below as a checked number.
"""
import numpy as np
import pytest

flwr = pytest.importorskip(
    "flwr",
    reason="Flower (flwr) is not installed: pip install flwr==1.42.0 (requirements-peers.txt)")

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position

from fedjax_lama import robust  # pylint: disable=wrong-import-position
from third_party import flower_peer  # pylint: disable=wrong-import-position

pytestmark = pytest.mark.slow

NUM_EXAMPLES = (30, 50, 20, 100, 40, 70, 10, 60, 80, 25, 45)
SHAPES = {"kernel": (3, 2), "bias": (2,)}  # Flower's list order: kernel, bias
KEYS = ("kernel", "bias")
# Slots of our padded stack (13): the real clients in order, NaN in slots 2 and 9.
SLOTS = (0, 1, None, 2, 3, 4, 5, 6, 7, None, 8, 9, 10)
# The second cohort: clients 1 and 6 absent (n = 9).
ABSENT = (1, 6)
F = 2  # Krum: n > 2f + 2; Bulyan: n >= 4f + 3 (11 clients); the second cohort runs Bulyan at f = 1
MULTI_KRUM_KEEP = 5
TRIM = 0.2  # floor(0.2 * 11) = 2 per side; floor(0.2 * 9) = 1
# Largest |Multi-Krum averaged uniformly (Blanchard et al.) - Flower's example-weighted mean|
# on the inputs below, m = 5, f = 2, measured with flwr 1.42.0 (the selected uploads differ
# by about 0.1, so weighting them differently moves the mean by a fraction of that).
PAPER_VS_FLOWER_MULTI_KRUM = 4.825e-2


def uploads(seed: int = 0) -> list[list[np.ndarray]]:
  """11 clients' arrays: a common model plus noise; clients 3 and 8 far off."""
  rng = np.random.default_rng(seed)
  centre = [rng.normal(size=SHAPES[k]) for k in KEYS]
  clients = [[c + 0.1 * rng.normal(size=c.shape) for c in centre] for _ in NUM_EXAMPLES]
  for bad in (3, 8):
    clients[bad] = [c + 3.0 * rng.normal(size=c.shape) for c in centre]
  return clients


def padded_stack(clients, present):
  """Our [13, ...] stack, mask and example counts: client i in its slot when present, NaN in
  padded and absent slots."""
  stack = {k: np.full((len(SLOTS),) + SHAPES[k], np.nan) for k in KEYS}
  mask = np.zeros(len(SLOTS))
  counts = np.zeros(len(SLOTS))
  for slot, client in enumerate(SLOTS):
    if client is not None and client in present:
      for j, k in enumerate(KEYS):
        stack[k][slot] = clients[client][j]
      mask[slot], counts[slot] = 1.0, NUM_EXAMPLES[client]
  return stack, mask, counts


@jax.jit
def ours(stack, mask, counts):
  """Every compared rule on one padded cohort (f = 2 except Bulyan at f = (n - 3) // 4)."""
  n = jnp.sum(mask)
  bulyan = jax.lax.cond(n >= 11, lambda: robust.bulyan(stack, mask, 2)[0],
                        lambda: robust.bulyan(stack, mask, 1)[0])
  return {
      "krum": robust.krum(stack, mask, F)[0],
      "multi_krum": robust.multi_krum(stack, mask, counts, F, MULTI_KRUM_KEEP)[0],
      "multi_krum_paper": robust.multi_krum(stack, mask, mask, F, MULTI_KRUM_KEEP)[0],
      "bulyan": bulyan,
      "median": robust.coordinate_median(stack, mask)[0],
      "trimmed_mean": robust.trimmed_mean(stack, mask, TRIM)[0],
  }


def flowers(clients, present):
  kept = [clients[i] for i in sorted(present)]
  counts = [NUM_EXAMPLES[i] for i in sorted(present)]
  f_bulyan = 2 if len(kept) >= 11 else 1
  run = lambda rule, **kw: flower_peer.robust_aggregate(rule, kept, counts, **kw)
  return {
      "krum": run("krum", num_malicious=F),
      "multi_krum": run("multi_krum", num_malicious=F, to_keep=MULTI_KRUM_KEEP),
      "bulyan": run("bulyan", num_malicious=f_bulyan),
      "median": run("median"),
      "trimmed_mean": run("trimmed_mean", proportiontocut=TRIM),
  }


COHORTS = {"all_11": tuple(range(11)), "9_of_11": tuple(i for i in range(11) if i not in ABSENT)}


@pytest.mark.parametrize("cohort", list(COHORTS))
def test_robust_rules_equal_flowers_on_identical_uploads(cohort):
  clients, present = uploads(), COHORTS[cohort]
  with jax.enable_x64(True):
    mine = ours(*padded_stack(clients, present))
    mine = {name: [np.asarray(value[k]) for k in KEYS] for name, value in mine.items()}
  peer = flowers(clients, present)
  distances = {name: flower_peer.largest_difference(mine[name], peer[name]) for name in peer}
  print(f"\n{cohort} vs Flower {flower_peer.version()}, float64: largest differences "
        + ", ".join(f"{k} {v:.3g}" for k, v in distances.items()))
  assert all(a.dtype == np.float64 for arrays in mine.values() for a in arrays)
  assert distances["krum"] == 0.0  # one client's upload, bit for bit
  assert max(distances.values()) < 1e-13
  # The far-off clients moved the plain mean: the rules are not compared on a trivial input.
  mean = [np.mean([c[j] for c in clients], axis=0) for j in range(len(KEYS))]
  assert flower_peer.largest_difference(mean, peer["median"]) > 0.1


def test_distance_of_the_papers_multi_krum_from_flowers():
  clients, present = uploads(), COHORTS["all_11"]
  with jax.enable_x64(True):
    mine = ours(*padded_stack(clients, present))["multi_krum_paper"]
  peer = flower_peer.robust_aggregate("multi_krum", clients, NUM_EXAMPLES, num_malicious=F,
                                      to_keep=MULTI_KRUM_KEEP)
  distance = flower_peer.largest_difference([np.asarray(mine[k]) for k in KEYS], peer)
  print(f"\nMulti-Krum averaged uniformly (Blanchard et al.) vs Flower "
        f"{flower_peer.version()}'s example-weighted mean: largest difference {distance:.3g}")
  assert distance == pytest.approx(PAPER_VS_FLOWER_MULTI_KRUM, rel=1e-3)
