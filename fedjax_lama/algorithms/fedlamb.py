"""Fed-LAMB and Fed-AMS.

B. Karimi, P. Li, X. Li, "Fed-LAMB: Layer-wise and Dimension-wise Locally Adaptive
Federated Learning", Baidu Research. Algorithm 1, with the choices the paper leaves open
as options (the Hparams below).

Round r: the server sends x = theta_bar_{r-1} and v_hat_{r-1} (downloads). Each client
starts at theta^0 = x, m^0 = 0, v^0 = w^0 = v_hat_{r-1}, counter 0 (`local_init`), and
steps t = 1..T_i:
  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  w = max(w, v~)     (v~ = v, or v/(1-b2^t))
  p = m_hat / (sqrt(w + eps_root) + eps)                               (m_hat: m/(1-b1^t))
  fedlamb, per tensor l:  u = p_l + lam theta_l,
    theta_l -= alpha_r phi(||theta_l||) u / ||u||   (zero_norm when phi(||theta_l||) = 0 or ||u|| = 0)
  fedams:                 theta -= alpha_r p                               (no layer ratio)
It uploads the displacement and its RAW v (`finish`); the server averages both with the
round's weights and keeps v_hat_r = max(v_hat_{r-1}, mean v) (`server_update`).
Traffic: 2d each way per participant, twice FedAvg.

optax pieces: the moments are optax.scale_by_amsgrad, warm-started by replacing nu and
nu_max of a fresh state with v_hat (count 0, mu 0); lam is optax.add_decayed_weights after it.
The layer step is this module's `scale_by_layer_trust_ratio`: with phi = identity and
"unit_ratio" it equals optax.scale_by_trust_ratio (tested), and it also gives the clipped phi
and "skip", with no NaN or Inf in any branch of the select (optax divides before it selects).
Where optax.lamb differs from Fed-LAMB's step: (1) Adam moments, no max (equal only on a
first step from zero with v correction on); (2) bias corrections always on; (3) eps 1e-6
by default (1e-8 here); (4) phi identity only, min_norm clips both norms from below, no
upper clip; (5) zero norms give ratio 1 (our "unit_ratio"); (6) state persists, no per-round
reset and no server v_hat; (7) a weight-decay mask (ours: lam_mask "all" by default).

Paper vs the authors' code (BelhalK/baiduresearch, f)LarsFL): both form the ratio as
||theta_l|| / ||r_l + lam theta_l||, phi the identity. The code divides by the server's v_hat
frozen for the round (its own v in round 1), corrects neither moment and carries m, v per
client; the defaults follow the paper's local AMSGrad, the code is reachable with
v_hat_source="server", m_bias_correction=False, m_round_init="carry", v_round_init="carry".
"""
import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_lama.algorithms.common import (Common, Spec, require, require_nonnegative,
                                           require_one_of, server_rate)
from fedjax_lama.engine.algorithm import (Algorithm, LocalOptimizer, ServerRule, ServerState,
                                          displacement, server_opt)

NO_SERVER_MAX = -1.0  # v_hat_source="server": the server's v_hat before its first aggregation


@dataclasses.dataclass(frozen=True)
class AmsHparams:
  """config.fedams (and the shared part of config.fedlamb): the spec's ams_* fields."""
  beta1: float = 0.9
  beta2: float = 0.999
  eps: float = 1e-8
  eps_root: float = 0.0
  v_init: float = 1e-8
  m_bias_correction: bool = True
  v_bias_correction: bool = False
  v_hat_source: str = "local_max"  # | "server" (the authors' code)
  m_round_init: str = "zeros"      # | "carry" (per-client rows, the authors' code)
  v_round_init: str = "server"     # | "carry"

  def __post_init__(self):
    for field in ("beta1", "beta2"):
      value = getattr(self, field)
      require(isinstance(value, (int, float)) and 0.0 <= value < 1.0, field, value,
              "a number in [0, 1)")
    for field in ("eps", "eps_root", "v_init"):
      require_nonnegative(field, getattr(self, field))
    require(self.eps > 0 or self.eps_root > 0, "eps", self.eps,
            "a number > 0 unless eps_root > 0 (the floor of p's denominator)")
    for field in ("m_bias_correction", "v_bias_correction"):
      require(isinstance(getattr(self, field), bool), field, getattr(self, field), "True, False")
    require_one_of("v_hat_source", self.v_hat_source, ("local_max", "server"))
    require_one_of("m_round_init", self.m_round_init, ("zeros", "carry"))
    require_one_of("v_round_init", self.v_round_init, ("server", "carry"))


