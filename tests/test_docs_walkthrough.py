"""The pages that teach the interface cannot drift from the code.

docs/algorithms.md walks through adding FedExP and FedBABU in full: the code blocks of each
walkthrough are extracted, each must be the module's own code
(fedjax_lama/algorithms/fedexp.py, fedbabu.py), and together they are run as a module whose
algorithm must train bit for bit as the registered one. FedBABU's walkthrough makes claims
that are checked here: the body against a numpy reference with the head fixed, the head
bit for bit at its initialisation on the server (also when the aggregate holds noise
there), only the body counted each way, the downloads a client reads not narrowed by
`exchanged`, head-only fine-tuning against numpy with the body bit for bit as served, and
head_layers="none" as FedAvg bit for bit. docs/stages.md walks through adding MeaMed as a
defence and automatic clipping as DP's clipping rule, each one module and one registration:
the blocks must be the module's code and the registry's line, and the code run from the page
must match a numpy reference written here. The README's algorithm table must name exactly
the registry's algorithms.
"""
import pathlib
import re
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lama import algorithms, registry
from fedjax_lama import config as config_lib
from fedjax_lama import data as fdata
from fedjax_lama.algorithms import Common, fedbabu, fedexp
from fedjax_lama.data import seeding
from fedjax_lama.engine import evaluate, local, personal_eval, stages, traffic as traffic_lib
from fedjax_lama.engine.algorithm import (Aggregates, Algorithm, Personalization, ServerRule,
                                          displacement, freeze, server_opt)
from fedjax_lama.errors import ConfigError, HparamError
from fedjax_lama.privacy import (AdaptiveClipOptions, DpOptions, SamplingOptions, automatic_clip,
                                 clipping, mechanisms)
from fedjax_lama.robust import defences, meamed
from fedjax_lama.run import records, spec as spec_lib
from tests import test_layer_partition as two_layers
from tests import test_personal_eval as per_client
from tests import test_robust_runs as robust_runs
from tests import test_sharding as helpers
from tests.test_algorithm_reference import engine

REPO = pathlib.Path(__file__).resolve().parent.parent
WALKTHROUGH = "## Adding an algorithm, in full: FedExP"
FEDBABU = "## Personalization, in full: FedBABU"


def walkthrough_blocks(title: str = WALKTHROUGH) -> list[str]:
  page = (REPO / "docs" / "algorithms.md").read_text()
  start = page.index(title)
  end = page.index("\n## ", start + len(title))
  return re.findall(r"```python\n(.*?)```", page[start:end], re.S)


def walkthrough_module(title: str, name: str) -> types.ModuleType:
  """The walkthrough's code blocks run together as a module."""
  module = types.ModuleType(name)
  exec(compile("\n".join(walkthrough_blocks(title)), "docs/algorithms.md", "exec"),  # pylint: disable=exec-used
       module.__dict__)
  return module


@pytest.mark.parametrize("title,module", [(WALKTHROUGH, fedexp), (FEDBABU, fedbabu)])
def test_walkthrough_blocks_are_the_modules_code(title, module):
  blocks = walkthrough_blocks(title)
  assert len(blocks) >= 4
  source = pathlib.Path(module.__file__).read_text()
  for block in blocks:
    assert block in source, (f"docs/algorithms.md shows code that is not "
                             f"{pathlib.Path(module.__file__).name}'s:\n{block}")
  # Together the blocks are the whole module after its docstring: nothing left out.
  body = source[source.index('"""', 3) + 3:]
  assert re.sub(r"\s+", "", "".join(blocks)) == re.sub(r"\s+", "", body)


def test_walkthrough_code_runs_and_trains_as_the_registered_algorithm():
  module = walkthrough_module(WALKTHROUGH, "walkthrough_fedexp")
  (spec,) = module.SPECS
  assert spec.name == "fedexp"
  hp = module.Hparams(eps=1e-3, eval_average_last_two=True)
  from_page = spec.make(hp, Common())
  registered = algorithms.build("fedexp", eps=1e-3, eval_average_last_two=True)
  ours = engine(from_page, 3, steps=(2, 1))[0]
  theirs = engine(registered, 3, steps=(2, 1))[0]
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
    np.testing.assert_array_equal(a, b)
  assert float(from_page.server.report(ours)[1]["fedexp_eta_g"]) > 1.0  # it extrapolated


