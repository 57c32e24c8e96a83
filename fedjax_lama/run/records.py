"""The run's bookkeeping in a workdir: config.json, metrics.jsonl (and TensorBoard events),
orbax checkpoints, the communication ledger, the host counters, evaluation and the summary.

Everything not in a checkpoint (cohorts, batches, keys) is derived from (seed, round), so a
run restored from its latest checkpoint ends with exactly the parameters and records of an
uninterrupted one; an extended run's records equal those of an uninterrupted longer run.
"""
import json
import math
import os
import time
from typing import Optional

import jax
import numpy as np

from fedjax_lama import checkpointing, comm, divergence, errors, metrics, plots, progress
from fedjax_lama import data as fdata
from fedjax_lama.algorithms import layer_partition
from fedjax_lama.engine import evaluate as evaluation
from fedjax_lama.engine import personal_eval
from fedjax_lama.errors import TrainingError
from fedjax_lama.privacy import dp_options, dp_stage as privacy_stage
from fedjax_lama.run import workdir as workdir_lib


class DivergenceError(errors.TrainingDiverged):
  """A training loss, evaluation metric or parameter became non-finite, or the training loss
  grew past config.max_loss_growth times the run's starting one: the run stops.
  Deterministic: resuming the same config diverges again at the same round."""

# The host counter of the run's starting training loss (its first round that trained anyone),
# the reference of config.max_loss_growth; checkpointed with the other host counters.
START_LOSS = "start_train_loss"


