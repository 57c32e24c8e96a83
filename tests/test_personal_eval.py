"""Per-client evaluation on local test parts (engine/personal_eval.py, run/records.py).

A hand-built federation with a fixed linear model whose per-client accuracies are known;
a toy `serve` (a per-client bias kept in the client rows) against numpy; fine-tuning
against numpy SGD (and k = 0 against the global model, bitwise); chunked = unchunked and
host store = device store bitwise; the stratified local split (deterministic, disjoint,
stratified, never trained on); the metrics in a run's records; the refusals.
"""
import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from configs import default
from fedjax_lama import config as config_lib
from fedjax_lama import data as fdata
from fedjax_lama import federation, training
from fedjax_lama.config import ConfigError
from fedjax_lama.data import partitions, seeding
from fedjax_lama.engine import client_store, evaluate, local, personal_eval, sharding
from fedjax_lama.engine.algorithm import ServerState
from fedjax_lama.run import records
from fedjax_lama.run import spec as spec_lib


class Linear(nn.Module):
  """logits = x W + b: a model whose predictions a test can write down."""
  num_classes: int = 2

  @nn.compact
  def __call__(self, x, train=False):
    del train
    return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))


MODEL = Linear()
# numpy, not jax: a subprocess sets its CPU device count after importing this module.
IDENTITY = {"Dense_0": {"kernel": np.eye(2, dtype=np.float32), "bias": np.zeros(2, np.float32)}}
# Client i's test part: (examples whose largest input is the label, examples where it is not).
KNOWN = [(3, 1), (1, 1), (0, 3), (5, 0), (0, 0), (2, 2)]


def _mesh():
  return sharding.client_mesh(jax.devices()[:1])


def _known_federation():
  """Test examples x = e_y (+ noise) predicted right by the identity, or e_{1-y} predicted
  wrong; each client gets KNOWN[i] of them. Client 4 has no test data."""
  rng = np.random.default_rng(0)
  xs, ys, parts = [], [], []
  for right, wrong in KNOWN:
    start = len(ys)
    for good in [True] * right + [False] * wrong:
      y = int(rng.integers(0, 2))
      hot = y if good else 1 - y
      x = np.zeros(2, np.float32)
      x[hot] = 1.0 + float(rng.uniform(0.1, 1.0))
      x[1 - hot] = float(rng.uniform(-0.5, 0.5))
      xs.append(x)
      ys.append(y)
    parts.append(np.arange(start, len(ys), dtype=np.int64))
  return np.stack(xs), np.asarray(ys, np.int32), parts


def _evaluator(parts, x, y, chunk, **kwargs):
  return personal_eval.PersonalEvaluator(
      evaluate.make_eval_fn(MODEL, False), _mesh(), test_x=x, test_y=y, test_parts=parts,
      clients_per_chunk=chunk, **kwargs)


def _same(a: personal_eval.ClientSums, b: personal_eval.ClientSums):
  for u, v in zip(a, b):
    np.testing.assert_array_equal(u, v)


def test_known_per_client_accuracies_and_statistics():
  x, y, parts = _known_federation()
  sums = _evaluator(parts, x, y, chunk=4)(IDENTITY, {})
  assert set(sums) == {"global"}  # no serve, no fine-tuning: the global model only
  acc = sums["global"].accuracy
  np.testing.assert_array_equal(acc[[0, 1, 2, 3, 5]], [0.75, 0.5, 0.0, 1.0, 0.5])
  assert np.isnan(acc[4]) and sums["global"].count[4] == 0
  stats = personal_eval.summarize(sums["global"])
  clients = np.array([0.75, 0.5, 0.0, 1.0, 0.5])
  weights = np.array([4, 2, 3, 5, 4], np.float64)
  assert stats["mean"] == pytest.approx(0.55)
  assert stats["std"] == pytest.approx(np.sqrt(np.mean((clients - 0.55) ** 2)))
  # sorted 0, .5, .5, .75, 1: the 10th percentile is 0.4 of the way from 0 to 0.5
  assert stats["p10"] == pytest.approx(0.2)
  assert stats["worst"] == 0.0
  assert stats["weighted_mean"] == pytest.approx(11 / 18)  # (3+1+0+5+2) / 18 examples
  assert stats["weighted_std"] == pytest.approx(
      np.sqrt(np.sum(weights * (clients - 11 / 18) ** 2) / 18))
  assert stats["weighted_p10"] == 0.0  # client 2 (accuracy 0) holds 3/18 > 10% of examples
  record = records.client_test_record(sums)
  assert record["client_test_accuracy/global/worst"] == 0.0
  assert record["client_test_accuracy_mean"] == pytest.approx(0.55)
  assert not any("/personal/" in k for k in record)


