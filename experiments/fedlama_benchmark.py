r"""Cost of a FedLAMA window against FedAvg rounds of the same shape, side by side.

  python -m experiments.fedlama_benchmark [--model=fedat_cnn --clients=32 --base_interval=10 --phi=2]

FedLAMA's window is phi sub-rounds of tau' local steps, each followed by the
layer-masked mean and the discrepancy, plus the interval selection, in one
jitted call. The same work under FedAvg(tau') is phi rounds. Both programs are
driven exactly as the training loop drives them (host sampling and packing
included) on the same CIFAR-shaped data. The last line is JSON with
fedlama_seconds_per_window, fedavg_seconds_per_window and ratio (target <= 1.1).
"""
import json
import time

from absl import app, flags
import jax
import numpy as np

from fedjax_lama import config as config_lib, federation, training
from fedjax_lama.data import Dataset
from fedjax_lama.engine import sharding

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "fedat_cnn", "Model name.")
flags.DEFINE_integer("clients", 32, "Participating clients (slots).")
flags.DEFINE_integer("base_interval", 10, "tau'.")
flags.DEFINE_integer("phi", 2, "FedLAMA phi.")
flags.DEFINE_integer("batch", 32, "Local batch size.")
flags.DEFINE_integer("repeats", 5, "Timed windows (best is reported) after one warm-up.")


def _dataset(n, shape=(32, 32, 3), num_classes=10):
  r = np.random.default_rng(0)
  x = r.random((n,) + shape, dtype=np.float32)
  y = r.integers(0, num_classes, n).astype(np.int32)
  return Dataset("synthetic", x, y, x[:256], y[:256], num_classes)


def _config(algorithm, clients, tau, phi, batch, model):
  c = config_lib.base_config()
  c.algorithm, c.model, c.partition = algorithm, model, "iid"
  c.num_clients, c.active_ratio, c.batch_size = clients, 1.0, batch
  c.local_steps, c.weighting, c.local_momentum = tau, "uniform", 0.9
  c.fedlama.base_interval, c.fedlama.phi = tau, phi
  c.fedlama.total_steps = 1000 * tau * phi
  return c


def _time(fn, repeats):
  fn(0)
  times = []
  for i in range(1, repeats + 1):
    t0 = time.perf_counter()
    fn(i)
    times.append(time.perf_counter() - t0)
  return min(times)


def run(model="fedat_cnn", clients=32, tau=10, phi=2, batch=32, repeats=5) -> dict:
  dataset = _dataset(clients * 64)
  mesh = sharding.client_mesh()
  results = {}
  for algorithm in ("fedavg", "fedlama"):
    c = _config(algorithm, clients, tau, phi, batch, model)
    fed = federation.build_federation(training.partition_spec(c), dataset)
    mdl, params, model_state = training._build_model(c, dataset)  # pylint: disable=protected-access
    program = training.build_program(c, mdl, params, model_state, fed, mesh)
    state = {"s": program.init_state()}
    rounds_per_window = phi if algorithm == "fedavg" else 1

    def window(i, program=program, state=state, k=rounds_per_window):
      for r in range(k):
        state["s"], out = program.run_round(state["s"], i * k + r)
      jax.block_until_ready(jax.tree_util.tree_leaves(state["s"]))
      return out

    results[algorithm] = _time(window, repeats)
  return {"model": model, "clients": clients, "base_interval": tau, "phi": phi, "batch": batch,
          "platform": jax.default_backend(),
          "fedlama_seconds_per_window": results["fedlama"],
          "fedavg_seconds_per_window": results["fedavg"],
          "ratio": results["fedlama"] / results["fedavg"]}


def main(argv):
  del argv
  r = run(FLAGS.model, FLAGS.clients, FLAGS.base_interval, FLAGS.phi, FLAGS.batch, FLAGS.repeats)
  print(f"{r['model']}, {r['clients']} clients, window of {r['phi']} x {r['base_interval']} steps: "
        f"FedLAMA {r['fedlama_seconds_per_window']:.3f}s, FedAvg(tau') x phi "
        f"{r['fedavg_seconds_per_window']:.3f}s, ratio {r['ratio']:.3f}")
  print(json.dumps(r))


if __name__ == "__main__":
  app.run(main)
