r"""What Byzantine-robust aggregation costs: a round with each defence against a round with the
plain mean, the defence alone on the stacked uploads, and the memory of gathering them.

  python -m benchmarks.robust_cost [--model=fedat_cnn --clients=32,256 --steps=10 --batch=32 \
      --defences=krum,bulyan,median,geometric_median --chunk=32 --repeats=3]
  python -m benchmarks.robust_cost --steps=10,2    # a 2-core CPU: 2 local steps at 256 clients
  python -m benchmarks.robust_cost --quick         # a smoke run: 8 clients x 1 step x batch 8

For each cohort size C (--clients, every client of a federation of C each round, fixed
sampling) the arms are, built from a config as a run builds them and driven as the training
loop drives them (round_timing.py), on FedAT's CNN with Fashion-MNIST-shaped synthetic data:

  mean           FedAvg's streaming mean over the whole cohort in one chunk;
  mean_chunked   the same with config.engine.clients_per_chunk = --chunk (the round keeps one
                 (sum, weight) pair across chunks, never the cohort's uploads);
  <defence>      config.robust.defence = krum, bulyan, median (coordinate-wise) or
                 geometric_median (Weiszfeld, 4 iterations): a whole-cohort stage, so the round
                 gathers the cohort's uploads (C x d floats, d the model's size) and the
                 server update runs the rule on that stack.

f, the Byzantine clients each rule must tolerate, is Bulyan's largest, floor((C - 3) / 4), for
every rule (7 at 32 clients, 63 at 256): it satisfies every rule's precondition (Krum
C > 2f + 2, Bulyan C >= 4f + 3, the medians C > 2f). f enters the work only through Bulyan's
C - 2f Krum picks (a loop of that many scorings of the C x C distances).

Timings: one warm-up round per arm, then --repeats rounds interleaved; the best round counts.
Ratios: `<defence>/mean`, the round with the defence over the round with the plain mean; and
`<defence>_alone/<defence>`, the rule alone (jitted, on a random stack of C uploads shaped like
the model, mask and uniform weights, the mean of enough calls to last 0.2 s) over its round.

Memory: the stack's size C x d x 4 bytes, and XLA's memory analysis of each arm's compiled
training call and server update, per device where the cohort is split over several: what the
call allocates (outputs not aliased to its arguments, and scratch: `allocated`) and that with
its arguments, the replicated training data among them (`peak`); every backend that
compiles reports it. On accelerators also the process's peak device memory (`memory_stats()`,
over the whole run so far). The last line is JSON.
"""
import json
import math
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import round_timing
from fedjax_lama import config as config_lib
from fedjax_lama.cli import cpu_devices, logs
from fedjax_lama.engine import stages
from fedjax_lama.robust import defences as defences_lib
from fedjax_lama.robust import robust_stage
from fedjax_lama.run import spec as spec_lib

FLAGS = flags.FLAGS
DEFENCES = ("krum", "bulyan", "median", "geometric_median")
MIN_SAMPLE_S = 0.2
QUICK = {"clients": (8,), "steps": (1,), "batch": 8, "repeats": 1, "chunk": 4}


def define_flags() -> None:
  """The command's flags, defined only when it runs as a program (absl refuses a flag defined
  twice, and the benchmarks' modules are imported side by side by tests)."""
  flags.DEFINE_string("model", "fedat_cnn", "Model name (fedjax_lama.models.names()).")
  flags.DEFINE_list("clients", ["32", "256"], "Cohort sizes C (every client of C each round).")
  flags.DEFINE_list("steps", ["10"], "Local steps per client: one value, or one per cohort "
                    "size (--steps=10,2 on a small CPU).")
  flags.DEFINE_integer("batch", 32, "Local batch size.")
  flags.DEFINE_list("defences", list(DEFENCES), "config.robust.defence values timed.")
  flags.DEFINE_integer("chunk", 32, "clients_per_chunk of the mean_chunked arm.")
  flags.DEFINE_integer("repeats", 3, "Timed rounds of each arm, interleaved, after one warm-up.")
  flags.DEFINE_list("input_shape", ["28", "28", "1"], "The synthetic images' shape (H,W,C).")
  flags.DEFINE_bool("quick", False, "A smoke run: 8 clients x 1 step x batch 8, one repeat.")


