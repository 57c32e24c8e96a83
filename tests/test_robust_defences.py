"""The robust aggregation rules against numpy references written here from the papers.

References loop over clients in float64 (one client at a time, as the papers state the rules);
the rules under test run jitted on a padded [C, ...] stack with a client mask. Hand-checkable
stacks pin ties, f = 0, duplicated clients and padded slots holding NaN.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lama import robust
from fedjax_lama.engine import stages
from fedjax_lama.errors import HparamError

SHAPES = {"kernel": (3, 2), "bias": (2,)}


# ---------------------------------------------------------------------------------------------
# Numpy references, from the papers.

def flat(stack, rows=None):
  """[C, d] float64: each client's leaves concatenated (kernel, then bias)."""
  x = np.concatenate([np.asarray(stack[k], np.float64).reshape(len(stack[k]), -1)
                      for k in sorted(stack)], axis=1)
  return x if rows is None else x[rows]


def as_tree(vector, like):
  """A [d] vector back into the leaves of one upload (kernel, then bias: sorted keys)."""
  out, start = {}, 0
  for k in sorted(like):
    shape = np.shape(like[k])[1:]
    size = int(np.prod(shape))
    out[k] = vector[start:start + size].reshape(shape)
    start += size
  return out


def ref_sq_distance(a, b):
  return float(np.sum((a - b) ** 2))


def ref_krum_scores(x, f):
  """Blanchard et al. 2017: s(i) = sum of the n - f - 2 smallest ||V_i - V_j||^2, j != i
  (at least one neighbour when fewer than f + 3 vectors remain)."""
  n = len(x)
  count = max(1, n - f - 2)
  scores = []
  for i in range(n):
    others = sorted(ref_sq_distance(x[i], x[j]) for j in range(n) if j != i)
    scores.append(sum(others[:count]))
  return np.array(scores)


def ref_krum(x, f):
  return x[int(np.argmin(ref_krum_scores(x, f)))]


def ref_multi_krum(x, w, f, m):
  best = np.argsort(ref_krum_scores(x, f), kind="stable")[:m]
  return sum(w[i] * x[i] for i in best) / sum(w[i] for i in best)


def ref_bulyan(x, f):
  """El Mhamdi et al. 2018: theta = n - 2f recursive Krum picks; per coordinate the mean of the
  beta = theta - 2f picked values closest to their median."""
  n = len(x)
  theta, beta = n - 2 * f, n - 4 * f
  remaining, picked = list(range(n)), []
  for _ in range(theta):
    scores = ref_krum_scores(x[remaining], f)
    picked.append(remaining.pop(int(np.argmin(scores))))
  chosen = x[sorted(picked)]
  median = np.median(chosen, axis=0)
  out = np.empty(x.shape[1])
  for j in range(x.shape[1]):
    closest = np.argsort(np.abs(chosen[:, j] - median[j]), kind="stable")[:beta]
    out[j] = np.mean(chosen[closest, j])
  return out, sorted(picked)


def ref_trimmed_mean(x, beta):
  """Yin et al. 2018: drop the floor(beta n) smallest and largest of each coordinate."""
  n = len(x)
  cut = math.floor(beta * n)
  return np.mean(np.sort(x, axis=0)[cut:n - cut], axis=0)


def ref_geometric_median(x, alpha, iterations, nu):
  """Pillutla et al. 2022, Algorithm 2 (smoothed Weiszfeld) from the weighted mean."""
  v = alpha @ x / alpha.sum()
  for _ in range(iterations):
    beta = np.array([a / max(nu, np.linalg.norm(v - xi)) for a, xi in zip(alpha, x)])
    v = beta @ x / beta.sum()
  return v


def ref_centered_clipping(x, p, center, radius, iterations, momentum):
  """Karimireddy et al. 2021, CC: v <- v + sum_i p_i clip_tau(m_i - v), from v = center."""
  p = p / p.sum()
  momenta = (1 - momentum) * x + momentum * center
  v = center.copy()
  for _ in range(iterations):
    step = np.zeros_like(v)
    for pi, mi in zip(p, momenta):
      gap = mi - v
      step += pi * gap * min(1.0, radius / max(np.linalg.norm(gap), 1e-300))
    v = v + step
  return v