@dataclasses.dataclass(frozen=True)
class LambHparams(AmsHparams):
  """config.fedlamb: the ams_* fields and the spec's fedlamb_* fields (prefixes dropped)."""
  phi: str = "identity"            # | "clip": min(max(x, phi_min), phi_max)
  phi_min: float = 0.0
  phi_max: float = 10.0
  zero_norm: str = "unit_ratio"    # | "skip": leave the layer unmoved
  lam: float = 0.0                 # lambda inside the normalised direction
  lam_mask: str = "all"            # | "exclude_1d" (biases, norm scales)
  layer_unit: str = "tensor"       # one params leaf is one layer (only value)

  def __post_init__(self):
    super().__post_init__()
    require_one_of("phi", self.phi, ("identity", "clip"))
    require_nonnegative("phi_min", self.phi_min)
    require_nonnegative("phi_max", self.phi_max)
    require(self.phi_max > 0 and self.phi_max >= self.phi_min, "phi_max", self.phi_max,
            f"a number > 0 and >= phi_min={self.phi_min!r}")
    require_one_of("zero_norm", self.zero_norm, ("unit_ratio", "skip"))
    require(isinstance(self.lam, (int, float)) and not isinstance(self.lam, bool)
            and 0.0 <= self.lam < 1.0, "lam", self.lam, "a number in [0, 1)")
    require_one_of("lam_mask", self.lam_mask, ("all", "exclude_1d"))
    require_one_of("layer_unit", self.layer_unit, ("tensor",))


def _norm(x):
  return jnp.sqrt(jnp.sum(jnp.square(x)))  # over the flattened tensor, any rank


def scale_by_layer_trust_ratio(phi, zero_norm: str = "unit_ratio") -> optax.GradientTransformation:
  """u_l -> s_l u_l per params leaf, s_l = phi(||theta_l||) / ||u_l|| where both are > 0, else
  1 ("unit_ratio") or 0 ("skip"); the divisor is made 1 first, so no branch is NaN or Inf."""
  fallback = 1.0 if zero_norm == "unit_ratio" else 0.0

  def update(updates, state, params=None):
    if params is None:
      raise ValueError("scale_by_layer_trust_ratio needs the params")

    def scale(u, theta):
      target, length = phi(_norm(theta)), _norm(u)
      regular = (target > 0) & (length > 0)
      return u * jnp.where(regular, target / jnp.where(regular, length, 1.0), fallback)

    return jax.tree.map(scale, updates, params), state

  return optax.GradientTransformation(optax.init_empty_state, update)


class ServerVHatState(NamedTuple):
  moments: optax.ScaleByAmsgradState
  v_hat: object  # the server's v_hat_{r-1}, frozen for the round (NO_SERVER_MAX before any)


def scale_by_server_v_hat(hp: AmsHparams, **amsgrad) -> optax.GradientTransformation:
  """v_hat_source="server": optax's AMSGrad moments, but p = m_hat / (sqrt(v_hat_{r-1} + eps_root) + eps)
  with the downloaded v_hat; before the server's first maximum the client's own v~ stands in."""
  inner = optax.scale_by_amsgrad(**amsgrad)

  def init(params):
    return ServerVHatState(inner.init(params), optax.tree.zeros_like(params))

  def update(grads, state, params=None):
    _, moments = inner.update(grads, state.moments, params)
    t = moments.count
    m_hat = (optax.tree.bias_correction(moments.mu, hp.beta1, t) if hp.m_bias_correction
             else moments.mu)
    v_own = (optax.tree.bias_correction(moments.nu, hp.beta2, t) if hp.v_bias_correction
             else moments.nu)
    denom = jax.tree.map(lambda s, own: jnp.where(s < 0, own, s), state.v_hat, v_own)
    p = jax.tree.map(lambda m, v: m / (jnp.sqrt(v + hp.eps_root) + hp.eps), m_hat, denom)
    return p, state._replace(moments=moments)

  return optax.GradientTransformation(init, update)