def test_chunked_equals_unchunked():
  x, y, parts = _known_federation()
  whole = _evaluator(parts, x, y, chunk=len(parts))(IDENTITY, {})["global"]
  for chunk in (1, 4, 5):
    _same(_evaluator(parts, x, y, chunk=chunk)(IDENTITY, {})["global"], whole)


def _bias_serve(server, row, loss_at):
  """A toy personal model: the global model with the client's own bias added."""
  del loss_at
  dense = server.params["Dense_0"]
  return ({"Dense_0": {"kernel": dense["kernel"], "bias": dense["bias"] + row["b"]}},
          server.model_state)


def _server(params, model_state=None):
  """A server state holding `params` (what serve reads)."""
  return ServerState(params, {} if model_state is None else model_state, (), {})


def _numpy_sums(params, x, y, parts, biases):
  w, b = np.asarray(params["Dense_0"]["kernel"]), np.asarray(params["Dense_0"]["bias"])
  out = []
  for part, extra in zip(parts, biases):
    logits = x[part].astype(np.float64) @ w + b + extra
    shifted = logits - logits.max(-1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    loss = -log_softmax[np.arange(len(part)), y[part]].sum()
    out.append((loss, float(np.sum(np.argmax(logits, -1) == y[part])), float(len(part))))
  return [np.array(a) for a in zip(*out)]


def test_personalize_against_numpy_and_host_store_equals_device_store():
  x, y, parts = _known_federation()
  biases = np.random.default_rng(1).normal(0.0, 2.0, (len(parts), 2)).astype(np.float32)
  on_device = client_store.ClientStore({"b": biases}, _mesh(), on_host=False)
  sums = _evaluator(parts, x, y, chunk=4, serve=_bias_serve)(
      IDENTITY, {}, on_device, server=_server(IDENTITY))
  loss, correct, count = _numpy_sums(IDENTITY, x, y, parts, biases)
  np.testing.assert_array_equal(sums["personal"].correct, correct)
  np.testing.assert_array_equal(sums["personal"].count, count)
  np.testing.assert_allclose(sums["personal"].loss_sum, loss, rtol=1e-5, atol=1e-5)
  zero = _numpy_sums(IDENTITY, x, y, parts, np.zeros_like(biases))
  np.testing.assert_array_equal(sums["global"].correct, zero[1])
  # The host placement, chunked otherwise, gives the same bits.
  on_host = client_store.ClientStore({"b": biases}, _mesh(), on_host=True)
  for chunk in (1, 6):
    again = _evaluator(parts, x, y, chunk=chunk, serve=_bias_serve)(
        IDENTITY, {}, on_host, server=_server(IDENTITY))
    _same(again["personal"], sums["personal"])
    _same(again["global"], sums["global"])


def _train_data():
  """Each client's training part: a few examples of the same kind as its test part."""
  rng = np.random.default_rng(2)
  y = rng.integers(0, 2, 30).astype(np.int32)
  x = (np.eye(2, dtype=np.float32)[y] + rng.normal(0, 0.3, (30, 2))).astype(np.float32)
  train_parts = [np.arange(5 * i, 5 * i + 5, dtype=np.int64) for i in range(len(KNOWN))]
  return x, y, train_parts


def _finetuning(parts, test_x, test_y, steps, chunk, lr=0.5):
  train_x, train_y, train_parts = _train_data()
  loss_fn = local.make_loss_fn(MODEL, False)
  return _evaluator(parts, test_x, test_y, chunk, loss_fn=loss_fn, train_x=train_x,
                    train_y=train_y, train_parts=train_parts, finetune_steps=steps,
                    finetune_lr=lr, batch_size=3, seed=7)


def numpy_finetune(features, w, b, packed, i: int, lr: float):
  """numpy SGD on the softmax regression logits = features(x) w + b over client i's
  fine-tuning batches (`packed`, drawn from `_train_data`); features stay fixed."""
  train_x, train_y, _ = _train_data()
  w, b = np.asarray(w, np.float64), np.asarray(b, np.float64)
  for s in range(packed.indices.shape[1]):
    real = packed.example_mask[i, s] > 0
    h = features(train_x[packed.indices[i, s][real]].astype(np.float64))
    yb = train_y[packed.indices[i, s][real]]
    logits = h @ w + b
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    g = (p - np.eye(2)[yb]) / len(yb)
    w, b = w - lr * h.T @ g, b - lr * g.sum(0)
  return w, b


def test_finetuning_zero_steps_is_the_global_model_bitwise():
  x, y, parts = _known_federation()
  sums = _finetuning(parts, x, y, steps=0, chunk=4)(IDENTITY, {}, personal=True)
  _same(sums["personal"], sums["global"])


def test_finetuning_against_numpy_sgd():
  x, y, parts = _known_federation()
  steps, lr, round_idx = 3, 0.5, 4
  sums = _finetuning(parts, x, y, steps=steps, chunk=4, lr=lr)(IDENTITY, {},
                                                                round_idx=round_idx)
  _, _, train_parts = _train_data()
  # The batches the evaluator draws: pack_cohort on the fine-tuning stream.
  packed = fdata.pack_cohort(train_parts, list(range(len(parts))), batch_size=3,
                             num_steps=steps, seed=7, round_idx=round_idx,
                             stream=seeding.FINETUNE_STREAM)
  for i, part in enumerate(parts):
    w, b = numpy_finetune(lambda v: v, np.eye(2), np.zeros(2), packed, i, lr)
    if len(part) == 0:
      assert sums["personal"].count[i] == 0
      continue
    loss, correct, _ = _numpy_sums({"Dense_0": {"kernel": w, "bias": b}}, x, y, [part],
                                   [np.zeros(2)])
    assert sums["personal"].correct[i] == correct[0]
    np.testing.assert_allclose(sums["personal"].loss_sum[i], loss[0], rtol=1e-4, atol=1e-5)
  # Fine-tuning chunked = unchunked.
  _same(_finetuning(parts, x, y, steps=steps, chunk=1, lr=lr)(
      IDENTITY, {}, round_idx=round_idx)["personal"], sums["personal"])


class EchoTokens(nn.Module):
  """Next-token logits that predict each input token itself (an identity embedding)."""
  vocab: int = 5

  @nn.compact
  def __call__(self, x, train=False):
    del train
    return nn.Embed(self.vocab, self.vocab)(x)


def test_next_token_targets_count_scored_tokens():
  """Per-token outcomes: a client's accuracy pools its scored tokens (targets >= 0)."""
  x = np.array([[1, 2, 3], [4, 0, 1], [2, 2, 2], [3, 1, 0]], np.int32)
  y = np.array([[1, 0, -1],    # 1 of 2 scored right
                [4, 0, 1],     # 3 of 3
                [-1, -1, -1],  # nothing scored
                [0, 1, 2]], np.int32)  # 1 of 3
  parts = [np.array([0, 1]), np.array([2]), np.array([3])]
  params = {"Embed_0": {"embedding": np.eye(5, dtype=np.float32)}}
  evaluator = personal_eval.PersonalEvaluator(
      evaluate.make_eval_fn(EchoTokens(), False), _mesh(), test_x=x, test_y=y,
      test_parts=parts, clients_per_chunk=2)
  sums = evaluator(params, {})["global"]
  np.testing.assert_array_equal(sums.correct, [4, 0, 1])
  np.testing.assert_array_equal(sums.count, [5, 0, 3])
  stats = personal_eval.summarize(sums)
  assert stats["mean"] == pytest.approx((0.8 + 1 / 3) / 2)
  assert stats["weighted_mean"] == pytest.approx(5 / 8)
  # The same tokens as the pooled evaluation's per-client breakdown.
  pooled = evaluate.evaluate(evaluate.make_eval_fn(EchoTokens(), False), params, {}, x, y, 4)
  np.testing.assert_array_equal(evaluate.per_client_accuracy(pooled.correct, parts),
                                sums.accuracy)


# ---- the split ----------------------------------------------------------------------------
@pytest.mark.parametrize("fraction,seed", [(0.2, 0), (0.25, 3), (0.5, 1), (0.1, 9)])
def test_stratified_split_is_deterministic_disjoint_and_stratified(fraction, seed):
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 5, 400)
  clients = partitions.dirichlet_fedml(labels, 8, 0.5, seed, min_client_size=5)
  train, test = partitions.local_split(clients, fraction, seed, labels=labels)
  again = partitions.local_split(clients, fraction, seed, labels=labels)
  for c, tr, te, tr2, te2 in zip(clients, train, test, *again):
    np.testing.assert_array_equal(tr, tr2)
    np.testing.assert_array_equal(te, te2)
    assert not set(tr) & set(te)
    assert sorted(np.concatenate([tr, te])) == sorted(c)
    n = len(c)
    assert len(te) == n - int(np.floor((1 - fraction) * n + 1e-9))  # FedAT's sizes
    for k in np.unique(labels[c]):
      n_k = int(np.sum(labels[c] == k))
      t_k = int(np.sum(labels[te] == k))
      assert np.floor(fraction * n_k + 1e-9) <= t_k <= np.ceil(fraction * n_k - 1e-9)


