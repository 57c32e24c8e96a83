"""FedLAMA's layer-wise interval selection (Lee, Zhang,
Avestimehr, AAAI 2023, Algorithm 1; known answers in tests/test_interval_selection.py).

Reference:
  S. Lee, T. Zhang, S. Avestimehr, "Layer-wise Adaptive Model Aggregation for
  Scalable Federated Learning", AAAI 2023 (Algorithm 1); arXiv:2110.10302 v1
  (Algorithm 2 and the "accelerate" remark at the end of its section 4).

`select_intervals` maps the per-layer unit discrepancy d_l (Eq. 2) and the layer
sizes s_l to an integer multiplier per layer, in {1, phi}. The interval of layer
l is `multiplier * interval_unit(base_interval, phi, rule)` local steps.

Representation. For "aaai", "code" and "v1" the unit is the base
interval tau': 1 means tau', phi means phi * tau'. For "accelerate" the unit is
tau' / phi: 1 means the short interval tau' / phi (a selected, high-discrepancy
layer) and phi means the base interval tau'. In every rule the window is
`phi * unit` local steps, value 1 means "synchronised after every sub-round" and
value phi means "only at the window end", so the training loop and the
accounting never branch on the rule; use `interval_unit` / `window_length`
instead of assuming unit == tau'.

Numerics. The curves delta_k = P_k / D and lambda_k = S_k / S are
never divided out: comparisons are cross-multiplied (P * S < R * D), the totals
are the last element of the same cumulative sums (so delta_L == lambda_L == 1
exactly), and sizes are summed in integers. A plain loop over the layers is the
reference; the tests compare against an exact-rational copy of it
(tests/reference/fedlama_select_ref.py).
"""

from typing import NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

RULES = ("aaai", "code", "v1", "accelerate")

ArrayLike = Union[jax.Array, np.ndarray, list, tuple]
IntLike = Union[int, jax.Array]


class SelectionCurves(NamedTuple):
  """Cumulative curves in sorted order (for logging; v1 Fig. 1 / AAAI Fig. 2).

  Attributes:
    order: int32 [L], layer indices in the order the rule walks them (stable
      ascending d; stable descending d for "accelerate"; for "code" with a
      kernel mask the eligible layers first, then the ineligible ones).
    eligible: bool [L], whether the layer at each sorted position is walked.
    delta: float [L], delta_k (Eq. 3); 0 everywhere when D == 0.
    lam: float [L], lambda_k (Eq. 4); at ineligible positions it stays at 1.
  """
  order: jax.Array
  eligible: jax.Array
  delta: jax.Array
  lam: jax.Array


def _check_rule(rule: str) -> None:
  if rule not in RULES:
    raise ValueError(
        f"fedlama.interval_rule must be one of {list(RULES)}, got {rule!r}")


def _check_phi(phi: IntLike) -> None:
  """Validates a static phi; a traced phi only needs an integer scalar dtype."""
  if isinstance(phi, (int, np.integer)) and not isinstance(phi, bool):
    if phi < 1:
      raise ValueError(f"fedlama.phi must be an integer >= 1, got {phi}")
    return
  dtype = getattr(phi, "dtype", None)
  if (isinstance(phi, bool) or dtype is None or np.ndim(phi) != 0
      or not jnp.issubdtype(dtype, jnp.integer)):
    raise ValueError(f"fedlama.phi must be an integer >= 1, got {phi!r}")


