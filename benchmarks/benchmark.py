r"""Engine training throughput against the hardware's limit, a per-step loop and peers.

  python -m benchmarks.benchmark [--model=fedat_cnn --clients=32 --steps=10 --batch=32]
  python -m benchmarks.benchmark --peers=fedjax [--peers_path=/tmp/peers]
  python -m benchmarks.benchmark --model=lstm_lm --clients=8 --steps=5 --batch=16 \
      --peers=fedjax,torch --peers_path=/tmp/peers    # under a python that has torch
  python -m benchmarks.benchmark --model=transformer_lm [--model_options='{"width": 256}']
  python -m benchmarks.benchmark --model=wrn28_10 --clients=8 --steps=5 --batch=32 \
      --repeats=1 --central=       # 16 min on a 2-core CPU; no whole-cohort batch

Side by side in one process, interleaved (best of --repeats after one warm-up each; a
timed sample is the mean of the fewest consecutive rounds lasting --min_sample_s, so a
round of a millisecond is not timed alone), on
the same clients and the same random data shaped like the model's dataset
(docs/performance.md):
  engine   this project's round: one jitted call of the local training of every client
           (a rolled `lax.scan` over local steps; clients added by `engine.local`'s client
           map, --client_map) with the convolution plan the engine picks for the platform
           (--conv_impl, default auto), then the masked server mean;
  loop     what FedJAX's default backend and most PyTorch simulators do: for each client,
           for each step, call one jitted SGD step (lax convolutions);
  central  the "centralized step", a reference only: one shared model, one jitted SGD
           step over the whole cohort's batch (clients x batch examples), called `steps`
           times. It is NOT a limit: the engine can beat it (a batch of clients x batch
           examples spills caches that one client's batch fits in). Measured with lax
           convolutions and with the engine's plan (--central), the faster counts;
  matmul   a dense float32 matmul (--matmul_size, 2048: 2 n^3 FLOPs; 3 calls per repeat,
           the best counts), the machine's measured peak FLOP/s in this process, under the
           same load as the plans;
  peers    with --peers=fedjax, FedJAX 0.0.17's `fed_avg` (its default jit backend) on the
           identical model (this zoo's flax module in a `fedjax.Model`), data and shapes,
           when FedJAX is importable (requirements-peers.txt; third_party/fedjax_peer.py);
           on `lstm_lm`, FedJAX's own Shakespeare model (below). With --peers=torch
           (lstm_lm only), the same LSTM in PyTorch trained client after client, plain
           SGD, on --torch_threads threads (third_party/torch_lstm.py).

Text models (`lstm_lm`, `transformer_lm`): random windows of 80 tokens over Shakespeare's
81 ids with next-token targets; `lstm_lm` is the FedAvg paper's and LEAF's character LSTM
(embedding 8, two LSTMs of 256, no dropout or batch normalisation), `transformer_lm` its
named size `small` (824,401 parameters, about the LSTM's 818,137); --model_options (JSON)
changes either. With --peers=fedjax the LSTM is FedJAX's Shakespeare model in every arm
(its 90 ids, a tanh after each LSTM layer: `FEDJAX_SHAKESPEARE`), FedJAX running its haiku
module from the same weights (mapped by `fedjax_peer.flax_from_haiku`), so every arm
computes one function. Text rows also report tokens/s and FLOPs per token, and for the LSTM
the recurrence's cost (`recurrence_plans`): the matmul of the second layer's step,
[batch, 512] x [512, 1024], chained over the 80 positions in a `lax.scan` (each step waits
for the last, as the LSTM's do) against the same 80 matmuls as one [80 batch, 512] product
(what a transformer's position-parallel layers get), both as FLOP/s beside the peak.

Model FLOP utilization (MFU): `flops_per_sample` is XLA's cost analysis of ONE
un-vectorized plain-SGD training step of the model with lax convolutions (forward,
backward, update) divided by the batch: the useful work of a sample, one count for every
plan (a plan that computes more, such as padded rows, gets no credit for it).
`engine_flops_per_s` = flops_per_sample x engine samples/s, `peak_flops_per_s` the best
matmul rate, `mfu` = engine_flops_per_s / peak_flops_per_s.

The last line printed is one JSON object: samples/s of each plan, the ratios engine/loop
(`ratio`), engine/central (`engine_vs_central`), engine/peer, the FLOP figures and the
load average of the machine before and after (other jobs share a CPU box: compare ratios
from one run, never absolute times across runs).
"""
import json
import math
import os
import time
from typing import Any, NamedTuple

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.conv import plans as conv_plans
from benchmarks.round_timing import host_cpu
from fedjax_lama import algorithms, models
from fedjax_lama.cli import cpu_devices
from fedjax_lama.data import leaf_text
from fedjax_lama.engine import cohort as cohort_lib, local, sharding, sync_round
from fedjax_lama.engine import plan as plan_lib
from fedjax_lama.models import transformer
from third_party import fedjax_peer, torch_lstm

