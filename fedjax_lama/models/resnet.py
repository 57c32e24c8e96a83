"""Residual networks of the seed papers: FedLAMA's ResNet20 and WRN-28-10 (Lee et al.
2023, its reference code), FedSpeed's ResNet-18-GN (Sun et al. 2023) and Fed-LAMB's
ResNet-9 (Karimi et al. 2022).

BatchNorm models keep running statistics in the 'batch_stats' collection and
normalise with them when `train=False`; WRN's dropout draws from the 'dropout'
rng. The injected `conv`, `dense` and `max_pool` (`fedjax_lama.kernels`) never change the
parameters.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_lama.models import param_layers

Array = jax.Array
ModuleDef = Any


def _gap(x: Array) -> Array:
  """Global average pooling over H and W."""
  return jnp.mean(x, axis=(1, 2))


class _PostActBlock(nn.Module):
  """Post-activation basic block of the FedLAMA reference ResNets.

  y = conv3x3(s) -> BN -> ReLU [-> dropout] -> conv3x3 -> BN(gamma=0);
  shortcut = BN(conv1x1(s)(x)) if `project` else x; out = ReLU(y + shortcut).
  """
  width: int
  strides: int
  project: bool
  norm: Any
  conv: ModuleDef
  dropout: float = 0.0

  @nn.compact
  def __call__(self, x: Array, train: bool) -> Array:
    conv = functools.partial(self.conv, use_bias=False, padding="SAME",
                             init_style="keras")
    s = (self.strides, self.strides)
    y = nn.relu(self.norm()(conv(self.width, (3, 3), s)(x)))
    if self.dropout:
      y = nn.Dropout(self.dropout)(y, deterministic=not train)
    y = conv(self.width, (3, 3))(y)
    y = self.norm(scale_init=nn.initializers.zeros)(y)
    if self.project:
      x = self.norm()(conv(self.width, (1, 1), s)(x))
    return nn.relu(y + x)


class ResNet20(nn.Module):
  """The FedLAMA reference ResNet20 and WRN-28-10 "reference".

  Stem conv3x3 16 -> BN -> ReLU; three stages of `blocks` post-activation
  blocks with widths `widths`, a BN'd 1x1 projection in the first block of
  every stage (stage 1 included), stride 2 at the start of stages 2 and 3;
  GAP -> Dense. Counts: ResNet20 272,762 (10 classes), WRN-28-10 36,539,124
  (100 classes).
  """
  num_classes: int = 10
  widths: tuple[int, ...] = (16, 32, 64)
  blocks: int = 3
  dropout: float = 0.0
  bn_momentum: float = 0.99
  bn_epsilon: float = 1e-3
  conv: ModuleDef = param_layers.Conv
  dense: ModuleDef = param_layers.Dense
  max_pool: Callable[..., Array] = param_layers.max_pool

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    norm = functools.partial(nn.BatchNorm, use_running_average=not train,
                             momentum=self.bn_momentum,
                             epsilon=self.bn_epsilon)
    x = self.conv(16, (3, 3), use_bias=False)(x)
    x = nn.relu(norm()(x))
    for stage, width in enumerate(self.widths):
      for block in range(self.blocks):
        x = _PostActBlock(width, 2 if stage > 0 and block == 0 else 1,
                          project=block == 0, norm=norm,
                          conv=self.conv, dropout=self.dropout)(x, train)
    return self.dense(self.num_classes)(_gap(x))


class _PreActBlock(nn.Module):
  """Zagoruyko-Komodakis wide block: BN-ReLU-conv-BN-ReLU-dropout-conv."""
  width: int
  strides: int
  norm: Any
  conv: ModuleDef
  dropout: float

  @nn.compact
  def __call__(self, x: Array, train: bool) -> Array:
    conv = functools.partial(self.conv, use_bias=False, padding="SAME",
                             init_style="keras")
    s = (self.strides, self.strides)
    o = nn.relu(self.norm()(x))
    y = conv(self.width, (3, 3), s)(o)
    y = nn.relu(self.norm()(y))
    if self.dropout:
      y = nn.Dropout(self.dropout)(y, deterministic=not train)
    y = conv(self.width, (3, 3))(y)
    if x.shape[-1] != self.width or self.strides != 1:
      x = conv(self.width, (1, 1), s)(o)
    return y + x


class WideResNetPreAct(nn.Module):
  """WRN-28-10 as published (`variant="preact"`): 36,536,884 (100)."""
  num_classes: int = 100
  depth: int = 28
  width_factor: int = 10
  dropout: float = 0.3
  bn_momentum: float = 0.99
  bn_epsilon: float = 1e-5
  conv: ModuleDef = param_layers.Conv
  dense: ModuleDef = param_layers.Dense
  max_pool: Callable[..., Array] = param_layers.max_pool

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    norm = functools.partial(nn.BatchNorm, use_running_average=not train,
                             momentum=self.bn_momentum,
                             epsilon=self.bn_epsilon)
    blocks = (self.depth - 4) // 6
    x = self.conv(16, (3, 3), use_bias=False)(x)
    for stage, width in enumerate((16, 32, 64)):
      for block in range(blocks):
        x = _PreActBlock(width * self.width_factor,
                         2 if stage > 0 and block == 0 else 1, norm=norm,
                         conv=self.conv, dropout=self.dropout)(x, train)
    x = nn.relu(norm()(x))
    return self.dense(self.num_classes)(_gap(x))


class _BasicBlock(nn.Module):
  """He et al. / torchvision BasicBlock with a configurable norm layer.

  conv3x3(s) - norm - ReLU - conv3x3 - norm, shortcut identity or
  conv1x1(s) + norm when the shape changes, then ReLU. Padding is the
  symmetric PyTorch padding=1.
  """
  width: int
  strides: int
  norm: Any
  init_style: str
  conv: ModuleDef

  @nn.compact
  def __call__(self, x: Array) -> Array:
    conv = functools.partial(self.conv, use_bias=False,
                             init_style=self.init_style)
    s = (self.strides, self.strides)
    y = conv(self.width, (3, 3), s, padding=((1, 1), (1, 1)))(x)
    y = nn.relu(self.norm()(y))
    y = self.norm()(conv(self.width, (3, 3), padding=((1, 1), (1, 1)))(y))
    if x.shape[-1] != self.width or self.strides != 1:
      x = self.norm()(conv(self.width, (1, 1), s, padding="VALID")(x))
    return nn.relu(y + x)


class ResNet9(nn.Module):
  """Fed-LAMB's ResNet-9 (Karimi et al. 2022), default variant "he_basic_1111".

  Stem conv3x3 64 -> BN -> ReLU; one BasicBlock per stage, widths 64/128/256/
  512, strides 1/2/2/2; global average pooling (= avg_pool 4 on 32x32 inputs);
  Dense with bias. 4,903,242 parameters for 10 classes. BatchNorm momentum 0.9
  (PyTorch's 0.1), epsilon 1e-5.
  """
  num_classes: int = 10
  init_style: str = "torch"
  bn_momentum: float = 0.9
  bn_epsilon: float = 1e-5
  conv: ModuleDef = param_layers.Conv
  dense: ModuleDef = param_layers.Dense
  max_pool: Callable[..., Array] = param_layers.max_pool

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    norm = functools.partial(nn.BatchNorm, use_running_average=not train,
                             momentum=self.bn_momentum,
                             epsilon=self.bn_epsilon)
    x = self.conv(64, (3, 3), padding=((1, 1), (1, 1)), use_bias=False,
                    init_style=self.init_style)(x)
    x = nn.relu(norm()(x))
    for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
      x = _BasicBlock(width, stride, norm=norm, init_style=self.init_style,
                      conv=self.conv)(x)
    return self.dense(self.num_classes, init_style=self.init_style)(_gap(x))


class ResNet9DawnBench(nn.Module):
  """ResNet-9 variant "dawnbench" (the Fed-LAMB code's other ResNet-9): 6,573,120 parameters.

  prep conv 64; layer1 conv 128 + pool + residual of two convs 128; layer2
  conv 256 + pool; layer3 conv 512 + pool + residual of two convs 512; global
  max-pool; Dense without bias; x 0.125. Every conv is 3x3 pad 1 without bias,
  followed by BN and ReLU (ReLU applied after the pool where there is one; the
  two commute).
  """
  num_classes: int = 10
  init_style: str = "torch"
  bn_momentum: float = 0.9
  bn_epsilon: float = 1e-5
  conv: ModuleDef = param_layers.Conv
  dense: ModuleDef = param_layers.Dense
  max_pool: Callable[..., Array] = param_layers.max_pool

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    norm = functools.partial(nn.BatchNorm, use_running_average=not train,
                             momentum=self.bn_momentum,
                             epsilon=self.bn_epsilon)

    def cbr(y, width, pool=False):
      y = self.conv(width, (3, 3), padding=((1, 1), (1, 1)), use_bias=False,
                      init_style=self.init_style)(y)
      y = norm()(y)
      if pool:
        y = self.max_pool(y, (2, 2))
      return nn.relu(y)

    x = cbr(x, 64)
    x = cbr(x, 128, pool=True)
    x = x + cbr(cbr(x, 128), 128)
    x = cbr(x, 256, pool=True)
    x = cbr(x, 512, pool=True)
    x = x + cbr(cbr(x, 512), 512)
    x = jnp.max(x, axis=(1, 2))
    x = self.dense(self.num_classes, use_bias=False,
                     init_style=self.init_style)(x)
    return x * 0.125


class ResNet18GN(nn.Module):
  """FedSpeed's ResNet-18-GN (Sun et al. 2023): torchvision ResNet-18.

  ImageNet stem kept (conv 7x7/2 pad 3, norm, ReLU, max-pool 3x3/2 pad 1, even
  on 32x32 inputs), BasicBlocks [2, 2, 2, 2] of widths 64/128/256/512, every
  BatchNorm replaced by GroupNorm(2 groups, eps 1e-5), GAP, Dense(classes).
  Conv kernels use torchvision's kaiming-normal (fan_out) init; the head uses
  PyTorch's Linear default. 11,181,642 parameters for 10 classes, 11,227,812
  for 100 (no running statistics).
  """
  num_classes: int = 10
  num_groups: int = 2
  conv: ModuleDef = param_layers.Conv
  dense: ModuleDef = param_layers.Dense
  max_pool: Callable[..., Array] = param_layers.max_pool

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    del train  # GroupNorm has no train/eval difference.
    norm = functools.partial(nn.GroupNorm, num_groups=self.num_groups,
                             epsilon=1e-5)
    x = self.conv(64, (7, 7), (2, 2), padding=((3, 3), (3, 3)),
                    use_bias=False, init_style="torchvision")(x)
    x = self.max_pool(norm()(x), (3, 3), (2, 2), padding=((1, 1), (1, 1)))
    x = nn.relu(x)  # relu(max_pool(.)) == max_pool(relu(.)); 4x fewer ReLUs.
    for stage, width in enumerate((64, 128, 256, 512)):
      for block in range(2):
        x = _BasicBlock(width, 2 if stage > 0 and block == 0 else 1,
                        norm=norm, init_style="torchvision", conv=self.conv)(x)
    return self.dense(self.num_classes, init_style="torch")(_gap(x))
