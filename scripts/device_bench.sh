#!/usr/bin/env bash
# One GPU session's measurements, as recorded in docs/benchmarks.md:
#   benchmark with the default operator choice (writes the random full-size checkpoint) -> gpu tests
#   -> operator profile -> profiled benchmark -> profiled benchmark with prompt-length buckets
#   [-> torch-only baseline and LeRobot's eager reference with BASELINES=1].
# Expects (carried to the GPU machine): .device_shared/ = a copy of ../shared, and for BASELINES .whl/ =
# LeRobot's wheels (see ../shared/device-wheels/README.md). Results land in $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
SHARED=$PWD/.device_shared
export PHYAI_PARITY_FIXTURES=$SHARED/fixtures/lerobot_parity
TOK=$PHYAI_PARITY_FIXTURES/tokenizer/tokenizer.model
CKPT=/tmp/phyai_bench_ckpt
OUT=${OUT:-/tmp/phyai_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv | tee "$OUT/gpu.txt"
step() { local name=$1 limit=$2 tail=$3; shift 3; echo "=== $name"; local t=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "rc=$? $name $((SECONDS - t)) s"; tail -n "$tail" "$OUT/$name.log"; }
B="python3 scripts/bench_runtime.py --tokenizer $TOK --checkpoint $CKPT"
PROFILE=$OUT/profile_h200.json
step bench 150 14 $B --out "$OUT/bench.json"
step gpu_tests 150 8 python3 -m pytest -q -m gpu -p no:cacheprovider test/test_runner.py test/test_pi05_parity.py \
  test/test_pi0_parity.py test/test_kernels_gpu.py test/test_dispatch.py
step profile 100 40 python3 scripts/profile_ops.py --checkpoint $CKPT --tokenizer "$TOK" --out "$PROFILE"
[ -f "$PROFILE" ] && PHYAI_OP_PROFILE=$PROFILE step bench_profiled 120 24 $B --reuse-checkpoint --out "$OUT/bench_profiled.json"
[ -f "$PROFILE" ] && PHYAI_OP_PROFILE=$PROFILE step bench_bucketed 120 16 $B --reuse-checkpoint --token-bucket 32 \
  --batches 1,32 --batch-iters 10 --out "$OUT/bench_bucketed.json"
if [ "${BASELINES:-0}" = 1 ]; then
  PHYAI_OPS=torch step bench_torch 90 14 $B --reuse-checkpoint --skip-startup --iters 100 --batches 1,32 \
    --batch-iters 5 --out "$OUT/bench_torch.json"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  PYTHONPATH=/tmp/site step lerobot 120 6 python3 "$SHARED/tools/lerobot_pi05_gpu.py" --iters 30 --warmup 5 \
    --batches 32 --tput-warmup 2 --tput-iters 5 --out "$OUT/lerobot.json"
fi
