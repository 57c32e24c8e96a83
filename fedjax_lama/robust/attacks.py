"""Byzantine attacks on a cohort's uploads and on a client's data, as pure functions; the
upload attacks also as a stage (`upload_attack`), and every attack registered by its
config name in ATTACKS.

Upload attacks take one client's upload (sign flipping, Gaussian noise, model replacement) or
the honest uploads of the same round (the omniscient attacks: "a little is enough",
inner-product manipulation), and return what the malicious clients send; `substitute` puts it
into the malicious rows of the cohort's stack ([C, ...] leaves). Data attacks (label flipping,
the pixel-pattern backdoor) rewrite a malicious client's examples before local training.

Everything random is a pure function of an explicit key, so a run's attack is reproducible.
Which clients are malicious is fixed for the whole run by `malicious_clients(seed, ...)`.
"""
import math
import statistics
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lama import rng
from fedjax_lama.engine import reduce as reduce_lib
from fedjax_lama.engine import stages
from fedjax_lama.errors import require

PyTree = Any

# Stream of the host-side draw of the malicious set (apart from fedjax_lama.rng's streams).
STREAM_MALICIOUS = 101


def _rows(mask: jax.Array, x: jax.Array) -> jax.Array:
  return jnp.asarray(mask).reshape((-1,) + (1,) * (x.ndim - 1))


# ---------------------------------------------------------------------------------------------
# Who attacks.

def malicious_clients(seed: int, num_clients: int, *, fraction: Optional[float] = None,
                      count: Optional[int] = None) -> np.ndarray:
  """[num_clients] bool: the run's malicious clients, the same in every round.

  Exactly one of `fraction` (floor(fraction * num_clients) clients) or `count`. Drawn without
  replacement from (seed, STREAM_MALICIOUS), so the set depends on nothing but the seed and
  the federation's size.
  """
  require(isinstance(num_clients, int) and num_clients >= 1, "num_clients", num_clients,
          "an int >= 1")
  require((fraction is None) != (count is None), "fraction/count", (fraction, count),
          "exactly one of fraction or count")
  if fraction is not None:
    require(isinstance(fraction, (int, float)) and 0 <= fraction <= 1, "fraction", fraction,
            "a number in [0, 1]")
    count = math.floor(fraction * num_clients)
  require(isinstance(count, int) and 0 <= count <= num_clients, "count", count,
          f"an int in [0, {num_clients}]")
  chosen = rng.numpy_rng(seed, STREAM_MALICIOUS).choice(num_clients, size=count, replace=False)
  malicious = np.zeros(num_clients, bool)
  malicious[chosen] = True
  return malicious


def substitute(stack: PyTree, malicious: jax.Array, sent: PyTree) -> PyTree:
  """The cohort's stack with the malicious rows replaced by `sent`.

  `sent` is either one upload (no client axis: every malicious client sends it, as in the
  omniscient attacks) or a stack like `stack` (row i for client i).
  """
  def put(x, s):
    s = jnp.broadcast_to(s, x.shape).astype(x.dtype)
    return jnp.where(_rows(malicious, x), s, x)
  return jax.tree.map(put, stack, sent)


# ---------------------------------------------------------------------------------------------
# Attacks on one client's upload.

def sign_flip(update: PyTree, scale: float = 1.0) -> PyTree:
  """-scale * update: the client sends its honest update reversed and amplified.

  The sign-flipping attack of the Byzantine-robust literature (Li, Xu, Chen, Giannakis, Ling,
  "RSA", AAAI 2019; "bit flipping" in Karimireddy, He, Jaggi, ICML 2021). Not omniscient: it uses
  only the client's own update.
  """
  return jax.tree.map(lambda x: -scale * x, update)


def gaussian_noise(key: jax.Array, update_like: PyTree, std: float,
                   mean: float = 0.0) -> PyTree:
  """An upload of independent N(mean, std^2) coordinates, in place of the honest one.

  The Gaussian Byzantine worker of Blanchard, El Mhamdi, Guerraoui, Stainer's experiments
  (NeurIPS 2017). Deterministic given `key` (fold in the client id for distinct clients); one
  key per leaf, split from `key`. Not omniscient.
  """
  leaves, treedef = jax.tree.flatten(update_like)
  keys = jax.random.split(key, max(len(leaves), 1))
  noise = [mean + std * jax.random.normal(k, jnp.shape(x), jnp.result_type(x))
           for k, x in zip(keys, leaves)]
  return jax.tree.unflatten(treedef, noise)


