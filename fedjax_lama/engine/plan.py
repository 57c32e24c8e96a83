"""The engine's per-platform decisions, in one typed plan.

`plan(platform)` says, for a backend ("cpu", "gpu", "tpu"), which kernel set the models
compute with, how local training adds the client axis, the compiler options of the
functions that run local training, and whether CPU devices may split a cohort. The training
entry point builds a run's plan once from config.engine (kernels, client_map) and the run
options carry it to every round; a caller without run options gets `plan()`, the default
backend's choices. Nothing here reads the environment.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax

from fedjax_lama import kernels as kernels_lib

# Compiler options for the functions that run local training, on CPU. Without its
# region-based live-range analysis (off by default in XLA:CPU) copy insertion copies every
# parameter a matmul reads at the top of each local step, so that the step's in-place update
# cannot overwrite it early; with the analysis it sees that every read comes first. Same
# results bit for bit (tests/test_training_compiler_options.py); in the engine on a 2-core
# Zen 5 box leaf_cnn trained 1.06x to 1.14x and mnist_mlp 1.06x to 1.12x faster, FedAT's
# CNN, resnet20 and cifar_cnn unchanged, the 8x8 `mlp` 0.95x to 0.98x.
CPU_TRAINING_COMPILER_OPTIONS = {"xla_cpu_copy_insertion_use_region_analysis": True}

# Added on CPU for a model that rematerialises (`plan(..., remat=True)`; the transformer's
# option `remat`, each block under jax.checkpoint). JAX ties a block's recomputation to the
# cotangent that reaches the block with one optimization barrier over both; XLA:CPU removes
# every optimization barrier right after CSE (its pass "cse_barrier_expander"), before fusion
# and scheduling, and its default scheduler then runs each recomputation as soon as the
# block's input exists, beside the forward pass, so the step keeps as many values as without
# remat. With the pass off the barriers stay to the schedule and the backward pass recomputes
# one block at a time: one step of transformer_lm "small" (batch 10 x 80 tokens) compiles
# to 16.4 MiB of temporaries instead of 47.8 MiB, the same gradients bit for bit
# (docs/performance.md, "LoRA"). Only for remat: with the pass off the dense kernels'
# barriers (fedjax_lama/kernels/dot.py) also stay, which changes how the rest compiles.
CPU_REMAT_COMPILER_OPTIONS = {"xla_disable_hlo_passes": "cse_barrier_expander"}

# How the client axis is added (`local.vmap_clients`):
#   "auto"  "scan" on CPU, "vmap" elsewhere (the measured best per platform);
#   "vmap"  one jax.vmap over the whole chunk of clients (every op batched over clients);
#   "scan"  a lax.scan over groups of clients, each group vmapped: as many clients per group
#           (per device) as keep one local step's values within SCAN_GROUP_BYTES.
# On XLA:CPU a vmapped step materialises every client's patch matrices and activations at
# once (FedAT's CNN: about 135 MB per client and step), far beyond the caches; a group of one
# client keeps them near: FedAT's CNN at 32 clients x 10 steps x batch 32 trained 1.15x to
# 1.4x faster than with "vmap", the LeNets and the MNIST CNN 1.7x to 2.6x at 8 x 5. Results
# equal "vmap" to float32 rounding.
CLIENT_MAPS = ("auto", "vmap", "scan")
SCAN_GROUP_BYTES = 64 << 20

# On CPU some models train faster with one JAX device per core and the clients split over
# them (each device runs its clients on its own thread): two devices against one on 2 cores,
# 8 clients x 5 steps x batch 32, mnist_cnn 1.58x, cifar_lenet 1.38x, resnet20 1.15x,
# mnist_mlp 1.14x, FedAT's CNN 1.13x (32 x 10 x 32); but fedspeed_lenet 0.92x, pfl_cnn 0.84x
# and leaf_cnn 0.80x (0.8 M, 1.6 M and 6.6 M parameters: two clients' weights and gradients
# compete for the caches), and `mlp` 0.89x (a step of 0.25 MB of values, too little to pay
# for a second device). Hence `splits_cpu_cohort`.
CPU_SPLIT_MAX_PARAMS = 500_000
CPU_SPLIT_MIN_STEP_BYTES = 1 << 20  # `local.step_bytes`: mlp 0.25 MB, mnist_mlp 1.96 MB


@dataclasses.dataclass(frozen=True)
class PlatformPlan:
  """What the engine does differently on one backend.

  platform: the backend ("cpu", "gpu", "tpu", ...).
  kernels: the models' kernel set, "lax" or "patches" (`fedjax_lama.kernels`).
  client_map: "vmap" or "scan" (`local.vmap_clients`).
  scan_group_bytes: the values one group of the scan map's clients may hold per device.
  compiler_options: (name, value) pairs for the jit of local training.
  cpu_device_rule: whether `splits_cpu_cohort` decides if a cohort is split over a
    process's devices (CPU); otherwise every device takes clients (accelerators).
  """
  platform: str
  kernels: str
  client_map: str
  scan_group_bytes: int
  compiler_options: tuple[tuple[str, object], ...]
  cpu_device_rule: bool

  def jit_compiler_options(self) -> Optional[dict]:
    """`compiler_options` for `jax.jit` (None when there are none)."""
    return dict(self.compiler_options) or None


def resolve_client_map(client_map: str, platform: Optional[str] = None) -> str:
  """"vmap" or "scan" for `client_map` ("auto", "vmap" or "scan") on `platform` (default
  JAX's default backend)."""
  if client_map not in CLIENT_MAPS:
    raise ValueError(f"client_map={client_map!r} is not accepted; use one of {CLIENT_MAPS}")
  if client_map == "auto":
    return "scan" if (platform or jax.default_backend()) == "cpu" else "vmap"
  return client_map


def plan(platform: Optional[str] = None, kernels: str = "auto",
         client_map: str = "auto", remat: bool = False) -> PlatformPlan:
  """The plan for `platform` (default JAX's default backend), with the kernel set `kernels`
  and the client map `client_map` (config.engine.kernels and config.engine.client_map:
  "auto" is the platform's measured best). `remat`: the model rematerialises
  (jax.checkpoint), so that on CPU local training compiles with CPU_REMAT_COMPILER_OPTIONS."""
  platform = platform or jax.default_backend()
  cpu = platform == "cpu"
  client_map = resolve_client_map(client_map, platform)
  options = {**CPU_TRAINING_COMPILER_OPTIONS, **(CPU_REMAT_COMPILER_OPTIONS if remat else {})}
  return PlatformPlan(
      platform=platform,
      kernels=kernels_lib.resolve(kernels, platform),
      client_map=client_map,
      scan_group_bytes=SCAN_GROUP_BYTES,
      compiler_options=tuple(options.items()) if cpu else (),
      cpu_device_rule=cpu)


def splits_cpu_cohort(num_params: int, step_bytes: int) -> bool:
  """Whether a cohort is split over a process's CPU devices: models of at most
  CPU_SPLIT_MAX_PARAMS parameters whose local step computes at least CPU_SPLIT_MIN_STEP_BYTES
  bytes of values (`local.step_bytes`)."""
  return num_params <= CPU_SPLIT_MAX_PARAMS and step_bytes >= CPU_SPLIT_MIN_STEP_BYTES