# ---- FedBABU ------------------------------------------------------------------------------
W0, V0 = two_layers.W0, two_layers.V0  # body Dense_0, head Dense_1 (the classifier)


def ref_fedbabu(rounds, steps=2, momentum=0.0, weight_decay=0.0):
  """numpy: FedAvg on the body W with the head v fixed at V0 (uniform weights, both clients
  every round, `steps` full-batch steps of heavy ball with additive weight decay)."""
  w = W0.copy()
  for _ in range(rounds):
    moves = []
    for i in range(two_layers.N):
      wi, m = w.copy(), np.zeros_like(w)
      for _ in range(steps):
        gw, _ = two_layers.grads(i, wi, V0)
        m = momentum * m + gw + weight_decay * wi
        wi = wi - two_layers.ETA * m
      moves.append(wi - w)
    w = w + sum(moves) / len(moves)
  return w


def test_fedbabu_walkthrough_trains_as_registered_and_as_its_numpy_reference():
  module = walkthrough_module(FEDBABU, "walkthrough_fedbabu")
  (spec,) = module.SPECS
  assert spec.name == "fedbabu"
  common = Common(local_momentum=0.5, weight_decay=0.1)
  from_page = spec.make(module.Hparams(), common)
  server, rows = two_layers.run(from_page, 3)
  registered, _ = two_layers.run(algorithms.build("fedbabu", common), 3)
  assert two_layers._bits(server) == two_layers._bits(registered)
  assert rows == {}  # no per-client state
  np.testing.assert_allclose(server.params["Dense_0"]["kernel"],
                             ref_fedbabu(3, momentum=0.5, weight_decay=0.1),
                             atol=two_layers.ATOL)
  # The head never moved, under momentum and weight decay: bit for bit its initialisation.
  np.testing.assert_array_equal(server.params["Dense_1"]["kernel"], V0)


def test_fedbabu_server_keeps_the_head_whatever_the_aggregate_holds_there():
  """A DP mechanism's noise lands on the head's (zero) aggregate too: the server drops it."""
  alg = algorithms.build("fedbabu")
  params = jax.tree.map(jnp.asarray, two_layers.TWO_LAYERS)
  noise = {"Dense_0": {"kernel": jnp.full((2, 2), 0.25)}, "Dense_1": {"kernel": jnp.ones(2)}}
  new = alg.server.update(alg.server.init(params, {}),
                          Aggregates({"delta": noise}, jnp.float32(2), 2))
  np.testing.assert_array_equal(new.params["Dense_1"]["kernel"], params["Dense_1"]["kernel"])
  np.testing.assert_allclose(new.params["Dense_0"]["kernel"], W0 + 0.25, rtol=1e-6)


def test_fedbabu_counts_the_body_alone_each_way():
  params = jax.tree.map(jnp.asarray, two_layers.TWO_LAYERS)
  alg = algorithms.build("fedbabu")
  t = traffic_lib.traffic(alg, alg.server.init(params, {}), {})
  body, head = W0.size, V0.size
  assert t.up_per_leaf.tolist() == [body, 0] and t.down_per_leaf.tolist() == [body, 0]
  assert (t.up_other, t.down_other, t.scalar_floats) == (0, 0, 0)
  assert body + head == sum(np.size(x) for x in jax.tree.leaves(params))


