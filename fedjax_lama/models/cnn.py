"""Small convolutional networks of the seed papers' experiments: LEAF's FEMNIST CNN (as
FedLAMA, Lee et al. 2023, uses it), FedSpeed's LeNet (Sun et al. 2023), FedAT's CNN (Chai
et al. 2021) and Fed-LAMB's CNNs (Karimi et al. 2022), with their code's layer sizes.

Every model takes NHWC float32 images and returns logits. The convolution plan
(the injected `conv`, `dense` and `max_pool`; `fedjax_lama.kernels`) changes how
convolutions and pooling are computed, never the parameters. Where a paper has conv -> ReLU -> max-pool we compute
max-pool -> ReLU: the two are equal exactly (ReLU is monotone), and the ReLU
and its gradient mask get 4x smaller.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_lama.models import param_layers

Array = jax.Array
ModuleDef = Any


def _flatten(x: Array) -> Array:
  """Flattens in NHWC (H, W, C) order, as Keras/TF do."""
  return x.reshape((x.shape[0], -1))


class FedATCNN(nn.Module):
  """FedAT's CNN (Chai et al. 2021; also Fed-LAMB's `cifar_cnn`, Karimi et al. 2022).

  variant "tf_tutorial" (default): conv 3x3 32/64/64 VALID, 2x2 max-pool after
  the first two, dense 64, dense classes: 122,570 parameters on 32x32x3 and
  93,322 on 28x28x1 (the dense input size follows the image size).
  variant "same_pool3": 3x3 SAME convs with a pool after each of the three
  (same counts).
  """
  num_classes: int = 10
  variant: str = "tf_tutorial"
  init_style: str = "keras"
  conv: ModuleDef = param_layers.Conv
  dense: ModuleDef = param_layers.Dense
  max_pool: Callable[..., Array] = param_layers.max_pool

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    del train  # No dropout or normalisation.
    same = self.variant == "same_pool3"
    pad = "SAME" if same else "VALID"
    conv = lambda f: self.conv(f, (3, 3), padding=pad,
                                 init_style=self.init_style)
    pool = lambda y: self.max_pool(y, (2, 2))
    x = nn.relu(pool(conv(32)(x)))
    x = nn.relu(pool(conv(64)(x)))
    x = conv(64)(x)
    x = nn.relu(pool(x) if same else x)
    x = nn.relu(self.dense(64, init_style=self.init_style)(_flatten(x)))
    return self.dense(self.num_classes, init_style=self.init_style)(x)


class LeafCNN(nn.Module):
  """LEAF FEMNIST CNN (Caldas et al. 2018, as FedLAMA uses it): 6,603,710 parameters for 62 classes.

  conv 5x5 32 SAME, pool, conv 5x5 64 SAME, pool, dense 2048, dense classes.
  """
  num_classes: int = 62
  init_style: str = "keras"
  conv: ModuleDef = param_layers.Conv
  dense: ModuleDef = param_layers.Dense
  max_pool: Callable[..., Array] = param_layers.max_pool

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    del train
    for f in (32, 64):
      x = self.conv(f, (5, 5), padding="SAME", init_style=self.init_style)(x)
      x = nn.relu(self.max_pool(x, (2, 2)))
    x = nn.relu(self.dense(2048, init_style=self.init_style)(_flatten(x)))
    return self.dense(self.num_classes, init_style=self.init_style)(x)


class MnistCNN(nn.Module):
  """Fed-LAMB's MNIST CNN (Karimi et al. 2022, its code's model): 21,840 parameters.

  conv 5x5 10 VALID, pool, ReLU, conv 5x5 20 VALID, channel dropout 0.5, pool,
  ReLU, flatten 320, dense 50, ReLU, dropout 0.5, dense classes.
  """
  num_classes: int = 10
  dropout: float = 0.5
  init_style: str = "torch"
  conv: ModuleDef = param_layers.Conv
  dense: ModuleDef = param_layers.Dense
  max_pool: Callable[..., Array] = param_layers.max_pool

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    conv = lambda f: self.conv(f, (5, 5), padding="VALID",
                                 init_style=self.init_style)
    x = nn.relu(self.max_pool(conv(10)(x), (2, 2)))
    x = conv(20)(x)
    # Whole feature maps are dropped (PyTorch Dropout2d).
    x = nn.Dropout(self.dropout, broadcast_dims=(1, 2))(
        x, deterministic=not train)
    x = nn.relu(self.max_pool(x, (2, 2)))
    x = nn.relu(self.dense(50, init_style=self.init_style)(_flatten(x)))
    x = nn.Dropout(self.dropout)(x, deterministic=not train)
    return self.dense(self.num_classes, init_style=self.init_style)(x)


class LeNet(nn.Module):
  """LeNet-style CNNs of two reference codes.

  variant "fedlamb" (`cifar_lenet`, the Fed-LAMB code's
  CNNCifar): conv 5x5 6, pool, conv 5x5 16, pool, dense 120, 84, classes;
  62,006 parameters for 10 classes.
  variant "fedspeed" (FedSpeed's `LeNet`): conv 5x5 64, pool, conv 5x5 64,
  pool, dense 384, 192, classes; 797,962 parameters for 10 classes.
  All convs VALID with bias; ReLU and 2x2 max-pool after each.
  """
  num_classes: int = 10
  variant: str = "fedlamb"
  init_style: str = "torch"
  conv: ModuleDef = param_layers.Conv
  dense: ModuleDef = param_layers.Dense
  max_pool: Callable[..., Array] = param_layers.max_pool

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    del train
    convs, dense = {"fedlamb": ((6, 16), (120, 84)),
                    "fedspeed": ((64, 64), (384, 192))}[self.variant]
    for f in convs:
      x = self.conv(f, (5, 5), padding="VALID", init_style=self.init_style)(x)
      x = nn.relu(self.max_pool(x, (2, 2)))
    x = _flatten(x)
    for f in dense:
      x = nn.relu(self.dense(f, init_style=self.init_style)(x))
    return self.dense(self.num_classes, init_style=self.init_style)(x)


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
  conv: ModuleDef = param_layers.Conv
  dense: ModuleDef = param_layers.Dense
  max_pool: Callable[..., Array] = param_layers.max_pool

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    conv = lambda f: self.conv(f, (3, 3), padding="VALID",
                                 init_style=self.init_style)
    x = nn.relu(conv(32)(x))
    x = nn.relu(self.max_pool(conv(64)(x), (2, 2)))
    if self.conv_dropout:
      x = nn.Dropout(self.conv_dropout)(x, deterministic=not train)
    x = nn.relu(self.dense(128, init_style=self.init_style)(_flatten(x)))
    if self.dropout:
      x = nn.Dropout(self.dropout)(x, deterministic=not train)
    return self.dense(self.num_classes, init_style=self.init_style)(x)