def build_local_tx(hp: AmsHparams, common: Common) -> optax.GradientTransformation:
  """The local direction (the engine steps by -alpha_r times it)."""
  amsgrad = dict(b1=hp.beta1, b2=hp.beta2, eps=hp.eps, eps_root=hp.eps_root,
                 bias_correction_mu=hp.m_bias_correction, bias_correction_nu=hp.v_bias_correction)
  parts = []
  if common.weight_decay:  # the shared additive L2: part of the gradient, so it enters m and v
    parts.append(optax.add_decayed_weights(common.weight_decay))
  parts.append(scale_by_server_v_hat(hp, **amsgrad) if hp.v_hat_source == "server"
               else optax.scale_by_amsgrad(**amsgrad))
  if isinstance(hp, LambHparams):
    if hp.lam:  # lambda enters only u = p + lam theta, never m or v
      mask = None if hp.lam_mask == "all" else (
          lambda params: jax.tree.map(lambda p: p.ndim > 1, params))
      parts.append(optax.add_decayed_weights(hp.lam, mask=mask))
    phi = (lambda a: a) if hp.phi == "identity" else (
        lambda a: jnp.clip(a, hp.phi_min, hp.phi_max))
    parts.append(scale_by_layer_trust_ratio(phi, hp.zero_norm))
  return optax.chain(*parts)


def build(hp: AmsHparams, common: Common) -> Algorithm:
  name = "fedlamb" if isinstance(hp, LambHparams) else "fedams"
  require(common.local_momentum == 0, "local_momentum", common.local_momentum,
          f"0 ({name}'s first moment is its momentum: config.{name}.beta1)")
  local_tx = build_local_tx(hp, common)
  # lr 1: theta_bar_r = mean of the models exactly.
  server = server_opt(optax.sgd(server_rate(common)))
  server_mode = hp.v_hat_source == "server"
  carry_m, carry_v = hp.m_round_init == "carry", hp.v_round_init == "carry"

  def known(v_hat):  # the sentinel of "server" mode read as v_init (the paper's v_hat_0)
    return jax.tree.map(lambda v: jnp.where(v < 0, hp.v_init, v), v_hat) if server_mode else v_hat

  def local_init(ctx):
    v_hat = ctx.shared["v_hat"]
    fields = {"nu": ctx.row["v"] if carry_v else known(v_hat), "nu_max": known(v_hat)}
    if carry_m:
      fields["mu"] = ctx.row["m"]
    if server_mode:
      fields["v_hat"] = v_hat
    # A fresh optax state (count 0, mu 0) with the warm-started second moments.
    return optax.tree_utils.tree_set(local_tx.init(ctx.shared["params"]), **fields)

  def row_init(params):
    row = {"m": optax.tree.zeros_like(params)} if carry_m else {}
    if carry_v:
      row["v"] = jax.tree.map(lambda p: jnp.full_like(p, hp.v_init), params)
    return row

  def finish(final, ctx, info):
    del info
    moments = optax.tree_utils.tree_get(final.opt_state, "ScaleByAmsgradState")
    row = dict(ctx.row)
    if carry_m:
      row["m"] = moments.mu
    if carry_v:
      row["v"] = moments.nu
    return {"delta": displacement(final, ctx), "v": moments.nu}, row  # the raw v (Algorithm 1)

  def server_init(params, model_state):
    start = NO_SERVER_MAX if server_mode else hp.v_init
    return server.init(params, model_state)._replace(
        extra={"v_hat": jax.tree.map(lambda p: jnp.full_like(p, start), params)})

  def server_update(state: ServerState, agg) -> ServerState:
    state = server.update(state, agg)  # theta_bar_r: x <- x + server_lr mean(delta)
    v_hat = jax.tree.map(jnp.maximum, known(state.extra["v_hat"]), agg["v"])
    return state._replace(extra={**state.extra, "v_hat": v_hat})

  return Algorithm(
      # AMSGrad's step is adaptive: no linear rule, so no effective step.
      local=LocalOptimizer(local_tx, rule=None, init=local_init),
      row_init=row_init if carry_m or carry_v else None, finish=finish,
      server=ServerRule(server_init, server_update, downloads=("params", "v_hat")))


SPECS = (
    Spec("fedlamb", LambHparams, build,
         "local AMSGrad + layer-wise trust ratio, server max of v (2d each way)"),
    Spec("fedams", AmsHparams, build, "local AMSGrad, server max of v (2d each way)"),
)
