r"""Personal state at scale: N clients' rows in the host store, rounds and per-client evaluation.

  python -m benchmarks.personal_scale [--clients=1000,10000,100000 --cohort=64 --repeats=3]
  python -m benchmarks.personal_scale --quick      # a smoke test: 200 clients, one repeat

For every N: synthetic data (8 training and 2 test examples per client, 16 features, 4
classes) and a tiny MLP (16 -> 16 -> 4). Two runs on the same federation and cohorts:

- FedAvg, no per-client state;
- Ditto (Li et al., ICML 2021): each client's personal model v_i (one model's worth of
  floats, and a flag) in its row, kept in the host store (config.engine.client_state_on_host),
  and per-client evaluation of every client's personal model (`Algorithm.serve`: v_i,
  or the global model for a client that never took part), plus 2 fine-tuning steps. Ditto's
  round trains the personal model beside the global one, so its round does twice the
  gradient work of FedAvg's.

Printed per N: the host store's bytes, the process's peak host memory (max RSS), device
memory in use where the backend reports it, the bytes of the live device arrays after the
rounds beside the training data (any backend: what the run keeps on the device), the round
time (best of the repeats after a compiling round) of both runs, and the time of one
per-client evaluation of all N clients (global and personal models; best of the repeats
after a compiling one). The last line is JSON.
"""
import gc
import json
import resource
import time

from absl import app, flags
import jax
import numpy as np

