"""train_many: several runs, each written to its own workdir exactly as train_and_evaluate
writes it; runs of one synchronous config that differ only in seed and local_lr train
together as one jitted computation per round (programs/vectorized.py)."""
from fedjax_lama.run import parts as parts_lib, pipeline, records as records_lib
from fedjax_lama.run import spec as spec_lib, workdir as workdir_lib
from fedjax_lama.run.records import DivergenceError

# Fields vectorized runs may differ in (programs/vectorized.py); the rest must be equal.
VECTORIZABLE_FIELDS = ("seed", "local_lr")


def _vectorizable(specs) -> bool:
  """Runs of one synchronous config differing only in seed and local_lr (and where it lands)."""
  if len(specs) < 2 or any(s.mode != "synchronous" for s in specs):
    return False
  if any(s.robust is not None and s.robust.attack == "backdoor" for s in specs):
    # The backdoor's poisoning of its clients' batches is a constant of each run's program
    # (RunOptions.poison, from that seed's attackers): one program per run.
    return False
  if any(s.records.local_test_fraction > 0 for s in specs):
    return False  # personal models and fine-tuning are evaluated by each run's own program
  if any(s.options.trainable for s in specs):
    return False  # each seed's frozen base is its own (models/lora.py): one program per run
  ignore = set(VECTORIZABLE_FIELDS) | set(workdir_lib.RESUMABLE_CHANGES)
  same = lambda s: {k: v for k, v in s.records.config_json.items() if k not in ignore}
  return all(same(s) == same(specs[0]) for s in specs[1:])


class _RunView:
  """One run of a vectorized program, as the run loop sees a program."""

  def __init__(self, program, index: int):
    self.vec, self.index, self.mesh = program, index, program.mesh
    self.eval_fn, self.num_rounds, self.eval_every = (program.eval_fn, program.num_rounds,
                                                      program.eval_every)

  def eval_params(self, state):
    return self.vec.eval_params(state)

  def local_steps_done(self, round_idx: int) -> int:
    return self.vec.local_steps_done(round_idx)

  def host_state(self) -> dict:
    return {}

  def load_host_state(self, d: dict) -> None:
    del d

  def summary(self, state, ledger) -> dict:
    del state, ledger
    return {"vectorized_runs": self.vec.num_runs}

  def plot(self, workdir, ledger) -> None:
    del workdir, ledger


def _one_after_another(configs, workdirs) -> list:
  outcomes = []
  for c, w in zip(configs, workdirs):
    try:
      outcomes.append(pipeline.train_and_evaluate(c, w))
    except DivergenceError as e:
      outcomes.append(e)
  return outcomes


def train_many(configs, workdirs) -> list:
  """Several runs, each written to its own workdir exactly as train_and_evaluate writes it.

  Runs of one synchronous config that differ only in seed and local_lr (a paper's seeds and
  learning-rate grid) train together as ONE jitted computation per round, with a run axis
  beside the client axis (programs/vectorized.py); they resume together when every workdir
  stopped at the same round. Any other set of runs, or workdirs at different rounds, runs
  one after another. A run that diverges is returned as its DivergenceError, in its place;
  the others go on.
  """
  from fedjax_lama.programs.vectorized import VectorizedSyncProgram  # pylint: disable=g-import-not-at-top
  specs = []
  for c, w in zip(configs, workdirs):
    specs.append(spec_lib.build_spec(c))
    workdir_lib.check_workdir_usable(w)
  if not _vectorizable(specs):
    return _one_after_another(configs, workdirs)
  prepared = [parts_lib.prepare(s) for s in specs]
  opts0 = parts_lib.federated_options(specs[0].options, specs[0].data.augmentation,
                                      prepared[0].fed)
  mesh = parts_lib.client_mesh(opts0.batch_size, prepared[0], parts_lib.chunk_cap(opts0))
  programs = [parts_lib.program(s, p, mesh) for s, p in zip(specs, prepared)]
  if any(not p.vectorizable or p.chunk_size < p.opts.sampler.max_cohort
         for p in programs):  # chunked or scheduled rounds: one after another
    return _one_after_another(configs, workdirs)
  vec = VectorizedSyncProgram([p.opts for p in programs], programs[0].algorithm,
                              prepared[0].model, [p.params for p in prepared],
                              [p.model_state for p in prepared],
                              [p.fed for p in programs],  # what the clients train on
                              mesh)
  for s, w in zip(specs, workdirs):
    workdir_lib.check_workdir(w, s.records, s.mode)
  runs = [records_lib.Run(s.records, w, _RunView(vec, i), p.fed, p.params)
          for i, (s, w, p) in enumerate(zip(specs, workdirs, prepared))]
  fresh = vec.init_state()
  states = [run.restore(vec.run_state(fresh, i)) for i, run in enumerate(runs)]
  if len({run.start_round for run in runs}) > 1:  # resumed from different rounds
    for run in runs:
      run.close()
    return _one_after_another(configs, workdirs)
  state = vec.stack_states(states)
  failed = {}  # a diverged run stops alone; the others go on
  try:
    for round_idx in range(runs[0].start_round, vec.num_rounds):
      for i, run in enumerate(runs):
        if i not in failed:
          run.before_round(round_idx)
      state, outs = vec.run_round(state, round_idx)
      for i, (run, out) in enumerate(zip(runs, outs)):
        if i in failed:
          continue
        try:
          run.after_round(vec.run_state(state, i), round_idx, out)
        except DivergenceError as e:
          failed[i] = e
  finally:
    for run in runs:
      run.close()
  return [failed[i] if i in failed else run.finish(vec.run_state(state, i))
          for i, run in enumerate(runs)]
