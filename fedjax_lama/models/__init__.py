"""Model zoo: flax.linen modules by name (algorithms.md section 8).

Usage:
  model = models.get("resnet20", num_classes=10, conv_impl="auto")
  variables = model.init(jax.random.PRNGKey(0), x)        # x: NHWC float32
  logits, updates = model.apply(variables, x, train=True,
                                mutable=["batch_stats"],
                                rngs={"dropout": key})
"""

from fedjax_lama.models.layers import CONV_IMPLS
from fedjax_lama.models.layers import INIT_STYLES
from fedjax_lama.models.layers import resolve_conv_impl
from fedjax_lama.models.registry import get
from fedjax_lama.models.registry import names
from fedjax_lama.models.registry import options

__all__ = ["CONV_IMPLS", "INIT_STYLES", "get", "names", "options",
           "resolve_conv_impl"]