def ref_norm_bound(x, bound):
  """Sun et al. 2019: Delta / max(1, ||Delta|| / M)."""
  return x / max(1.0, np.linalg.norm(x) / bound)


# ---------------------------------------------------------------------------------------------
# Stacks.

def random_stack(num_clients, seed=0, dtype=np.float64):
  rng = np.random.default_rng(seed)
  return {k: rng.normal(size=(num_clients,) + s).astype(dtype) for k, s in SHAPES.items()}


def line_stack(values):
  """One coordinate per client: a [C, 1] leaf."""
  return {"x": jnp.asarray(np.asarray(values, np.float32)[:, None])}


def with_padding(stack, mask, fill=np.nan):
  """The stack with its padded rows (mask == 0) overwritten by `fill`."""
  return {k: np.where(np.asarray(mask).reshape((-1,) + (1,) * (v.ndim - 1)) > 0, v, fill)
          for k, v in stack.items()}


def close(tree, vector, like, tol):
  expected = as_tree(vector, like)
  for k in expected:
    np.testing.assert_allclose(np.asarray(tree[k]), expected[k], rtol=tol, atol=tol)


# The rules jitted once per shape (eager dispatch of their sorts and loops is slower than
# compiling them).
krum = jax.jit(robust.krum, static_argnums=2)
multi_krum = jax.jit(robust.multi_krum, static_argnums=(3, 4))
bulyan = jax.jit(robust.bulyan, static_argnums=2)
coordinate_median = jax.jit(robust.coordinate_median)
trimmed_mean = jax.jit(robust.trimmed_mean, static_argnums=(2, 3))
geometric_median = jax.jit(robust.geometric_median, static_argnames=("iterations", "nu"))
centered_clipping = jax.jit(robust.centered_clipping,
                            static_argnames=("radius", "iterations", "momentum"))
norm_bounded_mean = jax.jit(robust.norm_bounded_mean, static_argnums=3)


# ---------------------------------------------------------------------------------------------
# Hand-checkable answers.

def test_pairwise_distances_one_matrix_product_equal_loops():
  stack = random_stack(6)
  mask = np.array([1, 1, 0, 1, 1, 1.])
  stack = with_padding(stack, mask)
  with jax.enable_x64(True):
    distances = np.asarray(jax.jit(robust.pairwise_sq_distances)(
        jax.tree.map(jnp.asarray, stack), jnp.asarray(mask)))
  x = flat(stack)
  for i in range(6):
    for j in range(6):
      if mask[i] and mask[j]:
        assert distances[i, j] == pytest.approx(ref_sq_distance(x[i], x[j]), abs=1e-12)
      else:
        assert distances[i, j] == np.inf


def test_krum_on_a_line():
  # 0, 1, 2, 10 with f = 0: each scores its n - f - 2 = 2 nearest: 1+4, 1+1, 1+4, 64+81.
  stack = line_stack([0, 1, 2, 10])
  chosen, info = krum(stack, jnp.ones(4), 0)
  np.testing.assert_array_equal(info["scores"], [5, 2, 5, 145])
  np.testing.assert_array_equal(info["selected"], [False, True, False, False])
  assert float(chosen["x"][0]) == 1.0
  assert bool(info["valid"])


def test_krum_ties_and_duplicated_clients():
  # Three copies of 1 and two of 7 (f = 0, 3 neighbours): the copies of 1 score 0 + 0 + 36,
  # those of 7 score 0 + 36 + 36. The tie among the copies goes to the lowest index.
  stack = line_stack([1, 1, 1, 7, 7])
  chosen, info = krum(stack, jnp.ones(5), 0)
  np.testing.assert_array_equal(info["scores"], [36, 36, 36, 72, 72])
  np.testing.assert_array_equal(info["selected"], [True, False, False, False, False])
  mean, info = multi_krum(stack, jnp.ones(5), jnp.ones(5), 0, 3)
  np.testing.assert_array_equal(info["selected"], [True, True, True, False, False])
  assert float(mean["x"][0]) == 1.0