class Run:
  """One run's workdir and counters.

  `program` is the run's round program, or a view of one run of a vectorized program: it
  answers eval_fn, eval_params(state), local_steps_done(r), num_rounds, eval_every,
  host_state(), load_host_state(d), summary(state, ledger) and plot(workdir, ledger).
  """

  def __init__(self, records, workdir: str, program, fed, params):
    self.records_options, self.workdir, self.program, self.fed = records, workdir, program, fed
    self.primary = jax.process_index() == 0  # multi-host: one writer of the plain files
    workdir_lib.make(workdir)
    config_path = os.path.join(workdir, workdir_lib.CONFIG_FILE)
    if self.primary and not os.path.exists(config_path):
      metrics.write_json(config_path, records.config_json)
    self.ledger = comm.Ledger(*comm.layer_table(params))
    self.writer = metrics.JsonlWriter(os.path.join(workdir, workdir_lib.METRICS_FILE))
    self.ckpt_dir = os.path.join(workdir, workdir_lib.CHECKPOINTS)
    self.ckpt = checkpointing.Checkpointer(self.ckpt_dir)
    self.start_round, self.wall_offset = 0, 0.0
    self.host = {"best_test_accuracy": None, "loss_sum": 0.0, "loss_count": 0.0,
                 START_LOSS: None}
    self.records, self.tensorboard = [], None
    # The backdoor's test set (robust_stage.Backdoor.test_set), triggered once on the host.
    self.backdoor_test = (records.backdoor.test_set(fed.dataset)
                          if records.backdoor is not None else None)
    # The layers fine-tuning moves are names of this model's layers: checked before training.
    frozen = finetune_frozen(records.finetune_layers)
    if frozen is not None:
      frozen(params)
    self.personal_evaluator = None    # built at the first per-client evaluation on test parts
    self.last_client_accuracy = None  # {"global": [N], "personal": [N]} of the last one

  def restore(self, state, extended_from: Optional[int] = None):
    """The state to continue from: the latest checkpoint's, else `state` (a fresh start).

    extended_from: the rounds of the finished run that config.rounds now extends; the
    final round's extra records are dropped so that the records equal an uninterrupted run's.
    """
    latest = self.ckpt.latest_step()
    if latest is not None:
      with progress.Phase(f"restoring the checkpoint of round {latest + 1} from {self.workdir}"):
        state, meta = self.ckpt.restore(latest, state)
      self.start_round = meta["round"] + 1
      self.wall_offset = meta["wall_seconds"]
      self.ledger.load(meta["ledger"])
      self.host = meta["host"]
      self.program.load_host_state(meta.get("program", {}))
      self.records = _records_up_to(self.writer, meta["round"] + 1, self.primary)
      if START_LOSS not in self.host:  # a checkpoint written before the growth check: the
        # training loss of the first record (the mean over the rounds up to it) stands in
        first = self.records[0].get("train_loss") if self.records else None
        self.host[START_LOSS] = first if first else None  # 0: no round had trained anyone
      if extended_from is not None:
        self._forget_final_evaluation(extended_from)
        progress.info("extending the run of %d rounds in %s to %d rounds", extended_from,
                      self.workdir, self.records_options.rounds)
      progress.info("resuming after round %d of %d", meta["round"] + 1, self.program.num_rounds)
    else:
      self.records = _records_up_to(self.writer, -1, self.primary)
    if self.primary and self.records_options.tensorboard:
      self.tensorboard = metrics.TensorBoardWriter(
          os.path.join(self.workdir, "tensorboard"),
          purge_step=metrics.resume_purge_step(self.records) if latest is not None else None)
    self.t_start = time.perf_counter()
    self.train_seconds, self.eval_seconds, self.first_round_seconds = 0.0, None, 0.0
    return state

  def _forget_final_evaluation(self, old_rounds: int) -> None:
    """The per-client evaluation of a run's last round (config.per_client_eval="final") is
    no longer the last one once the run goes on: its record loses those fields."""
    if self.records_options.per_client_eval != "final" or not self.records:
      return
    last = self.records[-1]
    if last["round"] != old_rounds or not any(k.startswith("client_") for k in last):
      return
    self.records[-1] = {k: v for k, v in last.items() if not k.startswith("client_")}
    if self.primary:  # the records were read back from this file: plain JSON values
      tmp = self.writer.path + ".tmp"
      with open(tmp, "w") as f:
        f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in self.records)
      os.replace(tmp, self.writer.path)  # atomic, as every rewrite of the records

  def wall(self) -> float:
    return self.wall_offset + time.perf_counter() - self.t_start

  def _evaluations_after(self, round_idx: int) -> int:
    """Evaluations still to come after round `round_idx` (the last round always evaluates)."""
    program = self.program
    total = program.num_rounds
    regular = sum(1 for r in range(round_idx + 1, total) if (r + 1) % program.eval_every == 0)
    return regular + (0 if total % program.eval_every == 0 or round_idx >= total - 1 else 1)

  def before_round(self, round_idx: int) -> None:
    if round_idx == self.start_round:
      progress.info("round %d/%d: compiling the round program, then training (the first "
                    "round of a process includes the one-time compilation)", round_idx + 1,
                    self.program.num_rounds)
    self.round_started = time.perf_counter()

  def _rerun(self) -> str:
    latest = self.ckpt.latest_step()
    return divergence.rerun_statement(None if latest is None else f"round {latest + 1}",
                                      self.ckpt_dir)

  def _advice(self) -> str:
    options = self.records_options
    advice = (f"try a smaller config.local_lr (now {options.local_lr}) or config.server_lr "
              f"(now {options.server_lr_text})")
    if options.privacy is not None:
      advice += (f", or a larger expected cohort: under differential privacy the noise std on "
                 f"the averaged update is {dp_options.noise_std_on_mean(options.privacy):.4g} "
                 f"beside the clip C = {options.privacy.clip_norm:g}")
    return advice

  def _diverged(self, where: str, quantities: dict, state) -> None:
    """Stops the run when a quantity or the global model is not finite (before any checkpoint
    of this round is written, so every checkpoint on disk is finite)."""
    divergence.check(where, quantities, self.program.eval_params(state), self._rerun,
                     self._advice(), error=DivergenceError)

  def _grown(self, where: str, out) -> None:
    """Stops the run when the round's training loss exceeds config.max_loss_growth times the
    run's starting loss, the first round's that trained anyone (an empty Poisson draw trains
    nobody). Checked before the round's checkpoint, as `_diverged`."""
    if out.train_count <= 0:
      return
    start = self.host.get(START_LOSS)
    if start is None:
      if out.train_loss > 0:
        self.host[START_LOSS] = float(out.train_loss)
      return
    divergence.check_growth(where, float(out.train_loss), start,
                            self.records_options.max_loss_growth, "config.max_loss_growth",
                            self._rerun, self._advice(), error=DivergenceError)

  def after_round(self, state, round_idx: int, out) -> None:
    """Accounting, divergence checks, evaluation and checkpoint of a finished round."""
    self._account(state, round_idx, out)
    last = round_idx == self.program.num_rounds - 1
    if (round_idx + 1) % self.program.eval_every == 0 or last:
      self._evaluate(state, round_idx, out, last)
    if (round_idx + 1) % self.records_options.checkpoint_every == 0 or last:
      self.ckpt.save(round_idx, state, {"round": round_idx, "wall_seconds": self.wall(),
                                        "ledger": self.ledger.dump(), "host": self.host,
                                        "program": self.program.host_state()})

  def _account(self, state, round_idx: int, out) -> None:
    """The round's time, its training loss (checked finite) and its traffic."""
    seconds = time.perf_counter() - self.round_started
    self.train_seconds += seconds
    if round_idx == self.start_round:
      self.first_round_seconds = seconds
      progress.info("round %d/%d: trained in %.1fs (compilation included)", round_idx + 1,
                    self.program.num_rounds, seconds)
    self._diverged(f"round {round_idx + 1}", {"train_loss": out.train_loss}, state)
    self._grown(f"round {round_idx + 1}", out)
    self.ledger.add(out.floats_up_per_layer, out.floats_down_per_layer, out.bytes, out.bits_up,
                    out.floats_up_other, out.floats_down_other)
    self.host["loss_sum"] += out.train_loss * out.train_count
    self.host["loss_count"] += out.train_count

  def _evaluate(self, state, round_idx: int, out, last: bool) -> None:
    """The round's record: evaluated, checked finite, written, and logged with the ETA."""
    per_client_eval, total = self.records_options.per_client_eval, self.program.num_rounds
    per_client = per_client_eval == "every" or (last and per_client_eval == "final")
    first = self.eval_seconds is None
    progress.info("round %d/%d: evaluating%s%s", round_idx + 1, total,
                  " (the first evaluation compiles)" if first else "",
                  ", with per-client accuracy" if per_client else "")
    started = time.perf_counter()
    record = evaluate(self.records_options.eval_batch_size, self.program, state, self.fed,
                      round_idx, out, self.host, self.ledger, self.wall(), per_client=per_client,
                      backdoor_test=self.backdoor_test,
                      client_test_metrics=self._client_test_metrics)
    if self.records_options.privacy is not None:  # the guarantee of the rounds done so far
      record["dp_epsilon"] = privacy_stage.epsilon_after(self.records_options.privacy,
                                                         round_idx + 1)
    self.eval_seconds = time.perf_counter() - started
    self._diverged(f"round {round_idx + 1}",
                   {k: record.get(k) for k in ("test_loss", "test_accuracy", "val_loss",
                                               "val_accuracy")}, state)
    self.records.append(record)
    if self.primary:
      self.writer.write(record)
      if self.tensorboard is not None:
        self.tensorboard.write(record)
    done = round_idx + 1 - self.start_round
    # The rate of the rounds after the first: the first one's compilation does not recur.
    trained = (self.train_seconds - self.first_round_seconds, done - 1) if done > 1 else (
        self.train_seconds, done)
    evaluations_left = self._evaluations_after(round_idx)
    eta = progress.eta_seconds(*trained, total - round_idx - 1, self.eval_seconds,
                               evaluations_left)
    progress.info("round %d/%d  test_acc %.4f  test_loss %.4f  train_loss %.4f  %.1fs  "
                  "ETA %.1fs", round_idx + 1, total, record["test_accuracy"],
                  record["test_loss"], record["train_loss"], record["wall_seconds"], eta)

  def _client_test_metrics(self, params, model_state, state, round_idx: int) -> dict:
    """The per-client test metrics of the global and personal models (run/personal_eval)."""
    if self.personal_evaluator is None:
      self.personal_evaluator = make_personal_evaluator(self.records_options, self.program,
                                                        self.fed)
    store = self.program.rows_store(state) if hasattr(self.program, "rows_store") else None
    server = self.program.server_state(state) if hasattr(self.program, "server_state") else None
    sums = self.personal_evaluator(params, model_state, store, round_idx, server=server)
    self.last_client_accuracy = {model: s.accuracy for model, s in sums.items()}
    return client_test_record(sums)

  def close(self) -> None:
    self.ckpt.close()
    if self.tensorboard is not None:
      self.tensorboard.close()

  def finish(self, state) -> dict:
    """summary.json and the plots of a completed run."""
    options = self.records_options
    summary = _summary(options, self.records, self.ledger, self.program, state, self.wall())
    if self.primary:
      path = os.path.join(self.workdir, workdir_lib.SUMMARY_FILE)
      with progress.Phase(f"writing {path}"):
        metrics.write_json(path, summary)
    if self.primary and options.plots:
      with progress.Phase(f"writing plots to {self.workdir}"):
        title = run_title(options, self.records)
        plots.run_plots(self.workdir, self.records, title=title)
        if self.last_client_accuracy is not None:  # under DP: outside the guarantee
          plots.client_accuracy_plot(
              self.workdir, self.last_client_accuracy,
              title=title + ("; per-client accuracies outside the guarantee"
                             if options.privacy is not None else ""))
        self.program.plot(self.workdir, self.ledger)
    return summary


