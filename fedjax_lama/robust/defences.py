"""Byzantine-robust aggregation rules over a cohort's stacked uploads.

Every rule is a pure, jittable function of

    stack    a pytree whose leaves are [C, ...]: the cohort's uploads, one row per client slot;
    mask     [C], 1 for a real client and 0 for a padded slot;
    weights  [C] (where the rule averages): the engine's client weights, 0 on padded slots;

and returns `(aggregate, info)`: the aggregate has the shape of one upload (no client axis);
`info` is a dict of arrays (the rows kept as a [C] bool "selected", scores, and a scalar
"valid" that is False when the round's real cohort is too small for the rule's bound).

The number of real clients n = sum(mask) may change every round without recompiling: sorts
put padded slots last (+inf), neighbour counts and order statistics are traced indices. A
padded slot never wins and never poisons a result, even when it holds NaN or inf: its rows
are replaced before any arithmetic (`jnp.where`, never multiplication by 0). A real client
whose upload is not finite is kept out of Krum's distances (its distances read +inf); in a
coordinate-wise sort its NaN counts as larger than every value.

The number of Byzantine clients f and every hyper-parameter are static Python numbers.
`check_preconditions(defence, n, f)` refuses, on the host, an (n, f) outside a rule's bound;
inside jit the same bound is reported as info["valid"] for the round's actual n.

`build(name, **hparams)` bundles a rule as `Defence(init, aggregate, client, reduce)`:
`aggregate(stack, mask, weights, state) -> (aggregate, state, info)`, the shape of a
whole-cohort aggregation stage; norm bounding also has a per-client `client` function and
streams (`reduce == "streaming"`), every other rule needs the cohort's stack.
"""
import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_lama.engine import reduce as reduce_lib
from fedjax_lama.errors import HparamError
from fedjax_lama.errors import require

PyTree = Any
_HIGHEST = jax.lax.Precision.HIGHEST


# ---------------------------------------------------------------------------------------------
# Preconditions.

# defence -> (the bound as a formula, the predicate on (n, f), the paper that proves it).
BOUNDS = {
    "krum": ("n > 2f + 2", lambda n, f: n > 2 * f + 2, "Blanchard et al., NeurIPS 2017"),
    "multi_krum": ("n > 2f + 2", lambda n, f: n > 2 * f + 2, "Blanchard et al., NeurIPS 2017"),
    "bulyan": ("n >= 4f + 3", lambda n, f: n >= 4 * f + 3, "El Mhamdi et al., ICML 2018"),
    "median": ("n > 2f", lambda n, f: n > 2 * f, "Yin et al., ICML 2018"),
    "trimmed_mean": ("floor(beta n) >= f and beta < 1/2", None, "Yin et al., ICML 2018"),
    "geometric_median": ("n > 2f", lambda n, f: n > 2 * f, "Pillutla et al., IEEE TSP 2022"),
    "centered_clipping": ("n > 2f", lambda n, f: n > 2 * f, "Karimireddy et al., ICML 2021"),
    "norm_bound": ("n >= 1", lambda n, f: n >= 1, "Sun et al., 2019"),
}
DEFENCES = tuple(BOUNDS)


def _is_count(x) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def check_preconditions(defence: str, n: int, f: int, *, beta: Optional[float] = None) -> None:
  """Refuses (one line, naming the bound) a cohort of `n` real clients with `f` Byzantine ones.

  Args:
    defence: one of DEFENCES.
    n: real clients in the cohort (the smallest cohort of the run, when it varies).
    f: Byzantine clients the rule must tolerate.
    beta: the trimmed mean's fraction cut from each side (trimmed_mean only).

  Raises:
    HparamError: naming `num_byzantine` (or `beta`) and the bound it breaks.
  """
  if defence not in BOUNDS:
    raise HparamError("defence", defence, ", ".join(DEFENCES))
  require(_is_count(n) and n >= 1, "num_clients", n, "an int >= 1 (real clients per round)")
  require(_is_count(f) and f >= 0, "num_byzantine", f, "an int >= 0")
  formula, holds, paper = BOUNDS[defence]
  if defence == "trimmed_mean":
    require(beta is not None and 0 <= beta < 0.5, "beta", beta,
            "a fraction in [0, 1/2) cut from each side (trimmed_mean)")
    holds = lambda n, f: math.floor(beta * n) >= f
    formula = f"floor(beta n) >= f (beta = {beta}, n = {n}: floor(beta n) = {math.floor(beta * n)})"
  if not holds(n, f):
    largest = max([g for g in range(n + 1) if holds(n, g)], default=None)
    allows = (f"n = {n} allows f <= {largest}" if largest is not None
              else f"n = {n} allows no f")
    raise HparamError("num_byzantine", f, f"{defence} needs {formula} ({paper}); {allows}")


