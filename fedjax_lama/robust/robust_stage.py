"""config.robust, typed (RobustSpec), as the run's stages: an upload attack, then a defence.

    spec = RobustSpec(...)                         config.robust read and checked once by
                                                   run/spec.py `robust_options` (None when
                                                   both are "none")
    run_stages(spec, num_clients)                  [attack, defence] for the run's one chain
                                                   (run/spec.py `run_chain`)
    fed = poisoned(spec, fed)                      label flipping: the malicious clients'
                                                   training labels, relabelled once
    opts = with_poison(spec, opts, fed)            the backdoor: RunOptions.poison stamps the
                                                   trigger inside the jitted local step

The defence (robust/defences.py DEFENCES) is the reducer of the model upload's aggregate
(engine/aggregation.py): a rule that needs the cohort's stack (Krum, Multi-Krum, Bulyan, the
coordinate median, the trimmed mean, the geometric median, centered clipping, MeaMed) reads
the stack; norm bounding clips each client's upload before the streaming mean, unless an
upload attack precedes it (then its form on the stack).

The model-poisoning attack (robust/attacks.py `upload_attack`) is a stage on the stack before
the defence: the malicious rows of the cohort's stack are replaced by what the attackers send.
The attacker is omniscient: the "a little is enough" and inner-product-manipulation uploads
are computed from the honest uploads of the same round. Which clients are malicious is fixed
for the run from config.seed (`attacks.malicious_clients`); they are sampled like everyone
else, and the stage finds them by the stack's client ids.

The backdoor (Bagdasaryan, Veit, Hua, Estrin, Shmatikov, "How To Backdoor Federated Learning",
AISTATS 2020) is both: a data attack, where a fixed share of each malicious client's examples
gets a pixel-pattern trigger and the target label inside the jitted local step (no host work
per round, the same rows every round), and an upload attack, where the malicious rows of the
stack are boosted (model replacement) before the defence. Its data part stays a hook of the
local step (RunOptions.poison, beside the augmentation) and is not a stage: it rewrites each
step's batch inside the local scan, before any upload exists, where the chain of stages (which
runs between the uploads and the server update) has no place. Its success is measured by the
run's records (`Backdoor.test_set`: the test examples of other classes, triggered).
"""
import dataclasses
import math
from typing import Callable, Optional

import jax.numpy as jnp
import numpy as np

from fedjax_lama import data as fdata
from fedjax_lama import rng
from fedjax_lama.engine import reduce as reduce_lib
from fedjax_lama.engine import stages
from fedjax_lama.engine.algorithm import MODEL_UPLOAD
from fedjax_lama.errors import ConfigError, HparamError
from fedjax_lama.robust import attacks, defences

# config.robust.defence and config.robust.attack: "none" or a registered rule or attack.
DEFENCES = ("none",) + tuple(defences.DEFENCES)
ATTACKS = ("none",) + tuple(attacks.ATTACKS)
# Attacks with a stage before the defence (the backdoor's boost of its poisoned updates).
STAGE_ATTACKS = tuple(name for name, a in attacks.ATTACKS.items() if a.uploads)
# What every attack reads besides its own options.
ATTACK_FIELDS = ("malicious_fraction", "malicious_count")
# Stream of the host-side draw of each malicious client's poisoned examples.
STREAM_BACKDOOR = 102
# Where the trigger starts, in pixels from the top and left edges.
TRIGGER_OFFSET = 1


