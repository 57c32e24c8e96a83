"""The run contract on the virtual clock: FedAT and its baselines end to end.

`run(options, fed, model, params, workdir, ...)` builds the event-driven simulator
(simulation/loop.py) with the engine's trainer, evaluator and algebra (engine_adapter.py)
and the polyline codec, runs it one evaluation tick at a time and writes a run's outputs
(FedAT: Chai et al., "FedAT: A High-Performance and Communication-Efficient Federated
Learning System with Asynchronous Tiers", SC'21):

- metrics.jsonl: one record per evaluation tick, written as it happens: `virtual_time` beside
  `wall_seconds`, `test_accuracy` (pooled over every client's local test split),
  `test_loss`, `train_loss` (jobs trained since the previous tick), per-client accuracy
  (`client_test_accuracy` and its mean / population variance / min), `bytes_up`,
  `bytes_down`, `comm_bytes`, `comm_floats_up` / `_down` (parameters carried), update
  counts (`global_updates`, FedAT's `tier_updates`, `uploads`, `downloads`),
  `local_steps`. `round` counts the records (1-based).
- summary.json: the contract's keys and the robustness measures of FedAT's Sec. 7 (best
  accuracy, variance
  measures, time and bytes to `target_accuracy` when one is set).
- PNG plots (fedjax_lama.plots): accuracy over virtual time in seconds, and over traffic.
- orbax checkpoints every `checkpoint_every_ticks` ticks: the models of the simulator's
  `state_dict` as pytrees, the rest of it (clock, event queue, in-flight jobs, logs,
  tick records) and the trainer's counters as JSON. Running again on the same workdir
  resumes exactly: the in-flight jobs keep their trainer calls, so the resumed run
  computes exactly what the uninterrupted one does.

The config is read by the training entry point; this module takes typed arguments.
"""
import math
import os
import time
from typing import Any, Callable, Optional

import jax
import numpy as np

from fedjax_lama import checkpointing, divergence, metrics, plots, progress
from fedjax_lama.engine import sharding
from fedjax_lama.simulation import engine_adapter
from fedjax_lama.simulation.message_codecs import PolylineCodec
from fedjax_lama.simulation.events import MODEL, UP
from fedjax_lama.simulation.loop import Simulator, tick_times
from fedjax_lama.simulation.methods import METHODS
from fedjax_lama.simulation.run_options import ClockOptions
from fedjax_lama.tree import tree_size

_FORMAT = 1
PROBE_UPLOAD_VALUES = 2  # TiFL's accuracy probe uploads two int32 counts (Chai et al., TiFL, HPDC'20)
PLOT_FILE = plots.VIRTUAL_TIME_FILE


class NonFiniteTraining(Exception):
  """A training call returned a non-finite loss or model (raised inside the simulator, turned
  into TrainingDiverged by `run`, which knows the checkpoints)."""

  def __init__(self, virtual_time: float, what: str):
    super().__init__(what)
    self.virtual_time, self.what = virtual_time, what


