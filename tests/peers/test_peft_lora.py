"""Our LoRA (fedjax_lama/models/lora.py) beside Hugging Face PEFT's (slow; needs peft, torch).

    pip install peft==0.21.2 torch==2.13.0   # requirements-peers.txt; a venv of its own
    python -m pytest -q -n 0 -m slow tests/peers/test_peft_lora.py -s

Identical weights and batches, float64 on both sides: (a) one Dense layer, (b) one block of
our transformer (`transformer.Block`: pre-LayerNorm causal attention and the GELU MLP) with
adapters on the attention's query, key, value and out projections, against PEFT's
`LoraModel` on torch twins of them (third_party/peft_peer.py). One SGD step (the same rate)
of 0.5 mean((y - target)^2) over the adapters only, B drawn nonzero so that A's gradient is
not zero; compared: the outputs before and after, the loss, A and B after the step, the
merged kernels (our `merged` against PEFT's `merge_and_unload`).

Conventions, each checked as a number below:
- Scaling: both alpha / r (Hu et al., ICLR 2022, Sec. 4.1; PEFT's default). PEFT's
  `use_rslora=True` (Kalajdzievski 2023, rank-stabilized LoRA) scales by alpha / sqrt(r):
  our alpha' = alpha sqrt(r) reproduces it, and our alpha stands from it by the adapter
  term (x A B) times alpha (1 / sqrt(r) - 1 / r).
- Dropout: both on the adapter's input only (the base path sees x), inverted (kept
  entries / (1 - p)). The two draw from different generators: our keep-mask is read from
  the forward pass and given to PEFT's layer in place of its dropout module.
- Layouts: PEFT's lora_A.weight is [r, in] and lora_B.weight [out, r], ours A [in, r] and
  B [r, out]; torch's Linear weight is [out, in], our kernel [in, out]: transposes, exact.
- A's initialization: PEFT's default is kaiming-uniform with a = sqrt(5), i.e.
  U(-1/sqrt(in), 1/sqrt(in)), standard deviation 1/sqrt(3 in); ours by default draws Hu et
  al.'s Gaussian, N(0, 1/in), sqrt(3) times wider; `a_init="kaiming_uniform"` is PEFT's.
  B starts at zero on both sides.
- Target names: PEFT matches a suffix of the module's dotted name ("query"); ours a
  "/"-joined layer path, everything under it, or a glob ("attention", "*/attention/*").
- FFA-LoRA (Sun et al., ICLR 2024), A frozen: PEFT has no option for it; freezing lora_A
  there (requires_grad False) equals our trainable set ("lora_b",).
"""
import functools

import numpy as np
import pytest

pytest.importorskip("torch", reason="PyTorch is not installed: pip install torch==2.13.0 "
                    "(requirements-peers.txt, in a virtual environment of its own)")
pytest.importorskip("peft", reason="PEFT is not installed: pip install peft==0.21.2 "
                    "(requirements-peers.txt, in a virtual environment of its own)")

import flax.linen as nn  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # pylint: disable=wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position

from fedjax_lama import algorithms, models  # pylint: disable=wrong-import-position
from fedjax_lama.models import (  # pylint: disable=wrong-import-position
    lora, param_layers, transformer)
from fedjax_lama.tree import leaf_names  # pylint: disable=wrong-import-position
from tests.peers import engine_rounds  # pylint: disable=wrong-import-position
from third_party import peft_peer  # pylint: disable=wrong-import-position

pytestmark = pytest.mark.slow

RANK, ALPHA, LR, P = 4, 8.0, 0.1, 0.3
WIDTH, HEADS, MLP_RATIO = 8, 2, 4
TOLERANCE = 1e-12  # float64 on both sides; measured distances are ~1e-15 (docs/results.md)
# jax.nn.dot_product_attention, which our transformer's attention calls, computes its softmax
# in float32 whatever the inputs' dtype: with it the block agrees to float32 rounding
# (measured: outputs 1.5e-6 before the step, 7.9e-5 after it); with the attention computed
# in float64 (`_attention64`) to TOLERANCE.
FLOAT32_SOFTMAX_TOLERANCE = 1e-3


class _OneDense(nn.Module):
  spec: lora.LoRA

  @nn.compact
  def __call__(self, x, train=False):
    del train
    return param_layers.Dense(5, lora=self.spec, name="proj")(x)


def _dense(spec):
  return _OneDense(spec), "proj", (6,), ["proj"]


def _block(spec):
  dense = functools.partial(param_layers.Dense, lora=spec)
  return (transformer.Block(WIDTH, HEADS, MLP_RATIO, dense=dense), "attention",
          (5, WIDTH), ["query", "key", "value", "out"])


