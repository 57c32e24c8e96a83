"""LoRA against full fine-tuning: the compiled round's memory per client, and the speed.

    python -m benchmarks.lora_memory [--width=128 --depth=4 --clients=1,8,64,256 ...]

For each mode (full fine-tuning; LoRA at ranks --ranks on every attention and MLP
projection; the same with --remat variants) and each K of --clients, the engine's
synchronous chunk of K clients (FedAvg, `engine/sync_round.make_round_fns`, every client
vmapped: client_map "vmap") is lowered and compiled for the transformer_lm of --width and
--depth at the text study's batch (10), sequence length (80) and local steps (5), and
XLA's `memory_analysis()` gives its temp (working), argument and output bytes. Nothing is
run for the table: compiling at K = 256 allocates nothing.

Per mode it prints the per-client slope of temp + output bytes between the two largest K
(the memory each further client costs) and its split:

    parameter state = 4 bytes x trainable floats x (weights + gradients + optimizer
                      state: 2 + the local optimizer's slots), from the shapes;
    activations     = the slope - the parameter state (what the step's values cost);

then each mode's slopes against full fine-tuning's (ratio). The argument bytes hold the
frozen base once (a LoRA run's base is one broadcast input of the chunk, never per client).

--remat adds rows: "block" rematerialises each transformer block (the model option
`remat`, nn.remat), "loss" the whole loss (`local.make_loss_fn(remat=True)`); either row
compiles with the engine's remat plan (`plan.plan(remat=True)`: on CPU, XLA keeps the
barriers that hold each recomputation back until the backward pass reaches it).

Speed (--speed_clients, a small K): each mode's jitted chunk and server update run
--repeats times after a warm-up call; clients/s and tokens/s (trained tokens: clients x
steps x batch x sequence length) are printed side by side, with LoRA's against full
fine-tuning's.

--peers=peft (under a python with PyTorch and PEFT, requirements-peers.txt): beside each
mode without remat, in the same interleaved passes, the PyTorch speed peer trains the same
K clients on the same batches: the torch twin of the transformer, PEFT's LoraModel with the
same layers, rank and alpha (or every weight for full fine-tuning), the clients one after
another, K plain SGD steps each from the global adapters, then their mean
(third_party/peft_peer.py `transformer_loop`), torch on as many threads as the cores this
process may use. Printed: the peer's rows, ours / peer per mode, and how far the two new
global states lie apart after one round (float32). The figures and the commands are in
docs/performance.md, "LoRA".
"""
import dataclasses
import json
import os
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_lama import algorithms, models
from fedjax_lama.algorithms import Common
from fedjax_lama.engine import cohort as cohort_lib, local, plan as plan_lib, sync_round
from fedjax_lama.models import lora
from fedjax_lama.tree import leaf_names

VOCAB = 81  # LEAF's Shakespeare characters
TARGETS = "*/attention/*,*/mlp_*"
PEERS = ("peft",)


@dataclasses.dataclass(frozen=True)
class Mode:
  name: str
  rank: int = 0            # 0: full fine-tuning
  remat: str = "none"      # "none" | "block" | "loss"


@dataclasses.dataclass(frozen=True)
class Setting:
  width: int = 128
  depth: int = 4
  heads: int = 4
  batch: int = 10
  seq: int = 80
  steps: int = 5
  momentum: float = 0.0
  dataset_rows: int = 2048


def build(mode: Mode, s: Setting):
  """(jitted chunk, server update, server state, frozen, trainable, the whole initial
  parameters) of one mode."""
  options = dict(width=s.width, depth=s.depth, heads=s.heads, max_len=s.seq,
                 remat=mode.remat == "block")
  if mode.rank:
    options["lora"] = {"rank": mode.rank, "targets": TARGETS, "alpha": 2.0 * mode.rank}
  model = models.get("transformer_lm", VOCAB, **options)
  x = jnp.zeros((1, s.seq), jnp.int32)
  params = model.init(jax.random.PRNGKey(0), x)["params"]
  chosen = lora.trainable_set(params, "lora") if mode.rank else None
  trainable, frozen = chosen.split(params) if chosen else (params, {})
  loss_fn = local.make_loss_fn(model, False, merge=chosen.merge if chosen else None,
                               remat=mode.remat == "loss")
  alg = algorithms.build("fedavg", Common(local_momentum=s.momentum))
  server = alg.server.init(trainable, {})
  plan = plan_lib.plan(client_map="vmap", remat=mode.remat != "none")
  train_chunk, server_update = sync_round.make_round_fns(
      loss_fn, alg, optax.constant_schedule(0.1), seed=0, weighting="uniform",
      local_steps=s.steps, population=1024, jit=False, plan=plan)
  return (local.jit_training(train_chunk, plan=plan), jax.jit(server_update), server, frozen,
          trainable, params)


