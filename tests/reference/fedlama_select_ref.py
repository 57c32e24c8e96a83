"""Exact loop reference for FedLAMA interval selection (known answers in
tests/test_interval_selection.py).

Test-only. It restates the selection as a plain loop (Lee et al., AAAI 2023, Algorithm 1) with one
layer per loop iteration and `fractions.Fraction` arithmetic, so every comparison is exact. The
jitted, vectorised `select_intervals` is checked against it.
"""

from fractions import Fraction
from typing import Optional, Sequence

RULES = ("aaai", "code", "v1", "accelerate")


def _walk_order(d, layers, descending):
  """Stable sort of `layers` by d: ties keep the caller's order."""
  sign = -1 if descending else 1
  return sorted(layers, key=lambda i: sign * d[i])


def select_ref(d: Sequence[float],
               sizes: Sequence[int],
               phi: int,
               rule: str = "aaai",
               kernel_mask: Optional[Sequence[bool]] = None) -> list:
  """Per-layer multipliers in the caller's order, exact arithmetic."""
  if rule not in RULES:
    raise ValueError(f"unknown rule {rule!r}")
  if kernel_mask is not None and rule != "code":
    raise ValueError("kernel_mask is only for rule 'code'")
  n = len(d)
  d = [Fraction(float(x)) for x in d]  # exact: every float is a rational
  sizes = [int(s) for s in sizes]
  result = [1] * n
  if phi == 1:
    return result
  total_d = sum(d[i] * sizes[i] for i in range(n))  # over every layer
  if total_d == 0:
    return [phi] * n if rule == "accelerate" else result

  if rule == "accelerate":
    total_s = sum(sizes)
    cum_d, cum_s = Fraction(0), 0
    for i in _walk_order(d, range(n), descending=True):
      cum_d += d[i] * sizes[i]
      cum_s += sizes[i]
      short = Fraction(cum_s, total_s) < 1 - cum_d / total_d
      result[i] = 1 if short else phi
    return result

  walked = [i for i in range(n) if kernel_mask is None or kernel_mask[i]]
  total_s = sum(sizes[i] for i in walked)
  cum_d, cum_s = Fraction(0), 0
  for i in _walk_order(d, walked, descending=False):
    cum_d += d[i] * sizes[i]
    cum_s += sizes[i]
    delta, lam = cum_d / total_d, Fraction(cum_s, total_s)
    if rule == "aaai":
      result[i] = phi if delta < 1 - lam else 1
    elif rule == "v1":
      result[i] = phi if delta < lam else 1
    else:  # "code": the layer where the curves cross is kept, then stop.
      result[i] = phi
      if delta > 1 - lam:
        break
  return result


def comm_ratio_ref(mult: Sequence[int], sizes: Sequence[int], phi: int,
                   rule: str) -> Fraction:
  """Steady-state per-window ratio against FedAvg(tau') (Lee et al., AAAI 2023, communication
  cost)."""
  per_unit = sum(Fraction(int(s), int(m)) for s, m in zip(sizes, mult))
  scale = phi if rule == "accelerate" else 1
  return scale * per_unit / sum(int(s) for s in sizes)


def min_margin(d: Sequence[float], sizes: Sequence[int], rule: str,
               kernel_mask: Optional[Sequence[bool]] = None) -> Fraction:
  """Smallest |lhs - rhs| / (D * S) over the comparisons that decide the output.

  Used to keep random float32 tests away from near-equalities, where float32
  and exact arithmetic may legitimately disagree. The exact equality
  delta_L == lambda_L of "v1" at the last position is excluded (implementations
  must get it exactly right, and the tests check it separately).
  """
  n = len(d)
  d = [Fraction(float(x)) for x in d]
  sizes = [int(s) for s in sizes]
  total_d = sum(d[i] * sizes[i] for i in range(n))
  if total_d == 0 or n == 0:
    return Fraction(1)
  walked = [i for i in range(n) if kernel_mask is None or kernel_mask[i]]
  if not walked:
    return Fraction(1)
  total_s = sum(sizes[i] for i in walked)
  order = _walk_order(d, walked, descending=(rule == "accelerate"))
  cum_d, cum_s, best = Fraction(0), 0, Fraction(1)
  for k, i in enumerate(order, 1):
    cum_d += d[i] * sizes[i]
    cum_s += sizes[i]
    delta, lam = cum_d / total_d, Fraction(cum_s, total_s)
    if rule == "aaai":
      gap = (1 - lam) - delta
    elif rule == "v1":
      if k == len(order):
        continue
      gap = lam - delta
    elif rule == "accelerate":
      gap = (1 - delta) - lam
    else:
      gap = delta - (1 - lam)
    best = min(best, abs(gap))
    if rule == "code" and gap > 0:
      break
  return best


# The known-answer example, worked by hand.
NAMES = ("fc2.kernel", "conv1.bias", "conv2.kernel", "fc1.kernel",
         "bn2.scale", "fc1.bias", "conv1.kernel", "fc2.bias")
D = (3.0, 2.0, 2.0, 0.0625, 1.0, 24.0, 0.125, 1.5)
SIZES = (1280, 16, 4608, 20480, 32, 64, 432, 20)
KERNEL = (True, False, True, True, False, False, True, False)