def _valid(defence: str, n: jax.Array, f: int) -> jax.Array:
  """The bound of `check_preconditions` on a traced n (trimmed_mean checks its own)."""
  return BOUNDS[defence][1](n, f)


# ---------------------------------------------------------------------------------------------
# Shared pieces.

def _leaves(stack: PyTree) -> list:
  return jax.tree_util.tree_leaves(stack)


def _rows(mask: jax.Array, x: jax.Array) -> jax.Array:
  """mask [C] shaped to broadcast against a leaf [C, ...]."""
  return mask.reshape((-1,) + (1,) * (x.ndim - 1))


def _real(mask: jax.Array) -> jax.Array:
  return jnp.asarray(mask) > 0


def _count(mask: jax.Array) -> jax.Array:
  return jnp.sum(_real(mask).astype(jnp.int32))


def _zero_rows(stack: PyTree, keep: jax.Array) -> PyTree:
  """Rows where `keep` is False set to 0 by selection, so NaN or inf there cannot leak."""
  return jax.tree.map(lambda x: jnp.where(_rows(keep, x), x, jnp.zeros((), x.dtype)), stack)


def _finite_rows(stack: PyTree) -> jax.Array:
  """[C] True where every coordinate of the client's upload is finite."""
  per_leaf = [jnp.all(jnp.isfinite(x.reshape(x.shape[0], -1)), axis=1) for x in _leaves(stack)]
  return jnp.all(jnp.stack(per_leaf), axis=0)


def _row_sq_norms(stack: PyTree) -> jax.Array:
  """[C] squared L2 norm of each client's whole upload (every leaf)."""
  return sum(jnp.sum(jnp.square(x.reshape(x.shape[0], -1)), axis=1) for x in _leaves(stack))


def _masked_mean(stack: PyTree, weights: jax.Array) -> PyTree:
  """sum_i w_i x_i / sum_i w_i over rows with w_i > 0 (0 when no weight)."""
  return reduce_lib.weighted_mean(stack, weights)


def pairwise_sq_distances(stack: PyTree, mask: jax.Array) -> jax.Array:
  """[C, C] squared L2 distances between whole uploads, +inf where either side is left out.

  One matrix product over the flattened cohort: ||a||^2 + ||b||^2 - 2 a.b, summed over
  leaves and clamped at 0 (rounding can make it slightly negative). The uploads are first
  centred on the mean of the kept rows: distances do not change, but the products shrink,
  so rounding stays small when the uploads sit far from the origin (whole models rather than
  updates). Left out: padded slots and real clients whose upload is not all finite.
  """
  keep = _real(mask) & _finite_rows(stack)
  stack = _zero_rows(stack, keep)
  centre = _masked_mean(stack, keep.astype(jnp.float32))
  centred = jax.tree.map(
      lambda x, c: jnp.where(_rows(keep, x), x - c, jnp.zeros((), x.dtype)), stack, centre)
  flat = [x.reshape(x.shape[0], -1) for x in _leaves(centred)]
  gram = sum(jnp.matmul(x, x.T, precision=_HIGHEST) for x in flat)
  sq = jnp.diagonal(gram)
  distances = jnp.maximum(sq[:, None] + sq[None, :] - 2 * gram, 0)
  pair = keep[:, None] & keep[None, :]
  return jnp.where(pair, distances, jnp.inf)


def _select_rows(stack: PyTree, one_hot: jax.Array) -> PyTree:
  """The row where `one_hot` is True, exactly (no arithmetic on its values)."""
  return jax.tree.map(
      lambda x: jnp.sum(jnp.where(_rows(one_hot, x), x, jnp.zeros((), x.dtype)), axis=0), stack)