def chunk_args(server, frozen, k: int, s: Setting, concrete: bool = False):
  """The chunk's arguments for K clients (shapes only unless `concrete`)."""
  rng = np.random.default_rng(0)
  shapes = dict(
      data_x=((s.dataset_rows, s.seq), jnp.int32), data_y=((s.dataset_rows, s.seq), jnp.int32),
      indices=((k, s.steps, s.batch), jnp.int32), example_mask=((k, s.steps, s.batch), jnp.float32),
      step_mask=((k, s.steps), jnp.float32), client_mask=((k,), jnp.float32),
      client_ids=((k,), jnp.int32), num_examples=((k,), jnp.float32))
  if concrete:
    arrays = {
        "data_x": rng.integers(0, VOCAB, shapes["data_x"][0]),
        "data_y": rng.integers(0, VOCAB, shapes["data_y"][0]),
        "indices": rng.integers(0, s.dataset_rows, shapes["indices"][0]),
        "client_ids": np.arange(k)}
    make = lambda n: jnp.asarray(arrays[n] if n in arrays else np.ones(shapes[n][0]),
                                 shapes[n][1])
  else:
    make = lambda n: jax.ShapeDtypeStruct(*shapes[n])
  cohort = cohort_lib.Cohort(*(make(n) for n in ("indices", "example_mask", "step_mask",
                                                 "client_mask", "client_ids",
                                                 "num_examples")))
  return (server, {}, make("data_x"), make("data_y"), cohort, 0), frozen