FLAGS = flags.FLAGS
MIN_SAMPLE_S = 0.2  # seconds a timed sample lasts at least (rounds_per_sample)
# The centralized step's convolution plans ("engine": the engine's own plan).
CENTRAL_IMPLS = ("lax", "engine")
flags.DEFINE_string("model", "fedat_cnn", "Model name (fedjax_lama.models.names()).")
flags.DEFINE_integer("clients", 32, "Clients per round.")
flags.DEFINE_integer("steps", 10, "Local steps per client.")
flags.DEFINE_integer("batch", 32, "Local batch size.")
flags.DEFINE_integer("repeats", 3, "Timed rounds of each plan, interleaved, after one warm-up; "
                     "the best counts.")
flags.DEFINE_string("conv_impl", "auto", "Engine convolution plan: auto, lax or patches.")
flags.DEFINE_integer("unroll", 1, "lax.scan unroll of the engine.")
flags.DEFINE_enum("client_map", "auto", list(local.CLIENT_MAPS),
                  "How the engine adds the client axis (engine/local.py CLIENT_MAPS).")
flags.DEFINE_bool("compare_client_maps", False, "Also time the engine with the other client "
                  "map (scan or vmap) side by side.")
flags.DEFINE_list("compare_conv_impls", [], "Also time the engine with these convolution plans "
                  "(e.g. lax,patches) side by side, each checked against the engine's result.")
flags.DEFINE_float("min_sample_s", MIN_SAMPLE_S, "A timed sample of a plan is the mean of the "
                   "fewest consecutive calls lasting about this long (0: single calls).")
flags.DEFINE_integer("matmul_size", 2048, "n of the n x n x n float32 matmul timed as the peak.")
flags.DEFINE_list("central", list(CENTRAL_IMPLS), "Convolution plans of the centralized step "
                  "(lax, engine: the engine's plan); empty (--central=) leaves it out, as for "
                  "models whose whole-cohort batch does not fit in memory.")
flags.DEFINE_list("peers", [], "Peer simulators to run side by side: fedjax, torch "
                  "(lstm_lm only).")
flags.DEFINE_string("model_options", "", "Text models: options as JSON over the benchmark's "
                    "(TEXT_MODELS).")
flags.DEFINE_integer("window", 80, "Text models: tokens per window (TEXT_WINDOW, LEAF's 80).")
flags.DEFINE_integer("torch_threads", 0, "--peers=torch: torch.set_num_threads (0: the cores "
                     "this process may use).")
flags.DEFINE_string("peers_path", os.environ.get("FEDJAX_LAMA_PEERS_PATH", ""),
                    "A directory appended to sys.path to import the peers from, e.g. the "
                    "target of `pip install --no-deps --target DIR -r requirements-peers.txt`.")

INPUT_SHAPES = {"leaf_cnn": (28, 28, 1), "mnist_mlp": (28, 28, 1), "mnist_cnn": (28, 28, 1),
                "mlp": (8, 8, 1)}
NUM_CLASSES = {"leaf_cnn": 62, "wrn28_10": 100}
LR = 0.01
PEERS = ("fedjax", "torch")
# Text models: windows of TEXT_WINDOW tokens over TEXT_VOCAB ids (LEAF's Shakespeare table
# and its other-character id), and the options of the benchmark's models.
TEXT_WINDOW, TEXT_VOCAB = 80, len(leaf_text.SHAKESPEARE_VOCAB)
TEXT_MODELS = {
    "lstm_lm": {"vocab_size": TEXT_VOCAB, "embed_size": 8, "hidden_size": 256,
                "num_layers": 2, "dropout": 0.0, "batch_norm": False},
    "transformer_lm": {"vocab_size": TEXT_VOCAB, **transformer.SIZES["small"]},
}
# lstm_lm as FedJAX's Shakespeare model (fedjax.models.shakespeare.create_lstm_model): its
# 90 ids and a tanh after each LSTM layer.
FEDJAX_SHAKESPEARE = {"vocab_size": 90, "tanh_outputs": True}