class EngineSimulator(Simulator):
  """The Simulator, with the engine's host counters added to every tick record.

  Extra keys per tick: `test_loss` (the evaluator's pooled loss at that tick),
  cumulative `train_loss_sum`, `train_count`, `local_steps` (trainer totals) and the
  cumulative message counts `models_up`, `models_down`, `probes_up`, `probes_down`.
  """

  def _train_pending(self) -> None:
    """Trains the queued jobs, then stops the run if their loss or models are not finite
    (before a non-finite upload reaches the codec or the server)."""
    jobs = [self.jobs[i] for i in self.pending]
    self._heartbeat(len(jobs))
    super()._train_pending()
    if not math.isfinite(float(self.trainer.loss_sum)):
      raise NonFiniteTraining(self.now, f"train_loss is {float(self.trainer.loss_sum)}")
    if not divergence.all_finite([job.trained_model for job in jobs]):
      raise NonFiniteTraining(self.now, "a trained client model holds non-finite values")

  _HEARTBEAT_S = 10.0
  _last_heartbeat = None
  _call_sizes = frozenset()

  def _heartbeat(self, num_jobs: int) -> None:
    """A progress line between ticks: before a padded call size this simulator has not
    trained yet (it compiles), or when the last such line is _HEARTBEAT_S old."""
    per_call = self.config.max_clients_per_call
    chunks = [min(per_call, num_jobs - start) for start in range(0, num_jobs, per_call)]
    trainer = self.trainer
    sizes = {trainer.padded_size(n, trainer.call_mesh(n)) for n in chunks}
    new = sizes - self._call_sizes
    now = time.perf_counter()
    if new or self._last_heartbeat is None or now - self._last_heartbeat >= self._HEARTBEAT_S:
      progress.info("virtual %.1fs: training %d client jobs%s (%d training calls so far)",
                    self.now, num_jobs,
                    f", compiling calls of {sorted(new)} clients" if new else "",
                    trainer.num_calls)
      self._last_heartbeat = now
      self._call_sizes = self._call_sizes | sizes

  def _record_tick(self, index: int, final: bool = False) -> None:
    if not self.ticks or self._last_heartbeat is None:
      progress.info("virtual %.1fs: evaluating tick %d on every client's test split (the "
                    "first evaluation compiles)", self.now, index)
      self._last_heartbeat = time.perf_counter()
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
    options: the typed run options (config.clock_options).
    fed: the federation; fed.client_test holds every client's local test rows of the
      training arrays (config.local_test_fraction > 0).
    model, params: the flax module and the initial model w0 (shared by every method).
    mesh: the "clients" mesh (default: every device).
    augment: the engine's augmentation hook, if any.
  """
  if fed.client_test is None or fed.client_test_in != "train":
    raise ValueError("runs on the clock evaluate every client's local test split: build the "
                     "federation with a local test fraction (FedAT's 80/20 split per client)")
  mesh = mesh if mesh is not None else sharding.client_mesh()
  ds, system = fed.dataset, options.system
  trainer = engine_adapter.EngineTrainer(
      model, ds.train_x, ds.train_y, fed.client_train, seed=system.seed,
      batch_size=system.batch_size, max_epochs=system.local_epochs, lr=options.local_lr,
      local_tx=engine_adapter.local_solver(options.local_optimizer, options.local_momentum),
      mesh=mesh, call_size_multiple=options.call_size_multiple, augment=augment,
      unroll=options.unroll, label_smoothing=options.label_smoothing, plan=options.platform)
  evaluator = engine_adapter.LocalTestEvaluator(model, ds.train_x, ds.train_y, fed.client_test,
                                                options.eval_batch_size)
  method = METHODS[options.method](options.method_config)
  initial = jax.tree.map(np.asarray, params)
  return EngineSimulator(system, method, num_examples=[len(ix) for ix in fed.client_train],
                         initial_model=initial, trainer=trainer, evaluator=evaluator,
                         algebra=engine_adapter.JaxAlgebra(),
                         codec=PolylineCodec(mode=options.polyline_mode))


# ---- checkpoints: models as pytrees, the rest as JSON ----------------------------------------
def _is_model(value: Any, params_def) -> bool:
  return isinstance(value, dict) and jax.tree.structure(value) == params_def


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
  state, models = split_models(sim.state_dict(), jax.tree.structure(params))
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


def _last_checkpoint(ckpt: checkpointing.Checkpointer) -> Optional[str]:
  """The tick a rerun resumes after, read from the checkpoint on disk (None: none yet)."""
  step = ckpt.latest_step()
  if step is None:
    return None
  return f"tick {ckpt.restore_meta(step)['num_ticks'] - 1}"


def start_loss(records) -> Optional[float]:
  """The run's starting training loss: that of its first tick after which a job had trained
  (tick 0, at t = 0, trains nobody); None before any. The records are on disk, so a resumed
  run compares with the same value as an uninterrupted one."""
  losses = (r.get("train_loss") for r in records)
  return next((v for v in losses if v is not None and math.isfinite(v)), None)


def _check_tick(sim: EngineSimulator, tick: dict, previous: Optional[dict], record: dict,
                ckpt: checkpointing.Checkpointer, ckpt_dir: str, advice: str,
                start: Optional[float] = None, max_loss_growth: float = 0.0) -> None:
  """Stops the run when a tick's losses, accuracy or global model are not finite, or its
  training loss exceeds `max_loss_growth` times the run's starting one, `start`."""
  trained = tick["train_count"] > (previous["train_count"] if previous else 0.0)
  where = f"tick {record['tick']} (virtual time {record['virtual_time']:.0f} s)"
  rerun = lambda: divergence.rerun_statement(_last_checkpoint(ckpt), ckpt_dir)
  divergence.check(
      where,
      {"train_loss": record["train_loss"] if trained else None,  # NaN by design when no job ran
       "test_loss": record["test_loss"], "test_accuracy": record["test_accuracy"]},
      sim.method.global_model(), rerun, advice)
  if trained:
    divergence.check_growth(where, record["train_loss"], start, max_loss_growth,
                            "config.max_loss_growth", rerun, advice)


