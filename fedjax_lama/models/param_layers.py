"""The two parameter layers the zoo builds: `Conv` and `Dense`, with an init style.

How they compute is injected (`op`, from a `fedjax_lama.kernels.Kernels`); every op creates
the same parameters, so a checkpoint or a FedLAMA kernel mask does not depend on it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import flax.linen as nn
import jax

from fedjax_lama.kernels import conv as conv_kernels
from fedjax_lama.kernels import dot as dense_kernels
from fedjax_lama.kernels import pool as pool_kernels
from fedjax_lama.models import init
from fedjax_lama.models import lora as lora_lib

Array = jax.Array


class Conv(nn.Module):
  """2-D convolution, NHWC input, `kernel` HWIO and `bias` leaves.

  padding: "SAME", "VALID" or explicit ((lo, hi), (lo, hi)); "SAME" with stride 2 pads
  (0, 1) like TensorFlow. op(x, kernel, strides, padding, bias) computes it.
  """
  features: int
  kernel_size: tuple[int, int] = (3, 3)
  strides: tuple[int, int] = (1, 1)
  padding: Any = "SAME"
  use_bias: bool = True
  init_style: str = "keras"
  op: Callable = conv_kernels.lax_conv

  @nn.compact
  def __call__(self, x: Array) -> Array:
    kh, kw = self.kernel_size
    kernel_init, bias_init = init.initializers(self.init_style, kh * kw * x.shape[-1])
    kernel = self.param("kernel", kernel_init, (kh, kw, x.shape[-1], self.features))
    bias = self.param("bias", bias_init, (self.features,)) if self.use_bias else None
    return self.op(x, kernel, tuple(self.strides), self.padding, bias)


class Dense(nn.Module):
  """Dense layer with `kernel` (in, out) and `bias` leaves; op(x, kernel) computes x @ kernel.

  With `lora` (`lora.LoRA`) and this module's path among its targets, it also has the
  adapter leaves `lora_a` (in, r) and `lora_b` (r, out) and adds (alpha / r) (x A) B after
  the bias (fedjax_lama/models/lora.py).
  """
  features: int
  use_bias: bool = True
  init_style: str = "keras"
  op: Callable = dense_kernels.lax_dense
  lora: Optional[lora_lib.LoRA] = None

  @nn.compact
  def __call__(self, x: Array) -> Array:
    kernel_init, bias_init = init.initializers(self.init_style, x.shape[-1])
    kernel = self.param("kernel", kernel_init, (x.shape[-1], self.features))
    y = self.op(x, kernel)
    if self.use_bias:
      y = y + self.param("bias", bias_init, (self.features,))
    if self.lora is not None and self.lora.adapts(self.scope.path):
      y = y + lora_lib.adapter_term(self, self.lora, x, self.features, kernel.dtype)
    return y


# The pool a model computes with when none is injected: reduce_window.
max_pool = pool_kernels.lax_max_pool
