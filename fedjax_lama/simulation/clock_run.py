"""The run contract on the virtual clock: FedAT and its baselines end to end.

`run(options, fed, model, params, workdir, ...)` builds the simulator of algorithms.md
3.1 with the engine's trainer, evaluator and algebra (engine_adapter.py) and the polyline
codec (3.3), runs it tick by tick and writes what architecture.md 3 promises
(FedAT: Chai et al., SC'21, shared/seeds/003_656c618fe5de2ce3.txt):

- metrics.jsonl: one record per evaluation tick (3.1.7, 3.5): `virtual_time` beside
  `wall_seconds`, `test_accuracy` (pooled over every client's local test split),
  `test_loss`, `train_loss` (jobs trained since the previous tick), per-client accuracy
  (`client_test_accuracy` and its mean / population variance / min), `bytes_up`,
  `bytes_down`, `comm_bytes`, `comm_floats_up` / `_down` (parameters carried), update
  counts (`global_updates`, FedAT's `tier_updates`, `uploads`, `downloads`),
  `local_steps`. `round` counts the records (1-based).
- summary.json: the contract's keys and the measures of 3.5 (best accuracy, variance
  measures, time and bytes to `target_accuracy` when one is set).
- PNG plots: accuracy over virtual time (and the usual accuracy vs records / traffic).
- orbax checkpoints every `checkpoint_every_ticks` ticks: the models of the simulator's
  `state_dict` as pytrees, the rest of it (clock, event queue, in-flight jobs, logs,
  tick records) and the trainer's counters as JSON. Running again on the same workdir
  resumes exactly: the in-flight jobs keep their trainer calls, so the resumed run
  computes exactly what the uninterrupted one does.

The config is read by the training entry point; this module takes typed arguments.
"""
import logging
import math
import os
from typing import Any, Callable, Optional

import jax
import numpy as np

from fedjax_lama import checkpointing, metrics
from fedjax_lama.engine import sharding
from fedjax_lama.simulation import engine_adapter
from fedjax_lama.simulation.codecs import PolylineCodec
from fedjax_lama.simulation.events import MODEL, UP
from fedjax_lama.simulation.loop import Simulator, tick_times
from fedjax_lama.simulation.methods import METHODS
from fedjax_lama.simulation.run_options import ClockOptions

logger = logging.getLogger("fedjax_lama")

_FORMAT = 1
PROBE_UPLOAD_VALUES = 2  # TiFL's accuracy probe uploads two int32 counts (3.4.4)
PLOT_FILE = "accuracy_vs_virtual_time.png"


class EngineSimulator(Simulator):
  """The Simulator, with the engine's host counters added to every tick record.

  Extra keys per tick: `test_loss` (the evaluator's pooled loss at that tick),
  cumulative `train_loss_sum`, `train_count`, `local_steps` (trainer totals) and the
  cumulative message counts `models_up`, `models_down`, `probes_up`, `probes_down`.
  """

  def _record_tick(self, index: int, final: bool = False) -> None:
    super()._record_tick(index, final)
    directions, kinds = self._messages[1], self._messages[4]
    previous = self.ticks[-2] if len(self.ticks) > 1 else None
    start = previous["num_messages"] if previous is not None else 0
    counts = {"models_up": 0, "models_down": 0, "probes_up": 0, "probes_down": 0}
    for d, k in zip(directions[start:], kinds[start:]):
      what = "models" if k == MODEL else "probes"
      counts[f"{what}_{'up' if d == UP else 'down'}"] += 1
    if previous is not None:
      counts = {name: previous[name] + c for name, c in counts.items()}
    trainer = self.trainer
    self.ticks[-1].update(
        test_loss=float(getattr(self.evaluator, "last_loss", math.nan)),
        num_messages=len(directions), train_loss_sum=float(trainer.loss_sum),
        train_count=float(trainer.example_count), local_steps=int(trainer.local_steps),
        **counts)


