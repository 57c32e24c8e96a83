r"""Wall time per simulated client update: FedBuff beside FedAsync, in one process.

Both methods run the same small run on the simulated clock (digits, an MLP, every client
training at once: FedAsync always keeps every client in flight, so FedBuff gets
concurrency = num_clients) through the training entry point, interleaved, after one
warm-up run each. A client update is one model upload that reached the server; the wall
time is the simulator's (local training, evaluation ticks and the server rule; not the
checkpoint writes). Each run's trainer compiles its own programs, so the figure compared
is the steady state: wall time and uploads from the first evaluation tick after time 0 to
the last (the whole run's figure, compilation included, is printed beside it).

    python -m experiments.fedbuff_speed --repeats=3 --budget_s=200
    python -m experiments.fedbuff_speed --mode=server --repeats=3

--mode=server times the same comparison without training: the numpy stand-in trainer
and evaluator (simulation.testing) on an MLP-sized model with the engine's jitted model
sums, so what is left is the event loop and each method's server rule.
"""
import statistics
import tempfile
import time

from absl import app, flags
import numpy as np

from fedjax_lama import metrics, training
from fedjax_lama.config import base_config
from fedjax_lama.simulation import FedAsync, FedBuff, FedBuffConfig, SystemConfig
from fedjax_lama.simulation.engine_adapter import JaxAlgebra
from fedjax_lama.simulation.testing import make_simulator

_MODE = flags.DEFINE_enum("mode", "engine", ["engine", "server"],
                          "engine: runs through the training entry point; server: stand-ins")
_REPEATS = flags.DEFINE_integer("repeats", 3, "measured runs of each method (after a warm-up)")
_BUDGET = flags.DEFINE_float("budget_s", 200.0, "virtual-time budget of each run, seconds")
_CLIENTS = flags.DEFINE_integer("num_clients", 10, "clients (all of them train at once)")
_BUFFER = flags.DEFINE_integer("buffer_size", 3, "FedBuff's K")


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


def engine_seconds_per_update(method: str) -> tuple[float, float, int]:
  """(steady-state seconds per client update, whole-run seconds per update, updates)."""
  config = run_config(method, _CLIENTS.value, _BUDGET.value, _BUFFER.value)
  with tempfile.TemporaryDirectory() as workdir:
    summary = training.train_and_evaluate(config, workdir)
    records = metrics.JsonlWriter(f"{workdir}/metrics.jsonl").read()
  first, last = records[1], records[-1]
  steady = (last["wall_seconds"] - first["wall_seconds"]) / (last["uploads"] - first["uploads"])
  return steady, summary["wall_seconds"] / last["uploads"], int(last["uploads"])


def server_seconds_per_update(method: str) -> tuple[float, float, int]:
  """Stand-in trainer and evaluator: the loop and the server rule only (no training)."""
  sizes = {"w1": (64, 32), "b1": (32,), "w2": (32, 10), "b2": (10,)}  # digits' MLP
  model = {k: np.zeros(shape, np.float32) for k, shape in sizes.items()}
  num_clients = _CLIENTS.value
  config = SystemConfig(num_clients=num_clients, num_unstable=0, num_tiers=2,
                        max_virtual_time_s=100 * _BUDGET.value, eval_interval_s=_BUDGET.value)
  rule = FedAsync() if method == "fedasync" else FedBuff(FedBuffConfig(
      concurrency=num_clients, buffer_size=_BUFFER.value))
  sim = make_simulator(config, rule, initial_model=model, algebra=JaxAlgebra())
  start = time.perf_counter()
  sim.run()
  seconds = time.perf_counter() - start
  updates = sum(1 for e in sim.event_log if e[2] == "arrival")
  return seconds / updates, seconds / updates, updates


def main(argv):
  del argv
  methods = ("fedasync", "fedbuff")
  if _MODE.value == "server":
    seconds_per_update = server_seconds_per_update  # pylint: disable=redefined-outer-name
  else:
    seconds_per_update = engine_seconds_per_update
  for method in methods:  # warm-up: compile every call size once
    seconds_per_update(method)
  times = {m: [] for m in methods}
  for _ in range(_REPEATS.value):
    for method in methods:
      per_update, whole_run, updates = seconds_per_update(method)
      times[method].append(per_update)
      print(f"{method:9s} {updates:5d} client updates  {1e3 * per_update:8.3f} ms per update "
            f"(whole run with compilation: {1e3 * whole_run:8.3f} ms)", flush=True)
  medians = {m: statistics.median(t) for m, t in times.items()}
  for m in methods:
    print(f"median {m:9s} {1e3 * medians[m]:8.3f} ms per client update")
  print(f"fedbuff / fedasync = {medians['fedbuff'] / medians['fedasync']:.3f}")


if __name__ == "__main__":
  app.run(main)
