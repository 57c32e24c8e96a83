r"""Engine training throughput vs a per-step Python loop and the centralized ceiling.

  python -m experiments.benchmark [--model=fedat_cnn --clients=32 --steps=10 --batch=32]

Three plans train the same clients on the same CIFAR-shaped random data, side by
side in one process (architecture.md 4):
  loop     what FedJAX's default backend and most PyTorch simulators do: for each
           client, for each step, call one jitted SGD step (lax convolutions);
  engine   this project's round: one jitted call of a vmapped rolled `lax.scan`
           over local steps, then the masked server mean, with the convolution
           plan the engine picks for the platform (`--conv_impl`, default auto);
  ceiling  one shared model, one jitted SGD step over the whole cohort's batch
           (clients x batch examples), called `steps` times from Python: simulating
           N clients cannot be cheaper than training one model on the same samples.
           Measured with lax convolutions and with the engine's plan; the faster counts.
The last line printed is one JSON object with the samples/s of each plan and the
ratios engine/loop (`ratio`) and engine/ceiling (`engine_vs_ceiling`).
"""
import json
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_lama import algorithms, models
from fedjax_lama.engine import local, round as round_lib

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "fedat_cnn", "Model name (fedjax_lama.models.names()).")
flags.DEFINE_integer("clients", 32, "Clients per round.")
flags.DEFINE_integer("steps", 10, "Local steps per client.")
flags.DEFINE_integer("batch", 32, "Local batch size.")
flags.DEFINE_integer("repeats", 3, "Timed rounds of each plan, interleaved, after one warm-up; "
                     "the best counts.")
flags.DEFINE_string("conv_impl", "auto", "Engine convolution plan: auto, lax or patches.")
flags.DEFINE_integer("unroll", 1, "lax.scan unroll of the engine.")

INPUT_SHAPES = {"leaf_cnn": (28, 28, 1), "mnist_mlp": (28, 28, 1), "mnist_cnn": (28, 28, 1),
                "mlp": (8, 8, 1)}
NUM_CLASSES = {"leaf_cnn": 62, "wrn28_10": 100}
LR = 0.01


def _model(name, conv_impl):
  num_classes = NUM_CLASSES.get(name, 10)
  return models.get(name, num_classes=num_classes, conv_impl=conv_impl), num_classes


def _time(fn):
  t0 = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - t0


def _sgd_step(model, has_state):
  """One jitted plain-SGD step of one model on one batch (every example real)."""
  loss_fn = local.make_loss_fn(model, has_state)
  key = jax.random.PRNGKey(0)

  @jax.jit
  def step(p, s, xb, yb):
    (_, (s, _)), g = jax.value_and_grad(loss_fn, has_aux=True)(p, s, xb, yb,
                                                              jnp.ones(xb.shape[0]), key)
    return jax.tree_util.tree_map(lambda a, b: a - LR * b, p, g), s

  return step


