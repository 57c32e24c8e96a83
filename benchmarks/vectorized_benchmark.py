r"""Speedup of 8 runs trained as one computation (a run axis) over the same 8 runs one by one.

  python -m benchmarks.vectorized_benchmark [--models=mlp_digits,fedat_cnn --runs=8]

The 8 runs are 4 seeds x 2 local learning rates of one FedAvg config (what a paper's seeds
and learning-rate grid are). Both ways are driven as the training loop drives them (host
sampling and packing, per-run partitions and models); a repeat is one round of all 8 runs,
the two ways interleaved so that load on this shared machine hits both alike; the best
repeat counts. The last line is JSON with the speedup per model.
"""
import json
import time

from absl import app, flags
import jax
import numpy as np

from fedjax_lama.cli import logs
from fedjax_lama import config as config_lib, federation, training
from fedjax_lama.data import Dataset, load_dataset
from fedjax_lama.engine import sharding
from fedjax_lama.programs.vectorized import VectorizedSyncProgram

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["mlp_digits", "fedat_cnn"], "mlp_digits (the digits MLP of "
                  "configs/default.py) and/or fedat_cnn (FedAT's CNN on CIFAR-shaped data).")
flags.DEFINE_integer("runs", 8, "Runs (seeds x 2 learning rates).")
flags.DEFINE_integer("repeats", 5, "Timed repeats after a warm-up round (best kept).")


def _setting(name):
  """(config, dataset) of a benchmark model."""
  c = config_lib.base_config()
  c.algorithm, c.partition, c.weighting, c.rounds = "fedavg", "iid", "uniform", 1000
  if name == "mlp_digits":
    from configs import default  # pylint: disable=g-import-not-at-top
    c = default.get_config()
    c.rounds = 1000
    return c, load_dataset("digits", source="builtin")
  c.model, c.num_clients, c.active_ratio, c.local_steps, c.batch_size = name, 32, 0.5, 10, 32
  r = np.random.default_rng(0)
  x = r.random((4096, 32, 32, 3), dtype=np.float32)
  y = r.integers(0, 10, 4096).astype(np.int32)
  return c, Dataset("synthetic", x, y, x[:256], y[:256], 10)


def _runs(base, num):
  configs = []
  for i in range(num):
    c = base.copy_and_resolve_references()
    c.seed, c.local_lr = i // 2, (0.05, 0.1)[i % 2]
    configs.append(c)
  return configs


def run(model: str, num_runs: int = 8, repeats: int = 5) -> dict:
  base, dataset = _setting(model)
  mesh = sharding.client_mesh()
  configs = _runs(base, num_runs)
  feds, params, states, programs = [], [], [], []
  for c in configs:
    fed = federation.build_federation(training.partition_spec(c), dataset)
    mdl, p, s = training.build_model(c, dataset)
    feds.append(fed), params.append(p), states.append(s)
    programs.append(training.build_program(c, mdl, p, s, fed, mesh))
  vec = VectorizedSyncProgram([training.run_options(c, f) for c, f in zip(configs, feds)],
                              programs[0].algorithm, mdl, params, states, feds, mesh)
  seq_states = [p.init_state() for p in programs]
  vec_state = vec.init_state()
  times = {"sequential": [], "vectorized": []}

  def sequential(r):
    t0 = time.perf_counter()
    for i, p in enumerate(programs):
      seq_states[i], _ = p.run_round(seq_states[i], r)
    jax.block_until_ready(jax.tree.leaves(seq_states))
    return time.perf_counter() - t0

  def vectorized(r):
    nonlocal vec_state
    t0 = time.perf_counter()
    vec_state, _ = vec.run_round(vec_state, r)
    jax.block_until_ready(jax.tree.leaves(vec_state))
    return time.perf_counter() - t0

  sequential(0), vectorized(0)  # compilation
  for r in range(1, repeats + 1):
    times["sequential"].append(sequential(r))
    times["vectorized"].append(vectorized(r))
  best = {k: min(v) for k, v in times.items()}
  return {"model": model, "runs": num_runs, "platform": jax.default_backend(),
          "clients_per_round": programs[0].chunk_size, "local_steps": programs[0].num_steps,
          "seconds_per_round_of_all_runs": best,
          "speedup": best["sequential"] / best["vectorized"]}


def main(argv):
  del argv
  logs.progress_only()
  results = [run(m, FLAGS.runs, FLAGS.repeats) for m in FLAGS.models]
  for r in results:
    print(f"{r['model']}: {r['runs']} runs x {r['clients_per_round']} clients x "
          f"{r['local_steps']} steps: sequential {r['seconds_per_round_of_all_runs']['sequential']:.3f}"
          f" s, vectorized {r['seconds_per_round_of_all_runs']['vectorized']:.3f} s per round "
          f"of all runs: speedup {r['speedup']:.2f}x")
  print(json.dumps(results))


if __name__ == "__main__":
  app.run(main)