def _model(name, conv_impl, options=None):
  """(module, num_classes); text models take TEXT_MODELS' options updated by `options`."""
  if isinstance(conv_impl, str):  # a plan's name; the measurement-only ones live in benchmarks
    conv_impl = conv_plans.kernels_for(conv_impl)
  if name in TEXT_MODELS:
    opts = {**TEXT_MODELS[name], **(options or {})}
    return models.get(name, num_classes=opts["vocab_size"], kernels=conv_impl, **opts), (
        opts["vocab_size"])
  if options:
    raise ValueError(f"--model_options: only the text models ({', '.join(TEXT_MODELS)}) "
                     f"take options here; got {name!r}")
  num_classes = NUM_CLASSES.get(name, 10)
  return models.get(name, num_classes=num_classes, kernels=conv_impl), num_classes


def example_spec(model_name: str, input_shape=None) -> tuple[tuple, Any, tuple]:
  """(input shape, input dtype, label shape) of one example: images and one class, or a
  text window of int tokens (input_shape: (window,), default TEXT_WINDOW) and its
  next-token targets."""
  if model_name in TEXT_MODELS:
    shape = tuple(input_shape or (TEXT_WINDOW,))
    return shape, jnp.int32, shape
  return tuple(input_shape or INPUT_SHAPES.get(model_name, (32, 32, 3))), jnp.float32, ()


def time_calls(fn, rounds: int = 1):
  """Seconds per call of `fn`, averaged over `rounds` calls timed as one sample (each call
  waited for, so calls never overlap)."""
  t0 = time.perf_counter()
  for _ in range(rounds):
    jax.block_until_ready(fn())
  return (time.perf_counter() - t0) / rounds


def rounds_per_sample(estimate_s: float, min_sample_s: float) -> int:
  """Calls per timed sample: the fewest whose estimated time reaches `min_sample_s` (at
  least 1). A round of a millisecond timed alone is mostly timer and cache noise (timeit's
  autorange does the same)."""
  if min_sample_s <= 0 or estimate_s >= min_sample_s:
    return 1
  return max(1, math.ceil(min_sample_s / max(estimate_s, 1e-9)))


def _sgd_step(model, has_state, jit=True):
  """One plain-SGD step of one model on one batch (every example real)."""
  loss_fn = local.make_loss_fn(model, has_state)
  key = jax.random.PRNGKey(0)

  def step(p, s, xb, yb):
    (_, (s, _)), g = jax.value_and_grad(loss_fn, has_aux=True)(p, s, xb, yb,
                                                              jnp.ones(xb.shape[0]), key)
    return jax.tree.map(lambda a, b: a - LR * b, p, g), s

  return jax.jit(step) if jit else step


def _cost_flops(compiled) -> float:
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):  # older jax: one dict per computation
    analysis = analysis[0]
  return float(analysis["flops"])


def training_flops_per_sample(model_name: str, batch: int = 32, conv_impl: str = "lax",
                              input_shape=None, options=None) -> float:
  """XLA's FLOP count of ONE un-vectorized plain-SGD step on `batch` examples, per example.

  The step is what `loop` runs (forward, backward, parameter update of one model on one
  batch), lowered and compiled for the CPU on every platform; `cost_analysis()["flops"]` counts
  the multiply-adds of dots and convolutions as 2 FLOPs and elementwise ops as 1. The
  benchmark counts it with lax convolutions (`conv_impl="lax"`) for every plan: the useful
  work of a sample, whatever plan computes it. A text sample is a window: divide by
  TEXT_WINDOW for a token's. The LSTM's loop over positions is counted once per position
  (XLA counts a loop's body once).
  """
  shape, x_dtype, label_shape = example_spec(model_name, input_shape)
  model, _ = _model(model_name, conv_plans.resolve(conv_impl), options)
  # Counted on the CPU backend whatever the default one: XLA:GPU's cost analysis leaves out
  # the convolutions it hands to cuDNN (custom calls), so on an H200 it read 0.86 MFLOP
  # for FedAT's CNN against the CPU's 26.2 (docs/performance.md, "GPU: one NVIDIA H200").
  on_cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
  spec = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=on_cpu)
  x = spec(jax.ShapeDtypeStruct((batch,) + shape, x_dtype))
  y = spec(jax.ShapeDtypeStruct((batch,) + label_shape, jnp.int32))
  variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                                jnp.zeros((1,) + shape, x_dtype), train=False))
  params, state = jax.tree.map(spec, (variables["params"],
                                      variables.get("batch_stats", {})))
  count = lambda m: _cost_flops(_sgd_step(m, bool(jax.tree.leaves(state))).lower(
      params, state, x, y).compile())
  flops = count(model)
  if model_name == "lstm_lm":
    # XLA's cost analysis counts a loop's body once, and the LSTM's positions are a
    # lax.scan (forward and backward): the body's count is the difference made by
    # unrolling it twice, and there are shape[0] positions. (Unrolling all of them would
    # count bookkeeping that grows with the positions, and compiles for minutes.)
    flops += (shape[0] - 1) * (count(model.clone(unroll=2)) - flops)
  return flops / batch