def test_exchanged_narrows_the_accounting_not_the_downloaded_values():
  """A probe with the head not exchanged uploads, as a scalar, the sum of the head it was
  handed: the server's head (not zeros), while the traffic counts no head either way."""
  head = lambda params: {"Dense_0": {"kernel": False}, "Dense_1": {"kernel": True}}
  body = lambda params: {"Dense_0": {"kernel": True}, "Dense_1": {"kernel": False}}

  def finish(final, ctx, info):
    del info
    delta = displacement(final, ctx)
    delta["Dense_1"]["kernel"] = jnp.zeros_like(delta["Dense_1"]["kernel"])
    return {"delta": delta, "head_seen": jnp.sum(ctx.shared["params"]["Dense_1"]["kernel"])}, {}

  fedavg = server_opt()

  def server_update(state, agg):  # FedAvg's step, and the mean head the clients were handed
    return fedavg.update(state, agg)._replace(extra={"head_seen": agg["head_seen"]})

  def server_init(params, model_state):
    return fedavg.init(params, model_state)._replace(extra={"head_seen": jnp.zeros(())})

  probe = Algorithm(local=freeze(Algorithm().local, head), finish=finish,
                    server=ServerRule(server_init, server_update),
                    personal=Personalization(exchanged=body))
  params = jax.tree.map(jnp.asarray, two_layers.TWO_LAYERS)
  t = traffic_lib.traffic(probe, probe.server.init(params, {}), {})
  assert t.down_per_leaf.tolist() == [W0.size, 0] and t.up_per_leaf.tolist() == [W0.size, 0]
  server, _ = two_layers.run(probe, 2)
  np.testing.assert_array_equal(server.params["Dense_1"]["kernel"], V0)
  np.testing.assert_allclose(server.extra["head_seen"], V0.sum(), rtol=1e-12)


def test_fedbabu_without_a_head_is_fedavg_bitwise():
  common = Common(local_momentum=0.5)
  plain, _ = two_layers.run(algorithms.build("fedavg", common), 3)
  none, _ = two_layers.run(algorithms.build("fedbabu", common, head_layers="none"), 3)
  assert two_layers._bits(none.params) == two_layers._bits(plain.params)


class Features(nn.Module):
  """logits = (x W_0 + b_0) W_1 + b_1: a body (Dense_0) and a head (Dense_1)."""

  @nn.compact
  def __call__(self, x, train=False):
    del train
    body, head = nn.Dense(3), nn.Dense(2)  # named in construction order: Dense_0, Dense_1
    return head(body(x.reshape((x.shape[0], -1))))


TWO_DENSE = {"Dense_0": {"kernel": np.array([[1.0, 0.5, -0.5], [0.0, 1.0, 0.5]], np.float32),
                         "bias": np.array([0.1, 0.0, -0.1], np.float32)},
             "Dense_1": {"kernel": np.array([[1.0, -1.0], [-0.5, 1.0], [0.5, 0.5]], np.float32),
                         "bias": np.zeros(2, np.float32)}}