def _synthetic_dataset(n=240, seed=0):
  rng = np.random.default_rng(seed)
  y = rng.integers(0, 3, n).astype(np.int32)
  x = (rng.normal(size=(n, 2, 2, 1)) + y[:, None, None, None]).astype(np.float32)
  return fdata.Dataset("synthetic", x, y, x[:40], y[:40], 3)


def test_synchronous_federation_is_stratified_and_training_never_reads_a_test_example():
  ds = _synthetic_dataset()
  spec = federation.PartitionSpec("dirichlet", 6, 0, min_client_size=5,
                                  local_test_fraction=0.25, local_split="stratified")
  fed = federation.build_federation(spec, ds)
  plain = federation.build_federation(federation.PartitionSpec(
      "dirichlet", 6, 0, min_client_size=5), ds)
  expected = partitions.local_split(plain.client_train, 0.25, 0, labels=ds.train_y)
  for got, want in zip(fed.client_test, expected[1]):
    np.testing.assert_array_equal(got, want)
  # Poison every test example: a round that read one would give non-finite parameters.
  test_rows = np.concatenate(fed.client_test)
  poisoned = ds.train_x.copy()
  poisoned[test_rows] = np.nan
  fed.dataset = fdata.Dataset("synthetic", poisoned, ds.train_y, ds.test_x, ds.test_y, 3)
  c = default.get_config()
  c.update_from_flattened_dict({"num_clients": 6, "local_steps": 4, "batch_size": 8,
                                "rounds": 2, "local_test_fraction": 0.25})
  model = Linear(num_classes=3)
  params = model.init(jax.random.PRNGKey(0), ds.train_x[:1])["params"]
  program = training.build_program(c, model, params, {}, fed, _mesh())
  state = program.init_state()
  for r in range(2):
    state, out = program.run_round(state, r)
    assert np.isfinite(out.train_loss) and out.train_count > 0
  params, model_state = program.eval_params(state)
  for leaf in jax.tree.leaves(params):
    assert np.all(np.isfinite(np.asarray(leaf)))
  # The record's per-client metrics of this program: global and fine-tuned personal models
  # (fine-tuning reads the clients' training parts only: finite despite the poison).
  c.finetune_steps = 1
  evaluator = records.make_personal_evaluator(spec_lib.record_options(c), program, fed)
  sums = evaluator(params, model_state, program.rows_store(state), round_idx=1)
  record = records.client_test_record(sums)
  for model in personal_eval.MODELS:
    for stat in personal_eval.STATISTICS:
      assert np.isfinite(record[personal_eval.metric_name(model, stat)])
  assert record["client_test_accuracy_mean"] == record["client_test_accuracy/global/mean"]