def run(options: ClockOptions, fed, model, params, workdir: str, *, config_json: dict,
        mesh=None, augment: Optional[Callable] = None,
        stop_after_tick: Optional[int] = None, advice: str = "try a smaller local_lr",
        max_loss_growth: float = 0.0) -> dict:
  """Runs (or resumes) one run on the clock, writing the run contract into `workdir`.

  The simulator runs one evaluation tick at a time: each tick's record is appended to
  metrics.jsonl and logged as it happens, whatever the checkpoint interval. A checkpoint
  covers the records of its ticks; a rerun drops the records written after the latest
  checkpoint and computes them again, so the file never holds a tick twice or misses one.

  Args:
    options, fed, model, params, mesh, augment: see `build_simulator`.
    workdir: the run directory (the caller has checked that it holds no other run).
    config_json: the resolved config, written to config.json on the first start.
    stop_after_tick: stop, as if interrupted, after the checkpoint that follows tick
      index `stop_after_tick` (tests of resume).
    advice: the settings a divergence message suggests changing.
    max_loss_growth: a tick's training loss above this multiple of the run's starting one
      (`start_loss`) stops the run as diverged; 0: never.

  Returns:
    The summary (also written to summary.json), or {"interrupted_after_tick": i}.
  Raises:
    TrainingDiverged: a tick's loss, accuracy or global model is not finite, or its training
      loss grew past max_loss_growth times the starting one.
  """
  sim = build_simulator(options, fed, model, params, mesh=mesh, augment=augment)
  num_parameters = tree_size(params)
  primary = jax.process_index() == 0
  os.makedirs(workdir, exist_ok=True)
  config_path = os.path.join(workdir, "config.json")
  if primary and not os.path.exists(config_path):
    metrics.write_json(config_path, config_json)
  writer = metrics.JsonlWriter(os.path.join(workdir, "metrics.jsonl"))
  ckpt_dir = os.path.join(workdir, "checkpoints")
  ckpt = checkpointing.Checkpointer(ckpt_dir)
  latest = ckpt.latest_step()
  if latest is not None:
    with progress.Phase(f"restoring the latest checkpoint from {workdir}"):
      state, meta = restore_checkpoint(ckpt, latest, params)
      sim.load_state_dict(state)
      sim.trainer.load_state_dict(meta["trainer"])
    records = writer.truncate_after(meta["num_ticks"]) if primary else writer.read()
    progress.info("resuming after tick %d (virtual time %.0f s)", len(sim.ticks) - 1, sim.now)
  else:
    records = writer.truncate_after(0) if primary else []
  saved_step, saved_ticks = latest, len(sim.ticks)
  times = tick_times(options.system)
  every = options.checkpoint_every_ticks
  budget = options.system.max_virtual_time_s
  progress.info("simulating %.0f s of virtual time, an evaluation every %.0f s (%d ticks); the "
                "first training and evaluation calls compile", budget,
                options.system.eval_interval_s, len(times))
  wall_start, ticks_start = sim.wall_elapsed, len(sim.ticks)
  try:
    while not sim.finished:
      # One tick per call: its record and log line come out as soon as it is evaluated.
      try:
        sim.run(until=times[min(sim.next_tick, len(times) - 1)])
      except NonFiniteTraining as e:
        divergence.fail(
            f"virtual time {e.virtual_time:.1f} s (after tick {len(sim.ticks) - 1})", e.what,
            lambda: divergence.rerun_statement(_last_checkpoint(ckpt), ckpt_dir), advice)
      for position in range(len(records), len(sim.ticks)):
        tick, previous = sim.ticks[position], sim.ticks[position - 1] if position else None
        record = tick_record(tick, previous, position, num_parameters)
        _check_tick(sim, tick, previous, record, ckpt, ckpt_dir, advice, start_loss(records),
                    max_loss_growth)
        records.append(record)
        if primary:
          writer.write(record)
        done, left = len(sim.ticks) - ticks_start, max(len(times) - len(sim.ticks), 0)
        eta = progress.eta_seconds(sim.wall_elapsed - wall_start, done, left)
        progress.info("tick %d  virtual %.0f/%.0fs  test_acc %.4f  client_var %.5f  "
                      "updates %d  MB %.1f  wall %.1fs  ETA %.1fs", record["tick"],
                      record["virtual_time"], budget, record["test_accuracy"],
                      record["client_test_accuracy_var"], record["global_updates"],
                      record["comm_bytes"] / 1e6, record["wall_seconds"], eta)
      stop = stop_after_tick is not None and sim.ticks and (
          sim.ticks[-1]["tick"] >= stop_after_tick) and not sim.finished
      due = len(sim.ticks) - saved_ticks >= every or sim.finished or stop
      if due and len(sim.event_log) != saved_step:
        save_checkpoint(ckpt, sim, params)
        saved_step, saved_ticks = len(sim.event_log), len(sim.ticks)
      if stop:
        return {"interrupted_after_tick": sim.ticks[-1]["tick"]}
  finally:
    ckpt.close()
  summary = _summary(options, sim, records, num_parameters)
  if primary:
    with progress.Phase(f"writing {os.path.join(workdir, 'summary.json')}"):
      metrics.write_json(os.path.join(workdir, "summary.json"), summary)
  if primary and options.plots:
    with progress.Phase(f"writing plots to {workdir}"):
      plots.clock_plots(workdir, records, f"{options.algorithm or options.method} / "
                        f"{options.dataset}")
  return summary
