"""Orbax checkpoints of the training state plus a JSON record of host counters.

Everything not saved here (cohorts, batches, keys) is recomputed from (seed, round),
which is what makes a resumed run exact.

Orbax writes a step atomically but does not check, when reading it back, that its bytes
are those it wrote. Once a step is finalized, a SHA-256 of every file in it is written
beside them (CHECKSUMS); a restore first compares them and stops with a `CheckpointError`
naming the file whose bytes changed. Steps written without the file (a kill between
orbax's finalization and the checksums) are restored unchecked.
"""
import hashlib
import json
import os
from typing import Any, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging as absl_logging

from fedjax_lama.errors import CheckpointError, WorkdirError
from fedjax_lama.tree import leaf_paths

CHECKSUMS = "fedjax_lama_sha256.json"


def _file_digests(step_dir: str) -> dict:
  """{relative path: sha256 hex} of every file under step_dir but the checksum file."""
  digests = {}
  for root, _, files in os.walk(step_dir):
    for name in files:
      path = os.path.join(root, name)
      rel = os.path.relpath(path, step_dir)
      if rel in (CHECKSUMS, CHECKSUMS + ".tmp"):
        continue
      h = hashlib.sha256()
      with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
          h.update(block)
      digests[rel] = h.hexdigest()
  return digests


# The key under which a program's host state records `tree_digest` of the parameters its
# checkpoints leave out (RoundProgram.host_state: a trainable set's frozen base).
FROZEN_DIGEST = "frozen_sha256"


def tree_digest(tree: Any) -> str:
  """sha256 hex of a parameter tree's leaves (paths, dtypes, shapes and bytes): what a
  checkpoint that leaves parameters out records of them (a trainable set's frozen base),
  so that a reader deriving them again can tell they are the ones the run trained on."""
  digest = hashlib.sha256()
  for path, leaf in zip(leaf_paths(tree), jax.device_get(jax.tree.leaves(tree))):
    leaf = np.ascontiguousarray(leaf)
    digest.update(("/".join(path) + str(leaf.dtype) + str(leaf.shape)).encode())
    digest.update(leaf.tobytes())
  return digest.hexdigest()


def _os_error(e: BaseException) -> Optional[OSError]:
  """The OSError that caused `e` (orbax wraps them), if any."""
  while e is not None:
    if isinstance(e, OSError):
      return e
    e = e.__cause__ or e.__context__
  return None


class Checkpointer:

  def __init__(self, directory: str, max_to_keep: int = 2, read_only: bool = False):
    """read_only: another run's checkpoints (config.init_from, the export), read and never
    written, cleaned or created."""
    self.directory = os.path.abspath(directory)
    verbosity = absl_logging.get_verbosity()
    if read_only:  # orbax would warn that a read-only directory is read only
      absl_logging.set_verbosity(absl_logging.ERROR)
    try:
      self._manager = ocp.CheckpointManager(
          self.directory,
          options=ocp.CheckpointManagerOptions(
              max_to_keep=None if read_only else max_to_keep, create=not read_only,
              read_only=read_only, save_interval_steps=0 if read_only else 1,
              enable_async_checkpointing=False),
          item_names=("state", "meta"))
    finally:
      absl_logging.set_verbosity(verbosity)

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def save(self, step: int, state: Any, meta: dict) -> None:
    try:
      self._manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
      self._manager.wait_until_finished()
      if jax.process_index() == 0:
        self._write_checksums(step)
    except Exception as e:  # pylint: disable=broad-except
      cause = _os_error(e)
      if cause is None:
        raise
      raise WorkdirError(f"checkpoint {self.step_dir(step)} cannot be written "
                         f"({cause.strerror or cause}); the workdir keeps the checkpoints "
                         "before it") from e

  def _write_checksums(self, step: int) -> None:
    step_dir = self.step_dir(step)
    if not os.path.isdir(step_dir):  # a layout this code does not know: nothing to check
      return
    digests = _file_digests(step_dir)
    tmp = os.path.join(step_dir, CHECKSUMS + ".tmp")
    with open(tmp, "w") as f:
      json.dump(digests, f, indent=0, sort_keys=True)
    os.replace(tmp, os.path.join(step_dir, CHECKSUMS))

  def verify(self, step: int) -> None:
    """Raises CheckpointError naming the first file of `step` whose bytes changed."""
    step_dir = self.step_dir(step)
    path = os.path.join(step_dir, CHECKSUMS)
    if not os.path.exists(path):
      return
    try:
      with open(path) as f:
        expected = json.load(f)
    except (OSError, ValueError) as e:
      raise CheckpointError(f"{path} cannot be read ({e}); {self._advice(step)}") from e
    actual = _file_digests(step_dir)
    for rel in sorted(set(expected) | set(actual)):
      if expected.get(rel) != actual.get(rel):
        what = ("is missing" if rel not in actual else "was not written with the checkpoint"
                if rel not in expected else "changed since it was written (SHA-256 differs)")
        raise CheckpointError(f"checkpoint file {os.path.join(step_dir, rel)} {what}; "
                              f"{self._advice(step)}")

  def _advice(self, step: int) -> str:
    earlier = [s for s in self._manager.all_steps() if s < step]
    if earlier:
      return (f"move {self.step_dir(step)} out of the workdir to resume from the checkpoint "
              f"after round {max(earlier) + 1}")
    return "no earlier checkpoint exists: start again in a new --workdir"

  def restore(self, step: int, like: Any) -> tuple[Any, dict]:
    """Restores into the structure, dtypes and shardings of `like`, after `verify`."""
    self.verify(step)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    try:
      out = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointError(f"checkpoint {self.step_dir(step)} cannot be restored "
                            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                            f"{self._advice(step)}") from e
    return out["state"], out["meta"]

  def restore_tree(self, step: int) -> tuple[Any, dict]:
    """The state of `step` as saved, without a target (nested dicts of host arrays; a
    NamedTuple comes back as a dict of its fields), after `verify`: what another run reads
    from this one's checkpoint, whose structure it does not hold."""
    self.verify(step)
    try:
      out = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointError(f"checkpoint {self.step_dir(step)} cannot be restored "
                            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
                            ) from e
    return jax.tree.map(np.asarray, out["state"]), out["meta"]

  def restore_meta(self, step: int) -> dict:
    """The JSON record of one step alone (to learn the state's structure before restoring it)."""
    self.verify(step)
    out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return out["meta"]

  def close(self) -> None:
    self._manager.close()
