r"""Per-client evaluation on text against the pooled evaluation of the same windows.

  python -m benchmarks.text_eval_speed [--roles=100 --test_windows=10000 --repeats=3]
  python -m benchmarks.text_eval_speed --model=transformer_lm \
      --model_options='{"width": 128, "depth": 4, "heads": 4}'
  python -m benchmarks.text_eval_speed --quick     # a smoke test: 20 roles, 1,000 windows

Synthetic Shakespeare-shaped data: `--roles` clients whose test parts are windows of 80
characters over LEAF's 81 ids, of sizes drawn log-normally (sigma 1.3, as unequal as a
play's roles: a few with thousands of windows, many with a handful), about
`--test_windows` in all. One model (default `lstm_lm`, embedding 8, one LSTM of 64) at
random weights, evaluated four ways, each once to compile and then `--repeats` times in
turn (so load on a shared machine falls on all alike):

- pooled: `evaluate.evaluate` over all the windows, in batches of `--eval_batch_size`
  (what a run's test accuracy costs);
- per_client: the engine's per-client evaluation of the global model
  (`PersonalEvaluator.global_sums`: the parts back to back in the same batches, each
  client's outcomes summed);
- one_width: the global model vmapped over chunks of `eval_batch_size // largest` clients,
  every part padded to the largest one: how per-client evaluation ran before
  (`PersonalEvaluator.personal_sums` without serve or fine-tuning, one width);
- personal_one_width, personal_by_size: each client's own model (here 0 fine-tuning
  steps: the global model, one copy per client, as fine-tuning and Ditto evaluate) in
  chunks of one width, and in chunks grouped by part size (`personal_eval.chunk_layout`,
  the engine's layout).

Printed: the machine, the data's shape, each way's time (median of the repeats) and its
ratio to the pooled evaluation (median of the ratios of neighbouring repeats). The last
line is JSON.
"""
import functools
import json
import math
import statistics
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import round_timing
from fedjax_lama import models
from fedjax_lama.data import leaf_text
from fedjax_lama.engine import evaluate, local, personal_eval, sharding

FLAGS = flags.FLAGS
WINDOW = 80


def define_flags() -> None:
  """The command line's flags, defined when run as a program (the benchmarks' tests import
  several benchmark modules into one process, whose flag names would collide)."""
  flags.DEFINE_integer("roles", 100, "Clients (a play's speaking roles).")
  flags.DEFINE_integer("test_windows", 10_000, "Test windows over all clients (about).")
  flags.DEFINE_string("model", "lstm_lm", "lstm_lm or transformer_lm.")
  flags.DEFINE_string("model_options", "", "The model's options as JSON (default: "
                      "lstm_lm embed_size 8, hidden_size 64).")
  flags.DEFINE_integer("eval_batch_size", 1000, "config.eval_batch_size.")
  flags.DEFINE_integer("repeats", 3, "Timed repeats of each way after a compiling one.")
  flags.DEFINE_bool("quick", False, "A smoke test: 20 roles, 1,000 windows, one repeat.")


def role_sizes(roles: int, windows: int, seed: int = 0) -> np.ndarray:
  """Log-normal part sizes (at least 1) summing to about `windows`."""
  weights = np.random.default_rng(seed).lognormal(0.0, 1.3, roles)
  return np.maximum(1, np.rint(weights / weights.sum() * windows)).astype(np.int64)


def synthetic_text(sizes: np.ndarray, seed: int = 0):
  """Windows x [N, 80] and next-character targets y [N, 80] (random characters), and each
  client's part (consecutive rows)."""
  rng = np.random.default_rng(seed)
  n = int(sizes.sum())
  stream = rng.integers(0, leaf_text.SHAKESPEARE_OOV, n + WINDOW).astype(np.int32)
  rows = np.arange(n)[:, None] + np.arange(WINDOW)[None]
  x, y = stream[rows], stream[rows + 1]
  ends = np.cumsum(sizes)
  return x, y, [np.arange(end - size, end) for end, size in zip(ends, sizes)]


def _timed(fn):
  def arm():
    started = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - started
  return arm