def run_title(options, records) -> str:
  """The figures' title: the algorithm (and its schedule) and dataset, then, on a second line,
  the privacy (the epsilon spent at the last record, its delta and sigma) and the attack and
  defence, where the run has them."""
  method = options.algorithm + ("" if options.schedule == "none" else f" + {options.schedule}")
  conditions = []
  privacy = options.privacy
  if privacy is not None:
    spent = records[-1].get("dp_epsilon") if records else None
    conditions.append(
        f"DP epsilon {spent:.3g} at delta {privacy.delta:g} (sigma {privacy.noise_multiplier:.3g})"
        if spent is not None else "DP with sigma 0 (no finite epsilon)")
  if options.robust_label:
    conditions.append(options.robust_label)
  return f"{method} / {options.dataset}" + ("\n" + "; ".join(conditions) if conditions else "")


def _records_up_to(writer: metrics.JsonlWriter, done: int, primary: bool) -> list:
  """The records the checkpoint covers (rounds <= done); later ones are dropped from disk."""
  try:
    if primary:
      return writer.truncate_after(done)
    return [r for r in writer.read() if r["round"] <= done]
  except ValueError as e:
    raise TrainingError(f"cannot resume: {e}") from e


def evaluate(eval_batch_size, program, state, fed, round_idx, out, host, ledger, wall_seconds,
             per_client, backdoor_test=None, client_test_metrics=None) -> dict:
  """The record of round `round_idx`: test (and validation) metrics of the global model, the
  training loss averaged since the last evaluation, the traffic so far.

  backdoor_test: (x, y) of the backdoor's triggered test examples, whose accuracy is recorded
  as "backdoor_accuracy" (the attack's success rate).
  client_test_metrics: (params, model_state, state, round_idx) -> the per-client metrics on
  the clients' test parts (`client_test_record`); None: the global model's, evaluated here.
  """
  params, model_state = program.eval_params(state)
  ds = fed.dataset
  res = evaluation.evaluate(program.eval_fn, params, model_state, ds.test_x, ds.test_y,
                            eval_batch_size)
  best = host["best_test_accuracy"]
  host["best_test_accuracy"] = res.accuracy if best is None else max(best, res.accuracy)
  train_loss = host["loss_sum"] / max(host["loss_count"], 1.0)
  host["loss_sum"], host["loss_count"] = 0.0, 0.0
  record = {
      "round": round_idx + 1, "local_steps": program.local_steps_done(round_idx),
      "test_accuracy": res.accuracy, "test_loss": res.loss, "train_loss": train_loss,
      "wall_seconds": wall_seconds, **ledger.totals(), **out.extra}
  text = ds.input_kind == fdata.INPUT_TOKENS
  if text:
    record.update(next_token_metrics("test", res))
  if backdoor_test is not None:  # the same batched evaluation as the test accuracy
    record["backdoor_accuracy"] = evaluation.evaluate(
        program.eval_fn, params, model_state, *backdoor_test, eval_batch_size).accuracy
  if fed.validation is not None:
    val = evaluation.evaluate(program.eval_fn, params, model_state, fed.validation.x,
                              fed.validation.y, eval_batch_size)
    record.update(val_accuracy=val.accuracy, val_loss=val.loss)
    if text:
      record.update(next_token_metrics("val", val))
  if per_client and fed.client_test is not None:
    if client_test_metrics is None:
      def client_test_metrics(params, model_state, state, round_idx):
        evaluator = make_personal_evaluator(None, program, fed, eval_batch_size)
        return client_test_record(evaluator(params, model_state, None, round_idx,
                                            personal=False))
    record.update(client_test_metrics(params, model_state, state, round_idx))
  elif per_client:
    record.update(_per_client_train(eval_batch_size, program, params, model_state, fed))
  return record