def test_natural_partition_keeps_its_own_test_data():
  train_ids = np.array([7, 3, 7, 9, 3, 3])
  test_ids = np.array([9, 3, 5, 7, 7, 3])  # writer 5 has no training data: dropped
  parts = partitions.natural_test_parts(train_ids, test_ids)
  # natural(): clients by ascending id 3, 7, 9
  assert [p.tolist() for p in parts] == [[1, 5], [3, 4], [0]]
  x = np.zeros((6, 2), np.float32)
  ds = fdata.Dataset("synthetic", x, np.zeros(6, np.int32), x, np.zeros(6, np.int32), 2,
                     train_client_ids=train_ids, test_client_ids=test_ids)
  fed = federation.build_federation(federation.PartitionSpec(
      "natural", 3, 0, local_test_fraction=0.2, local_split="stratified"), ds)
  assert fed.client_test_in == "test"
  assert [p.tolist() for p in fed.client_test] == [[1, 5], [3, 4], [0]]
  assert [p.tolist() for p in fed.client_train] == [[1, 4, 5], [0, 2], [3]]  # not split


# ---- a run's records ----------------------------------------------------------------------
def _tiny(**overrides):
  c = default.get_config()
  c.update_from_flattened_dict({
      "rounds": 2, "local_steps": 2, "num_clients": 4, "eval_every": 2, "checkpoint_every": 2,
      "batch_size": 8, "plots": False, "local_test_fraction": 0.25, **overrides})
  c.model_options.hidden_sizes = (8,)
  return c


