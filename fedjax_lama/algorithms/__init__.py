"""Algorithms by the lower-case name their paper uses (config.algorithm)."""
from fedjax_lama.algorithms.base import Algorithm
from fedjax_lama.algorithms.fedavg import fedavg, fedprox
from fedjax_lama.algorithms.fedpaq import fedpaq

# Builders of synchronous-round algorithms. FedLAMA is an aggregation schedule
# over a base algorithm, see fedjax_lama.programs.
REGISTRY = {"fedavg": fedavg, "fedprox": fedprox, "fedpaq": fedpaq}


def get(name: str):
  if name not in REGISTRY:
    raise ValueError(f"algorithm={name!r} is unknown; accepted: {', '.join(sorted(REGISTRY))}")
  return REGISTRY[name]
