"""Bad input to the command line: one "error:" line naming the field, file or path, exit
status 2, no traceback, and a workdir that already held files left byte for byte as it was.

Each case is one `python -m experiments.main` process that must stop before any data is
loaded or anything is compiled (a few seconds each). A representative set runs by default;
the rest is marked slow.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
DEFAULT = "configs/default.py"


def _write(path: pathlib.Path, text: str) -> str:
  path.write_text(text)
  return str(path)


def _config_files(tmp: pathlib.Path) -> dict:
  return {
      "raises": _write(tmp / "raises.py", "def get_config():\n  raise RuntimeError('boom')\n"),
      "syntax": _write(tmp / "syntax.py", "def get_config(:\n  pass\n"),
      "no_get_config": _write(tmp / "no_get_config.py", "X = 1\n"),
      "import_error": _write(tmp / "import_error.py", "import no_such_module_xyz\n"),
      "unknown_field": _write(tmp / "unknown_field.py", (
          "from configs.default import get_config as _base\n"
          "def get_config():\n  c = _base()\n  c.learning_rate = 0.5\n  return c\n")),
      "unknown_nested": _write(tmp / "unknown_nested.py", (
          "from configs.default import get_config as _base\n"
          "def get_config():\n  c = _base()\n  c.engine.unrol = 2\n  return c\n")),
      "unknown_dataset_option": _write(tmp / "unknown_dataset_option.py", (
          "from configs.default import get_config as _base\n"
          "def get_config():\n  c = _base()\n  c.dataset_options.foo = 1\n  return c\n")),
      "renamed_field": _write(tmp / "renamed_field.py", (
          "from configs.default import get_config as _base\n"
          "def get_config():\n  c = _base()\n  c.local_lr_schedule = 'cosine'\n  return c\n")),
      "missing": str(tmp / "missing.py"),
  }


# (case id, extra command-line arguments, what the error line must name). "{...}" fields
# are filled from the case's temporary paths. The workdir is, unless a case names one, a
# directory that already holds files of the user's; "{rundir}" holds a run's files. Both
# are compared byte for byte afterwards.
CASES = [
    ("unknown_field_typo", ["--config.roundz=5"], ["config.roundz", "rounds"]),
    ("config_file_raises", ["--config={raises}"], ["{raises}", "RuntimeError", "boom"]),
    ("config_file_syntax_error", ["--config={syntax}"], ["{syntax}", "SyntaxError"]),
    ("config_file_without_get_config", ["--config={no_get_config}"],
     ["{no_get_config}", "get_config"]),
    ("config_file_missing", ["--config={missing}"], ["{missing}", "no such file"]),
    ("seed_negative", ["--config.seed=-1"], ["config.seed=-1"]),
    ("init_from_missing", ["--config.init_from={missing}"],
     ["config.init_from={missing}", "no such file"]),
    ("num_clients_larger_than_data", ["--config.num_clients=5000"],
     ["config.num_clients=5000"]),
    ("workdir_is_a_file", ["--workdir={afile}"], ["{afile}", "is a file"]),
    ("workdir_empty", ["--workdir="], ["workdir is empty"]),
    ("fedasync_with_fedlama_phi", ["--config.algorithm=fedasync", "--config.fedlama.phi=4"],
     ["config.fedlama.phi", "config.algorithm='fedasync'"]),
    ("renamed_field", ["--config.engine.conv_impl=lax"],
     ["config.engine.conv_impl was renamed config.engine.kernels"]),
]
SLOW_CASES = [
    ("unknown_dataset_option", ["--config.dataset_options.foo=1"],
     ["config.dataset_options.foo", "config.dataset='digits'"]),
    ("config_file_import_error", ["--config={import_error}"],
     ["{import_error}", "ModuleNotFoundError"]),
    ("config_file_unknown_field", ["--config={unknown_field}"], ["config.learning_rate"]),
    ("config_file_renamed_field", ["--config={renamed_field}"],
     ["config.local_lr_schedule was renamed config.local_lr_decay"]),
    ("config_file_unknown_nested_field", ["--config={unknown_nested}"],
     ["config.engine.unrol", "unroll"]),
    ("config_file_unknown_dataset_option", ["--config={unknown_dataset_option}"],
     ["config.dataset_options.foo"]),
    ("fedat_with_rounds", ["--config.algorithm=fedat", "--config.rounds=1"],
     ["config.rounds", "config.algorithm='fedat'"]),
    ("fedat_with_client_sampling",
     ["--config.algorithm=fedat", "--config.client_sampling=bernoulli"],
     ["config.client_sampling", "config.algorithm='fedat'"]),
    ("fedavg_with_fedprox_mu", ["--config.fedprox.mu=0.1"],
     ["config.fedprox.mu", "config.algorithm='fedavg'"]),
    ("scaffold_with_fedlama_phi", ["--config.algorithm=scaffold", "--config.fedlama.phi=4"],
     ["config.fedlama.phi", "config.algorithm='scaffold'"]),
    ("rounds_not_an_integer", ["--config.rounds=abc"], ["config.rounds"]),
    ("algorithm_unknown", ["--config.algorithm=fedavgg"], ["config.algorithm='fedavgg'"]),
    ("local_lr_negative", ["--config.local_lr=-1"], ["config.local_lr=-1"]),
    ("server_lr_zero", ["--config.server_lr=0"], ["config.server_lr=0"]),
    ("active_ratio_above_one", ["--config.active_ratio=2"], ["config.active_ratio=2"]),
    ("partition_unknown", ["--config.partition=foo"], ["config.partition='foo'"]),
    ("model_unknown", ["--config.model=resnet2"], ["config.model='resnet2'"]),
    ("fedlama_phi_zero", ["--config.schedule=fedlama", "--config.fedlama.phi=0"],
     ["config.fedlama.phi"]),
    ("clock_with_scaffold", ["--config.algorithm=scaffold", "--config.system.clock=True"],
     ["config.algorithm='scaffold'"]),
    ("unknown_flag", ["--foo=1"], ["foo"]),
    ("missing_data_files",
     ["--config.dataset=mnist", "--config.data_source=files", "--config.data_dir={nodata}"],
     ["{nodata}", "train-images-idx3-ubyte.gz"]),
    ("workdir_under_a_file", ["--workdir={afile}/run"], ["{afile}", "under a file"]),
    ("workdir_holds_another_run", ["--config.local_lr=0.05", "--workdir={rundir}"],
     ["{rundir}", "fields: local_lr"]),
    ("workdir_holds_a_longer_run", ["--config.rounds=10", "--workdir={rundir}"],
     ["{rundir}", "fields: rounds"]),
]


def _run_workdir(tmp: pathlib.Path) -> pathlib.Path:
  """A workdir holding the files of a run of configs/default.py (as a first run writes
  them) and a file of the user's."""
  from configs import default  # pylint: disable=g-import-not-at-top
  workdir = tmp / "existing_run"
  (workdir / "checkpoints").mkdir(parents=True)
  (workdir / "config.json").write_text(
      json.dumps(json.loads(default.get_config().to_json_best_effort(sort_keys=True)),
                 indent=2, sort_keys=True) + "\n")
  (workdir / "metrics.jsonl").write_text('{"round": 5, "test_accuracy": 0.5}\n')
  (workdir / "notes.txt").write_text("the user's own notes\n")
  return workdir