def _order_statistic(sorted_x: jax.Array, index: jax.Array) -> jax.Array:
  """sorted_x[index] along the client axis, with a traced index."""
  return jax.lax.dynamic_index_in_dim(sorted_x, index, axis=0, keepdims=False)


# ---------------------------------------------------------------------------------------------
# Krum, Multi-Krum, Bulyan.

def krum_scores(distances: jax.Array, active: jax.Array, f: int) -> jax.Array:
  """Krum's score of every active client: the sum of its r - f - 2 smallest squared distances
  to the other active clients (r = number active), +inf for inactive ones.

  Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with Adversaries: Byzantine
  Tolerant Gradient Descent", NeurIPS 2017: s(i) = sum over the n - f - 2 closest
  vectors to V_i. When fewer than f + 3 clients are active (Bulyan's last recursions) the
  count r - f - 2 drops below 1: a client is then scored by its single nearest neighbour,
  and a lone client scores 0 (the count is clamped to [1, r - 1], as Flower does).
  """
  num_clients = distances.shape[0]
  active = _real(active)
  r = jnp.sum(active.astype(jnp.int32))
  neighbours = jnp.maximum(1, r - f - 2)
  pair = active[:, None] & active[None, :] & ~jnp.eye(num_clients, dtype=bool)
  nearest = jnp.sort(jnp.where(pair, distances, jnp.inf), axis=1)
  position = jnp.arange(num_clients)[None, :]
  counted = (position < neighbours) & (position < r - 1)
  scores = jnp.sum(jnp.where(counted, nearest, 0), axis=1)
  return jnp.where(active, scores, jnp.inf)


def _argmin_active(scores: jax.Array, active: jax.Array) -> jax.Array:
  """Lowest score among active clients (lowest index on ties); the first active client when
  every active score is +inf, never an inactive one."""
  pick = jnp.argmin(jnp.where(active, scores, jnp.inf))
  return jnp.where(active[pick], pick, jnp.argmax(active))


def _ranks(scores: jax.Array) -> jax.Array:
  """0 for the lowest score, ties broken by the lower index (a stable sort)."""
  order = jnp.argsort(scores, stable=True)
  return jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0]))


def krum(stack: PyTree, mask: jax.Array, f: int) -> tuple[PyTree, dict]:
  """Krum: the upload of the client whose n - f - 2 nearest neighbours are closest.

  Blanchard, El Mhamdi, Guerraoui, Stainer, NeurIPS 2017. Preconditions: n > 2f + 2
  real clients (the paper's bound); the rule returns one client's upload unchanged, the one
  with the lowest score (`krum_scores`), the lowest index on ties.

  Returns:
    (the chosen upload, {"selected": [C] one-hot, "scores": [C], "valid": bool}).
  """
  active = _real(mask)
  scores = krum_scores(pairwise_sq_distances(stack, mask), active, f)
  pick = _argmin_active(scores, active)
  selected = (jnp.arange(active.shape[0]) == pick) & active
  info = {"selected": selected, "scores": scores,
          "valid": _valid("krum", _count(mask), f)}
  return _select_rows(stack, selected), info


def multi_krum(stack: PyTree, mask: jax.Array, weights: jax.Array, f: int,
               num_selected: Optional[int] = None) -> tuple[PyTree, dict]:
  """Multi-Krum: the weighted mean of the m clients with the lowest Krum scores.

  Blanchard, El Mhamdi, Guerraoui, Stainer, NeurIPS 2017 (Multi-Krum): scores are
  computed once on the whole cohort and the m best are averaged; the paper averages them
  uniformly (pass `weights = mask`); Flower weights them by example counts. Preconditions:
  n > 2f + 2 and 1 <= m <= n.

  Args:
    stack, mask, weights: the cohort (see the module docstring).
    f: Byzantine clients tolerated.
    num_selected: m; None keeps n - f, computed from the round's n.

  Returns:
    (the mean, {"selected": [C] bool, "scores": [C], "valid": bool}).
  """
  active = _real(mask)
  n = _count(mask)
  m = n - f if num_selected is None else num_selected
  scores = krum_scores(pairwise_sq_distances(stack, mask), active, f)
  selected = (_ranks(scores) < m) & active
  kept_weights = jnp.where(selected, weights, 0)
  valid = _valid("multi_krum", n, f) & (m >= 1) & (m <= n)
  info = {"selected": selected, "scores": scores, "valid": valid}
  return _masked_mean(stack, kept_weights), info