@dataclasses.dataclass(frozen=True)
class Backdoor:
  """config.robust's backdoor options, checked (Bagdasaryan et al., AISTATS 2020)."""
  target_label: int
  poison_fraction: float
  trigger_size: int

  @staticmethod
  def poisoned_count(num_examples: int, fraction: float) -> int:
    """How many of a client's `num_examples` carry the trigger: fraction * num_examples
    rounded half up, at least 1 (a malicious client with data always poisons some)."""
    if num_examples == 0:
      return 0
    return min(num_examples, max(1, math.floor(fraction * num_examples + 0.5)))

  def check_data(self, dataset) -> None:
    """ConfigError naming config.robust.<field> unless the dataset is images of one class
    label per example with the target among its classes and room for the trigger."""
    x, y = np.shape(dataset.train_x), np.shape(dataset.train_y)
    if dataset.input_kind != fdata.INPUT_IMAGE or len(x) != 4 or len(y) != 1:
      raise ConfigError(
          f"config.robust.attack='backdoor' is not accepted for config.dataset="
          f"{dataset.name!r}: it gives {dataset.input_kind!r} inputs of shape {x[1:]} with "
          f"targets of shape {y[1:]} per example; accepted: an image dataset with one class "
          "label per example (the trigger is a pixel pattern)")
    classes = int(dataset.num_classes)
    if not self.target_label < classes:
      fail("target_label", self.target_label,
            f"a class in [0, {classes}) of config.dataset={dataset.name!r}")
    room = min(x[1], x[2]) - TRIGGER_OFFSET
    if not self.trigger_size <= room:
      fail("trigger_size", self.trigger_size,
            f"an int in [1, {room}] for the {x[1]}x{x[2]} images of config.dataset="
            f"{dataset.name!r} (the trigger starts {TRIGGER_OFFSET} pixel from the corner)")

  def trigger(self, dataset) -> dict:
    """`attacks.pixel_trigger`'s options: a checkerboard of trigger_size pixels set to the
    largest training input (white on the images as they are normalised), so training and
    evaluation stamp the same pixels with the same value."""
    return {"pattern": attacks.checkerboard(self.trigger_size),
            "value": float(np.max(dataset.train_x)), "offset": TRIGGER_OFFSET}

  def test_set(self, dataset) -> tuple[np.ndarray, np.ndarray]:
    """The backdoor's test set: the test examples whose label is not the target, triggered
    and labelled with the target; the accuracy on it is the attack's success rate."""
    keep = np.asarray(dataset.test_y) != self.target_label
    x = np.asarray(attacks.pixel_trigger(np.asarray(dataset.test_x)[keep],
                                         **self.trigger(dataset)))
    return x, np.full(int(keep.sum()), self.target_label, np.asarray(dataset.test_y).dtype)


@dataclasses.dataclass(frozen=True)
class RobustSpec:
  """config.robust, checked."""
  defence: str                 # one of DEFENCES
  f: Optional[int]             # None where the defence reads no f
  hparams: dict                # the rule's options (defences.DEFENCES[defence].options)
  attack: str                  # one of ATTACKS
  malicious_fraction: Optional[float]
  malicious_count: Optional[int]
  attack_options: dict         # scale (sign_flip), std (gaussian), z (alie), epsilon (ipm),
                               # boost and server_lr (backdoor)
  seed: int
  sampling: str                # config.client_sampling, for the smallest cohort
  active_ratio: float
  backdoor: Optional[Backdoor] = None  # the backdoor's data options (attack "backdoor")

  def malicious(self, num_clients: int) -> np.ndarray:
    """[num_clients] bool: the run's malicious clients (none without an attack)."""
    if self.attack == "none":
      return np.zeros(num_clients, bool)
    return attacks.malicious_clients(self.seed, num_clients, fraction=self.malicious_fraction,
                                     count=self.malicious_count)

  def smallest_cohort(self, num_clients: int) -> tuple[int, str]:
    """(the fewest real clients a round can hold, how that follows from the config)."""
    if self.sampling == "bernoulli":  # an empty draw trains nobody: one client is the least
      return 1, "config.client_sampling='bernoulli' can draw a cohort of 1 client"
    n = max(1, int(round(self.active_ratio * num_clients)))
    return n, (f"config.active_ratio={self.active_ratio} of config.num_clients={num_clients} "
               f"gives cohorts of n={n} clients")


def fail(field: str, value, accepted: str):
  raise ConfigError(f"config.robust.{field}={value!r} is not accepted; accepted: {accepted}")


