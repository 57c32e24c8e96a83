"""What the simulator needs from outside: trainer, evaluator, codec, model algebra.

The asynchronous/tiered simulation of FedAT and its baselines (Chai et al.,
SC'21) runs on the host in
numpy and plain Python. Everything numeric about models is injected through the
four protocols below, so that the JAX engine can be plugged in without the
simulator importing it (and tests can use small deterministic fakes):

- `Trainer.train(jobs)`: local training of a batch of jobs (one vectorised call
  of the engine). The simulator calls it with at most `max_clients_per_call`
  jobs, in dispatch order (deferred training: several
  jobs share one vectorised call).
- `Evaluator.evaluate(model)`: correct predictions and test-set sizes of all K
  clients (Chai et al., SC'21, metrics).
- `Codec.roundtrip(tree, precision)`: what the receiver of a message gets and
  how many bytes the message took (Chai et al., SC'21, Sec. 4.3).
- `ModelAlgebra.weighted_sum(trees, weights)`: every server-side aggregation.

Models are opaque pytrees to the simulator: it never looks inside one except
through these protocols, and it treats them as immutable values (a model handed
to the simulator must not be modified in place afterwards, and vice versa).
"""
from typing import Any, NamedTuple, Optional, Protocol, Sequence, runtime_checkable

import numpy as np

PyTree = Any


class TrainJob(NamedTuple):
  """One local round of one client, as given to a Trainer.

  Attributes:
    client_id: k, in 0..K-1.
    index: the participation index j of this job (jobs client k was dispatched
      before this one, in this run). The trainer derives the job's minibatch
      order from (k, j, epoch) with stream BATCH.
    start_model: the model the client starts from (already decoded if the
      download was compressed).
    anchor: the centre of the proximal term (the same decoded model as
      `start_model` for every method of this package).
    num_epochs: E for this job (FedProx draws it per job).
    prox_coeff: lambda / mu / rho of the proximal term (lambda/2 ||v - anchor||^2);
      0.0 means plain F_k.
  """
  client_id: int
  index: int
  start_model: PyTree
  anchor: PyTree
  num_epochs: int
  prox_coeff: float


class TrainResult(NamedTuple):
  """The outcome of one TrainJob.

  Attributes:
    model: the trained client model v_k (before upload compression).
    num_steps: the number of valid (unmasked) local steps the job ran. The
      simulator computes compute times from n_k, the batch size and the epochs
      before training, so the timeline never depends on training; this count
      is only checked against that number (E * ceil(n_k / B)).
  """
  model: PyTree
  num_steps: int


@runtime_checkable
class Trainer(Protocol):
  """Runs local training for a batch of jobs.

  `train` receives at most `max_clients_per_call` jobs in dispatch order and
  returns one TrainResult per job, in the same order. A job's result must depend
  only on the job (its fields and the run's seed), never on which other jobs
  share the call: that is what makes deferred training exact.
  """

  def train(self, jobs: Sequence[TrainJob]) -> Sequence[TrainResult]:
    ...


@runtime_checkable
class Evaluator(Protocol):
  """Evaluates a model on every client's local test set (Chai et al., SC'21, metrics).

  Returns:
    (correct, count): two integer arrays of length K (all clients, departed ones
    included): correct predictions and test examples of each client.
  """

  def evaluate(self, model: PyTree) -> tuple[np.ndarray, np.ndarray]:
    ...


@runtime_checkable
class Codec(Protocol):
  """Encodes and decodes one message.

  `roundtrip(tree, precision)` returns (decoded_tree, num_bytes): the tree the
  receiver reconstructs and the size of the message in bytes. `precision=None`
  means raw float32: the tree is returned unchanged and the size is 4 bytes per
  parameter, with no metadata (the architecture is known to both sides). An int
  precision is the polyline precision (FedAT uses 4); the size counts the
  encoded characters plus the per-leaf shape metadata.
  """

  def roundtrip(self, tree: PyTree, precision: Optional[int]) -> tuple[PyTree, int]:
    ...


@runtime_checkable
class ModelAlgebra(Protocol):
  """The one model operation the server needs.

  `weighted_sum(trees, weights)` returns sum_i weights[i] * trees[i] leaf by leaf,
  with float64 weights. Implementations should keep the leaves' dtype, and
  should return the single tree unchanged (bit for bit) when given one tree
  with weight exactly 1.0 (FedAT with one tier equals FedAvg).
  """

  def weighted_sum(self, trees: Sequence[PyTree], weights: Sequence[float]) -> PyTree:
    ...
