"""Algorithms by the lower-case name their paper uses (config.algorithm).

Each module cites its paper and registers `Spec(name, Hparams, build)`s; the
registry (algorithms/registry.py) maps a config to them. The interface they
implement is fedjax_lama.engine.algorithm.Algorithm.
"""
from fedjax_lama.algorithms.common import Common
from fedjax_lama.algorithms.common import local_optimizer
from fedjax_lama.algorithms.common import Spec
from fedjax_lama.engine.algorithm import Algorithm
from fedjax_lama.algorithms.registry import build
from fedjax_lama.algorithms.registry import names
