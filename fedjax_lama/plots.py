"""Every figure a run writes, in one place.

Figures are built as matplotlib `Figure` objects (no pyplot state, so nothing leaks between
runs and tests can inspect them), then saved as PNG files into the run's workdir. Every
figure has a title (a run's names its algorithm and schedule, dataset, privacy and attack or
defence: `fedjax_lama.run.records.run_title`), axes say their units, accuracy axes span
[0, 1] whatever the run reached, legends sit beside the axes rather than on the data, and
virtual-time axes are in seconds from 0.

- Synchronous runs: accuracy against rounds and against communicated floats, and under
  differential privacy against the epsilon spent; with per-client test parts, the
  distribution of the clients' test accuracies (global and personal models).
- Runs on the simulated clock: accuracy against virtual time (s) with the per-client
  spread, and against communicated floats.
- FedLAMA (Lee et al., AAAI 2023): synchronisations and communicated floats per layer,
  named by layer (AAAI Figs. 4 and 5), and the interval-selection curves (arXiv v1 Fig. 1,
  AAAI Fig. 2).

matplotlib is imported when a figure is drawn, so importing this module stays cheap.
"""
import os
from typing import Optional, Sequence

import numpy as np

from fedjax_lama import metrics

ROUND_FILE = "accuracy_vs_round.png"
COMM_FILE = "accuracy_vs_comm.png"
EPSILON_FILE = "accuracy_vs_epsilon.png"
VIRTUAL_TIME_FILE = "accuracy_vs_virtual_time.png"
LAYER_COMM_FILE = "fedlama_layer_comm.png"
CURVES_FILE = "fedlama_curves.png"
CLIENT_ACCURACY_FILE = "client_test_accuracy.png"


def _figure(width: float, height: float, ncols: int = 1):
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = Figure(figsize=(width, height), dpi=100)
  axes = fig.subplots(1, ncols)
  return fig, axes


def _legend_beside(ax) -> None:
  """The legend right of the axes, off the data."""
  ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=7)


def save(fig, path: str) -> str:
  """Writes `fig` as a PNG (the legend beside the axes included)."""
  fig.savefig(path, bbox_inches="tight")
  return path


def _finite(records, key):
  return [r for r in records if r.get(key) is not None and np.isfinite(r[key])]


def _titled(title: str, what: str) -> str:
  """A figure's title: what it shows after the run's first line (algorithm and dataset); the
  run's further lines (privacy, attack and defence) below."""
  first, _, rest = title.partition("\n")
  return f"{first}: {what}" + (f"\n{rest}" if rest else "")


def _accuracy_axis(ax, label: str) -> None:
  """An accuracy axis from 0 to 1, so that figures of different runs compare at a glance."""
  ax.set_ylabel(label)
  ax.set_ylim(0.0, 1.0)


# ---- synchronous runs --------------------------------------------------------------------------
def accuracy_figure(xs: Sequence[float], accuracy: Sequence[float], xlabel: str, title: str):
  fig, ax = _figure(5.5, 3.5)
  ax.plot(xs, accuracy, marker=".")
  ax.set_xlabel(xlabel)
  _accuracy_axis(ax, "test accuracy")
  ax.set_title(title)
  ax.grid(alpha=0.3)
  return fig


def run_figures(records: Sequence[dict], title: str) -> dict:
  """{file name: Figure}: test accuracy against rounds and against communicated floats, and
  against the epsilon spent when the records carry `dp_epsilon` (a DP run with noise)."""
  records = _finite(records, "test_accuracy")
  if not records:
    return {}
  acc = [r["test_accuracy"] for r in records]
  figures = {
      ROUND_FILE: accuracy_figure([r["round"] for r in records], acc, "round",
                                  _titled(title, "test accuracy by round")),
      COMM_FILE: comm_figure(records, title),
  }
  private = _finite(records, "dp_epsilon")
  if private:
    figures[EPSILON_FILE] = epsilon_figure(private, title)
  return figures


def epsilon_figure(records: Sequence[dict], title: str):
  """Test accuracy against the privacy spent: each evaluation's `dp_epsilon`, the epsilon of
  the rounds done so far at the run's delta."""
  return accuracy_figure([r["dp_epsilon"] for r in records],
                         [r["test_accuracy"] for r in records],
                         "epsilon spent (at the run's delta)",
                         _titled(title, "test accuracy by privacy spent"))


def comm_figure(records: Sequence[dict], title: str):
  """Test accuracy against the floats communicated so far (up + down)."""
  return accuracy_figure([r["comm_floats_up"] + r["comm_floats_down"] for r in records],
                         [r["test_accuracy"] for r in records],
                         "floats communicated (up + down)",
                         _titled(title, "test accuracy by communication"))


def run_plots(workdir: str, records: Sequence[dict], title: str) -> list[str]:
  """The PNG files of a synchronous run, in workdir; returns their paths."""
  return [save(fig, os.path.join(workdir, name))
          for name, fig in run_figures(records, title).items()]


def client_accuracy_figure(accuracy: dict, title: str):
  """Per-client test accuracy, each model's clients sorted from worst to best (x: the
  fraction of clients at or below), for the global model and, when evaluated, the personal
  models: the whole distribution, the worst clients at the left."""
  fig, ax = _figure(5.5, 3.5)
  for model, values in accuracy.items():
    values = np.sort(np.asarray(values, np.float64)[np.isfinite(values)])
    if values.size == 0:
      continue
    # Client k (sorted) spans [k/N, (k+1)/N): a step per client across the whole axis.
    share = np.arange(values.size + 1) / values.size
    ax.step(share, np.append(values, values[-1]), where="post",
            label=f"{model} model ({values.size} clients)")
  ax.set_xlabel("fraction of clients (sorted by accuracy)")
  _accuracy_axis(ax, "client test accuracy")
  ax.set_xlim(0.0, 1.0)
  ax.set_title(_titled(title, "per-client test accuracy"))
  ax.grid(alpha=0.3)
  _legend_beside(ax)
  return fig