def test_krum_returns_the_upload_bit_for_bit():
  stack = random_stack(7, dtype=np.float32)
  chosen, info = krum(stack, jnp.ones(7), 1)
  i = int(np.argmax(info["selected"]))
  for k in stack:
    np.testing.assert_array_equal(chosen[k], stack[k][i])


@jax.jit
def line_rules(stack, mask, weights):
  """Every rule but Bulyan on a line stack: name -> (aggregate, selected or None)."""
  state = robust.centered_clipping_init({"x": jnp.zeros(1, stack["x"].dtype)})
  out = {
      "krum": robust.krum(stack, mask, 1),
      "multi_krum": robust.multi_krum(stack, mask, weights, 1),
      "median": robust.coordinate_median(stack, mask),
      "trimmed_mean": robust.trimmed_mean(stack, mask, 0.2),
      "geometric_median": robust.geometric_median(stack, mask, weights),
      "norm_bound": robust.norm_bounded_mean(stack, mask, weights, 0.5),
      "centered_clipping": robust.centered_clipping(stack, mask, weights, state, radius=0.5,
                                                    iterations=2)[::2],
  }
  return {name: (value["x"], info.get("selected")) for name, (value, info) in out.items()}


def test_padded_nan_client_never_wins_nor_poisons():
  # The padded slot holds NaN or inf, or sits on the honest cluster where it would win.
  honest = [0.0, 0.1, 0.2, 0.3, 5.0, 0.15]
  mask = jnp.array([1, 1, 1, 1, 1, 0, 1.])
  want = line_rules(line_stack(honest), jnp.ones(6), jnp.ones(6))
  for fill in (np.nan, np.inf, 0.15):
    got = line_rules(line_stack(honest[:5] + [fill] + honest[5:]), mask, mask)
    for name, (value, selected) in got.items():
      assert np.isfinite(value).all(), (name, fill)
      np.testing.assert_allclose(value, want[name][0], rtol=1e-6, err_msg=f"{name} {fill}")
      if selected is not None:
        assert not bool(selected[5]), (name, fill)
        np.testing.assert_array_equal(np.delete(selected, 5), want[name][1])


def test_padded_nan_client_does_not_poison_bulyan():
  honest = [0.0, 0.11, 0.2, 0.33, 0.26, 9.0, 0.15]  # no ties in distance
  stack = line_stack(honest[:3] + [np.nan] + honest[3:])
  mask = jnp.array([1, 1, 1, 0, 1, 1, 1, 1.])
  got, info = bulyan(stack, mask, 1)
  want, picked = ref_bulyan(np.asarray(honest)[:, None], 1)
  assert not bool(info["selected"][3])
  assert float(got["x"][0]) == pytest.approx(want[0], rel=1e-6)
  assert int(info["selected"].sum()) == len(picked) == 5


def test_real_client_with_nan_is_kept_out_of_krum():
  stack = line_stack([0.0, 0.1, np.nan, 0.2, 0.3, 0.4])
  chosen, info = krum(stack, jnp.ones(6), 1)
  scores = np.asarray(info["scores"])
  assert np.isfinite(scores[[0, 1, 3, 4, 5]]).all() and scores[2] == np.inf
  assert float(chosen["x"][0]) == pytest.approx(0.2)


def test_median_even_and_odd_counts():
  odd, _ = coordinate_median(line_stack([3, 1, 2, 99]), jnp.array([1, 1, 1, 0.]))
  even, _ = coordinate_median(line_stack([4, 1, 3, 2]), jnp.ones(4))
  assert float(odd["x"][0]) == 2.0 and float(even["x"][0]) == 2.5


