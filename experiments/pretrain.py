r"""Central pretraining: one client holding a public corpus, trained by the run machinery.

  python -m experiments.pretrain --config=configs/pretrain_milton.py --workdir=/tmp/milton
  python -m experiments.main --config=configs/text_study.py:transformer \
      --config.init_from=/tmp/milton --workdir=/tmp/text_tf_pretrained

A config with one client (config.num_clients=1, config.partition="iid", every round)
trains centrally: with FedAvg at server rate 1 each round is config.local_steps steps of
minibatch SGD on the whole corpus, and the workdir is a run's like any other (config.json,
metrics.jsonl, checkpoints/, summary.json), so the same command resumes it and a larger
--config.rounds extends it. The last line reports the final evaluation on the corpus's
held-out windows (the dataset's test split): loss in nats, bits per token (per character
on character data) and next-token accuracy, with the checkpoint that
`--config.init_from=<workdir>` starts a federated run from (fedjax_lama/run/pretrained.py).

Flags, errors and exit status are experiments/main.py's.
"""
import math

from absl import app

from fedjax_lama.errors import ConfigError


def check_central(config) -> None:
  """A pretraining config trains one client on the whole corpus in every round."""
  if config.num_clients != 1:
    raise ConfigError(f"config.num_clients={config.num_clients!r} is not accepted by "
                      "experiments.pretrain; accepted: 1 (one client holding the corpus)")
  if config.partition != "iid":
    raise ConfigError(f"config.partition={config.partition!r} is not accepted by "
                      "experiments.pretrain; accepted: 'iid' (over one client: every "
                      "training example)")
  if config.active_ratio != 1.0:
    raise ConfigError(f"config.active_ratio={config.active_ratio!r} is not accepted by "
                      "experiments.pretrain; accepted: 1.0 (the client trains every round)")


def pretrain(config, workdir) -> dict:
  """Runs (or resumes) the central run of `config` in `workdir`; returns its summary."""
  from fedjax_lama import training  # pylint: disable=g-import-not-at-top
  check_central(config)
  return training.train_and_evaluate(config, workdir)


def final_line(summary: dict) -> str:
  from experiments import main as cli  # pylint: disable=g-import-not-at-top
  bits = summary.get("final_test_bits_per_token", summary["final_test_loss"] / math.log(2.0))
  return (f"pretrained: test_loss={summary['final_test_loss']:.4f} "
          f"test_bits_per_token={bits:.4f} test_accuracy={summary['final_test_accuracy']:.4f} "
          f"rounds={summary['rounds']} local_steps={summary['local_steps']} "
          f"wall_seconds={summary['wall_seconds']:.1f} workdir={cli.FLAGS.workdir} "
          f"(start a run from it: --config.init_from={cli.FLAGS.workdir})")


def main(argv):
  from experiments import main as cli  # pylint: disable=g-import-not-at-top
  cli.main(argv, train=pretrain, final_line=final_line)


# The CLI's flags (a required --workdir) are defined only when this runs as a command, so that
# pretrain() and check_central() import into other commands (experiments/lora_study.py).
if __name__ == "__main__":
  from experiments import main as cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)
