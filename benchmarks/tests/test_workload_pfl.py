"""The pfl-research workload harness: its CLI command and how it finds a run to resume."""
import sys

import numpy as np

from configs import workload_pfl_cifar10 as workload_config
from benchmarks import workload_pfl_cifar10 as workload
from fedjax_lama import checkpointing


def test_config_is_the_published_setup():
  c = workload_config.get_config()
  assert (c.num_clients, c.batch_size, c.local_epochs, c.rounds) == (1000, 10, 1, 1500)
  assert c.num_clients * c.active_ratio == 50
  assert c.dataset_options.train_examples // c.num_clients == 50  # 5 steps of 10


def test_full_run_command_keeps_the_config_schedule():
  cmd = workload.workload_command("pfl_cnn", 1500, "/w")
  assert cmd[:3] == [sys.executable, "-m", "experiments.main"]
  assert cmd[3:] == ["--config=configs/workload_pfl_cifar10.py:pfl_cnn",
                     "--config.rounds=1500", "--workdir=/w"]


def test_prefix_evaluates_five_times_and_checkpoint_override_is_passed():
  cmd = workload.workload_command("fedat_cnn", 30, "/w", checkpoint_every=10)
  assert "--config.eval_every=6" in cmd
  assert "--config.checkpoint_every=10" in cmd
  assert "--config=configs/workload_pfl_cifar10.py:fedat_cnn" in cmd


def test_latest_checkpoint_round_reads_the_runs_own_checkpoints(tmp_path):
  workdir = str(tmp_path)
  assert workload.latest_checkpoint_round(workdir) is None  # a fresh run
  ckpt = checkpointing.Checkpointer(str(tmp_path / "checkpoints"))
  for step in (49, 99):
    ckpt.save(step, {"w": np.zeros(3, np.float32)}, {"round": step})
  ckpt.close()
  assert workload.latest_checkpoint_round(workdir) == 99