def build_simulator(options: ClockOptions, fed, model, params, *, mesh=None,
                    augment: Optional[Callable] = None) -> EngineSimulator:
  """The simulator of `options` on the federation `fed` (local 80/20 splits required).

  Args:
    options: the typed run options (registry.clock_options).
    fed: the federation; fed.client_test holds every client's local test rows of the
      training arrays (config.local_test_fraction > 0).
    model, params: the flax module and the initial model w0 (shared by every method).
    mesh: the "clients" mesh (default: every device).
    augment: the engine's augmentation hook, if any.
  """
  if fed.client_test is None or fed.client_test_in != "train":
    raise ValueError("runs on the clock evaluate every client's local test split: build the "
                     "federation with a local test fraction (3.6.3)")
  mesh = mesh if mesh is not None else sharding.client_mesh()
  ds, system = fed.dataset, options.system
  trainer = engine_adapter.EngineTrainer(
      model, ds.train_x, ds.train_y, fed.client_train, seed=system.seed,
      batch_size=system.batch_size, max_epochs=system.local_epochs, lr=options.local_lr,
      local_tx=engine_adapter.local_solver(options.local_optimizer, options.local_momentum),
      mesh=mesh, call_size_multiple=options.call_size_multiple, augment=augment,
      unroll=options.unroll, label_smoothing=options.label_smoothing)
  evaluator = engine_adapter.LocalTestEvaluator(model, ds.train_x, ds.train_y, fed.client_test,
                                                options.eval_batch_size)
  method = METHODS[options.method](options.method_config)
  initial = jax.tree_util.tree_map(np.asarray, params)
  return EngineSimulator(system, method, num_examples=[len(ix) for ix in fed.client_train],
                         initial_model=initial, trainer=trainer, evaluator=evaluator,
                         algebra=engine_adapter.JaxAlgebra(),
                         codec=PolylineCodec(mode=options.polyline_mode))


# ---- checkpoints: models as pytrees, the rest as JSON ----------------------------------------
def _is_model(value: Any, params_def) -> bool:
  return isinstance(value, dict) and jax.tree_util.tree_structure(value) == params_def


