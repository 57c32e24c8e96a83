"""A run on the simulated clock (FedAT, Chai et al. 2021, and its baselines): the RunSpec's
data, federation and model handed to fedjax_lama.simulation.clock_run with its typed options."""
from typing import Optional

import jax

from fedjax_lama import errors
from fedjax_lama.data import augment
from fedjax_lama.errors import ConfigError
from fedjax_lama.run import parts as parts_lib
from fedjax_lama.run.records import DivergenceError


def train(spec, parts: parts_lib.Parts, workdir: str, extended: Optional[int],
          stop_after_tick: Optional[int]) -> dict:
  """Runs (or resumes) the clock run of `spec` in `workdir` (checked by the caller; a run on
  the clock is never `extended`).

  stop_after_tick: stop after the checkpoint that follows that evaluation tick (tests).
  """
  del extended  # refused by workdir.check_extension
  from fedjax_lama.simulation import clock_run  # pylint: disable=g-import-not-at-top
  if jax.tree.leaves(parts.model_state):
    raise ConfigError(
        f"config.model={spec.model.name!r} keeps BatchNorm statistics, which runs on the "
        "simulated clock do not carry (models travel as parameters only); accepted: a model "
        "without them")
  # Calls vary in size: each takes its own devices of this mesh
  # (engine_adapter.EngineTrainer.call_mesh).
  mesh = parts_lib.client_mesh(spec.clock.system.batch_size, parts._replace(model_state={}))
  try:
    return clock_run.run(spec.clock, parts.fed, parts.model, parts.params, workdir,
                         config_json=spec.records.config_json, mesh=mesh,
                         augment=augment.augmentation(spec.data.augmentation, parts.fed.dataset),
                         stop_after_tick=stop_after_tick,
                         advice=f"try a smaller config.local_lr (now {spec.records.local_lr})",
                         max_loss_growth=spec.records.max_loss_growth)
  except errors.TrainingDiverged as e:  # one error type for every mode (sweeps record it)
    if isinstance(e, DivergenceError):
      raise
    raise DivergenceError(str(e)) from None