@pytest.mark.slow
def test_run_records_the_per_client_test_metrics(tmp_path):
  summary = training.train_and_evaluate(_tiny(finetune_steps=2, plots=True), str(tmp_path))
  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    last = [json.loads(line) for line in f][-1]
  with open(os.path.join(tmp_path, "summary.json")) as f:
    written = json.load(f)
  for model in personal_eval.MODELS:
    for stat in personal_eval.STATISTICS:
      name = personal_eval.metric_name(model, stat)
      assert 0.0 <= last[name] <= 1.0 or stat.endswith("std"), name
      assert written[name] == last[name] == summary[name]
  assert last["client_test_accuracy_mean"] == last["client_test_accuracy/global/mean"]
  assert (tmp_path / "client_test_accuracy.png").exists()


@pytest.mark.parametrize("overrides,field,accepted", [
    ({"local_test_fraction": 1.0}, "config.local_test_fraction", "[0, 1)"),
    ({"local_test_fraction": -0.1}, "config.local_test_fraction", "[0, 1)"),
    ({"finetune_steps": -1}, "config.finetune_steps", "integer >= 0"),
    ({"finetune_steps": 2, "local_test_fraction": 0.0}, "config.finetune_steps",
     "local_test_fraction > 0"),
    ({"finetune_steps": 2, "per_client_eval": "never"}, "config.finetune_steps",
     "per_client_eval='never'"),
    ({"finetune_lr": 0.0}, "config.finetune_lr", "> 0"),
    ({"algorithm": "fedat", "local_epochs": 1, "finetune_steps": 2}, "config.finetune_steps",
     "synchronous rounds"),
    ({"finetune_layers": "Dense_1"}, "config.finetune_layers", "config.finetune_steps=0"),
])
def test_refusals_name_the_field(overrides, field, accepted):
  c = _tiny(**overrides)
  with pytest.raises(ConfigError) as e:
    config_lib.validate(c)
  message = str(e.value)
  assert field in message and accepted in message and "\n" not in message


