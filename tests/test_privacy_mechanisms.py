"""Clipping, noise and adaptive clipping against numpy references written here."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lama.engine import reduce, stages
from fedjax_lama.errors import HparamError
from fedjax_lama.privacy import (AdaptiveClipOptions, DpOptions, SamplingOptions, clipping,
                                 mechanisms, update_noise_multiplier)

SHAPES = {"dense": {"kernel": (3, 4), "bias": (4,)}, "out": {"kernel": (4, 2)}}


def client_updates(num_clients: int, seed: int) -> dict:
  """Stacked updates whose norms spread over about two orders of magnitude."""
  rng = np.random.default_rng(seed)
  scales = np.exp(rng.uniform(-2, 2.5, num_clients)).astype(np.float32)
  return jax.tree.map(
      lambda s: (rng.normal(size=(num_clients,) + s).astype(np.float32)
                 * scales.reshape((-1,) + (1,) * len(s))),
      SHAPES, is_leaf=lambda x: isinstance(x, tuple))


def options(clipping="flat", layer_split="equal", sigma=0.0, clip=1.5, adaptive=None,
            num_clients=100, rate=0.08):
  return DpOptions(noise_multiplier=sigma, clip_norm=clip, delta=1e-3, clipping=clipping,
                   layer_split=layer_split, adaptive=adaptive,
                   sampling=SamplingOptions("poisson", num_clients, rate=rate))


def run_stage(stage, stacked, mask, state, key, chunk=None):
  """The engine's shape: vmapped client, masked uniform sums over chunks, then the server."""
  num = mask.shape[0]
  chunk = chunk or num
  client = jax.jit(jax.vmap(stage.client, in_axes=(0, None, 0)))
  total = None
  for start in range(0, num, chunk):
    part = jax.tree.map(lambda x: x[start:start + chunk], stacked)
    keys = jax.random.split(jax.random.PRNGKey(0), part["out"]["kernel"].shape[0])
    outputs = client(part, state, keys)
    summed = reduce.weighted_sum(outputs, jnp.asarray(mask[start:start + chunk]))
    total = summed if total is None else jax.tree.map(jnp.add, total, summed)
  return jax.jit(stage.server)(stages.Sums(total, jnp.sum(mask)), state, key)


def flat_leaves(tree, i):
  return [np.asarray(x[i], np.float64).ravel() for x in jax.tree.leaves(tree)]


def numpy_clipped_mean(stacked, mask, layer_clips, expected):
  """sum over unmasked clients of each leaf scaled by min(1, clip / norm), / expected cohort.

  `layer_clips`: one clip per group of leaves; a group is all leaves (flat) or one leaf.
  """
  leaves = jax.tree.leaves(stacked)
  total = [np.zeros(np.shape(x)[1:]) for x in leaves]
  for i in np.flatnonzero(mask):
    vectors = flat_leaves(stacked, i)
    if len(layer_clips) == 1:  # flat: one norm over the whole model
      norm = np.sqrt(sum(np.sum(v ** 2) for v in vectors))
      scales = [min(1.0, layer_clips[0] / norm)] * len(vectors)
    else:
      scales = [min(1.0, c / np.linalg.norm(v)) for v, c in zip(vectors, layer_clips)]
    for t, v, s, x in zip(total, vectors, scales, leaves):
      t += (v * s).reshape(np.shape(x)[1:])
  return [t / expected for t in total]


@pytest.mark.parametrize("clipping, layer_split", [
    ("flat", "equal"), ("per_layer", "equal"), ("per_layer", "size"),
    ("per_layer", (0.5, 0.2, 0.3))])
def test_clip_then_average_without_noise_equals_numpy(clipping, layer_split):
  opts = options(clipping, layer_split)
  stacked = client_updates(11, seed=3)
  mask = np.array([1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 1], np.float32)  # two padded rows
  stage = mechanisms.user_level_dp(opts)
  value, state, scalars = run_stage(stage, stacked, mask, stage.init(None),
                                    jax.random.PRNGKey(1))
  leaves = jax.tree.leaves(stacked)
  if clipping == "flat":
    clips = [opts.clip_norm]
  else:
    if layer_split == "equal":
      shares = np.full(len(leaves), 1 / len(leaves))
    elif layer_split == "size":
      sizes = np.array([np.prod(x.shape[1:]) for x in leaves], np.float64)
      shares = sizes / sizes.sum()
    else:
      shares = np.array(layer_split)
    clips = list(opts.clip_norm * np.sqrt(shares))
  expected = numpy_clipped_mean(stacked, mask, clips, opts.sampling.expected_cohort)
  for got, want in zip(jax.tree.leaves(value), expected):
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-6, atol=1e-7)
  assert float(scalars["dp/clip_norm"]) == pytest.approx(opts.clip_norm)
  assert state.clip_norm == stage.init(None).clip_norm
  # Some clients were clipped and some were not, so the reference is not vacuous.
  norms = [np.sqrt(sum(np.sum(v ** 2) for v in flat_leaves(stacked, i))) for i in range(11)]
  assert min(norms) < opts.clip_norm < max(norms)