def byzantine_f(clients: int) -> int:
  """Bulyan's largest f for C clients (C >= 4f + 3), which every timed rule accepts."""
  return max(0, (clients - 3) // 4)


def robust_config(arm: str, model: str, clients: int, steps: int, batch: int, chunk: int = 0):
  """One arm's config: FedAvg over every client of a federation of `clients`, uniform weights;
  a defence with f = byzantine_f, or the mean (in chunks of `chunk` clients for mean_chunked)."""
  c = config_lib.base_config()
  c.algorithm, c.model, c.partition = "fedavg", model, "iid"
  c.num_clients, c.active_ratio, c.client_sampling = clients, 1.0, "fixed"
  c.batch_size, c.local_steps, c.weighting, c.local_lr = batch, steps, "uniform", 0.01
  if arm == "mean_chunked":
    c.engine.clients_per_chunk = chunk
  elif arm != "mean":
    c.robust.defence, c.robust.f = arm, byzantine_f(clients)
  return c


def _time_alone(fn, args, repeats: int) -> float:
  """Best seconds per call of `fn(*args)` over `repeats` samples, each the mean of the fewest
  calls lasting MIN_SAMPLE_S (a call of a millisecond timed alone is timer noise)."""
  jax.block_until_ready(fn(*args))  # compilation
  t0 = time.perf_counter()
  jax.block_until_ready(fn(*args))
  calls = max(1, math.ceil(MIN_SAMPLE_S / max(time.perf_counter() - t0, 1e-9)))
  best = float("inf")
  for _ in range(max(1, repeats)):
    t0 = time.perf_counter()
    for _ in range(calls):
      jax.block_until_ready(fn(*args))
    best = min(best, (time.perf_counter() - t0) / calls)
  return best


def defence_alone(config, params, repeats: int) -> float:
  """Seconds of the config's rule alone on a random stack of C uploads shaped like `params`."""
  spec = spec_lib.robust_options(config, "synchronous")
  rule = defences_lib.build(spec.defence, spec.f, on_stack=True, **spec.hparams)
  clients = config.num_clients
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(0), len(leaves))
  stack = jax.tree.unflatten(treedef, [
      0.01 * jax.random.normal(k, (clients,) + jnp.shape(x), jnp.float32)
      for k, x in zip(keys, leaves)])
  mask = jnp.ones((clients,), jnp.float32)
  weights = mask / clients
  state = rule.init(params)
  aggregate = jax.jit(lambda s, m, w, st: rule.server(stages.Stack(s, w, m), st, None)[0])
  return _time_alone(aggregate, (stack, mask, weights, state), repeats)


def _device_peak():
  """The process's peak device memory in bytes where the backend reports it (None on CPU)."""
  try:
    stats = jax.devices()[0].memory_stats()
  except Exception:  # pylint: disable=broad-except
    return None
  return None if not stats else stats.get("peak_bytes_in_use")


def run_cohort(model, clients, steps, batch, defences=DEFENCES, chunk=32, repeats=3,
               input_shape=round_timing.FASHION_MNIST_SHAPE) -> dict:
  """Every arm at one cohort size (see the module doc)."""
  dataset = round_timing.synthetic_dataset(clients * steps * batch, input_shape)
  arms, params = {}, None
  for arm in ("mean", "mean_chunked", *defences):
    config = robust_config(arm, model, clients, steps, batch, chunk)
    program = round_timing.build(config, dataset)
    params = program.params
    arms[arm] = round_timing.TimedProgram(program)
  times = round_timing.interleave(arms, repeats)
  first = times.pop("first_call_s")
  best = {name: min(t) for name, t in times.items()}
  alone = {name: defence_alone(robust_config(name, model, clients, steps, batch), params,
                               repeats) for name in defences}
  ratios = {f"{name}/mean": round_timing.ratio(times, name, "mean") for name in defences}
  ratios["mean_chunked/mean"] = round_timing.ratio(times, "mean_chunked", "mean")
  for name in defences:
    ratios[f"{name}_alone/{name}"] = {"best": alone[name] / best[name]}
  d = sum(int(np.size(x)) for x in jax.tree.leaves(params))
  return {"clients": clients, "steps": steps, "batch": batch, "f": byzantine_f(clients),
          "chunk": chunk, "model_size": d, "stack_bytes": 4 * clients * d,
          "seconds_per_round": best, "rounds_s": times, "first_call_s": first,
          "defence_alone_s": alone, "ratios": ratios,
          "memory": {name: arm.memory() for name, arm in arms.items()},
          "device_peak_bytes": _device_peak()}