def _nearest_to_reference_mean(x: jax.Array, kept: jax.Array, reference: jax.Array,
                               count: jax.Array) -> jax.Array:
  """Per coordinate, the mean of the `count` kept values nearest `reference` (ties: the lower
  client index)."""
  kept = _rows(kept, x)
  gap = jnp.where(kept, jnp.abs(x - reference), jnp.inf)
  values = jnp.where(kept, x, jnp.zeros((), x.dtype))
  _, nearest_first = jax.lax.sort((gap, values), dimension=0, is_stable=True, num_keys=1)
  position = jnp.arange(x.shape[0]).reshape((-1,) + (1,) * (x.ndim - 1))
  total = jnp.sum(jnp.where(position < count, nearest_first, jnp.zeros((), x.dtype)), axis=0)
  return total / jnp.maximum(count, 1).astype(x.dtype)


def bulyan(stack: PyTree, mask: jax.Array, f: int) -> tuple[PyTree, dict]:
  """Bulyan: theta = n - 2f recursive Krum picks, then per coordinate the mean of the
  beta = theta - 2f picked values nearest their median.

  El Mhamdi, Guerraoui, Rouault, "The Hidden Vulnerability of Distributed Learning in
  Byzantium", ICML 2018: Krum is applied to the remaining set, its choice moved to the
  selection set, theta times; then a coordinate-wise trimmed aggregation around the median.
  Krum's neighbour count in each recursion is r - f - 2 for the r clients remaining, clamped
  to at least 1 (see `krum_scores`). Preconditions: n >= 4f + 3.

  Returns:
    (the aggregate, {"selected": [C] bool (the theta Krum picks), "valid": bool}).
  """
  active = _real(mask)
  num_clients = active.shape[0]
  n = _count(mask)
  theta = n - 2 * f
  beta = theta - 2 * f
  distances = pairwise_sq_distances(stack, mask)

  def pick_one(t, carry):
    remaining, selected = carry
    pick = _argmin_active(krum_scores(distances, remaining, f), remaining)
    chosen = (jnp.arange(num_clients) == pick) & remaining & (t < theta)
    return remaining & ~chosen, selected | chosen

  # theta <= C - 2f: the loop's static length; iterations past the round's theta pick nothing.
  _, selected = jax.lax.fori_loop(0, max(num_clients - 2 * f, 0), pick_one,
                                  (active, jnp.zeros_like(active)))
  median = coordinate_median(stack, selected)[0]
  aggregate = jax.tree.map(
      lambda x, m: _nearest_to_reference_mean(x, selected, m, beta), stack, median)
  valid = _valid("bulyan", n, f)
  return aggregate, {"selected": selected, "valid": valid}


# ---------------------------------------------------------------------------------------------
# Coordinate-wise statistics.

def _sorted_real(x: jax.Array, real: jax.Array) -> jax.Array:
  """x sorted along the client axis with padded slots as +inf (they sort last)."""
  return jnp.sort(jnp.where(_rows(real, x), x, jnp.array(jnp.inf, x.dtype)), axis=0)


