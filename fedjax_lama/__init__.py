"""fedjax_lama: a vectorized federated-learning simulator in JAX.

Public entry points (imported lazily so `import fedjax_lama` stays light):
  train_and_evaluate(config, workdir)   the run contract (docs/design.md)
  select_intervals(d, sizes, phi, rule) FedLAMA's interval selector (AAAI 2023, Alg. 1)
  layer_masked_mean(...)                FedLAMA's layer-masked aggregation (AAAI 2023, Alg. 2)
"""
__version__ = "0.1.0"

_LAZY = {
    "train_and_evaluate": ("fedjax_lama.run.pipeline", "train_and_evaluate"),
    "select_intervals": ("fedjax_lama.fedlama.selection", "select_intervals"),
    "layer_masked_mean": ("fedjax_lama.fedlama.layer_sync", "layer_masked_mean"),
    "base_config": ("fedjax_lama.config", "base_config"),
}


def __getattr__(name):
  if name in _LAZY:
    import importlib  # pylint: disable=g-import-not-at-top
    module, attr = _LAZY[name]
    return getattr(importlib.import_module(module), attr)
  raise AttributeError(f"module 'fedjax_lama' has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + list(_LAZY))
