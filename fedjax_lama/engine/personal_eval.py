"""Per-client evaluation: every client's model on its own held-out test part, vectorized.

Each client i holds a test part (indices into the test or training arrays, disjoint from
its training part: federation.build_federation).

The global model x is the same for every client, so its per-client metrics come from one
pooled evaluation of the test parts laid back to back, in the batches of the pooled test
evaluation (`evaluate.evaluate_parts`), each client's examples then summed: the cost is
that of evaluating the examples once, however unequal the parts (a play's roles range
from a few windows to thousands).

Each client's own model is evaluated in chunks of C clients, each chunk one jitted,
vmapped computation of fixed shape, so the host makes O(1) dispatches per chunk and device
memory is flat in the number of clients (it grows with C, never with N):

    for each client i of the chunk (vmapped):
      w_i, s_i   = algorithm.serve(server, row_i, loss_at)            (or x, model_state)
                   (loss_at: a model's mean loss over client i's training part, computed
                   only for a serve that reads it, HypCluster's choice)
      w_i, s_i   = k steps of local SGD from w_i on client i's training part (fine-tuning;
                   the layers it leaves alone, if any, stay as served: `finetune_frozen`)
      personal_i = metrics of w_i on client i's test part

Test parts are packed once as [N, T] index and mask arrays (T: the largest test part); a
chunk reads the first W columns, W at least the largest part of its clients. When one
W = T for every chunk would pad the examples by more than MAX_PADDING, clients are grouped
by the size of their part into at most MAX_WIDTHS widths (`chunk_layout`). Client rows are gathered from the run's ClientStore
(device or host) chunk by chunk, like the training rounds gather their cohort's rows.
Fine-tuning reuses the engine's local step (`local.make_client_train` with plain SGD at a
constant rate) and its batching (`data.pack_cohort` on a stream of its own, so its
batches are a pure function of (seed, round, client) and never those of training). With
k = 0 the scan has no step: the personal model is the personalized (or global) model
itself, bit for bit.

Metrics per client are sums: the summed loss, the correct examples (tokens for next-token
targets), and the scored examples (tokens), from which `summarize` takes the across-client
statistics. Both paths sum a client's per-example outcomes on the host in the same way
(`evaluate.segment_sums`).
"""
import itertools
import math
from typing import Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lama import data as fdata
from fedjax_lama.data import seeding
from fedjax_lama.engine import evaluate, local, sharding
from fedjax_lama.engine.algorithm import Algorithm, ClientContext, LocalState, freeze


class ClientSums(NamedTuple):
  """Per-client evaluation sums, float64 numpy [N]."""
  loss_sum: np.ndarray
  correct: np.ndarray
  count: np.ndarray   # scored examples (or tokens); 0 for a client without test data

  @property
  def accuracy(self) -> np.ndarray:
    """Per-client accuracy; nan for a client with nothing scored."""
    with np.errstate(invalid="ignore", divide="ignore"):
      return np.where(self.count > 0, self.correct / np.maximum(self.count, 1.0), np.nan)


def pack_parts(parts) -> tuple[np.ndarray, np.ndarray]:
  """Index and mask arrays [N, T] of per-client index lists (T: the longest, at least 1)."""
  width = max([1] + [len(p) for p in parts])
  indices = np.zeros((len(parts), width), np.int32)
  mask = np.zeros((len(parts), width), np.float32)
  for i, p in enumerate(parts):
    indices[i, :len(p)] = p
    mask[i, :len(p)] = 1.0
  return indices, mask


def _replicated(array, mesh, dtype=None):
  """`array` on every device of the mesh; a device array already there (the program's
  training arrays) is used as it is, without a second copy."""
  if isinstance(array, jax.Array) and (dtype is None or array.dtype == dtype):
    return sharding.replicate(array, mesh)
  return sharding.replicate(np.asarray(array, dtype), mesh)


def _example_outcomes(eval_fn, params, model_state, data_x, data_y, indices, mask):
  """(loss, correct, scored) float32 [T] per example of one client's part: its summed loss,
  its correct and its scored examples (tokens for next-token targets); 0 where mask is 0."""
  loss, correct = eval_fn(params, model_state, data_x[indices], data_y[indices], mask)
  if correct.ndim == 1:  # one label per example; padded rows are masked here
    return loss, correct * mask, mask
  # per-token outcomes: 1 correct, 0 wrong, -1 not scored (the eval_fn masked the padding)
  return (loss, jnp.sum(correct == 1, axis=1).astype(jnp.float32),
          jnp.sum(correct >= 0, axis=1).astype(jnp.float32))