def coordinate_median(stack: PyTree, mask: jax.Array) -> tuple[PyTree, dict]:
  """The coordinate-wise median of the real clients' uploads.

  Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust Distributed Learning: Towards Optimal
  Statistical Rates", ICML 2018, Option I (median). An even count takes the mean of the two
  middle values (numpy's convention). Unweighted, as in the paper. Preconditions: n > 2f.
  A round with no real client returns zeros (info["valid"] False).

  Returns:
    (the median, {"valid": bool}: n >= 1; the bound on f is `check_preconditions`'s).
  """
  real = _real(mask)
  n = _count(mask)

  def median(x):
    ordered = _sorted_real(x, real)
    low = _order_statistic(ordered, jnp.maximum(n - 1, 0) // 2)
    high = _order_statistic(ordered, n // 2)
    return jnp.where(n > 0, (low + high) / 2, jnp.zeros((), x.dtype))

  return jax.tree.map(median, stack), {"valid": n > 0}


def trimmed_mean(stack: PyTree, mask: jax.Array, beta: float,
                 f: int = 0) -> tuple[PyTree, dict]:
  """The coordinate-wise mean after dropping the floor(beta n) largest and smallest values.

  Yin, Chen, Ramchandran, Bartlett, ICML 2018, Option II (trimmed mean), with beta the
  fraction cut from each side. Unweighted, as in the paper. Preconditions: 0 <= beta < 1/2
  and floor(beta n) >= f. floor(beta n) is computed in the stack's float type on the traced n,
  as Python's int(beta * n) in float64 (they can differ only when beta n lies within rounding of
  an integer in float32).

  Returns:
    (the mean, {"trimmed_per_side": int, "valid": bool}).
  """
  real = _real(mask)
  n = _count(mask)
  dtype = jnp.result_type(*_leaves(stack))
  cut = jnp.floor(jnp.asarray(beta, dtype) * n.astype(dtype)).astype(jnp.int32)
  kept = jnp.maximum(n - 2 * cut, 1)

  def trimmed(x):
    ordered = _sorted_real(x, real)
    position = jnp.arange(x.shape[0]).reshape((-1,) + (1,) * (x.ndim - 1))
    inside = (position >= cut) & (position < n - cut)
    total = jnp.sum(jnp.where(inside, ordered, jnp.zeros((), x.dtype)), axis=0)
    return total / kept.astype(x.dtype)

  valid = (n > 2 * cut) & (cut >= f)
  return jax.tree.map(trimmed, stack), {"trimmed_per_side": cut, "valid": valid}


# ---------------------------------------------------------------------------------------------
# Geometric median (RFA).

def geometric_median(stack: PyTree, mask: jax.Array, weights: jax.Array, *,
                     iterations: int = 4, nu: float = 1e-6) -> tuple[PyTree, dict]:
  """The weighted geometric median by the smoothed Weiszfeld algorithm (RFA).

  Pillutla, Kakade, Harchaoui, "Robust Aggregation for Federated Learning", IEEE TSP 2022,
  smoothed Weiszfeld algorithm: starting from the weighted mean, repeat
      beta_i = alpha_i / max(nu, ||v - w_i||),   v = sum_i beta_i w_i / sum_i beta_i
  for a fixed number of iterations (the paper finds that a few suffice), alpha_i the client
  weights (their alpha_i is proportional to the example count). nu > 0 keeps the step finite
  when v lands on an upload. Preconditions: n > 2f (the breakdown point is 1/2).

  Returns:
    (v, {"objective": sum_i alpha_i ||v - w_i|| / sum_i alpha_i at the returned v, "valid"}).
  """
  real = _real(mask)
  stack = _zero_rows(stack, real)
  alpha = jnp.where(real, weights, 0)

  def distances(v):
    gaps = jax.tree.map(lambda x, c: x - c, stack, v)
    return jnp.sqrt(_row_sq_norms(gaps))

  def weiszfeld_step(_, v):
    beta = alpha / jnp.maximum(nu, distances(v))
    return _masked_mean(stack, beta)

  v = jax.lax.fori_loop(0, iterations, weiszfeld_step, _masked_mean(stack, alpha))
  total = jnp.sum(alpha)
  objective = jnp.sum(jnp.where(real, alpha * distances(v), 0)) / jnp.where(total > 0, total, 1)
  n = _count(mask)
  return v, {"objective": objective, "valid": n > 0}


# ---------------------------------------------------------------------------------------------
# Centered clipping.

class CenteredClippingState(NamedTuple):
  """The previous round's aggregate: the centre of this round's clipping (the paper's v)."""
  center: PyTree


def centered_clipping_init(upload_like: PyTree) -> CenteredClippingState:
  """The first round clips around 0 (the paper's momentum starts at 0)."""
  return CenteredClippingState(jax.tree.map(jnp.zeros_like, upload_like))


def centered_clipping(stack: PyTree, mask: jax.Array, weights: jax.Array,
                      state: CenteredClippingState, *, radius: float, iterations: int = 1,
                      momentum: float = 0.0) -> tuple[PyTree, CenteredClippingState, dict]:
  """Centered clipping around the previous aggregate, with the server keeping the momentum.

  Karimireddy, He, Jaggi, "Learning from History for Byzantine Robust Optimization", ICML
  2021, centered clipping: starting from v = the previous round's aggregate, repeat L times
      v <- v + sum_i p_i (m_i - v) min(1, tau / ||m_i - v||)
  with p_i the normalised weights (the paper: 1/n, pass `weights = mask`). The paper's workers
  send momenta m_i = (1 - beta) g_i + beta m_i^prev. Clients here keep no state across rounds,
  so the server forms them from its own previous aggregate: m_i = (1 - beta) x_i + beta v_prev
  (beta = `momentum`; 0 clips the raw uploads). The new state is the returned aggregate.
  Preconditions: radius tau > 0; an honest majority n > 2f (the paper's guarantee needs the
  Byzantine fraction well below 1/2).

  Returns:
    (v, the next state, {"clipped": fraction of real clients clipped in the last iteration,
    "valid": bool}).
  """
  real = _real(mask)
  stack = _zero_rows(stack, real)
  previous = state.center
  momenta = jax.tree.map(lambda x, c: (1 - momentum) * x + momentum * c, stack, previous)
  p = jnp.where(real, weights, 0)
  total = jnp.sum(p)
  total = jnp.where(total > 0, total, 1)

  def clip_step(_, carry):
    v, _ = carry
    gaps = jax.tree.map(lambda x, c: x - c, momenta, v)
    norms = jnp.sqrt(_row_sq_norms(gaps))
    scale = 1 / jnp.maximum(1, norms / radius)
    step = reduce_lib.weighted_sum(gaps, p * scale)
    v = jax.tree.map(lambda c, s: c + s / total, v, step)
    return v, jnp.sum(real & (norms > radius)) / jnp.maximum(_count(mask), 1)

  v, clipped = jax.lax.fori_loop(0, iterations, clip_step, (previous, jnp.zeros(())))
  n = _count(mask)
  info = {"clipped": clipped, "valid": (n > 0)}
  return v, CenteredClippingState(v), info


# ---------------------------------------------------------------------------------------------
# Norm bounding.

def norm_bound(update: PyTree, bound: float) -> PyTree:
  """One client's update scaled to L2 norm at most `bound` (over the whole pytree).

  Sun, Kairouz, Suresh, McMahan, "Can You Really Backdoor Federated Learning?", arXiv
  1911.07963 (2019), norm thresholding of updates: Delta / max(1, ||Delta|| / M). Per client,
  so it runs inside the vmapped client computation and the mean streams. Preconditions:
  bound M > 0; no bound on the number of Byzantine clients (it limits each one's influence).
  """
  norm = jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in _leaves(update)))
  scale = 1 / jnp.maximum(1, norm / bound)
  return jax.tree.map(lambda x: x * scale.astype(x.dtype), update)


