r"""A private FedAvg round against a non-private one of the same shape, side by side.

  python -m benchmarks.dp_speed [--model=fedat_cnn --clients=32 --steps=10 --batch=32 \
      --sampling=fixed,poisson --repeats=5]
  python -m benchmarks.dp_speed --quick          # a smoke run: 2 clients x 1 step x batch 8

User-level DP (config.privacy: DP-FedAvg, McMahan et al., ICLR 2018) clips every client's
update to L2 norm C inside the vmapped client computation, sums the clipped updates and adds
N(0, sigma^2 C^2) to the sum once per round; adaptive clipping (Andrew et al., NeurIPS 2021)
also counts the clients left unclipped and moves C. Per cohort kind, three arms are timed:

  fedavg        FedAvg without privacy;
  dp_flat       flat clipping with noise (sigma = --noise_multiplier);
  dp_adaptive   the same with adaptive clipping.

Cohorts: "fixed" draws round(active_ratio N) clients without replacement; "poisson" is the
Bernoulli draw the accountant's amplification assumes (privacy needs it, FedAvg is timed on the
same draws), run over a static capacity of the mean plus four binomial standard deviations,
so its rounds train the padded slots as well. `poisson_fedavg/fixed_fedavg` is that padding's
cost, paid by any Poisson-sampled round, private or not; the DP ratios compare arms of one
cohort kind, so they measure what privacy adds; `poisson_dp_flat/fixed_fedavg` is what a
private run pays against the usual fixed-cohort FedAvg round. A Poisson round can instead run
in chunks of --poisson_chunk clients (config.engine.clients_per_chunk: ceil(n / chunk) chunks
for a draw of n, so the padding is less than one chunk): the arm `poisson_chunked_dp_flat`,
whose results equal the one-chunk round's to float32 rounding (the chunks' sums are added
in another order). The population is N = 2 x --clients at active_ratio 0.5 unless
--population says otherwise.

Every program is built from a config as a run builds it and driven as the training loop
drives it (round_timing.py), on FedAT's CNN with Fashion-MNIST-shaped synthetic data; one
warm-up round per arm, then --repeats rounds interleaved across the arms. Ratios are given
of the best rounds and as the median of the rounds' paired ratios. The issue's target is a
private round within 1.1x the non-private one. The last line is JSON.
"""
import json

from absl import app, flags

from benchmarks import round_timing
from fedjax_lama import config as config_lib
from fedjax_lama.cli import cpu_devices, logs

FLAGS = flags.FLAGS
SAMPLINGS = {"fixed": "fixed", "poisson": "bernoulli"}  # --sampling -> config.client_sampling
ARMS = ("fedavg", "dp_flat", "dp_adaptive")
TARGET = 1.1
QUICK = {"clients": 2, "steps": 1, "batch": 8, "repeats": 1, "poisson_chunk": 1}


def define_flags() -> None:
  """The command's flags, defined only when it runs as a program (absl refuses a flag defined
  twice, and the benchmarks' modules are imported side by side by tests)."""
  flags.DEFINE_string("model", "fedat_cnn", "Model name (fedjax_lama.models.names()).")
  flags.DEFINE_integer("clients", 32, "Clients per round (the expected cohort under Poisson "
                       "sampling).")
  flags.DEFINE_integer("population", 0, "Clients in the federation (0: 2 x --clients).")
  flags.DEFINE_integer("steps", 10, "Local steps per client.")
  flags.DEFINE_integer("batch", 32, "Local batch size.")
  flags.DEFINE_list("sampling", list(SAMPLINGS), "Cohort kinds timed: fixed, poisson.")
  flags.DEFINE_integer("poisson_chunk", 8, "clients_per_chunk of the poisson_chunked_dp_flat "
                       "arm (0: no such arm).")
  flags.DEFINE_float("noise_multiplier", 1.0, "sigma of the private arms.")
  flags.DEFINE_float("clip_norm", 1.0, "C of the private arms (the initial clip if adaptive).")
  flags.DEFINE_integer("repeats", 5, "Timed rounds of each arm, interleaved, after one warm-up.")
  flags.DEFINE_list("input_shape", ["28", "28", "1"], "The synthetic images' shape (H,W,C).")
  flags.DEFINE_bool("quick", False, "A smoke run: 2 clients x 1 step x batch 8, one repeat.")


def dp_config(arm: str, sampling: str, model: str, clients: int, population: int, steps: int,
              batch: int, noise_multiplier: float = 1.0, clip_norm: float = 1.0,
              clients_per_chunk: int = 0):
  """The config of one arm: FedAvg, uniform weights, with config.privacy for the DP arms."""
  c = config_lib.base_config()
  c.algorithm, c.model, c.partition = "fedavg", model, "iid"
  c.num_clients, c.active_ratio = population, clients / population
  c.client_sampling = SAMPLINGS[sampling]
  c.batch_size, c.local_steps, c.weighting, c.local_lr = batch, steps, "uniform", 0.01
  c.engine.clients_per_chunk = clients_per_chunk
  if arm != "fedavg":
    c.privacy.enabled = True
    c.privacy.noise_multiplier = noise_multiplier
    c.privacy.clip_norm = clip_norm
    c.privacy.adaptive.enabled = arm == "dp_adaptive"
    if arm == "dp_adaptive" and clients / 20 <= noise_multiplier / 2:
      # The default noise on the count (expected cohort / 20) must exceed sigma / 2 for the
      # update's noise to stay finite: small (smoke-run) cohorts get sigma instead.
      c.privacy.adaptive.count_stddev = float(noise_multiplier)
  return c