def test_head_only_finetuning_moves_the_head_alone():
  frozen = records.finetune_frozen("Dense_1")  # --config.finetune_layers=Dense_1
  assert frozen(TWO_DENSE) == {"Dense_0": {"kernel": True, "bias": True},
                               "Dense_1": {"kernel": False, "bias": False}}
  model = Features()
  loss_fn = local.make_loss_fn(model, False)
  train_x, train_y, train_parts = per_client._train_data()
  steps, lr, round_idx = 3, 0.5, 2
  # The engine's fine-tuning step with the body frozen: the body bit for bit as served.
  tuner = Algorithm(local=freeze(Algorithm().local, frozen))
  client_train = local.make_client_train(loss_fn, tuner, lambda step: lr)
  packed = fdata.pack_cohort(train_parts, list(range(len(train_parts))), batch_size=3,
                             num_steps=steps, seed=7, round_idx=round_idx,
                             stream=seeding.FINETUNE_STREAM)
  batch = local.ClientBatch(jnp.asarray(packed.indices[0], jnp.int32),
                            jnp.asarray(packed.example_mask[0], jnp.float32),
                            jnp.asarray(packed.step_mask[0], jnp.float32), jax.random.PRNGKey(0))
  params = jax.tree.map(jnp.asarray, TWO_DENSE)
  ctx = local.ClientContext({"params": params}, {}, jnp.float32(5), jnp.int32(0))
  final, _ = client_train(local.LocalState(params, {}, tuner.local.init_state(ctx)), ctx,
                          jnp.asarray(train_x), jnp.asarray(train_y), batch, 0)
  assert two_layers._bits(final.params["Dense_0"]) == two_layers._bits(params["Dense_0"])
  assert two_layers._bits(final.params["Dense_1"]) != two_layers._bits(params["Dense_1"])

  # The per-client evaluation with head-only fine-tuning against numpy SGD on the head.
  x, y, parts = per_client._known_federation()
  evaluator = personal_eval.PersonalEvaluator(
      evaluate.make_eval_fn(model, False), per_client._mesh(), test_x=x, test_y=y,
      test_parts=parts, clients_per_chunk=4, loss_fn=loss_fn, train_x=train_x,
      train_y=train_y, train_parts=train_parts, finetune_steps=steps, finetune_lr=lr,
      batch_size=3, seed=7, finetune_frozen=frozen)
  sums = evaluator(TWO_DENSE, {}, round_idx=round_idx)["personal"]
  packed = fdata.pack_cohort(train_parts, list(range(len(parts))), batch_size=3,
                             num_steps=steps, seed=7, round_idx=round_idx,
                             stream=seeding.FINETUNE_STREAM)
  w0, b0 = (TWO_DENSE["Dense_0"][k].astype(np.float64) for k in ("kernel", "bias"))
  body = lambda v: v @ w0 + b0  # as served: fine-tuning leaves it alone
  for i, part in enumerate(parts):
    w1, b1 = per_client.numpy_finetune(body, TWO_DENSE["Dense_1"]["kernel"],
                                       TWO_DENSE["Dense_1"]["bias"], packed, i, lr)
    if len(part) == 0:
      assert sums.count[i] == 0
      continue
    loss, correct, _ = per_client._numpy_sums({"Dense_0": {"kernel": w1, "bias": b1}},
                                              body(x.astype(np.float64)), y, [part],
                                              [np.zeros(2)])
    np.testing.assert_allclose(sums.loss_sum[i], loss[0], rtol=1e-4, atol=1e-5)
    assert sums.correct[i] == correct[0]


def readme_algorithm_names() -> set[str]:
  readme = (REPO / "README.md").read_text()
  start = readme.index("## Algorithms")
  end = readme.index("\n## ", start + 1)
  names = set()
  for line in readme[start:end].splitlines():
    if line.startswith("| `"):
      first_cell = line.split("|")[1]
      # The names are the backticked words before any parenthesis of options.
      names.update(re.findall(r"`([a-z0-9_]+)`", first_cell.split("(")[0]))
  return names


def table_differences(table: set[str], registered) -> str:
  """What the README's table lacks and what it names beyond the registry, in one line ("" when
  they agree)."""
  missing, extra = sorted(set(registered) - table), sorted(table - set(registered))
  parts = ([f"lacks {', '.join(missing)} (registered)"] if missing else []) + (
      [f"names {', '.join(extra)} (not registered)"] if extra else [])
  return f"README.md's algorithm table {' and '.join(parts)}" if parts else ""


def test_readme_algorithm_table_is_the_registry():
  differences = table_differences(readme_algorithm_names(), registry.names())
  assert not differences, differences


def test_a_table_that_differs_from_the_registry_is_named():
  table = set(registry.names()) - {"scaffold"} | {"fedfoo"}
  assert table_differences(table, registry.names()) == (
      "README.md's algorithm table lacks scaffold (registered) and names fedfoo (not "
      "registered)")
  assert table_differences(set(registry.names()), registry.names()) == ""


# ---- docs/stages.md: a defence and a clipping rule, each one module and one registration ----
STAGES_PAGE = REPO / "docs" / "stages.md"
MEAMED = "## Adding a defence, in full: MeaMed"
AUTOMATIC = "## Adding a clipping rule, in full: automatic clipping"