from fedjax_lama import config as config_lib, federation, training
from fedjax_lama.data import Dataset
from fedjax_lama.engine import evaluate, local, personal_eval, sharding
from fedjax_lama.run import parts as parts_lib, spec as spec_lib

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line's flags, defined when run as a program (the benchmarks' tests import
  several benchmark modules into one process, whose flag names would collide)."""
  flags.DEFINE_list("clients", ["1000", "10000", "100000"], "Federation sizes N.")
  flags.DEFINE_integer("cohort", 64, "Clients per round.")
  flags.DEFINE_integer("repeats", 3, "Timed repeats after a compiling one (best kept).")
  flags.DEFINE_bool("quick", False, "A smoke test: 200 clients, one timed repeat.")

TRAIN_PER_CLIENT, TEST_PER_CLIENT, FEATURES, CLASSES = 8, 2, 16, 4


def synthetic_federation(num_clients: int, seed: int = 0) -> federation.Federation:
  """Each client: its own class prior and 8 + 2 examples (train, test), features = one-hot
  of the class plus noise; the test parts index the training arrays."""
  rng = np.random.default_rng(seed)
  per = TRAIN_PER_CLIENT + TEST_PER_CLIENT
  n = num_clients * per
  y = rng.integers(0, CLASSES, n).astype(np.int32)
  x = (np.eye(CLASSES, FEATURES, dtype=np.float32)[y] +
       rng.normal(0.0, 0.5, (n, FEATURES)).astype(np.float32))
  starts = np.arange(num_clients, dtype=np.int64) * per
  train = [s + np.arange(TRAIN_PER_CLIENT, dtype=np.int64) for s in starts]
  test = [s + TRAIN_PER_CLIENT + np.arange(TEST_PER_CLIENT, dtype=np.int64) for s in starts]
  ds = Dataset("synthetic", x, y, x[:1000], y[:1000], CLASSES)
  return federation.Federation(ds, train, test)


def _config(algorithm: str, num_clients: int, cohort: int, on_host: bool):
  c = config_lib.base_config()
  c.algorithm, c.model, c.num_clients = algorithm, "mlp", num_clients
  c.model_options.hidden_sizes = (16,)
  c.active_ratio = min(1.0, cohort / num_clients)
  c.local_steps, c.batch_size, c.rounds = 2, 4, 1000
  c.engine.client_state_on_host = on_host
  return c


def _peak_host_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # kB on Linux


def _device_mb():
  stats = jax.devices()[0].memory_stats()
  if not stats or "bytes_in_use" not in stats:
    return None
  return stats["bytes_in_use"] / 2**20


def _live_device_mb(program) -> tuple[float, float]:
  """(MB of every live jax array, MB of those that are the program's training arrays): what
  stays on the device between rounds, measured on any backend (the CPU backend reports no
  memory_stats). The rest is the run's state: it holds the cohort's rows, never all N."""
  gc.collect()
  live = sum(a.nbytes for a in jax.live_arrays())
  data = sum(getattr(program, name).nbytes for name in ("data_x", "data_y")
             if isinstance(getattr(program, name, None), jax.Array))
  return live / 2**20, data / 2**20


def _best_round_seconds(program, repeats: int) -> float:
  state = program.init_state()
  state, _ = program.run_round(state, 0)  # compiles
  best = float("inf")
  for r in range(1, repeats + 1):
    started = time.perf_counter()
    state, out = program.run_round(state, r)
    jax.block_until_ready(state["server"].params)
    best = min(best, time.perf_counter() - started)
    del out
  program.last_state = state
  return best


def run_one(num_clients: int, cohort: int, repeats: int) -> dict:
  fed = synthetic_federation(num_clients)
  mesh = sharding.client_mesh()
  out = {"clients": num_clients}
  for name, algorithm, on_host in (("fedavg", "fedavg", False), ("personal", "ditto", True)):
    c = _config(algorithm, num_clients, cohort, on_host)
    spec = spec_lib.build_spec(c)
    model, params, model_state = parts_lib.build_model(spec.model, fed.dataset,
                                                       spec.plan.kernels)
    program = training.build_program(c, model, params, model_state, fed, mesh)
    out[f"{name}_round_s"] = _best_round_seconds(program, repeats)
    live_mb, data_mb = _live_device_mb(program)
    out[f"{name}_device_state_mb"] = live_mb - data_mb
    out["device_data_mb"] = data_mb
    if name == "personal":
      store = program.store
      out["host_store_mb"] = store.nbytes / 2**20
      evaluator = personal_eval.PersonalEvaluator(
          evaluate.make_eval_fn(model, False), mesh, test_x=fed.dataset.train_x,
          test_y=fed.dataset.train_y, test_parts=fed.client_test,
          clients_per_chunk=max(1, 1000 // TEST_PER_CLIENT),
          serve=program.algorithm.serve,
          loss_fn=local.make_loss_fn(model, False), train_x=fed.dataset.train_x,
          train_y=fed.dataset.train_y, train_parts=fed.client_train, finetune_steps=2,
          finetune_lr=0.1, batch_size=4, seed=0)
      eval_params, eval_state = program.eval_params(program.last_state)
      server = program.server_state(program.last_state)
      evaluator(eval_params, eval_state, store, server=server)  # compiles
      best = float("inf")
      for _ in range(repeats):
        started = time.perf_counter()
        sums = evaluator(eval_params, eval_state, store, server=server)
        best = min(best, time.perf_counter() - started)
      out["per_client_eval_s"] = best
      out["personal_mean_accuracy"] = personal_eval.summarize(sums["personal"])["mean"]
  out["peak_host_mb"] = _peak_host_mb()
  out["device_mb"] = _device_mb()
  return out


def run(sizes, cohort: int, repeats: int) -> list:
  """Prints one line per N and the JSON line; returns the results."""
  results = []
  print(f"device: {jax.devices()[0].device_kind}; cohort {cohort} clients, "
        f"{TRAIN_PER_CLIENT}+{TEST_PER_CLIENT} examples per client")
  for n in sizes:
    r = run_one(n, cohort, repeats)
    results.append(r)
    device = "n/a" if r["device_mb"] is None else f"{r['device_mb']:.1f} MB"
    print(f"N={n:>7}: host store {r['host_store_mb']:.1f} MB, peak host {r['peak_host_mb']:.0f}"
          f" MB, device in use {device}; live device arrays beside the training data "
          f"({r['device_data_mb']:.1f} MB): FedAvg {r['fedavg_device_state_mb'] * 1024:.1f} kB, "
          f"with host rows {r['personal_device_state_mb'] * 1024:.1f} kB; "
          f"round {r['fedavg_round_s'] * 1e3:.1f} ms FedAvg, "
          f"{r['personal_round_s'] * 1e3:.1f} ms with host rows; per-client evaluation of all "
          f"N clients {r['per_client_eval_s']:.2f} s", flush=True)
  print(json.dumps({"personal_scale": results}))
  return results


def main(argv):
  del argv
  if FLAGS.quick:
    run([200], FLAGS.cohort, 1)
  else:
    run([int(n) for n in FLAGS.clients], FLAGS.cohort, FLAGS.repeats)


if __name__ == "__main__":
  define_flags()
  app.run(main)