def matmul_plan(n: int = 2048):
  """(run, flops): one jitted n x n x n float32 matmul and its 2 n^3 FLOPs."""
  ka, kb = jax.random.split(jax.random.PRNGKey(1))
  a = jax.random.normal(ka, (n, n), jnp.float32)
  b = jax.random.normal(kb, (n, n), jnp.float32)
  dot = jax.jit(jnp.dot)
  return (lambda: dot(a, b)), 2.0 * n ** 3


def recurrence_plans(batch: int, inputs: int, hidden: int, steps: int = TEXT_WINDOW):
  """(chained, batched, flops): an LSTM layer's step matmul, [batch, inputs + hidden] x
  [inputs + hidden, 4 hidden], chained over `steps` positions in a `lax.scan` (each step's
  input is the last step's output, as in the LSTM), and the same `steps` matmuls as one
  [steps batch, inputs + hidden] product; both compute 2 steps batch (inputs + hidden)
  4 hidden FLOPs in their matmuls (every output column is used, so none is dropped)."""
  keys = jax.random.split(jax.random.PRNGKey(2), 3)
  w = jax.random.normal(keys[0], (inputs + hidden, 4 * hidden), jnp.float32) * 0.05
  xs = jax.random.normal(keys[1], (steps, batch, inputs), jnp.float32)
  hs = jax.random.normal(keys[2], (steps, batch, hidden), jnp.float32)

  def squash(z):
    return jnp.tanh(sum(jnp.split(z, 4, axis=-1)))

  @jax.jit
  def chained(w, xs):
    def step(h, x):
      return squash(jnp.concatenate([x, h], -1) @ w), None
    return jax.lax.scan(step, jnp.zeros((batch, hidden), jnp.float32), xs)[0]

  @jax.jit
  def batched(w, xs, hs):
    flat = jnp.concatenate([xs, hs], -1).reshape(steps * batch, inputs + hidden)
    return squash(flat @ w)

  flops = 2.0 * steps * batch * (inputs + hidden) * 4 * hidden
  return (lambda: chained(w, xs)), (lambda: batched(w, xs, hs)), flops


def _load() -> list:
  try:
    return [round(x, 2) for x in os.getloadavg()]
  except OSError:
    return []


def _max_abs_diff(a, b) -> float:
  return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a),
                                                            jax.tree.leaves(b)))


# ---- the benchmark -----------------------------------------------------------------------

class Workload(NamedTuple):
  """One benchmark row's model, random data shaped like its dataset, and FedAvg cohort."""
  model: Any
  shape: tuple  # one example's input shape
  data_x: jax.Array
  data_y: jax.Array
  indices: np.ndarray  # [clients, steps, batch] rows of data_x, in order
  params: Any
  model_state: Any
  has_state: bool
  clients: int
  steps: int
  batch: int


def workload(model_name: str, clients: int, steps: int, batch: int, conv_impl: str,
             options=None, token_ids=None, window: int = TEXT_WINDOW) -> Workload:
  """The model with `conv_impl`, seeded random data and parameters (the same for every call).

  Text: `window` tokens of TEXT_VOCAB ids, mapped through `token_ids` when given (FedJAX's
  ids)."""
  shape, _, _ = example_spec(model_name, (window,) if model_name in TEXT_MODELS else None)
  model, num_classes = _model(model_name, conv_impl, options)
  data_rng = np.random.default_rng(0)
  n = clients * steps * batch
  if model_name in TEXT_MODELS:
    tokens = data_rng.integers(0, TEXT_VOCAB, size=(n, window + 1)).astype(np.int32)
    if token_ids is not None:
      tokens = np.asarray(token_ids, np.int32)[tokens]
    data_x, data_y = jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:])
  else:
    data_x = jnp.asarray(data_rng.normal(size=(n,) + shape).astype(np.float32))
    data_y = jnp.asarray(data_rng.integers(0, num_classes, size=n).astype(np.int32))
  variables = model.init(jax.random.PRNGKey(0), data_x[:1], train=False)
  params, model_state = variables["params"], variables.get("batch_stats", {})
  return Workload(model, shape, data_x, data_y,
                  np.arange(n, dtype=np.int32).reshape(clients, steps, batch), params,
                  model_state, bool(jax.tree.leaves(model_state)), clients, steps,
                  batch)