def section_blocks(title: str) -> list[str]:
  page = STAGES_PAGE.read_text()
  start = page.index(title)
  end = page.find("\n## ", start + len(title))
  return re.findall(r"```python\n(.*?)```", page[start:end if end >= 0 else None], re.S)


def run_section(title: str, module_file: str, registry_file: str) -> types.ModuleType:
  """The section's code run as a module, once checked: all blocks but the last are the whole
  module after its docstring; the last is the registration, a line of the registry's own
  source."""
  *module_blocks, registration = section_blocks(title)
  source = pathlib.Path(module_file).read_text()
  for block in module_blocks:
    assert block in source, f"docs/stages.md shows code that is not {module_file}'s:\n{block}"
  body = source[source.index('"""', 3) + 3:]
  assert re.sub(r"\s+", "", "".join(module_blocks)) == re.sub(r"\s+", "", body)
  assert registration.strip() in pathlib.Path(registry_file).read_text()
  module = types.ModuleType("walkthrough_" + pathlib.Path(module_file).stem)
  exec(compile("\n".join(module_blocks), "docs/stages.md", "exec"), module.__dict__)  # pylint: disable=exec-used
  return module


def numpy_meamed(x: np.ndarray, f: int) -> np.ndarray:
  """Xie, Koyejo, Gupta 2018, Definition 5, one coordinate at a time in float64: of the n
  values, the n - f nearest the median (ties: the lower client), averaged."""
  n = x.shape[0]
  flat = x.reshape(n, -1).astype(np.float64)
  out = np.empty(flat.shape[1])
  for j in range(flat.shape[1]):
    column = flat[:, j]
    order = np.argsort(np.abs(column - np.median(column)), kind="stable")
    out[j] = column[order[:n - f]].mean()
  return out.reshape(x.shape[1:])


def test_meamed_walkthrough_is_the_module_and_matches_numpy():
  page = run_section(MEAMED, meamed.__file__, defences.__file__)
  assert defences.DEFENCES["meamed"].build is meamed.stage
  rng = np.random.default_rng(0)
  real, padded, f = 9, 3, 2
  values = {"kernel": rng.normal(size=(real + padded, 4, 3)).astype(np.float32),
            "bias": rng.standard_cauchy(size=(real + padded, 3)).astype(np.float32)}
  values["kernel"][real:] = np.nan  # padded slots' garbage must never enter
  values["bias"][real:] = -1e30
  values["bias"][[1, 4], 0] = values["bias"][7, 0]  # ties in the distance to the median
  mask = np.array([1.0] * real + [0.0] * padded, np.float32)
  stage = page.stage(f)
  assert stage.consumes == stages.STACK and stage.reduces and stage.client is None
  stack = stages.Stack(jax.tree.map(jax.numpy.asarray, values), mask, mask)
  got, state, scalars = jax.jit(stage.server)(stack, stage.init(None), jax.random.PRNGKey(0))
  assert state == () and bool(scalars["valid"])
  for k, v in values.items():
    np.testing.assert_allclose(np.asarray(got[k]), numpy_meamed(v[:real], f), rtol=1e-6,
                               atol=1e-6)
  # Neither the plain mean nor the median: MeaMed is its own rule on this stack.
  assert not np.allclose(np.asarray(got["kernel"]), np.median(values["kernel"][:real], 0))
  assert not np.allclose(np.asarray(got["kernel"]), values["kernel"][:real].mean(0))
  # The registered rule is the page's: the same numbers.
  registered, _, _ = defences.build("meamed", f).server(stack, (), jax.random.PRNGKey(0))
  for k in values:
    np.testing.assert_array_equal(np.asarray(registered[k]), np.asarray(got[k]))


