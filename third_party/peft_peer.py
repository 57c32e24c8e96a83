"""Hugging Face PEFT's LoRA driven on torch modules that mirror ours: equivalence checks and
the speed peer of `python -m benchmarks.lora_memory --peers=peft`.

PEFT (https://github.com/huggingface/peft; Mangrulkar et al. 2022) wraps a torch module's
`nn.Linear` layers named in `LoraConfig.target_modules` (a suffix of the module's dotted
name) by `peft.tuners.lora.Linear`, which computes

    base_layer(x) + lora_B(lora_A(lora_dropout(x))) * scaling,   scaling = alpha / r

(alpha / sqrt(r) with `use_rslora=True`), with `lora_A.weight` [r, in] and `lora_B.weight`
[out, r] (torch's Linear layout [out, in]; ours: kernel [in, out], A [in, r], B [r, out]).
`LoraModel` freezes every parameter but the adapters. This adapter builds the torch twin of
one of our modules (a Dense layer, a transformer block), loads our float64 weights into it
(transposing the kernels), wraps it with `LoraModel`, and runs one SGD step on
0.5 mean((y - target)^2); the results come back in our layout.

`transformer_module` is the twin of the whole `transformer_lm`, and `fed_avg_loop` trains
a cohort on it the way PyTorch federated fine-tuning runs (FlowerTune's LLM template, PEFT's
own examples): one model in memory, the clients one after another, each loading the global
trainable weights (the adapters, as `set_peft_model_state_dict` does; every weight without
PEFT), taking plain SGD steps on its batches with a fresh optimizer, and leaving its
trainable weights, whose uniform mean is the new global state (FedAvg over A and B). PEFT
and PyTorch are optional dependencies (requirements-peers.txt, a virtual environment of
their own).
"""
import os
from typing import Mapping, Optional, Sequence

import numpy as np

# Our leaf name -> torch's parameter name within the same module; kernels are transposed.
_LEAVES = {"kernel": "weight", "scale": "weight", "bias": "bias", "embedding": "weight"}
# Our adapter leaves -> PEFT's parameters inside the wrapped layer (adapter "default"),
# transposed: ours A [in, r], B [r, out]; PEFT's lora_A.weight [r, in], lora_B.weight [out, r].
_ADAPTERS = {"lora_a": "lora_A.default.weight", "lora_b": "lora_B.default.weight"}


def _imports():
  try:
    import peft  # pylint: disable=g-import-not-at-top
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("PEFT and PyTorch are not installed: pip install peft==0.21.2 torch==2.13.0 "
                      "(requirements-peers.txt; into a virtual environment of its own)") from e
  return peft, torch


def versions() -> str:
  peft, torch = _imports()
  return f"peft {peft.__version__}, torch {torch.__version__}"


def dense_module(features_in: int, features_out: int, name: str = "proj"):
  """A torch module holding one Linear layer `name` (our Dense)."""
  _, torch = _imports()

  class OneLinear(torch.nn.Module):

    def __init__(self):
      super().__init__()
      self.add_module(name, torch.nn.Linear(features_in, features_out))

    def forward(self, x):
      return getattr(self, name)(x)

  return OneLinear().double()