def run(model="fedat_cnn", clients=(32, 256), steps=(10,), batch=32, defences=DEFENCES,
        chunk=32, repeats=3, input_shape=round_timing.FASHION_MNIST_SHAPE) -> dict:
  """Every cohort size in turn; returns the JSON dict."""
  unknown = [name for name in defences if name not in robust_stage.DEFENCES or name == "none"]
  if unknown:
    raise ValueError(f"defences={','.join(unknown)} is not accepted; accepted: "
                     f"{', '.join(n for n in robust_stage.DEFENCES if n != 'none')}")
  if len(steps) not in (1, len(clients)):
    raise ValueError(f"steps={','.join(map(str, steps))} is not accepted; accepted: one value "
                     f"or one per cohort size ({len(clients)})")
  steps = list(steps) * len(clients) if len(steps) == 1 else list(steps)
  rows = [run_cohort(model, c, s, batch, tuple(defences), min(chunk, c), repeats, input_shape)
          for c, s in zip(clients, steps)]
  return {"model": model, "repeats": repeats, "defences": list(defences),
          "machine": round_timing.machine(), "cohorts": rows}


def _memory(memory) -> str:
  if not memory:
    return "n/a"
  return (f"{round_timing.mib(memory['allocated'])} allocated "
          f"(peak {round_timing.mib(memory['peak'])} with its arguments)")


def report(r: dict) -> str:
  """The human-readable summary: per cohort size, each arm's round, the ratios, the memory."""
  lines = [round_timing.machine_line(r["machine"])]
  most_steps = max(row["steps"] for row in r["cohorts"])
  for row in r["cohorts"]:
    fewer = (f" (fewer local steps than the other cohorts' {most_steps}: --steps)"
             if row["steps"] < most_steps else "")
    lines.append(f"{r['model']} ({row['model_size']:,} parameters): {row['clients']} clients x "
                 f"{row['steps']} steps x batch {row['batch']}{fewer}, f = {row['f']}; best of "
                 f"{r['repeats']} interleaved rounds after one warm-up")
    for name, seconds in row["seconds_per_round"].items():
      extra = (f", the rule alone {row['defence_alone_s'][name]:.4f} s"
               if name in row["defence_alone_s"] else "")
      lines.append(f"  round {name:18s} {seconds:8.3f} s{extra}")
    for name, q in row["ratios"].items():
      paired = f" (paired median {q['paired_median']:.3f})" if "paired_median" in q else ""
      lines.append(f"  ratio {name:34s} {q['best']:.3f}{paired}")
    lines.append(f"  memory: the stacked uploads C x d x 4 B = {round_timing.mib(row['stack_bytes'])}")
    for name, m in row["memory"].items():
      chunk = f" ({row['chunk']} clients a chunk)" if name == "mean_chunked" else ""
      lines.append(f"  memory {name:18s} training call {_memory(m['training_call'])}, server "
                   f"update {_memory(m['server_update'])}{chunk}")
    if row["device_peak_bytes"] is not None:
      lines.append(f"  device peak over the process so far: "
                   f"{round_timing.mib(row['device_peak_bytes'])}")
  return "\n".join(lines)


def main(argv):
  del argv
  cpu_devices.split_cpu()
  logs.progress_only()
  sizes = dict(clients=tuple(int(c) for c in FLAGS.clients),
               steps=tuple(int(s) for s in FLAGS.steps), batch=FLAGS.batch,
               repeats=FLAGS.repeats, chunk=FLAGS.chunk)
  if FLAGS.quick:
    sizes.update(QUICK)
  r = run(FLAGS.model, defences=tuple(FLAGS.defences),
          input_shape=tuple(int(s) for s in FLAGS.input_shape), **sizes)
  print(report(r))
  print(json.dumps(r))


if __name__ == "__main__":
  define_flags()
  app.run(main)
