"""The shape every algorithm shares: pure functions the one engine calls.

An algorithm is a frozen bundle of a local optimiser, an optional gradient
correction (FedProx's proximal pull, SCAFFOLD's control variates, ...), optional
per-client persistent state, and a server optimiser that receives the
pseudo-gradient G = -mean(delta) (algorithms.md 5.0: optax minimises, so feeding
+delta would ascend).
"""
import dataclasses
from typing import Callable, Optional

import optax

from fedjax_lama.engine.local import GradCorrection
from fedjax_lama.tree import PyTree


@dataclasses.dataclass(frozen=True)
class Algorithm:
  name: str
  local_tx: optax.GradientTransformation
  server_tx: optax.GradientTransformation
  correction: Optional[GradCorrection] = None
  # Template of one client's persistent state row (None: the algorithm keeps none).
  client_row_init: Optional[Callable[[PyTree], PyTree]] = None
  # (anchor, final_params, row) -> new row; rows of unsampled clients are never touched.
  client_row_update: Optional[Callable[[PyTree, PyTree, PyTree], PyTree]] = None
  # Model copies each participating client sends up / receives down per round (comm accounting).
  floats_up_per_model: float = 1.0
  floats_down_per_model: float = 1.0
