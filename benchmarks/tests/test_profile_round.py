"""benchmarks.profile_round: the grouping of XLA's trace, and one traced round end to end."""
import json
import pathlib
import subprocess
import sys

from benchmarks import profile_round

REPO = pathlib.Path(__file__).resolve().parents[2]

HLO = """HloModule jit_f
fused_computation.1 {
  p = f32[4]{0} parameter(0)
  ROOT a = f32[4]{0} add(p, p)
}
ENTRY main {
  %x = f32[4]{0} parameter(0), metadata={op_name="x"}
  %add_fusion.1 = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused_computation.1, metadata={op_name="jit(f)/add"}
  %dot.12 = f32[4]{0} dot(%x, %x), metadata={op_name="jit(f)/dot_general"}
  %while.3 = f32[4]{0} while(%x), condition=%c, body=%b
  ROOT %ynn_fusion.2.1 = f32[4]{0} fusion(%dot.12), kind=kCustom
}
"""


def test_op_kind_drops_the_instruction_number():
  assert profile_round.op_kind("ynn_fusion.21") == "ynn_fusion"
  assert profile_round.op_kind("ynn_fusion.2.1") == "ynn_fusion"
  assert profile_round.op_kind("dot") == "dot"
  assert profile_round.op_kind("add_bitcast_fusion.2") == "add_bitcast_fusion"


def test_hlo_instructions_reads_names_and_op_names():
  found = profile_round.hlo_instructions(HLO)
  assert found["add_fusion.1"] == "jit(f)/add"
  assert found["dot.12"] == "jit(f)/dot_general"
  assert found["ynn_fusion.2.1"] == ""  # ROOT, no metadata
  assert "while.3" in found and "a" in found


def test_group_ops_sums_per_round_by_kind_and_leaves_out_the_rest():
  instructions = profile_round.hlo_instructions(HLO)
  events = [
      {"ph": "X", "name": "dot.12", "dur": 3000},           # 3 ms over two rounds
      {"ph": "X", "name": "dot.12", "dur": 1000},
      {"ph": "X", "name": "add_fusion.1", "dur": 2000},
      {"ph": "X", "name": "ynn_fusion.2.1", "dur": 6000},
      {"ph": "X", "name": "while.3", "dur": 50000},         # spans the others: left out
      {"ph": "X", "name": "ThunkExecutor::Execute", "dur": 90000},  # runtime, not an op
      {"ph": "i", "name": "dot.12", "dur": 7000},           # not a complete event
  ]
  by_kind, by_op = profile_round.group_ops(events, 2, instructions)
  assert by_op == {"ynn_fusion.2.1": 3.0, "dot.12": 2.0, "add_fusion.1": 1.0}
  assert by_kind == {"ynn_fusion": 3.0, "dot": 2.0, "add_fusion": 1.0}
  assert list(by_kind) == ["ynn_fusion", "dot", "add_fusion"]  # largest first


def test_idle_time_is_the_gaps_between_operations_named_by_the_one_before():
  instructions = profile_round.hlo_instructions(HLO)
  ms = 1000  # trace timestamps and durations are microseconds
  events = [
      {"ph": "X", "name": "dot.12", "ts": 0, "dur": 1 * ms},             # 0 - 1
      {"ph": "X", "name": "add_fusion.1", "ts": 500, "dur": 1500},       # 0.5 - 2, ends last
      # nothing from 2 to 5: 3 ms after add_fusion.1
      {"ph": "X", "name": "ynn_fusion.2.1", "ts": 5 * ms, "dur": 2 * ms},  # 5 - 7
      {"ph": "X", "name": "dot.12", "ts": 5500, "dur": 500},             # inside it
      {"ph": "X", "name": "dot.12", "ts": 7 * ms, "dur": 100},           # 7 - 7.1
      # nothing from 7.1 to 9.1: 2 ms after dot.12
      {"ph": "X", "name": "add_fusion.1", "ts": 9100, "dur": 900},       # 9.1 - 10
      {"ph": "X", "name": "while.3", "ts": 0, "dur": 20 * ms},           # a loop: left out
      {"ph": "X", "name": "ThunkExecutor::Execute", "ts": 0, "dur": 20 * ms},
  ]
  busy, idle, after = profile_round.idle_time(events, 2, instructions)
  assert abs(busy - (2.0 + 2.1 + 0.9) / 2) < 1e-9
  assert abs(idle - (3 + 2) / 2) < 1e-9
  assert list(after) == ["add_fusion.1", "dot.12"]
  assert abs(after["add_fusion.1"] - 1.5) < 1e-9 and abs(after["dot.12"] - 1.0) < 1e-9
  assert profile_round.idle_time([], 1, instructions) == (0.0, 0.0, {})


def test_one_traced_round_of_a_small_model_end_to_end(tmp_path):
  """A fresh process (XLA_FLAGS must be set before JAX starts its backend) traces the mlp."""
  out = subprocess.run(
      [sys.executable, "-m", "benchmarks.profile_round", "--model=mlp", "--clients=2",
       "--steps=2", "--batch=4", "--traced_rounds=1", f"--trace_dir={tmp_path}"],
      cwd=REPO, capture_output=True, text=True, timeout=300, check=True)
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["model"] == "mlp" and result["trace_dir"] == str(tmp_path)
  assert result["op_ms_per_round"] > 0
  assert "while" not in result["ms_by_kind"]
  # The MLP's matmuls ran, whichever library XLA gave them to.
  assert {"dot", "ynn_fusion"} & set(result["ms_by_kind"])
  assert result["busy_ms_per_round"] > 0 and result["idle_ms_per_round"] >= 0
  assert "ms a round (wall)" in out.stdout
