"""Evaluation of one (global) model on a host dataset, in fixed-size batches.

Batches are straight-line jitted calls driven from Python, not a rolled loop:
on XLA:CPU a convolution inside a loop body is many times slower
(docs/performance.md). The last batch is padded and masked, so one shape compiles.

Labels y [N] give per-example accuracy and mean loss. Next-token targets
y [N, L] give next-token accuracy and mean loss over the scored tokens
(targets >= 0 and != pad_id, see `local.make_loss_fn`), pooled over the
dataset and, in `per_client_accuracy`, over each client's tokens; also the
accuracy at each row's last scored target (`EvalResult.accuracy_last`).

`evaluate_parts` evaluates the union of some index lists (the clients' test parts) in
the same batches as `evaluate` and sums each list's outcomes: a per-client evaluation of
one model that costs what the pooled evaluation of the same examples costs, whatever
the spread of the parts' sizes.
"""
import math
from typing import Iterator, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_lama.engine import local


class EvalResult(NamedTuple):
  loss: float      # mean per example, or per scored token for targets [N, L] (nats)
  accuracy: float  # likewise
  # For per-client breakdowns: bool [N] per example, or int8 [N, L] per token
  # (1 correct, 0 wrong, -1 not scored: padding) for targets [N, L].
  correct: np.ndarray
  # Targets [N, L]: the accuracy of each row's last scored target (on LEAF's Shakespeare
  # windows the character after the window, LEAF's metric), over rows with a scored
  # target; labels [N]: the accuracy itself.
  accuracy_last: float = math.nan
  # float32 [N]: each example's loss, summed over its scored tokens (0 when none is).
  example_loss: Optional[np.ndarray] = None


class PartSums(NamedTuple):
  """Sums over each of some index lists (`evaluate_parts`), float64 numpy [P]."""
  loss_sum: np.ndarray
  correct: np.ndarray
  count: np.ndarray   # scored examples (or tokens); 0 for an empty list


