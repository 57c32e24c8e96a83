"""--cpu_devices: the JAX devices the CPU is split into, applied first thing by the commands
that train through the engine (no JAX import here, so --help stays fast)."""
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_integer(
    "cpu_devices", 0, "JAX devices the CPU is split into, before any JAX computation. 0: one "
    "per core, so the engine can train one client per core side by side (it does on models "
    "of at most fedjax_lama.engine.sharding.CPU_SPLIT_MAX_PARAMS parameters, "
    "sharding.client_devices); 1: one device for the whole CPU. Accelerators are not "
    "affected.")


def split_cpu() -> int:
  """Applies --cpu_devices; returns the CPU device count. Call before any JAX computation."""
  if FLAGS.cpu_devices < 0:
    raise app.UsageError(f"--cpu_devices={FLAGS.cpu_devices}: use 0 (one device per core) or a "
                         "positive count")
  from fedjax_lama.engine import sharding  # pylint: disable=g-import-not-at-top
  return sharding.use_cpu_device_per_core(FLAGS.cpu_devices or None)
