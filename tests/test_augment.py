"""On-device augmentation (pad 4 + random crop + flip) and input normalisation."""
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lama import config as config_lib
from fedjax_lama import training
from fedjax_lama.data import Dataset
from fedjax_lama.data import augment


def _images(b=16, h=8, w=8, c=3, seed=0):
  return jnp.asarray(np.random.default_rng(seed).random((b, h, w, c), dtype=np.float32) + 1.0)


def _matches_some_crop(out, img, pad=4):
  """out equals a crop (flipped or not) of the zero-padded img at some offset."""
  h, w, _ = img.shape
  padded = np.pad(img, ((pad, pad), (pad, pad), (0, 0)))
  for dy in range(2 * pad + 1):
    for dx in range(2 * pad + 1):
      crop = padded[dy:dy + h, dx:dx + w]
      if np.array_equal(out, crop) or np.array_equal(out, crop[:, ::-1]):
        return (dy, dx)
  return None


def test_crop_flip_is_a_padded_crop_of_each_example():
  x = _images()
  out = np.asarray(augment.crop_flip(x, jax.random.PRNGKey(3)))
  assert out.shape == x.shape
  offsets = [_matches_some_crop(out[i], np.asarray(x[i])) for i in range(len(x))]
  assert all(o is not None for o in offsets)
  assert len(set(offsets)) > 1  # per-example draws, not one offset for the batch


def test_crop_flip_is_deterministic_in_its_key():
  x = _images()
  a = augment.crop_flip(x, jax.random.PRNGKey(1))
  b = augment.crop_flip(x, jax.random.PRNGKey(1))
  c = augment.crop_flip(x, jax.random.PRNGKey(2))
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)


@pytest.mark.slow
def test_crop_flip_offsets_and_flips_are_uniform():
  """Over many draws the offsets are uniform on 0..8 and half the images flip."""
  x = jnp.zeros((1, 4, 4, 1)).at[0, 0, 0, 0].set(1.0)  # a marker pixel shows the offset
  keys = jax.random.split(jax.random.PRNGKey(0), 4000)
  outs = np.asarray(jax.vmap(lambda k: augment.crop_flip(x, k)[0, ..., 0])(keys))
  present = outs.reshape(len(keys), -1).sum(1) > 0
  # The padded marker sits at (4, 4): it is inside the crop for dy, dx in [1, 4], 16 of 81.
  assert abs(present.mean() - 16 / 81) < 0.02
  rows, cols = np.nonzero(outs[present].sum(0))
  assert set(rows) == set(range(4)) and set(cols) == set(range(4))
  flipped = np.asarray(jax.vmap(lambda k: augment.crop_flip(x, k, pad=0)[0, 0, 3, 0])(keys))
  assert abs(flipped.mean() - 0.5) < 0.03


def test_normalize_per_channel_uses_train_statistics():
  r = np.random.default_rng(0)
  train = (r.random((50, 4, 4, 3)) * [1, 2, 3] + [0, 5, 10]).astype(np.float32)
  test = train[:7] + 1
  ds = Dataset("synthetic", train, np.zeros(50, np.int32), test, np.zeros(7, np.int32), 2)
  out, _ = augment.normalize_dataset(ds, "per_channel")
  np.testing.assert_allclose(out.train_x.mean(axis=(0, 1, 2)), 0, atol=1e-5)
  np.testing.assert_allclose(out.train_x.std(axis=(0, 1, 2)), 1, atol=1e-4)
  std = train.std(axis=(0, 1, 2))
  np.testing.assert_allclose(out.test_x - out.train_x[:7], np.broadcast_to(1 / std, (7, 4, 4, 3)),
                             rtol=1e-4)
  pixel, _ = augment.normalize_dataset(ds, "per_pixel")
  np.testing.assert_allclose(pixel.train_x.mean(axis=0), 0, atol=1e-5)
  assert augment.normalize_dataset(ds, "none")[0] is ds


def test_non_image_inputs_are_refused():
  ds = Dataset("text", np.zeros((5, 7), np.int32), np.zeros(5, np.int32),
               np.zeros((2, 7), np.int32), np.zeros(2, np.int32), 2)
  with pytest.raises(config_lib.ConfigError, match="config.normalization"):
    augment.normalize_dataset(ds, "per_channel")
  c = config_lib.base_config()
  c.augmentation = "crop_flip"
  with pytest.raises(config_lib.ConfigError, match="config.augmentation"):
    augment.augmentation(c.augmentation, ds)
  c.augmentation = "mixup"
  with pytest.raises(config_lib.ConfigError, match="augmentation"):
    config_lib.validate(c)


def _run(**overrides):
  c = config_lib.base_config()
  c.num_clients, c.rounds, c.local_steps, c.plots = 6, 2, 3, False
  for k, v in overrides.items():
    c[k] = v
  with tempfile.TemporaryDirectory() as d:
    training.train_and_evaluate(c, d)
    with open(f"{d}/metrics.jsonl") as f:
      return f.read()


@pytest.mark.slow
def test_augmented_training_is_reproducible_and_differs_from_plain():
  plain = _run()
  aug = _run(augmentation="crop_flip", normalization="per_channel")
  again = _run(augmentation="crop_flip", normalization="per_channel")
  strip = lambda m: [l.split('"wall_seconds"')[0] for l in m.splitlines()]
  assert strip(aug) == strip(again)
  assert strip(aug) != strip(plain)
