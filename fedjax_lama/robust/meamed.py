"""MeaMed, the mean around the median: per coordinate, the mean of the n - f values nearest the
coordinate-wise median of the n real clients' uploads.

Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD", arXiv 1802.10116 (2018),
Definition 5 (mean around median), dimensional Byzantine resilience for f <= ceil(n/2) - 1,
that is n > 2f. Unweighted, as in the paper. Padded slots never enter: the median sorts them
last, and the mean takes the nearest values among the real clients only (ties: the lower
row). f is static; n may change every round without recompiling.
"""
import jax
import jax.numpy as jnp

from fedjax_lama.engine import reduce, stages


def meamed(values, mask, f: int):
  """(the aggregate, {"valid": n > 2f}) of a stack whose leaves are [C, ...]."""
  real = mask > 0
  n = jnp.sum(real.astype(jnp.int32))
  median = reduce.coordinate_median(values, mask)
  keep = jnp.maximum(n - f, 1)
  aggregate = jax.tree.map(lambda x, m: reduce.nearest_mean(x, real, m, keep), values, median)
  return aggregate, {"valid": n > 2 * f}


def stage(f: int) -> stages.Stage:
  """MeaMed as the run's reducer of the model upload: it reads the cohort's stack."""
  def server(stack: stages.Stack, state, key):
    del key  # deterministic
    aggregate, info = meamed(stack.values, stack.mask, f)
    return aggregate, state, info

  return stages.make("meamed", server=server, consumes=stages.STACK, reduces=True)
