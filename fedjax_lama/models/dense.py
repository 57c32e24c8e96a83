"""Models without convolutions: MLPs, logistic regression, the LSTM language
model of FedAT (Chai et al. 2021) and Fed-LAMB (Karimi et al. 2022).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_lama.models import param_layers
from fedjax_lama.models import init

Array = jax.Array
ModuleDef = Any


class MLP(nn.Module):
  """Flatten -> [Dense -> (BatchNorm) -> ReLU -> Dropout] per hidden size -> Dense(classes).

  With hidden_sizes=(200,), dropout=0.5 and 28x28 inputs this is Fed-LAMB's
  `mnist_mlp`: 159,010 parameters in 4 tensors. `batch_norm` puts a BatchNorm (flax
  defaults: momentum 0.99, eps 1e-5; running statistics in 'batch_stats') after each hidden
  Dense, before its ReLU, as the models of FedBN (Li et al., ICLR 2021) place theirs.
  """
  num_classes: int = 10
  hidden_sizes: tuple[int, ...] = (128,)
  dropout: float = 0.0
  init_style: str = "keras"
  dense: ModuleDef = param_layers.Dense
  batch_norm: bool = False

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    x = x.reshape((x.shape[0], -1))
    dense = lambda width: self.dense(width, init_style=self.init_style)
    for width in self.hidden_sizes:
      x = dense(width)(x)
      if self.batch_norm:
        x = nn.BatchNorm(use_running_average=not train)(x)
      x = nn.relu(x)
      if self.dropout:
        x = nn.Dropout(self.dropout)(x, deterministic=not train)
    return dense(self.num_classes)(x)


class LogReg(nn.Module):
  """Logistic regression over a bag of words (FedAT Sentiment140, 3.6).

  vocab_size * num_classes + num_classes parameters (vocab * 2 + 2 for the
  binary task), in one `Dense_0` {kernel [vocab, classes], bias} whatever the
  input form:

  * float counts [batch, vocab] ('bow_counts'): counts @ kernel + bias;
    `vocab_size`, when given, is checked against the input width.
  * int token ids [batch, L] padded with negative ids ('bow_tokens', pad -1),
    which needs `vocab_size`: the sum of the kernel rows of the ids >= 0
    (a repeated id counts as often as it occurs) + bias. That equals the
    counts form on the same tweet up to float32 summation order, and costs
    L rows per example instead of a [batch, vocab] matrix (1.6M tweets x
    10,000 words would be 64 GB of dense counts).
  """
  num_classes: int = 2
  vocab_size: int | None = None
  init_style: str = "keras"

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    del train
    if x.ndim != 2:
      raise ValueError(
          f"logreg expects a bag-of-words matrix [batch, vocab_size] or "
          f"token ids [batch, length]; got shape {x.shape}")
    if jnp.issubdtype(x.dtype, jnp.integer):
      if self.vocab_size is None:
        raise ValueError(
            "logreg on int token ids [batch, length] needs vocab_size (the "
            "number of rows of the kernel); pass model option vocab_size")
      return _TokenBag(self.num_classes, self.vocab_size, self.init_style,
                       name="Dense_0")(x)
    if self.vocab_size is not None and x.shape[-1] != self.vocab_size:
      raise ValueError(
          f"logreg was built with vocab_size={self.vocab_size} but the input "
          f"has {x.shape[-1]} features")
    return param_layers.Dense(self.num_classes, init_style=self.init_style)(
        x.astype(jnp.float32))


class _TokenBag(nn.Module):
  """`param_layers.Dense` over the bag of words of padded ids, from the ids.

  Same leaves, shapes and initialisers as `param_layers.Dense(features)` applied to
  a [batch, vocab_size] input (it is named "Dense_0" by `LogReg`, so both
  input forms share one parameter tree and one initialisation).
  """
  features: int
  vocab_size: int
  init_style: str = "keras"

  @nn.compact
  def __call__(self, ids: Array) -> Array:
    kernel_init, bias_init = init.initializers(self.init_style,
                                                 self.vocab_size)
    kernel = self.param("kernel", kernel_init,
                        (self.vocab_size, self.features))
    bias = self.param("bias", bias_init, (self.features,))
    valid = ids >= 0
    # Padding gathers row 0 and is zeroed; ids >= vocab_size gather NaN
    # (jnp.take's "fill" mode), so a bad id shows up as a non-finite loss.
    rows = jnp.take(kernel, jnp.where(valid, ids, 0), axis=0)
    return jnp.sum(rows * valid[..., None].astype(kernel.dtype), axis=1) + bias


def check_tokens(model: str, x: Array) -> None:
  """A language model's input: int tokens [batch, time]."""
  if not jnp.issubdtype(x.dtype, jnp.integer) or x.ndim != 2:
    raise ValueError(f"{model} expects int tokens [batch, time]; got {x.dtype} {x.shape}")


