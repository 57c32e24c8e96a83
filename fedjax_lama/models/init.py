"""Initialisers by style: the defaults of the frameworks the seed papers' code used."""

from __future__ import annotations

import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

Initializer = Callable[..., jax.Array]
INIT_STYLES = ("keras", "torch", "torchvision", "flax")


def initializers(style: str, fan_in: int) -> tuple[Initializer, Initializer]:
  """(kernel_init, bias_init) for an init style.

  "keras": Glorot-uniform kernels, zero biases (Keras/TF1 defaults, which the FedLAMA, LEAF
  and FedAT code use). "torch": PyTorch's Linear/Conv2d defaults, kernels and biases
  ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (the Fed-LAMB and FedSpeed code). "torchvision":
  kaiming-normal (fan_out, ReLU gain) kernels, as torchvision's ResNet sets for its
  convolutions, zero biases. "flax": LeCun-normal kernels, zero biases.
  """
  if style == "keras":
    return nn.initializers.glorot_uniform(), nn.initializers.zeros
  if style == "torch":
    bound = 1.0 / math.sqrt(fan_in)
    kernel = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")

    def bias(key, shape, dtype=jnp.float32):
      return jax.random.uniform(key, shape, dtype, -bound, bound)

    return kernel, bias
  if style == "torchvision":
    return (nn.initializers.variance_scaling(2.0, "fan_out", "normal"),
            nn.initializers.zeros)
  if style == "flax":
    return nn.initializers.lecun_normal(), nn.initializers.zeros
  raise ValueError(
      f"init_style={style!r} is not accepted; use one of "
      f"{', '.join(INIT_STYLES)}")
