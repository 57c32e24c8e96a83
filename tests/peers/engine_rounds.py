"""For the FedJAX peer tests: our engine's synchronous rounds on a peer test's batches
(engine/sync_round.py; the same batches, in the same order, as the peer trains on), and the
distance the tests compare the two sides by."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_lama.engine import cohort as cohort_lib, local as local_lib, sync_round


def largest(a, b) -> float:
  """max |a - b| over two pytrees of the same structure (dicts with int keys included)."""
  leaves_a, tree_a = jax.tree.flatten(a)
  leaves_b, tree_b = jax.tree.flatten(b)
  assert tree_a == tree_b, (tree_a, tree_b)
  return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
             for x, y in zip(leaves_a, leaves_b))


def rounds(alg, model, batches, cohorts, server, lr: float, steps=None, trainable=None,
           frozen=None):
  """Yields (cohort ids, server, rows of every client) after each round.

  batches[i]: client i's list of (x, y) batches, all of one size; client i's step k trains on
  its batch k mod len(batches[i]), for steps[i] steps (default: one pass); its weight is its
  number of examples. Client SGD at `lr`; rows start at alg.row_init(server.params) (none
  without it: FedAvg). trainable: a LoRA run's trainable set (models/lora.py `TrainableSet`),
  the server's params being its trainable part and `frozen` the rest. Runs in the caller's
  precision (the peer tests enable float64).
  """
  per_client = tuple(len(b) for b in batches)
  steps = per_client if steps is None else tuple(steps)
  batch = int(np.shape(batches[0][0][0])[0])
  max_steps, n = max(steps), len(batches)
  merge = trainable.merge if trainable is not None else None
  train_chunk, server_update = sync_round.make_round_fns(
      local_lib.make_loss_fn(model, False, merge=merge), alg, optax.constant_schedule(lr),
      seed=0, weighting="examples", local_steps=max_steps, population=n)
  flat = [b for client in batches for b in client]
  data_x = jnp.asarray(np.concatenate([x for x, _ in flat]))
  data_y = jnp.asarray(np.concatenate([y for _, y in flat]), jnp.int32)
  first_row = np.cumsum((0,) + per_client)[:-1] * batch
  store = ({} if alg.row_init is None else
           jax.tree.map(lambda r: jnp.stack([r] * n), alg.row_init(server.params)))
  for r, cohort_ids in enumerate(cohorts):
    c = len(cohort_ids)
    indices = np.zeros((c, max_steps, batch), np.int32)
    step_mask = np.zeros((c, max_steps))
    for j, i in enumerate(cohort_ids):
      for k in range(steps[i]):
        indices[j, k] = first_row[i] + (k % per_client[i]) * batch + np.arange(batch)
        step_mask[j, k] = 1.0
    ids = jnp.asarray(cohort_ids, jnp.int32)
    sizes = np.array([per_client[i] * batch for i in cohort_ids], np.float64)
    cohort = cohort_lib.Cohort(jnp.asarray(indices), jnp.ones(indices.shape),
                               jnp.asarray(step_mask), jnp.ones(c), ids, jnp.asarray(sizes))
    rows = cohort_lib.gather_rows(store, ids) if store else {}
    sums, new_rows, _ = train_chunk(server, rows, data_x, data_y, cohort, r, frozen=frozen)
    if store:
      store = cohort_lib.scatter_rows(store, ids, jnp.ones(c), new_rows)
    server = server_update(server, sums)
    yield cohort_ids, server, store
