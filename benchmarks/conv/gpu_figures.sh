#!/usr/bin/env bash
# The GPU figures in one command:
#   1. the machine: GPU, driver, jax and its devices; the float32 matmul peak at the
#      default precision (what the engine computes at) and at "highest" (true fp32);
#   2. the benchmark on FedAT's CNN at 32 clients x 10 steps x batch 32: mfu, engine/loop,
#      and the engine with its plan (auto: patches since the first H200 run, lax before)
#      against the lax and im2col convolution plans, against "patches_cpu" and against the
#      scan client map, side by side in one process;
#   3. the same on ResNet20, less the client-map comparison;
#   4. WRN-28-10 at 8 x 5 x 32 against the "winograd" plan (Winograd's minimal filtering on
#      every 3x3 and 5x5 stride-1 layer) and "patches_cpu";
#   5. the 8x8 mlp at 8 x 5 x 32 against "patches_cpu" (its small kernels' gradient);
#   6. the pfl-research CIFAR-10 workload end to end through the CLI (1,500 rounds).
# "patches_cpu" is the patches plan with the picks it takes on CPU only (Winograd layers,
# im2col's written-out stride-1 gradient, small dense kernels' gradient; benchmarks/conv/plans.py) taken
# here too: engine_vs_engine_patches_cpu above 1 means they do not pay on this GPU.
#
#   bash benchmarks/conv/gpu_figures.sh [OUT_DIR]     # from the repository root
#
# Each step runs in its own process under its own time limit, so one that fails or runs
# long leaves the others' figures; every log goes to OUT_DIR (default ./gpu_figures_out).
# The matmul peak is 8192^3 here: a 2048^3 matmul takes tens of microseconds on a GPU.
set -u
out="${1:-gpu_figures_out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
t_fedat="${GPU_FIGURES_FEDAT_S:-120}"
t_resnet="${GPU_FIGURES_RESNET_S:-150}"
t_wrn="${GPU_FIGURES_WRN_S:-200}"
t_mlp="${GPU_FIGURES_MLP_S:-60}"
t_workload="${GPU_FIGURES_WORKLOAD_S:-250}"
rounds="${GPU_FIGURES_ROUNDS:-1500}"
clients="${GPU_FIGURES_CLIENTS:-32}"
steps="${GPU_FIGURES_STEPS:-10}"
matmul="${GPU_FIGURES_MATMUL:-8192}"

step() {  # step NAME SECONDS COMMAND...: run one step, log to $out/NAME.log
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit} s): $*"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0)) s"
  tail -n 4 "$out/$name.log" | cut -c1-1500
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  "$py" - "$matmul" <<'EOF'
import sys
import jax
from benchmarks.workload_pfl_cifar10 import peak_flops
n = int(sys.argv[1])
print("jax", jax.__version__, "backend", jax.default_backend(), jax.devices())
for precision in ("default", "highest"):
  with jax.default_matmul_precision(precision):
    print(f"float32 {n}^3 matmul, precision {precision}: {peak_flops(n) / 1e12:.1f} TFLOP/s")
EOF
} >"$out/machine.log" 2>&1
cat "$out/machine.log"

step bench_fedat_cnn "$t_fedat" "$py" -m benchmarks.benchmark --model=fedat_cnn \
  --clients="$clients" --steps="$steps" --batch=32 --repeats=5 --matmul_size="$matmul" \
  --compare_conv_impls=lax,patches,im2col,patches_cpu --compare_client_maps
step bench_resnet20 "$t_resnet" "$py" -m benchmarks.benchmark --model=resnet20 \
  --clients="$clients" --steps="$steps" --batch=32 --repeats=3 --matmul_size="$matmul" \
  --compare_conv_impls=lax,patches,im2col,patches_cpu
step bench_wrn28_10 "$t_wrn" "$py" -m benchmarks.benchmark --model=wrn28_10 --clients=8 \
  --steps=5 --batch=32 --repeats=2 --central= --matmul_size="$matmul" \
  --compare_conv_impls=winograd,patches_cpu
step bench_mlp "$t_mlp" "$py" -m benchmarks.benchmark --model=mlp --clients=8 --steps=5 \
  --batch=32 --repeats=5 --matmul_size="$matmul" --compare_conv_impls=patches_cpu
workdir="$(mktemp -d)"
step workload_pfl "$t_workload" "$py" -m benchmarks.workload_pfl_cifar10 \
  --rounds="$rounds" --peak_matmul_size="$matmul" --workdir="$workdir"
# The run's own records, also when the step ran out of time part way (its rate so far).
cp "$workdir/metrics.jsonl" "$out/workload_metrics.jsonl" 2>/dev/null
tail -n 2 "$out/workload_metrics.jsonl" 2>/dev/null | cut -c1-400
