r"""Cost of each algorithm's round against a FedAvg round of the same shape, side by side.

  python -m benchmarks.algorithm_benchmark [--model=fedat_cnn --clients=16 --steps=10 \
      --algorithms=scaffold,feddyn,fedadam,fedspeed,fedsam,mofedsam,fedsmoo,fedgamma \
      --fedlama_over=fedavg,scaffold,feddyn,fedadam]

Every program is driven exactly as the training loop drives it (host sampling, packing, row
gather/scatter, server update) on the same CIFAR-shaped data and model. Timings are
interleaved (one round of each program per repeat, in turn) so that load on this shared
machine hits all of them alike, and the best repeat of each is kept. Targets: SCAFFOLD,
FedDyn and FedAdam <= 1.1x FedAvg (their extra work is O(d) per client per round), FedSpeed,
FedSAM, MoFedSAM, FedSMOO and FedGamma <= 2.2x (two gradients per step), FedLAMA over an
algorithm <= 1.1x that algorithm (a window of phi sub-rounds against phi rounds).

--cost_analysis adds XLA's own count of each synchronous program's training call (the one
jitted call that runs every client's local steps): floating-point operations and bytes
accessed, against FedAvg's, from `jax.jit(...).lower(...).compile().cost_analysis()` on
the arguments of its first round. XLA counts a loop's body once, not once per trip, so
these are the costs of one local step plus one client's work outside the steps, not of a
round. Unlike the timings they do not depend on the load of the machine: a method whose
local step takes two gradients reads 2.0x FedAvg's operations, and its bytes say how much
elementwise work (norms, duals, control variates) it adds.
The last line is JSON.
"""
import json
import time

from absl import app, flags
import jax
import numpy as np

from fedjax_lama.cli import logs
from fedjax_lama import config as config_lib, federation, training
from fedjax_lama.data import Dataset
from fedjax_lama.engine import sharding

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags, defined only when it runs as a program: the benchmarks' modules
  are imported side by side (tests, other tools), and absl refuses a flag defined twice."""
  flags.DEFINE_string("model", "fedat_cnn", "Model name.")
  flags.DEFINE_integer("clients", 16, "Participating clients per round.")
  flags.DEFINE_integer("steps", 10, "Local steps per round (FedLAMA: tau').")
  flags.DEFINE_integer("phi", 2, "FedLAMA's phi.")
  flags.DEFINE_integer("batch", 32, "Local batch size.")
  flags.DEFINE_list("algorithms", ["scaffold", "feddyn", "fedadam", "fedspeed", "fedsam",
                                   "mofedsam", "fedsmoo", "fedgamma"],
                    "Algorithms timed against FedAvg.")
  flags.DEFINE_list("fedlama_over", ["fedavg", "scaffold", "feddyn", "fedadam"],
                    "Algorithms timed under the FedLAMA schedule against themselves.")
  flags.DEFINE_integer("repeats", 5, "Timed repeats after one warm-up (best kept).")
  flags.DEFINE_bool("cost_analysis", False, "Also report XLA's operation and byte counts of each "
                    "synchronous program's training call against FedAvg's (one more compilation "
                    "each).")


def _dataset(n, shape=(32, 32, 3), num_classes=10):
  r = np.random.default_rng(0)
  x = r.random((n,) + shape, dtype=np.float32)
  y = r.integers(0, num_classes, n).astype(np.int32)
  return Dataset("synthetic", x, y, x[:256], y[:256], num_classes)


def _config(algorithm, clients, steps, phi, batch, model, fedlama=False):
  c = config_lib.base_config()
  c.algorithm, c.model, c.partition = algorithm, model, "iid"
  c.num_clients, c.active_ratio, c.batch_size = 2 * clients, 0.5, batch
  c.local_steps, c.weighting, c.local_lr = steps, "uniform", 0.01
  if algorithm in ("fedadam", "fedyogi", "fedadagrad"):
    c.server_lr = 0.01
  if fedlama:
    c.schedule = "fedlama"
    c.fedlama.base_interval, c.fedlama.phi = steps, phi
    c.fedlama.total_steps = 1000 * steps * phi
  return c


def _program(config, dataset, mesh):
  fed = federation.build_federation(training.partition_spec(config), dataset)
  model, params, model_state = training.build_model(config, dataset)
  return training.build_program(config, model, params, model_state, fed, mesh)


class _Timed:
  """One program advanced `rounds_per_call` rounds per call, its state kept between calls."""

  def __init__(self, program, rounds_per_call):
    self.program, self.k = program, rounds_per_call
    self.state, self.calls, self.times = program.init_state(), 0, []
    self.first_args = None
    train_chunk = getattr(program, "train_chunk", None)
    if train_chunk is not None:  # a synchronous program: keep its first call's arguments

      def recorded(*args, **kwargs):  # kwargs: a LoRA run's frozen base
        if self.first_args is None:
          self.first_args = args
        return train_chunk(*args, **kwargs)

      self.jitted, program.train_chunk = train_chunk, recorded

  def cost(self):
    """XLA's cost analysis of the training call on its first arguments, or None."""
    if self.first_args is None:
      return None
    analysis = self.jitted.lower(*self.first_args).compile().cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    return {"flops": float(analysis.get("flops", 0.0)),
            "bytes": float(analysis.get("bytes accessed", 0.0))}

  def __call__(self):
    t0 = time.perf_counter()
    for _ in range(self.k):
      self.state, _ = self.program.run_round(self.state, self.calls)
      self.calls += 1
    jax.block_until_ready(jax.tree.leaves(self.state))
    return time.perf_counter() - t0