def next_token_metrics(split: str, res: evaluation.EvalResult) -> dict:
  """A next-token task's metrics beside `{split}_accuracy` (every scored position) and
  `{split}_loss` (mean cross-entropy per scored token, in nats): `{split}_accuracy_last`,
  the accuracy of each window's last scored target (LEAF's Shakespeare metric: the
  character after the window; equal to the accuracy with one target per window), and
  `{split}_bits_per_token`, the loss in bits (bits per character on character data)."""
  return {f"{split}_accuracy_last": res.accuracy_last,
          f"{split}_bits_per_token": res.loss / math.log(2.0)}


def _per_client_train(eval_batch_size, program, params, model_state, fed) -> dict:
  """Global model accuracy per client on its training data (no held-out split): mean,
  variance and minimum across clients."""
  ds = fed.dataset
  res = evaluation.evaluate(program.eval_fn, params, model_state, ds.train_x, ds.train_y,
                            eval_batch_size)
  acc = evaluation.per_client_accuracy(res.correct, fed.client_train)
  acc = acc[np.isfinite(acc)]
  key = "client_train_accuracy"
  return {f"{key}_mean": float(acc.mean()), f"{key}_var": float(acc.var()),
          f"{key}_min": float(acc.min())}


def make_personal_evaluator(options, program, fed, eval_batch_size: Optional[int] = None):
  """The per-client evaluator of a run with test parts: the global model and, when the
  algorithm has `serve` or options.finetune_steps > 0, each client's own model.

  Chunks hold about eval_batch_size test examples (at least one client)."""
  ds = fed.dataset
  # The program's device copy of the training arrays, where it has one (no second copy).
  train_x = getattr(program, "data_x", ds.train_x)
  train_y = getattr(program, "data_y", ds.train_y)
  on_test = fed.client_test_in == "test"
  test_x, test_y = (ds.test_x, ds.test_y) if on_test else (train_x, train_y)
  width = max([1] + [len(p) for p in fed.client_test])
  eval_batch_size = eval_batch_size if options is None else options.eval_batch_size
  algorithm = getattr(program, "algorithm", None)
  # The clients' training parts: fine-tuning's batches and serve's training loss read them.
  finetune = dict(train_x=train_x, train_y=train_y, train_parts=fed.client_train)
  if options is not None and options.finetune_steps > 0:
    loss_fn = getattr(program, "loss_fn", None)
    if loss_fn is None:
      raise errors.ConfigError(
          f"config.finetune_steps={options.finetune_steps} is not accepted by this run's "
          "program (vectorized runs evaluate the global model only); accepted: 0")
    finetune.update(loss_fn=loss_fn, finetune_steps=options.finetune_steps,
                    finetune_lr=options.finetune_lr, batch_size=options.batch_size,
                    seed=options.seed, finetune_frozen=finetune_frozen(options.finetune_layers))
  return personal_eval.PersonalEvaluator(
      program.eval_fn, program.mesh, test_x=test_x, test_y=test_y, test_parts=fed.client_test,
      clients_per_chunk=max(1, eval_batch_size // width), eval_batch_size=eval_batch_size,
      serve=algorithm.serve if algorithm is not None else None,
      trainable=getattr(program, "trainable", None), **finetune)


def finetune_frozen(layers: str):
  """params -> the leaves fine-tuning leaves alone (personal_eval's `finetune_frozen`): every
  leaf outside the layers config.finetune_layers names; None when it is "" (every leaf
  moves). A name that is not a layer of the model stops with a ConfigError."""
  if not layers.strip():
    return None

  def frozen(params):
    moved = layer_partition.select_names(params, layer_partition.names(layers),
                                         "config.finetune_layers", layers,
                                         "or '' (every layer)")
    return layer_partition.as_tree(~moved, params)

  return frozen


def client_test_record(sums: dict) -> dict:
  """The record's per-client test metrics (personal_eval.metric_name) of {"global": ClientSums,
  "personal": ClientSums (when evaluated)}; also the global model's mean, variance and
  minimum under their earlier names (client_test_accuracy_{mean,var,min})."""
  record = {}
  for model, model_sums in sums.items():
    for stat, value in personal_eval.summarize(model_sums).items():
      record[personal_eval.metric_name(model, stat)] = value
  acc = sums["global"].accuracy
  acc = acc[np.isfinite(acc)]
  if acc.size == 0:  # no client has test data
    acc = np.array([np.nan])
  record.update(client_test_accuracy_mean=float(acc.mean()),
                client_test_accuracy_var=float(acc.var()),
                client_test_accuracy_min=float(acc.min()))
  return record


def _summary(options, records, ledger, program, state, wall_seconds) -> dict:
  accs = [r["test_accuracy"] for r in records]
  last = records[-1]
  summary = {
      "algorithm": options.algorithm, "dataset": options.dataset, "model": options.model,
      "final_test_accuracy": accs[-1], "best_test_accuracy": max(accs),
      "final_test_loss": last["test_loss"], "rounds": program.num_rounds,
      "local_steps": last["local_steps"], "wall_seconds": wall_seconds,
      "num_parameters": int(sum(ledger.sizes)), "client_devices": program.mesh.size,
      **ledger.totals(), "comm_floats_up_per_layer": dict(zip(ledger.names, ledger.up.tolist())),
      "comm_floats_down_per_layer": dict(zip(ledger.names, ledger.down.tolist())),
  }
  frozen = getattr(program, "frozen", {})
  if jax.tree.leaves(frozen):  # the base under a trainable set: never sent, not counted above
    summary["num_frozen_parameters"] = int(sum(np.size(x) for x in jax.tree.leaves(frozen)))
  if "backdoor_accuracy" in last:
    attacked = [r["backdoor_accuracy"] for r in records]
    summary.update(final_backdoor_accuracy=attacked[-1], best_backdoor_accuracy=max(attacked))
  if "val_accuracy" in last:
    val = [r["val_accuracy"] for r in records]
    summary.update(final_val_accuracy=val[-1], best_val_accuracy=max(val),
                   final_val_loss=last["val_loss"])
  for split in ("test", "val"):  # next-token tasks (next_token_metrics)
    if f"{split}_accuracy_last" in last:
      at_last = [r[f"{split}_accuracy_last"] for r in records]
      finite = [a for a in at_last if a is not None and math.isfinite(a)]  # None: read back
      summary.update({f"final_{split}_accuracy_last": at_last[-1],
                      f"best_{split}_accuracy_last": max(finite, default=math.nan),
                      f"final_{split}_bits_per_token": last[f"{split}_bits_per_token"]})
  summary.update({k: v for k, v in last.items() if k.startswith("client_")})
  summary.update(program.summary(state, ledger))
  if options.privacy is not None:
    summary["privacy"] = privacy_stage.summary(options.privacy, program.num_rounds)
    unprotected = sorted(k for k in summary if k.startswith(("client_train_", "client_test_")))
    if unprotected:
      summary["privacy"]["outside_guarantee"] = {"metrics": unprotected, "why": OUTSIDE_GUARANTEE}
  return summary


# Why a DP run's per-client metrics are not covered by its (epsilon, delta).
OUTSIDE_GUARANTEE = (
    "computed on each client's own data (its training or test part) with neither clip nor "
    "noise, and the personal models (Algorithm.serve, fine-tuning) are trained on it too: the "
    "(epsilon, delta) guarantee covers the global model, the noised mean of the clipped "
    "updates, and what is computed from it on the central test and validation sets only")
