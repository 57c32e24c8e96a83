r"""Engine vs per-step loop vs the hardware's limit (MFU) over a grid; client-state memory.

COMMANDS (from the repository root):

  python -m benchmarks.benchmark_suite --models_table     # benchmarks/results/models_cpu.md
  python -m benchmarks.benchmark_suite --quick            # a few minutes on a 2-core CPU
  python -m benchmarks.benchmark_suite --out=suite.json   # the full grid (hours on CPU)
  python -m benchmarks.benchmark_suite --models=resnet20 --clients_grid=32 --steps_grid=5,20 \
      --conv_impl=lax
  python -m benchmarks.benchmark_suite --memory           # peak RSS, 1,000 clients' rows
  python -m benchmarks.benchmark_suite --text [--peers=fedjax,torch --peers_path=DIR]

Throughput (docs/performance.md): for every (model, clients, steps) of
the grid, `benchmarks.benchmark.run` times, side by side in one process and interleaved,
the engine's round (one jitted call of every client's local scan + server mean, kernel
set `fedjax_lama.kernels.resolve(--conv_impl)`, client map of `engine.plan.plan`), the
per-client Python loop of a jitted SGD step (FedJAX's default backend), the centralized
step (a reference, not a limit: one model, one jitted step over the whole cohort's batch,
per local step; with lax convolutions and with the engine's plan, the faster counts; --quick
and --models_table measure the engine's plan only) and an n^3 float32 matmul (the
measured peak FLOP/s; n = --matmul_size, 2048, which a GPU runs in microseconds: use 8192
there). It prints a markdown table of samples/s with engine/loop, MFU and
engine/central, and one JSON line (also written to --out).

--models_table regenerates benchmarks/results/models_cpu.md (--table_out): every image
model of the zoo at 8 clients x 5 steps x batch 32, 3 interleaved repeats, the engine's other
client map timed beside it, and the machine's load average around each row. WRN-28-10 (36.5M
parameters) runs one timed round of the engine and the loop and no other plan
(`benchmark_grid.TABLE_ROW_OPTIONS`): that row alone takes about 16 min on a 2-core CPU, the
table about 30. The grids and their runner are in benchmarks/benchmark_grid.py.

--text: both text models (`lstm_lm` as the FedAvg paper's character LSTM, `transformer_lm`
at its size `small`, of about the same parameters; benchmark.TEXT_MODELS) at
`benchmark_grid.TEXT_SIZE` (4 clients x 5 steps x batch 10; --clients_grid, --steps_grid and
--batch change it): tokens/s, FLOPs per token, MFU, engine/loop, and for the LSTM the
recurrence's matmul rates and, with --peers, FedJAX's `fed_avg` on its Shakespeare model and
the PyTorch loop (third_party/torch_lstm.py; run the suite under a python that has torch).
--transformer_clients=64,256 adds the transformer at those cohorts (each one chunk: one call
trains every client); on a GPU:
  python -m benchmarks.benchmark_suite --text --transformer_clients=64,256 --matmul_size=8192

Memory (--memory): per-client persistent state of `--memory_clients` clients of
`--memory_row` parameters' shape (ResNet20's 272,762 float32 each, 1.09 GB for
1,000), kept by `engine.client_store.ClientStore` on device and on host, each
in its own subprocess; a few rounds of gather -> update -> scatter on cohorts
of `--memory_cohort` clients. Reports peak RSS (resource.getrusage), the RSS
before the store exists, the store's bytes and the bytes that live on device.

Absolute numbers from a shared machine are noise; compare the ratios, measured
in one run. On a GPU, name the GPU (device_kind is in the JSON), e.g.
  python -m benchmarks.benchmark_suite --models_table --matmul_size=8192 --table_out=gpu.md
"""
import json
import os
import resource
import subprocess
import sys
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import benchmark
from fedjax_lama.cli import cpu_devices
from benchmarks.benchmark_grid import (TABLE_MODELS, TABLE_ROW_OPTIONS, TABLE_SIZE,
                                       TEXT_MODELS, TEXT_SIZE, throughput)
from benchmarks.benchmark_tables import markdown, models_table, text_table
from fedjax_lama import models
from fedjax_lama.data import sample_clients
from fedjax_lama.engine import client_store, sharding
from fedjax_lama.tree import tree_size

FLAGS = flags.FLAGS
# --batch, --repeats, --conv_impl and --unroll are benchmarks.benchmark's flags.
flags.DEFINE_bool("quick", False, "8 clients x 5 steps, 1 timed round per plan: minutes on CPU.")
flags.DEFINE_list("models", ["fedat_cnn", "resnet20"], "Models of the grid.")
flags.DEFINE_list("clients_grid", ["8", "32", "128"], "Clients per round, one run each.")
flags.DEFINE_list("steps_grid", ["5", "20"], "Local steps per client, one run each.")
flags.DEFINE_string("out", "", "Write the JSON results here too.")
flags.DEFINE_bool("models_table", False, "Every image model of the zoo (TABLE_MODELS) at "
                  "8 x 5 x 32; writes --table_out.")
