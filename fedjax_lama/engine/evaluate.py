"""Evaluation of one (global) model on a host dataset, in fixed-size batches.

Batches are straight-line jitted calls driven from Python, not a rolled loop:
on XLA:CPU a convolution inside a loop body is many times slower
(architecture.md 4). The last batch is padded and masked, so one shape compiles.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax


class EvalResult(NamedTuple):
  loss: float
  accuracy: float
  correct: np.ndarray  # bool per example, for per-client breakdowns


def make_eval_fn(model, has_model_state: bool):
  @jax.jit
  def eval_batch(params, model_state, x, y, mask):
    variables = {"params": params, **({"batch_stats": model_state} if has_model_state else {})}
    logits = model.apply(variables, x, train=False)
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
      yb = np.concatenate([yb, np.zeros(bs - real, yb.dtype)])
    mask = (np.arange(bs) < real).astype(np.float32)
    ls, c = eval_batch(params, model_state, xb, yb, mask)
    loss_sum += float(ls)
    correct.append(np.asarray(c)[:real])
  correct = np.concatenate(correct)
  return EvalResult(loss_sum / n, float(correct.mean()), correct)


def per_client_accuracy(correct: np.ndarray, client_indices) -> np.ndarray:
  """Accuracy of each client's examples (indices into the evaluated arrays)."""
  return np.array([correct[idx].mean() if len(idx) else np.nan for idx in client_indices])