def engine_round(w: Workload, client_map: str, unroll=1, mesh=None):
  """The engine's FedAvg round on `w` with `client_map`: one jitted call of every client's
  local training, then the server mean, the clients split over `mesh` (default: the devices
  a run of the CLI takes, `sharding.client_devices`), placed as the CLI places them. Returns
  a no-argument function giving the params; its `training_call` is (the jitted training
  call, its arguments), for tools that read its HLO; its `mesh` is the mesh."""
  if mesh is None:
    x = jax.ShapeDtypeStruct((w.batch,) + w.data_x.shape[1:], w.data_x.dtype)
    y = jax.ShapeDtypeStruct((w.batch,) + w.data_y.shape[1:], jnp.int32)
    step_bytes = local.step_bytes(local.make_loss_fn(w.model, w.has_state), w.params,
                                  w.model_state, x, y)
    mesh = sharding.client_mesh(sharding.client_devices(w.params, step_bytes, w.clients))
  alg = algorithms.build("fedavg")
  server = sharding.replicate(alg.server.init(w.params, w.model_state), mesh)
  c, k, b = w.clients, w.steps, w.batch
  cohort = sharding.shard_clients(cohort_lib.Cohort(
      jnp.asarray(w.indices), jnp.ones((c, k, b)), jnp.ones((c, k)), jnp.ones((c,)),
      jnp.arange(c, dtype=jnp.int32), jnp.ones((c,))), mesh)
  data_x, data_y = sharding.replicate((w.data_x, w.data_y), mesh)
  train_chunk, server_update = sync_round.make_round_fns(
      local.make_loss_fn(w.model, w.has_state), alg, optax.constant_schedule(LR), seed=0,
      weighting="uniform", local_steps=k, population=c, unroll=unroll,
      client_devices=mesh.size, plan=plan_lib.plan(client_map=client_map))

  def one_round():
    sums, _, _ = train_chunk(server, {}, data_x, data_y, cohort, 0)
    return server_update(server, sums).params

  one_round.training_call = (train_chunk, (server, {}, data_x, data_y, cohort, 0))
  one_round.mesh = mesh
  return one_round