def tree_bytes(tree) -> int:
  return int(sum(np.size(x) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def memory(mode: Mode, s: Setting, ks) -> dict:
  chunk, _, server, frozen, trainable, _ = build(mode, s)
  rows = {}
  for k in ks:
    args, fz = chunk_args(server, frozen, k, s)
    start = time.perf_counter()
    analysis = chunk.lower(*args, frozen=fz).compile().memory_analysis()
    rows[k] = {"temp": int(analysis.temp_size_in_bytes),
               "argument": int(analysis.argument_size_in_bytes),
               "output": int(analysis.output_size_in_bytes),
               "compile_s": time.perf_counter() - start}
  # Weights, gradients and the local optimizer's slots (momentum: one), per client.
  slots = 2 + (1 if s.momentum else 0)
  return {"rows": rows, "trainable": tree_bytes(trainable) // 4,
          "frozen": tree_bytes(frozen) // 4, "param_state": slots * tree_bytes(trainable)}


def slope(rows: dict) -> float:
  """Bytes per further client: temp + output between the two largest K."""
  (k0, a), (k1, b) = sorted(rows.items())[-2:]
  total = lambda r: r["temp"] + r["output"]
  return (total(b) - total(a)) / (k1 - k0)


def by_path(tree) -> dict:
  return dict(zip(leaf_names(tree), map(np.asarray, jax.tree.leaves(tree))))


def peer_round(mode: Mode, s: Setting, params, args, threads: int):
  """The PyTorch (+ PEFT) loop over the chunk's clients and batches (`args`, concrete):
  (run, its result in our layout by path)."""
  from third_party import peft_peer  # pylint: disable=g-import-not-at-top
  data_x, data_y, indices = np.asarray(args[2]), np.asarray(args[3]), np.asarray(args[4].indices)
  batches = [[(data_x[rows], data_y[rows]) for rows in client] for client in indices]
  options = dict(vocab_size=VOCAB, width=s.width, depth=s.depth, heads=s.heads, max_len=s.seq)
  run, paths = peft_peer.transformer_loop(by_path(params), options, batches, 0.1,
                                          alpha=2.0 * mode.rank, threads=threads)
  return run, lambda state: peft_peer.our_layout(state, paths)


def peer_name(mode: Mode) -> str:
  return f"PEFT {mode.name}" if mode.rank else f"PyTorch {mode.name}"


def speeds(modes, s: Setting, k: int, repeats: int, peers=(), threads: int = 0) -> dict:
  """Each mode's best round time over `repeats` passes, the modes (and with `peers` the
  PyTorch loop beside each mode without remat) interleaved in every pass, so that a slower
  moment of a shared machine falls on every mode alike. With peers: each peer's distance
  from our new global state after the warm-up round."""
  rounds, distances = {}, {}
  for mode in modes:
    chunk, update, server, frozen, _, params = build(mode, s)
    args, fz = chunk_args(server, frozen, k, s, concrete=True)

    def one_round(chunk=chunk, update=update, server=server, args=args, fz=fz):
      sums, _, _ = chunk(*args, frozen=fz)
      return update(server, sums).params

    ours = by_path(jax.block_until_ready(one_round()))  # compile
    rounds[mode.name] = one_round
    if "peft" in peers and mode.remat == "none":
      theirs, to_ours = peer_round(mode, s, params, args, threads)
      distances[peer_name(mode)] = max(float(np.max(np.abs(v - ours[p])))
                                       for p, v in to_ours(theirs()).items())
      rounds[peer_name(mode)] = theirs
  times = {name: [] for name in rounds}
  for _ in range(repeats):
    for name, one_round in rounds.items():
      start = time.perf_counter()
      jax.block_until_ready(one_round())
      times[name].append(time.perf_counter() - start)
  tokens = k * s.steps * s.batch * s.seq
  out = {name: {"round_s": min(t), "median_s": float(np.median(t)), "clients_per_s": k / min(t),
                "tokens_per_s": tokens / min(t)} for name, t in times.items()}
  for name, distance in distances.items():
    out[name]["distance"] = distance
  return out


def mib(n: float) -> str:
  return f"{n / 2**20:9.1f}"


def run(s: Setting, ks, ranks, remat, speed_k: int, repeats: int, peers=(),
        threads: int = 0) -> dict:
  unknown = [p for p in peers if p not in PEERS]
  if unknown:
    raise ValueError(f"--peers: unknown peer {unknown[0]!r}; accepted: {', '.join(PEERS)}")
  modes = [Mode("full")] + [Mode(f"lora r={r}", r) for r in ranks]
  for how in remat:
    modes += [Mode(f"full, remat {how}", 0, how)]
    modes += [Mode(f"lora r={r}, remat {how}", r, how) for r in ranks]
  print(f"transformer_lm width {s.width}, depth {s.depth}, heads {s.heads}; batch {s.batch}, "
        f"sequence {s.seq}, {s.steps} local steps; FedAvg, client_map vmap; "
        f"backend {jax.default_backend()}, {jax.device_count()} device(s)")
  result = {"setting": dataclasses.asdict(s), "modes": {}, "speed": {}}
  if ks:
    memory_table(result, modes, s, ks)
  if speed_k:
    speed_table(result, modes, s, speed_k, repeats, peers, threads)
  return result


def speed_table(result, modes, s: Setting, k: int, repeats: int, peers, threads: int) -> None:
  print(f"\nspeed at K={k} (best of {repeats} interleaved passes after a warm-up)")
  if peers:
    from third_party import peft_peer  # pylint: disable=g-import-not-at-top
    threads = threads or len(os.sched_getaffinity(0))
    result["peer"] = {"versions": peft_peer.versions(), "torch_threads": threads}
    print(f"peer: {peft_peer.versions()}, eager, torch.set_num_threads({threads}); clients one "
          f"after another; 'apart': largest difference of the new global state from ours")
  measured = speeds(modes, s, k, repeats, peers, threads)
  result["speed"] = measured
  print(f"{'mode':>22} {'round s':>8} {'clients/s':>10} {'tokens/s':>10} {'x full':>7}"
        + (f" {'ours/peer':>9} {'apart':>8}" if peers else ""))
  ours = {m.name: peer_name(m) for m in modes}
  for name, r in measured.items():
    full = measured["full" if name in ours else peer_name(Mode("full"))]
    line = (f"{name:>22} {r['round_s']:8.3f} {r['clients_per_s']:10.2f} "
            f"{r['tokens_per_s']:10.0f} {r['tokens_per_s'] / full['tokens_per_s']:7.2f}")
    if ours.get(name) in measured:
      r["ours_vs_peer"] = r["tokens_per_s"] / measured[ours[name]]["tokens_per_s"]
      line += f" {r['ours_vs_peer']:9.2f}"
    elif "distance" in r:
      line += f" {'':>9} {r['distance']:8.1e}"
    print(line)


def memory_table(result, modes, s: Setting, ks) -> None:
  print(f"{'mode':>22} {'K':>4} {'temp MiB':>9} {'arg MiB':>9} {'out MiB':>9} {'compile s':>9}")
  for mode in modes:
    m = memory(mode, s, ks)
    result["modes"][mode.name] = m
    for k, r in sorted(m["rows"].items()):
      print(f"{mode.name:>22} {k:>4} {mib(r['temp'])} {mib(r['argument'])} "
            f"{mib(r['output'])} {r['compile_s']:9.1f}")
  full = result["modes"]["full"]
  full_slope = slope(full["rows"])
  print(f"\nper-client slope (temp + output, K={sorted(ks)[-2]}..{sorted(ks)[-1]}); parameter "
        f"state = weights + gradients + optimizer state from the shapes; activations = the rest")
  print(f"{'mode':>22} {'trainable':>10} {'slope MiB':>10} {'params MiB':>10} {'activ MiB':>10}"
        f" {'x full':>7} {'params x':>9} {'activ x':>8}")
  for name, m in result["modes"].items():
    total = slope(m["rows"])
    params = m["param_state"]
    m.update(slope=total, activations=total - params)
    full_params = full["param_state"]
    print(f"{name:>22} {m['trainable']:>10,} {mib(total):>10} {mib(params):>10} "
          f"{mib(total - params):>10} {total / full_slope:7.3f} {params / full_params:9.4f} "
          f"{(total - params) / (full_slope - full_params):8.3f}")


FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_integer("width", 128, "transformer width")
  flags.DEFINE_integer("depth", 4, "transformer blocks")
  flags.DEFINE_integer("heads", 4, "attention heads")
  flags.DEFINE_integer("batch", 10, "local batch (the text study's)")
  flags.DEFINE_integer("seq", 80, "sequence length (the text study's)")
  flags.DEFINE_integer("steps", 5, "local steps (the text study's)")
  flags.DEFINE_float("momentum", 0.0, "local momentum (0: plain SGD, no optimizer state)")
  flags.DEFINE_list("clients", ["1", "8", "64", "256"], "clients per chunk K")
  flags.DEFINE_list("ranks", ["4", "16"], "LoRA ranks")
  flags.DEFINE_list("remat", ["block"], "remat variants: block, loss ('' for none)")
  flags.DEFINE_integer("speed_clients", 8, "K of the speed rows (0: none)")
  flags.DEFINE_integer("repeats", 3, "timed rounds per mode")
  flags.DEFINE_list("peers", [], "speed peers beside the speed rows: peft (PyTorch + PEFT)")
  flags.DEFINE_integer("torch_threads", 0, "--peers: torch.set_num_threads (0: the cores "
                       "this process may use)")
  flags.DEFINE_string("json", "", "also write the figures here")


def main(argv):
  del argv
  s = Setting(FLAGS.width, FLAGS.depth, FLAGS.heads, FLAGS.batch, FLAGS.seq, FLAGS.steps,
              FLAGS.momentum)
  result = run(s, [int(k) for k in FLAGS.clients], [int(r) for r in FLAGS.ranks],
               [r for r in FLAGS.remat if r], FLAGS.speed_clients, FLAGS.repeats,
               FLAGS.peers, FLAGS.torch_threads)
  if FLAGS.json:
    with open(FLAGS.json, "w") as f:
      json.dump(result, f, indent=1, default=float)


if __name__ == "__main__":
  define_flags()
  app.run(main)