def block_module(width: int, heads: int, mlp_ratio: int, epsilon: float = 1e-5,
                 dtype: str = "float64"):
  """The torch twin of fedjax_lama.models.transformer.Block (pre-LayerNorm; causal
  multi-head attention through `scaled_dot_product_attention`; GELU, tanh approximation),
  its submodules named as our layers are."""
  _, torch = _imports()
  functional = torch.nn.functional

  class Block(torch.nn.Module):

    def __init__(self):
      super().__init__()
      self.attention_norm = torch.nn.LayerNorm(width, eps=epsilon)
      self.attention = torch.nn.Module()
      for projection in ("query", "key", "value", "out"):
        self.attention.add_module(projection, torch.nn.Linear(width, width))
      self.mlp_norm = torch.nn.LayerNorm(width, eps=epsilon)
      self.mlp_in = torch.nn.Linear(width, mlp_ratio * width)
      self.mlp_out = torch.nn.Linear(mlp_ratio * width, width)

    def forward(self, x):
      batch, time, _ = x.shape
      h = self.attention_norm(x)
      heads_of = lambda y: y.view(batch, time, heads, width // heads).transpose(1, 2)
      q, k, v = (heads_of(getattr(self.attention, n)(h)) for n in ("query", "key", "value"))
      y = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
      x = x + self.attention.out(y.transpose(1, 2).reshape(batch, time, width))
      h = self.mlp_out(functional.gelu(self.mlp_in(self.mlp_norm(x)), approximate="tanh"))
      return x + h

  return Block().to(getattr(torch, dtype))


def transformer_module(vocab_size: int, width: int, depth: int, heads: int,
                       mlp_ratio: int = 4, max_len: int = 80, num_classes: Optional[int] = None,
                       epsilon: float = 1e-5, dtype: str = "float64"):
  """The torch twin of `transformer_lm` (untied head, no dropout): token and learned
  position embeddings summed, `depth` of `block_module`, the final LayerNorm and the output
  Linear `Dense_0`; int64 tokens [batch, time] -> logits [batch, time, classes]."""
  _, torch = _imports()

  class TransformerLM(torch.nn.Module):

    def __init__(self):
      super().__init__()
      self.token_embed = torch.nn.Embedding(vocab_size, width)
      self.position_embed = torch.nn.Embedding(max_len, width)
      self.blocks = [block_module(width, heads, mlp_ratio, epsilon, dtype) for _ in range(depth)]
      for i, block in enumerate(self.blocks):
        self.add_module(f"block_{i}", block)
      self.final_norm = torch.nn.LayerNorm(width, eps=epsilon)
      self.add_module("Dense_0", torch.nn.Linear(width, num_classes or vocab_size))

    def forward(self, tokens):
      h = self.token_embed(tokens) + self.position_embed(torch.arange(tokens.shape[1]))[None]
      for block in self.blocks:
        h = block(h)
      return self.get_submodule("Dense_0")(self.final_norm(h))

  return TransformerLM().to(getattr(torch, dtype))


def torch_name(path: str) -> tuple:
  """Our "/"-joined leaf path -> (the twin's parameter name, whether it is transposed).
  Adapter leaves name PEFT's parameters of the wrapped twin."""
  *layer, leaf = path.split("/")
  if leaf in _ADAPTERS:
    return ".".join(layer + [_ADAPTERS[leaf]]), True
  return ".".join(layer + [_LEAVES[leaf]]), leaf == "kernel"


def is_adapter(path: str) -> bool:
  return path.rsplit("/", 1)[-1] in _ADAPTERS


def load(module, params: Mapping[str, np.ndarray]) -> None:
  """Copies our leaves, by path, into the parameters of `module` that they name."""
  _, torch = _imports()
  named = dict(module.named_parameters())
  with torch.no_grad():
    for path, value in params.items():
      name, transposed = torch_name(path)
      if name not in named:
        raise KeyError(f"{path}: the torch module has no parameter {name}")
      value = np.asarray(value)
      named[name].copy_(torch.as_tensor(np.array(value.T if transposed else value)))


def our_layout(state: Mapping[str, object], paths: Sequence[str]) -> dict:
  """Torch tensors by the twin's parameter names (a `LoraModel` keeps the twin as its
  `model`: that prefix is dropped) -> numpy arrays by our paths, among `paths`."""
  by_name = {torch_name(p)[0]: p for p in paths}
  out = {}
  for name, tensor in state.items():
    path = by_name[name.removeprefix("model.")]
    value = tensor.detach().numpy()
    out[path] = value.T.copy() if torch_name(path)[1] else value.copy()
  return out


def lora_model(module, layers: Sequence[str], *, rank: int, alpha: float):
  """PEFT's `LoraModel` over `module`: adapters (dropout 0) on exactly the layers named by
  their dotted names; every other parameter frozen."""
  peft, _ = _imports()
  config = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0,
                           target_modules=list(layers))
  model = peft.tuners.lora.LoraModel(module, config, "default")
  wrapped = {name for name, layer in model.model.named_modules()
             if isinstance(layer, peft.tuners.lora.Linear)}
  if wrapped != set(layers):
    raise ValueError(f"PEFT wrapped {sorted(wrapped)}, not {sorted(layers)}")
  return model


def fed_avg_loop(model, batches, lr: float, threads: int = 0):
  """run() -> the new global trainable weights {parameter name: tensor} after one FedAvg
  round of clients trained one after another (module docstring).

  model: the twin holding the global weights, wrapped by `lora_model` or not; the
  parameters that require a gradient are the trainable set (PEFT's adapters, or every
  weight). batches[c][k]: client c's (x, y) of step k, int tokens and next-token targets
  [batch, time]; the loss is the mean cross-entropy over every position. Each client loads
  the global trainable weights and takes one SGD(lr) step per batch; the new global state is
  the clients' uniform mean (equal client sizes). threads: torch.set_num_threads (0: the
  cores this process may use).
  """
  _, torch = _imports()
  torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
  trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
  start = {n: p.detach().clone() for n, p in trainable.items()}
  data = [[(torch.as_tensor(np.asarray(x, np.int64)), torch.as_tensor(np.asarray(y, np.int64)))
           for x, y in client] for client in batches]
  cross_entropy = torch.nn.functional.cross_entropy
  model.train()

  def run():
    total = {n: torch.zeros_like(v) for n, v in start.items()}
    for client in data:
      with torch.no_grad():
        for n, p in trainable.items():
          p.copy_(start[n])
      optimizer = torch.optim.SGD(list(trainable.values()), lr=lr)
      for x, y in client:
        optimizer.zero_grad(set_to_none=True)
        logits = model(x)
        cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).backward()
        optimizer.step()
      with torch.no_grad():
        for n, p in trainable.items():
          total[n] += p
    return {n: v / len(data) for n, v in total.items()}

  return run


