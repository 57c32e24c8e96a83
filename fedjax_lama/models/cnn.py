"""Small convolutional networks of the seed papers (algorithms.md 1.6.6, 2.3,
3.6.4 and 4.5.3).

Every model takes NHWC float32 images and returns logits. The convolution plan
(`conv_impl`) changes how convolutions and pooling are computed, never the
parameters (see `layers`). Where a paper has conv -> ReLU -> max-pool we compute
max-pool -> ReLU: the two are equal exactly (ReLU is monotone), and the ReLU
and its gradient mask get 4x smaller.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_lama.models import layers

Array = jax.Array


def _flatten(x: Array) -> Array:
  """Flattens in NHWC (H, W, C) order, as Keras/TF do."""
  return x.reshape((x.shape[0], -1))


class FedATCNN(nn.Module):
  """FedAT's CNN, algorithms.md 3.6.4 (also Fed-LAMB's `cifar_cnn`, 4.5.3).

  variant "tf_tutorial" (default): conv 3x3 32/64/64 VALID, 2x2 max-pool after
  the first two, dense 64, dense classes: 122,570 parameters on 32x32x3 and
  93,322 on 28x28x1 (the dense input size follows the image size).
  variant "same_pool3": 3x3 SAME convs with a pool after each of the three
  (same counts).
  """
  num_classes: int = 10
  variant: str = "tf_tutorial"
  init_style: str = "keras"
  conv_impl: str = "lax"

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    del train  # No dropout or normalisation.
    same = self.variant == "same_pool3"
    pad = "SAME" if same else "VALID"
    conv = lambda f: layers.Conv(f, (3, 3), padding=pad,
                                 init_style=self.init_style,
                                 conv_impl=self.conv_impl)
    pool = lambda y: layers.max_pool(y, (2, 2), impl=self.conv_impl)
    x = nn.relu(pool(conv(32)(x)))
    x = nn.relu(pool(conv(64)(x)))
    x = conv(64)(x)
    x = nn.relu(pool(x) if same else x)
    x = nn.relu(layers.Dense(64, init_style=self.init_style, impl=self.conv_impl)(_flatten(x)))
    return layers.Dense(self.num_classes, init_style=self.init_style, impl=self.conv_impl)(x)


class LeafCNN(nn.Module):
  """LEAF FEMNIST CNN, algorithms.md 1.6.6: 6,603,710 parameters for 62 classes.

  conv 5x5 32 SAME, pool, conv 5x5 64 SAME, pool, dense 2048, dense classes.
  """
  num_classes: int = 62
  init_style: str = "keras"
  conv_impl: str = "lax"

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    del train
    for f in (32, 64):
      x = layers.Conv(f, (5, 5), padding="SAME", init_style=self.init_style,
                      conv_impl=self.conv_impl)(x)
      x = nn.relu(layers.max_pool(x, (2, 2), impl=self.conv_impl))
    x = nn.relu(layers.Dense(2048, init_style=self.init_style, impl=self.conv_impl)(_flatten(x)))
    return layers.Dense(self.num_classes, init_style=self.init_style, impl=self.conv_impl)(x)


class MnistCNN(nn.Module):
  """Fed-LAMB's MNIST CNN, algorithms.md 4.5.3: 21,840 parameters.

  conv 5x5 10 VALID, pool, ReLU, conv 5x5 20 VALID, channel dropout 0.5, pool,
  ReLU, flatten 320, dense 50, ReLU, dropout 0.5, dense classes.
  """
  num_classes: int = 10
  dropout: float = 0.5
  init_style: str = "torch"
  conv_impl: str = "lax"

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    conv = lambda f: layers.Conv(f, (5, 5), padding="VALID",
                                 init_style=self.init_style,
                                 conv_impl=self.conv_impl)
    x = nn.relu(layers.max_pool(conv(10)(x), (2, 2), impl=self.conv_impl))
    x = conv(20)(x)
    # Whole feature maps are dropped (PyTorch Dropout2d).
    x = layers.Dropout(self.dropout, broadcast_dims=(1, 2), impl=self.conv_impl)(
        x, deterministic=not train)
    x = nn.relu(layers.max_pool(x, (2, 2), impl=self.conv_impl))
    x = nn.relu(layers.Dense(50, init_style=self.init_style, impl=self.conv_impl)(_flatten(x)))
    x = layers.Dropout(self.dropout, impl=self.conv_impl)(x, deterministic=not train)
    return layers.Dense(self.num_classes, init_style=self.init_style, impl=self.conv_impl)(x)


class LeNet(nn.Module):
  """LeNet-style CNNs of two reference codes.

  variant "fedlamb" (algorithms.md 4.5.3 `cifar_lenet`, the Fed-LAMB code's
  CNNCifar): conv 5x5 6, pool, conv 5x5 16, pool, dense 120, 84, classes;
  62,006 parameters for 10 classes.
  variant "fedspeed" (2.3, FedSpeed's `LeNet`): conv 5x5 64, pool, conv 5x5 64,
  pool, dense 384, 192, classes; 797,962 parameters for 10 classes.
  All convs VALID with bias; ReLU and 2x2 max-pool after each.
  """
  num_classes: int = 10
  variant: str = "fedlamb"
  init_style: str = "torch"
  conv_impl: str = "lax"

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    del train
    convs, dense = {"fedlamb": ((6, 16), (120, 84)),
                    "fedspeed": ((64, 64), (384, 192))}[self.variant]
    for f in convs:
      x = layers.Conv(f, (5, 5), padding="VALID", init_style=self.init_style,
                      conv_impl=self.conv_impl)(x)
      x = nn.relu(layers.max_pool(x, (2, 2), impl=self.conv_impl))
    x = _flatten(x)
    for f in dense:
      x = nn.relu(layers.Dense(f, init_style=self.init_style, impl=self.conv_impl)(x))
    return layers.Dense(self.num_classes, init_style=self.init_style, impl=self.conv_impl)(x)


class PflCNN(nn.Module):
  """pfl-research's `simple_cnn` (its CIFAR-10 benchmark model, benchmarks/model): conv 3x3
  32 VALID, ReLU, conv 3x3 64 VALID, ReLU, 2x2 max-pool, dropout 0.25, dense 128, ReLU,
  dropout 0.5, dense classes. 1,626,442 parameters on 32x32x3 with 10 classes (the dense
  input follows the image size). Glorot-uniform kernels as there; zero biases ("keras").
  """
  num_classes: int = 10
  dropout: float = 0.5  # after the dense layer; conv_dropout after the pool
  conv_dropout: float = 0.25
  init_style: str = "keras"
  conv_impl: str = "lax"

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    conv = lambda f: layers.Conv(f, (3, 3), padding="VALID",
                                 init_style=self.init_style,
                                 conv_impl=self.conv_impl)
    x = nn.relu(conv(32)(x))
    x = nn.relu(layers.max_pool(conv(64)(x), (2, 2), impl=self.conv_impl))
    if self.conv_dropout:
      x = layers.Dropout(self.conv_dropout, impl=self.conv_impl)(x, deterministic=not train)
    x = nn.relu(layers.Dense(128, init_style=self.init_style, impl=self.conv_impl)(_flatten(x)))
    if self.dropout:
      x = layers.Dropout(self.dropout, impl=self.conv_impl)(x, deterministic=not train)
    return layers.Dense(self.num_classes, init_style=self.init_style, impl=self.conv_impl)(x)
