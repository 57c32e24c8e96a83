r"""The pfl-research CIFAR-10 workload end to end through the CLI: wall time, samples/s, MFU.

  python -m benchmarks.workload_pfl_cifar10                  # all 1,500 rounds
  python -m benchmarks.workload_pfl_cifar10 --rounds=100     # a prefix, extrapolated
  python -m benchmarks.workload_pfl_cifar10 --setting=fedat_cnn --workdir=/tmp/w

Runs `python -m experiments.main --config=configs/workload_pfl_cifar10.py[:setting]` in a
subprocess (the command a user runs; --rounds overrides config.rounds) and reports:
  wall_s            the whole command (data synthesis, compilation, evaluation included);
  train_wall_s      the run's own `wall_seconds` (the round loop with its evaluations and
                    checkpoints: summary.json);
  samples_per_s     training samples (rounds x 50 clients x 50 examples) / train_wall_s,
                    and (samples_per_s_whole_command) the samples of the rounds this command
                    ran / wall_s;
  resumed_after_round  the checkpoint this command resumed from (None: a fresh run). A long
                    run may go in parts: the same command on the same --workdir continues it
                    (--checkpoint_every sets how much an interruption can lose), and
                    train_wall_s then sums the parts' rounds;
  mfu               flops_per_sample (XLA's count of one un-vectorized SGD step of the model
                    on a batch of 10, benchmarks.benchmark) x samples/s over the peak
                    FLOP/s of an n^3 float32 matmul (--peak_matmul_size, 2048) measured in this
                    process right before and right after the run (the best of both), with
                    the load average;
  extrapolated_1500_rounds_s  when --rounds < 1,500: the 1,500-round wall time at the
                    measured per-round rate after the first round (compilation) plus the
                    command's fixed costs.
The last line is one JSON object.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags

FLAGS = flags.FLAGS
ROUNDS = 1500
CLIENTS_PER_ROUND, EXAMPLES_PER_CLIENT, BATCH = 50, 50, 10


def peak_flops(matmul_size: int = 2048, repeats: int = 5) -> float:
  """FLOP/s of the best of `repeats` samples of a float32 matmul (benchmark.matmul_plan); a
  sample is the mean of the fewest calls lasting 0.2 s, as in the benchmark, so a matmul of
  microseconds on a GPU is not timed alone."""
  from benchmarks import benchmark  # pylint: disable=g-import-not-at-top
  run, flops = benchmark.matmul_plan(matmul_size)
  benchmark.time_calls(run)  # compiles: the estimate below must time the matmul alone
  calls = benchmark.rounds_per_sample(benchmark.time_calls(run), benchmark.MIN_SAMPLE_S)
  return flops / min(benchmark.time_calls(run, calls) for _ in range(repeats))


def latest_checkpoint_round(workdir: str):
  """The round of the newest checkpoint in `workdir` (None: none, a fresh run)."""
  from fedjax_lama import checkpointing  # pylint: disable=g-import-not-at-top
  folder = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(folder):
    return None
  ckpt = checkpointing.Checkpointer(folder)
  try:
    return ckpt.latest_step()
  finally:
    ckpt.close()


def workload_command(setting: str, rounds: int, workdir: str, eval_every: int = 0,
                     checkpoint_every: int = 0) -> list:
  """The CLI command of the workload (0: the config's own eval_every / checkpoint_every)."""
  cmd = [sys.executable, "-m", "experiments.main",
         f"--config=configs/workload_pfl_cifar10.py:{setting}",
         f"--config.rounds={rounds}", f"--workdir={workdir}"]
  eval_every = eval_every or (max(1, rounds // 5) if rounds < ROUNDS else 0)
  if eval_every:  # a prefix evaluates 5 times, for the per-round rate
    cmd.append(f"--config.eval_every={eval_every}")
  if checkpoint_every:
    cmd.append(f"--config.checkpoint_every={checkpoint_every}")
  return cmd


def define_flags():
  """The command's flags (defined only when run, so importing this module defines none)."""
  flags.DEFINE_integer("rounds", 1500, "Rounds to run (the workload's 1,500, or a prefix).")
  flags.DEFINE_string("setting", "pfl_cnn", "Config setting: the model (pfl_cnn or fedat_cnn).")
  flags.DEFINE_string("workdir", "", "Run directory (default: a new temporary one).")
  flags.DEFINE_integer("eval_every", 0, "Override config.eval_every (0: the config's 100, or "
                       "rounds / 5 for a prefix).")
  flags.DEFINE_integer("checkpoint_every", 0, "Override config.checkpoint_every (0: the config's "
                       "500). A run stopped part way resumes from its last checkpoint when the "
                       "same command runs again on the same --workdir.")
  flags.DEFINE_integer("peak_matmul_size", 2048, "n of the n x n x n float32 matmul timed as "
                       "the peak (8192 on a GPU, where 2048 takes microseconds).")


def main(argv):
  del argv
  run_env = dict(os.environ)
  # This process only counts FLOPs and times a matmul; on a GPU, JAX would otherwise take
  # 75 % of the GPU's memory here and leave the run (a second process) too little.
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  from benchmarks import benchmark  # pylint: disable=g-import-not-at-top
  workdir = FLAGS.workdir or tempfile.mkdtemp(prefix="workload_pfl_")
  flops_per_sample = benchmark.training_flops_per_sample(FLAGS.setting, BATCH, "lax",
                                                         (32, 32, 3))
  peak_before, load_before = peak_flops(FLAGS.peak_matmul_size), os.getloadavg()
  cmd = workload_command(FLAGS.setting, FLAGS.rounds, workdir, FLAGS.eval_every,
                         FLAGS.checkpoint_every)
  resumed_after = latest_checkpoint_round(workdir)
  print(" ".join(cmd), flush=True)
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, check=False, env=run_env)
  wall = time.perf_counter() - t0
  if proc.returncode:
    sys.exit(f"the run failed (exit {proc.returncode})")
  load_after = os.getloadavg()
  peak = max(peak_before, peak_flops(FLAGS.peak_matmul_size))
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  samples = FLAGS.rounds * CLIENTS_PER_ROUND * EXAMPLES_PER_CLIENT
  # A resumed run: train_wall_s (summary.json) sums every part's rounds up to its last
  # checkpoint; this command ran only the rounds after `resumed_after`.
  rounds_this_command = FLAGS.rounds - (0 if resumed_after is None else resumed_after + 1)
  train_wall = summary["wall_seconds"]
  result = {
      "setting": FLAGS.setting, "rounds": FLAGS.rounds, "samples": samples,
      "wall_s": wall, "train_wall_s": train_wall,
      "samples_per_s": samples / train_wall, "resumed_after_round": resumed_after,
      "samples_per_s_whole_command":
          rounds_this_command * CLIENTS_PER_ROUND * EXAMPLES_PER_CLIENT / wall,
      "flops_per_sample": flops_per_sample, "peak_flops_per_s": peak,
      "mfu": flops_per_sample * samples / train_wall / peak,
      "final_test_accuracy": summary["final_test_accuracy"],
      "load_avg_before": [round(x, 2) for x in load_before],
      "load_avg_after": [round(x, 2) for x in load_after], "workdir": workdir,
      "evaluations": [(r["round"], r["wall_seconds"], r["test_accuracy"]) for r in records],
  }
  if FLAGS.rounds < ROUNDS and len(records) >= 2:
    # Per-round rate between the first and the last evaluation (compilation excluded).
    (r0, t_0, _), (r1, t_1, _) = result["evaluations"][0], result["evaluations"][-1]
    per_round = (t_1 - t_0) / max(r1 - r0, 1)
    result["seconds_per_round"] = per_round
    result["extrapolated_1500_rounds_s"] = wall + per_round * (ROUNDS - FLAGS.rounds)
  print(f"{FLAGS.setting}: {FLAGS.rounds} rounds x {CLIENTS_PER_ROUND} clients x "
        f"{EXAMPLES_PER_CLIENT} examples (batch {BATCH}) in {wall:.0f} s ({train_wall:.0f} s of "
        f"rounds): {result['samples_per_s']:.0f} samples/s, {flops_per_sample / 1e6:.1f} "
        f"MFLOP/sample, MFU {result['mfu']:.3f} of {peak / 1e9:.0f} GFLOP/s; load "
        f"{result['load_avg_before']} -> {result['load_avg_after']}")
  if "extrapolated_1500_rounds_s" in result:
    print(f"  {result['seconds_per_round']:.2f} s/round after the first evaluation: 1,500 "
          f"rounds would take about {result['extrapolated_1500_rounds_s'] / 60:.0f} min")
  print(json.dumps(result))


if __name__ == "__main__":
  define_flags()
  app.run(main)