def run(model="fedat_cnn", clients=32, population=0, steps=10, batch=32,
        sampling=tuple(SAMPLINGS), noise_multiplier=1.0, clip_norm=1.0, repeats=5,
        input_shape=round_timing.FASHION_MNIST_SHAPE, poisson_chunk=8) -> dict:
  """Times every arm of every cohort kind; returns the JSON dict (see the module doc)."""
  unknown = [s for s in sampling if s not in SAMPLINGS]
  if unknown:
    raise ValueError(f"sampling={','.join(unknown)} is not accepted; accepted: "
                     f"{', '.join(SAMPLINGS)}")
  population = population or 2 * clients
  dataset = round_timing.synthetic_dataset(population * steps * batch, input_shape)
  arms, capacity = {}, {}
  for kind in sampling:
    for arm in ARMS:
      config = dp_config(arm, kind, model, clients, population, steps, batch, noise_multiplier,
                         clip_norm)
      program = round_timing.build(config, dataset)
      arms[f"{kind}_{arm}"] = round_timing.TimedProgram(program)
      capacity[kind] = program.chunk_size
  if "poisson" in sampling and poisson_chunk:
    config = dp_config("dp_flat", "poisson", model, clients, population, steps, batch,
                       noise_multiplier, clip_norm, clients_per_chunk=poisson_chunk)
    program = round_timing.build(config, dataset)
    arms["poisson_chunked_dp_flat"] = round_timing.TimedProgram(program)
    capacity["poisson_chunked"] = program.chunk_size
  times = round_timing.interleave(arms, repeats)
  ratios = {}
  for kind in sampling:
    for arm in ARMS[1:]:
      ratios[f"{kind}_{arm}/{kind}_fedavg"] = round_timing.ratio(times, f"{kind}_{arm}",
                                                                 f"{kind}_fedavg")
  if "fixed" in sampling and "poisson" in sampling:
    for arm in ("poisson_fedavg", "poisson_dp_flat", "poisson_chunked_dp_flat"):
      if arm in times:
        ratios[f"{arm}/fixed_fedavg"] = round_timing.ratio(times, arm, "fixed_fedavg")
  first = times.pop("first_call_s")
  return {"model": model, "clients": clients, "population": population, "steps": steps,
          "batch": batch, "noise_multiplier": noise_multiplier, "clip_norm": clip_norm,
          "poisson_chunk": poisson_chunk,
          "repeats": repeats, "client_slots_per_round": capacity, "target": TARGET,
          "machine": round_timing.machine(),
          "seconds_per_round": {name: min(t) for name, t in times.items()},
          "rounds_s": times, "first_call_s": first, "ratios": ratios}


def report(r: dict) -> str:
  """The human-readable summary: the machine, each arm's round, each ratio."""
  lines = [round_timing.machine_line(r["machine"]),
           f"{r['model']}: {r['clients']} clients of {r['population']} x {r['steps']} steps x "
           f"batch {r['batch']}, sigma {r['noise_multiplier']}, C {r['clip_norm']}; best of "
           f"{r['repeats']} interleaved rounds after one warm-up"]
  for kind, slots in r["client_slots_per_round"].items():
    what = "a chunk, as many chunks as the draw needs" if kind.endswith("chunked") else "a round"
    lines.append(f"  {kind} cohorts: {slots} client slots {what}")
  for name, seconds in r["seconds_per_round"].items():
    lines.append(f"  round {name:22s} {seconds:8.3f} s")
  for name, q in r["ratios"].items():
    numerator, denominator = name.split("/")
    same_cohorts = numerator.split("_")[0] == denominator.split("_")[0]
    # The target is privacy's cost: arms of one cohort kind (the same draws, the same slots).
    note = f" (target <= {r['target']})" if same_cohorts else ""
    lines.append(f"  ratio {name:34s} {q['best']:.3f} (paired median "
                 f"{q['paired_median']:.3f}){note}")
  return "\n".join(lines)


def main(argv):
  del argv
  cpu_devices.split_cpu()
  logs.progress_only()
  sizes = dict(clients=FLAGS.clients, steps=FLAGS.steps, batch=FLAGS.batch,
               repeats=FLAGS.repeats, poisson_chunk=FLAGS.poisson_chunk)
  if FLAGS.quick:
    sizes.update(QUICK)
  r = run(FLAGS.model, population=FLAGS.population, sampling=tuple(FLAGS.sampling),
          noise_multiplier=FLAGS.noise_multiplier, clip_norm=FLAGS.clip_norm,
          input_shape=tuple(int(s) for s in FLAGS.input_shape), **sizes)
  print(report(r))
  print(json.dumps(r))


if __name__ == "__main__":
  define_flags()
  app.run(main)