# The personal chunks pad every client's test part to its chunk's width. One width (the
# largest part) while that evaluates at most MAX_PADDING times the real examples; otherwise
# up to MAX_WIDTHS widths, each one more compiled shape (`chunk_layout`).
MAX_PADDING = 1.5
MAX_WIDTHS = 4


def chunk_layout(sizes: Sequence[int], clients_per_chunk: int, examples_per_chunk: int,
                 devices: int = 1, max_padding: float = MAX_PADDING,
                 max_widths: int = MAX_WIDTHS) -> list[tuple[np.ndarray, int, int]]:
  """The personal models' chunks: [(client ids, real clients, width)], each chunk's ids
  padded (to the chunk size of its width, a multiple of `devices`) by repeating its first
  client, masked out of the results.

  Clients without test examples are in no chunk (they have nothing to evaluate). With one
  width, the largest part, chunks hold `clients_per_chunk` clients in id order. When that
  would pad the examples by more than `max_padding` (a play's roles: a few thousand windows
  against a few), each client goes to the smallest of a few widths that holds its part
  (powers of two, and the largest part; one compiled shape each): the fewest widths, up to
  `max_widths`, that pad by at most `max_padding`, else the set that pads least. The chunks
  of width W hold about `examples_per_chunk` / W clients.
  """
  sizes = np.asarray(sizes, np.int64)
  ids = np.flatnonzero(sizes > 0)
  if ids.size == 0:
    return []
  sizes = sizes[ids]
  top = int(sizes.max())
  pad = lambda n: -(-n // devices) * devices

  def chunks(widths):  # [(members, clients per chunk, width)] of an assignment
    if np.all(widths == top):
      return [(ids, pad(max(1, clients_per_chunk)), top)]
    return [(ids[widths == w], min(pad(max(1, examples_per_chunk // int(w))),
                                   pad(int(np.sum(widths == w)))), int(w))
            for w in np.unique(widths)]

  def evaluated(plan):
    return sum(-(-members.size // per) * per * w for members, per, w in plan)

  best = chunks(np.full(sizes.size, top))
  candidates = sorted({int(min(top, 2 ** math.ceil(math.log2(s)))) for s in sizes} - {top})
  for count in range(2, max_widths + 1):
    if evaluated(best) <= max_padding * sizes.sum():
      break
    for chosen in itertools.combinations(candidates, count - 1):
      widths = np.array(chosen + (top,))
      plan = chunks(widths[np.searchsorted(widths, sizes)])
      if evaluated(plan) < evaluated(best):
        best = plan
  layout = []
  for members, per, width in best:
    for start in range(0, members.size, per):
      group = members[start:start + per]
      layout.append((np.concatenate([group, np.full(per - group.size, group[0])]),
                     group.size, width))
  return layout


class PersonalEvaluator:
  """Evaluates the global and (optionally) each client's personal model on the clients' test
  parts; see the module docstring.

  The global model is one model for every client: its per-client sums come from one pooled
  evaluation of the test parts back to back (`evaluate.evaluate_parts`, batches of
  `eval_batch_size` examples), whose cost does not depend on how unequal the parts are.
  The personal models are evaluated in vmapped chunks (`chunk_layout`).

  Args:
    eval_fn: (params, model_state, x, y, mask) -> (per-example loss, correct) of one batch
      (engine/evaluate.make_eval_fn).
    mesh: the run's mesh (chunks are split over its "clients" axis).
    test_x, test_y: the arrays the test parts index.
    test_parts: per client, its test indices (into test_x, test_y).
    clients_per_chunk: C, rounded up to a multiple of the device count.
    serve: Algorithm.serve (server, row, loss_at) -> (params, model_state), or None (every
      client is served the global model).
    train_x, train_y, train_parts: the clients' training parts: serve's loss_at (the mean
      loss over the client's whole training part) and fine-tuning's batches read them.
    loss_fn, finetune_steps, finetune_lr, batch_size, seed: local fine-tuning (with loss_fn):
      k steps of plain SGD at finetune_lr with batches of batch_size drawn from each client's
      training part.
    eval_batch_size: examples per evaluation call (the global model's batches, the personal
      chunks laid out by size); default C times the largest test part.
    max_padding, max_widths: `chunk_layout`'s bound on the personal chunks' padding (inf:
      one width) and on the widths it may use.
    finetune_frozen: params -> a params-shaped tree of Python bools, True on the leaves
      fine-tuning leaves alone (engine.algorithm.freeze; the head-only fine-tuning of
      FedBABU freezes the body); None: fine-tuning moves every leaf.
    trainable: the run's trainable set (models/lora.py `TrainableSet`; None: every
      parameter trains). The model's parameters given to the evaluator are then split
      once: the algorithm's serve, its rows, loss_fn and fine-tuning work on the trainable
      set, and each personal model is evaluated merged with the frozen rest, which every
      client of a chunk reads from one broadcast copy.
  """

  def __init__(self, eval_fn, mesh, *, test_x, test_y, test_parts, clients_per_chunk: int,
               serve: Optional[Callable] = None, loss_fn: Optional[Callable] = None,
               train_x=None, train_y=None, train_parts=None, finetune_steps: int = 0,
               finetune_lr: float = 0.0, batch_size: int = 1, seed: int = 0,
               unroll: int = 1, eval_batch_size: Optional[int] = None,
               max_padding: float = MAX_PADDING, max_widths: int = MAX_WIDTHS,
               finetune_frozen: Optional[Callable] = None, trainable=None):
    if finetune_steps < 0:
      raise ValueError(f"finetune_steps={finetune_steps!r}; accepted: an integer >= 0")
    if finetune_steps and (loss_fn is None or train_parts is None):
      raise ValueError("fine-tuning needs the loss function and the clients' training parts")
    self.eval_fn, self.mesh, self.num_clients = eval_fn, mesh, len(test_parts)
    self.test_parts = [np.asarray(p, np.int64) for p in test_parts]
    self.chunk = sharding.padded_size(max(1, int(clients_per_chunk)), mesh)
    self.indices, self.mask = pack_parts(test_parts)
    width = self.indices.shape[1]
    self.eval_batch_size = int(eval_batch_size or self.chunk * width)
    self.layout = chunk_layout([len(p) for p in self.test_parts], self.chunk,
                               self.eval_batch_size, mesh.size, max_padding, max_widths)
    self._raw_test = (test_x, test_y)
    self._host_test = None     # the test arrays on the host (the global model's batches)
    self._device_test = None   # ... and on the mesh (the personal chunks), when first read
    self.serve, self.finetune_steps = serve, int(finetune_steps)
    self.train_parts, self.batch_size, self.seed = train_parts, int(batch_size), int(seed)
    self._raw_train = (train_x, train_y)
    self._train_arrays = None   # the training arrays on the mesh, when something reads them
    self._train_packed = None   # [N, T] index and mask arrays of the training parts
    self._serve_reads_loss = None  # whether serve calls loss_at (probed on the first call)
    # Fine-tuning is configured when its loss and data are given; k = 0 then runs the same
    # code over an empty step axis (the model comes back as it went in).
    self.finetunes = loss_fn is not None and train_parts is not None
    # Plain SGD at a constant rate; the frozen leaves (if any) never move.
    tuner = Algorithm() if finetune_frozen is None else Algorithm(
        local=freeze(Algorithm().local, finetune_frozen))
    if self.finetunes:
      rate = float(finetune_lr)
      client_train = local.make_client_train(loss_fn, tuner, lambda step: rate, unroll=unroll)
    else:
      client_train = None
    self.has_personal_model = serve is not None or self.finetune_steps > 0
    self.trainable = trainable
    whole = (lambda p, frozen: p) if trainable is None else trainable.merge

    def one_client(params, frozen, model_state, server, row, test_x, test_y, indices, mask,
                   train_x, train_y, batch, num_examples, client_id, own_indices, own_mask):
      if serve is None:
        own, own_state = params, model_state
      else:
        def loss_at(candidate):
          # The mean loss over the client's training part (traced only if serve asks).
          loss, _, count = _example_outcomes(eval_fn, whole(candidate, frozen),
                                             server.model_state, train_x, train_y,
                                             own_indices, own_mask)
          return jnp.sum(loss) / jnp.maximum(jnp.sum(count), 1.0)
        own, own_state = serve(server, row, loss_at)
      if client_train is not None:
        ctx = ClientContext({"params": own}, row, num_examples, client_id)
        final, _ = client_train(LocalState(own, own_state, tuner.local.init_state(ctx)), ctx,
                                train_x, train_y, batch, 0, frozen=frozen)
        own, own_state = final.params, final.model_state
      return _example_outcomes(eval_fn, whole(own, frozen), own_state, test_x, test_y,
                               indices, mask)

    def chunk_fn(params, frozen, model_state, server, rows, test_x, test_y, indices, mask,
                 train_x, train_y, batch, num_examples, client_ids, own_indices, own_mask):
      per_client = lambda *a: one_client(params, frozen, model_state, server, *a)
      return jax.vmap(per_client, in_axes=(0, None, None, 0, 0, None, None, 0, 0, 0, 0, 0))(
          rows, test_x, test_y, indices, mask, train_x, train_y, batch, num_examples,
          client_ids, own_indices, own_mask)

    self._chunk = jax.jit(chunk_fn)

  def _test_on_host(self):
    if self._host_test is None:
      test_x, test_y = self._raw_test
      self._host_test = (np.asarray(test_x), np.asarray(test_y, np.int32))
    return self._host_test

  def _test_on_mesh(self):
    if self._device_test is None:
      test_x, test_y = self._raw_test
      self._device_test = (_replicated(test_x, self.mesh),
                           _replicated(test_y, self.mesh, np.int32))
    return self._device_test

  def _train_data(self):
    """The training arrays on the mesh (copied once, when first read)."""
    if self._train_arrays is None:
      train_x, train_y = self._raw_train
      self._train_arrays = (_replicated(train_x, self.mesh),
                            _replicated(train_y, self.mesh, np.int32))
    return self._train_arrays

  def _reads_loss(self, server, rows) -> bool:
    """Whether `serve` calls its loss_at (HypCluster's choice): traced once for shapes."""
    if self._serve_reads_loss is None:
      calls = []

      def probe(params):
        del params
        calls.append(True)
        return jnp.zeros((), jnp.float32)

      row = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), rows)
      jax.eval_shape(lambda s, r: self.serve(s, r, probe), server, row)
      if calls and self.train_parts is None:
        raise ValueError("this algorithm's serve reads the clients' training loss: pass "
                         "train_x, train_y and train_parts")
      self._serve_reads_loss = bool(calls)
    return self._serve_reads_loss

  def _finetune_batches(self, ids: np.ndarray, real: int, round_idx: int):
    """The chunk's fine-tuning batches (local.ClientBatch [C, k, B]) and example counts."""
    if not self.finetunes:
      return None, np.zeros(len(ids), np.float32)
    parts = [self.train_parts[i] for i in ids[:real]]
    packed = fdata.pack_cohort(parts, list(ids[:real]), batch_size=self.batch_size,
                               num_steps=self.finetune_steps, seed=self.seed,
                               round_idx=round_idx, pad_clients_to=len(ids),
                               pad_steps_to=self.finetune_steps,
                               stream=seeding.FINETUNE_STREAM)
    base = jax.random.fold_in(jax.random.PRNGKey(self.seed), seeding.FINETUNE_STREAM)
    keys = jax.vmap(lambda c: jax.random.fold_in(jax.random.fold_in(base, round_idx), c))(
        jnp.asarray(ids, jnp.uint32))
    batch = local.ClientBatch(packed.indices.astype(np.int32),
                              packed.example_mask.astype(np.float32),
                              packed.step_mask.astype(np.float32), keys)
    return batch, packed.num_examples.astype(np.float32)

  def global_sums(self, params, model_state) -> ClientSums:
    """The global model's sums on every client's test part: one pooled evaluation of the
    parts back to back (`evaluate.evaluate_parts`)."""
    test_x, test_y = self._test_on_host()
    return ClientSums(*evaluate.evaluate_parts(self.eval_fn, params, model_state, test_x,
                                               test_y, self.test_parts, self.eval_batch_size))

  def personal_sums(self, params, model_state, store, round_idx: int, server) -> ClientSums:
    """Each client's own model's sums on its test part, chunk by chunk (`chunk_layout`)."""
    serves = self.serve is not None
    if serves and server is None:
      raise ValueError("this evaluator serves each client its own model: pass the server state")
    test_x, test_y = self._test_on_mesh()
    # The trainable set (what serve and fine-tuning move) and the frozen rest.
    own_params, frozen = (self.trainable.split(params) if self.trainable is not None
                          else (params, {}))
    sums = [np.zeros(self.num_clients) for _ in ClientSums._fields]
    for ids, real, width in self.layout:
      indices, mask = self.indices[ids, :width], self.mask[ids, :width]
      mask[real:] = 0.0  # padded slots evaluate their chunk's first client, masked out
      batch, num_examples = self._finetune_batches(ids, real, round_idx)
      rows = store.gather(ids.astype(np.int32)) if store is not None else {}
      if serves and self._reads_loss(server, rows):
        if self._train_packed is None:
          self._train_packed = pack_parts(self.train_parts)
        own_indices, own_mask = (a[ids] for a in self._train_packed)
      else:  # nothing reads the training parts: one padded example each, never used
        own_indices, own_mask = np.zeros((len(ids), 1), np.int32), np.zeros((len(ids), 1))
      mapped = sharding.shard_clients(
          (indices.astype(np.int32), mask.astype(np.float32), batch, num_examples,
           ids.astype(np.int32), own_indices.astype(np.int32), own_mask.astype(np.float32)),
          self.mesh)
      reads_train = self.finetunes or (serves and self._serve_reads_loss)
      train_x, train_y = self._train_data() if reads_train else (None, None)
      outcomes = jax.device_get(self._chunk(
          own_params, frozen, model_state, server if serves else None, rows, test_x, test_y,
          *mapped[:2], train_x, train_y, *mapped[2:]))
      # Each client's examples in order, summed as evaluate_parts sums them.
      sizes = self.mask[ids[:real]].sum(axis=1).astype(np.int64)
      first = np.arange(width)[None, :] < sizes[:, None]
      for total, per_example in zip(sums, outcomes):
        total[ids[:real]] = evaluate.segment_sums(np.asarray(per_example)[:real][first], sizes)
    return ClientSums(*sums)

  def __call__(self, params, model_state, store=None, round_idx: int = 0,
               personal: Optional[bool] = None, server=None) -> dict:
    """{"global": ClientSums, "personal": ClientSums (when personal)} over all N clients.

    store: the run's ClientStore of the algorithm's rows (None: no rows; serve then gets
      {}). personal: evaluate the personal models too (default: when there is one, a serve
      hook or fine-tuning). server: the run's ServerState, which serve reads (needed with
      serve).
    """
    personal = self.has_personal_model if personal is None else bool(personal)
    if personal and self.serve is not None and server is None:
      raise ValueError("this evaluator serves each client its own model: pass the server state")
    result = {"global": self.global_sums(params, model_state)}
    if personal:
      result["personal"] = self.personal_sums(params, model_state, store, round_idx, server)
    return result


# ---- across-client statistics -------------------------------------------------------------
STATISTICS = ("mean", "std", "p10", "worst", "weighted_mean", "weighted_std", "weighted_p10")
MODELS = ("global", "personal")


def metric_name(model: str, statistic: str) -> str:
  """The record's name of one statistic: client_test_accuracy/{global,personal}/{statistic}.

  "global" is the evaluated global model on every client's test part; "personal" each
  client's own model (Algorithm.serve, then fine-tuning), present only when the run
  has one. `statistic` is one of STATISTICS (see `summarize`).
  """
  if model not in MODELS or statistic not in STATISTICS:
    raise ValueError(f"metric_name({model!r}, {statistic!r}); accepted: a model of {MODELS} "
                     f"and a statistic of {STATISTICS}")
  return f"client_test_accuracy/{model}/{statistic}"


def _weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
  """The smallest value whose cumulative weight reaches q of the total (lower quantile)."""
  order = np.argsort(values, kind="stable")
  cumulative = np.cumsum(weights[order])
  return float(values[order][np.searchsorted(cumulative, q * cumulative[-1])])


def summarize(sums: ClientSums) -> dict:
  """Across-client statistics of the per-client accuracy, over clients with test data.

  Unweighted (each client counts once): mean, std (population), p10 (the 10th percentile,
  linear interpolation), worst (the lowest). Example-weighted (each client counts by its
  scored test examples, tokens for next-token targets): weighted_mean (the accuracy of the
  pooled test parts), weighted_std, weighted_p10 (the lowest accuracy whose clients and
  those below it hold at least 10% of the test examples). nan when no client has any.
  """
  has = sums.count > 0
  if not np.any(has):
    return {name: float("nan") for name in STATISTICS}
  acc, weight = sums.accuracy[has], sums.count[has]
  weighted_mean = float(np.sum(sums.correct[has]) / np.sum(weight))
  return {
      "mean": float(acc.mean()), "std": float(acc.std()),
      "p10": float(np.percentile(acc, 10)), "worst": float(acc.min()),
      "weighted_mean": weighted_mean,
      "weighted_std": float(np.sqrt(np.sum(weight * (acc - weighted_mean) ** 2) /
                                    np.sum(weight))),
      "weighted_p10": _weighted_quantile(acc, weight, 0.1),
  }