def test_trimmed_mean_cuts_floor_beta_n_per_side():
  # n = 5, beta = 0.2: one value cut from each side of 1, 2, 3, 4, 100 -> (2 + 3 + 4) / 3.
  mean, info = trimmed_mean(line_stack([100, 2, 1, 4, 3]), jnp.ones(5), 0.2)
  assert float(mean["x"][0]) == 3.0 and int(info["trimmed_per_side"]) == 1
  # n = 4 (one slot padded with NaN): floor(0.2 * 4) = 0, the plain mean.
  mean, info = trimmed_mean(line_stack([1, 2, np.nan, 3, 6]),
                                   jnp.array([1, 1, 0, 1, 1.]), 0.2)
  assert float(mean["x"][0]) == 3.0 and int(info["trimmed_per_side"]) == 0


def test_f_zero():
  # Bulyan with f = 0 keeps every client (theta = beta = n): the plain mean.
  stack = random_stack(5)
  with jax.enable_x64(True):
    got, info = bulyan(stack, jnp.ones(5), 0)
    mean, _ = trimmed_mean(stack, jnp.ones(5), 0.0)
  assert bool(info["selected"].all())
  close(got, flat(stack).mean(0), stack, 1e-12)
  close(mean, flat(stack).mean(0), stack, 1e-12)


def test_geometric_median_of_a_line_is_the_median():
  # In one dimension the geometric median of 0, 1, 100 is 1; Weiszfeld gets there.
  v, info = geometric_median(line_stack([0, 1, 100]), jnp.ones(3), jnp.ones(3),
                                    iterations=200, nu=1e-8)
  assert float(v["x"][0]) == pytest.approx(1.0, abs=1e-3)
  assert float(info["objective"]) == pytest.approx(100 / 3, rel=1e-3)


def test_centered_clipping_with_a_wide_radius_is_the_mean_and_keeps_its_state():
  stack = line_stack([1, 2, 6])
  state = robust.centered_clipping_init({"x": jnp.zeros(1)})
  v, state, info = centered_clipping(stack, jnp.ones(3), jnp.ones(3), state,
                                             radius=100.0)
  assert float(v["x"][0]) == 3.0 and float(state.center["x"][0]) == 3.0
  assert float(info["clipped"]) == 0.0
  # Radius 1 around the previous aggregate 3: the gaps -2, -1, 3 clip to -1, -1, 1.
  v, state, info = centered_clipping(stack, jnp.ones(3), jnp.ones(3), state, radius=1.0)
  assert float(v["x"][0]) == pytest.approx(3 - 1 / 3)
  assert float(info["clipped"]) == pytest.approx(2 / 3)


def test_norm_bound_scales_to_the_bound_only_when_above():
  small = {"a": jnp.array([0.3]), "b": jnp.array([0.4])}
  big = {"a": jnp.array([3.0]), "b": jnp.array([4.0])}
  np.testing.assert_allclose(robust.norm_bound(big, 1.0)["a"], [0.6], rtol=1e-6)
  np.testing.assert_allclose(robust.norm_bound(big, 1.0)["b"], [0.8], rtol=1e-6)
  assert robust.norm_bound(small, 1.0) == small


# ---------------------------------------------------------------------------------------------
# Masks of varying n inside one jit, against the references.

MASKS = [np.array(m, np.float64) for m in (
    [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],   # n = 11
    [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0],   # n = 10
    [1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1],   # n = 9, holes
    [0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0],   # n = 8
    [1, 1, 1, 0, 1, 1, 1, 0, 0, 0, 1],   # n = 7
)]


@pytest.fixture(scope="module")
def cohort():
  stack = random_stack(11, seed=3)
  stack["kernel"][4] += 5.0  # an outlier
  weights = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], np.float64)
  return stack, weights