def _inputs(build, seed=0) -> dict:
  """Our weights by path, the batch and the target, float64: matrices (kernels, A, and B,
  nonzero so that A's gradient is not zero) N(0, 1/rows), biases N(0, 0.1^2), LayerNorm
  scales N(1, 0.1^2)."""
  rng = np.random.default_rng(seed)
  model, _, feature_shape, targets = build(lora.LoRA(RANK, ("proj", "attention"), ALPHA))
  x = rng.normal(size=(3,) + feature_shape)
  with jax.enable_x64(True):
    shapes = jax.eval_shape(model.init, {"params": jax.random.PRNGKey(0)}, x)["params"]
    out = jax.eval_shape(lambda p: model.apply({"params": p}, x), shapes).shape
  return {"params": _draw(rng, shapes), "x": x, "target": rng.normal(size=out),
          "targets": targets}


def _draw(rng, shapes) -> dict:
  """Float64 leaves by path for the shapes of a parameter tree: matrices N(0, 1/rows),
  biases N(0, 0.1^2), LayerNorm scales N(1, 0.1^2)."""
  draw = lambda n, shape: (rng.normal(0, 1 / np.sqrt(shape[0]), shape) if len(shape) == 2
                           else rng.normal(1.0 if n.endswith("scale") else 0.0, 0.1, shape))
  return {n: draw(n, leaf.shape) for n, leaf in zip(leaf_names(shapes), jax.tree.leaves(shapes))}


def _ours(build, given, dropout=0.0, trainable="lora", alpha=ALPHA) -> dict:
  """Our side from `given` (`_inputs`): one SGD step over the trainable set, the merged
  export, and with dropout the keep-masks our forward pass drew."""
  as_dict = lambda t: {n: np.asarray(v) for n, v in zip(leaf_names(t), jax.tree.leaves(t))}
  with jax.enable_x64(True):
    spec = lora.LoRA(RANK, ("proj", "attention"), alpha, dropout)
    model = build(spec)[0]
    x, target = given["x"], given["target"]
    shapes = jax.eval_shape(model.init, {"params": jax.random.PRNGKey(0)}, x)["params"]
    tree = jax.tree.unflatten(
        jax.tree.structure(shapes), [jnp.asarray(given["params"][n]) for n in leaf_names(shapes)])
    rngs = {"dropout": jax.random.PRNGKey(7)} if dropout else {}
    forward = lambda p: model.apply({"params": p}, x, rngs=rngs)
    chosen = lora.trainable_set(tree, trainable)
    part, frozen = chosen.split(tree)
    loss = lambda t: 0.5 * jnp.mean((forward(chosen.merge(t, frozen)) - target) ** 2)
    value, grads = jax.value_and_grad(loss)(part)
    stepped = chosen.merge(jax.tree.map(lambda t, g: t - LR * g, part, grads), frozen)
    masks = None
    if dropout:
      _, seen = model.apply({"params": tree}, x, rngs=rngs, capture_intermediates=True,
                            mutable=["intermediates"])
      masks = {name.rsplit("/lora_dropout", 1)[0]: np.asarray(v) != 0 for name, v in
               as_dict(seen["intermediates"]).items() if "/lora_dropout/" in name}
    return {**given, "stepped": as_dict(stepped), "before": np.asarray(forward(tree)),
            "after": np.asarray(forward(stepped)), "loss": float(value), "masks": masks,
            "merged": as_dict(lora.merged(stepped, spec))}


def _peft(module, ours, **kwargs):
  return peft_peer.lora_step(module, ours["params"], ours["targets"], ours["x"],
                             ours["target"], rank=RANK, alpha=ALPHA, lr=LR, **kwargs)


def _distances(ours, theirs) -> dict:
  """Largest absolute differences, by quantity."""
  out = {"before": np.max(np.abs(ours["before"] - theirs["before"])),
         "after": np.max(np.abs(ours["after"] - theirs["after"])),
         "loss": abs(ours["loss"] - theirs["loss"])}
  out["A, B"] = max(
      max(np.max(np.abs(ours["stepped"][f"{layer}/lora_a"] - a)),
          np.max(np.abs(ours["stepped"][f"{layer}/lora_b"] - b)))
      for layer, (a, b) in theirs["adapters"].items())
  out["merged"] = max(np.max(np.abs(ours["merged"][k] - v)) for k, v in theirs["merged"].items())
  return out


def _run(build, module, dropout=0.0, trainable="lora", **kwargs):
  """Our step and PEFT's on the same weights and batch."""
  ours = _ours(build, _inputs(build), dropout, trainable)
  return ours, _peft(module, ours, dropout=dropout, masks=ours["masks"], **kwargs)


