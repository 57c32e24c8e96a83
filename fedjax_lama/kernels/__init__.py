"""The models' kernel sets: how convolution, dense products and max pooling are computed.

A kernel set computes what `flax.linen`'s layers compute, from the same parameters; the model
zoo takes one as injected operations (`models.get(..., kernels=...)`), and the config chooses
it as config.engine.kernels (KERNELS, "auto" by default). Two sets:

* "lax": `lax.conv_general_dilated`, `jnp.dot`, `reduce_window`; the set on TPU.
* "patches": the set on CPU and GPU (`conv.patches_conv` and its per-layer picks,
  `dot.patches_dense`, `pool.patches_max_pool`). XLA:CPU runs convolutions inside a rolled
  scan (local training) 15-20x slower than in straight-line code, and `vmap` over per-client
  kernels turns a convolution into a grouped one that is slow on CPU and GPU alike; the
  patches set is slices and matmuls. Its CPU-only picks (Winograd layers, im2col's written-out
  stride-1 gradient, the small dense kernels' gradient) follow `platform`.

`resolve` is the one place that routes "auto" by platform. Kernel sets kept only to be
measured live in benchmarks/conv/, which builds its own `Kernels`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax

from fedjax_lama.kernels import conv
from fedjax_lama.kernels import dot
from fedjax_lama.kernels import pool

# The accepted values of config.engine.kernels and of the models' `kernels` option.
KERNELS = ("auto", "lax", "patches")


@dataclasses.dataclass(frozen=True)
class Kernels:
  """The operations a model's layers compute with.

  conv(x, kernel, strides, padding, bias) for NHWC x HWIO; dense(x, kernel) over x's last
  axis; max_pool(x, window, strides, padding) for NHWC.
  """
  name: str
  conv: Callable
  dense: Callable
  max_pool: Callable


def resolve(name: str, platform: str | None = None) -> str:
  """"lax" or "patches" for `name` ("auto", "lax" or "patches") on `platform` (default
  `jax.default_backend()`): "auto" is "lax" on TPU (not measured there), "patches" elsewhere."""
  if name not in KERNELS:
    raise ValueError(f"kernels={name!r} is not accepted; use one of "
                     f"{', '.join(repr(k) for k in KERNELS)}")
  if name == "auto":
    return "lax" if (platform or jax.default_backend()) == "tpu" else "patches"
  return name


@functools.lru_cache(maxsize=None)
def get(name: str, platform: str | None = None) -> Kernels:
  """The kernel set `resolve(name, platform)`; one object per (name, platform), so models
  built twice compare equal. With `platform` None the patches set's CPU-only picks follow
  JAX's default backend when traced."""
  resolved = resolve(name, platform)
  if resolved == "lax":
    return Kernels("lax", conv.lax_conv, dot.lax_dense, pool.lax_max_pool)
  return Kernels("patches", functools.partial(conv.patches_conv, platform=platform),
                 functools.partial(dot.patches_dense, platform=platform),
                 pool.patches_max_pool)
