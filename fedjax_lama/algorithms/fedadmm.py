"""FedADMM.

H. Wang, S. Marella, J. Anderson, "FedADMM: A Federated Primal-Dual Algorithm Allowing
Partial Participation", IEEE CDC 2022 (arXiv 2203.15104). Not Gong, Li and Freris's
algorithm of the same name.

Client i keeps a dual z_i (0 at start) and an augmented model x_hat_i (x^0 at start).
It minimises the augmented Lagrangian f_i(y) + <z_i, y - x> + rho/2 ||y - x||^2: steps
along g + z_i + rho (y - x); then z_i <- z_i + rho (y_K - x),
x_hat_i_new = y_K + z_i / rho, and uploads delta_i = x_hat_i_new - x_hat_i (d up).
The server keeps x_tilde = mean over ALL N clients of x_hat_j:
x_tilde <- x_tilde + (1/N) sum_i delta_i, and broadcasts it. Stale augmented models of
absent clients stay in the average by design. rho = 0 skips z / rho: FedAvg under full
participation with equal weights, and only then.
"""
import dataclasses

import jax
import optax

from fedjax_lama.algorithms.common import (Common, Spec, local_optimizer, require_nonnegative,
                                           server_sgd)
from fedjax_lama.engine.algorithm import SUM, Algorithm, ServerRule, ServerState, server_opt, upload


@dataclasses.dataclass(frozen=True)
class Hparams:
  rho: float = 0.1

  def __post_init__(self):
    require_nonnegative("rho", self.rho)


def build(hp: Hparams, common: Common) -> Algorithm:
  rho = hp.rho

  def correct(grads, params, ctx):
    return jax.tree.map(lambda g, z, p, x: g + z + rho * (p - x), grads, ctx.row["z"], params,
                        ctx.shared["params"])

  def finish(final, ctx, info):
    del info
    x = ctx.shared["params"]
    z = jax.tree.map(lambda z, y, xx: z + rho * (y - xx), ctx.row["z"], final.params, x)
    augmented = jax.tree.map(lambda y, zz: y + zz / rho, final.params, z) if rho else final.params
    delta = jax.tree.map(lambda new, old: new - old, augmented, ctx.row["x_hat"])
    return {"delta_x_hat": delta}, {"z": z, "x_hat": augmented}

  def server_update(server: ServerState, agg) -> ServerState:
    params = jax.tree.map(lambda x, s: x + s / agg.population, server.params,
                          agg["delta_x_hat"])
    return server._replace(params=params)

  return Algorithm(
      local=local_optimizer(common, correction=correct), finish=finish,
      row_init=lambda params: {"z": optax.tree.zeros_like(params), "x_hat": params},
      aggregate={"delta_x_hat": upload("delta_x_hat", SUM)},
      # The server's own step; its state is FedAvg's (no optimizer moments).
      server=ServerRule(server_opt(server_sgd(common)).init, server_update))


SPECS = (Spec("fedadmm", Hparams, build, "primal-dual, per-client z_i and x_hat_i"),)