# ---------------------------------------------------------------------------------------------
# Omniscient attacks: functions of the round's honest uploads.

def _honest_moments(stack: PyTree, honest: jax.Array) -> tuple[PyTree, PyTree]:
  """Per coordinate mean and sample standard deviation (n - 1) over the honest rows."""
  weights = jnp.asarray(honest, jnp.float32)
  mean = reduce_lib.weighted_mean(stack, weights)
  n = jnp.sum(weights)

  def std(x, m):
    gap = jnp.where(_rows(weights > 0, x), x - m, jnp.zeros((), x.dtype))
    return jnp.sqrt(jnp.sum(jnp.square(gap), axis=0) / jnp.maximum(n - 1, 1).astype(x.dtype))

  return mean, jax.tree.map(std, stack, mean)


def little_is_enough_z(n: int, f: int) -> float:
  """z_max of Baruch, Baruch, Goldberg, "A Little Is Enough: Circumventing Defenses For
  Distributed Learning", NeurIPS 2019: with s = floor(n/2 + 1) - f supporters
  needed, z_max = Phi^{-1}((n - s) / n), Phi the standard normal CDF.

  Preconditions: 0 < (n - s) / n < 1 (that is 0 < s < n).
  """
  require(isinstance(n, int) and n >= 2, "num_clients", n, "an int >= 2")
  s = math.floor(n / 2 + 1) - f
  require(isinstance(f, int) and 0 < s < n, "num_byzantine", f,
          f"an int with 0 < floor(n/2 + 1) - f < n (n = {n})")
  return statistics.NormalDist().inv_cdf((n - s) / n)


def little_is_enough(stack: PyTree, honest: jax.Array, z: float) -> PyTree:
  """mean - z * std per coordinate over the honest uploads ("a little is enough").

  Baruch, Baruch, Goldberg, NeurIPS 2019: every malicious client sends
  mu_j - z sigma_j. Omniscient: mu and sigma are those of this round's honest uploads (the
  paper lets the attackers estimate them; with all honest uploads known this is its strongest
  form). sigma is the sample standard deviation (n - 1), as their implementation's torch.std.
  z from `little_is_enough_z(n, f)`.
  """
  mean, std = _honest_moments(stack, honest)
  return jax.tree.map(lambda m, s: m - z * s, mean, std)


def inner_product_manipulation(stack: PyTree, honest: jax.Array, epsilon: float) -> PyTree:
  """-epsilon times the mean of the honest uploads.

  Xie, Koyejo, Gupta, "Fall of Empires: Breaking Byzantine-tolerant SGD by Inner Product
  Manipulation", UAI 2019: the Byzantine value is -epsilon * (mean of the correct
  gradients), which makes the inner product of the aggregate with the true gradient negative
  for a large enough epsilon. Omniscient: the mean is over this round's honest uploads.
  """
  mean = reduce_lib.weighted_mean(stack, jnp.asarray(honest, jnp.float32))
  return jax.tree.map(lambda m: -epsilon * m, mean)


# ---------------------------------------------------------------------------------------------
# Data poisoning.

