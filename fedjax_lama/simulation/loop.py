"""The virtual clock and event loop of the asynchronous/tiered simulation.

Simulates the tiered system of FedAT (Chai et al., SC'21) and its asynchronous and
synchronous baselines (FedAvg, FedProx, FedAsync, TiFL): a heap of
(time, class, seq, payload) events, the job life cycle with lost jobs, the
method hooks, evaluation ticks, the stopping rules, the message log, deferred
vectorised training through an injected Trainer, and an exact
`state_dict`/`load_state_dict` (the clock, the heap and its counter, the
participation indices, the in-flight jobs, the method's state, the logs and the
tick records).

Job life cycle. dispatch(k) at t0: the download is recorded (its bytes at t0);
tau_down, tau_comp and delta are drawn; if t_c = t0 + tau_down + tau_comp +
delta >= D_k the job is lost and nothing is pushed; otherwise COMPUTE_DONE is
pushed at t_c and the job is queued for training. At COMPUTE_DONE the job's
trained model must exist: every queued job is trained then, in dispatch order,
in calls of at most `max_clients_per_call` jobs (a job's result depends only on
its inputs, so deferring is exact, and a synchronous round is one call). The
upload is encoded, tau_up drawn; if t_c + tau_up >= D_k the job is lost,
otherwise ARRIVAL is pushed. At ARRIVAL the upload is recorded and the method's
`on_arrival` receives the decoded model.
"""
import dataclasses
import math
import time as wall_clock
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from fedjax_lama.simulation import robustness_metrics as metrics_lib
from fedjax_lama.simulation.message_codecs import RawCodec
from fedjax_lama.simulation.system_config import SystemConfig
from fedjax_lama.simulation.events import (DIRECTIONS, DOWN, MESSAGE_KINDS, MODEL, UP, EventClass,
                                           EventQueue, JobEvent)
from fedjax_lama.simulation.interfaces import (Codec, Evaluator, ModelAlgebra, PyTree, Trainer,
                                               TrainJob)
from fedjax_lama.simulation.latency import job_steps
from fedjax_lama.simulation.methods.base import Arrival, Method
from fedjax_lama.simulation.pytree import NumpyAlgebra
from fedjax_lama.simulation.tiers import build_setup

EpochsArg = Union[None, int, Callable[[int, int], int]]

_FORMAT = 1


def tick_times(config: SystemConfig) -> list[float]:
  """Evaluation times: multiples of eval_interval_s in [0, budget], plus the budget."""
  interval, budget = float(config.eval_interval_s), float(config.max_virtual_time_s)
  n = int(math.floor(budget / interval))
  while (n + 1) * interval <= budget:  # guard the float division both ways
    n += 1
  while n > 0 and n * interval > budget:
    n -= 1
  times = [g * interval for g in range(n + 1)]
  if times[-1] < budget:
    times.append(budget)
  return times