def run(model="fedat_cnn", clients=16, steps=10, phi=2, batch=32,
        algorithms=("scaffold", "feddyn", "fedadam", "fedspeed", "fedsam", "mofedsam", "fedsmoo",
                    "fedgamma"),
        fedlama_over=("fedavg", "scaffold", "feddyn", "fedadam"), repeats=5,
        cost_analysis=False) -> dict:
  dataset = _dataset(2 * clients * steps * batch)
  mesh = sharding.client_mesh()
  # A FedLAMA window is phi sub-rounds: it is timed against phi rounds of its base.
  timed = {}
  for name in dict.fromkeys(["fedavg", *algorithms, *fedlama_over]):
    timed[name] = _Timed(_program(_config(name, clients, steps, phi, batch, model), dataset,
                                  mesh), phi)
  for name in fedlama_over:
    timed[f"fedlama+{name}"] = _Timed(_program(
        _config(name, clients, steps, phi, batch, model, fedlama=True), dataset, mesh), 1)
  for t in timed.values():  # warm-up: compilation
    t()
  for _ in range(repeats):
    for t in timed.values():
      t.times.append(t())
  best = {name: min(t.times) for name, t in timed.items()}
  ratios = {f"{name}/fedavg": best[name] / best["fedavg"] for name in algorithms}
  ratios.update({f"fedlama+{name}/{name}": best[f"fedlama+{name}"] / best[name]
                 for name in fedlama_over})
  result = {"model": model, "clients": clients, "steps": steps, "phi": phi, "batch": batch,
            "platform": jax.default_backend(), "repeats": repeats,
            "seconds_per_phi_rounds": best, "ratios": ratios}
  if cost_analysis:
    costs = {name: timed[name].cost() for name in ["fedavg", *algorithms]}
    base = costs["fedavg"]
    result["training_call_cost"] = costs
    result["cost_ratios"] = {
        f"{name}/fedavg": {k: costs[name][k] / base[k] for k in ("flops", "bytes")}
        for name in algorithms if costs[name] is not None}
  return result


def main(argv):
  del argv
  logs.progress_only()
  r = run(FLAGS.model, FLAGS.clients, FLAGS.steps, FLAGS.phi, FLAGS.batch, FLAGS.algorithms,
          FLAGS.fedlama_over, FLAGS.repeats, FLAGS.cost_analysis)
  print(f"{r['model']}, {r['clients']} clients x {r['steps']} steps x batch {r['batch']}, "
        f"best of {r['repeats']} interleaved repeats of {r['phi']} rounds (a FedLAMA window):")
  for name, seconds in r["seconds_per_phi_rounds"].items():
    print(f"  {name:22s} {seconds:8.3f} s")
  for name, ratio in r["ratios"].items():
    print(f"  {name:30s} ratio {ratio:.3f}")
  for name, ratio in r.get("cost_ratios", {}).items():
    print(f"  {name:30s} training call: operations {ratio['flops']:.3f}x, bytes accessed "
          f"{ratio['bytes']:.3f}x (XLA's cost analysis)")
  print(json.dumps(r))


if __name__ == "__main__":
  define_flags()
  app.run(main)