def client_accuracy_plot(workdir: str, accuracy: dict, title: str) -> str:
  """CLIENT_ACCURACY_FILE in workdir from {"global": [N], "personal": [N]} accuracies."""
  return save(client_accuracy_figure(accuracy, title),
              os.path.join(workdir, CLIENT_ACCURACY_FILE))


# ---- runs on the simulated clock ---------------------------------------------------------------
def virtual_time_figure(records: Sequence[dict], title: str):
  """Pooled test accuracy and the per-client mean +- std against virtual time in seconds."""
  t = np.array([r["virtual_time"] for r in records], np.float64)
  acc = np.array([r["test_accuracy"] for r in records], np.float64)
  mean = np.array([r["client_test_accuracy_mean"] for r in records], np.float64)
  std = np.sqrt(np.array([r["client_test_accuracy_var"] for r in records], np.float64))
  fig, ax = _figure(6.5, 3.5)
  ax.plot(t, acc, marker=".", label="accuracy (pooled local test sets)")
  ax.fill_between(t, mean - std, mean + std, alpha=0.2, label="per-client mean ± std")
  ax.set_xlabel("virtual time (s)")
  _accuracy_axis(ax, "test accuracy")
  ax.set_xlim(0.0, max(float(t.max()) if t.size else 0.0, 1e-9))
  ax.set_title(_titled(title, "test accuracy over virtual time"))
  ax.grid(alpha=0.3)
  _legend_beside(ax)
  return fig


def clock_figures(records: Sequence[dict], title: str) -> dict:
  """{file name: Figure} of a run on the clock (its x axes are time and traffic, not rounds:
  its evaluations are ticks of virtual time)."""
  records = _finite(records, "test_accuracy")
  if not records:
    return {}
  return {
      VIRTUAL_TIME_FILE: virtual_time_figure(records, title),
      COMM_FILE: comm_figure(records, title),
  }


def clock_plots(workdir: str, records: Sequence[dict], title: str) -> list[str]:
  return [save(fig, os.path.join(workdir, name))
          for name, fig in clock_figures(records, title).items()]


# ---- FedLAMA -----------------------------------------------------------------------------------
def layer_comm_figure(names: Sequence[str], sizes: Sequence[int], counts: Sequence[int]):
  """Synchronisations c_l and floats s_l * c_l of every layer, bars labelled by layer name."""
  counts = np.asarray(counts)
  positions = np.arange(len(counts))
  fig, axes = _figure(max(10.0, 0.6 * len(counts) + 4.0), 4.0, ncols=2)
  for ax, values, ylabel, title in (
      (axes[0], counts, "synchronisations c_l", "synchronisations per layer"),
      (axes[1], counts * np.asarray(sizes), "floats communicated s_l * c_l (log)",
       "floats communicated per layer")):
    ax.bar(positions, values)
    ax.set_xticks(positions)
    ax.set_xticklabels(list(names), rotation=45, ha="right", fontsize=7)
    ax.set_xlabel("layer")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
  axes[1].set_yscale("log")
  fig.suptitle("FedLAMA: per-layer communication")
  fig.tight_layout()
  return fig


def selection_curves_figure(records: Sequence[dict], rule: str):
  """delta_k and 1 - lambda_k (lambda_k for the v1 rules) against k at up to four logged
  window ends. For "aaai" the layers left of the crossing get the long interval."""
  records = [r for r in records if r.get("fedlama_delta")]
  if not records:
    return None
  picks = records if len(records) <= 4 else [records[i] for i in
                                             np.linspace(0, len(records) - 1, 4).astype(int)]
  v1 = rule in ("v1", "accelerate")
  fig, ax = _figure(7.5, 4.0)
  for r in picks:
    k = np.arange(1, len(r["fedlama_delta"]) + 1)
    line, = ax.plot(k, r["fedlama_delta"], label=f"delta, step {r['local_steps']}")
    lam = np.asarray(r["fedlama_lambda"])
    ax.plot(k, lam if v1 else 1 - lam, "--", color=line.get_color(),
            label=("lambda" if v1 else "1 - lambda") + f", step {r['local_steps']}")
  ax.set_xlabel("k (layers in the rule's order)")
  ax.set_ylabel("fraction")
  ax.set_title(f"FedLAMA selection curves (rule {rule!r})")
  ax.grid(alpha=0.3)
  _legend_beside(ax)
  return fig


def fedlama_plots(workdir: str, names: Sequence[str], sizes: Sequence[int],
                  counts: Optional[Sequence[int]], rule: str) -> list[str]:
  """FedLAMA's per-layer bars and selection curves (read from workdir/metrics.jsonl)."""
  paths = []
  if counts is not None:
    paths.append(save(layer_comm_figure(names, sizes, counts),
                      os.path.join(workdir, LAYER_COMM_FILE)))
  records = metrics.JsonlWriter(os.path.join(workdir, "metrics.jsonl")).read()
  fig = selection_curves_figure(records, rule)
  if fig is not None:
    paths.append(save(fig, os.path.join(workdir, CURVES_FILE)))
  return paths