def is_count(x) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def is_number(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _config_field(field: str) -> str:
  """robust.defences' field names (num_byzantine, trimmed_mean.beta) as config.robust's."""
  last = field.split(".")[-1]
  return "f" if last == "num_byzantine" else last


def fields_read(defence: str, attack: str) -> tuple:
  """The config.robust fields a run with this defence and attack reads (besides the two
  names): the defence's f and options, the attack's options and its count of attackers."""
  fields = []
  rule = defences.DEFENCES.get(defence)
  if rule is not None:
    fields += (["f"] if rule.bound is not None else []) + list(rule.options)
  if attack in attacks.ATTACKS:
    fields += list(ATTACK_FIELDS) + list(attacks.ATTACKS[attack].options)
  return tuple(fields)


# ---- the stages ---------------------------------------------------------------------------------
def _defence(spec: RobustSpec, num_clients: int, on_stack: bool) -> Optional[stages.Stage]:
  rule = defences.DEFENCES.get(spec.defence)
  if rule is None:
    return None
  try:
    stage = defences.build(spec.defence, spec.f, on_stack=on_stack, **spec.hparams)
  except HparamError as e:
    raise ConfigError(f"config.robust.{_config_field(e.field)}={e.value!r} is not accepted "
                      f"with config.robust.defence={spec.defence!r}; accepted: {e.accepted}"
                      ) from e
  if rule.bound is None:
    return stage
  n, how = spec.smallest_cohort(num_clients)
  try:
    defences.check_preconditions(spec.defence, n, spec.f, **spec.hparams)
  except HparamError as e:
    raise ConfigError(
        f"config.robust.f={spec.f} is not accepted with config.robust.defence="
        f"{spec.defence!r}: {how}, and {e.accepted}; accepted: a smaller config.robust.f or "
        "larger cohorts") from e
  return stage


def whole_cohort_mean() -> stages.Stage:
  """sum_i p_i v_i / sum_i p_i on the stack (the mean after an attack, with no defence)."""
  def server(stack: stages.Stack, state, key):
    del key
    return reduce_lib.weighted_mean(stack.values, stack.weights), state, {}
  return stages.make("mean[stack]", server=server, consumes=stages.STACK, reduces=True)


def _alie_z(spec: RobustSpec, num_clients: int) -> float:
  """config.robust.z, or z_max of Baruch et al. (NeurIPS 2019) for the run's cohort and its
  expected number of malicious clients."""
  if spec.attack_options["z"] > 0:
    return float(spec.attack_options["z"])
  n, how = spec.smallest_cohort(num_clients)
  share = spec.malicious(num_clients).mean()
  f = max(1, int(round(share * n)))
  try:
    return attacks.little_is_enough_z(n, f)
  except HparamError as e:
    raise ConfigError(
        f"config.robust.z=0 (z_max) is not accepted for config.robust.attack='alie': {how} "
        f"with about f={f} malicious, and z_max needs {e.accepted}; accepted: a z > 0") from e


def attack_stage(spec: RobustSpec, num_clients: int) -> stages.Stage:
  """The run's upload attack (attacks.upload_attack) with its attackers among
  `num_clients` clients."""
  z = _alie_z(spec, num_clients) if spec.attack == "alie" else None
  return attacks.upload_attack(spec.attack, spec.malicious(num_clients), spec.attack_options,
                               z)


def run_stages(spec: Optional[RobustSpec], num_clients: int) -> list:
  """The run's robust stages on a federation of `num_clients` clients, in chain order: the
  upload attack, then the defence; after an attack every reducer reads the stack (a clip of
  each client's upload would bound the honest uploads the attackers' replace), so the mean
  is the stack's when there is no defence. [] without config.robust."""
  if spec is None:
    return []
  after_attack = spec.attack in STAGE_ATTACKS
  rule = _defence(spec, num_clients, on_stack=after_attack)
  if not after_attack:
    return [] if rule is None else [rule]
  return [attack_stage(spec, num_clients), whole_cohort_mean() if rule is None else rule]


def build_stage(spec: Optional[RobustSpec], num_clients: int) -> Optional[stages.Stage]:
  """The run's robust stages as one chain (None: the algorithm's declared aggregation
  alone)."""
  members = run_stages(spec, num_clients)
  return stages.chain(*members) if members else None


def check_algorithm(spec: Optional[RobustSpec], algorithm, algorithm_name: str) -> None:
  """Refuses a defence over an algorithm that declares its own reduction of the model upload
  (Algorithm.aggregate[MODEL_UPLOAD], HypCluster's per-cluster masked mean): the defence
  replaces the mean of the displacement the clients upload, which that aggregate is not."""
  if spec is None or spec.defence == "none":
    return
  if MODEL_UPLOAD in (algorithm.aggregate or {}):
    raise ConfigError(
        f"config.robust.defence={spec.defence!r} is not accepted with "
        f"config.algorithm={algorithm_name!r} (it declares its own aggregate of the model "
        f"upload {MODEL_UPLOAD!r}); accepted: 'none', or an algorithm that averages the "
        "uploaded displacement as it is")


def poisoned(spec: Optional[RobustSpec], fed):
  """The federation the clients train on: under label flipping, the training labels of the
  examples the malicious clients hold sent l -> K - 1 - l (Fang et al., USENIX Security 2020),
  a relabelled copy built once; otherwise `fed` itself."""
  if spec is None or spec.attack != "label_flip":
    return fed
  labels = np.asarray(fed.dataset.train_y)
  if labels.ndim != 1:
    raise ConfigError(
        "config.robust.attack='label_flip' needs one class label per example, but "
        f"config.dataset has targets of shape {labels.shape[1:]} per example; accepted: a "
        "classification dataset")
  malicious = spec.malicious(fed.num_clients)
  held = [np.asarray(c) for c, bad in zip(fed.client_train, malicious) if bad]
  flipped = labels.copy()
  if held:
    rows = np.unique(np.concatenate(held))
    flipped[rows] = np.asarray(attacks.flip_labels(labels[rows], int(fed.dataset.num_classes)))
  return dataclasses.replace(fed, dataset=dataclasses.replace(fed.dataset, train_y=flipped))


def poisoned_rows(spec: RobustSpec, fed) -> np.ndarray:
  """[train examples] bool: the examples the backdoor triggers. Of each malicious client's
  n_i examples, `Backdoor.poisoned_count(n_i, poison_fraction)` drawn without replacement
  from (config.seed, STREAM_BACKDOOR, client id): the same rows in every round and on
  resume. (Partitions give each example to one client, so a row is one client's.)"""
  rows = np.zeros(len(fed.dataset.train_y), bool)
  for client in np.flatnonzero(spec.malicious(fed.num_clients)):
    held = np.asarray(fed.client_train[client])
    k = Backdoor.poisoned_count(len(held), spec.backdoor.poison_fraction)
    chosen = rng.numpy_rng(spec.seed, STREAM_BACKDOOR, int(client)).choice(
        len(held), size=k, replace=False)
    rows[held[chosen]] = True
  return rows


def backdoor_poison(malicious: np.ndarray, rows: np.ndarray, target_label: int,
                    trigger: dict) -> Callable:
  """RunOptions.poison of the backdoor: poison(x, y, indices, client_id) -> (x, y) on one
  local step's batch (x [B, H, W, C], y [B], `indices` [B] the batch's rows of the training
  arrays), inside the jitted step. An example is triggered and relabelled `target_label`
  when `rows[index]` and the training client is malicious (`malicious[client_id]`)."""
  malicious, rows = jnp.asarray(malicious, bool), jnp.asarray(rows, bool)
  last = malicious.shape[0] - 1

  def poison(x, y, indices, client_id):
    chosen = rows[indices] & malicious[jnp.clip(client_id, 0, last)]
    return attacks.backdoor_examples(x, y, chosen, target_label, **trigger)

  return poison


def with_poison(spec: Optional[RobustSpec], opts, fed):
  """RunOptions with the backdoor's poisoning of the malicious clients' batches (unchanged
  for every other attack); the data are checked first (`Backdoor.check_data`)."""
  if spec is None or spec.backdoor is None:
    return opts
  spec.backdoor.check_data(fed.dataset)
  poison = backdoor_poison(spec.malicious(fed.num_clients), poisoned_rows(spec, fed),
                           spec.backdoor.target_label, spec.backdoor.trigger(fed.dataset))
  return dataclasses.replace(opts, poison=poison)
