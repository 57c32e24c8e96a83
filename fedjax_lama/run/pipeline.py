"""train_and_evaluate: config -> validation -> RunSpec -> the loop, on one page.

Running it again on the same workdir resumes from the last checkpoint with exactly the
parameters and metrics of an uninterrupted run; running it with a larger config.rounds
extends a finished run to what an uninterrupted run of that length gives. Every input is
checked before any data is loaded where it can be (the config as given, the workdir, the run
it may hold), and nothing in a workdir is removed or overwritten by a run that stops on an
error.
"""
from typing import Optional

import ml_collections

from fedjax_lama.run import clock, parts as parts_lib, records as records_lib
from fedjax_lama.run import spec as spec_lib, workdir as workdir_lib


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       stop_after_round: Optional[int] = None) -> dict:
  """Runs (or resumes) the experiment described by `config`, writing into `workdir`.

  stop_after_round: stop after that round (on the clock: that evaluation tick) as if
  interrupted (used to test resume). Returns the summary dict (also in workdir/summary.json).
  """
  spec = spec_lib.build_spec(config)  # the config as given, validated and read once
  workdir, extended = workdir_lib.check(workdir, spec)  # before any data is loaded
  parts = parts_lib.prepare(spec)
  return TRAIN[spec.mode](spec, parts, workdir, extended, stop_after_round)


def train_rounds(spec, parts: parts_lib.Parts, workdir: str, extended: Optional[int],
                 stop_after_round: Optional[int]) -> dict:
  """Synchronous rounds (FedLAMA's schedule included) of the round program, recorded."""
  program = parts_lib.program(spec, parts)
  # The program's params: the trainable set, what travels and is counted (models/lora.py).
  run = records_lib.Run(spec.records, workdir, program, parts.fed, program.params)
  state = run.restore(program.init_state(), extended_from=extended)
  try:
    for round_idx in range(run.start_round, program.num_rounds):
      run.before_round(round_idx)
      state, out = program.run_round(state, round_idx)
      run.after_round(state, round_idx, out)
      if stop_after_round is not None and round_idx >= stop_after_round:
        return {"interrupted_after_round": round_idx}
  finally:
    run.close()
  return run.finish(state)


# How each mode (spec.MODES, decided once by build_spec) trains.
TRAIN = {"synchronous": train_rounds, "fedlama": train_rounds, "clock": clock.train}