flags.DEFINE_string("table_out", "benchmarks/results/models_cpu.md",
                    "Where --models_table writes its markdown.")
flags.DEFINE_bool("text", False, "Both text models at benchmark_grid.TEXT_SIZE, with --peers "
                  "on the LSTM.")
flags.DEFINE_list("transformer_clients", [], "--text: also the transformer at these cohort "
                  "sizes (one chunk of clients per call), e.g. 64,256 on a GPU.")
flags.DEFINE_bool("memory", False, "Measure client-state memory instead of throughput.")
flags.DEFINE_integer("memory_clients", 1000, "Clients holding a row of state.")
flags.DEFINE_string("memory_row", "resnet20", "Model whose parameters' shape is one row.")
flags.DEFINE_integer("memory_cohort", 32, "Clients gathered and scattered per round.")
flags.DEFINE_integer("memory_rounds", 5, "Rounds of gather/update/scatter.")
flags.DEFINE_enum("memory_worker", "", ["", "host", "device"], "Internal: one placement.")

# --quick: the smallest grid point, one timed round per plan, the centralized step with the
# engine's convolution plan only.
QUICK = {"clients": [8], "steps": [5], "repeats": 1, "central_impls": ("engine",)}


# ---- memory ------------------------------------------------------------------------------

def _rss_mb() -> float:
  """Current resident set size (Linux /proc; falls back to the peak)."""
  try:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
  except OSError:
    return _peak_rss_mb()


def _peak_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _row_template(name: str):
  """One client's row: zeros shaped like `name`'s parameters (shapes only, nothing trained)."""
  model = models.get(name, num_classes=10, kernels="lax")
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)),
                                             train=False))["params"]
  return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)


def memory_worker(on_host: bool, num_clients: int, row_name: str, cohort: int, rounds: int):
  row = _row_template(row_name)
  mesh = sharding.client_mesh()
  cohort = sharding.padded_size(cohort, mesh)
  update = jax.jit(lambda rows: jax.tree.map(lambda a: a + 1.0, rows),
                   out_shardings=sharding.clients_sharding(mesh))
  jax.block_until_ready(update(sharding.shard_clients(
      jax.tree.map(lambda r: np.zeros((cohort,) + r.shape, r.dtype), row), mesh)))
  rss_before = _rss_mb()
  t0 = time.perf_counter()
  store = client_store.ClientStore.create(row, num_clients, mesh, on_host=on_host)
  jax.block_until_ready(store.rows)
  create_s = time.perf_counter() - t0
  mask = np.ones(cohort, np.float32)
  times = []
  for r in range(rounds):
    ids = sample_clients(num_clients, cohort, 0, r)
    t0 = time.perf_counter()
    rows = update(store.gather(ids))
    store.scatter(ids, mask, rows)
    jax.block_until_ready(store.rows)
    times.append(time.perf_counter() - t0)
  device_bytes = (store.nbytes if not on_host else 0) + cohort * sum(
      x.nbytes for x in jax.tree.leaves(row))
  stats = jax.devices()[0].memory_stats() or {}
  return {"placement": "host" if on_host else "device", "clients": num_clients,
          "row_floats": tree_size(row),
          "store_mb": store.nbytes / 2**20, "device_resident_mb": device_bytes / 2**20,
          "rss_before_store_mb": rss_before, "peak_rss_mb": _peak_rss_mb(),
          "create_s": create_s, "round_s_best": min(times), "cohort": cohort,
          "device_peak_bytes_in_use": stats.get("peak_bytes_in_use"),
          "platform": jax.default_backend()}


