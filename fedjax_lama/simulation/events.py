"""The event queue of the virtual clock.

An event is (time, class, seq, payload); the queue pops the lexicographically
smallest tuple. At equal time DROPOUT (0) pops before JOB (1) before TICK (2),
so a tick sees every arrival and drop-out with its timestamp, and `seq`, a
global counter incremented at every push, makes equal (time, class) pop in
insertion (FIFO) order. Payloads are tuples of ints and are never compared
(seq is unique).
"""
import enum
import heapq
from typing import NamedTuple


# Message log codes (the log keeps time, direction, bytes, client, kind).
DOWN, UP = 0, 1
DIRECTIONS = ("down", "up")
MODEL, ACCURACY_PROBE = 0, 1
MESSAGE_KINDS = ("model", "accuracy_probe")


class EventClass(enum.IntEnum):
  DROPOUT = 0
  JOB = 1
  TICK = 2


class JobEvent(enum.IntEnum):
  """First payload entry of a JOB-class event."""
  COMPUTE_DONE = 0   # (COMPUTE_DONE, job_id)
  ARRIVAL = 1        # (ARRIVAL, job_id)
  TIMER = 2          # (TIMER, token): a method's own wake-up (TiFL's probe downloads)


class Event(NamedTuple):
  time: float
  cls: int
  seq: int
  payload: tuple


class EventQueue:
  """A binary heap of events with the global push counter."""

  def __init__(self):
    self._heap: list[Event] = []
    self.seq = 0

  def push(self, time: float, cls: EventClass, payload: tuple = ()) -> int:
    seq = self.seq
    self.seq += 1
    heapq.heappush(self._heap, Event(float(time), int(cls), seq, tuple(int(p) for p in payload)))
    return seq

  def pop(self) -> Event:
    return heapq.heappop(self._heap)

  def peek(self) -> Event:
    return self._heap[0]

  def __len__(self) -> int:
    return len(self._heap)

  def state_dict(self) -> dict:
    """The heap as stored (a valid heap list), and the counter."""
    return {"heap": [[e.time, e.cls, e.seq, list(e.payload)] for e in self._heap],
            "seq": self.seq}

  def load_state_dict(self, state: dict) -> None:
    self._heap = [Event(float(t), int(c), int(s), tuple(int(p) for p in payload))
                  for t, c, s, payload in state["heap"]]
    heapq.heapify(self._heap)  # a no-op on a saved heap; guards hand-made states
    self.seq = int(state["seq"])