def run(model_name="fedat_cnn", clients=32, steps=10, batch=32, repeats=3, conv_impl="auto",
        unroll=1, ceiling_impls=("lax", "engine")) -> dict:
  """Times the three plans; ceiling_impls: the ceiling's convolution plans ("engine": the
  engine's), the fastest counts."""
  shape = INPUT_SHAPES.get(model_name, (32, 32, 3))
  engine_impl = models.resolve_conv_impl(conv_impl)
  engine_model, num_classes = _model(model_name, engine_impl)
  loop_model, _ = _model(model_name, "lax")
  data_rng = np.random.default_rng(0)
  n = clients * steps * batch
  data_x = jnp.asarray(data_rng.normal(size=(n,) + shape).astype(np.float32))
  data_y = jnp.asarray(data_rng.integers(0, num_classes, size=n).astype(np.int32))
  variables = engine_model.init(jax.random.PRNGKey(0), data_x[:1], train=False)
  params, model_state = variables["params"], variables.get("batch_stats", {})
  has_state = bool(jax.tree_util.tree_leaves(model_state))
  indices = np.arange(n, dtype=np.int32).reshape(clients, steps, batch)

  # Engine: one jitted vmapped scan for the cohort, then the server mean.
  alg = algorithms.build("fedavg")
  train_chunk, server_update = round_lib.make_round_fns(
      local.make_loss_fn(engine_model, has_state), alg, optax.constant_schedule(LR), seed=0,
      weighting="uniform", local_steps=steps, population=clients, unroll=unroll)
  server = alg.init_server(params, model_state)
  cohort = round_lib.Cohort(jnp.asarray(indices), jnp.ones((clients, steps, batch)),
                            jnp.ones((clients, steps)), jnp.ones((clients,)),
                            jnp.arange(clients, dtype=jnp.int32), jnp.ones((clients,)))

  def engine_round():
    sums, _, _ = train_chunk(server, {}, data_x, data_y, cohort, 0)
    return server_update(server, sums).params

  # Loop baseline: per client, per step, one jitted SGD step; then the mean.
  sgd_step = _sgd_step(loop_model, has_state)
  host_x = [[data_x[indices[c, k]] for k in range(steps)] for c in range(clients)]
  host_y = [[data_y[indices[c, k]] for k in range(steps)] for c in range(clients)]
  mean = jax.jit(lambda *ps: jax.tree_util.tree_map(lambda *xs: sum(xs) / len(xs), *ps))

  def loop_round():
    finals = []
    for c in range(clients):
      p, s = params, model_state
      for k in range(steps):
        p, s = sgd_step(p, s, host_x[c][k], host_y[c][k])
      finals.append(p)
    return mean(*finals)

  # Centralized ceiling: one shared model, step k trains on every client's batch k.
  central_x = [data_x[indices[:, k].reshape(-1)] for k in range(steps)]
  central_y = [data_y[indices[:, k].reshape(-1)] for k in range(steps)]
  ceilings = {}
  for impl in ceiling_impls:
    impl = engine_impl if impl == "engine" else models.resolve_conv_impl(impl)
    ceilings[impl] = engine_model if impl == engine_impl else _model(model_name, impl)[0]

  def central_round(step):
    def go():
      p, s = params, model_state
      for k in range(steps):
        p, s = step(p, s, central_x[k], central_y[k])
      return p
    return go

  plans = {"loop": loop_round, "engine": engine_round}
  plans.update({f"ceiling_{impl}": central_round(_sgd_step(m, has_state))
                for impl, m in ceilings.items()})
  first = {name: _time(fn) for name, fn in plans.items()}  # compile + one run
  best = {name: float("inf") for name in plans}
  for _ in range(repeats):  # interleaved, against the drift of a shared machine
    for name, fn in plans.items():
      best[name] = min(best[name], _time(fn))
  ceiling_impl = min(ceilings, key=lambda impl: best[f"ceiling_{impl}"])
  ceiling_t = best[f"ceiling_{ceiling_impl}"]
  engine_t, loop_t = best["engine"], best["loop"]
  samples = clients * steps * batch
  return {"model": model_name, "clients": clients, "steps": steps, "batch": batch,
          "platform": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
          "engine_conv_impl": engine_impl, "ceiling_conv_impl": ceiling_impl,
          "engine_samples_per_s": samples / engine_t, "loop_samples_per_s": samples / loop_t,
          "ceiling_samples_per_s": samples / ceiling_t,
          "ratio": loop_t / engine_t, "engine_vs_ceiling": ceiling_t / engine_t,
          "first_call_s": first,
          "seconds_per_round": {name: t for name, t in best.items()}}


def main(argv):
  del argv
  result = run(FLAGS.model, FLAGS.clients, FLAGS.steps, FLAGS.batch, FLAGS.repeats,
               FLAGS.conv_impl, FLAGS.unroll)
  print(f"{result['model']}: {result['clients']} clients x {result['steps']} steps x batch "
        f"{result['batch']} on {result['platform']} ({result['device_kind']}): engine "
        f"{result['engine_samples_per_s']:.0f} samples/s, per-step loop "
        f"{result['loop_samples_per_s']:.0f} samples/s, centralized ceiling "
        f"{result['ceiling_samples_per_s']:.0f} samples/s; engine/loop {result['ratio']:.2f}, "
        f"engine/ceiling {result['engine_vs_ceiling']:.2f}")
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
