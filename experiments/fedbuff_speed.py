r"""Wall time per simulated client update: FedBuff beside FedAsync, in one process.

Both methods run the same small run on the simulated clock (digits, an MLP, every client
training at once: FedAsync always keeps every client in flight, so FedBuff gets
concurrency = num_clients) through the training entry point, interleaved, after one
warm-up run each (compilation). A client update is one model upload that reached the
server; the wall time is the simulator's (local training, evaluation ticks and the
server rule; not the checkpoint writes).

    python -m experiments.fedbuff_speed --repeats=3 --budget_s=200
"""
import statistics
import tempfile

from absl import app, flags

from fedjax_lama import metrics, training
from fedjax_lama.config import base_config

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


def seconds_per_update(method: str) -> tuple[float, int]:
  config = run_config(method, _CLIENTS.value, _BUDGET.value, _BUFFER.value)
  with tempfile.TemporaryDirectory() as workdir:
    summary = training.train_and_evaluate(config, workdir)
    records = metrics.JsonlWriter(f"{workdir}/metrics.jsonl").read()
  updates = int(records[-1]["models_up"])
  return summary["wall_seconds"] / updates, updates


def main(argv):
  del argv
  methods = ("fedasync", "fedbuff")
  for method in methods:  # warm-up: compile every call size once
    seconds_per_update(method)
  times = {m: [] for m in methods}
  for _ in range(_REPEATS.value):
    for method in methods:
      per_update, updates = seconds_per_update(method)
      times[method].append(per_update)
      print(f"{method:9s} {updates:5d} client updates  {1e3 * per_update:8.3f} ms per update",
            flush=True)
  medians = {m: statistics.median(t) for m, t in times.items()}
  for m in methods:
    print(f"median {m:9s} {1e3 * medians[m]:8.3f} ms per client update")
  print(f"fedbuff / fedasync = {medians['fedbuff'] / medians['fedasync']:.3f}")


if __name__ == "__main__":
  app.run(main)
