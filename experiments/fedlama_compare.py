r"""FedLAMA vs FedAvg at an equal local-step budget (algorithms.md 1.2.4, 1.6.7).

  python -m experiments.fedlama_compare --config=configs/fedlama_fmnist_cnn.py \
      --phis=2,4 --seeds=0,1,2 --total_steps=400 --out=/tmp/fedlama_fmnist

For each seed runs FedAvg(tau'), FedAvg(phi tau') and FedLAMA(tau', phi) for every phi
(FedAvg(k tau') is FedLAMA with phi = 1 and base interval k tau', as the spec's presets
do), then prints a markdown table of final / best accuracy and comm_ratio (floats
communicated relative to FedAvg(tau') over the same steps), mean +- std over seeds,
and writes it with the per-run JSON to --out. Runs already finished in --out are
reused (each run is resumable), so an interrupted sweep continues where it stopped.
"""
import json
import os

from absl import app, flags
from ml_collections import config_flags
import numpy as np

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "configs/fedlama_fmnist_cnn.py", "Base FedLAMA config.")
flags.DEFINE_list("phis", ["2", "4"], "FedLAMA interval factors.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds.")
flags.DEFINE_integer("total_steps", 0, "Local-step budget (0: the config's fedlama.total_steps).")
flags.DEFINE_integer("eval_steps", 0, "Evaluate every this many local steps (0: at the end only "
                     "and at every longest window).")
flags.DEFINE_string("out", None, "Output directory.")
flags.mark_flags_as_required(["out"])


def run_variants(base, phis, total_steps):
  """(label, config) pairs: FedAvg(tau'), FedAvg(phi tau'), FedLAMA(tau', phi)."""
  tau = base.fedlama.base_interval
  out = []

  def variant(label, interval, phi, fixed=None):
    c = base.copy_and_resolve_references()
    c.fedlama.base_interval, c.fedlama.phi = interval, phi
    c.fedlama.fixed_multipliers = fixed
    c.fedlama.total_steps = total_steps
    window = interval * phi
    every = FLAGS.eval_steps or tau * max(phis)
    c.eval_every = max(1, every // window)
    out.append((label, c))

  variant(f"FedAvg({tau})", tau, 1)
  for phi in phis:
    variant(f"FedAvg({phi * tau})", phi * tau, 1)
  for phi in phis:
    variant(f"FedLAMA({tau},{phi})", tau, phi)
  return out


def main(argv):
  del argv
  from fedjax_lama import training  # pylint: disable=g-import-not-at-top
  base = FLAGS.config
  phis = [int(p) for p in FLAGS.phis]
  total = FLAGS.total_steps or base.fedlama.total_steps
  results = {}
  for seed in [int(s) for s in FLAGS.seeds]:
    for label, c in run_variants(base, phis, total):
      c.seed = seed
      workdir = os.path.join(FLAGS.out, f"{label}_seed{seed}".replace(",", "_"))
      summary_path = os.path.join(workdir, "summary.json")
      if os.path.exists(summary_path):
        with open(summary_path) as f:
          s = json.load(f)
      else:
        s = training.train_and_evaluate(c, workdir)
      print(f"{label} seed {seed}: final {s['final_test_accuracy']:.4f} best "
            f"{s['best_test_accuracy']:.4f} floats_up {s['comm_floats_up']} "
            f"wall {s['wall_seconds']:.0f}s", flush=True)
      results.setdefault(label, []).append(s)
  tau = base.fedlama.base_interval
  ref = {s["seed"] if "seed" in s else i: s["comm_floats_up"]
         for i, s in enumerate(results[f"FedAvg({tau})"])}
  rows, table = [], ["| run | final acc (mean ± std) | best acc (mean ± std) | comm_ratio | wall s/run |",
                     "|---|---|---|---|---|"]
  for label, runs in results.items():
    final = np.array([r["final_test_accuracy"] for r in runs])
    best = np.array([r["best_test_accuracy"] for r in runs])
    ratio = np.array([r["comm_floats_up"] / ref[i] for i, r in enumerate(runs)])
    wall = np.mean([r["wall_seconds"] for r in runs])
    rows.append({"run": label, "final": final.tolist(), "best": best.tolist(),
                 "comm_ratio": ratio.tolist(), "wall_seconds": float(wall)})
    table.append(f"| {label} | {final.mean():.4f} ± {final.std():.4f} | {best.mean():.4f} ± "
                 f"{best.std():.4f} | {ratio.mean():.4f} | {wall:.0f} |")
  text = "\n".join(table)
  print(text)
  os.makedirs(FLAGS.out, exist_ok=True)
  with open(os.path.join(FLAGS.out, "table.md"), "w") as f:
    f.write(text + "\n")
  with open(os.path.join(FLAGS.out, "results.json"), "w") as f:
    json.dump({"total_steps": total, "phis": phis, "rows": rows}, f, indent=2)


if __name__ == "__main__":
  app.run(main)
