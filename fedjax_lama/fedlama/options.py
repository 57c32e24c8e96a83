"""FedLAMA's options (config.fedlama.*), typed and checked (Lee, Zhang, Avestimehr, AAAI 2023).

Where the papers (AAAI 2023; arXiv:2110.10302 v1) and the authors' code differ, the default
follows AAAI and the code's reading is an option: the selection rule, which tensors may be
relaxed (the code: kernels only), what a layer is (the code: one tensor), when BatchNorm
statistics are averaged (neither paper says; the code never averages them in FedLAMA)."""
import dataclasses
from typing import Optional, Union

from fedjax_lama.errors import require, require_one_of
from fedjax_lama.fedlama.selection import RULES

NAME = "fedlama"  # config.schedule value, and the alias config.algorithm="fedlama"


def _is_int(value, minimum: int) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


@dataclasses.dataclass(frozen=True)
class FedLamaOptions:
  base_interval: int = 10        # tau', local steps
  phi: int = 2                   # interval increase factor
  interval_rule: str = "aaai"    # aaai | code | v1 | accelerate (AAAI Algorithm 1)
  kernels_only: Optional[bool] = None   # None: True for rule "code", as the authors' code
  client_sampling: str = "window"       # a cohort per window, or per sub-round
  warmup_windows: int = 0
  layer_granularity: str = "tensor"     # tensor (the authors' code) | module
  bn_stats_sync: str = "window"         # window | round | never ("never": the authors' code)
  fixed_multipliers: Optional[Union[int, tuple]] = None  # 1 or phi per layer (equivalence runs)
  total_steps: int = 0                  # 0: rounds * window
  local_algorithm: str = "fedavg"       # the base of config.algorithm="fedlama"

  def __post_init__(self):
    for field in ("base_interval", "phi"):
      require(_is_int(getattr(self, field), 1), field, getattr(self, field), "an integer >= 1")
    require_one_of("interval_rule", self.interval_rule, RULES)
    if self.interval_rule == "accelerate":
      require(self.base_interval % self.phi == 0, "base_interval", self.base_interval,
              f"a multiple of fedlama.phi={self.phi} with interval_rule='accelerate'")
    require(not self.kernels_only or self.interval_rule == "code", "kernels_only",
            self.kernels_only, "null or false unless interval_rule='code'")
    require_one_of("client_sampling", self.client_sampling, ("window", "round"))
    require_one_of("layer_granularity", self.layer_granularity, ("tensor", "module"))
    require_one_of("bn_stats_sync", self.bn_stats_sync, ("window", "round", "never"))
    require(_is_int(self.total_steps, 0), "total_steps", self.total_steps,
            "an integer >= 0 (0: rounds * window)")
    require(_is_int(self.warmup_windows, 0), "warmup_windows", self.warmup_windows,
            "an integer >= 0")