def run(model_name="fedat_cnn", clients=32, steps=10, batch=32, repeats=3, conv_impl="auto",
        unroll=1, central_impls=CENTRAL_IMPLS, client_map="auto", peers=(),
        peers_path="", matmul_size=2048, loop=True, compare_client_maps=False,
        min_sample_s=MIN_SAMPLE_S, compare_conv_impls=(), model_options=None,
        torch_threads=0, window=TEXT_WINDOW) -> dict:
  """Times the plans side by side; returns the JSON dict (see the module docstring).

  central_impls: the centralized step's convolution plans ("engine": the engine's; empty:
  no centralized step), the faster counts. loop=False leaves the loop out.
  compare_client_maps: also time the engine with the other client map(s) (engine/local.py),
  reported as `engine_<map>_samples_per_s`.
  compare_conv_impls: also time the engine (same client map) with these convolution plans,
  reported as `engine_<plan>_samples_per_s` with `engine_<plan>_max_param_diff`, the
  largest |difference| of its round's parameters from the engine's.
  min_sample_s: each timed sample of a plan is the mean of the fewest consecutive calls
  that last about this long (`rounds_per_sample`, estimated from the plan's first timed
  call, which counts as a sample only when it is long enough; reported as
  `rounds_per_sample`); 0 times single calls.
  model_options: a text model's options over TEXT_MODELS'. torch_threads: the PyTorch
  loop's threads (0: the cores this process may use). window: a text model's tokens per
  window.
  """
  load_before = _load()
  unknown = [p for p in peers if p not in PEERS]
  if unknown:
    raise ValueError(f"--peers: unknown peer {unknown[0]!r}; accepted: {', '.join(PEERS)}")
  engine_impl = conv_plans.resolve(conv_impl)
  engine_map = local.resolve_client_map(client_map)
  options = dict(model_options or {})
  peer_notes = {}
  fedjax = fedjax_peer.import_fedjax(peers_path) if "fedjax" in peers else None
  if "fedjax" in peers and fedjax is None:
    peer_notes["fedjax"] = ("not installed: pip install --no-deps --target DIR -r "
                            "requirements-peers.txt, then --peers_path=DIR (docs/performance.md)")
  # On lstm_lm FedJAX runs its own Shakespeare model; every arm then computes that model.
  shakespeare = fedjax is not None and model_name == "lstm_lm"
  token_ids = None
  if shakespeare:
    options.update(FEDJAX_SHAKESPEARE)
    lstm = {**TEXT_MODELS[model_name], **options}
    fmodel = fedjax_peer.shakespeare_model(fedjax, lstm["embed_size"], lstm["hidden_size"],
                                           lstm["num_layers"])
    haiku_params = fmodel.init(jax.random.PRNGKey(0))
    token_ids = fedjax_peer.leaf_to_fedjax_ids(fedjax, leaf_text.SHAKESPEARE_CHARS)
  w = workload(model_name, clients, steps, batch, engine_impl, options, token_ids, window)
  if shakespeare:
    w = w._replace(params=fedjax_peer.flax_from_haiku(haiku_params, lstm["num_layers"]))
  engine_model, data_x, data_y, indices = w.model, w.data_x, w.data_y, w.indices
  params, model_state, has_state = w.params, w.model_state, w.has_state
  loop_model, _ = _model(model_name, "lax", options)
  flops_per_sample = training_flops_per_sample(model_name, batch, "lax", w.shape, options)

  plans = {"engine": engine_round(w, engine_map, unroll)}
  other_maps = [m for m in local.CLIENT_MAPS if m not in ("auto", engine_map)]
  if compare_client_maps:  # the other client map(s), as references
    plans.update({f"engine_{m}": engine_round(w, m, unroll) for m in other_maps})
  other_impls = [conv_plans.resolve(i) for i in compare_conv_impls]
  other_impls = [i for i in dict.fromkeys(other_impls) if i != engine_impl]
  for impl in other_impls:  # the same params and data; only the convolution plan differs
    plans[f"engine_{impl}"] = engine_round(
        w._replace(model=_model(model_name, impl, options)[0]), engine_map, unroll)

  # Loop baseline: per client, per step, one jitted SGD step; then the mean.
  sgd_step = _sgd_step(loop_model, has_state)
  host_x = [[data_x[indices[c, k]] for k in range(steps)] for c in range(clients)]
  host_y = [[data_y[indices[c, k]] for k in range(steps)] for c in range(clients)]
  mean = jax.jit(lambda *ps: jax.tree.map(lambda *xs: sum(xs) / len(xs), *ps))

  def loop_round():
    finals = []
    for c in range(clients):
      p, s = params, model_state
      for k in range(steps):
        p, s = sgd_step(p, s, host_x[c][k], host_y[c][k])
      finals.append(p)
    return mean(*finals)

  if loop:
    plans["loop"] = loop_round

  # Centralized step (a reference, not a limit): one shared model, step k trains on every
  # client's batch k.
  central_x = [data_x[indices[:, k].reshape(-1)] for k in range(steps)]
  central_y = [data_y[indices[:, k].reshape(-1)] for k in range(steps)]
  centrals = {}
  for impl in central_impls:
    impl = engine_impl if impl == "engine" else conv_plans.resolve(impl)
    centrals[impl] = engine_model if impl == engine_impl else _model(model_name, impl,
                                                                     options)[0]

  def central_round(step):
    def go():
      p, s = params, model_state
      for k in range(steps):
        p, s = step(p, s, central_x[k], central_y[k])
      return p
    return go

  plans.update({f"central_{impl}": central_round(_sgd_step(m, has_state))
                for impl, m in centrals.items()})

  # Peers; `to_ours` maps a peer's result into our parameter layout.
  to_ours = {}
  client_batches = [[(np.asarray(data_x[indices[c, k]]), np.asarray(data_y[indices[c, k]]))
                     for k in range(steps)] for c in range(clients)]
  if shakespeare:
    plans["fedjax"] = fedjax_peer.shakespeare_fed_avg_round(fedjax, fmodel, haiku_params,
                                                            client_batches, LR)
    to_ours["fedjax"] = lambda p: fedjax_peer.flax_from_haiku(p, lstm["num_layers"])
  elif fedjax is not None and model_name in TEXT_MODELS:
    peer_notes["fedjax"] = "FedJAX's Shakespeare task has an LSTM only (--model=lstm_lm)"
  elif fedjax is not None:
    try:
      plans["fedjax"] = fedjax_peer.fed_avg_round(fedjax, loop_model, params, model_state,
                                                  data_x, data_y, indices, lr=LR)
    except ValueError as e:
      peer_notes["fedjax"] = str(e)
  torch = torch_lstm.import_torch() if "torch" in peers else None
  if "torch" in peers and torch is None:
    peer_notes["torch"] = "PyTorch is not installed (requirements-peers.txt)"
  elif torch is not None and model_name != "lstm_lm":
    peer_notes["torch"] = "the PyTorch loop is written for lstm_lm only"
  elif torch is not None:
    lstm = {**TEXT_MODELS[model_name], **options}
    torch_threads = torch_threads or len(os.sched_getaffinity(0))
    plans["torch"] = torch_lstm.fed_avg_loop(
        torch, {"vocab_size": lstm["vocab_size"], "num_classes": lstm["vocab_size"],
                "embed_size": lstm["embed_size"], "hidden_size": lstm["hidden_size"],
                "num_layers": lstm["num_layers"],
                "tanh_outputs": lstm.get("tanh_outputs", False)},
        params, client_batches, LR, torch_threads)
    to_ours["torch"] = lambda state: torch_lstm.our_params(state, lstm["num_layers"])

  # FLOP-rate plans: the matmul peak, and for the LSTM its recurrence's matmuls.
  matmul, matmul_flops = matmul_plan(matmul_size)
  plans["matmul"] = matmul
  flop_plans = {"matmul": matmul_flops}
  if model_name == "lstm_lm":
    lstm = {**TEXT_MODELS[model_name], **options}
    hidden = lstm["hidden_size"]
    chained, batched, recurrence_flops = recurrence_plans(
        batch, hidden if lstm["num_layers"] > 1 else lstm["embed_size"], hidden, window)
    plans.update(recurrence_chained=chained, recurrence_batched=batched)
    flop_plans.update(recurrence_chained=recurrence_flops, recurrence_batched=recurrence_flops)

  outputs, first = {}, {}
  for name, fn in plans.items():  # compile + one run
    t0 = time.perf_counter()
    outputs[name] = jax.block_until_ready(fn())
    first[name] = time.perf_counter() - t0
  best = {name: float("inf") for name in plans}
  rounds = {}  # calls per timed sample, set by each plan's first timed call
  for _ in range(repeats):  # interleaved, against the drift of a shared machine
    for name, fn in plans.items():
      for _ in range(3 if name in flop_plans else 1):
        k = rounds.get(name)
        t = time_calls(fn, k or 1)
        if k is None:
          rounds[name] = k = rounds_per_sample(t, min_sample_s)
          if k > 1:  # that call was only the estimate; a slow round's single call counts
            t = time_calls(fn, k)
        best[name] = min(best[name], t)

  samples = clients * steps * batch
  sps = {name: samples / t for name, t in best.items() if name not in flop_plans}
  peak = matmul_flops / best["matmul"]
  engine_flops = flops_per_sample * sps["engine"]
  result = {
      "model": model_name, "clients": clients, "steps": steps, "batch": batch,
      "platform": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
      "host_cpu": host_cpu(), "host_cpu_count": os.cpu_count(), "jax": jax.__version__,
      "engine_conv_impl": engine_impl, "engine_client_map": engine_map,
      "engine_devices": plans["engine"].mesh.size, "cpu_devices": len(jax.devices("cpu")),
      "engine_samples_per_s": sps["engine"],
      "flops_per_sample": flops_per_sample, "engine_flops_per_s": engine_flops,
      "peak_flops_per_s": peak, "mfu": engine_flops / peak, "matmul_size": matmul_size,
      "matmul_precision": str(getattr(jax.config, "jax_default_matmul_precision", None)
                              or "default"),
      "first_call_s": first, "seconds_per_round": {k: t for k, t in best.items()},
      "repeats": repeats, "min_sample_s": min_sample_s, "rounds_per_sample": rounds,
      "load_avg_before": load_before, "load_avg_after": _load(),
  }
  if loop:
    result.update(loop_samples_per_s=sps["loop"], ratio=sps["engine"] / sps["loop"],
                  loop_mfu=flops_per_sample * sps["loop"] / peak)
  for m in other_maps + other_impls:
    if f"engine_{m}" in sps:
      result[f"engine_{m}_samples_per_s"] = sps[f"engine_{m}"]
      result[f"engine_vs_engine_{m}"] = sps["engine"] / sps[f"engine_{m}"]
  for impl in other_impls:
    result[f"engine_{impl}_max_param_diff"] = _max_abs_diff(outputs[f"engine_{impl}"],
                                                            outputs["engine"])
  if centrals:
    central_impl = min(centrals, key=lambda impl: best[f"central_{impl}"])
    result.update(central_conv_impl=central_impl,
                  central_samples_per_s=sps[f"central_{central_impl}"],
                  engine_vs_central=sps["engine"] / sps[f"central_{central_impl}"])
  if model_name in TEXT_MODELS:
    result.update(model_options={**TEXT_MODELS[model_name], **options},
                  tokens_per_sample=window, flops_per_token=flops_per_sample / window,
                  engine_tokens_per_s=sps["engine"] * window)
    if loop:
      result["loop_tokens_per_s"] = sps["loop"] * window
  for name in ("recurrence_chained", "recurrence_batched"):
    if name in plans:
      result[f"{name}_flops_per_s"] = flop_plans[name] / best[name]
      result[f"{name}_vs_peak"] = flop_plans[name] / best[name] / peak
  ref = outputs["loop"] if loop else outputs["engine"]
  for peer in ("fedjax", "torch"):
    if peer in plans:
      theirs = to_ours.get(peer, lambda p: p)(outputs[peer])
      result.update({f"{peer}_samples_per_s": sps[peer],
                     f"engine_vs_{peer}": sps["engine"] / sps[peer],
                     f"{peer}_max_param_diff": _max_abs_diff(theirs, ref)})
  if shakespeare:
    result["fedjax_model"] = "fedjax.models.shakespeare.create_lstm_model"
  if "torch" in plans:
    result.update(torch_threads=torch_threads, torch_version=torch.__version__)
  if peer_notes:
    result["peers_skipped"] = peer_notes
  return result