def _attention64(query, key, value, is_causal=False):
  """softmax(q k^T / sqrt(head_dim)) v per head, causal, in the inputs' dtype."""
  assert is_causal
  time = query.shape[1]
  logits = jnp.einsum("bqhd,bkhd->bhqk", query, key) / np.sqrt(query.shape[-1])
  logits = jnp.where(jnp.tril(jnp.ones((time, time), bool)), logits, -jnp.inf)
  return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), value)


CASES = {
    "dense": (_dense, lambda: peft_peer.dense_module(6, 5)),
    "block": (_block, lambda: peft_peer.block_module(WIDTH, HEADS, MLP_RATIO)),
    "block, float64 attention": (
        _block, lambda: peft_peer.block_module(WIDTH, HEADS, MLP_RATIO)),
}
TOLERANCES = {"dense": TOLERANCE, "block": FLOAT32_SOFTMAX_TOLERANCE,
              "block, float64 attention": TOLERANCE}


@pytest.fixture(name="case_run")
def _case_run(monkeypatch):
  def run(case, *args, **kwargs):
    if case == "block, float64 attention":
      monkeypatch.setattr(jax.nn, "dot_product_attention", _attention64)
    build, module = CASES[case]
    return _run(build, module(), *args, **kwargs)
  return run


@pytest.mark.parametrize("dropout", [0.0, P])
@pytest.mark.parametrize("case", sorted(CASES))
def test_one_step_equals_peft(case, dropout, case_run):
  ours, theirs = case_run(case, dropout)
  distances = _distances(ours, theirs)
  print(f"\n{case}, dropout {dropout} ({peft_peer.versions()}): "
        + ", ".join(f"{k} {v:.1e}" for k, v in distances.items()))
  assert theirs["trainable"] and all("lora_" in n for n in theirs["trainable"])
  assert len(theirs["adapters"]) == len(ours["targets"])
  for name, distance in distances.items():
    assert distance < TOLERANCES[case], name
  # The step moved A and B, and more than the tolerance.
  for layer, (a, b) in theirs["adapters"].items():
    a0, b0 = theirs["initial_adapters"][layer]
    assert np.max(np.abs(a - a0)) > 1e-4 and np.max(np.abs(b - b0)) > 1e-4
  if dropout:  # the masks dropped entries: the result differs from the undropped one
    undropped = _ours(CASES[case][0], ours)
    assert np.max(np.abs(undropped["before"] - ours["before"])) > 1e-3


@pytest.mark.parametrize("case", sorted(CASES))
def test_ffa_lora_equals_peft_with_a_frozen(case, case_run):
  ours, theirs = case_run(case, trainable="lora_b", train_a=False)
  distances = _distances(ours, theirs)
  print(f"\n{case}, FFA-LoRA: " + ", ".join(f"{k} {v:.1e}" for k, v in distances.items()))
  assert max(distances.values()) < TOLERANCES[case]
  for layer, (a, _) in theirs["adapters"].items():
    np.testing.assert_array_equal(a, ours["params"][f"{layer}/lora_a"])


def test_rslora_scaling_distance():
  """PEFT's rsLoRA scales by alpha / sqrt(r): ours with alpha sqrt(r) is it; ours with alpha
  differs by the adapter term times (1 / sqrt(r) - 1 / r) alpha."""
  build, module = CASES["dense"]
  ours, _ = _run(build, module())
  theirs = _peft(module(), ours, use_rslora=True)
  base_only = ours["params"]["proj/kernel"], ours["params"]["proj/bias"]
  a, b = ours["params"]["proj/lora_a"], ours["params"]["proj/lora_b"]
  adapter = ours["x"] @ a @ b
  predicted = np.max(np.abs(adapter * ALPHA * (1 / np.sqrt(RANK) - 1 / RANK)))
  distance = np.max(np.abs(ours["before"] - theirs["before"]))
  print(f"\nrsLoRA against alpha / r: {distance:.3e} (predicted {predicted:.3e})")
  assert distance > 0.1 and abs(distance - predicted) < 1e-12
  assert np.max(np.abs(ours["x"] @ base_only[0] + base_only[1]
                       + ALPHA / np.sqrt(RANK) * adapter - theirs["before"])) < TOLERANCE
  rescaled = _ours(build, ours, alpha=ALPHA * np.sqrt(RANK))
  assert _distances(rescaled, theirs)["before"] < TOLERANCE
  assert _distances(rescaled, theirs)["A, B"] < TOLERANCE


