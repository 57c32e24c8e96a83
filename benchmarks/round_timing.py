"""What the aggregation-stage benchmarks share: synthetic data, programs driven as the training
loop drives them, interleaved timing, compiled memory, and the machine's name.

`dp_speed.py` (user-level DP against plain FedAvg) and `robust_cost.py` (Byzantine-robust rules
against the plain mean) time whole rounds of programs built from a config exactly as a run
builds them (`training.build_program`: host sampling, packing, the jitted training call per
chunk, the server update). Every arm gets one warm-up round (compilation), then `repeats`
rounds interleaved across the arms, so load on a shared machine falls on all of them alike.
"""
import os
import platform
import statistics
import time
from typing import Optional

import jax
import numpy as np

from fedjax_lama import federation, training
from fedjax_lama.data import Dataset

# Fashion-MNIST's shape: FedAT's CNN as FedAT (Chai et al., 2021) trains it there.
FASHION_MNIST_SHAPE = (28, 28, 1)


def synthetic_dataset(num_examples: int, shape=FASHION_MNIST_SHAPE,
                      num_classes: int = 10) -> Dataset:
  """Seeded uniform images and labels in the dataset's shapes (the benchmarks time the
  simulator, not learning)."""
  r = np.random.default_rng(0)
  x = r.random((num_examples,) + tuple(shape), dtype=np.float32)
  y = r.integers(0, num_classes, num_examples).astype(np.int32)
  return Dataset("synthetic", x, y, x[:256], y[:256], num_classes)


def build(config, dataset):
  """The round program of `config` on `dataset`, on the devices a run of the CLI takes."""
  fed = federation.build_federation(training.partition_spec(config), dataset)
  model, params, model_state = training.build_model(config, dataset)
  return training.build_program(config, model, params, model_state, fed, None)


def _recording(fn, box: list):
  """`fn`, keeping the arguments of its first call in `box` (for its compiled memory)."""
  def recorded(*args, **kwargs):  # kwargs: a LoRA run's frozen base
    if not box:
      box.append(args)
    return fn(*args, **kwargs)
  return recorded


def _memory(jitted, args) -> Optional[dict]:
  """XLA's memory analysis of `jitted` compiled for `args` (bytes), or None where the
  backend reports none."""
  try:
    analysis = jitted.lower(*args).compile().memory_analysis()
  except Exception:  # pylint: disable=broad-except  # some backends do not implement it
    return None
  if analysis is None:
    return None
  fields = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
            "alias_size_in_bytes", "generated_code_size_in_bytes")
  out = {f[:-len("_in_bytes")]: int(getattr(analysis, f, 0) or 0) for f in fields}
  # What the executable allocates (outputs not aliased to its arguments, and its scratch
  # buffers), and what it holds at once with its arguments (the training data among them).
  out["allocated"] = out["output_size"] - out["alias_size"] + out["temp_size"]
  out["peak"] = out["argument_size"] + out["allocated"]
  return out


class TimedProgram:
  """A synchronous round program advanced one round per call, its state kept between calls;
  the first arguments of its training call and server update are kept for `memory()`."""

  def __init__(self, program):
    self.program, self.state, self.calls, self.times = program, program.init_state(), 0, []
    self._train_args, self._server_args = [], []
    self._train_jit, self._server_jit = program.train_chunk, program.server_update
    program.train_chunk = _recording(program.train_chunk, self._train_args)
    program.server_update = _recording(program.server_update, self._server_args)

  def __call__(self) -> float:
    t0 = time.perf_counter()
    self.state, _ = self.program.run_round(self.state, self.calls)
    jax.block_until_ready(jax.tree.leaves(self.state))
    self.calls += 1
    return time.perf_counter() - t0

  def memory(self) -> dict:
    """{"training_call": ..., "server_update": ...}: XLA's memory analysis of each compiled
    piece (None where the backend gives none)."""
    return {"training_call": self._train_args and _memory(self._train_jit, self._train_args[0]),
            "server_update": (self._server_args and
                              _memory(self._server_jit, self._server_args[0]))}


def interleave(arms: dict, repeats: int) -> dict:
  """One warm-up round of every arm, then `repeats` rounds of each in turn; returns
  {name: [seconds of each timed round]} and keeps the warm-up's time in `first_call_s`."""
  first = {name: arm() for name, arm in arms.items()}  # compilation
  times = {name: [] for name in arms}
  for _ in range(repeats):
    for name, arm in arms.items():
      times[name].append(arm())
  times["first_call_s"] = first
  return times


def ratio(times: dict, numerator: str, denominator: str) -> dict:
  """numerator / denominator two ways: of their best rounds, and the median of the ratios of
  the rounds timed next to each other (repeat by repeat)."""
  a, b = times[numerator], times[denominator]
  return {"best": min(a) / min(b),
          "paired_median": statistics.median(x / y for x, y in zip(a, b))}


def host_cpu() -> str:
  """The host's processor as the OS names it ("AMD EPYC", "Intel(R) Xeon(R) ..."): on a
  CPU platform jax's device_kind is only "cpu". Linux's /proc/cpuinfo, else `platform`."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine() or "unknown"


def machine() -> dict:
  """The platform, device, host processor, JAX version and load average, for the record."""
  try:
    load = [round(x, 2) for x in os.getloadavg()]
  except OSError:
    load = []
  return {"platform": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
          "device_count": jax.device_count(), "host_cpu": host_cpu(),
          "host_cpu_count": os.cpu_count(), "jax": jax.__version__, "load_avg": load}


def machine_line(m: dict) -> str:
  return (f"machine: {m['platform']} ({m['device_kind']} x {m['device_count']}), host "
          f"{m['host_cpu']} ({m['host_cpu_count']} cores), jax {m['jax']}, load {m['load_avg']}")


def mib(num_bytes) -> str:
  return "n/a" if num_bytes is None else f"{num_bytes / 2**20:.1f} MiB"
