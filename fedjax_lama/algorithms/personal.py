"""What the personalization methods that train a second model beside the global one share.

Ditto, APFL and pFedMe keep a client's own model (and APFL its mixing weight) in the
client's row, and train it during the client's local steps. The engine's local state has one
model, the iterate that goes up (the global model's local copy), so the personal quantities
travel in the local optimizer's state: `holding_optimizer` puts a pass-through transform in
front of the shared local optimizer whose state holds them, the grad oracle reads and writes
that state at each step (it gets the step's value_and_grad, so it can evaluate the personal
model on the same batch), and the algorithm's `finish` writes the state back to the row.

A padded step leaves the whole local carry as it was (engine/local.py), the held state
included, so clients with fewer steps train their personal model for their own steps only.
"""
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_lama.engine.algorithm import ClientContext, LocalOptimizer

PyTree = Any


def _pass_through() -> optax.GradientTransformation:
  """Leaves the updates as they are; its state is written by the grad oracle, not here.
  (`LocalOptimizer.init` builds the state, so this init is never the one used.)"""
  return optax.GradientTransformation(lambda params: (),
                                      lambda updates, state, params=None: (updates, state))


def holding_optimizer(inner: LocalOptimizer,
                      held_init: Callable[[ClientContext], PyTree]) -> LocalOptimizer:
  """`inner` (the run's local SGD) with a held state in front: opt_state = (held, inner's).

  The pass-through changes no direction, so the linear rule (the effective step of
  ClientInfo) is `inner`'s.
  """
  inner_tx = inner.tx

  def init(ctx: ClientContext):
    return held_init(ctx), inner_tx.init(ctx.shared["params"])

  return LocalOptimizer(optax.chain(_pass_through(), inner_tx), inner.rule, init=init)


def held(opt_state: PyTree) -> PyTree:
  """The held state of a `holding_optimizer`'s opt_state."""
  return opt_state[0]


def with_held(opt_state: PyTree, value: PyTree) -> PyTree:
  """opt_state with its held state replaced by `value`."""
  return (value,) + tuple(opt_state[1:])


def own_if_seen(row: PyTree, own: PyTree, fallback: PyTree) -> PyTree:
  """`own` where the client has trained (row["seen"] > 0), else `fallback`, leaf by leaf: a
  client never sampled has no personal model yet, and is served (or starts from) the global
  one."""
  seen = row["seen"] > 0
  return jax.tree.map(lambda mine, other: jnp.where(seen, mine, other), own, fallback)


def marked_seen(row: PyTree) -> jax.Array:
  """The "seen" flag of a row written by a client that has trained."""
  return jnp.ones_like(row["seen"])


def unseen() -> jax.Array:
  """The "seen" flag of an initial row: the client has not trained yet."""
  return jnp.zeros((), jnp.float32)


def sgd_step(params: PyTree, grads: PyTree, lr: float) -> PyTree:
  """params - lr * grads, leaf by leaf, in each leaf's dtype."""
  return jax.tree.map(lambda p, g: (p - lr * g).astype(p.dtype), params, grads)