def split_models(state: Any, params_def) -> tuple[Any, list]:
  """(JSON-ready state with {"__model__": i} in place of every model, the models).

  A model object referenced several times (a download shared by a round's jobs) is
  stored once. numpy arrays become {"__ndarray__": values, "dtype": name}.
  """
  models, seen = [], {}

  def walk(value):
    if _is_model(value, params_def):
      if id(value) not in seen:
        seen[id(value)] = len(models)
        models.append(value)
      return {"__model__": seen[id(value)]}
    if isinstance(value, dict):
      return {str(k): walk(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
      return [walk(v) for v in value]
    if isinstance(value, (np.ndarray, jax.Array)):
      array = np.asarray(value)
      return {"__ndarray__": array.tolist(), "dtype": array.dtype.name,
              "shape": list(array.shape)}
    if isinstance(value, np.generic):
      return value.item()
    return value

  return walk(state), models


def join_models(state: Any, models: list) -> Any:
  """The inverse of `split_models`."""

  def walk(value):
    if isinstance(value, dict):
      if set(value) == {"__model__"}:
        return models[value["__model__"]]
      if "__ndarray__" in value:
        return np.asarray(value["__ndarray__"], value["dtype"]).reshape(value["shape"])
      return {k: walk(v) for k, v in value.items()}
    if isinstance(value, list):
      return [walk(v) for v in value]
    return value

  return walk(state)


def save_checkpoint(ckpt: checkpointing.Checkpointer, sim: EngineSimulator, params) -> None:
  state, models = split_models(sim.state_dict(), jax.tree_util.tree_structure(params))
  meta = {"format": _FORMAT, "simulator": state, "trainer": sim.trainer.state_dict(),
          "num_models": len(models), "num_ticks": len(sim.ticks)}
  ckpt.save(len(sim.event_log), {"models": {f"m{i}": m for i, m in enumerate(models)}}, meta)


def restore_checkpoint(ckpt: checkpointing.Checkpointer, step: int, params) -> tuple[dict, dict]:
  """(the simulator's state_dict, the checkpoint's meta) of one step."""
  meta = ckpt.restore_meta(step)
  if meta.get("format") != _FORMAT:
    raise ValueError(f"checkpoint step {step} has format {meta.get('format')!r}, not {_FORMAT}")
  like = {"models": {f"m{i}": params for i in range(meta["num_models"])}}
  restored, meta = ckpt.restore(step, like)
  models = [restored["models"][f"m{i}"] for i in range(meta["num_models"])]
  return join_models(meta["simulator"], models), meta


def latest_state(workdir: str, params) -> dict:
  """The simulator's state_dict in a run's latest checkpoint (its global model is
  state["method_state"]["model"]); for tests and notebooks."""
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"))
  try:
    state, _ = restore_checkpoint(ckpt, ckpt.latest_step(), params)
  finally:
    ckpt.close()
  return state


# ---- records ----------------------------------------------------------------------------------
def tick_record(tick: dict, previous: Optional[dict], position: int, num_parameters: int) -> dict:
  """One metrics.jsonl record from a tick of EngineSimulator."""
  prev = previous or {"train_loss_sum": 0.0, "train_count": 0.0}
  count = tick["train_count"] - prev["train_count"]
  train_loss = (tick["train_loss_sum"] - prev["train_loss_sum"]) / count if count else math.nan
  client = np.asarray(tick["client_accuracy"], np.float64)
  finite = client[np.isfinite(client)]
  record = {
      "round": position + 1, "tick": tick["tick"], "final": tick["final"],
      "virtual_time": tick["virtual_time"], "wall_seconds": tick["wall_time"],
      "local_steps": tick["local_steps"],
      "test_accuracy": tick["accuracy"], "test_loss": tick["test_loss"],
      "train_loss": train_loss,
      "client_test_accuracy_mean": tick["client_accuracy_mean"],
      "client_test_accuracy_var": tick["client_accuracy_var"],
      "client_test_accuracy_min": float(finite.min()) if finite.size else math.nan,
      "client_test_accuracy": client.tolist(),
      "global_updates": tick["global_updates"],
      "uploads": tick["models_up"], "downloads": tick["models_down"],
      "bytes_up": tick["bytes_up"], "bytes_down": tick["bytes_down"],
      "comm_bytes": tick["bytes_up"] + tick["bytes_down"],
      "comm_floats_up": num_parameters * tick["models_up"]
                        + PROBE_UPLOAD_VALUES * tick["probes_up"],
      "comm_floats_down": num_parameters * (tick["models_down"] + tick["probes_down"]),
  }
  if tick["tier_updates"] is not None:
    record["tier_updates"] = list(tick["tier_updates"])
  return record


def ticks_from_records(records: list) -> list:
  """The tick view `simulation.robustness_metrics.summarize` reads, from metrics.jsonl records."""
  return [{"virtual_time": r["virtual_time"], "accuracy": r["test_accuracy"],
           "client_accuracy_var": r["client_test_accuracy_var"], "bytes_up": r["bytes_up"],
           "bytes_down": r["bytes_down"]} for r in records]


def plot_virtual_time(workdir: str, records: list, title: str = "") -> str:
  """Accuracy over virtual time (pooled, and the per-client mean +- std band), as a PNG."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  t = np.array([r["virtual_time"] for r in records], np.float64)
  acc = np.array([r["test_accuracy"] for r in records], np.float64)
  mean = np.array([r["client_test_accuracy_mean"] for r in records], np.float64)
  std = np.sqrt(np.array([r["client_test_accuracy_var"] for r in records], np.float64))
  fig, ax = plt.subplots(figsize=(5.5, 3.5), dpi=100)
  ax.plot(t, acc, label="accuracy (pooled local test sets)")
  ax.fill_between(t, mean - std, mean + std, alpha=0.2, label="per-client mean ± std")
  ax.set_xlabel("virtual time (s)")
  ax.set_ylabel("test accuracy")
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  path = os.path.join(workdir, PLOT_FILE)
  fig.savefig(path)
  plt.close(fig)
  return path


def _summary(options: ClockOptions, sim: EngineSimulator, records: list,
             num_parameters: int) -> dict:
  last = records[-1]
  accs = [r["test_accuracy"] for r in records]
  measures = sim.summary(options.target_accuracy)
  return {
      "algorithm": options.algorithm or options.method, "method": options.method,
      "dataset": options.dataset, "model": options.model, "seed": options.system.seed,
      "final_test_accuracy": accs[-1], "best_test_accuracy": max(accs),
      "final_test_loss": last["test_loss"], "rounds": len(records),
      "local_steps": last["local_steps"], "wall_seconds": sim.wall_elapsed,
      "num_parameters": num_parameters, "client_devices": sim.trainer.mesh.size,
      "comm_floats_up": last["comm_floats_up"],
      "comm_floats_down": last["comm_floats_down"], "comm_bytes": last["comm_bytes"],
      "bytes_up": last["bytes_up"], "bytes_down": last["bytes_down"],
      "client_test_accuracy_mean": last["client_test_accuracy_mean"],
      "client_test_accuracy_var": last["client_test_accuracy_var"],
      "tier_updates": last.get("tier_updates"), "target_accuracy": options.target_accuracy,
      "tier_sizes": np.bincount(sim.setup.tiers).tolist(),
      "unstable_clients": np.flatnonzero(np.isfinite(sim.dropout_times)).tolist(),
      "trainer_calls": sim.trainer.num_calls, **measures,
  }


def run(options: ClockOptions, fed, model, params, workdir: str, *, config_json: dict,
        mesh=None, augment: Optional[Callable] = None,
        stop_after_tick: Optional[int] = None) -> dict:
  """Runs (or resumes) one run on the clock, writing the run contract into `workdir`.

  Args:
    options, fed, model, params, mesh, augment: see `build_simulator`.
    workdir: the run directory (the caller has checked that it holds no other run).
    config_json: the resolved config, written to config.json on the first start.
    stop_after_tick: stop, as if interrupted, after the checkpoint that follows tick
      index `stop_after_tick` (tests of resume).

  Returns:
    The summary (also written to summary.json), or {"interrupted_after_tick": i}.
  """
  sim = build_simulator(options, fed, model, params, mesh=mesh, augment=augment)
  num_parameters = int(sum(np.size(x) for x in jax.tree_util.tree_leaves(params)))
  primary = jax.process_index() == 0
  os.makedirs(workdir, exist_ok=True)
  config_path = os.path.join(workdir, "config.json")
  if primary and not os.path.exists(config_path):
    metrics.write_json(config_path, config_json)
  writer = metrics.JsonlWriter(os.path.join(workdir, "metrics.jsonl"))
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"))
  latest = ckpt.latest_step()
  if latest is not None:
    state, meta = restore_checkpoint(ckpt, latest, params)
    sim.load_state_dict(state)
    sim.trainer.load_state_dict(meta["trainer"])
    records = writer.truncate_after(meta["num_ticks"]) if primary else writer.read()
  else:
    records = writer.truncate_after(0) if primary else []
  saved_step = latest
  times = tick_times(options.system)
  every = options.checkpoint_every_ticks
  while not sim.finished:
    end = min(sim.next_tick + every - 1, len(times) - 1)
    if stop_after_tick is not None:
      end = min(end, max(stop_after_tick, sim.next_tick))
    sim.run(until=times[end])
    for position in range(len(records), len(sim.ticks)):
      previous = sim.ticks[position - 1] if position else None
      records.append(tick_record(sim.ticks[position], previous, position, num_parameters))
      if primary:
        writer.write(records[-1])
      r = records[-1]
      logger.info("tick %d  virtual %.0f/%.0fs  test_acc %.4f  client_var %.5f  updates %d  "
                  "MB %.1f  wall %.1fs", r["tick"], r["virtual_time"],
                  options.system.max_virtual_time_s, r["test_accuracy"],
                  r["client_test_accuracy_var"], r["global_updates"], r["comm_bytes"] / 1e6,
                  r["wall_seconds"])
    if len(sim.event_log) != saved_step:
      save_checkpoint(ckpt, sim, params)
      saved_step = len(sim.event_log)
    if stop_after_tick is not None and sim.ticks and (
        sim.ticks[-1]["tick"] >= stop_after_tick) and not sim.finished:
      ckpt.close()
      return {"interrupted_after_tick": sim.ticks[-1]["tick"]}
  ckpt.close()
  summary = _summary(options, sim, records, num_parameters)
  if primary:
    metrics.write_json(os.path.join(workdir, "summary.json"), summary)
  if primary and options.plots:
    title = f"{options.algorithm or options.method} / {options.dataset}"
    plot_virtual_time(workdir, records, title)
    metrics.plot_run(workdir, records, title=title)
  return summary