def interval_unit(base_interval: int, phi: int, rule: str) -> int:
  """Local steps per multiplier unit: tau', or tau' / phi for "accelerate"."""
  _check_rule(rule)
  if not isinstance(phi, (int, np.integer)) or isinstance(phi, bool):
    raise ValueError(f"fedlama.phi must be a Python integer here, got {phi!r}")
  _check_phi(phi)
  if (isinstance(base_interval, bool)
      or not isinstance(base_interval, (int, np.integer)) or base_interval < 1):
    raise ValueError(
        f"fedlama.base_interval must be an integer >= 1, got {base_interval!r}")
  if rule != "accelerate":
    return int(base_interval)
  if base_interval % phi:
    raise ValueError(
        f"fedlama.base_interval ({base_interval}) must be divisible by "
        f"fedlama.phi ({phi}) for interval_rule='accelerate' (the short "
        "interval is base_interval / phi local steps)")
  return int(base_interval // phi)


def window_length(base_interval: int, phi: int, rule: str) -> int:
  """Local steps per window (phi * unit), after which every layer is synced."""
  return int(phi) * interval_unit(base_interval, phi, rule)


def base_multipliers(num_layers: int, phi: IntLike, rule: str) -> jax.Array:
  """Multipliers that make every interval tau', i.e. FedAvg(tau')."""
  _check_rule(rule)
  _check_phi(phi)
  base = phi if rule == "accelerate" else 1
  return jnp.full((num_layers,), base, dtype=jnp.int32)


def _prepare(discrepancy, sizes, rule, kernel_mask):
  """Validates static properties and converts the inputs to arrays."""
  _check_rule(rule)
  if kernel_mask is not None and rule != "code":
    raise ValueError(
        "kernel_mask is only accepted with interval_rule='code' "
        f"(fedlama.kernels_only=true), got rule {rule!r}")
  d = jnp.asarray(discrepancy)
  if not jnp.issubdtype(d.dtype, jnp.floating):
    d = d.astype(jnp.result_type(float))
  s = jnp.asarray(sizes)
  if d.ndim != 1 or s.shape != d.shape:
    raise ValueError(
        "discrepancy and sizes must be 1-D arrays of the same length, got "
        f"shapes {d.shape} and {s.shape}")
  if not jnp.issubdtype(s.dtype, jnp.integer):
    raise ValueError(f"sizes must be an integer array, got dtype {s.dtype}")
  if not isinstance(d, jax.core.Tracer):  # concrete input: the values are checked too
    values = np.asarray(d)
    if values.size == 0:
      raise ValueError("discrepancy is empty; accepted: one d_l >= 0 per layer, at least one "
                       "layer")
    if not np.all(np.isfinite(values)) or np.any(values < 0):
      bad = values[~(np.isfinite(values) & (values >= 0))][0]
      raise ValueError(f"discrepancy holds {bad}; accepted: finite values >= 0 (one d_l per "
                       "layer)")
  if kernel_mask is None:
    eligible = jnp.ones(d.shape, dtype=bool)
  else:
    eligible = jnp.asarray(kernel_mask, dtype=bool)
    if eligible.shape != d.shape:
      raise ValueError(
          f"kernel_mask must have shape {d.shape}, got {eligible.shape}")
  return d, s, eligible


def _sorted_sums(d, s, eligible, rule):
  """Walk order and the cumulative sums P (of d*s) and Sc (of sizes).

  Ineligible layers sort last (key +inf), so P at eligible positions sums
  eligible layers only while P[-1] is the total D over ALL layers, which is
  what "code" needs (the FedLAMA authors' code) and equals the eligible total for the other rules.
  d is rescaled by an exact power of two (max d in [0.5, 1)), which changes no
  rounding, so that the cross-multiplied products stay below S^2 whatever the
  overall scale of d (no overflow for huge d, no flush-to-zero for tiny d).
  """
  key = -d if rule == "accelerate" else jnp.where(eligible, d, jnp.inf)
  order = jnp.argsort(key, stable=True)
  d_scaled = jnp.ldexp(d, -jnp.frexp(jnp.max(d))[1])
  elig = eligible[order]
  p = jnp.cumsum((d_scaled * s.astype(d.dtype))[order])
  sc = jnp.cumsum(jnp.where(elig, s[order], 0))
  return order, elig, p, sc


def _selected_sorted(p, sc, elig, rule):
  """Boolean per sorted position: is this layer given the non-base value."""
  dtype = p.dtype
  total_d = p[-1]
  total_s = sc[-1]
  rest = (total_s - sc).astype(dtype)  # R_k = S - S_k, exact in integers.
  sc_f, total_s_f = sc.astype(dtype), total_s.astype(dtype)
  if rule == "aaai":  # delta_k < 1 - lambda_k
    return p * total_s_f < rest * total_d
  if rule == "v1":  # delta_k < lambda_k
    return p * total_s_f < sc_f * total_d
  if rule == "accelerate":  # lambda_k < 1 - delta_k, descending order
    return sc_f * total_d < (total_d - p) * total_s_f
  # "code": keep every eligible layer up to and including the first crossing.
  crossed = elig & (rest * total_d < p * total_s_f)
  crossed_before = jnp.cumsum(crossed.astype(jnp.int32)) - crossed
  return elig & (crossed_before == 0)


def select_intervals(discrepancy: ArrayLike,
                     sizes: ArrayLike,
                     phi: IntLike,
                     rule: str = "aaai",
                     kernel_mask: Optional[ArrayLike] = None) -> jax.Array:
  """Per-layer interval multipliers (Lee et al., AAAI 2023, Algorithm 1; known
  answers in tests/test_interval_selection.py).

  Pure and jittable with `rule` static; `phi` may be a Python int or a traced
  integer scalar. No Python loop over layers: one stable argsort, two cumsums
  and cross-multiplied comparisons.

  Args:
    discrepancy: float [L], L >= 1, d_l >= 0 and finite (validated unless traced).
      Values below the smallest normal float may be flushed to 0 on CPU.
    sizes: integer [L], s_l >= 1.
    phi: interval increase factor, integer >= 1.
    rule: "aaai" (AAAI Alg. 1, default), "code" (reference implementation),
      "v1" (v1 Alg. 2 as printed) or "accelerate" (v1 remark).
    kernel_mask: optional bool [L], only with rule "code": layers walked by the
      selector; the others always get 1. None means all layers.

  Returns:
    int32 [L] in the caller's order, values in {1, phi}. "aaai"/"code"/"v1":
    1 = tau', phi = phi * tau'. "accelerate": 1 = tau' / phi (selected),
    phi = tau'. If phi == 1 all ones; if D = sum(d * s) == 0 the base
    multipliers (1, or phi for "accelerate"), i.e. FedAvg(tau').

  Raises:
    ValueError: unknown rule, kernel_mask with a rule other than "code",
      mismatched shapes, non-integer sizes, or a static phi < 1.
  """
  d, s, eligible = _prepare(discrepancy, sizes, rule, kernel_mask)
  _check_phi(phi)
  num_layers = d.shape[0]
  if num_layers == 0:
    return jnp.zeros((0,), dtype=jnp.int32)
  order, elig, p, sc = _sorted_sums(d, s, eligible, rule)
  selected = _selected_sorted(p, sc, elig, rule)
  phi32 = jnp.asarray(phi, dtype=jnp.int32)
  one = jnp.ones((), dtype=jnp.int32)
  if rule == "accelerate":
    values, base = jnp.where(selected, one, phi32), phi32
  else:
    values, base = jnp.where(selected, phi32, one), one
  out = jnp.zeros((num_layers,), dtype=jnp.int32).at[order].set(values)
  return jnp.where(p[-1] > 0, out, base)


def selection_curves(
    discrepancy: ArrayLike,
    sizes: ArrayLike,
    rule: str = "aaai",
    kernel_mask: Optional[ArrayLike] = None,
) -> SelectionCurves:
  """delta_k and lambda_k in the walk order of `rule`, for logging/plots.

  These use division and are for display only; `select_intervals` never
  divides. For "code" delta uses D over all layers and lambda the
  eligible total, exactly as the rule compares them.
  """
  d, s, eligible = _prepare(discrepancy, sizes, rule, kernel_mask)
  if d.shape[0] == 0:
    empty = jnp.zeros((0,), d.dtype)
    return SelectionCurves(jnp.zeros((0,), jnp.int32), jnp.zeros((0,), bool),
                           empty, empty)
  order, elig, p, sc = _sorted_sums(d, s, eligible, rule)
  total_d = p[-1]
  safe_d = jnp.where(total_d > 0, total_d, 1)
  delta = jnp.where(total_d > 0, p / safe_d, 0)
  lam = sc.astype(d.dtype) / jnp.maximum(sc[-1], 1).astype(d.dtype)
  return SelectionCurves(order.astype(jnp.int32), elig, delta, lam)


def window_comm_ratio(multipliers: ArrayLike,
                      sizes: ArrayLike,
                      phi: IntLike,
                      rule: str) -> jax.Array:
  """Floats of one window over those of FedAvg(tau') in the same steps (Lee et al., AAAI 2023,
  communication cost).

  "aaai"/"code"/"v1": sum(s / m) / sum(s). "accelerate" (unit tau' / phi):
  phi * sum(s / m) / sum(s), which is >= 1.
  """
  _check_rule(rule)
  _check_phi(phi)
  m = jnp.asarray(multipliers)
  s = jnp.asarray(sizes)
  if m.shape != s.shape or m.ndim != 1:
    raise ValueError(
        "multipliers and sizes must be 1-D arrays of the same length, got "
        f"shapes {m.shape} and {s.shape}")
  dtype = jnp.result_type(float)
  s_f = s.astype(dtype)
  ratio = jnp.sum(s_f / m.astype(dtype)) / jnp.sum(s_f)
  return ratio * phi if rule == "accelerate" else ratio
