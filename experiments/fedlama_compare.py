r"""FedLAMA vs FedAvg at an equal local-step budget (Lee, Zhang, Avestimehr, AAAI 2023).

  python -m experiments.fedlama_compare --config=configs/fedlama_fmnist_cnn.py \
      --phis=2,4 --seeds=0,1,2 --total_steps=400 --out=/tmp/fedlama_fmnist

For each seed runs FedAvg(tau'), FedAvg(phi tau') and FedLAMA(tau', phi) for every phi
(FedAvg(k tau') is FedLAMA with phi = 1 and base interval k tau', as the spec's presets
do), then prints a markdown table of final / best accuracy and comm_ratio (floats
communicated relative to FedAvg(tau') over the same steps), mean +- std over seeds,
and writes it with the per-run JSON to --out. Runs already finished in --out are
reused (each run is resumable), so an interrupted sweep continues where it stopped.

Early stopping as AAAI reports it (Lee et al., AAAI 2023: FedLAMA "stops the training once it
achieves a higher accuracy than FedAvg"): early_stop_step is the first evaluation at which
FedLAMA(tau', phi) beats the best accuracy of FedAvg(phi tau') in the same seed; the table gives the
accuracy there and comm_ratio_budget = C(T) / C_ref(T_budget)
(evaluate often enough, --eval_steps, for it to mean something).

Composition (AAAI Table 4): the base config's local algorithm and compressor apply to every
run, e.g. FedPAQ vs FedPAQ + FedLAMA:
  python -m experiments.fedlama_compare --config=configs/fedlama_fmnist_cnn.py \
      --config.compressor.name=qsgd --phis=2,4 --seeds=0 --out=/tmp/fedpaq_fmnist
and FedProx vs FedProx + FedLAMA with --config.fedlama.local_algorithm=fedprox.
"""
import json
import os

from absl import app, flags
from ml_collections import config_flags
import numpy as np

from experiments.studies import base_name, early_stop, run_variants

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "configs/fedlama_fmnist_cnn.py", "Base FedLAMA config.")
flags.DEFINE_list("phis", ["2", "4"], "FedLAMA interval factors.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds.")
flags.DEFINE_integer("total_steps", 0, "Local-step budget (0: the config's fedlama.total_steps).")
flags.DEFINE_integer("eval_steps", 0, "Evaluate every this many local steps (0: at the end only "
                     "and at every longest window).")
flags.DEFINE_string("out", None, "Output directory.")
flags.mark_flags_as_required(["out"])


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def main(argv):
  del argv
  from fedjax_lama import training  # pylint: disable=g-import-not-at-top
  base = FLAGS.config
  phis = [int(p) for p in FLAGS.phis]
  total = FLAGS.total_steps or base.fedlama.total_steps
  results, workdirs = {}, {}
  name = base_name(base)
  for seed in [int(s) for s in FLAGS.seeds]:
    for label, c in run_variants(base, phis, total, FLAGS.eval_steps):
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
      workdirs.setdefault(label, []).append(workdir)
  tau = base.fedlama.base_interval
  ref = {s["seed"] if "seed" in s else i: s["comm_floats_up"]
         for i, s in enumerate(results[f"{name}({tau})"])}
  rows, table = [], ["| run | final acc (mean ± std) | best acc (mean ± std) | comm_ratio | "
                     "uplink bits / float32 FedAvg(tau') | early stop: step, acc, C ratio "
                     "(per seed) | wall s/run |", "|---|---|---|---|---|---|---|"]
  for label, runs in results.items():
    final = np.array([r["final_test_accuracy"] for r in runs])
    best = np.array([r["best_test_accuracy"] for r in runs])
    ratio = np.array([r["comm_floats_up"] / ref[i] for i, r in enumerate(runs)])
    bits = [r.get("comm_bits_up") for r in runs]
    bits_ratio = (np.array([b / (32 * ref[i]) for i, b in enumerate(bits)])
                  if all(b is not None for b in bits) else None)
    wall = np.mean([r["wall_seconds"] for r in runs])
    stops = []
    if "FedLAMA(" in label:
      phi = int(label.rsplit(",", 1)[1].rstrip(")"))
      baseline = results[f"{name}({phi * tau})"]
      stops = [early_stop(_records(w), b["best_test_accuracy"], total)
               for w, b in zip(workdirs[label], baseline)]
    rows.append({"run": label, "final": final.tolist(), "best": best.tolist(),
                 "comm_ratio": ratio.tolist(),
                 "bits_ratio": None if bits_ratio is None else bits_ratio.tolist(),
                 "early_stop": stops, "wall_seconds": float(wall)})
    stop_text = "; ".join("not reached" if e is None else
                          f"{e['step']}, {e['accuracy']:.4f}, {e['comm_ratio_budget']:.4f}"
                          for e in stops) or "-"
    bits_text = "-" if bits_ratio is None else f"{bits_ratio.mean():.4f}"
    table.append(f"| {label} | {final.mean():.4f} ± {final.std():.4f} | {best.mean():.4f} ± "
                 f"{best.std():.4f} | {ratio.mean():.4f} | {bits_text} | {stop_text} | "
                 f"{wall:.0f} |")
  text = "\n".join(table)
  print(text)
  os.makedirs(FLAGS.out, exist_ok=True)
  with open(os.path.join(FLAGS.out, "table.md"), "w") as f:
    f.write(text + "\n")
  with open(os.path.join(FLAGS.out, "results.json"), "w") as f:
    json.dump({"total_steps": total, "phis": phis, "rows": rows}, f, indent=2)


if __name__ == "__main__":
  app.run(main)
