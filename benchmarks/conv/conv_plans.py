r"""Convolution plans for local training on CPU, measured side by side.

COMMAND (from the repository root; 15 to 20 minutes on the shared 2-core
machine, most of it in the lax plans and in compiles):

  python -m benchmarks.conv.conv_plans                 # fedat_cnn 32x10, resnet20 8x5
  python -m benchmarks.conv.conv_plans --chunks=1      # + lax.map over clients
  python -m benchmarks.conv.conv_plans --models=resnet20 --clients=8 --steps=5 \
      --impls=patches --unrolls=1,2 --with_lax_scan

What it measures: C clients x K local steps of
plain SGD (lr 0.01) on batches of B = 32, random CIFAR-shaped data, for
  loop[lax]        Python loop over clients and steps of one jitted SGD step
                   with lax convolutions: what FedJAX does. THE BASELINE.
  loop[<impl>]     the same loop with the first of the plans (how much comes
                   from the plan and how much from vmap/scan).
  central[<impl>]  the centralized step (a reference, not a limit: the engine
                   can beat it): K jitted steps of one shared model on the whole
                   cohort's batch (C*B).
  vmap_scan[<impl>,u<n>]  jit(vmap over clients(lax.scan over steps,
                   unroll=n)): the simulator's engine shape.
  chunked_scan[<impl>,c<k>]  jit(lax.map over chunks of k clients(vmap(scan))):
                   the engine's client chunking (k = 1: no vmap at all).
All plans run in one process, interleaved: one warm-up call each (reported as
"first", compile included), then `--repeats` rounds over all plans; the best
time of each is kept. Ratios are to loop[lax] and to the best central plan.
Every plan that trains per client is checked against loop[lax] (max |params
difference|; up to ~lr * |grad| where float rounding flips a max-pool winner).
The last line of output is one JSON object with every number.

Absolute samples/s on a shared 2-core machine are noise (other jobs run on the
same cores, and the per-step loop suffers from them more than one big call);
compare ratios from one run, and run it more than once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import benchmark
from benchmarks.conv import plans as conv_plans
from fedjax_lama import models

# (model, clients, steps, conv plans run as vmap_scan). For fedat_cnn
# "im2col" is the same computation as "patches" (no layer takes the row-shift
# path), so it is left out there.
_DEFAULT_SUITE = (
    ("fedat_cnn", 32, 10, ["patches", "patches_xla", "shifted_sum"]),
    ("resnet20", 8, 5, ["patches", "im2col"]),
)


def _make_step(model, lr: float) -> Callable[..., Any]:
  """Plain SGD on (params, batch_stats); batch_stats may be empty."""

  def loss_fn(params, stats, xb, yb):
    variables = {"params": params, **({"batch_stats": stats} if stats else {})}
    if stats:
      logits, updates = model.apply(variables, xb, train=True,
                                    mutable=["batch_stats"])
      stats = updates["batch_stats"]
    else:
      logits = model.apply(variables, xb, train=True)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()
    return loss, stats

  def step(state, batch):
    params, stats = state
    grads, stats = jax.grad(loss_fn, has_aux=True)(params, stats, *batch)
    params = jax.tree.map(lambda p, g: p - lr * g, params, grads)
    return (params, stats), None

  return step


def _plans(name: str, clients: int, steps: int, batch: int, lr: float,
           impls: list[str], unrolls: list[int], chunks: list[int],
           with_lax_scan: bool, all_loops: bool, seed: int = 0):
  """Returns {plan name: (run() -> per-client final params, kind)}."""
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(clients, steps, batch, 32, 32, 3)),
                  jnp.float32)
  y = jnp.asarray(rng.integers(0, 10, size=(clients, steps, batch)))
  xc = x.swapaxes(0, 1).reshape((steps, clients * batch) + x.shape[3:])
  yc = y.swapaxes(0, 1).reshape(steps, clients * batch)

  def setup(impl):
    model = models.get(name, 10, kernels=conv_plans.kernels_for(impl))
    variables = model.init(jax.random.PRNGKey(seed), x[0, 0])
    state = (variables["params"], variables.get("batch_stats", {}))
    return state, _make_step(model, lr)

  plans = {}
  loop_impls = ["lax"] + [i for i in impls if i != "lax"]
  for impl in loop_impls if all_loops else loop_impls[:2]:
    state, step = setup(impl)
    jstep = jax.jit(lambda s, xb, yb, step=step: step(s, (xb, yb))[0])

    def loop(state=state, jstep=jstep):
      out = []
      for c in range(clients):
        s = state
        for k in range(steps):
          s = jstep(s, x[c, k], y[c, k])
        out.append(s[0])
      return jax.tree.map(lambda *a: jnp.stack(a), *out)

    def central(state=state, jstep=jstep):
      s = state
      for k in range(steps):
        s = jstep(s, xc[k], yc[k])
      return s[0]

    plans[f"loop[{impl}]"] = (loop, "loop")
    plans[f"central[{impl}]"] = (central, "central")

  scan_impls = [i for i in impls if i != "lax"] + (
      ["lax"] if with_lax_scan else [])
  for impl in scan_impls:
    state, step = setup(impl)
    for unroll in unrolls:
      local = lambda s, xs, ys, step=step, unroll=unroll: lax.scan(
          step, s, (xs, ys), unroll=unroll)[0][0]
      run = jax.jit(jax.vmap(local, in_axes=(None, 0, 0)))
      plans[f"vmap_scan[{impl},u{unroll}]"] = (
          lambda run=run, state=state: run(state, x, y), "vmap_scan")
    for chunk in chunks:
      if clients % chunk:
        raise ValueError(f"--chunks: {chunk} does not divide {clients} clients")
      local = lambda s, xs, ys, step=step: lax.scan(step, s, (xs, ys))[0][0]
      vlocal = jax.vmap(local, in_axes=(None, 0, 0))

      def chunked(s, x, y, vlocal=vlocal, chunk=chunk):
        split = lambda a: a.reshape((clients // chunk, chunk) + a.shape[1:])
        out = lax.map(lambda xy: vlocal(s, *xy), (split(x), split(y)))
        return jax.tree.map(
            lambda a: a.reshape((clients,) + a.shape[2:]), out)

      run = jax.jit(chunked)
      plans[f"chunked_scan[{impl},c{chunk}]"] = (
          lambda run=run, state=state: run(state, x, y), "vmap_scan")
  return plans


def _max_diff(a, b) -> float:
  return max(float(jnp.max(jnp.abs(u - v))) for u, v in zip(
      jax.tree.leaves(a), jax.tree.leaves(b)))


def run_config(name: str, clients: int, steps: int, batch: int, lr: float,
               impls: list[str], unrolls: list[int], chunks: list[int],
               repeats: int, with_lax_scan: bool,
               all_loops: bool) -> dict[str, Any]:
  """Measures every plan for one model; prints a table; returns the numbers."""
  samples = clients * steps * batch
  print(f"\n== {name}: {clients} clients x {steps} steps x batch {batch}, "
        f"SGD lr {lr} ({samples} samples per call)", flush=True)
  plans = _plans(name, clients, steps, batch, lr, impls, unrolls, chunks,
                 with_lax_scan, all_loops)
  first, best, outputs = {}, {}, {}
  for plan, (run, _) in plans.items():
    t0 = time.perf_counter()
    outputs[plan] = jax.block_until_ready(run())
    first[plan] = time.perf_counter() - t0
    best[plan] = float("inf")
    print(f"  warm-up {plan:30s} {first[plan]:7.1f} s", flush=True)
  for _ in range(repeats):
    for plan, (run, _) in plans.items():
      t0 = time.perf_counter()
      jax.block_until_ready(run())
      best[plan] = min(best[plan], time.perf_counter() - t0)
  base = best["loop[lax]"]
  central = min(t for p, t in best.items() if plans[p][1] == "central")
  rows = []
  print(f"  {'plan':30s} {'samples/s':>10s} {'x loop[lax]':>11s} "
        f"{'x central':>9s} {'first s':>8s} {'max|dparams|':>12s}")
  for plan, t in best.items():
    diff = (_max_diff(outputs[plan], outputs["loop[lax]"])
            if plans[plan][1] != "central" else None)
    row = {"plan": plan, "samples_per_s": samples / t,
           "ratio_to_loop": base / t, "ratio_to_central": central / t,
           "first_call_s": first[plan], "best_s": t,
           "max_param_diff_vs_loop": diff}
    rows.append(row)
    print(f"  {plan:30s} {row['samples_per_s']:10.0f} "
          f"{row['ratio_to_loop']:11.2f} {row['ratio_to_central']:9.2f} "
          f"{first[plan]:8.1f} {'' if diff is None else f'{diff:12.1e}'}",
          flush=True)
  scans = [r for r in rows if plans[r["plan"]][1] == "vmap_scan"]
  if scans:
    top = max(scans, key=lambda r: r["ratio_to_loop"])
    print(f"  best engine plan {top['plan']}: {top['ratio_to_loop']:.2f}x "
          f"loop[lax], {top['ratio_to_central']:.2f}x central", flush=True)
  return {"model": name, "clients": clients, "steps": steps, "batch": batch,
          "lr": lr, "repeats": repeats, "rows": rows}


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--models", default=None,
                      help="comma list; default: fedat_cnn (32 clients x 10 "
                      "steps) then resnet20 (8 x 5)")
  parser.add_argument("--clients", type=int, default=None)
  parser.add_argument("--steps", type=int, default=None)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--lr", type=float, default=0.01)
  parser.add_argument("--impls", default=None,
                      help=f"conv plans to run in vmap_scan, from "
                      f"{','.join(conv_plans.PLANS)} (default: per model, "
                      "see _DEFAULT_SUITE; patches for other models)")
  parser.add_argument("--unrolls", default="1")
  parser.add_argument("--chunks", default="",
                      help="client chunk sizes: lax.map over chunks of "
                      "vmap(scan), e.g. 1,4 (default: none)")
  parser.add_argument("--all_loops", action="store_true",
                      help="loop/central plans for every impl, not only "
                      "lax and the first of --impls")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--with_lax_scan", action="store_true",
                      help="also vmap_scan[lax] (about 15-20x slower: minutes)")
  args = parser.parse_args(argv)

  impls = [i for i in args.impls.split(",") if i] if args.impls else None
  for impl in impls or []:
    conv_plans.resolve(impl)  # Fails early naming the accepted values.
  unrolls = [int(u) for u in args.unrolls.split(",")]
  chunks = [int(c) for c in args.chunks.split(",") if c]
  defaults = {m: (c, k, i) for m, c, k, i in _DEFAULT_SUITE}
  names = (args.models.split(",") if args.models
           else [m for m, *_ in _DEFAULT_SUITE])
  suite = []
  for m in names:
    if m not in models.names():
      sys.exit(f"--models: unknown model {m!r}; known: {models.names()}")
    c, k, i = defaults.get(m, (8, 10, ["patches"]))
    suite.append((m, args.clients or c, args.steps or k, impls or i))

  print(f"jax {jax.__version__} on {jax.default_backend()} "
        f"({jax.devices()[0].device_kind}), {benchmark.host_cpu()}; "
        f"kernels.resolve('auto') = {conv_plans.resolve('auto')}")
  results = [run_config(m, c, k, args.batch, args.lr, i, unrolls, chunks,
                        args.repeats, args.with_lax_scan, args.all_loops)
             for m, c, k, i in suite]
  print(json.dumps({"benchmark": "conv_plans", "jax": jax.__version__,
                    "backend": jax.default_backend(), "results": results}))


if __name__ == "__main__":
  main()
