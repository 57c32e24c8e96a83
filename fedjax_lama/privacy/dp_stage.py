"""User-level DP in a run: what the run checks and reports about it.

run/spec.py `privacy_options` reads config.privacy once into DpOptions, refusing the runs
the accountant cannot describe; `mechanisms.user_level_dp(options)` is the stage the run's
chain holds (run/spec.py `run_chain`). The checks below refuse, before any training,
what the noise would not cover; `summary` and `epsilon_after` report the guarantee.
"""
from typing import Optional

import jax

from fedjax_lama.engine.algorithm import MODEL_UPLOAD
from fedjax_lama.errors import ConfigError
from fedjax_lama.privacy.dp_options import DpOptions

# TF Privacy's default noise on the count of unclipped clients: the expected cohort / 20.
COUNT_STDDEV_PER_CLIENT = 1 / 20


def _field(name: str) -> str:
  return f"config.privacy.{name}"


def layer_split(text):
  """"equal", "size" or comma-separated shares "0.25,0.75" as DpOptions takes them."""
  if not isinstance(text, str):
    raise ConfigError(f"{_field('layer_split')}={text!r} is not accepted; accepted: 'equal', "
                      "'size' or comma-separated shares C_l^2 / C^2 ('0.25,0.75')")
  if text in ("equal", "size"):
    return text
  try:
    return tuple(float(s) for s in text.split(","))
  except ValueError:
    raise ConfigError(f"{_field('layer_split')}={text!r} is not accepted; accepted: 'equal', "
                      "'size' or comma-separated shares C_l^2 / C^2 ('0.25,0.75')") from None


def check_uploads(upload_names, algorithm_name: str, aggregate_names=()) -> None:
  """Refuses an algorithm whose server sees the clients through more than the noised mean of
  the model delta: the noise covers that one aggregate, so any other upload (SCAFFOLD's dc,
  FedNova's a, ...) or any other aggregate the server reads of the delta (FedDyn's
  alpha_delta, FedCM's D) would leave in the clear; an algorithm that uploads no delta
  (FedADMM, FedSpeed's "active" average) gives the noise nothing to cover.

  Args:
    upload_names: the names of one client's uploads (engine/traffic.py).
    algorithm_name: config.algorithm, for the message.
    aggregate_names: the names of the aggregates the server update reads
      (Algorithm.aggregations_for).
  """
  accepted = ("accepted: algorithms that upload the model delta alone and read nothing but "
              "its mean (fedavg, fedavgm, fedadam, fedprox, ...)")
  refused = f"config.algorithm={algorithm_name!r} is not accepted with config.privacy.enabled=True"
  if MODEL_UPLOAD not in upload_names:
    raise ConfigError(
        f"{refused}: it uploads {', '.join(map(repr, sorted(upload_names)))} and no model delta "
        f"{MODEL_UPLOAD!r} (y - x) for the noise to cover; {accepted}")
  extra = sorted(n for n in upload_names if n != MODEL_UPLOAD)
  if extra:
    raise ConfigError(
        f"{refused}: it uploads {', '.join(map(repr, extra))} besides the model delta, which the "
        f"noise does not cover; {accepted}")
  extra = sorted(n for n in aggregate_names if n != MODEL_UPLOAD)
  if extra:
    raise ConfigError(
        f"{refused}: its server also reads {', '.join(map(repr, extra))}, an aggregate of the "
        f"clients' deltas without the noise; {accepted}")


def check_model_state(model_state, model_name: str) -> None:
  """Refuses a model with BatchNorm running statistics: a synchronous round averages the
  participants' statistics into the server's with neither clip nor noise."""
  if jax.tree.leaves(model_state):
    raise ConfigError(
        f"config.model={model_name!r} is not accepted with config.privacy.enabled=True: its "
        "BatchNorm running statistics are averaged over the cohort without clip or noise; "
        "accepted: a model without running statistics (GroupNorm or no normalisation, e.g. "
        "resnet18_gn, mlp)")


def check_layer_split(options: DpOptions, params) -> None:
  """Explicit per-layer shares need one share per leaf of the model (checked before training,
  where the stage would otherwise first see the model inside the compiled round)."""
  if options.clipping != "per_layer" or isinstance(options.layer_split, str):
    return
  leaves = len(jax.tree.leaves(params))
  if len(options.layer_split) != leaves:
    raise ConfigError(f"{_field('layer_split')}={','.join(map(str, options.layer_split))!r} "
                      f"is not accepted; accepted: one share per leaf of the model ({leaves} "
                      "leaves), 'equal' or 'size'")


def check_federation(options: DpOptions, num_clients: int) -> None:
  """The accountant's population is config.num_clients; a partition that gives another
  number of clients (the natural ones) would change q N."""
  if num_clients != options.sampling.num_clients:
    raise ConfigError(
        f"config.num_clients={options.sampling.num_clients} is not accepted with "
        f"config.privacy.enabled=True: the partition gave {num_clients} clients; accepted: "
        f"config.num_clients={num_clients}")


# ---- what the run reports --------------------------------------------------------------------
ADJACENCY = {"poisson": "add_or_remove_one", "fixed": "replace_one"}
SAMPLING_SCHEMES = {"poisson": "poisson", "fixed": "fixed_size_without_replacement"}


def epsilon_after(options: DpOptions, rounds: int) -> Optional[float]:
  """epsilon at options.delta after `rounds` rounds (accounting.options_epsilon), computed on
  the host from the rounds done; None without noise (sigma = 0: no finite guarantee)."""
  if options.noise_multiplier == 0:
    return None
  from fedjax_lama.privacy import accounting  # pylint: disable=g-import-not-at-top
  return accounting.options_epsilon(options, rounds).epsilon


def summary(options: DpOptions, rounds: int) -> dict:
  """The guarantee of `rounds` rounds and everything it depends on, for summary.json."""
  from fedjax_lama.privacy import accounting  # pylint: disable=g-import-not-at-top
  sampling = options.sampling
  out = {
      "epsilon": epsilon_after(options, rounds), "delta": options.delta, "rounds": rounds,
      "noise_multiplier": float(options.noise_multiplier), "clip_norm": options.clip_norm,
      "clipping": options.clipping, "adaptive_clipping": options.adaptive is not None,
      "adjacency": ADJACENCY[sampling.kind], "sampling": SAMPLING_SCHEMES[sampling.kind],
      "sampling_fraction": sampling.sampling_fraction, "num_clients": sampling.num_clients,
      "expected_cohort": sampling.expected_cohort, "accountant": options.accountant,
      "library": accounting.LIBRARY, "library_version": accounting.LIBRARY_VERSION,
  }
  if options.adaptive is not None:
    out["update_noise_multiplier"] = options.update_noise_multiplier
    out["count_stddev"] = options.adaptive.count_stddev
  return out
