r"""Convolution plans layer by layer, inside a scan, against lax outside any loop (issue 20).

  python -m benchmarks.conv.conv_layers --models=leaf_cnn,pfl_cnn --steps=3 --repeats=10 [--batch=32]
  taskset -c 1 python -m benchmarks.conv.conv_layers ...   # one core, beside other jobs

For every convolution layer of each model (the shapes its `init` passes to its conv kernel),
times, in one process and interleaved, the gradient of sum(conv(x, kernel)^2) with respect to
the kernel (and to the input, past the first layer, as in training) plus an SGD update, over a
rolled `lax.scan` of --steps batches (the engine's shape; the figures in RULES.md used
--steps=3 --repeats=10), for each plan of `fedjax_lama.kernels` and `plans`: im2col, channel_major, row_shift (stride 1 along H only),
winograd (F(4x4, 3x3) and F(2x2, 5x5); stride-1 layers only), standard_layout, and lax (the
conv-in-loop trap); and the same step with lax convolutions
jitted ONCE outside any loop, the per-step loop's shape ("lax_outside"). Prints milliseconds
per step, the plan `patches_conv` picks for the layer, and each plan's largest gradient
difference from lax relative to its largest entry. The per-layer rules in
`fedjax_lama.kernels.conv` come from these figures and from whole-model runs (RULES.md): a plan
that wins a layer alone can lose in the model, so check a rule change with the engine benchmark.
The last line is one JSON object with every number.
"""
import json
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.conv import plans as conv_plans
from benchmarks import benchmark
from fedjax_lama import kernels
from fedjax_lama.kernels import conv as kconv
from fedjax_lama.kernels import winograd

FLAGS = flags.FLAGS
# --batch (examples per step), --steps (steps of the timed scan) and --repeats (timed calls of
# each plan after one warm-up; the best counts) are benchmarks.benchmark's flags.
flags.DEFINE_list("models", ["leaf_cnn"], "Models whose convolution layers are timed.")
flags.DEFINE_list("plans", ["im2col", "channel_major", "row_shift", "winograd",
                            "standard_layout", "lax"], "Plans timed inside the scan.")

_DIRECT = {"im2col": kconv.im2col_conv, "channel_major": kconv.channel_major_conv,
           "row_shift": kconv.row_shift_conv, "winograd": winograd.winograd_conv,
           "standard_layout": conv_plans.standard_layout_conv,
           "lax": lambda x, k, s, p: kconv.lax_conv(x, k, s, p)}
# Where `patches_conv` finds each of its picks (monkeypatched to see which it takes).
_PICKS = {"im2col": kconv, "channel_major": kconv, "row_shift": kconv, "winograd": winograd}


def conv_layers(model_name: str) -> list[tuple]:
  """(input shape without batch, kernel shape, strides, padding) of each conv of a model."""
  seen, lax_set = [], kernels.get("lax")

  def record(x, kernel, strides=(1, 1), padding="SAME", bias=None):
    key = (tuple(x.shape[1:]), tuple(kernel.shape), tuple(strides),
           padding if isinstance(padding, str) else tuple(map(tuple, padding)))
    if key not in seen:
      seen.append(key)
    return lax_set.conv(x, kernel, strides, padding, bias)

  shape = benchmark.INPUT_SHAPES.get(model_name, (32, 32, 3))
  recording = kernels.Kernels("record", record, lax_set.dense, lax_set.max_pool)
  model, _ = benchmark._model(model_name, recording)  # pylint: disable=protected-access
  jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1,) + shape),
                                    train=False))
  return seen


def _best_ms(fn, *args, repeats):
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - t0)
  return 1e3 * best


def picked_plan(x_shape, kernel_shape, strides, padding) -> str:
  """The plan `patches_conv` takes for a layer (traced on shapes only)."""
  called, saved = [], {name: getattr(module, f"{name}_conv") for name, module in _PICKS.items()}
  try:
    for name, fn in saved.items():
      setattr(_PICKS[name], f"{name}_conv",
              lambda *a, _n=name, _f=fn: called.append(_n) or _f(*a))
    jax.eval_shape(lambda x, k: kconv.patches_conv(x, k, strides, padding),
                   jax.ShapeDtypeStruct(x_shape, jnp.float32),
                   jax.ShapeDtypeStruct(kernel_shape, jnp.float32))
  finally:
    for name, fn in saved.items():
      setattr(_PICKS[name], f"{name}_conv", fn)
  return called[0]


def time_layer(in_shape, kernel_shape, strides, padding, first: bool, batch: int, steps: int,
               plans, repeats: int, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  xs = jnp.asarray(rng.normal(size=(steps, batch) + in_shape), jnp.float32)
  params = {"kernel": jnp.asarray(rng.normal(size=kernel_shape) / np.sqrt(
      np.prod(kernel_shape[:3])), jnp.float32), "scale": jnp.ones(())}

  def grads(conv, p, x):
    # Past the first layer the input depends on parameters, so its gradient is computed too.
    return jax.grad(lambda q: jnp.sum(conv(x if first else x * q["scale"], q["kernel"],
                                           strides, padding) ** 2))(p)

  def sgd(p, g):
    return jax.tree.map(lambda a, b: a - 1e-3 * b, p, g)

  row = {"input": in_shape, "kernel": kernel_shape, "strides": strides,
         "padding": padding if isinstance(padding, str) else [list(p) for p in padding],
         "picked": picked_plan((batch,) + in_shape, kernel_shape, strides, padding), "ms": {},
         "max_rel_grad_diff": {}}
  reference = jax.jit(lambda p, x: grads(_DIRECT["lax"], p, x))(params, xs[0])
  scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(reference))
  for name in plans:
    if (name == "row_shift" and strides[0] != 1) or (
        name == "winograd" and not winograd.winograd_applies(kernel_shape, strides)):
      continue  # The plan cannot compute this layer.
    conv = _DIRECT[name]
    scanned = jax.jit(lambda p, x, conv=conv: jax.lax.scan(
        lambda q, xb: (sgd(q, grads(conv, q, xb)), None), p, x)[0])
    row["ms"][name] = _best_ms(scanned, params, xs, repeats=repeats) / steps
    got = jax.jit(lambda p, x, conv=conv: grads(conv, p, x))(params, xs[0])
    row["max_rel_grad_diff"][name] = max(
        float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(got),
                                                        jax.tree.leaves(reference))
    ) / scale
  outside = jax.jit(lambda p, x: sgd(p, grads(_DIRECT["lax"], p, x)))
  row["ms"]["lax_outside"] = _best_ms(outside, params, xs[0], repeats=repeats)
  return row


def main(argv):
  del argv
  results = {}
  for name in FLAGS.models:
    rows = []
    for i, (in_shape, kernel_shape, strides, padding) in enumerate(conv_layers(name)):
      row = time_layer(in_shape, kernel_shape, strides, padding, i == 0, FLAGS.batch,
                       FLAGS.steps, FLAGS.plans, FLAGS.repeats)
      times = ", ".join(f"{k} {v:.2f}" for k, v in row["ms"].items())
      print(f"{name} {in_shape} kernel {kernel_shape} strides {strides} {padding}: picked "
            f"{row['picked']}; ms per step: {times}", flush=True)
      rows.append(row)
    results[name] = rows
  print(json.dumps({"batch": FLAGS.batch, "steps": FLAGS.steps, "repeats": FLAGS.repeats,
                    "platform": jax.default_backend(), "jax": jax.__version__,
                    "models": results}))


if __name__ == "__main__":
  app.run(main)