def summary_line(r: dict) -> str:
  parts = [f"{r['model']}: {r['clients']} clients x {r['steps']} steps x batch {r['batch']} on "
           f"{r['platform']} ({r['device_kind']}), load {r['load_avg_before']}: engine "
           f"{r['engine_samples_per_s']:.0f} samples/s ({r['engine_conv_impl']}, "
           f"{r['engine_client_map']})"]
  if "loop_samples_per_s" in r:
    parts.append(f"per-step loop {r['loop_samples_per_s']:.0f}")
  if "central_samples_per_s" in r:
    parts.append(f"centralized step {r['central_samples_per_s']:.0f}")
  if "fedjax_samples_per_s" in r:
    parts.append(f"FedJAX fed_avg {r['fedjax_samples_per_s']:.0f}")
  if "torch_samples_per_s" in r:
    parts.append(f"PyTorch loop {r['torch_samples_per_s']:.0f} ({r['torch_threads']} threads)")
  line = ", ".join(parts) + "."
  if "engine_tokens_per_s" in r:
    line += (f"\n  engine {r['engine_tokens_per_s']:.0f} tokens/s, "
             f"{r['flops_per_token'] / 1e6:.2f} MFLOP per training token")
  if "recurrence_chained_flops_per_s" in r:
    line += (f"; the LSTM step's matmul chained over {r['tokens_per_sample']} positions "
             f"{r['recurrence_chained_flops_per_s'] / 1e9:.1f} GFLOP/s "
             f"({r['recurrence_chained_vs_peak']:.3f} of the peak), as one batched matmul "
             f"{r['recurrence_batched_flops_per_s'] / 1e9:.1f} GFLOP/s "
             f"({r['recurrence_batched_vs_peak']:.3f})")
  ratios = [f"engine/loop {r['ratio']:.2f}"] if "ratio" in r else []
  ratios += [f"engine/{k[len('engine_vs_'):]} {v:.2f}" for k, v in r.items()
             if k.startswith("engine_vs_engine_")]
  for peer in ("fedjax", "torch"):
    if f"engine_vs_{peer}" in r:
      ratios.append(f"engine/{peer} {r[f'engine_vs_{peer}']:.2f} (parameters "
                    f"{r[f'{peer}_max_param_diff']:.1e} apart)")
  if "engine_vs_central" in r:
    ratios.append(f"engine/central {r['engine_vs_central']:.2f}")
  line += (f"\n  {', '.join(ratios)}; {r['flops_per_sample'] / 1e6:.1f} MFLOP per training "
           f"sample, engine {r['engine_flops_per_s'] / 1e9:.1f} GFLOP/s of a measured "
           f"{r['peak_flops_per_s'] / 1e9:.1f} GFLOP/s {r['matmul_size']}^3 matmul: "
           f"MFU {r['mfu']:.3f}")
  for peer, why in r.get("peers_skipped", {}).items():
    line += f"\n  peer {peer} skipped: {why}"
  return line


def main(argv):
  del argv
  cpu_devices.split_cpu()
  unknown = [c for c in FLAGS.central if c not in CENTRAL_IMPLS]
  if unknown:
    raise app.UsageError(f"--central: {', '.join(unknown)} not accepted; use a comma-separated "
                         f"list of {', '.join(CENTRAL_IMPLS)}, or nothing (--central=)")
  result = run(FLAGS.model, FLAGS.clients, FLAGS.steps, FLAGS.batch, FLAGS.repeats,
               FLAGS.conv_impl, FLAGS.unroll, central_impls=tuple(FLAGS.central),
               client_map=FLAGS.client_map, peers=FLAGS.peers,
               peers_path=FLAGS.peers_path, matmul_size=FLAGS.matmul_size,
               compare_client_maps=FLAGS.compare_client_maps, min_sample_s=FLAGS.min_sample_s,
               compare_conv_impls=tuple(FLAGS.compare_conv_impls),
               model_options=json.loads(FLAGS.model_options) if FLAGS.model_options else None,
               torch_threads=FLAGS.torch_threads, window=FLAGS.window)
  print(summary_line(result))
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