def test_finetune_layers_that_are_not_the_models_stop_before_training(tmp_path):
  with pytest.raises(ConfigError, match=r"config\.finetune_layers='Dense_9': 'Dense_9' is not a "
                     r"layer of the model; accepted: .*Dense_0, Dense_1.*'' \(every layer\)"):
    training.train_and_evaluate(_tiny(finetune_steps=2, finetune_layers="Dense_9"),
                                str(tmp_path))
  assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow
def test_interrupted_run_resumes_the_per_client_metrics_exactly(tmp_path):
  """SCAFFOLD's rows on host, per-client evaluation with fine-tuning at every evaluation:
  a run cut after round 2 and resumed writes the records of an uninterrupted one."""
  c = _tiny(rounds=4, algorithm="scaffold", per_client_eval="every", finetune_steps=2,
            **{"engine.client_state_on_host": True})
  full = training.train_and_evaluate(c, str(tmp_path / "full"))
  assert training.train_and_evaluate(c, str(tmp_path / "cut"), stop_after_round=2) == {
      "interrupted_after_round": 2}
  resumed = training.train_and_evaluate(c, str(tmp_path / "cut"))

  def metrics(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      return [{k: v for k, v in json.loads(line).items() if k != "wall_seconds"} for line in f]

  assert metrics(tmp_path / "full") == metrics(tmp_path / "cut")
  name = personal_eval.metric_name("personal", "mean")
  assert name in metrics(tmp_path / "full")[0]
  assert full[name] == resumed[name]


# ---- 8 devices = 1 ------------------------------------------------------------------------
def _device_case(out_path: str) -> None:
  """Subprocess entry: the serve + fine-tuning evaluation on every CPU device of this
  process (FEDJAX_TEST_CPU_DEVICES, set before any device exists), on both store placements."""
  jax.config.update("jax_num_cpu_devices", int(os.environ["FEDJAX_TEST_CPU_DEVICES"]))
  mesh = sharding.client_mesh(jax.devices())
  x, y, parts = _known_federation()
  train_x, train_y, train_parts = _train_data()
  biases = np.random.default_rng(1).normal(0.0, 2.0, (len(parts), 2)).astype(np.float32)
  report = {}
  for on_host in (False, True):
    store = client_store.ClientStore({"b": biases}, mesh, on_host=on_host)
    evaluator = personal_eval.PersonalEvaluator(
        evaluate.make_eval_fn(MODEL, False), mesh, test_x=x, test_y=y, test_parts=parts,
        clients_per_chunk=3, serve=_bias_serve,
        loss_fn=local.make_loss_fn(MODEL, False), train_x=train_x, train_y=train_y,
        train_parts=train_parts, finetune_steps=2, finetune_lr=0.5, batch_size=3, seed=7)
    sums = evaluator(IDENTITY, {}, store, round_idx=3, server=_server(IDENTITY))
    report[str(on_host)] = {model: [a.tolist() for a in s] for model, s in sums.items()}
  with open(out_path, "w") as f:
    json.dump(report, f)


@pytest.mark.slow
def test_eight_devices_equal_one(tmp_path):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  procs = {}
  for devices in (1, 8):
    env = dict(os.environ, JAX_PLATFORMS="cpu", FEDJAX_TEST_CPU_DEVICES=str(devices),
               PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    procs[devices] = subprocess.Popen(
        [sys.executable, "-m", "tests.test_personal_eval", str(tmp_path / f"{devices}.json")],
        cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  for devices, proc in procs.items():
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, f"{devices} devices:\n{err[-4000:]}"
  one, eight = (json.loads((tmp_path / f"{d}.json").read_text()) for d in (1, 8))
  assert one == eight
  assert one["False"] == one["True"]  # device store = host store


if __name__ == "__main__":
  import sys  # pylint: disable=g-import-not-at-top
  _device_case(sys.argv[1])