def norm_bounded_mean(stack: PyTree, mask: jax.Array, weights: jax.Array,
                      bound: float) -> tuple[PyTree, dict]:
  """The weighted mean of every real client's `norm_bound`-ed upload (the whole-cohort form of
  the streaming rule; same numbers).

  Returns:
    (the mean, {"clipped": fraction of real clients whose norm exceeded the bound, "valid"}).
  """
  real = _real(mask)
  stack = _zero_rows(stack, real)
  norms = jnp.sqrt(_row_sq_norms(stack))
  clipped = jax.vmap(lambda u: norm_bound(u, bound))(stack)
  n = _count(mask)
  fraction = jnp.sum(real & (norms > bound)) / jnp.maximum(n, 1)
  return _masked_mean(clipped, jnp.where(real, weights, 0)), {"clipped": fraction,
                                                                 "valid": n > 0}


# ---------------------------------------------------------------------------------------------
# The bundle an aggregation stage plugs in.

class Defence(NamedTuple):
  """A rule as an aggregation stage.

  Attributes:
    name: the rule's name (one of DEFENCES).
    init: upload_like -> state (() for stateless rules).
    aggregate: (stack, mask, weights, state) -> (aggregate, state, info).
    client: one client's upload -> upload, applied inside the vmapped client computation
      (norm bounding), or None.
    reduce: "streaming" (only `client` matters; the mean is the engine's) or "whole_cohort"
      (the engine gathers the stack).
  """
  name: str
  init: Callable[[PyTree], PyTree]
  aggregate: Callable[..., tuple[PyTree, PyTree, dict]]
  client: Optional[Callable[[PyTree], PyTree]]
  reduce: str