def test_a_initialization_distance():
  """PEFT's default A ~ U(-1/sqrt(in), 1/sqrt(in)); ours N(0, 1/in) by default, and PEFT's
  distribution with a_init="kaiming_uniform"; B = 0 on both sides."""
  fan_in, rank = 512, 64
  module = peft_peer.dense_module(fan_in, 8)
  weights = {"proj/kernel": np.zeros((fan_in, 8)), "proj/bias": np.zeros(8)}
  theirs = peft_peer.lora_step(module, weights, ["proj"], np.ones((1, fan_in)),
                               np.zeros((1, 8)), rank=rank, alpha=ALPHA, lr=0.0)
  a_peft, b_peft = theirs["initial_adapters"]["proj"]
  assert a_peft.shape == (fan_in, rank) and not np.any(b_peft)
  stds = {}
  for a_init in lora.A_INITS:
    spec = lora.LoRA(rank, ("proj",), a_init=a_init)
    params = _OneDense(spec).init({"params": jax.random.PRNGKey(0)}, jnp.ones((1, fan_in)))
    a_ours = np.asarray(params["params"]["proj"]["lora_a"])
    assert not np.any(params["params"]["proj"]["lora_b"])
    stds[a_init] = np.std(a_ours)
    if a_init == "kaiming_uniform":
      assert np.max(np.abs(a_ours)) <= 1 / np.sqrt(fan_in)
      assert np.max(np.abs(a_peft)) <= 1 / np.sqrt(fan_in)
  ratio = stds["gaussian"] / np.std(a_peft)
  print(f"\nA's std: PEFT {np.std(a_peft):.4e}, ours gaussian {stds['gaussian']:.4e}, "
        f"kaiming_uniform {stds['kaiming_uniform']:.4e}; gaussian / PEFT {ratio:.3f}")
  assert abs(np.std(a_peft) * np.sqrt(3 * fan_in) - 1) < 0.02   # 32,768 draws
  assert abs(stds["kaiming_uniform"] / np.std(a_peft) - 1) < 0.03
  assert abs(ratio / np.sqrt(3) - 1) < 0.03


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_fed_avg_round_equals_the_peft_client_loop(mode, monkeypatch):
  """The speed peer of `benchmarks.lora_memory --peers=peft` computes our round: one FedAvg
  round of 2 clients x 2 SGD steps on the whole transformer_lm (adapters on every attention
  and MLP projection, or every weight), the engine's against the PyTorch loop of clients one
  after another (PEFT's LoraModel over the torch twin), float64 with the attention computed
  in float64 on our side; the new global A and B (or weights) agree to TOLERANCE."""
  monkeypatch.setattr(jax.nn, "dot_product_attention", _attention64)
  vocab, depth, seq, batch, lr = 11, 2, 6, 3, 0.5
  options = dict(width=WIDTH, depth=depth, heads=HEADS, max_len=seq)
  if mode == "lora":
    options["lora"] = {"rank": RANK, "targets": "*/attention/*,*/mlp_*", "alpha": ALPHA}
  model = models.get("transformer_lm", vocab, **options)
  rng = np.random.default_rng(5)
  batches = [[(rng.integers(0, vocab, (batch, seq)), rng.integers(0, vocab, (batch, seq)))
              for _ in range(2)] for _ in range(2)]
  with jax.enable_x64(True):
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                            jnp.zeros((1, seq), jnp.int32))["params"]
    params = _draw(rng, shapes)  # B nonzero: A's gradient is not zero at the first step
    tree = jax.tree.unflatten(jax.tree.structure(shapes),
                              [jnp.asarray(params[n]) for n in leaf_names(shapes)])
    chosen = lora.trainable_set(tree, "lora") if mode == "lora" else None
    part, frozen = chosen.split(tree) if chosen else (tree, None)
    alg = algorithms.build("fedavg")
    (_, server, _), = engine_rounds.rounds(alg, model, batches, ((0, 1),),
                                           alg.server.init(part, {}), lr, trainable=chosen,
                                           frozen=frozen)
    ours = dict(zip(leaf_names(server.params), map(np.asarray, jax.tree.leaves(server.params))))
  run, paths = peft_peer.transformer_loop(
      params, dict(vocab_size=vocab, width=WIDTH, depth=depth, heads=HEADS, max_len=seq),
      batches, lr, alpha=ALPHA, dtype="float64", threads=1)
  theirs = peft_peer.our_layout(run(), paths)
  assert set(theirs) == set(ours)
  assert all(peft_peer.is_adapter(p) for p in theirs) == (mode == "lora")
  distance = max(np.max(np.abs(ours[p] - theirs[p])) for p in ours)
  # A key projection's bias adds the same logit to every key of a query, which the softmax
  # ignores: its gradient is zero (5e-18 measured); every other leaf moves.
  moved = min(np.max(np.abs(theirs[p] - params[p])) for p in ours
              if not p.endswith("key/bias"))
  print(f"\n{mode}, one round of 2 clients ({peft_peer.versions()}): new global state "
        f"{distance:.1e} apart; every leaf moved, the least by {moved:.1e}")
  assert distance < TOLERANCE
  assert moved > 1e-4