def test_meamed_runs_from_the_config_with_its_bound_and_fields_checked():
  config = robust_runs.robust_config("meamed", "sign_flip", rounds=2)
  program = helpers.build(config, robust_runs.MESH)
  assert program.opts.aggregator.name == "(attack[sign_flip], meamed)"
  state, outs = helpers.run(program)
  assert all(o.extra["aggregator_valid"] == 1.0 for o in outs)
  assert all(np.all(np.isfinite(np.asarray(x)))
             for x in jax.tree.leaves(state["server"].params))
  # 10 clients a round: n > 2f allows f <= 4.
  with pytest.raises(ConfigError, match=r"config\.robust\.f=5 .* meamed needs n > 2f .* "
                                        r"f <= 4"):
    spec_lib.build_spec(robust_runs.robust_config("meamed", **{"robust.f": 5}))
  unset = robust_runs.robust_config("meamed")
  unset.robust.f = None
  with pytest.raises(ConfigError, match=r"config\.robust\.f is not set; accepted with "
                                        r"config\.robust\.defence='meamed'"):
    spec_lib.build_spec(unset)
  with pytest.raises(ConfigError, match=r"config\.robust\.beta has no effect with "
                                        r"config\.robust\.defence='meamed'"):
    config_lib.check_overrides(config, ["robust.beta"])


def test_automatic_clipping_walkthrough_is_the_module_and_matches_numpy():
  page = run_section(AUTOMATIC, automatic_clip.__file__, clipping.__file__)
  assert clipping.CLIPPINGS["automatic"].clip is automatic_clip.clip
  rng = np.random.default_rng(1)
  clip_norm, clients = 1.5, 7
  scales = np.exp(rng.uniform(-3, 2, clients))
  updates = [{"w": (rng.normal(size=(4, 3)) * s).astype(np.float32),
              "b": (rng.normal(size=(3,)) * s).astype(np.float32)} for s in scales]
  for u in updates:  # one client at a time, as the paper states the rule
    norm = np.sqrt(sum(np.sum(np.square(v.astype(np.float64))) for v in u.values()))
    got, got_norm = page.clip(jax.tree.map(jax.numpy.asarray, u), clip_norm)
    assert float(got_norm) == pytest.approx(norm, rel=1e-6)
    for k in u:
      np.testing.assert_allclose(np.asarray(got[k]), clip_norm * u[k] / (norm + 0.01),
                                 rtol=1e-5, atol=1e-7)
    clipped_norm = np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64)))
                               for x in jax.tree.leaves(got)))
    assert clipped_norm < clip_norm
  # Registered: DP-FedAvg's stage with it, without noise, is the numpy mean of the clipped
  # updates over the expected cohort.
  options = DpOptions(noise_multiplier=0.0, clip_norm=clip_norm, delta=1e-3,
                      clipping="automatic",
                      sampling=SamplingOptions("poisson", 70, rate=0.1))
  stage = mechanisms.user_level_dp(options)
  stacked = jax.tree.map(lambda *xs: jax.numpy.asarray(np.stack(xs)), *updates)
  out = jax.vmap(stage.client, in_axes=(0, None, 0))(
      stacked, stage.init(None), jax.random.split(jax.random.PRNGKey(0), clients))
  summed = jax.tree.map(lambda x: x.sum(0), out)
  value, _, _ = stage.server(stages.Sums(summed, jax.numpy.float32(clients)), stage.init(None),
                             jax.random.PRNGKey(1))
  for k in updates[0]:
    want = sum(clip_norm * u[k].astype(np.float64)
               / (np.sqrt(sum(np.sum(np.square(v.astype(np.float64))) for v in u.values()))
                  + 0.01) for u in updates) / options.sampling.expected_cohort
    np.testing.assert_allclose(np.asarray(value[k]), want, rtol=1e-5, atol=1e-7)
  with pytest.raises(HparamError, match=r"privacy\.clipping='automatic'.*'flat' when "
                                        r"privacy\.adaptive is set"):
    DpOptions(noise_multiplier=1.0, clip_norm=1.0, delta=1e-3, clipping="automatic",
              sampling=SamplingOptions("poisson", 70, rate=0.1),
              adaptive=AdaptiveClipOptions())
