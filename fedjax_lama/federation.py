"""Host-side federation: dataset, client partition, cohort sampling and packing.

Pure numpy; the engine only sees packed index arrays (architecture.md 2.1).
"""
import dataclasses
import os
from typing import Optional

import numpy as np

from fedjax_lama import data as fdata
from fedjax_lama.config import ConfigError


@dataclasses.dataclass
class Federation:
  dataset: "fdata.Dataset"
  client_train: list  # list of int64 index arrays into dataset.train_*
  client_test: Optional[list]  # per-client held-out indices or None
  client_test_in: str = "train"  # which arrays client_test indexes: "train" or "test"

  @property
  def num_clients(self) -> int:
    return len(self.client_train)

  @property
  def client_sizes(self) -> np.ndarray:
    return np.array([len(ix) for ix in self.client_train], np.float32)


def resolve_data_dir(config) -> str:
  return config.data_dir or os.environ.get("FEDJAX_LAMA_DATA_DIR", "") or "data"


def build_federation(config, dataset) -> Federation:
  """Partitions the training set into config.num_clients clients (a pure function of the seed)."""
  labels = dataset.train_y
  name = config.partition
  seed = config.seed
  if name == "natural":
    if dataset.train_client_ids is None:
      raise ConfigError(f"config.partition='natural' needs a dataset with client ids "
                        f"(femnist); {config.dataset!r} has none")
    clients = fdata.natural(dataset.train_client_ids)
  elif name == "femnist_writers":
    if dataset.train_client_ids is None:
      raise ConfigError("config.partition='femnist_writers' needs dataset='femnist'")
    writers = fdata.femnist_clients(
        dataset.train_client_ids, num_writers=config.femnist_num_writers,
        writers_per_client=config.femnist_writers_per_client, seed=seed,
        test_client_ids=dataset.test_client_ids)
    # D23: the test set is the held-out data of the selected writers.
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
    clients = fdata.iid(len(labels), config.num_clients, seed)
  elif name == "dirichlet":
    clients = fdata.dirichlet_fedml(labels, config.num_clients, config.dirichlet_concentration, seed,
                                    min_client_size=config.min_client_size)
  elif name == "dirichlet_balanced":
    clients = fdata.dirichlet_balanced(labels, config.num_clients, config.dirichlet_concentration,
                                       seed)
  elif name == "shards":
    clients = fdata.shards(labels, config.num_clients, config.classes_per_client, seed)
  elif name == "class_cyclic":
    clients = fdata.class_cyclic(labels, config.num_clients, config.classes_per_client, seed)
  elif name == "one_class":
    clients = fdata.one_class(labels, config.num_clients, seed)
  else:  # validate() already rejects unknown names
    raise ConfigError(f"config.partition={name!r}")
  clients = [np.asarray(c, np.int64) for c in clients]
  client_test = None
  if config.local_test_fraction > 0:
    clients, client_test = fdata.local_split(clients, config.local_test_fraction, seed)
  return Federation(dataset, clients, client_test)


def cohort_size(config, num_clients: int) -> int:
  """Clients per round: fixed m = round(active_ratio * N) (at least 1)."""
  return max(1, int(round(config.active_ratio * num_clients)))


def sample_round(config, num_clients: int, round_idx: int) -> np.ndarray:
  if config.client_sampling == "bernoulli":
    return np.asarray(fdata.sample_bernoulli(num_clients, config.active_ratio, config.seed, round_idx))
  return np.asarray(fdata.sample_clients(num_clients, cohort_size(config, num_clients), config.seed,
                                         round_idx))


def max_cohort(config, num_clients: int) -> int:
  """Static client-axis size of a round (one compiled shape for the whole run).

  Bernoulli cohorts vary; they are padded to a high quantile of the binomial and
  the rare larger draw runs as extra chunks.
  """
  if config.client_sampling == "fixed":
    return cohort_size(config, num_clients)
  p = config.active_ratio
  mean, std = num_clients * p, np.sqrt(num_clients * p * (1 - p))
  return int(min(num_clients, max(1, np.ceil(mean + 4 * std))))
