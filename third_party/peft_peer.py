"""Hugging Face PEFT's LoRA driven on torch modules that mirror ours, for equivalence checks.

PEFT (https://github.com/huggingface/peft; Mangrulkar et al. 2022) wraps a torch module's
`nn.Linear` layers named in `LoraConfig.target_modules` (a suffix of the module's dotted
name) by `peft.tuners.lora.Linear`, which computes

    base_layer(x) + lora_B(lora_A(lora_dropout(x))) * scaling,   scaling = alpha / r

(alpha / sqrt(r) with `use_rslora=True`), with `lora_A.weight` [r, in] and `lora_B.weight`
[out, r] (torch's Linear layout [out, in]; ours: kernel [in, out], A [in, r], B [r, out]).
`LoraModel` freezes every parameter but the adapters. This adapter builds the torch twin of
one of our modules (a Dense layer, a transformer block), loads our float64 weights into it
(transposing the kernels), wraps it with `LoraModel`, and runs one SGD step on
0.5 mean((y - target)^2); the results come back in our layout. PEFT and PyTorch are
optional dependencies (requirements-peers.txt, a virtual environment of their own).
"""
from typing import Mapping, Optional

import numpy as np

# Our leaf name -> torch's parameter name within the same module; kernels are transposed.
_LEAVES = {"kernel": "weight", "scale": "weight", "bias": "bias"}


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


def block_module(width: int, heads: int, mlp_ratio: int, epsilon: float = 1e-5):
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

  return Block().double()


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
  with torch.no_grad():
    named = dict(module.named_parameters())
    for path, value in params.items():
      *layer, leaf = path.split("/")
      if leaf in _LEAVES:
        value = value.T if leaf == "kernel" else value
        named[".".join(layer + [_LEAVES[leaf]])].copy_(torch.as_tensor(np.array(value)))
  config = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout,
                           target_modules=list(targets), use_rslora=use_rslora,
                           init_lora_weights=init_lora_weights)
  model = peft.tuners.lora.LoraModel(module, config, "default")
  layers = {name: layer for name, layer in model.model.named_modules()
            if isinstance(layer, peft.tuners.lora.Linear)}
  with torch.no_grad():
    for name, layer in layers.items():
      path = name.replace(".", "/")
      if f"{path}/lora_a" in params:
        layer.lora_A["default"].weight.copy_(torch.as_tensor(params[f"{path}/lora_a"].T))
        layer.lora_B["default"].weight.copy_(torch.as_tensor(params[f"{path}/lora_b"].T))
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
