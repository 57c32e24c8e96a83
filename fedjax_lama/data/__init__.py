"""Data layer of fedjax_lama: readers, datasets, partitions, sampling, packing.

Pure numpy on the host; imports nothing from jax, the models or the engine.
"""

from fedjax_lama.data.datasets import DATA_DIR_ENV
from fedjax_lama.data.datasets import DATASET_NAMES
from fedjax_lama.data.datasets import Dataset
from fedjax_lama.data.datasets import femnist_clients
from fedjax_lama.data.datasets import femnist_clients_round_robin
from fedjax_lama.data.datasets import load_dataset
from fedjax_lama.data.datasets import SOURCES
from fedjax_lama.data.datasets import WriterClients
from fedjax_lama.data.errors import DataError
from fedjax_lama.data.leaf import LeafSplit
from fedjax_lama.data.leaf import read_femnist_leaf
from fedjax_lama.data.leaf import read_leaf
from fedjax_lama.data.leaf import read_leaf_split
from fedjax_lama.data.packing import CohortBatch
from fedjax_lama.data.packing import pack_cohort
from fedjax_lama.data.packing import steps_per_epoch
from fedjax_lama.data.partitions import class_cyclic
from fedjax_lama.data.partitions import dirichlet_balanced
from fedjax_lama.data.partitions import dirichlet_fedml
from fedjax_lama.data.partitions import iid
from fedjax_lama.data.partitions import local_split
from fedjax_lama.data.partitions import natural
from fedjax_lama.data.partitions import one_class
from fedjax_lama.data.partitions import partition
from fedjax_lama.data.partitions import PARTITIONERS
from fedjax_lama.data.partitions import shards
from fedjax_lama.data.readers import load_digits_arrays
from fedjax_lama.data.readers import read_cifar10
from fedjax_lama.data.readers import read_cifar100
from fedjax_lama.data.readers import read_cifar_batch
from fedjax_lama.data.readers import read_idx
from fedjax_lama.data.readers import read_idx_images
from fedjax_lama.data.readers import read_idx_labels
from fedjax_lama.data.readers import read_idx_pair
from fedjax_lama.data.readers import safe_unpickle
from fedjax_lama.data.sampling import sample_bernoulli
from fedjax_lama.data.sampling import sample_clients
from fedjax_lama.data.tfds_loader import load_tfds
