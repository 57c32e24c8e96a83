"""Host-side federation: dataset, client partition, cohort sampling.

Pure numpy; the engine only sees packed index arrays (docs/design.md, "The engine"). Takes
typed arguments: the training entry point reads the config.
"""
import dataclasses
from typing import Optional

import numpy as np

from fedjax_lama import data as fdata
from fedjax_lama.errors import ConfigError


@dataclasses.dataclass
class Federation:
  dataset: "fdata.Dataset"
  client_train: list  # list of int64 index arrays into dataset.train_*
  client_test: Optional[list]  # per-client held-out indices or None
  client_test_in: str = "train"  # which arrays client_test indexes: "train" or "test"
  validation: Optional["fdata.Validation"] = None  # held out of training, for tuning

  @property
  def num_clients(self) -> int:
    return len(self.client_train)

  @property
  def client_sizes(self) -> np.ndarray:
    return np.array([len(ix) for ix in self.client_train], np.float32)


def resolve_data_dir(data_dir: str) -> str:
  return fdata.resolve_data_dir(data_dir)


LOCAL_SPLITS = ("random", "stratified")  # PartitionSpec.local_split


@dataclasses.dataclass(frozen=True)
class PartitionSpec:
  """How the training set is split into clients (the config.partition family of fields)."""
  name: str
  num_clients: int
  seed: int
  dirichlet_concentration: float = 0.5
  min_client_size: int = 10
  classes_per_client: int = 2
  femnist_num_writers: int = 256
  femnist_writers_per_client: int = 2
  local_test_fraction: float = 0.0
  # How the local test parts are drawn: "random" (FedAT's split, the simulated clock's) or
  # "stratified" by label (synchronous runs; the natural partition then keeps the
  # dataset's own per-client test data where it has it). See `build_federation`.
  local_split: str = "random"
  dataset_name: str = ""  # for error messages


def build_federation(spec: PartitionSpec, dataset) -> Federation:
  """Partitions the training set into spec.num_clients clients (a pure function of the seed).

  With spec.local_test_fraction > 0 every client also gets a held-out test part, disjoint
  from its training part (training never reads it). spec.local_split="random" draws it as
  FedAT does; "stratified" draws it per label (labels of one class per example; sequence
  targets fall back to the random draw), and a natural partition on a dataset with
  per-client test data (test_client_ids) takes each client's own test examples instead of
  carving them out of its training data.
  """
  labels = dataset.train_y
  name = spec.name
  seed = spec.seed
  if name == "natural":
    if dataset.train_client_ids is None:
      raise ConfigError(f"config.partition='natural' needs a dataset with client ids "
                        f"(femnist); {spec.dataset_name!r} has none")
    clients = fdata.natural(dataset.train_client_ids)
  elif name == "femnist_writers":
    if dataset.train_client_ids is None:
      raise ConfigError("config.partition='femnist_writers' needs dataset='femnist'")
    writers = fdata.femnist_clients(
        dataset.train_client_ids, num_writers=spec.femnist_num_writers,
        writers_per_client=spec.femnist_writers_per_client, seed=seed,
        test_client_ids=dataset.test_client_ids)
    # As in Lee et al., AAAI 2023: the test set is the held-out data of the selected writers.
    test_rows = np.sort(np.concatenate(writers.test)) if writers.test is not None else None
    if test_rows is not None:
      position = np.full(len(dataset.test_y), -1, np.int64)
      position[test_rows] = np.arange(len(test_rows))
      dataset = dataclasses.replace(dataset, test_x=dataset.test_x[test_rows],
                                    test_y=dataset.test_y[test_rows],
                                    test_client_ids=dataset.test_client_ids[test_rows])
      client_test = [position[t] for t in writers.test]
      return Federation(dataset, [np.asarray(c, np.int64) for c in writers.train], client_test,
                        "test")
    clients = writers.train
  elif name == "iid":
    clients = fdata.iid(len(labels), spec.num_clients, seed)
  elif name == "dirichlet":
    clients = fdata.dirichlet_fedml(labels, spec.num_clients, spec.dirichlet_concentration, seed,
                                    min_client_size=spec.min_client_size)
  elif name == "dirichlet_balanced":
    clients = fdata.dirichlet_balanced(labels, spec.num_clients, spec.dirichlet_concentration,
                                       seed)
  elif name == "shards":
    clients = fdata.shards(labels, spec.num_clients, spec.classes_per_client, seed)
  elif name == "class_cyclic":
    clients = fdata.class_cyclic(labels, spec.num_clients, spec.classes_per_client, seed)
  elif name == "one_class":
    clients = fdata.one_class(labels, spec.num_clients, seed)
  else:  # validate() already rejects unknown names
    raise ConfigError(f"config.partition={name!r}")
  clients = [np.asarray(c, np.int64) for c in clients]
  client_test = None
  if spec.local_split not in LOCAL_SPLITS:
    raise ValueError(f"PartitionSpec.local_split={spec.local_split!r}; accepted: "
                     f"{', '.join(map(repr, LOCAL_SPLITS))}")
  if spec.local_test_fraction > 0:
    stratified = spec.local_split == "stratified"
    if stratified and name == "natural" and dataset.test_client_ids is not None:
      own = fdata.natural_test_parts(dataset.train_client_ids, dataset.test_client_ids)
      return Federation(dataset, clients, own, "test")
    by_label = labels if stratified and np.ndim(labels) == 1 else None
    clients, client_test = fdata.local_split(clients, spec.local_test_fraction, seed,
                                             labels=by_label)
  return Federation(dataset, clients, client_test)


@dataclasses.dataclass(frozen=True)
class Sampler:
  """Which clients take part in round r: a pure function of (seed, r)."""
  kind: str            # "fixed": m = round(active_ratio * N) without replacement; "bernoulli"
  active_ratio: float
  num_clients: int
  seed: int

  @property
  def cohort_size(self) -> int:
    """Clients per round of fixed sampling (at least 1)."""
    return max(1, int(round(self.active_ratio * self.num_clients)))

  def sample(self, round_idx: int) -> np.ndarray:
    if self.kind == "bernoulli":
      return np.asarray(fdata.sample_bernoulli(self.num_clients, self.active_ratio, self.seed,
                                               round_idx))
    return np.asarray(fdata.sample_clients(self.num_clients, self.cohort_size, self.seed,
                                           round_idx))

  @property
  def max_cohort(self) -> int:
    """Static client-axis size of a round (one compiled shape for the whole run).

    Bernoulli cohorts vary; they are padded to a high quantile of the binomial and
    the rare larger draw runs as extra chunks.
    """
    if self.kind == "fixed":
      return self.cohort_size
    p = self.active_ratio
    mean, std = self.num_clients * p, np.sqrt(self.num_clients * p * (1 - p))
    return int(min(self.num_clients, max(1, np.ceil(mean + 4 * std))))
