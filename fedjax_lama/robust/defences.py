"""Byzantine-robust aggregation rules over a cohort's stacked uploads, each built as a stage.

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

Each rule is registered once in DEFENCES under its config.robust.defence name, as a
`Defence`: the builder of its stage (an engine/stages.py reducer reading the cohort's stack,
or for norm bounding the per-client clip before the streaming mean), the config.robust
fields it reads, and its bound on (n, f). `check_preconditions(name, n, f)` refuses, on the
host, an (n, f) outside that bound; inside jit the same bound is reported as info["valid"]
for the round's actual n. docs/stages.md walks through adding one (MeaMed, robust/meamed.py).
"""
import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_lama import tree
from fedjax_lama.engine import reduce as reduce_lib
from fedjax_lama.engine import stages
from fedjax_lama.errors import HparamError
from fedjax_lama.errors import require
from fedjax_lama.robust import meamed

PyTree = Any
_HIGHEST = jax.lax.Precision.HIGHEST


# ---------------------------------------------------------------------------------------------
# Bounds on (n, f).

class Bound(NamedTuple):
  """A rule's precondition on n real clients with f Byzantine ones."""
  formula: str                   # as the refusal prints it, "n > 2f + 2"
  holds: Callable[..., Any]      # holds(n, f, **options) -> bool (n may be traced; options
                                 # are the rule's, each bound reads those it needs)
  paper: str


KRUM_BOUND = Bound("n > 2f + 2", lambda n, f, **_: n > 2 * f + 2,
                   "Blanchard et al., NeurIPS 2017")
BULYAN_BOUND = Bound("n >= 4f + 3", lambda n, f, **_: n >= 4 * f + 3,
                     "El Mhamdi et al., ICML 2018")
MAJORITY = "n > 2f"


def _majority(paper: str) -> Bound:
  """An honest majority, n > 2f (the breakdown point 1/2)."""
  return Bound(MAJORITY, lambda n, f, **_: n > 2 * f, paper)


def _trimmed_mean_holds(n, f, beta=None, **_) -> bool:
  require(isinstance(beta, (int, float)) and 0 <= beta < 0.5, "beta", beta,
          "a fraction in [0, 1/2) cut from each side (trimmed_mean)")
  return math.floor(beta * n) >= f


# ---------------------------------------------------------------------------------------------
# Shared pieces.

def _leaves(stack: PyTree) -> list:
  return jax.tree.leaves(stack)


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
  """[C] squared L2 norm of each client's whole upload (`tree.global_sq_norm` per row)."""
  return jax.vmap(tree.global_sq_norm)(stack)


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
          "valid": KRUM_BOUND.holds(_count(mask), f)}
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
  valid = KRUM_BOUND.holds(n, f) & (m >= 1) & (m <= n)
  info = {"selected": selected, "scores": scores, "valid": valid}
  return _masked_mean(stack, kept_weights), info


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
  median = reduce_lib.coordinate_median(stack, selected)
  aggregate = jax.tree.map(
      lambda x, m: reduce_lib.nearest_mean(x, selected, m, beta), stack, median)
  valid = BULYAN_BOUND.holds(n, f)
  return aggregate, {"selected": selected, "valid": valid}


# ---------------------------------------------------------------------------------------------
# Coordinate-wise statistics.