def _snapshot(folder: pathlib.Path) -> dict:
  return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
          for p in sorted(folder.rglob("*"))}


def _run_main(args, env_extra=None):
  env = dict(os.environ, JAX_PLATFORMS="cpu", **(env_extra or {}))
  env.pop("FEDJAX_LAMA_DEBUG", None)
  env.update(env_extra or {})
  return subprocess.run([sys.executable, "-m", "experiments.main", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300)


def _check_case(tmp_path, args, names):
  """Runs one case and checks it; returns the process's output (stdout, then stderr)."""
  paths = _config_files(tmp_path)
  workdir = tmp_path / "existing"
  workdir.mkdir()
  (workdir / "notes.txt").write_text("the user's own notes\n")
  afile = tmp_path / "afile"
  afile.write_text("not a directory\n")
  fill = dict(paths, rundir=str(_run_workdir(tmp_path)), afile=str(afile),
              nodata=str(tmp_path / "nodata"))
  args = [a.format(**fill) for a in args]
  if not any(a.startswith("--config=") for a in args):
    args = [f"--config={DEFAULT}"] + args
  if not any(a.startswith("--workdir") for a in args):
    args = args + [f"--workdir={workdir}"]
  before = _snapshot(tmp_path)
  proc = _run_main(args)
  output = proc.stdout + proc.stderr
  assert proc.returncode == 2, output
  errors = [line for line in output.splitlines() if line.startswith("error:")]
  assert len(errors) == 1, output
  assert "Traceback" not in output, output
  for name in names:
    assert name.format(**fill) in errors[0], (name, errors[0])
  assert _snapshot(tmp_path) == before  # nothing written, nothing lost
  return output


@pytest.mark.parametrize("case_id,args,names", CASES, ids=[c[0] for c in CASES])
def test_bad_input_stops_with_one_line(tmp_path, case_id, args, names):
  del case_id
  _check_case(tmp_path, args, names)


@pytest.mark.slow
@pytest.mark.parametrize("case_id,args,names", SLOW_CASES, ids=[c[0] for c in SLOW_CASES])
def test_more_bad_input_stops_with_one_line(tmp_path, case_id, args, names):
  del case_id
  _check_case(tmp_path, args, names)


def test_unwritable_workdir_stops_with_one_line(tmp_path):
  """A directory this user cannot write in: a read-only directory, or (as root, whom
  permissions do not stop) a directory of the kernel's sysfs."""
  if os.geteuid() != 0:
    parent = tmp_path / "readonly"
    parent.mkdir()
    parent.chmod(0o555)
    workdir = parent / "run"
  else:
    workdir = pathlib.Path("/sys/fedjax_lama_run")
    try:
      (pathlib.Path("/sys") / ".fedjax_lama_probe").write_bytes(b"")
      os.remove("/sys/.fedjax_lama_probe")
      pytest.skip("no unwritable directory for root on this machine")
    except OSError:
      pass
  proc = _run_main([f"--config={DEFAULT}", f"--workdir={workdir}"])
  output = proc.stdout + proc.stderr
  errors = [line for line in output.splitlines() if line.startswith("error:")]
  assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in output, output
  assert str(workdir) in errors[0] and "cannot be written" in errors[0]
  assert not workdir.exists()


def test_debug_variable_shows_the_traceback(tmp_path):
  proc = _run_main([f"--config={DEFAULT}", "--config.seed=-1",
                    f"--workdir={tmp_path / 'w'}"], {"FEDJAX_LAMA_DEBUG": "1"})
  assert proc.returncode == 2
  assert "Traceback" in proc.stderr and "ConfigError" in proc.stderr
  assert [l for l in proc.stderr.splitlines() if l.startswith("error:")] == [
      "error: config.seed=-1 is not accepted; accepted: an integer >= 0"]


def test_a_dataset_and_its_options_can_both_be_set_on_the_command_line(tmp_path):
  """--config.dataset=femnist --config.dataset_options.format=leaf: the option is checked
  against the dataset set beside it (configs/default.py's dataset is digits, which has no
  options), so the run passes validation and stops only at the data: LEAF files, as asked."""
  workdir = tmp_path / "w"
  proc = _run_main([f"--config={DEFAULT}", "--config.dataset=femnist",
                    "--config.dataset_options.format=leaf", "--config.data_source=files",
                    f"--config.data_dir={tmp_path / 'nodata'}", f"--workdir={workdir}"])
  output = proc.stdout + proc.stderr
  errors = [line for line in output.splitlines() if line.startswith("error:")]
  assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in output, output
  assert "loading data: femnist" in output, output  # validation passed: the data was sought
  assert "LEAF FEMNIST" in errors[0] and str(tmp_path / "nodata") in errors[0], errors[0]
  assert not workdir.exists()
