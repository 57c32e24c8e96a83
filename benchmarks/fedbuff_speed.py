r"""Wall and CPU time per simulated client update: FedBuff beside FedAsync, in one process.

Both methods run the same small run on the simulated clock (digits, an MLP, every client
training at once: FedAsync always keeps every client in flight, so FedBuff gets
concurrency = num_clients), built as the training entry point builds it (one federation,
model and w0 for all runs), interleaved, after one warm-up run each. A client update is
one model upload that reached the server. Each run's trainer compiles its own programs
in the first quarter of the virtual-time budget, so only the rest of the run is timed:
local training, evaluation ticks and the server rule. CPU time (every thread of this
process) is less disturbed than wall time when other work shares the machine.

    python -m benchmarks.fedbuff_speed --repeats=5 --budget_s=400
    python -m benchmarks.fedbuff_speed --mode=server --repeats=3

--mode=server times the same comparison without training: the numpy stand-in trainer
and evaluator (simulation.testing) on an MLP-sized model with the engine's jitted model
sums, so what is left is the event loop and each method's server rule.

The last lines are the verdict (FedBuff's wall time per client update no worse than FedAsync's
at the same concurrency, read from each repeat's paired ratio fedbuff / fedasync: HOLDS when
their median is <= 1, FAILS when FedBuff was slower in so many repeats that a sign test
rejects equal speeds at p < 0.05, otherwise HOLDS, at parity; CPU time beside it) and one
JSON object.
"""
import json
import math
import statistics
import time

from absl import app, flags
import numpy as np

