"""A decoder-only transformer language model, `transformer_lm`.

The GPT-2 layout (Radford et al. 2019; pre-LayerNorm blocks as analysed by Xiong et al.,
ICML 2020): token embedding plus learned position embedding, `depth` blocks of

    h = h + Dropout(out(CausalSelfAttention(query, key, value of LayerNorm(h))))
    h = h + Dropout(mlp_out(GELU(mlp_in(LayerNorm(h)))))      (GELU: the tanh approximation)

then a final LayerNorm and the output projection (a Dense layer, or the token embedding
transposed when `tied_output`, as in Press & Wolf, EACL 2017). Attention is computed by
`jax.nn.dot_product_attention(..., is_causal=True)` (softmax(q k^T / sqrt(head_dim)) v per
head, position t attending to positions <= t), so the logits of position t depend on
tokens 0..t only. Dropout (option `dropout`) is applied to the summed embeddings and to
both residual branches, as GPT-2's embedding and residual dropout; there is no dropout on
the attention weights, which `dot_product_attention` does not offer.

Input int tokens [batch, time] with time <= max_len; output logits [batch, time,
num_classes]. With one target per window (LEAF's Shakespeare `target='last'`) the engine
reads the last position (engine/local.align_logits), as for `lstm_lm`.

Layer names, as FedLAMA's layer-wise schedule and the personalization methods' layer
options read them (fedjax_lama/fedlama/layer_units.py, algorithms/layer_partition.py):

    token_embed/embedding                  [vocab_size, width]
    position_embed/embedding               [max_len, width]
    block_<i>/attention_norm/{scale,bias}
    block_<i>/attention/{query,key,value,out}/{kernel,bias}   [width, width], [width]
    block_<i>/mlp_norm/{scale,bias}
    block_<i>/mlp_in/{kernel,bias}         [width, mlp_ratio * width]
    block_<i>/mlp_out/{kernel,bias}        [mlp_ratio * width, width]
    final_norm/{scale,bias}
    Dense_0/{kernel,bias}                  [width, num_classes]   (absent when tied_output)

The output projection is the model's only top-level Dense module, so it is the default
head of FedPer, FedRep and LG-FedAvg; with `tied_output` there is no head of its own and
those methods need their layers named. Every projection is its own Dense layer (a `kernel`
leaf of FedLAMA's kernel mask), named so that adapters can be put on them by name.

Parameters (`parameter_count`): embeddings (V + P) d; per block 4 (d^2 + d) for the
attention projections, 2 r d^2 + r d + d for the MLP and 4 d for the two LayerNorms; a
final LayerNorm 2 d; the untied head d C + C. Initialisation: embeddings N(0, 0.02^2) as
GPT-2's; Dense kernels by `init_style` (default "flax": LeCun normal), zero biases;
LayerNorm scale 1, bias 0 (eps 1e-5, as GPT-2's).
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_lama.models import dense as dense_models
from fedjax_lama.models import param_layers

Array = jax.Array

# Named sizes over LEAF's Shakespeare characters (V = C = 81, max_len 80, mlp_ratio 4,
# untied head); their exact parameter counts are in the zoo's summary and checked against
# a count by hand in tests/test_text_models.py.
SIZES: dict[str, dict[str, int]] = {
    "tiny": {"width": 64, "depth": 4, "heads": 4},       # 215,633
    "small": {"width": 128, "depth": 4, "heads": 4},     # 824,401
    "medium": {"width": 256, "depth": 6, "heads": 8},    # 4,801,105
    "large": {"width": 256, "depth": 12, "heads": 8},    # 9,539,665
}
LAYER_NORM_EPSILON = 1e-5
EMBEDDING_STDDEV = 0.02


def parameter_count(vocab_size: int, width: int, depth: int, heads: int = 1,
                    mlp_ratio: int = 4, max_len: int = 80, num_classes: int | None = None,
                    tied_output: bool = False) -> int:
  """The number of parameters of `TransformerLM` with these options (heads do not change it)."""
  del heads
  d, r = width, mlp_ratio
  classes = vocab_size if num_classes is None else num_classes
  block = 4 * (d * d + d) + (2 * r * d * d + r * d + d) + 4 * d
  head = 0 if tied_output else d * classes + classes
  return (vocab_size + max_len) * d + depth * block + 2 * d + head


class CausalSelfAttention(nn.Module):
  """Multi-head causal self-attention with separate query, key, value and out Dense layers."""
  width: int
  heads: int
  init_style: str = "flax"
  dense: Callable[..., nn.Module] = param_layers.Dense

  @nn.compact
  def __call__(self, x: Array) -> Array:
    batch, time, _ = x.shape
    head_dim = self.width // self.heads
    split = lambda y: y.reshape(batch, time, self.heads, head_dim)
    project = lambda name: self.dense(self.width, init_style=self.init_style, name=name)
    q, k, v = (split(project(name)(x)) for name in ("query", "key", "value"))
    y = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    return project("out")(y.reshape(batch, time, self.width))


class Block(nn.Module):
  """One pre-LayerNorm transformer block: attention, then the MLP, each on a residual."""
  width: int
  heads: int
  mlp_ratio: int = 4
  dropout: float = 0.0
  init_style: str = "flax"
  dense: Callable[..., nn.Module] = param_layers.Dense

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    norm = lambda name: nn.LayerNorm(epsilon=LAYER_NORM_EPSILON, name=name)
    drop = lambda y: nn.Dropout(self.dropout)(y, deterministic=not train)
    x = x + drop(CausalSelfAttention(self.width, self.heads, self.init_style, self.dense,
                                     name="attention")(norm("attention_norm")(x)))
    h = self.dense(self.mlp_ratio * self.width, init_style=self.init_style,
                   name="mlp_in")(norm("mlp_norm")(x))
    h = self.dense(self.width, init_style=self.init_style, name="mlp_out")(nn.gelu(h))
    return x + drop(h)


class TransformerLM(nn.Module):
  """Decoder-only transformer language model (module docstring)."""
  num_classes: int = 81
  vocab_size: int = 81
  width: int = 128
  depth: int = 4
  heads: int = 4
  mlp_ratio: int = 4
  max_len: int = 80
  dropout: float = 0.0
  tied_output: bool = False
  init_style: str = "flax"
  dense: Any = param_layers.Dense
  # Rematerialise each block (`nn.remat`, jax.checkpoint): the backward pass recomputes a
  # block's activations from its input instead of keeping them, so a step holds one
  # block's activations at a time plus every block's input (docs/performance.md, "LoRA").
  remat: bool = False

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    dense_models.check_tokens("transformer_lm", x)
    if x.shape[1] > self.max_len:
      raise ValueError(
          f"transformer_lm was built with max_len={self.max_len} positions but the input "
          f"has {x.shape[1]}; set the model option max_len to at least {x.shape[1]}")
    embed_init = nn.initializers.normal(EMBEDDING_STDDEV)
    tokens = nn.Embed(self.vocab_size, self.width, embedding_init=embed_init,
                      name="token_embed")
    positions = nn.Embed(self.max_len, self.width, embedding_init=embed_init,
                         name="position_embed")
    h = tokens(x) + positions(jnp.arange(x.shape[1]))[None]
    h = nn.Dropout(self.dropout)(h, deterministic=not train)
    block = nn.remat(Block, static_argnums=(2,)) if self.remat else Block
    for i in range(self.depth):
      h = block(self.width, self.heads, self.mlp_ratio, self.dropout, self.init_style,
                self.dense, name=f"block_{i}")(h, train)
    h = nn.LayerNorm(epsilon=LAYER_NORM_EPSILON, name="final_norm")(h)
    if self.tied_output:
      return tokens.attend(h)
    return self.dense(self.num_classes, init_style=self.init_style)(h)