def coordinate_median(stack: PyTree, mask: jax.Array) -> tuple[PyTree, dict]:
  """The coordinate-wise median of the real clients' uploads.

  Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust Distributed Learning: Towards Optimal
  Statistical Rates", ICML 2018, Option I (median). An even count takes the mean of the two
  middle values (numpy's convention). Unweighted, as in the paper. Preconditions: n > 2f.
  A round with no real client returns zeros (info["valid"] False).

  Returns:
    (the median, {"valid": bool}: n >= 1; the bound on f is `check_preconditions`'s).
  """
  return reduce_lib.coordinate_median(stack, mask), {"valid": _count(mask) > 0}


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
    ordered = reduce_lib.sorted_real(x, real)
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
    scale = tree.clip_scale(norms, radius)  # min(1, tau / ||m_i - v||)
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
  1911.07963 (2019), norm thresholding of updates: Delta min(1, M / ||Delta||)
  (`tree.clip_by_global_norm`). Per client, so it runs inside the vmapped client computation
  and the mean streams. Preconditions: bound M > 0; no bound on the number of Byzantine
  clients (it limits each one's influence).
  """
  return tree.clip_by_global_norm(update, bound)[0]


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
# The rules as stages, and the registry.

def kept_ids(info: dict, stack: stages.Stack) -> dict:
  """A rule's scalars for the round's record: its 0-d info and, for a rule that selects
  clients, their ids (-1 elsewhere) as "kept"."""
  out = {k: v for k, v in info.items() if jnp.ndim(v) == 0}
  if "selected" in info and stack.client_ids is not None:
    kept = jnp.asarray(info["selected"]) & (stack.mask > 0)
    out["kept"] = jnp.where(kept, stack.client_ids, -1).astype(jnp.int32)
  return out


def _no_state(upload_like: PyTree) -> tuple:
  del upload_like
  return ()


def stack_rule(name: str, rule: Callable[[stages.Stack, PyTree], tuple],
               init: Callable[[PyTree], PyTree] = _no_state) -> stages.Stage:
  """A rule on the cohort's stack as a reducing stage: rule(stack, state) -> (aggregate,
  state, info); the info's scalars (and "selected" as client ids) reach the round's record."""
  def server(stack: stages.Stack, state, key):
    del key
    value, state, info = rule(stack, state)
    return value, state, kept_ids(info, stack)
  return stages.make(name, init=init, server=server, consumes=stages.STACK, reduces=True)


def _with_state(result: tuple, state) -> tuple:
  value, info = result
  return value, state, info


def _check_f(f) -> int:
  require(_is_count(f) and f >= 0, "num_byzantine", f, "an int >= 0")
  return f


def _is_count(x) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def krum_stage(f: int) -> stages.Stage:
  f = _check_f(f)
  return stack_rule("krum", lambda s, st: _with_state(krum(s.values, s.mask, f), st))


def multi_krum_stage(f: int, num_selected: int = 0) -> stages.Stage:
  """num_selected: m, 0 (or None) for n - f."""
  f = _check_f(f)
  require(num_selected is None or (_is_count(num_selected) and num_selected >= 0),
          "multi_krum.num_selected", num_selected, "0 (n - f) or an int >= 1")
  m = num_selected or None
  return stack_rule("multi_krum", lambda s, st: _with_state(
      multi_krum(s.values, s.mask, s.weights, f, m), st))


def bulyan_stage(f: int) -> stages.Stage:
  f = _check_f(f)
  return stack_rule("bulyan", lambda s, st: _with_state(bulyan(s.values, s.mask, f), st))


def median_stage(f: int) -> stages.Stage:
  del f  # the median does not read f; its bound does
  return stack_rule("median", lambda s, st: _with_state(coordinate_median(s.values, s.mask), st))


def trimmed_mean_stage(f: int, beta: Optional[float] = None) -> stages.Stage:
  f = _check_f(f)
  require(isinstance(beta, (int, float)) and 0 <= beta < 0.5, "trimmed_mean.beta", beta,
          "a fraction in [0, 1/2) cut from each side")
  return stack_rule("trimmed_mean", lambda s, st: _with_state(
      trimmed_mean(s.values, s.mask, beta, f), st))


def geometric_median_stage(f: int, iterations: int = 0, nu: float = 1e-6) -> stages.Stage:
  """iterations: 0 for the default 4."""
  del f  # its bound reads f
  require(_is_count(iterations) and iterations >= 0, "geometric_median.iterations",
          iterations, "an int >= 1, or 0 for the rule's default (4)")
  require(isinstance(nu, (int, float)) and nu > 0, "geometric_median.nu", nu, "a number > 0")
  iterations = iterations or 4
  return stack_rule("geometric_median", lambda s, st: _with_state(
      geometric_median(s.values, s.mask, s.weights, iterations=iterations, nu=nu), st))


def centered_clipping_stage(f: int, radius: Optional[float] = None, iterations: int = 0,
                            momentum: float = 0.0) -> stages.Stage:
  """iterations: 0 for the default 1. The state is the last aggregate (the centre)."""
  del f  # its bound reads f
  require(isinstance(radius, (int, float)) and radius > 0, "centered_clipping.radius",
          radius, "a number > 0")
  require(_is_count(iterations) and iterations >= 0, "centered_clipping.iterations",
          iterations, "an int >= 1, or 0 for the rule's default (1)")
  require(isinstance(momentum, (int, float)) and 0 <= momentum < 1,
          "centered_clipping.momentum", momentum, "a number in [0, 1)")
  iterations = iterations or 1
  return stack_rule("centered_clipping", lambda s, st: centered_clipping(
      s.values, s.mask, s.weights, st, radius=radius, iterations=iterations,
      momentum=momentum), init=centered_clipping_init)


def _check_bound(bound) -> float:
  require(isinstance(bound, (int, float)) and bound > 0, "norm_bound.bound", bound,
          "a number > 0")
  return bound


def norm_bounding_stage(bound: Optional[float] = None) -> stages.Stage:
  """Each client's update clipped inside the vmapped client computation, then the engine's
  streaming mean: the cohort's stack is never gathered."""
  bound = _check_bound(bound)
  clip = stages.make("norm_bound[client]", client=lambda value, state, key: norm_bound(value,
                                                                                       bound))
  return stages.chain(clip, stages.mean())


