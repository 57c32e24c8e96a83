"""experiments/notebook.ipynb runs end to end, in its smoke setting; its install helpers and
its written-out config agree with the repository.

The notebook is executed with nbclient in a fresh kernel of this interpreter, from a
temporary working directory, with FEDJAX_LAMA_NOTEBOOK_SMOKE=1 (a few rounds, one seed) and
its outputs sent to a temporary folder; the install source is this checkout's path
(FEDJAX_LAMA_SOURCE) and the package is found through PYTHONPATH, so the notebook's install
cell must see the project importable and install nothing.
"""
import json
import os
import pathlib
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "experiments" / "notebook.ipynb"
CELL_TIMEOUT_S = 300
KERNEL = "fedjax_lama_notebook_test"


def _kernel_spec(root: pathlib.Path) -> str:
  """A kernelspec that runs ipykernel under this very interpreter (whatever `python3` means
  to Jupyter elsewhere); returns the JUPYTER_PATH entry that holds it."""
  spec_dir = root / "kernels" / KERNEL
  spec_dir.mkdir(parents=True)
  (spec_dir / "kernel.json").write_text(json.dumps({
      "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
      "display_name": "fedjax_lama test", "language": "python"}))
  return str(root)


def _tagged_cell(tag: str) -> dict:
  """The names a code cell of the notebook defines, run in a namespace of their own."""
  nb = nbformat.read(str(NOTEBOOK), as_version=4)
  (cell,) = [c for c in nb.cells if tag in c.metadata.get("tags", [])]
  namespace = {"os": os, "__name__": "notebook_cell"}
  exec(compile(cell.source, f"notebook cell {tag}", "exec"), namespace)  # pylint: disable=exec-used
  return namespace


def test_written_out_config_is_the_repositorys():
  from configs import fedlama_digits  # pylint: disable=g-import-not-at-top
  assert _tagged_cell("digits_config")["digits_config"]() == fedlama_digits.get_config()


def test_install_command_for_a_wheel_a_checkout_and_a_url(tmp_path):
  install_command = _tagged_cell("install_helpers")["install_command"]
  pip = [sys.executable, "-m", "pip", "install", "-q"]
  assert install_command(str(REPO)) == pip + ["-c", str(REPO / "constraints.txt"), str(REPO)]
  assert install_command(str(tmp_path)) == pip + [str(tmp_path)]  # no constraints file there
  wheel = tmp_path / "fedjax_lama-0.1.0-py3-none-any.whl"
  wheel.write_bytes(b"")
  assert install_command(str(wheel)) == pip + [str(wheel)]
  url = "git+https://example.org/fedjax_lama.git"
  assert install_command(url) == pip + [url]
  for source in ("", str(tmp_path / "missing.whl"), str(tmp_path / "nothing_here")):
    with pytest.raises(ValueError, match="set FEDJAX_LAMA_SOURCE"):
      install_command(source)


def test_notebook_is_clean_and_full_by_default():
  nb = nbformat.read(str(NOTEBOOK), as_version=4)
  nbformat.validate(nb)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert all(not c.outputs and c.execution_count is None for c in code), \
      "commit the notebook without outputs"
  params = code[0]
  assert "parameters" in params.metadata.get("tags", [])
  assert "SMOKE = False" in params.source  # the fuller setting unless smoke is asked for
  assert "FEDJAX_LAMA_NOTEBOOK_SMOKE" in params.source


# In the default suite, not under -m slow: the README says CI executes the notebook, and
# .ci/run runs the default suite.
def test_notebook_runs_in_smoke_setting(tmp_path, monkeypatch):
  work = tmp_path / "cwd"
  out = tmp_path / "out"
  work.mkdir()
  monkeypatch.setenv("FEDJAX_LAMA_NOTEBOOK_SMOKE", "1")
  monkeypatch.setenv("FEDJAX_LAMA_NOTEBOOK_OUT", str(out))
  monkeypatch.setenv("FEDJAX_LAMA_SOURCE", str(REPO))  # what CI would install from
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
      [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
  monkeypatch.setenv("JUPYTER_PATH", _kernel_spec(tmp_path / "jupyter"))

  nb = nbformat.read(str(NOTEBOOK), as_version=4)
  client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name=KERNEL,
                                   resources={"metadata": {"path": str(work)}})
  client.execute()  # raises CellExecutionError, naming the cell, if any cell fails

  code = [c for c in nb.cells if c.cell_type == "code"]
  outputs = [o for c in code for o in c.outputs]
  assert not [o for o in outputs if o.output_type == "error"]
  text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
  assert "setting: smoke" in text
  assert f"install source: {REPO}" in text
  assert "nothing to install" in text  # found through PYTHONPATH: no pip
  assert "backend:" in text  # the device cell ran
  for method in ("FedAvg", "FedLAMA", "FedSpeed"):
    assert f"{method:8s} seed 0: final test accuracy" in text
  images = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.data]
  assert len(images) == 3  # accuracy vs local steps, vs communication, FedLAMA per layer

  summary = json.loads((out / "summary.json").read_text())
  assert summary["smoke"] is True and summary["total_steps"] == 40
  assert set(summary["methods"]) == {"FedAvg", "FedLAMA", "FedSpeed"}
  for row in summary["methods"].values():
    assert 0.0 <= row["final_test_accuracy_mean"] <= 1.0
    assert row["local_steps"] == 40 and row["comm_floats"] > 0
  # FedLAMA communicates less than FedAvg over the same local steps (phi = 2).
  assert summary["methods"]["FedLAMA"]["comm_vs_fedavg"] < 1.0
  assert summary["methods"]["FedAvg"]["comm_vs_fedavg"] == 1.0
  for name in ("accuracy_vs_local_steps", "accuracy_vs_comm", "fedlama_layer_comm"):
    png = out / f"{name}.png"
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
  for method in ("FedAvg", "FedLAMA", "FedSpeed"):
    records = (out / "smoke" / f"{method}_seed0" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["local_steps"] for r in records] == [10, 20, 30, 40]
  assert not list(work.iterdir())  # everything went to the output folder
