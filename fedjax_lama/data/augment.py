"""Input normalisation (host, once) and training augmentation (device, per step).

The CIFAR recipe of the seed papers (FedLAMA reference
`feeders/feeder_cifar.py`): standardise, zero-pad to 40 x 40, take a random 32 x 32
crop, flip horizontally with probability 1/2; the test split is only standardised.

- Normalisation is a fixed affine map computed from the training split, so it is
  applied once to the host arrays (train and test alike); "per_channel" is the usual
  recipe (the issue's), "per_pixel" the reference code's 32 x 32 x 3 mean and std.
  Padding after standardisation pads with zeros = the mean, as the reference does.
- Crop and flip draw fresh randomness at every local step inside the jitted scan:
  `crop_flip(x, key)` gets the (client, step) key the engine derives
  (engine/local.make_client_train), so draws do not depend on cohort, padding,
  sharding or chunking, and a resumed run repeats them.
"""
import dataclasses
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lama.errors import ConfigError

NORMALIZATIONS = ("none", "per_channel", "per_pixel")
AUGMENTATIONS = ("none", "crop_flip")


def normalization_stats(train_x: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
  """Mean and std of the training images, per channel [C] or per pixel [H, W, C]."""
  if kind not in NORMALIZATIONS[1:]:
    raise ConfigError(f"config.normalization must be one of {list(NORMALIZATIONS)}, got {kind!r}")
  axes = (0, 1, 2) if kind == "per_channel" else (0,)
  x = np.asarray(train_x, np.float64)
  mean = x.mean(axis=axes)
  std = x.std(axis=axes)
  return mean.astype(np.float32), np.maximum(std, 1e-6).astype(np.float32)


def normalize_dataset(dataset, kind: str, validation=None):
  """A copy of an image dataset (and of its held-out validation examples, if given)
  standardised with its training split's statistics. Returns (dataset, validation)."""
  if kind == "none":
    return dataset, validation
  if np.ndim(dataset.train_x) != 4:
    raise ConfigError(f"config.normalization={kind!r} needs image inputs [N, H, W, C]; dataset "
                     f"{dataset.name!r} has inputs of shape {np.shape(dataset.train_x)}")
  mean, std = normalization_stats(dataset.train_x, kind)
  norm = lambda x: ((np.asarray(x, np.float32) - mean) / std).astype(np.float32)
  if validation is not None:
    validation = dataclasses.replace(validation, x=norm(validation.x))
  return (dataclasses.replace(dataset, train_x=norm(dataset.train_x),
                              test_x=norm(dataset.test_x)), validation)


def crop_flip(x: jax.Array, key: jax.Array, pad: int = 4) -> jax.Array:
  """Pad by `pad` zeros, random crop back to H x W, random horizontal flip; per example.

  x: [B, H, W, C]. Every example gets its own offsets and flip from `key`.
  """
  b, h, w, _ = x.shape
  k_off, k_flip = jax.random.split(key)
  offsets = jax.random.randint(k_off, (b, 2), 0, 2 * pad + 1)
  flips = jax.random.bernoulli(k_flip, 0.5, (b,))
  padded = jnp.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))

  def one(img, off, flip):
    out = jax.lax.dynamic_slice(img, (off[0], off[1], 0), (h, w, img.shape[-1]))
    return jnp.where(flip, out[:, ::-1, :], out)

  return jax.vmap(one)(padded, offsets, flips)


def augmentation(kind: str, dataset=None) -> Optional[Callable[[jax.Array, jax.Array], jax.Array]]:
  """The engine's `augment` hook for config.augmentation=kind (None: no augmentation)."""
  if kind not in AUGMENTATIONS:
    raise ConfigError(f"config.augmentation must be one of {list(AUGMENTATIONS)}, got {kind!r}")
  if kind == "none":
    return None
  if dataset is not None and np.ndim(dataset.train_x) != 4:
    raise ConfigError(f"config.augmentation={kind!r} needs image inputs [N, H, W, C]; dataset "
                     f"{dataset.name!r} has inputs of shape {np.shape(dataset.train_x)}")
  return crop_flip
