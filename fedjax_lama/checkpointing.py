"""Orbax checkpoints of the training state plus a JSON record of host counters.

Everything not saved here (cohorts, batches, keys) is recomputed from
(seed, round), which is what makes a resumed run exact (architecture.md 3).
"""
import os
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp


class Checkpointer:

  def __init__(self, directory: str, max_to_keep: int = 2):
    self._manager = ocp.CheckpointManager(
        os.path.abspath(directory),
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                             enable_async_checkpointing=False),
        item_names=("state", "meta"))

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def save(self, step: int, state: Any, meta: dict) -> None:
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
    self._manager.wait_until_finished()

  def restore(self, step: int, like: Any) -> tuple[Any, dict]:
    """Restores into the structure, dtypes and shardings of `like`."""
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, like)
    out = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    return out["state"], out["meta"]

  def restore_meta(self, step: int) -> dict:
    """The JSON record of one step alone (to learn the state's structure before restoring it)."""
    out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return out["meta"]

  def close(self) -> None:
    self._manager.close()