def run(roles: int, windows: int, model_name: str, options: dict, eval_batch_size: int,
        repeats: int) -> dict:
  classes = leaf_text.SHAKESPEARE_OOV + 1
  sizes = role_sizes(roles, windows)
  x, y, parts = synthetic_text(sizes)
  if model_name == "lstm_lm" and not options:
    options = {"embed_size": 8, "hidden_size": 64}
  model = models.get(model_name, classes, vocab_size=classes, **options)
  variables = model.init({"params": jax.random.PRNGKey(0)}, jnp.asarray(x[:1]))
  params, state = variables["params"], variables.get("batch_stats", {})
  has_state = bool(jax.tree.leaves(state))
  eval_fn = evaluate.make_eval_fn(model, has_state)
  mesh = sharding.client_mesh(jax.devices()[:1])
  largest = int(sizes.max())
  common = dict(test_x=x, test_y=y, test_parts=parts,
                clients_per_chunk=max(1, eval_batch_size // largest),
                eval_batch_size=eval_batch_size)
  tuning = dict(loss_fn=local.make_loss_fn(model, has_state), train_x=x, train_y=y,
                train_parts=parts, finetune_steps=0)
  evaluators = {
      "per_client": personal_eval.PersonalEvaluator(eval_fn, mesh, **common),
      # Without serve or fine-tuning the personal path evaluates the global model itself,
      # vmapped over padded parts: the computation per-client evaluation ran before.
      "one_width": personal_eval.PersonalEvaluator(eval_fn, mesh, max_padding=math.inf,
                                                   **common),
      "personal_one_width": personal_eval.PersonalEvaluator(
          eval_fn, mesh, max_padding=math.inf, **common, **tuning),
      "personal_by_size": personal_eval.PersonalEvaluator(eval_fn, mesh, **common, **tuning),
  }
  arms = {"pooled": _timed(lambda: evaluate.evaluate(eval_fn, params, state, x, y,
                                                     eval_batch_size).loss),
          "per_client": _timed(lambda: evaluators["per_client"].global_sums(
              params, state).loss_sum)}
  for name in ("one_width", "personal_one_width", "personal_by_size"):
    arms[name] = _timed(functools.partial(
        lambda e: e.personal_sums(params, state, None, 0, None).loss_sum, evaluators[name]))
  times = round_timing.interleave(arms, repeats)
  evaluated = {name: sum(len(ids) * w for ids, _, w in evaluators[name].layout)
               for name in ("one_width", "personal_one_width", "personal_by_size")}
  out = {"machine": round_timing.machine(), "model": model_name, "options": options,
         "num_parameters": int(sum(a.size for a in jax.tree.leaves(params))),
         "roles": roles, "windows": int(sizes.sum()), "largest_part": largest,
         "smallest_part": int(sizes.min()), "eval_batch_size": eval_batch_size,
         "windows_evaluated": {"pooled": int(sizes.sum()), "per_client": int(sizes.sum()),
                               **evaluated},
         "seconds": {k: statistics.median(v) for k, v in times.items() if k in arms},
         "first_call_s": times["first_call_s"],
         "ratio_to_pooled": {k: round_timing.ratio(times, k, "pooled")["paired_median"]
                             for k in arms if k != "pooled"}}
  return out


def report(out: dict) -> None:
  print(round_timing.machine_line(out["machine"]))
  print(f"{out['model']} {out['options']} ({out['num_parameters']:,} parameters); "
        f"{out['roles']} roles, {out['windows']:,} test windows of {WINDOW} characters "
        f"(parts of {out['smallest_part']} to {out['largest_part']}); eval_batch_size "
        f"{out['eval_batch_size']}")
  for arm, seconds in out["seconds"].items():
    ratio = out["ratio_to_pooled"].get(arm)
    tail = "" if ratio is None else f"  {ratio:.2f}x the pooled evaluation"
    print(f"  {arm:<17} {seconds:8.2f} s  ({out['windows_evaluated'][arm]:,} windows "
          f"evaluated){tail}")
  print(json.dumps({"text_eval_speed": out}))


def main(argv):
  del argv
  options = json.loads(FLAGS.model_options) if FLAGS.model_options else {}
  if FLAGS.quick:
    report(run(20, 1000, FLAGS.model, options, FLAGS.eval_batch_size, 1))
  else:
    report(run(FLAGS.roles, FLAGS.test_windows, FLAGS.model, options, FLAGS.eval_batch_size,
               FLAGS.repeats))


if __name__ == "__main__":
  define_flags()
  app.run(main)
