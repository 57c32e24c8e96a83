"""The flat name -> model table: the zoo's models with their options and paper counts.

`get(name, num_classes, **options)` returns an unbound `flax.linen.Module` whose
`__call__(x, train=False)` returns logits. Every model accepts the option `kernels`
(`fedjax_lama.kernels.KERNELS`) so the engine can pass it uniformly:
the kernel set its convolutions, dense layers and max pools compute with; logreg and lstm_lm
ignore it. Every model but logreg accepts `lora` (None, or a dict: `lora.LoRA.parse`), the
LoRA adapters put on the Dense layers it names (fedjax_lama/models/lora.py); it adds the
adapter leaves and leaves the rest of the parameter tree as it is. The counts in the
summaries are the papers' (FedLAMA: Lee et al. 2023; FedSpeed: Sun et al. 2023; FedAT: Chai
et al. 2021; Fed-LAMB: Karimi et al. 2022; the FedAvg paper, McMahan et al. 2017, and LEAF,
Caldas et al. 2018) and their code's.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn

from fedjax_lama import kernels
from fedjax_lama.models import param_layers
from fedjax_lama.models import cnn
from fedjax_lama.models import dense as dense_models
from fedjax_lama.models import init
from fedjax_lama.models import lora
from fedjax_lama.models import resnet
from fedjax_lama.models import transformer


@dataclasses.dataclass(frozen=True)
class _Entry:
  """A model family: builder, accepted options with defaults, a summary.

  `build(num_classes, **options)` also takes `ops` (the layers' plan) when `conv` is
  true, and else `dense` (the Dense layer, with the adapters of option `lora`) when
  `adapters` is true. `inputs` are the input kinds it consumes (INPUT_KINDS).
  """
  build: Callable[..., nn.Module]
  defaults: dict[str, Any]
  summary: str
  conv: bool = True
  adapters: bool = True
  inputs: tuple[str, ...] = ("image",)


# What a model consumes, as fedjax_lama.data names a dataset's `input_kind`: images, bags of
# words as counts or as token ids, or token sequences (next-token data).
INPUT_KINDS = ("image", "bow_counts", "bow_tokens", "tokens")


def _choice(model: str, option: str, value: Any, accepted: tuple[str, ...]):
  if value not in accepted:
    raise ValueError(
        f"model {model!r}: {option}={value!r} is not accepted; use one of "
        f"{', '.join(repr(a) for a in accepted)}")


def _fedat_cnn(name):
  def build(num_classes, variant, init_style, **ops):
    _choice(name, "variant", variant, ("tf_tutorial", "same_pool3"))
    return cnn.FedATCNN(num_classes, variant, init_style, **ops)
  return build


def _wrn28_10(num_classes, variant, dropout, **ops):
  _choice("wrn28_10", "variant", variant, ("reference", "preact"))
  if variant == "reference":
    return resnet.ResNet20(num_classes, widths=(160, 320, 640), blocks=4,
                           dropout=dropout, bn_epsilon=1e-5,
                           **ops)
  return resnet.WideResNetPreAct(num_classes, dropout=dropout,
                                 **ops)


def _resnet9(num_classes, variant, init_style, **ops):
  _choice("resnet9", "variant", variant, ("he_basic_1111", "dawnbench"))
  cls = resnet.ResNet9 if variant == "he_basic_1111" else (
      resnet.ResNet9DawnBench)
  return cls(num_classes, init_style=init_style, **ops)


def _positive_int(model: str, option: str, value: Any):
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"model {model!r}: {option} must be a positive int; got {value!r}")


def _lstm_lm(num_classes, vocab_size, embed_size, hidden_size, dropout, num_layers,
             batch_norm, tanh_outputs, dense):
  for option, value in (("vocab_size", vocab_size), ("embed_size", embed_size),
                        ("hidden_size", hidden_size), ("num_layers", num_layers)):
    _positive_int("lstm_lm", option, value)
  _choice("lstm_lm", "batch_norm", batch_norm, (True, False))
  _choice("lstm_lm", "tanh_outputs", tanh_outputs, (True, False))
  return dense_models.LSTMLM(num_classes, vocab_size, embed_size, hidden_size, dropout,
                             num_layers, batch_norm, dense, tanh_outputs)


def _transformer_lm(num_classes, vocab_size, width, depth, heads, mlp_ratio, max_len,
                    dropout, tied_output, init_style, remat, **ops):
  vocab_size = num_classes if vocab_size is None else vocab_size
  for option, value in (("vocab_size", vocab_size), ("width", width), ("depth", depth),
                        ("heads", heads), ("mlp_ratio", mlp_ratio), ("max_len", max_len)):
    _positive_int("transformer_lm", option, value)
  if width % heads:
    raise ValueError(f"model 'transformer_lm': width={width} must be a multiple of "
                     f"heads={heads}")
  _choice("transformer_lm", "tied_output", tied_output, (True, False))
  if tied_output and vocab_size != num_classes:
    raise ValueError(f"model 'transformer_lm': tied_output=True reads the logits from the "
                     f"token embedding, so vocab_size={vocab_size} must equal the number "
                     f"of classes {num_classes}")
  _choice("transformer_lm", "remat", remat, (True, False))
  return transformer.TransformerLM(num_classes, vocab_size, width, depth, heads, mlp_ratio,
                                   max_len, dropout, tied_output, init_style, ops["dense"],
                                   remat)


def _lenet(variant):
  def build(num_classes, init_style, **ops):
    return cnn.LeNet(num_classes, variant, init_style, **ops)
  return build


_MODELS: dict[str, _Entry] = {
    "resnet20": _Entry(
        lambda num_classes, **ops: resnet.ResNet20(
            num_classes, **ops),
        {}, "FedLAMA reference ResNet20; 272,762 params (10 classes)"),
    "wrn28_10": _Entry(
        _wrn28_10, {"variant": "reference", "dropout": 0.3},
        "WRN-28-10; 36,539,124 (100 classes), preact 36,536,884"),
    "leaf_cnn": _Entry(
        lambda num_classes, init_style, **ops: cnn.LeafCNN(
            num_classes, init_style, **ops),
        {"init_style": "keras"},
        "LEAF FEMNIST CNN; 6,603,710 params (62 classes)"),
    "fedat_cnn": _Entry(
        _fedat_cnn("fedat_cnn"),
        {"variant": "tf_tutorial", "init_style": "keras"},
        "FedAT CNN; 122,570 (32x32x3), 93,322 (28x28x1)"),
    "cifar_cnn": _Entry(
        _fedat_cnn("cifar_cnn"),
        {"variant": "tf_tutorial", "init_style": "torch"},
        "Fed-LAMB CIFAR CNN, fedat_cnn layout; 122,570"),
    "mnist_mlp": _Entry(
        lambda num_classes, dropout, init_style, **ops: dense_models.MLP(
            num_classes, (200,), dropout, init_style, ops["dense"]),
        {"dropout": 0.5, "init_style": "torch"},
        "Fed-LAMB MNIST MLP 784-200-10; 159,010"),
    "mnist_cnn": _Entry(
        lambda num_classes, dropout, init_style, **ops: cnn.MnistCNN(
            num_classes, dropout, init_style, **ops),
        {"dropout": 0.5, "init_style": "torch"},
        "Fed-LAMB MNIST CNN; 21,840"),
    "pfl_cnn": _Entry(
        lambda num_classes, dropout, conv_dropout, init_style, **ops: cnn.PflCNN(
            num_classes, dropout, conv_dropout, init_style, **ops),
        {"dropout": 0.5, "conv_dropout": 0.25, "init_style": "keras"},
        "pfl-research's CIFAR-10 simple_cnn; 1,626,442 (32x32x3, 10 classes)"),
    "cifar_lenet": _Entry(
        _lenet("fedlamb"), {"init_style": "torch"},
        "Fed-LAMB code's CNNCifar; 62,006"),
    "fedspeed_lenet": _Entry(
        _lenet("fedspeed"), {"init_style": "torch"},
        "FedSpeed code's LeNet; 797,962 (10 classes)"),
    "resnet9": _Entry(
        _resnet9, {"variant": "he_basic_1111", "init_style": "torch"},
        "Fed-LAMB ResNet-9; 4,903,242, dawnbench 6,573,120"),
    "resnet18_gn": _Entry(
        lambda num_classes, num_groups, **ops: resnet.ResNet18GN(
            num_classes, num_groups, **ops),
        {"num_groups": 2},
        "FedSpeed ResNet-18-GN; 11,181,642 (10 classes)"),
    "logreg": _Entry(
        lambda num_classes, vocab_size, init_style: dense_models.LogReg(
            num_classes, vocab_size, init_style),
        {"vocab_size": None, "init_style": "keras"},
        "bag-of-words logistic regression; vocab*classes+classes",
        conv=False, adapters=False, inputs=("bow_counts", "bow_tokens")),
    "lstm_lm": _Entry(
        _lstm_lm,
        {"vocab_size": 10_000, "embed_size": 128, "hidden_size": 128,
         "dropout": 0.1, "num_layers": 1, "batch_norm": True, "tanh_outputs": False},
        "FedAT Reddit LSTM LM; 2,701,840 (10,000 classes). FedAvg paper / LEAF "
        "character LSTM (embed_size=8, hidden_size=256, num_layers=2, dropout=0, "
        "batch_norm=False): 818,137 over 81 characters (LEAF's TF model, 80: 817,872; "
        "the FedAvg paper states 866,578, see dense.LSTMLM); tanh_outputs=True over 90 "
        "ids: FedJAX's Shakespeare LSTM",
        conv=False, inputs=("tokens",)),
    "transformer_lm": _Entry(
        _transformer_lm,
        {"vocab_size": None, "width": 128, "depth": 4, "heads": 4, "mlp_ratio": 4,
         "max_len": 80, "dropout": 0.0, "tied_output": False, "init_style": "flax",
         "remat": False},
        "decoder-only pre-LayerNorm transformer LM; 81 characters, max_len 80, untied: "
        + ", ".join(f"{name} {transformer.parameter_count(81, **size):,}"
                    for name, size in transformer.SIZES.items())
        + " (transformer.SIZES)", inputs=("tokens",)),
    "mlp": _Entry(
        lambda num_classes, hidden_sizes, dropout, init_style, batch_norm, **ops: (
            dense_models.MLP(num_classes, tuple(hidden_sizes), dropout, init_style,
                             ops["dense"], bool(batch_norm))),
        {"hidden_sizes": (128,), "dropout": 0.0, "init_style": "keras", "batch_norm": False},
        "small MLP (e.g. the built-in 8x8 digits); batch_norm: a BatchNorm per hidden layer",
        inputs=("image", "bow_counts")),
}

def names() -> list[str]:
  """All model names, sorted."""
  return sorted(_MODELS)


def options(name: str) -> dict[str, Any]:
  """The options `name` accepts, with their defaults (kernels and lora included)."""
  entry = _entry(name)
  return {**entry.defaults, "kernels": "auto", **({"lora": None} if entry.adapters else {})}


def inputs(name: str) -> tuple[str, ...]:
  """The input kinds (INPUT_KINDS) model `name` consumes."""
  return _entry(name).inputs


def _entry(name: str) -> _Entry:
  if name not in _MODELS:
    raise ValueError(
        f"unknown model {name!r}; known models: {', '.join(names())}")
  return _MODELS[name]


def get(name: str, num_classes: int, **opts: Any) -> nn.Module:
  """Builds model `name` with `num_classes` outputs.

  Args:
    name: one of `names()`.
    num_classes: size of the logit axis (for lstm_lm the output vocabulary).
    **opts: model options, see `options(name)`. `kernels` ("auto" by default) names
      a kernel set (`kernels.get`); a `kernels.Kernels` is taken as it is (the benchmarks'
      measurement-only plans). `lora` (None by default) puts LoRA adapters on the Dense
      layers it names (`lora.LoRA.parse`); `lora.check_targets` on the initialised
      parameters then checks that every target named a layer.

  Returns:
    An unbound flax module; `module.init(rngs, x)` / `module.apply(...)`.

  Raises:
    ValueError: unknown name, bad num_classes, unknown option or bad value.
  """
  entry = _entry(name)
  if isinstance(num_classes, bool) or not isinstance(num_classes, int) or (
      num_classes < 1):
    raise ValueError(
        f"model {name!r}: num_classes must be a positive int; got "
        f"{num_classes!r}")
  unknown = sorted(set(opts) - set(options(name)))
  if unknown:
    raise ValueError(
        f"model {name!r}: unknown option(s) {', '.join(unknown)}; accepted: "
        f"{', '.join(sorted(options(name)))}")
  merged = {**entry.defaults, **opts}
  chosen = merged.pop("kernels", "auto")
  adapter = lora.LoRA.parse(merged.pop("lora", None))
  ops = _layers(chosen if isinstance(chosen, kernels.Kernels) else kernels.get(chosen),
                adapter)
  if "init_style" in merged:
    init.initializers(merged["init_style"], 1)  # Validates the name.
  if "dropout" in merged and not 0.0 <= merged["dropout"] < 1.0:
    raise ValueError(
        f"model {name!r}: dropout must be in [0, 1); got {merged['dropout']!r}")
  if entry.conv:  # The others accept kernels and ignore it.
    merged.update(ops)
  elif entry.adapters:  # Its Dense layers compute with the default op.
    merged["dense"] = _plain_dense(adapter)
  return entry.build(num_classes, **merged)


@functools.lru_cache(maxsize=None)
def _layers(ops: kernels.Kernels, adapter: lora.LoRA | None = None) -> dict[str, Any]:
  """The modules a model is built with, computing with `ops`, its Dense layers with the
  adapters of `adapter`; one dict per kernel set and adapter, so a model built twice
  compares equal (jit caches on it)."""
  return {"conv": functools.partial(param_layers.Conv, op=ops.conv),
          "dense": functools.partial(param_layers.Dense, op=ops.dense, lora=adapter),
          "max_pool": ops.max_pool}


@functools.lru_cache(maxsize=None)
def _plain_dense(adapter: lora.LoRA | None) -> Any:
  """The Dense layer of the models that ignore `kernels` (lstm_lm), with `adapter`."""
  return functools.partial(param_layers.Dense, lora=adapter)
