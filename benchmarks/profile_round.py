r"""Where an engine round's time goes on CPU: XLA's own per-operation trace, grouped.

  python -m benchmarks.profile_round --model=resnet20 --clients=2 --steps=2 [--batch=32]

Builds benchmarks.benchmark's engine round for the model (its --model, --clients, --steps,
--batch, --conv_impl, --client_map and --unroll flags; the same random data), runs it twice to
compile and warm up, then traces --traced_rounds rounds with `jax.profiler` while XLA:CPU records
every operation it executes (`--xla_cpu_enable_xprof_traceme`, set here before JAX starts its
backend). It prints milliseconds per round for the operation kinds (an HLO instruction's name
without its number: `ynn_fusion` are YNNPACK matmul fusions, `dot` Eigen matmuls,
`convolution` lax convolutions, the other `*_fusion` XLA's own elementwise and data-movement
kernels) and for the --top single operations, each with its HLO op_name (what JAX traced it
from). Loops and calls are left out (their events span their bodies' operations). Times are
summed over the threads that ran them, so a kind's share is of the operations' total, not of
the round's wall time (printed beside it); the tracing itself slows every operation a little,
so a round of small operations (the MLPs) looks slower than benchmarks.benchmark times it.
It then prints the time in which no operation runs, by the operation that finished last
before each gap (`idle_time`): an Eigen `dot`'s event ends when the product is handed to
Eigen's threads, so its real time is the gap after it, not its event's duration.
The last line is one JSON object. The trace itself stays in --trace_dir for TensorBoard or
Perfetto.
"""
import collections
import glob
import gzip
import json
import os
import re
import tempfile
import time

from absl import app, flags
import jax

# --model, --clients, --steps, --batch, --conv_impl, --client_map and --unroll are
# benchmarks.benchmark's flags.
from benchmarks import benchmark
from fedjax_lama.cli import cpu_devices
from fedjax_lama import kernels
from fedjax_lama.engine import local

FLAGS = flags.FLAGS
flags.DEFINE_integer("traced_rounds", 2, "Rounds traced after the warm-up.")
flags.DEFINE_integer("top", 15, "Single operations listed.")
flags.DEFINE_string("trace_dir", "", "Where the trace is written (default: a new temp dir).")

TRACEME_FLAG = "--xla_cpu_enable_xprof_traceme=true"
# Control flow: a loop's or call's event spans the operations of its body, counted already.
CONTAINERS = ("while", "conditional", "call")


def op_kind(name: str) -> str:
  """The kind of an HLO instruction from its name: "ynn_fusion.21" -> "ynn_fusion"."""
  return re.sub(r"(\.\d+)+$", "", name)


def hlo_instructions(hlo_text: str) -> dict:
  """Every instruction of an HLO module's text -> the op_name JAX recorded for it ("" if
  none)."""
  found = {}
  for line in hlo_text.splitlines():
    m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = ", line)
    if m:
      source = re.search(r'op_name="([^"]*)"', line)
      found[m.group(1)] = source.group(1) if source else ""
  return found


def _op_events(events: list[dict], instructions) -> list[dict]:
  """The complete ("X") trace events named after an instruction of `instructions` (the
  runtime's own events around them, and CONTAINERS, are left out)."""
  return [e for e in events if e.get("ph") == "X" and e.get("name") in instructions
          and op_kind(e["name"]) not in CONTAINERS]


def group_ops(events: list[dict], rounds: int, instructions) -> tuple[dict, dict]:
  """(milliseconds per round by kind, by single instruction), largest first, of the
  operations' trace events (`_op_events`)."""
  by_op = collections.Counter()
  for e in _op_events(events, instructions):
    by_op[e["name"]] += e.get("dur", 0) / 1e3 / rounds  # trace durations are microseconds
  by_kind = collections.Counter()
  for name, ms in by_op.items():
    by_kind[op_kind(name)] += ms
  return dict(by_kind.most_common()), dict(by_op.most_common())