def norm_bounding_on_stack(bound: Optional[float] = None) -> stages.Stage:
  """Norm bounding on the cohort's stack (after an upload attack, which replaces rows of the
  stack: a clip inside the client computation would bound the honest uploads instead)."""
  bound = _check_bound(bound)
  return stack_rule("norm_bound", lambda s, st: _with_state(
      norm_bounded_mean(s.values, s.mask, s.weights, bound), st))


class Defence(NamedTuple):
  """A rule as config.robust.defence names it (one entry of DEFENCES).

  Attributes:
    build: build(f, **options) -> its stage (build(**options) when `bound` is None).
    options: the config.robust fields it reads besides f, passed to `build` by name.
    bound: its precondition on (n, f); None for a rule that reads no f (norm bounding).
    on_stack: build(**options) of its form that reads the cohort's stack, for a rule whose
      stage works on each client's upload (it runs after an upload attack); None: `build`'s
      stage already reads the stack.
  """
  build: Callable[..., stages.Stage]
  options: tuple = ()
  bound: Optional[Bound] = None
  on_stack: Optional[Callable[..., stages.Stage]] = None


# config.robust.defence -> its rule.
DEFENCES = {
    "krum": Defence(krum_stage, bound=KRUM_BOUND),
    "multi_krum": Defence(multi_krum_stage, ("num_selected",), KRUM_BOUND),
    "bulyan": Defence(bulyan_stage, bound=BULYAN_BOUND),
    "median": Defence(median_stage, bound=_majority("Yin et al., ICML 2018")),
    "trimmed_mean": Defence(trimmed_mean_stage, ("beta",), Bound(
        "floor(beta n) >= f and beta < 1/2", _trimmed_mean_holds, "Yin et al., ICML 2018")),
    "geometric_median": Defence(geometric_median_stage, ("iterations", "nu"),
                                _majority("Pillutla et al., IEEE TSP 2022")),
    "centered_clipping": Defence(centered_clipping_stage, ("radius", "iterations", "momentum"),
                                 _majority("Karimireddy et al., ICML 2021")),
    "norm_bounding": Defence(norm_bounding_stage, ("bound",),
                             on_stack=norm_bounding_on_stack),
    "meamed": Defence(meamed.stage, bound=_majority("Xie, Koyejo, Gupta, arXiv 2018")),
}


def build(name: str, f: Optional[int] = None, *, on_stack: bool = False,
          **options) -> stages.Stage:
  """The stage of DEFENCES[name] tolerating `f` Byzantine clients, its options checked
  (HparamError naming `<name>.<option>`, `num_byzantine` or `defence`). `on_stack`: the form
  that reads the cohort's stack (after an upload attack)."""
  if name not in DEFENCES:
    raise HparamError("defence", name, ", ".join(DEFENCES))
  rule = DEFENCES[name]
  for key in options:
    require(key in rule.options, f"{name}.{key}", options[key],
            ", ".join(rule.options) or f"no options for {name}")
  builder = rule.on_stack if on_stack and rule.on_stack is not None else rule.build
  if rule.bound is None:
    return builder(**options)
  return builder(_check_f(0 if f is None else f), **options)


def check_preconditions(name: str, n: int, f: int, **options) -> None:
  """Refuses (one line, naming the bound) a cohort of `n` real clients with `f` Byzantine ones.

  Args:
    name: one of DEFENCES.
    n: real clients in the cohort (the smallest cohort of the run, when it varies).
    f: Byzantine clients the rule must tolerate.
    options: the rule's options its bound reads (trimmed_mean's beta).

  Raises:
    HparamError: naming `num_byzantine` (or the option) and the bound it breaks.
  """
  if name not in DEFENCES:
    raise HparamError("defence", name, ", ".join(DEFENCES))
  require(_is_count(n) and n >= 1, "num_clients", n, "an int >= 1 (real clients per round)")
  require(_is_count(f) and f >= 0, "num_byzantine", f, "an int >= 0")
  bound = DEFENCES[name].bound
  if bound is None:
    return
  holds = lambda n, f: bound.holds(n, f, **options)
  if not holds(n, f):
    largest = max([g for g in range(n + 1) if holds(n, g)], default=None)
    allows = (f"n = {n} allows f <= {largest}" if largest is not None
              else f"n = {n} allows no f")
    raise HparamError("num_byzantine", f,
                      f"{name} needs {bound.formula} ({bound.paper}); {allows}")
