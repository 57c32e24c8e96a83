r"""Where an engine round's time goes on CPU: XLA's own per-operation trace, grouped (issue 20).

  python -m experiments.profile_round --model=resnet20 --clients=2 --steps=2 [--batch=32]

Builds experiments.benchmark's engine round for the model (its --model, --clients, --steps,
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
so a round of small operations (the MLPs) looks slower than experiments.benchmark times it.
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
# experiments.benchmark's flags.
from experiments import benchmark, cpu_devices
from fedjax_lama import models
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


def group_ops(events: list[dict], rounds: int, instructions) -> tuple[dict, dict]:
  """(milliseconds per round by kind, by single instruction), largest first, of the complete
  ("X") trace events named after an instruction of `instructions` (the runtime's own events
  around them, and CONTAINERS, are left out)."""
  by_op = collections.Counter()
  for e in events:
    name = e.get("name")
    if e.get("ph") == "X" and name in instructions and op_kind(name) not in CONTAINERS:
      by_op[name] += e.get("dur", 0) / 1e3 / rounds  # trace durations are microseconds
  by_kind = collections.Counter()
  for name, ms in by_op.items():
    by_kind[op_kind(name)] += ms
  return dict(by_kind.most_common()), dict(by_op.most_common())


def main(argv):
  del argv
  if FLAGS.traced_rounds < 1:
    raise app.UsageError(f"--traced_rounds={FLAGS.traced_rounds}: trace at least 1 round")
  # Read when JAX starts its CPU backend, at the first computation below (nothing before
  # main computes).
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + TRACEME_FLAG).strip()
  cpu_devices.split_cpu()  # as experiments.benchmark: the engine's round on the same devices

  impl = models.resolve_conv_impl(FLAGS.conv_impl)
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
  print(json.dumps({"model": FLAGS.model, "clients": FLAGS.clients, "steps": FLAGS.steps,
                    "batch": FLAGS.batch, "conv_impl": impl, "client_map": client_map,
                    "wall_ms_per_round": wall_ms, "op_ms_per_round": total,
                    "ms_by_kind": by_kind, "trace_dir": trace_dir}))


if __name__ == "__main__":
  app.run(main)