def idle_time(events: list[dict], rounds: int, instructions) -> tuple[float, float, dict]:
  """(ms a round in which some operation runs, ms a round in which none does, and the
  latter by the operation that finished last before each such gap, largest first), between
  the first and the last operation traced.

  Why: XLA:CPU hands a `dot` (an Eigen matmul) to Eigen's threads and its trace event ends
  there, before the product is computed; the product's time then shows as a gap after the
  `dot` in which no operation runs. On leaf_cnn (8 x 5 x 32, on this project's 2-core
  CPU machine) the forward `dot` of its 3136 x 2048 layer read 0.2 ms a step by its
  event and was followed by about 3 ms with no operation running.
  """
  spans = sorted((e["ts"], e["ts"] + e.get("dur", 0), e["name"])
                 for e in _op_events(events, instructions))
  busy, waits = 0.0, collections.Counter()
  if not spans:
    return 0.0, 0.0, {}
  start, end, last = spans[0]
  for s, e, name in spans[1:]:
    if s > end:  # nothing ran between `end` and `s`
      busy += end - start
      waits[last] += (s - end) / 1e3 / rounds
      start, end, last = s, e, name
    elif e >= end:
      end, last = e, name
  busy += end - start
  return busy / 1e3 / rounds, sum(waits.values()), dict(waits.most_common())


def main(argv):
  del argv
  if FLAGS.traced_rounds < 1:
    raise app.UsageError(f"--traced_rounds={FLAGS.traced_rounds}: trace at least 1 round")
  # Read when JAX starts its CPU backend, at the first computation below (nothing before
  # main computes).
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + TRACEME_FLAG).strip()
  cpu_devices.split_cpu()  # as benchmarks.benchmark: the engine's round on the same devices

  impl = kernels.resolve(FLAGS.conv_impl)
  client_map = local.resolve_client_map(FLAGS.client_map)
  w = benchmark.workload(FLAGS.model, FLAGS.clients, FLAGS.steps, FLAGS.batch, impl)
  one_round = benchmark.engine_round(w, client_map, FLAGS.unroll)
  for _ in range(2):
    jax.block_until_ready(one_round())
  trace_dir = FLAGS.trace_dir or tempfile.mkdtemp(prefix="profile_round_")
  jax.profiler.start_trace(trace_dir)
  t0 = time.perf_counter()
  for _ in range(FLAGS.traced_rounds):
    jax.block_until_ready(one_round())
  wall_ms = (time.perf_counter() - t0) * 1e3 / FLAGS.traced_rounds
  jax.profiler.stop_trace()
  traces = sorted(glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True),
                  key=os.path.getmtime)
  if not traces:
    raise SystemExit(f"no trace was written under {trace_dir}")
  with gzip.open(traces[-1]) as f:
    events = json.load(f).get("traceEvents", [])
  train_chunk, args = one_round.training_call
  instructions = hlo_instructions(train_chunk.lower(*args).compile().as_text())
  by_kind, by_op = group_ops(events, FLAGS.traced_rounds, instructions)
  if not by_op:
    raise SystemExit("the trace has no XLA operations: was XLA_FLAGS read before JAX started? "
                     f"({TRACEME_FLAG})")
  total = sum(by_kind.values())
  print(f"{FLAGS.model}, {FLAGS.clients} clients x {FLAGS.steps} steps x batch {FLAGS.batch}, "
        f"{impl} convolutions, {client_map} client map: {wall_ms:.1f} ms a round (wall), "
        f"{total:.1f} ms of operations")
  for kind, ms in by_kind.items():
    if ms >= 0.005 * total:
      print(f"  {ms:9.2f} ms {100 * ms / total:5.1f}%  {kind}")
  print(f"the {FLAGS.top} largest operations:")
  for name, ms in list(by_op.items())[:FLAGS.top]:
    print(f"  {ms:9.2f} ms  {name}  {instructions[name][-90:]}")
  busy, idle, idle_after = idle_time(events, FLAGS.traced_rounds, instructions)
  print(f"some operation running {busy:.1f} ms a round, none {idle:.1f} ms; the longest "
        "waits followed (an Eigen `dot` computes after its event ends):")
  for name, ms in list(idle_after.items())[:5]:
    print(f"  {ms:9.2f} ms  after {name}  {instructions[name][-90:]}")
  print(json.dumps({"model": FLAGS.model, "clients": FLAGS.clients, "steps": FLAGS.steps,
                    "batch": FLAGS.batch, "conv_impl": impl, "client_map": client_map,
                    "wall_ms_per_round": wall_ms, "op_ms_per_round": total,
                    "busy_ms_per_round": busy, "idle_ms_per_round": idle,
                    "ms_by_kind": by_kind, "idle_ms_after": dict(list(idle_after.items())[:20]),
                    "trace_dir": trace_dir}))


if __name__ == "__main__":
  app.run(main)