def transformer_loop(params: Mapping[str, np.ndarray], options: Mapping[str, int], batches,
                     lr: float, *, alpha: float = 0.0, dtype: str = "float32", threads: int = 0):
  """`fed_avg_loop` on the twin of `transformer_lm` holding our `params` (by path).

  options: the twin's (`transformer_module`: vocab_size, width, depth, heads, max_len, ...).
  With adapter leaves in `params` the twin is wrapped by PEFT (`lora_model`: the layers
  that hold them, their rank, scaling alpha / r) and trains the adapters, loaded from ours;
  without, it trains every weight. Returns (run, paths): `our_layout(run(), paths)` is the
  new global trainable set in our layout.
  """
  module = transformer_module(**options, dtype=dtype)
  load(module, {p: v for p, v in params.items() if not is_adapter(p)})
  adapters = {p: v for p, v in params.items() if is_adapter(p)}
  if adapters:
    layers = sorted({p.rsplit("/", 1)[0].replace("/", ".") for p in adapters})
    rank = np.shape(next(v for p, v in adapters.items() if p.endswith("lora_a")))[-1]
    module = lora_model(module, layers, rank=rank, alpha=alpha)
    load(module.model, adapters)
  return fed_avg_loop(module, batches, lr, threads), list(params)


def lora_step(module, params: Mapping[str, np.ndarray], targets, x: np.ndarray,
              target: np.ndarray, *, rank: int, alpha: float, lr: float,
              dropout: float = 0.0, masks: Optional[Mapping[str, np.ndarray]] = None,
              use_rslora: bool = False, init_lora_weights=True, train_a: bool = True) -> dict:
  """One SGD step of PEFT's LoRA on `module` (from `dense_module` or `block_module`).

  Args:
    module: the torch twin, float64.
    params: our leaves by "/"-joined path ("attention/query/kernel", ".../lora_a"), float64.
      Without adapter leaves PEFT keeps its own initialisation (`init_lora_weights`).
    targets: PEFT's target_modules (name suffixes).
    x, target: the batch and the regression target of 0.5 mean((y - target)^2).
    masks: our dropout keep-masks by layer path ("attention/query"): PEFT's dropout of that
      layer is replaced by that mask (x / (1 - p) where kept, else 0), the module in train
      mode, so both sides drop the same entries.
    train_a: False freezes every lora_A (requires_grad False): FFA-LoRA's trainable set,
      which PEFT has no option for.

  Returns:
    {"before", "after": outputs before and after the step, "loss": before the step,
     "adapters": {path: (A [in, r], B [r, out]) after the step},
     "initial_adapters": the same before the step, "merged": our-layout kernels of
     PEFT's merge_and_unload after the step, "trainable": names PEFT trains}.
  """
  peft, torch = _imports()
  load(module, {p: v for p, v in params.items() if not is_adapter(p)})
  config = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout,
                           target_modules=list(targets), use_rslora=use_rslora,
                           init_lora_weights=init_lora_weights)
  model = peft.tuners.lora.LoraModel(module, config, "default")
  layers = {name: layer for name, layer in model.model.named_modules()
            if isinstance(layer, peft.tuners.lora.Linear)}
  load(model.model, {p: v for p, v in params.items() if is_adapter(p)})
  if masks is not None:
    for name, layer in layers.items():
      layer.lora_dropout["default"] = _FixedDropout(torch, masks[name.replace(".", "/")],
                                                    dropout)
  model.train(masks is not None)

  def adapters():
    return {name.replace(".", "/"): (layer.lora_A["default"].weight.detach().numpy().T.copy(),
                                     layer.lora_B["default"].weight.detach().numpy().T.copy())
            for name, layer in layers.items()}

  initial = adapters()
  for layer in layers.values():
    layer.lora_A["default"].weight.requires_grad_(train_a)
  trainable = [p for p in model.parameters() if p.requires_grad]
  optimizer = torch.optim.SGD(trainable, lr=lr)
  inputs, wanted = torch.as_tensor(x), torch.as_tensor(target)
  out = model(inputs)
  loss = 0.5 * torch.mean((out - wanted) ** 2)
  optimizer.zero_grad()
  loss.backward()
  optimizer.step()
  after = model(inputs).detach().numpy()
  result = {"before": out.detach().numpy(), "after": after, "loss": float(loss.detach()),
            "adapters": adapters(), "initial_adapters": initial,
            "trainable": sorted(n for n, p in model.named_parameters() if p.requires_grad)}
  merged = model.merge_and_unload()
  result["merged"] = {name.replace(".", "/") + "/kernel": layer.weight.detach().numpy().T
                      for name, layer in merged.named_modules()
                      if name.replace(".", "/") in result["adapters"]}
  return result


def _FixedDropout(torch, keep: np.ndarray, rate: float):  # pylint: disable=invalid-name
  """A dropout module that drops the entries `keep` marks false, scaling by 1 / (1 - rate)."""
  mask = torch.as_tensor(np.asarray(keep, bool))

  class FixedDropout(torch.nn.Module):

    def forward(self, x):
      return torch.where(mask, x / (1.0 - rate), torch.zeros_like(x))

  return FixedDropout()