def flip_labels(labels: jax.Array, num_classes: int, *, permutation: Optional[Any] = None,
                target: Optional[int] = None, source: Optional[int] = None) -> jax.Array:
  """Labels rewritten by a permutation, or sent to a fixed target class.

  With neither given: l -> num_classes - 1 - l, the label-flipping attack of Fang, Cao, Jia,
  Gong, "Local Model Poisoning Attacks to Byzantine-Robust Federated Learning", USENIX
  Security 2020. `permutation[l]` is the new label of l. `target`: every label (or only
  `source`, the targeted source-to-target flip of Tolpegin, Truex, Gursoy, Liu, ESORICS 2020)
  becomes `target`. Not omniscient.
  """
  require(permutation is None or target is None, "permutation/target", (permutation, target),
          "at most one of a permutation or a target class")
  labels = jnp.asarray(labels)
  if target is not None:
    require(isinstance(target, int) and 0 <= target < num_classes, "target", target,
            f"a class in [0, {num_classes})")
    flip = jnp.ones(labels.shape, bool) if source is None else labels == source
    return jnp.where(flip, jnp.asarray(target, labels.dtype), labels)
  require(source is None, "source", source, "only with a target class")
  if permutation is None:
    return (num_classes - 1 - labels).astype(labels.dtype)
  table = np.asarray(permutation)
  require(table.shape == (num_classes,) and sorted(table.tolist()) == list(range(num_classes)),
          "permutation", permutation, f"a permutation of range({num_classes})")
  return jnp.asarray(table, labels.dtype)[labels]


def checkerboard(size: int = 3) -> np.ndarray:
  """A size x size pattern of 1 and 0, 1 in the top-left corner."""
  return ((np.arange(size)[:, None] + np.arange(size)[None, :]) % 2 == 0).astype(np.float32)


def pixel_trigger(images: jax.Array, *, pattern: Optional[Any] = None, value: float = 1.0,
                  offset: int = 1) -> jax.Array:
  """Images [..., H, W, channels] with a pixel pattern stamped near the top-left corner.

  The pixel-pattern backdoor of Bagdasaryan, Veit, Hua, Estrin, Shmatikov, "How To Backdoor
  Federated Learning", AISTATS 2020 (after Gu et al.'s BadNets, 2017): where `pattern` is 1
  the pixel is set to `value` in every channel; elsewhere the image is unchanged. The pattern
  (default `checkerboard(3)`) starts `offset` pixels from the top and left edges.
  """
  pattern = checkerboard() if pattern is None else np.asarray(pattern)
  images = jnp.asarray(images)
  require(images.ndim >= 3, "images", images.shape, "[..., height, width, channels]")
  height, width = images.shape[-3], images.shape[-2]
  ph, pw = pattern.shape
  require(offset >= 0 and offset + ph <= height and offset + pw <= width, "offset", offset,
          f"a position where the {ph}x{pw} pattern fits in {height}x{width} images")
  stamp = np.zeros((height, width), bool)
  stamp[offset:offset + ph, offset:offset + pw] = pattern > 0
  return jnp.where(stamp[:, :, None], jnp.asarray(value, images.dtype), images)


def backdoor_examples(images: jax.Array, labels: jax.Array, poisoned: jax.Array,
                      target_label: int, **trigger) -> tuple[jax.Array, jax.Array]:
  """The examples where `poisoned` [B] is True get the trigger and `target_label`.

  Bagdasaryan et al., AISTATS 2020: the attacker trains on a mix of backdoored and
  clean examples so the model keeps its main-task accuracy. `trigger` goes to `pixel_trigger`.
  """
  poisoned = jnp.asarray(poisoned, bool)
  stamped = pixel_trigger(images, **trigger)
  images = jnp.where(_rows(poisoned, stamped), stamped, images)
  labels = jnp.where(poisoned, jnp.asarray(target_label, jnp.asarray(labels).dtype), labels)
  return images, labels


def model_replacement(delta: PyTree, num_clients: int, server_lr: float = 1.0,
                      num_attackers: int = 1) -> PyTree:
  """The backdoored update boosted by gamma = n / (eta m), so it replaces the global model.

  Bagdasaryan et al., AISTATS 2020, model replacement: the attacker submits gamma (X - G) for its
  backdoored model X and the global model G, with gamma = n / eta (n clients averaged, eta the
  server learning rate), so that G + eta/n * gamma (X - G) = X when the other updates cancel.
  With m colluding attackers in the round each divides its boost by m, so that together they
  land the mean on the average of their backdoored models rather than m times past it.
  `delta` is X - G (the upload in update form). Not omniscient (it needs n, eta and m only).
  """
  require(isinstance(num_clients, int) and num_clients >= 1, "num_clients", num_clients,
          "an int >= 1")
  require(server_lr > 0, "server_lr", server_lr, "a number > 0")
  require(isinstance(num_attackers, int) and num_attackers >= 1, "num_attackers", num_attackers,
          "an int >= 1")
  gamma = num_clients / (server_lr * num_attackers)
  return jax.tree.map(lambda x: gamma * x, delta)


