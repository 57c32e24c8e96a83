"""What one client sends and receives per round, from an algorithm's declaration."""
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lama import compression
from fedjax_lama.engine.algorithm import (Algorithm, ClientContext, ClientInfo, LocalState,
                                          ServerState)
from fedjax_lama.tree import PyTree, leaf_sizes, tree_size


class Traffic(NamedTuple):
  """Per participating client and round, from the algorithm's declaration."""
  up_per_leaf: np.ndarray    # floats of params-shaped uploads, per params leaf
  up_other: int              # floats of other uploads (scalars: FedNova's ||a_i||_1)
  down_per_leaf: np.ndarray  # floats of params-shaped downloads, per params leaf
  down_other: int
  vector_uploads: tuple      # names of the compressible uploads
  scalar_floats: int         # floats of all-scalar uploads (32 bits each, never compressed)
  upload_shapes: dict        # name -> ShapeDtypeStruct pytree (one client)
  # name -> what of each vector upload travels (its exchanged leaves; Algorithm.exchanged)
  sent_shapes: Optional[dict] = None


def traffic(algorithm: Algorithm, server: ServerState, row: PyTree) -> Traffic:
  """What one client sends and receives, from the shapes of `finish` and the downloads."""
  shared = algorithm.shared(server)
  f32 = jax.ShapeDtypeStruct((), jnp.float32)
  i32 = jax.ShapeDtypeStruct((), jnp.int32)
  ctx = ClientContext(shared, row, f32, i32)
  info = ClientInfo(f32, f32, f32, f32, i32)

  def one_client(ctx, info):
    state = LocalState(ctx.shared["params"], server.model_state, algorithm.local.init_state(ctx))
    if algorithm.start is not None:  # only shapes are traced: any loss will do
      state = algorithm.start(state, ctx, lambda params: jnp.zeros((), jnp.float32))
    return algorithm.finish(state, ctx, info)

  uploads, _ = jax.eval_shape(one_client, ctx, info)
  params_def = jax.tree.structure(server.params)
  sent = exchanged_leaves(algorithm, server.params)
  # Only the exchanged leaves of a params-shaped message travel (Algorithm.exchanged).
  sizes = leaf_sizes(server.params) * sent

  def split(trees):
    per_leaf, other = np.zeros_like(sizes), 0
    for tree in trees:
      if jax.tree.structure(tree) == params_def:
        per_leaf = per_leaf + sizes
      else:
        other += tree_size(tree)
    return per_leaf, other

  up_leaf, up_other = split(uploads.values())
  down_leaf, down_other = split(shared.values())
  scalars = tuple(n for n, v in uploads.items() if compression.is_scalar_upload(v))
  # What each vector upload sends: a params-shaped one its exchanged leaves only.
  sent_shapes = {
      n: ([leaf for leaf, s in zip(jax.tree.leaves(v), sent) if s]
          if jax.tree.structure(v) == params_def else v)
      for n, v in uploads.items() if n not in scalars}
  return Traffic(up_leaf, up_other, down_leaf, down_other,
                 tuple(n for n in uploads if n not in scalars),
                 sum(tree_size(uploads[n]) for n in scalars), uploads, sent_shapes)


def exchanged_leaves(algorithm: Algorithm, params: PyTree) -> np.ndarray:
  """bool [num_leaves]: which params leaves travel (Algorithm.exchanged; None: all)."""
  leaves = jax.tree.leaves(params)
  if algorithm.exchanged is None:
    return np.ones(len(leaves), bool)
  mask = jax.tree.structure(params).flatten_up_to(algorithm.exchanged(params))
  return np.array([bool(m) for m in mask], bool)


def uplink_bits(traffic_: Traffic, compressor: Optional[compression.Compressor]) -> int:
  """Bits one client sends per round: compressed vector uploads + 32 per scalar."""
  comp = compressor if compressor is not None else compression.identity()
  shapes = traffic_.sent_shapes or traffic_.upload_shapes
  return int(sum(comp.bits(shapes[n]) for n in traffic_.vector_uploads)
             + 32 * traffic_.scalar_floats)