def build(name: str, f: int = 0, **hparams) -> Defence:
  """The rule `name` tolerating `f` Byzantine clients, with its hyper-parameters checked.

  Hyper-parameters: multi_krum `num_selected` (None: n - f); trimmed_mean `beta`;
  geometric_median `iterations` (4), `nu` (1e-6); centered_clipping `radius`, `iterations`
  (1), `momentum` (0); norm_bound `bound`.
  """
  if name not in BOUNDS:
    raise HparamError("defence", name, ", ".join(DEFENCES))
  require(_is_count(f) and f >= 0, "num_byzantine", f, "an int >= 0")
  accepted = {"krum": (), "multi_krum": ("num_selected",), "bulyan": (), "median": (),
              "trimmed_mean": ("beta",), "geometric_median": ("iterations", "nu"),
              "centered_clipping": ("radius", "iterations", "momentum"),
              "norm_bound": ("bound",)}[name]
  for key in hparams:
    require(key in accepted, f"{name}.{key}", hparams[key],
            ", ".join(accepted) or f"no hyper-parameters for {name}")
  no_state = lambda upload_like: ()

  def whole(rule):
    def aggregate(stack, mask, weights, state):
      value, info = rule(stack, mask, weights)
      return value, state, info
    return Defence(name, no_state, aggregate, None, "whole_cohort")

  if name == "krum":
    return whole(lambda s, m, w: krum(s, m, f))
  if name == "multi_krum":
    m_sel = hparams.get("num_selected")
    require(m_sel is None or (_is_count(m_sel) and m_sel >= 1), "multi_krum.num_selected",
            m_sel, "None (n - f) or an int >= 1")
    return whole(lambda s, m, w: multi_krum(s, m, w, f, m_sel))
  if name == "bulyan":
    return whole(lambda s, m, w: bulyan(s, m, f))
  if name == "median":
    return whole(lambda s, m, w: coordinate_median(s, m))
  if name == "trimmed_mean":
    beta = hparams.get("beta")
    require(isinstance(beta, (int, float)) and 0 <= beta < 0.5, "trimmed_mean.beta", beta,
            "a fraction in [0, 1/2) cut from each side")
    return whole(lambda s, m, w: trimmed_mean(s, m, beta, f))
  if name == "geometric_median":
    iterations, nu = hparams.get("iterations", 4), hparams.get("nu", 1e-6)
    require(_is_count(iterations) and iterations >= 1, "geometric_median.iterations",
            iterations, "an int >= 1")
    require(isinstance(nu, (int, float)) and nu > 0, "geometric_median.nu", nu, "a number > 0")
    return whole(lambda s, m, w: geometric_median(s, m, w, iterations=iterations, nu=nu))
  if name == "centered_clipping":
    radius = hparams.get("radius")
    iterations, momentum = hparams.get("iterations", 1), hparams.get("momentum", 0.0)
    require(isinstance(radius, (int, float)) and radius > 0, "centered_clipping.radius",
            radius, "a number > 0")
    require(_is_count(iterations) and iterations >= 1, "centered_clipping.iterations",
            iterations, "an int >= 1")
    require(isinstance(momentum, (int, float)) and 0 <= momentum < 1,
            "centered_clipping.momentum", momentum, "a number in [0, 1)")

    def aggregate(stack, mask, weights, state):
      return centered_clipping(stack, mask, weights, state, radius=radius,
                               iterations=iterations, momentum=momentum)

    return Defence(name, centered_clipping_init, aggregate, None, "whole_cohort")
  bound = hparams.get("bound")
  require(isinstance(bound, (int, float)) and bound > 0, "norm_bound.bound", bound,
          "a number > 0")

  def bounded_mean(stack, mask, weights, state):
    value, info = norm_bounded_mean(stack, mask, weights, bound)
    return value, state, info

  return Defence(name, no_state, bounded_mean, lambda u: norm_bound(u, bound), "streaming")
