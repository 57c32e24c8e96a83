"""Evaluation of one (global) model on a host dataset, in fixed-size batches.

Batches are straight-line jitted calls driven from Python, not a rolled loop:
on XLA:CPU a convolution inside a loop body is many times slower
(docs/performance.md). The last batch is padded and masked, so one shape compiles.

Labels y [N] give per-example accuracy and mean loss. Next-token targets
y [N, L] give next-token accuracy and mean loss over the scored tokens
(targets >= 0 and != pad_id, see `local.make_loss_fn`), pooled over the
dataset and, in `per_client_accuracy`, over each client's tokens.
"""
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_lama.engine import local


class EvalResult(NamedTuple):
  loss: float      # mean per example, or per scored token for targets [N, L]
  accuracy: float  # likewise
  # For per-client breakdowns: bool [N] per example, or int8 [N, L] per token
  # (1 correct, 0 wrong, -1 not scored: padding) for targets [N, L].
  correct: np.ndarray


def make_eval_fn(model, has_model_state: bool, pad_id: Optional[int] = None):
  """eval_batch(params, model_state, x, y, mask) -> (summed loss, correct), jitted.

  pad_id: a vocabulary id of next-token targets that is padding (targets < 0
  always are); see `local.make_loss_fn`.
  """

  @jax.jit
  def eval_batch(params, model_state, x, y, mask):
    variables = {"params": params, **({"batch_stats": model_state} if has_model_state else {})}
    logits = local.align_logits(model.apply(variables, x, train=False), y)
    if y.ndim == 2:
      tokens = local.token_mask(y, mask, pad_id)
      loss = local.token_losses(logits, y)
      hit = (jnp.argmax(logits, -1) == y).astype(jnp.int8)
      return jnp.sum(loss * tokens), jnp.where(tokens > 0, hit, jnp.int8(-1))
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    correct = jnp.argmax(logits, -1) == y
    return jnp.sum(loss * mask), correct
  return eval_batch


def evaluate(eval_batch, params, model_state, x: np.ndarray, y: np.ndarray,
             batch_size: int = 1000) -> EvalResult:
  n = len(y)
  if n == 0:
    return EvalResult(float("nan"), float("nan"), np.zeros(0, bool))
  bs = min(batch_size, n)
  loss_sum, correct = 0.0, []
  for start in range(0, n, bs):
    xb, yb = x[start:start + bs], y[start:start + bs]
    real = len(yb)
    if real < bs:  # pad to the compiled shape
      xb = np.concatenate([xb, np.zeros((bs - real,) + xb.shape[1:], xb.dtype)])
      yb = np.concatenate([yb, np.zeros((bs - real,) + yb.shape[1:], yb.dtype)])
    mask = (np.arange(bs) < real).astype(np.float32)
    ls, c = eval_batch(params, model_state, xb, yb, mask)
    loss_sum += float(ls)
    correct.append(np.asarray(c)[:real])
  correct = np.concatenate(correct)
  if correct.ndim == 1:
    return EvalResult(loss_sum / n, float(correct.mean()), correct)
  scored = int(np.count_nonzero(correct >= 0))
  if scored == 0:
    return EvalResult(float("nan"), float("nan"), correct)
  return EvalResult(loss_sum / scored, np.count_nonzero(correct == 1) / scored, correct)


def per_client_accuracy(correct: np.ndarray, client_indices) -> np.ndarray:
  """Accuracy of each client's examples (indices into the evaluated arrays).

  For per-token `correct` [N, L] (see EvalResult) a client's accuracy pools its
  scored tokens; NaN for a client with no examples or no scored token.
  """
  if correct.ndim == 1:
    return np.array([correct[idx].mean() if len(idx) else np.nan for idx in client_indices])
  out = np.full(len(client_indices), np.nan)
  for i, idx in enumerate(client_indices):
    c = correct[idx]
    scored = np.count_nonzero(c >= 0)
    if scored:
      out[i] = np.count_nonzero(c == 1) / scored
  return out