def run_all(stack, mask, weights):
  state = robust.centered_clipping_init(jax.tree.map(lambda x: x[0], stack))
  return {
      "krum": krum(stack, mask, 1)[0],
      "multi_krum": multi_krum(stack, mask, weights, 1)[0],
      "multi_krum_3": multi_krum(stack, mask, weights, 1, 3)[0],
      "bulyan": bulyan(stack, mask, 1)[0],
      "median": coordinate_median(stack, mask)[0],
      "trimmed_mean": trimmed_mean(stack, mask, 0.15)[0],
      "geometric_median": geometric_median(stack, mask, weights, iterations=5)[0],
      "centered_clipping": centered_clipping(stack, mask, weights, state, radius=0.8,
                                                    iterations=3)[0],
      "norm_bound": norm_bounded_mean(stack, mask, weights, 1.5)[0],
  }


def references(x, w):
  n = len(x)
  return {
      "krum": ref_krum(x, 1),
      "multi_krum": ref_multi_krum(x, w, 1, n - 1),
      "multi_krum_3": ref_multi_krum(x, w, 1, 3),
      "bulyan": ref_bulyan(x, 1)[0],
      "median": np.median(x, axis=0),
      "trimmed_mean": ref_trimmed_mean(x, 0.15),
      "geometric_median": ref_geometric_median(x, w, 5, 1e-6),
      "centered_clipping": ref_centered_clipping(x, w, np.zeros(x.shape[1]), 0.8, 3, 0.0),
      "norm_bound": sum(wi * ref_norm_bound(xi, 1.5) for wi, xi in zip(w, x)) / w.sum(),
  }


def test_every_rule_matches_its_reference_for_every_mask_in_one_jit(cohort):
  stack, weights = cohort
  with jax.enable_x64(True):
    rules = jax.jit(run_all)
    for mask in MASKS:
      padded = with_padding(stack, mask)
      got = rules(padded, jnp.asarray(mask), jnp.asarray(weights * mask))
      real = np.flatnonzero(mask)
      want = references(flat(stack, real), weights[real])
      for name in want:
        close(got[name], want[name], stack, 1e-10)
    assert rules._cache_size() == 1  # pylint: disable=protected-access


def test_centered_clipping_momentum_over_rounds(cohort):
  stack, weights = cohort
  x = flat(stack)
  with jax.enable_x64(True):
    defence = robust.build("centered_clipping", 1, radius=0.5, iterations=2, momentum=0.9)
    state = defence.init(jax.tree.map(lambda leaf: leaf[0], stack))
    center = np.zeros(x.shape[1])
    step = jax.jit(lambda *args: on_stack(defence, *args))
    for r in range(3):
      shifted = jax.tree.map(lambda leaf: leaf + 0.1 * r, stack)
      got, state, _ = step(shifted, jnp.ones(11), jnp.asarray(weights), state)
      center = ref_centered_clipping(x + 0.1 * r, weights, center, 0.5, 2, 0.9)
      close(got, center, stack, 1e-10)
      close(state.center, center, stack, 1e-10)


def test_valid_reports_the_bound_for_the_rounds_n():
  stack = random_stack(8, dtype=np.float32)
  krum_valid = lambda m: krum(stack, m, 2)[1]["valid"]
  bulyan_valid = lambda m: bulyan(stack, m, 1)[1]["valid"]
  assert bool(krum_valid(jnp.ones(8)))  # n = 8 > 2f + 2 = 6
  assert not bool(krum_valid(jnp.array([1, 1, 1, 1, 1, 1, 0, 0.])))  # n = 6
  assert bool(bulyan_valid(jnp.array([1, 1, 1, 1, 1, 1, 1, 0.])))  # n = 7 >= 4f + 3
  assert not bool(bulyan_valid(jnp.array([1, 1, 1, 1, 1, 1, 0, 0.])))  # n = 6


# ---------------------------------------------------------------------------------------------
# Preconditions and the bundle.

@pytest.mark.parametrize("defence,n,f,bound", [
    ("krum", 6, 2, "n > 2f + 2"), ("multi_krum", 4, 1, "n > 2f + 2"),
    ("bulyan", 10, 2, "n >= 4f + 3"), ("median", 4, 2, "n > 2f"),
    ("geometric_median", 2, 1, "n > 2f"), ("centered_clipping", 6, 3, "n > 2f"),
])
def test_check_preconditions_refuses_with_the_bound(defence, n, f, bound):
  with pytest.raises(HparamError, match="num_byzantine") as error:
    robust.check_preconditions(defence, n, f)
  assert bound in str(error.value) and "\n" not in str(error.value)
  robust.check_preconditions(defence, n + 2 * f + 2 if defence != "bulyan" else 4 * f + 3, f)


