"""Typed options of one run on the virtual clock (the run contract of docs/design.md).

FedAT (Chai et al., SC'21) and its baselines run
on the simulated system (simulation/system_config.py). The registry
(fedjax_lama.config.clock_options) builds a `ClockOptions` from a config
(config.system.*, config.<method>.*); clock_run.py runs it. Pure dataclasses: importing
this module pulls in neither JAX nor a config library.
"""
import dataclasses
from typing import Any, Optional

from fedjax_lama.simulation.system_config import (ASOFedConfig, FedAsyncConfig, FedATConfig,
                                           FedAvgConfig, FedBuffConfig, FedProxConfig, SystemConfig,
                                           TiFLConfig)

LOCAL_OPTIMIZERS = ("adam", "sgd")
POLYLINE_MODES = ("flat", "pairs")
METHOD_CONFIGS = {"fedat": FedATConfig, "fedavg": FedAvgConfig, "fedprox": FedProxConfig,
                  "tifl": TiFLConfig, "fedasync": FedAsyncConfig, "asofed": ASOFedConfig,
                  "fedbuff": FedBuffConfig}


@dataclasses.dataclass(frozen=True)
class ClockOptions:
  """Everything a run on the clock needs besides the data and the model.

  Attributes:
    method: a name of `simulation.METHODS` ("fedat", "fedavg", "fedprox", "tifl",
      "fedasync", "asofed", "fedbuff").
    method_config: its typed config (METHOD_CONFIGS[method]).
    system: the simulated system and the run.
    local_lr: eta of the local solver (constant).
    local_optimizer: "adam" or "sgd" (with `local_momentum`).
    local_momentum: momentum of "sgd".
    polyline_mode: "flat" or "pairs" (Chai et al., SC'21, Sec. 6).
    call_size_multiple: trainer calls are padded to a multiple of this many clients.
    target_accuracy: the target of the time/bytes-to-target measures, or None.
    checkpoint_every_ticks: a checkpoint every this many evaluation ticks.
    eval_batch_size, label_smoothing, unroll: as for synchronous runs.
    plots: write the PNG plots.
    algorithm, dataset, model: names for the summary and the plots' titles.
    platform: the engine's platform plan (`engine.plan.PlatformPlan`, built by the
      training entry point); None: the default backend's.
  """
  method: str
  method_config: Any
  system: SystemConfig
  local_lr: float
  local_optimizer: str = "adam"
  local_momentum: float = 0.0
  polyline_mode: str = "flat"
  call_size_multiple: int = 10
  target_accuracy: Optional[float] = None
  checkpoint_every_ticks: int = 20
  eval_batch_size: int = 1000
  label_smoothing: float = 0.0
  unroll: int = 1
  plots: bool = True
  algorithm: str = ""
  dataset: str = ""
  model: str = ""
  platform: Optional[Any] = None  # a PlatformPlan; typed Any so this module needs no JAX

  def __post_init__(self):
    if self.method not in METHOD_CONFIGS:
      raise ValueError(f"method must be one of {list(METHOD_CONFIGS)}, got {self.method!r}")
    if not isinstance(self.method_config, METHOD_CONFIGS[self.method]):
      raise ValueError(f"method_config must be a {METHOD_CONFIGS[self.method].__name__}")
    if not isinstance(self.system, SystemConfig):
      raise ValueError("system must be a SystemConfig")
    if self.local_optimizer not in LOCAL_OPTIMIZERS:
      raise ValueError(f"local_optimizer must be one of {list(LOCAL_OPTIMIZERS)}, got "
                       f"{self.local_optimizer!r}")
    if self.polyline_mode not in POLYLINE_MODES:
      raise ValueError(f"polyline_mode must be one of {list(POLYLINE_MODES)}, got "
                       f"{self.polyline_mode!r}")
    for name in ("call_size_multiple", "checkpoint_every_ticks", "eval_batch_size"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