def _keras_embedding_init(key, shape, dtype=jnp.float32):
  """Keras's Embedding default, U(-0.05, 0.05)."""
  return jax.random.uniform(key, shape, dtype, -0.05, 0.05)


class LSTMLM(nn.Module):
  """A character or word LSTM language model: embedding, `num_layers` LSTM layers, then
  (dropout, batch normalisation,) a dense output layer.

  Input int tokens [batch, time]; output logits [batch, time, num_classes]: the logits of
  position t depend on tokens 0..t only (the LSTM runs forward). With the next-token targets
  of a window that is every position's prediction; with one target per window (LEAF's
  Shakespeare `target='last'`) the engine reads the last position (engine/local.align_logits).

  Defaults: FedAT's Reddit next-word model (Chai et al., SC'21, Sec. 6): embedding 10,000 ->
  128, one LSTM, dropout 0.1, batch normalisation, dense 10,000. The paper gives no LSTM
  width; `hidden_size` defaults to 128, which gives 2,701,840 parameters (embedding
  1,280,000; LSTM 131,584; BN 256; dense 1,290,000). BatchNorm uses Keras defaults (momentum
  0.99, eps 1e-3), running statistics in 'batch_stats'.

  The character LSTM of McMahan, Moore, Ramage, Hampson, Aguera y Arcas (AISTATS 2017,
  Sec. 3, Shakespeare) and of LEAF (Caldas et al. 2018): embed_size=8, hidden_size=256,
  num_layers=2, dropout=0, batch_norm=False; a softmax output layer over the characters.
  Over LEAF's 80 characters plus one for any other (vocab_size=num_classes=81) it has
  818,137 parameters: embedding 648; LSTMs 271,360 + 525,312; dense 20,817. LEAF's TF
  model (80 characters) has 817,872. The FedAvg paper states 866,578 and not its character
  set: with one bias per gate as here, 265 V + 796,672 = 866,578 has no whole solution V; it
  is matched by V = 258 characters if the LSTMs also have peephole weights (3 x 256 per
  layer), a reading the paper does not confirm.

  Each LSTM is flax's `OptimizedLSTMCell` (gates i, f, g, o; input kernels without bias,
  recurrent kernels with one bias per gate, 4 (e h + h h + h) parameters for input width e);
  layer k's weights are the module "OptimizedLSTMCell_k" (FedLAMA's and the personalization
  methods' layer names: Embed_0, OptimizedLSTMCell_k, BatchNorm_0, Dense_0). The embedding
  leaf is named "embedding", not "kernel" (as Keras's "embeddings" is not a kernel either). `dense` builds the output layer (the zoo's, with the
  adapters of its `lora` option: fedjax_lama/models/lora.py; the LSTM cells have none).

  `tanh_outputs` puts a tanh on each LSTM layer's outputs (the next layer's input and, after
  the last layer, the output layer's), not on the recurrent state: FedJAX's Shakespeare
  model (`fedjax.models.shakespeare.create_lstm_model`, a haiku DeepRNN of [LSTM, tanh] per
  layer). Its weights map onto this module's exactly (third_party/fedjax_peer.py), so with
  `tanh_outputs=True` over FedJAX's 90 ids this module computes FedJAX's model.
  """
  num_classes: int = 10_000
  vocab_size: int = 10_000
  embed_size: int = 128
  hidden_size: int = 128
  dropout: float = 0.1
  num_layers: int = 1
  batch_norm: bool = True
  dense: ModuleDef = param_layers.Dense
  tanh_outputs: bool = False
  # lax.scan's unroll over positions: the same function at any value. Not a zoo option: the
  # benchmark's FLOP count sets it (XLA's cost analysis counts a loop's body once).
  unroll: int = 1

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    check_tokens("lstm_lm", x)
    x = nn.Embed(self.vocab_size, self.embed_size,
                 embedding_init=_keras_embedding_init)(x)
    for _ in range(self.num_layers):
      # The carry in the input's dtype (param_dtype sets it; the parameters are created in
      # the embedding's dtype, float32): float64 runs (the peer tests) keep one dtype.
      x = nn.RNN(nn.OptimizedLSTMCell(self.hidden_size, param_dtype=x.dtype),
                 unroll=self.unroll)(x)
      if self.tanh_outputs:
        x = jnp.tanh(x)
    x = nn.Dropout(self.dropout)(x, deterministic=not train)
    if self.batch_norm:
      x = nn.BatchNorm(use_running_average=not train, momentum=0.99,
                       epsilon=1e-3)(x)
    return self.dense(self.num_classes)(x)