def test_chunks_sum_to_the_unchunked_round():
  stage = mechanisms.user_level_dp(options("flat", sigma=0.7))
  stacked, mask = client_updates(12, seed=5), np.ones(12, np.float32)
  key = jax.random.PRNGKey(4)
  whole = run_stage(stage, stacked, mask, stage.init(None), key)[0]
  chunked = run_stage(stage, stacked, mask, stage.init(None), key, chunk=4)[0]
  for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(chunked)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_per_layer_clips_share_the_whole_clip():
  tree = jax.tree.map(lambda s: jnp.ones(s), SHAPES, is_leaf=lambda x: isinstance(x, tuple))
  for split in ("equal", "size", (0.1, 0.6, 0.3)):
    clips = clipping.layer_clip_norms(tree, 2.0, split)
    assert float(sum(c ** 2 for c in jax.tree.leaves(clips))) == pytest.approx(4.0, rel=1e-6)
  with pytest.raises(HparamError, match=r"^privacy\.layer_split=\(0\.5, 0\.5\) .*\(3 leaves\)$"):
    clipping.layer_clip_norms(tree, 2.0, (0.5, 0.5))


def test_the_noise_has_std_sigma_c_over_the_expected_cohort():
  sigma, clip, expected = 1.3, 0.7, 8.0  # 0.08 * 100 clients
  zeros = {"a": jnp.zeros((400, 500)), "b": jnp.zeros((100_000,))}
  noised_mean = jax.jit(mechanisms.noised_mean)
  stds, means = [], []
  for seed in range(4):
    noisy = noised_mean(zeros, jax.random.PRNGKey(seed), sigma, clip, expected)
    values = np.concatenate([np.asarray(x).ravel() for x in jax.tree.leaves(noisy)])
    stds.append(values.std())
    means.append(values.mean())
  n = 4 * 300_000
  want = sigma * clip / expected
  # The sample std of n normals has relative standard error 1/sqrt(2n); a 5-sigma band.
  assert np.mean(stds) == pytest.approx(want, rel=5 / np.sqrt(2 * n))
  assert abs(np.mean(means)) < 5 * want / np.sqrt(n)
  # Leaves draw independent noise (each from its own folded key).
  noisy = mechanisms.add_gaussian_noise({"a": jnp.zeros(50_000), "b": jnp.zeros(50_000)},
                                        1.0, jax.random.PRNGKey(9))
  assert abs(np.corrcoef(np.asarray(noisy["a"]), np.asarray(noisy["b"]))[0, 1]) < 5 / np.sqrt(
      50_000)


def test_the_stage_noises_the_updates_with_the_adaptive_multiplier():
  adaptive = AdaptiveClipOptions(count_stddev=4.0)
  opts = options(sigma=1.1, adaptive=adaptive)
  stage = mechanisms.user_level_dp(opts)
  summed = {"update": {"w": jnp.zeros(200_000)}, "unclipped": jnp.float32(3)}
  value = stage.server(stages.Sums(summed, jnp.float32(3)), stage.init(None),
                       jax.random.PRNGKey(2))[0]
  want = update_noise_multiplier(1.1, 4.0) * opts.clip_norm / opts.sampling.expected_cohort
  assert np.std(np.asarray(value["w"])) == pytest.approx(want, rel=5 / np.sqrt(400_000))


def test_adaptive_clipping_without_noise_follows_the_geometric_update():
  gamma, eta, clip0 = 0.4, 0.3, 1.0
  opts = options(sigma=0.0, clip=clip0, num_clients=100, rate=0.1,
                 adaptive=AdaptiveClipOptions(target_quantile=gamma, learning_rate=eta,
                                              count_stddev=0.0))
  stage = mechanisms.user_level_dp(opts)
  server = jax.jit(stage.server)
  client = jax.jit(jax.vmap(stage.client, in_axes=(0, None, 0)))
  state, clip = stage.init(None), clip0
  fractions = []
  for round_idx in range(6):
    stacked = client_updates(10, seed=100 + round_idx)
    mask = np.ones(10, np.float32)
    mask[round_idx % 10] = 0  # a padded row must not count
    keys = jax.random.split(jax.random.PRNGKey(round_idx), 10)
    outputs = client(stacked, state, keys)
    summed = reduce.weighted_sum(outputs, jnp.asarray(mask))
    _, state, scalars = server(stages.Sums(summed, jnp.sum(jnp.asarray(mask))), state,
                               jax.random.PRNGKey(round_idx))
    # numpy: b = (number of unmasked clients with norm <= C) / (q N); C <- C exp(-eta (b - gamma))
    norms = np.array([np.sqrt(sum(np.sum(v ** 2) for v in flat_leaves(stacked, i)))
                      for i in range(10)])
    fraction = np.sum((norms <= clip) * mask) / 10.0
    clip = clip * np.exp(-eta * (fraction - gamma))
    fractions.append(fraction)
    assert float(scalars["dp/unclipped_fraction"]) == pytest.approx(fraction, abs=1e-6)
    assert float(state.clip_norm) == pytest.approx(clip, rel=1e-6)
  assert len(set(fractions)) > 1  # the clip moved through different quantiles


def test_adaptive_clip_step_noise_has_std_sigma_b_over_the_cohort():
  keys = jax.random.split(jax.random.PRNGKey(0), 20_000)
  step = jax.vmap(lambda k: mechanisms.adaptive_clip_step(
      1.0, 5.0, k, expected_cohort=10.0, target_quantile=0.5, learning_rate=0.2,
      count_stddev=2.0)[1])
  fractions = np.asarray(step(keys))
  assert fractions.std() == pytest.approx(0.2, rel=5 / np.sqrt(2 * 20_000))
  assert fractions.mean() == pytest.approx(0.5, abs=5 * 0.2 / np.sqrt(20_000))