from fedjax_lama import data as fdata
from fedjax_lama import federation, training
from fedjax_lama.config import base_config
from fedjax_lama.simulation import FedAsync, FedBuff, FedBuffConfig, SystemConfig
from fedjax_lama.simulation import clock_run
from fedjax_lama.simulation.engine_adapter import JaxAlgebra
from fedjax_lama.simulation.testing import make_simulator

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags, defined only when it runs as a program (see algorithm_benchmark)."""
  flags.DEFINE_enum("mode", "engine", ["engine", "server"],
                    "engine: runs through the training entry point; server: stand-ins")
  flags.DEFINE_integer("repeats", 3, "measured runs of each method (after a warm-up)")
  flags.DEFINE_float("budget_s", 200.0, "virtual-time budget of each run, seconds")
  flags.DEFINE_integer("num_clients", 10, "clients (all of them train at once)")
  flags.DEFINE_integer("buffer_size", 3, "FedBuff's K")


def run_config(method: str, num_clients: int, budget_s: float, buffer_size: int):
  c = base_config()
  c.algorithm = method
  c.dataset, c.model = "digits", "mlp"
  c.model_options.hidden_sizes = (32,)
  c.partition, c.classes_per_client, c.num_clients = "class_cyclic", 2, num_clients
  c.local_test_fraction = 0.2
  c.local_epochs, c.local_steps, c.batch_size, c.local_lr = 1, 0, 10, 3e-3
  c.system.compute_model.step_cost_s = 0.5
  c.system.num_unstable = 0
  c.system.max_virtual_time_s = budget_s
  c.system.eval_interval_s = budget_s / 4
  c.plots = False
  if method == "fedbuff":
    c.fedbuff.concurrency = num_clients
    c.fedbuff.buffer_size = buffer_size
  return c


_SETUP = {}


def arrivals(sim) -> int:
  return sum(1 for e in sim.event_log if e[2] == "arrival")


def timed_rest_of_run(sim, warm_until: float) -> tuple[float, float, int]:
  """Runs to `warm_until` (compilation), then times the rest: (wall s, CPU s, updates)."""
  sim.run(until=warm_until)
  before = arrivals(sim)
  wall, cpu = time.perf_counter(), time.process_time()
  sim.run()
  return time.perf_counter() - wall, time.process_time() - cpu, arrivals(sim) - before


def engine_seconds_per_update(method: str) -> tuple[float, float, int]:
  """(wall, CPU) seconds per client update after the first quarter of the budget."""
  config = run_config(method, FLAGS.num_clients, FLAGS.budget_s, FLAGS.buffer_size)
  if not _SETUP:  # one federation, model and w0 for every run (what training builds)
    dataset = fdata.load_dataset(config.dataset, data_dir="")
    fed = federation.build_federation(training.partition_spec(config), dataset)
    model, params, _ = training.build_model(config, dataset)
    _SETUP.update(fed=fed, model=model, params=params)
  sim = clock_run.build_simulator(training.clock_options(config), _SETUP["fed"],
                                  _SETUP["model"], _SETUP["params"])
  wall, cpu, updates = timed_rest_of_run(sim, FLAGS.budget_s / 4)
  return wall / updates, cpu / updates, updates


def server_seconds_per_update(method: str) -> tuple[float, float, int]:
  """Stand-in trainer and evaluator: the loop and the server rule only (no training)."""
  sizes = {"w1": (64, 32), "b1": (32,), "w2": (32, 10), "b2": (10,)}  # digits' MLP
  model = {k: np.zeros(shape, np.float32) for k, shape in sizes.items()}
  num_clients = FLAGS.num_clients
  config = SystemConfig(num_clients=num_clients, num_unstable=0, num_tiers=2,
                        max_virtual_time_s=100 * FLAGS.budget_s, eval_interval_s=FLAGS.budget_s)
  rule = FedAsync() if method == "fedasync" else FedBuff(FedBuffConfig(
      concurrency=num_clients, buffer_size=FLAGS.buffer_size))
  sim = make_simulator(config, rule, initial_model=model, algebra=JaxAlgebra())
  wall, cpu, updates = timed_rest_of_run(sim, config.max_virtual_time_s / 4)
  return wall / updates, cpu / updates, updates


def main(argv):
  del argv
  methods = ("fedasync", "fedbuff")
  if FLAGS.mode == "server":
    seconds_per_update = server_seconds_per_update  # pylint: disable=redefined-outer-name
  else:
    seconds_per_update = engine_seconds_per_update
  for method in methods:  # warm-up: compile every call size once
    seconds_per_update(method)
  walls, cpus = {m: [] for m in methods}, {m: [] for m in methods}
  for _ in range(FLAGS.repeats):
    for method in methods:
      wall, cpu, updates = seconds_per_update(method)
      walls[method].append(wall)
      cpus[method].append(cpu)
      print(f"{method:9s} {updates:5d} client updates  {1e3 * wall:8.3f} ms wall, "
            f"{1e3 * cpu:8.3f} ms CPU per update", flush=True)
  print(json.dumps(verdict(walls, cpus, FLAGS.num_clients, FLAGS.mode)))


def slower_p_value(slower: int, repeats: int) -> float:
  """One-sided sign test: the chance of FedBuff being slower in at least `slower` of
  `repeats` paired repeats if the two methods took the same time (each repeat a coin)."""
  return sum(math.comb(repeats, k) for k in range(slower, repeats + 1)) / 2 ** repeats


def verdict(walls: dict, cpus: dict, concurrency: int, mode: str) -> dict:
  """Prints the medians, each repeat's paired ratio and the verdict; returns them.

  The check: FedBuff's wall time per simulated client update no worse than FedAsync's at
  the same concurrency. Each repeat runs the two methods one after the other, so its ratio
  fedbuff / fedasync sees the same load; the verdict reads those paired wall ratios:
  HOLDS when their median is <= 1; FAILS when FedBuff was slower in so many repeats that
  equal speeds would give that few times in 20 (one-sided sign test, p < 0.05: all 5 of 5
  repeats, 9 of 10); otherwise the methods are at parity within the noise of the
  measurement, which is not worse (HOLDS, at parity).
  """
  result = {"mode": mode, "concurrency": concurrency, "repeats": len(walls["fedbuff"])}
  for name, table in (("wall", walls), ("cpu", cpus)):
    medians = {m: statistics.median(t) for m, t in table.items()}
    paired = [b / a for a, b in zip(table["fedasync"], table["fedbuff"])]
    ratio = statistics.median(paired)
    print(f"median {name}: fedasync {1e3 * medians['fedasync']:.3f} ms, fedbuff "
          f"{1e3 * medians['fedbuff']:.3f} ms per client update; fedbuff / fedasync per "
          f"repeat {', '.join(f'{r:.3f}' for r in paired)} (median {ratio:.3f})")
    result[f"{name}_ms_per_update"] = {m: 1e3 * v for m, v in medians.items()}
    result[f"{name}_ratio"] = ratio
    result[f"{name}_ratios"] = paired
  paired, repeats = result["wall_ratios"], result["repeats"]
  slower = sum(r > 1 for r in paired)
  p_value = slower_p_value(slower, repeats)
  if result["wall_ratio"] <= 1:
    word = "HOLDS"
  elif p_value < 0.05:
    word = "FAILS"
  else:
    word = "HOLDS, at parity"
  result.update(slower_repeats=slower, sign_test_p=p_value, verdict=word,
                holds=word != "FAILS")
  print(f"VERDICT: {word} -- FedBuff's wall time per client update is "
        f"{result['wall_ratio']:.3f}x FedAsync's at concurrency {concurrency} (median of "
        f"{repeats} paired repeats, {min(paired):.3f} to {max(paired):.3f}; FedBuff slower in "
        f"{slower} of {repeats}, sign test p = {p_value:.3f}; CPU time "
        f"{result['cpu_ratio']:.3f}x)")
  return result

if __name__ == "__main__":
  define_flags()
  app.run(main)