def memory(num_clients, row_name, cohort, rounds) -> list[dict]:
  results = []
  for placement in ("device", "host"):
    cmd = [sys.executable, "-m", "benchmarks.benchmark_suite", f"--memory_worker={placement}",
           f"--memory_clients={num_clients}", f"--memory_row={row_name}",
           f"--memory_cohort={cohort}", f"--memory_rounds={rounds}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode:
      raise RuntimeError(f"{placement} memory run failed:\n{proc.stderr[-3000:]}")
    results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
  return results


def memory_markdown(rows: list[dict]) -> str:
  lines = ["| placement | clients | floats/row | store MB | on device MB | RSS before store MB "
           "| peak RSS MB | peak - before MB | create s | gather+update+scatter s/round |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(
        f"| {r['placement']} | {r['clients']} | {r['row_floats']:,} | {r['store_mb']:.0f} | "
        f"{r['device_resident_mb']:.0f} | {r['rss_before_store_mb']:.0f} | "
        f"{r['peak_rss_mb']:.0f} | {r['peak_rss_mb'] - r['rss_before_store_mb']:.0f} | "
        f"{r['create_s']:.2f} | {r['round_s_best']:.3f} |")
  return "\n".join(lines)


def text_rows() -> list[dict]:
  """--text: benchmark.run of each text model at TEXT_SIZE (or the grid flags when given),
  the peers on the LSTM."""
  clients, steps, batch = TEXT_SIZE
  clients = int(FLAGS.clients_grid[0]) if FLAGS["clients_grid"].present else clients
  steps = int(FLAGS.steps_grid[0]) if FLAGS["steps_grid"].present else steps
  batch = FLAGS.batch if FLAGS["batch"].present else batch
  rows = []
  for name in FLAGS.models if FLAGS["models"].present else TEXT_MODELS:
    r = benchmark.run(name, clients, steps, batch, FLAGS.repeats, FLAGS.conv_impl, FLAGS.unroll,
                      peers=tuple(FLAGS.peers) if name == "lstm_lm" else (),
                      peers_path=FLAGS.peers_path, matmul_size=FLAGS.matmul_size,
                      central_impls=("engine",), min_sample_s=FLAGS.min_sample_s,
                      torch_threads=FLAGS.torch_threads, window=FLAGS.window)
    print(benchmark.summary_line(r), file=sys.stderr, flush=True)
    rows.append(r)
  for c in FLAGS.transformer_clients:
    r = benchmark.run("transformer_lm", int(c), steps, batch, FLAGS.repeats, FLAGS.conv_impl,
                      FLAGS.unroll, central_impls=("engine",), matmul_size=FLAGS.matmul_size,
                      min_sample_s=FLAGS.min_sample_s, window=FLAGS.window)
    print(benchmark.summary_line(r), file=sys.stderr, flush=True)
    rows.append(r)
  return rows


def main(argv):
  del argv
  if FLAGS.memory_worker:
    print(json.dumps(memory_worker(FLAGS.memory_worker == "host", FLAGS.memory_clients,
                                   FLAGS.memory_row, FLAGS.memory_cohort, FLAGS.memory_rounds)))
    return
  if FLAGS.memory:
    rows = memory(FLAGS.memory_clients, FLAGS.memory_row, FLAGS.memory_cohort,
                  FLAGS.memory_rounds)
    print(memory_markdown(rows))
    result = {"memory": rows}
  elif FLAGS.text:
    cpu_devices.split_cpu()
    result = {"throughput": text_rows()}
    print(text_table(result["throughput"]))
  elif FLAGS.models_table:
    cpu_devices.split_cpu()  # as benchmarks.benchmark
    names = FLAGS.models if FLAGS["models"].present else list(TABLE_MODELS)
    clients, steps, batch = TABLE_SIZE
    rows = throughput(names, [clients], [steps], batch, FLAGS.repeats, FLAGS.conv_impl,
                      FLAGS.unroll, ("engine",), compare_client_maps=True,
                      row_options=TABLE_ROW_OPTIONS, min_sample_s=FLAGS.min_sample_s,
                      matmul_size=FLAGS.matmul_size)
    command = "python -m benchmarks.benchmark_suite --models_table" + (
        f" --models={','.join(names)}" if FLAGS["models"].present else "") + (
        f" --repeats={FLAGS.repeats}" if FLAGS["repeats"].present else "") + (
        f" --min_sample_s={FLAGS.min_sample_s}" if FLAGS["min_sample_s"].present else "") + (
        f" --matmul_size={FLAGS.matmul_size}" if FLAGS["matmul_size"].present else "")
    table = models_table(rows, command)
    with open(FLAGS.table_out, "w") as f:
      f.write(table)
    print(table)
    result = {"throughput": rows}
  else:
    cpu_devices.split_cpu()
    clients = QUICK["clients"] if FLAGS.quick else [int(c) for c in FLAGS.clients_grid]
    steps = QUICK["steps"] if FLAGS.quick else [int(k) for k in FLAGS.steps_grid]
    repeats = QUICK["repeats"] if FLAGS.quick else FLAGS.repeats
    central = QUICK["central_impls"] if FLAGS.quick else benchmark.CENTRAL_IMPLS
    rows = throughput(FLAGS.models, clients, steps, FLAGS.batch, repeats, FLAGS.conv_impl,
                      FLAGS.unroll, central, min_sample_s=FLAGS.min_sample_s,
                      matmul_size=FLAGS.matmul_size)
    print(markdown(rows))
    result = {"throughput": rows}
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      json.dump(result, f, indent=1)
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