# ---------------------------------------------------------------------------------------------
# The attacks as config.robust.attack names them, and the upload attacks as a stage.

class Attack(NamedTuple):
  """An attack as config.robust.attack names it (one entry of ATTACKS).

  Attributes:
    options: the config.robust fields it reads (besides malicious_fraction / malicious_count).
    uploads: it replaces the malicious clients' uploads: a stage on the cohort's stack before
      the defence (`upload_attack`).
    data: it rewrites the malicious clients' training data (label flipping's relabelled copy,
      the backdoor's trigger inside the local step).
  """
  options: tuple = ()
  uploads: bool = False
  data: bool = False


ATTACKS = {
    "sign_flip": Attack(("scale",), uploads=True),
    "gaussian": Attack(("std",), uploads=True),
    "alie": Attack(("z",), uploads=True),
    "ipm": Attack(("epsilon",), uploads=True),
    "label_flip": Attack(data=True),
    "backdoor": Attack(("target_label", "poison_fraction", "boost", "trigger_size"),
                       uploads=True, data=True),
}


def upload_attack(kind: str, malicious: np.ndarray, options: dict,
                  z: Optional[float] = None) -> stages.Stage:
  """The model-poisoning attack `kind` as a stage on the cohort's stack: the malicious rows
  replaced by what the attackers send (scalar "malicious": how many were in the round).

  `malicious`: [num_clients] bool, the run's attackers (`malicious_clients`), held as the
  stage's state, never changed, not as a constant of its program: runs that differ only in
  seed, each with its own attackers, then share one program (run/many.py vectorizes them).
  `options`: the attack's (ATTACKS[kind].options; the backdoor's also "server_lr"). `z`: the
  "a little is enough" z.

  The backdoor sends its own (poisoned) update boosted by gamma: options["boost"], or with
  boost 0 model replacement's gamma = n / (eta m) (Bagdasaryan et al., AISTATS 2020, Sec. 3.2:
  the attacker submits gamma (X - G) so that G + eta / n * sum of the n updates is about X),
  n the round's real clients, m the attackers among them (colluding, they share the
  replacement) and eta options["server_lr"]. Scalar "boost": the gamma of the round.
  """
  table = np.asarray(malicious)
  num_clients = table.shape[0]

  def init(params):
    del params
    return {"malicious": jnp.asarray(table)}

  def server(stack, state, key):
    if stack.client_ids is None:
      raise ValueError("an attack stage needs the stack's client ids (Stack.client_ids)")
    real = stack.mask > 0
    bad = state["malicious"][jnp.clip(stack.client_ids, 0, num_clients - 1)] & real
    honest = real & ~bad
    values = stack.values
    if kind == "sign_flip":
      sent = sign_flip(values, options["scale"])
    elif kind == "gaussian":
      row = jax.tree.map(lambda x: x[0], values)
      keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(stack.client_ids)
      sent = jax.vmap(lambda k: gaussian_noise(k, row, options["std"]))(keys)
    elif kind == "alie":
      sent = little_is_enough(values, honest, z)
    elif kind == "backdoor":
      gamma = (jnp.asarray(options["boost"], jnp.float32) if options["boost"] > 0 else
               jnp.sum(real).astype(jnp.float32)
               / (options["server_lr"] * jnp.maximum(jnp.sum(bad), 1).astype(jnp.float32)))
      sent = jax.tree.map(lambda x: (gamma * x).astype(x.dtype), values)
    else:  # ipm
      sent = inner_product_manipulation(values, honest, options["epsilon"])
    attacked = stack._replace(values=substitute(values, bad, sent))
    scalars = {"malicious": jnp.sum(bad).astype(jnp.float32)}
    if kind == "backdoor":
      scalars["boost"] = gamma
    return attacked, state, scalars

  return stages.make(f"attack[{kind}]", init=init, server=server, consumes=stages.STACK)