def _plain(value: Any) -> Any:
  """Tuples -> lists, recursively (config records in the state dict)."""
  if isinstance(value, dict):
    return {k: _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  return value


@dataclasses.dataclass
class _Job:
  """An in-flight job (dispatched, not yet arrived or lost)."""
  job_id: int
  client: int
  index: int
  context: tuple
  dispatch_time: float
  num_epochs: int
  prox_coeff: float
  precision: Optional[int]
  bytes_down: int
  compute_done_time: float
  status: str                      # "pending" -> "trained" -> "uploading"
  start_model: Any = None          # pending only
  anchor: Any = None               # pending only
  trained_model: Any = None        # trained only
  num_steps: int = -1
  upload_model: Any = None         # uploading only (the decoded upload)
  bytes_up: int = -1

  def to_state(self) -> dict:
    # Shallow on purpose: models are immutable values, copying them is not needed.
    state = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    state["context"] = list(self.context)
    return state

  @classmethod
  def from_state(cls, state: dict) -> "_Job":
    state = dict(state)
    state["context"] = tuple(int(c) for c in state["context"])
    return cls(**state)


class Simulator:
  """Runs one method on the simulated system.

  Args:
    config: the system and run configuration.
    method: the method (methods/*.py); bound to this simulator.
    num_examples: n_k, training examples of every client (length K).
    initial_model: w0 (a pytree; numpy arrays with the default algebra).
    trainer: local training (interfaces.Trainer).
    evaluator: evaluation on every client's test set (interfaces.Evaluator).
    algebra: weighted sums of models (default: NumpyAlgebra).
    codec: message encoding (default: RawCodec, uncompressed only).
  """

  def __init__(self, config: SystemConfig, method: Method, *, num_examples: Sequence[int],
               initial_model: PyTree, trainer: Trainer, evaluator: Evaluator,
               algebra: Optional[ModelAlgebra] = None, codec: Optional[Codec] = None):
    if not isinstance(config, SystemConfig):
      raise ValueError(f"config must be a SystemConfig, got {type(config).__name__}")
    num_examples = np.asarray(num_examples)
    if (num_examples.shape != (config.num_clients,) or
        not np.issubdtype(num_examples.dtype, np.integer) or np.any(num_examples < 1)):
      raise ValueError(f"num_examples must hold num_clients={config.num_clients} ints >= 1, "
                       f"got shape {num_examples.shape} and dtype {num_examples.dtype}")
    self.config = config
    self.seed = config.seed
    self.method = method
    self.num_examples = num_examples.astype(np.int64)
    self.initial_model = initial_model
    self.trainer = trainer
    self.evaluator = evaluator
    self.algebra = algebra if algebra is not None else NumpyAlgebra()
    self.codec = codec if codec is not None else RawCodec()
    _, self.raw_model_bytes = self.codec.roundtrip(initial_model, None)
    self.setup, self.latency = build_setup(config, self.num_examples, self.raw_model_bytes)
    self.dropout_times = self.setup.dropout_times
    self._tick_times = tick_times(config)
    self._reset_state()
    method.bind(self)

  def _reset_state(self) -> None:
    num_clients = self.config.num_clients
    self.queue = EventQueue()
    self.now = 0.0
    self.started = False
    self.finished = False
    self.stop_reason: Optional[str] = None
    self.wall_elapsed = 0.0
    self._wall_resumed_at = None
    self.participation = np.zeros(num_clients, np.int64)
    self.departed = np.zeros(num_clients, bool)
    self.jobs: dict[int, _Job] = {}
    self.pending: list[int] = []
    self.next_job_id = 0
    self.num_train_calls = 0
    self.event_log: list[tuple] = []
    self._messages: tuple[list, ...] = ([], [], [], [], [])  # time, direction, bytes, client, kind
    self.bytes_up = 0
    self.bytes_down = 0
    self.ticks: list[dict] = []
    self.next_tick = 0

  # ================================================================== method API

  def is_departed(self, client: int) -> bool:
    """Whether the server has seen client k's DROPOUT (at exactly D_k)."""
    return bool(self.departed[client])

  def alive_clients(self, candidates: Optional[Sequence[int]] = None) -> list[int]:
    """The candidates (default: all clients) that have not departed, in id order."""
    if candidates is None:
      candidates = range(self.config.num_clients)
    return sorted(int(k) for k in candidates if not self.departed[k])

  def broadcast(self, clients: Sequence[int], model: PyTree, context: Sequence[int], *,
                precision: Optional[int], prox_coeff: float,
                num_epochs: EpochsArg = None) -> list[int]:
    """Dispatches one job per client, all starting from `model`, at `now`.

    The download is encoded once (at `precision`) and counted once per client
    (every client receives its own copy); the decoded model is both the start point and the proximal anchor.

    Args:
      clients: clients to dispatch, in dispatch order; none may have departed.
      model: the model sent down.
      context: the method's tag of these jobs (ints, e.g. (tier, round)); it is
        returned with every arrival and written to the event log.
      precision: codec precision of the download and of the uploads (None = raw).
      prox_coeff: proximal coefficient of the local objective.
      num_epochs: None (the config's local_epochs), an int, or a function
        (k, j) -> epochs of job j of client k.

    Returns:
      The job ids, in dispatch order.
    """
    if not clients:
      return []
    decoded, num_bytes = self.codec.roundtrip(model, precision)
    return [self._dispatch(int(k), decoded, int(num_bytes), tuple(int(c) for c in context),
                           precision, float(prox_coeff), num_epochs) for k in clients]

  def record_message(self, direction: int, num_bytes: int, client: int, kind: int) -> None:
    """Appends one message to the log at `now` (DOWN/UP, MODEL/ACCURACY_PROBE)."""
    self._messages[0].append(self.now)
    self._messages[1].append(int(direction))
    self._messages[2].append(int(num_bytes))
    self._messages[3].append(int(client))
    self._messages[4].append(int(kind))
    if direction == UP:
      self.bytes_up += int(num_bytes)
    else:
      self.bytes_down += int(num_bytes)

  def evaluate(self, model: PyTree) -> tuple[np.ndarray, np.ndarray]:
    """(correct, count) of every client's test set (the injected evaluator)."""
    correct, count = self.evaluator.evaluate(model)
    return np.asarray(correct, np.int64), np.asarray(count, np.int64)

  def schedule_timer(self, time: float, token: int) -> None:
    """Calls method.on_timer(token) at virtual time `time` (>= now)."""
    if time < self.now:
      raise ValueError(f"timer at {time} is in the past (now = {self.now})")
    self.queue.push(time, EventClass.JOB, (JobEvent.TIMER, token))

  # ================================================================== jobs

  def _num_epochs(self, num_epochs: EpochsArg, client: int, index: int) -> int:
    if num_epochs is None:
      return self.config.local_epochs
    if callable(num_epochs):
      return int(num_epochs(client, index))
    return int(num_epochs)

  def _log(self, seq: int, kind: str, client: int, index: int, context: tuple = ()) -> None:
    self.event_log.append((seq, self.now, kind, client, index, context))

  def _dispatch(self, client: int, model: PyTree, bytes_down: int, context: tuple,
                precision: Optional[int], prox_coeff: float, num_epochs: EpochsArg) -> int:
    if self.departed[client]:
      raise RuntimeError(f"client {client} departed at {self.dropout_times[client]} and "
                         "cannot be dispatched")
    index = int(self.participation[client])
    self.participation[client] += 1
    job_id = self.next_job_id
    self.next_job_id += 1
    t0 = self.now
    self.record_message(DOWN, bytes_down, client, MODEL)
    epochs = self._num_epochs(num_epochs, client, index)
    steps = job_steps(self.num_examples[client], self.config.batch_size, epochs)
    tau_down = self.latency.download_time(client, index, bytes_down)
    tau_comp = self.latency.compute_time(client, index, steps)
    delta = self.latency.delay(client, index)
    t_c = t0 + tau_down
    t_c = t_c + tau_comp
    t_c = t_c + delta
    self._log(-1, "dispatch", client, index, context)
    if t_c >= self.dropout_times[client]:
      self._log(-1, "lost", client, index, context)
      return job_id
    self.jobs[job_id] = _Job(job_id, client, index, context, t0, epochs, prox_coeff, precision,
                             bytes_down, t_c, "pending", start_model=model, anchor=model)
    self.pending.append(job_id)
    self.queue.push(t_c, EventClass.JOB, (JobEvent.COMPUTE_DONE, job_id))
    return job_id

  def _train_pending(self) -> None:
    """Trains every queued job, in dispatch order, in calls of bounded size."""
    ids, self.pending = self.pending, []
    per_call = self.config.max_clients_per_call
    for start in range(0, len(ids), per_call):
      batch = [self.jobs[i] for i in ids[start:start + per_call]]
      results = list(self.trainer.train([
          TrainJob(j.client, j.index, j.start_model, j.anchor, j.num_epochs, j.prox_coeff)
          for j in batch]))
      self.num_train_calls += 1
      if len(results) != len(batch):
        raise RuntimeError(f"trainer returned {len(results)} results for {len(batch)} jobs")
      for job, result in zip(batch, results):
        expected = job_steps(self.num_examples[job.client], self.config.batch_size,
                             job.num_epochs)
        if int(result.num_steps) != expected:
          raise RuntimeError(
              f"job (k={job.client}, j={job.index}) ran {int(result.num_steps)} valid steps, but "
              f"its compute time assumed E * ceil(n_k / B) = {expected}")
        job.trained_model, job.num_steps = result.model, int(result.num_steps)
        job.start_model = job.anchor = None
        job.status = "trained"

  def _on_compute_done(self, seq: int, job_id: int) -> None:
    job = self.jobs[job_id]
    self._log(seq, "compute_done", job.client, job.index, job.context)
    if job.status == "pending":
      self._train_pending()
    decoded, num_bytes = self.codec.roundtrip(job.trained_model, job.precision)
    tau_up = self.latency.upload_time(job.client, job.index, int(num_bytes))
    arrival = self.now + tau_up
    job.trained_model = None
    if arrival >= self.dropout_times[job.client]:
      del self.jobs[job_id]
      self._log(-1, "lost", job.client, job.index, job.context)
      return
    job.upload_model, job.bytes_up, job.status = decoded, int(num_bytes), "uploading"
    self.queue.push(arrival, EventClass.JOB, (JobEvent.ARRIVAL, job_id))

  def _on_arrival(self, seq: int, job_id: int) -> None:
    job = self.jobs.pop(job_id)
    self._log(seq, "arrival", job.client, job.index, job.context)
    self.record_message(UP, job.bytes_up, job.client, MODEL)
    self.method.on_arrival(Arrival(
        job_id=job.job_id, client=job.client, index=job.index, context=job.context,
        model=job.upload_model, num_examples=int(self.num_examples[job.client]),
        dispatch_time=job.dispatch_time, num_epochs=job.num_epochs))

  # ================================================================== ticks

  def _wall_time(self) -> float:
    if self._wall_resumed_at is None:
      return self.wall_elapsed
    return self.wall_elapsed + (wall_clock.perf_counter() - self._wall_resumed_at)

  def _record_tick(self, index: int, final: bool = False) -> None:
    correct, count = self.evaluate(self.method.global_model())
    stats = metrics_lib.accuracy_stats(correct, count)
    tiers = self.method.tier_updates()
    self.ticks.append({
        "tick": index,
        "virtual_time": self.now,
        "wall_time": self._wall_time(),
        "global_updates": int(self.method.global_updates),
        "tier_updates": None if tiers is None else [int(t) for t in tiers],
        "bytes_up": self.bytes_up,
        "bytes_down": self.bytes_down,
        "final": final,
        **stats,
    })

  def _on_tick(self, seq: int, index: int) -> None:
    self._log(seq, "tick", -1, index)
    self._record_tick(index)
    self.method.on_tick(index)
    self.next_tick = index + 1
    if self.next_tick < len(self._tick_times):
      self.queue.push(self._tick_times[self.next_tick], EventClass.TICK, (self.next_tick,))

  # ================================================================== the loop

  def _start(self) -> None:
    for k in np.flatnonzero(np.isfinite(self.dropout_times)):
      self.queue.push(self.dropout_times[k], EventClass.DROPOUT, (int(k),))
    self.queue.push(self._tick_times[0], EventClass.TICK, (0,))
    self.started = True
    self.method.on_start()

  def _process(self, event) -> None:
    if event.cls == EventClass.DROPOUT:
      client = event.payload[0]
      self.departed[client] = True
      self._log(event.seq, "dropout", client, -1)
      self.method.on_dropout(client)
    elif event.cls == EventClass.TICK:
      self._on_tick(event.seq, event.payload[0])
    else:
      kind, ident = event.payload
      if kind == JobEvent.COMPUTE_DONE:
        self._on_compute_done(event.seq, ident)
      elif kind == JobEvent.ARRIVAL:
        self._on_arrival(event.seq, ident)
      else:
        self._log(event.seq, "timer", -1, ident)
        self.method.on_timer(ident)

  def _finish(self, reason: str) -> None:
    self.finished = True
    self.stop_reason = reason

  def run(self, *, until: Optional[float] = None, max_events: Optional[int] = None) -> bool:
    """Processes events until the run ends or an interruption point.

    Args:
      until: stop before the first event later than this virtual time.
      max_events: stop after processing this many events (in this call).

    Returns:
      True when the run has finished (budget, max_global_updates or an empty
      queue), False when it was interrupted by `until` or `max_events`.
    """
    if self.finished:
      return True
    self._wall_resumed_at = wall_clock.perf_counter()
    try:
      if not self.started:
        self._start()
      budget = float(self.config.max_virtual_time_s)
      max_updates = self.config.max_global_updates
      processed = 0
      while True:
        if not self.queue:
          self._finish("queue_empty")
          break
        upcoming = self.queue.peek()
        if upcoming.time > budget:
          self._finish("time_budget")
          break
        if (until is not None and upcoming.time > until) or (
            max_events is not None and processed >= max_events):
          break
        event = self.queue.pop()
        self.now = event.time
        self._process(event)
        processed += 1
        if max_updates is not None and self.method.global_updates >= max_updates:
          self._finish("max_global_updates")
          last = self.ticks[-1] if self.ticks else None
          if last is None or last["virtual_time"] != self.now or (
              last["global_updates"] != self.method.global_updates):
            self._record_tick(len(self.ticks), final=True)
          break
    finally:
      self.wall_elapsed = self._wall_time()
      self._wall_resumed_at = None
    return self.finished

  # ================================================================== outputs

  @property
  def messages(self) -> list[tuple]:
    """The message log: (time, direction, bytes, client, kind) per message."""
    time, direction, num_bytes, client, kind = self._messages
    return [(t, DIRECTIONS[d], b, c, MESSAGE_KINDS[m])
            for t, d, b, c, m in zip(time, direction, num_bytes, client, kind)]

  def summary(self, target: Optional[float] = None) -> dict:
    """The per-run measures of FedAT's Sec. 7, plus how the run ended."""
    out = metrics_lib.summarize(self.ticks, target)
    out.update(method=self.method.name, stop_reason=self.stop_reason,
               global_updates=int(self.method.global_updates),
               virtual_time=self.now, wall_time=self.wall_elapsed,
               num_train_calls=self.num_train_calls)
    return out

  # ================================================================== resume

  def state_dict(self) -> dict:
    """Everything needed to continue the run exactly, as plain data.

    Numbers, strings, lists, dicts and numpy arrays only; models stay pytrees
    (as the trainer and the algebra produce them). Call it between `run` calls.
    """
    time, direction, num_bytes, client, kind = self._messages
    return {
        "format": _FORMAT,
        "config": _plain(dataclasses.asdict(self.config)),
        "method": self.method.name,
        "now": self.now,
        "started": self.started,
        "finished": self.finished,
        "stop_reason": self.stop_reason,
        "wall_elapsed": self.wall_elapsed,
        "queue": self.queue.state_dict(),
        "participation": self.participation.copy(),
        "departed": self.departed.copy(),
        "next_job_id": self.next_job_id,
        "pending": list(self.pending),
        "jobs": [self.jobs[i].to_state() for i in sorted(self.jobs)],
        "num_train_calls": self.num_train_calls,
        "event_log": [[s, t, k, c, i, list(ctx)] for s, t, k, c, i, ctx in self.event_log],
        "messages": {"time": np.asarray(time, np.float64),
                     "direction": np.asarray(direction, np.int8),
                     "bytes": np.asarray(num_bytes, np.int64),
                     "client": np.asarray(client, np.int64),
                     "kind": np.asarray(kind, np.int8)},
        "bytes_up": self.bytes_up,
        "bytes_down": self.bytes_down,
        "ticks": [dict(t, client_accuracy=np.array(t["client_accuracy"]),
                       tier_updates=None if t["tier_updates"] is None else list(t["tier_updates"]))
                  for t in self.ticks],
        "next_tick": self.next_tick,
        "method_state": self.method.state_dict(),
    }

  def load_state_dict(self, state: dict) -> None:
    """Restores a `state_dict` taken from a run with the same config and method."""
    if state.get("format") != _FORMAT:
      raise ValueError(f"unknown simulator state format {state.get('format')!r}")
    if state["config"] != _plain(dataclasses.asdict(self.config)):
      raise ValueError("the state was saved with a different SystemConfig")
    if state["method"] != self.method.name:
      raise ValueError(f"the state is of method {state['method']!r}, not {self.method.name!r}")
    self._reset_state()
    self.now = float(state["now"])
    self.started = bool(state["started"])
    self.finished = bool(state["finished"])
    self.stop_reason = state["stop_reason"]
    self.wall_elapsed = float(state["wall_elapsed"])
    self.queue.load_state_dict(state["queue"])
    self.participation = np.array(state["participation"], np.int64)
    self.departed = np.array(state["departed"], bool)
    self.next_job_id = int(state["next_job_id"])
    self.pending = [int(i) for i in state["pending"]]
    self.jobs = {int(j["job_id"]): _Job.from_state(j) for j in state["jobs"]}
    self.num_train_calls = int(state["num_train_calls"])
    self.event_log = [(int(s), float(t), str(k), int(c), int(i), tuple(int(x) for x in ctx))
                      for s, t, k, c, i, ctx in state["event_log"]]
    m = state["messages"]
    self._messages = ([float(x) for x in m["time"]], [int(x) for x in m["direction"]],
                      [int(x) for x in m["bytes"]], [int(x) for x in m["client"]],
                      [int(x) for x in m["kind"]])
    self.bytes_up = int(state["bytes_up"])
    self.bytes_down = int(state["bytes_down"])
    self.ticks = [dict(t, client_accuracy=np.array(t["client_accuracy"]),
                       tier_updates=None if t["tier_updates"] is None else list(t["tier_updates"]))
                  for t in state["ticks"]]
    self.next_tick = int(state["next_tick"])
    self.method.load_state_dict(state["method_state"])