def make_eval_fn(model, has_model_state: bool, pad_id: Optional[int] = None):
  """eval_batch(params, model_state, x, y, mask) -> (loss [B], correct), jitted.

  loss: each example's loss (float32), summed over its scored tokens for next-token
  targets, 0 where mask is 0. correct: bool [B] (labels), or int8 [B, L] (1 correct,
  0 wrong, -1 not scored) for targets [B, L].
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
      return jnp.sum(loss * tokens, axis=1), jnp.where(tokens > 0, hit, jnp.int8(-1))
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    correct = jnp.argmax(logits, -1) == y
    return loss * mask, correct
  return eval_batch


def _outcomes(eval_batch, params, model_state, x, y, batch_size: int,
              rows: Optional[np.ndarray] = None
              ) -> Iterator[tuple[np.ndarray, np.ndarray, float]]:
  """(loss, correct, the batch's summed loss) of the real examples, batch by batch: of x, y
  in order, or of the rows `rows` of them (gathered one batch at a time). The summed loss
  is reduced on the device, in float32, as the pooled test loss always was, so that runs
  keep their recorded test losses bit for bit."""
  n = len(y) if rows is None else len(rows)
  bs = min(batch_size, n)
  for start in range(0, n, bs):
    if rows is None:
      xb, yb = x[start:start + bs], y[start:start + bs]
    else:
      take = rows[start:start + bs]
      xb, yb = x[take], y[take]
    real = len(yb)
    if real < bs:  # pad to the compiled shape
      xb = np.concatenate([xb, np.zeros((bs - real,) + xb.shape[1:], xb.dtype)])
      yb = np.concatenate([yb, np.zeros((bs - real,) + yb.shape[1:], yb.dtype)])
    mask = (np.arange(bs) < real).astype(np.float32)
    loss, correct = eval_batch(params, model_state, xb, yb, mask)
    yield np.asarray(loss)[:real], np.asarray(correct)[:real], float(jnp.sum(loss))


def _gather(eval_batch, params, model_state, x, y, batch_size, rows=None):
  """(per-example losses, outcomes, the summed loss) over every batch."""
  losses, corrects, loss_sum = [], [], 0.0
  for loss, correct, batch_sum in _outcomes(eval_batch, params, model_state, x, y, batch_size,
                                            rows):
    losses.append(loss)
    corrects.append(correct)
    loss_sum += batch_sum
  return np.concatenate(losses), np.concatenate(corrects), loss_sum


def last_scored(correct: np.ndarray) -> np.ndarray:
  """int8 [N]: the outcome of each row's last scored target (1, 0, or -1 when the row has
  none) of per-token outcomes [N, L] (EvalResult.correct)."""
  scored = correct >= 0
  last = correct.shape[1] - 1 - np.argmax(scored[:, ::-1], axis=1)
  out = correct[np.arange(len(correct)), last]
  return np.where(scored.any(axis=1), out, np.int8(-1)).astype(np.int8)


def evaluate(eval_batch, params, model_state, x: np.ndarray, y: np.ndarray,
             batch_size: int = 1000) -> EvalResult:
  n = len(y)
  if n == 0:
    return EvalResult(float("nan"), float("nan"), np.zeros(0, bool), float("nan"),
                      np.zeros(0, np.float32))
  example_loss, correct, loss_sum = _gather(eval_batch, params, model_state, x, y, batch_size)
  if correct.ndim == 1:
    accuracy = float(correct.mean())
    return EvalResult(loss_sum / n, accuracy, correct, accuracy, example_loss)
  scored = int(np.count_nonzero(correct >= 0))
  last = last_scored(correct)
  rows = int(np.count_nonzero(last >= 0))
  accuracy_last = np.count_nonzero(last == 1) / rows if rows else float("nan")
  if scored == 0:
    return EvalResult(float("nan"), float("nan"), correct, accuracy_last, example_loss)
  return EvalResult(loss_sum / scored, np.count_nonzero(correct == 1) / scored, correct,
                    accuracy_last, example_loss)


def example_counts(correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(correct, scored) per example, float64 [N], of bool [N] or per-token [N, L] outcomes."""
  if correct.ndim == 1:
    return correct.astype(np.float64), np.ones(len(correct))
  return (np.count_nonzero(correct == 1, axis=1).astype(np.float64),
          np.count_nonzero(correct >= 0, axis=1).astype(np.float64))


def segment_sums(values: np.ndarray, lengths: Sequence[int]) -> np.ndarray:
  """float64 [P]: the sums of consecutive runs of `values` of the given lengths (0 for an
  empty run), each run summed in float64 from its first value to its last."""
  lengths = np.asarray(lengths, np.int64)
  out = np.zeros(len(lengths))
  nonempty = lengths > 0
  if nonempty.any():
    starts = (np.cumsum(lengths) - lengths)[nonempty]
    out[nonempty] = np.add.reduceat(np.asarray(values, np.float64), starts)
  return out


def evaluate_parts(eval_batch, params, model_state, x: np.ndarray, y: np.ndarray,
                   parts: Sequence[np.ndarray], batch_size: int = 1000) -> PartSums:
  """The summed loss, correct and scored examples (tokens) of each index list of `parts`.

  The lists are evaluated back to back in batches of `batch_size`, as `evaluate` evaluates
  a dataset: the cost is that of one pooled evaluation of their union.
  """
  lengths = [len(p) for p in parts]
  if sum(lengths) == 0:
    zeros = np.zeros(len(parts))
    return PartSums(zeros, zeros.copy(), zeros.copy())
  rows = np.concatenate([np.asarray(p, np.int64) for p in parts])
  example_loss, correct, _ = _gather(eval_batch, params, model_state, x, y, batch_size, rows)
  hits, scored = example_counts(correct)
  return PartSums(segment_sums(example_loss, lengths), segment_sums(hits, lengths),
                  segment_sums(scored, lengths))


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