def test_check_preconditions_accepts_the_edge_and_names_the_largest_f():
  robust.check_preconditions("krum", 7, 2)
  robust.check_preconditions("bulyan", 11, 2)
  with pytest.raises(HparamError, match=r"n = 10 allows f <= 1"):
    robust.check_preconditions("bulyan", 10, 2)
  robust.check_preconditions("trimmed_mean", 10, 2, beta=0.2)
  with pytest.raises(HparamError, match=r"floor\(beta n\) >= f"):
    robust.check_preconditions("trimmed_mean", 10, 2, beta=0.1)
  with pytest.raises(HparamError, match="beta"):
    robust.check_preconditions("trimmed_mean", 10, 2, beta=0.5)
  with pytest.raises(HparamError, match="defence"):
    robust.check_preconditions("krun", 10, 2)
  robust.check_preconditions("norm_bounding", 1, 5)


def test_build_checks_hyperparameters():
  with pytest.raises(HparamError, match="defence"):
    robust.build("mean")
  with pytest.raises(HparamError, match="trimmed_mean.beta"):
    robust.build("trimmed_mean", 1, beta=0.5)
  with pytest.raises(HparamError, match="centered_clipping.radius"):
    robust.build("centered_clipping", 1)
  with pytest.raises(HparamError, match="krum.radius"):
    robust.build("krum", 1, radius=1.0)
  with pytest.raises(HparamError, match="num_byzantine"):
    robust.build("krum", -1)


def on_stack(stage, stack, mask, weights, state):
  """A stage's server part on the cohort's stack: (aggregate, state, scalars)."""
  return stage.server(stages.Stack(stack, weights, mask), state, jax.random.PRNGKey(0))


def test_build_makes_every_rule_a_stage(cohort):
  stack, weights = cohort
  stack = jax.tree.map(lambda x: x.astype(np.float32), stack)
  hparams = {"trimmed_mean": {"beta": 0.2}, "centered_clipping": {"radius": 1.0},
             "norm_bounding": {"bound": 1.0}}
  upload_like = jax.tree.map(lambda x: x[0], stack)
  for name in robust.DEFENCES:
    streams = name == "norm_bounding"
    defence = robust.build(name, 1, on_stack=streams, **hparams.get(name, {}))
    state = defence.init(upload_like)
    assert defence.consumes == stages.STACK and defence.reduces, name
    # Traced, not compiled: the numbers are checked above, here the stage's shapes.
    value, next_state, info = jax.eval_shape(
        lambda s, m, w, st, d=defence: on_stack(d, s, m, w, st), stack, jnp.ones(11),
        jnp.asarray(weights), state)
    assert jax.tree.map(np.shape, value) == jax.tree.map(np.shape, upload_like), name
    assert jax.tree.map(np.shape, next_state) == jax.tree.map(np.shape, state), name
    assert info["valid"].shape == () and info["valid"].dtype == bool, name
  # Norm bounding streams: its per-client clip then the engine's weighted mean.
  defence = robust.build("norm_bounding", bound=1.0)
  assert defence.consumes == stages.SUMS and defence.client is not None
  clipped = jax.vmap(lambda u: defence.client(u, defence.init(None), jax.random.PRNGKey(0)))(
      stack)
  streamed = jax.tree.map(lambda x: np.tensordot(weights, x, axes=1) / weights.sum(), clipped)
  whole = on_stack(robust.build("norm_bounding", bound=1.0, on_stack=True), stack,
                   jnp.ones(11), jnp.asarray(weights), ())[0]
  for k in stack:
    np.testing.assert_allclose(streamed[k], whole[k], rtol=1e-6)
