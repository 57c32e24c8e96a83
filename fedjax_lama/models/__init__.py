"""Model zoo: flax.linen modules by name, with the kernel set their layers compute with.

Usage:
  model = models.get("resnet20", num_classes=10, kernels="auto")
  variables = model.init(jax.random.PRNGKey(0), x)        # x: NHWC float32
  logits, updates = model.apply(variables, x, train=True,
                                mutable=["batch_stats"],
                                rngs={"dropout": key})
"""

from fedjax_lama.models.init import INIT_STYLES
from fedjax_lama.models.zoo import INPUT_KINDS
from fedjax_lama.models.zoo import get
from fedjax_lama.models.zoo import inputs
from fedjax_lama.models.zoo import names
from fedjax_lama.models.zoo import options

__all__ = ["INIT_STYLES", "INPUT_KINDS", "get", "inputs", "names", "options"]
