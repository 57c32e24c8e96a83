"""The grids of `benchmarks.benchmark.run` that `benchmarks.benchmark_suite` runs.

No flags of its own (the suite's are its CLI), so tests and notebooks can import it beside
other entry points.
"""
import itertools
import sys

from benchmarks import benchmark

# --models_table: every model of the zoo that takes images, and the sizes it runs at.
TABLE_MODELS = ("fedat_cnn", "cifar_cnn", "pfl_cnn", "leaf_cnn", "mnist_cnn", "mnist_mlp",
                "cifar_lenet", "fedspeed_lenet", "resnet20", "resnet9", "resnet18_gn",
                "wrn28_10", "mlp")
TABLE_SIZE = (8, 5, 32)
# --text: both text models (benchmark.TEXT_MODELS) at clients x steps x batch.
TEXT_MODELS = ("lstm_lm", "transformer_lm")
TEXT_SIZE = (4, 5, 10)
# benchmark.run options that replace the table's for a row: WRN-28-10's warm-up and timed
# round take 8 min each for the engine and the loop on a 2-core CPU.
TABLE_ROW_OPTIONS = {"wrn28_10": {"repeats": 1, "central_impls": (),
                                  "compare_client_maps": False}}


def throughput(model_names, clients, steps, batch, repeats, conv_impl, unroll=1,
               central_impls=benchmark.CENTRAL_IMPLS, compare_client_maps=False,
               row_options=None, min_sample_s=benchmark.MIN_SAMPLE_S,
               matmul_size=2048) -> list[dict]:
  """benchmark.run over the grid; `row_options` (model -> benchmark.run keyword arguments)
  replaces the grid's options for that model's rows; `matmul_size`: n of the n^3 matmul
  timed as each row's peak."""
  rows = []
  for name in model_names:
    for c, k in itertools.product(clients, steps):
      options = dict(clients=c, steps=k, batch=batch, repeats=repeats,
                     central_impls=central_impls, compare_client_maps=compare_client_maps)
      options.update((row_options or {}).get(name, {}))
      r = benchmark.run(name, conv_impl=conv_impl, unroll=unroll, min_sample_s=min_sample_s,
                        matmul_size=matmul_size, **options)
      print(f"  {name} {r['clients']} clients x {r['steps']} steps x batch {r['batch']}: "
            f"engine/loop {r['ratio']:.2f}, "
            f"MFU {r['mfu']:.3f}, load {r['load_avg_before']}", file=sys.stderr, flush=True)
      rows.append(r)
  return rows
