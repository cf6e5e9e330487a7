#!/usr/bin/env bash
# Issue 39's device calls (twelfth session, 2026-12-07): one mode per call, each step's wall time printed, every
# record and log packed into $OUT/MODE.tgz (the device returns at most 8 files). /tmp/keep and /tmp/phyai_bench
# outlive a call while the machine stays warm; each mode rebuilds what it needs when they are gone.
#   bash docs/device_runs/2026-12-07-autotune/session.sh pi05|groot|quant|tests
set -u
MODE=$1
export PYTHONUNBUFFERED=1 PHYAI_PARITY_FIXTURES=$PWD/.device_shared/shared/fixtures/lerobot_parity
TOK=$PHYAI_PARITY_FIXTURES/tokenizer/tokenizer.model
B="python3 -m phyai_ros.bench"
K=/tmp/keep/$MODE
CK=/tmp/phyai_bench/pi05-full/checkpoint
GR=/tmp/phyai_bench/groot_n17-full
mkdir -p "$K" /tmp/h200only && cp profiles/h200.json /tmp/h200only/
T0=$SECONDS
LIMIT=${LIMIT:-575}   # seconds this call's steps may take (the device call's limit is 600)
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
git log -1 --format='commit %h %s' 2>/dev/null | cut -c1-100

step() {   # step NAME CMD...: the command's output to $K/NAME.log, its tail and wall time here
  local name=$1 s=$SECONDS; shift
  echo "=== $name ($((SECONDS - T0)) s in): $*"
  local left=$((LIMIT - (SECONDS - T0)))
  if [ $left -lt 20 ]; then echo "=== $name skipped: $left s left"; return; fi
  timeout $left "$@" > "$K/$name.log" 2>&1
  local rc=$?
  grep -E "median|profile for|written|chunks/s|autotune|quantized plan|passed|failed|Error|error" "$K/$name.log" \
    | grep -v "^  warnings" | tail -6
  echo "=== $name rc=$rc $((SECONDS - s)) s"
  tar czf "$OUT/$MODE.tgz" -C "$K" .   # after every step: what a killed call leaves still comes back
}

summary() {   # the batch medians of every record in $K
  python3 - "$K" <<'EOF'
import json, sys, pathlib
def walk(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items():
            if k in ("median_ms", "T_sync_ms", "Q_per_s", "chunks_per_s", "autotune_s", "operator_profile_origin",
                     "quant_plan") or (k.startswith("batch") and not isinstance(v, (dict, list))):
                print(f"  {path}{k} = {v}")
            elif isinstance(v, (dict, list)) and k not in ("environment", "options", "steps", "ceilings"):
                walk(v, f"{path}{k}.")
    elif isinstance(x, list):
        for i, v in enumerate(x[:8]):
            walk(v, f"{path}{i}.")
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    data = json.loads(f.read_text())
    if "devices" not in data:   # a record, not a profile
        print(f.name); walk(data)
EOF
}

pack() {   # the profiles apart (at most 8 files come back), everything in the tarball
  for f in h100 fast g_fast q cache_tuned; do [ -f "$K/$f.json" ] && cp "$K/$f.json" "$OUT/"; done
  tar czf "$OUT/$MODE.tgz" -C "$K" .; summary; echo "total $((SECONDS - T0)) s"
}
trap pack EXIT

case $MODE in
pi05)   # no profile, the full profile (timed), the fast autotune (30 s), each benched at batch 1
  step bench_none   $B pi05 --profile none --batches 1 --iters 200 --out "$K/bench_none.json"
  step profile_full $B profile_ops --checkpoint "$CK" --tokenizer "$TOK" --out "$K/h100.json"
  step profile_fast $B profile_ops --checkpoint "$CK" --tokenizer "$TOK" --fast 30 --out "$K/fast.json"
  step bench_fast   $B pi05 --profile "$K/fast.json" --batches 1 --iters 200 --out "$K/bench_fast.json"
  step bench_full   $B pi05 --profile "$K/h100.json" --batches 1 --iters 200 --out "$K/bench_full.json"
  [ $((SECONDS - T0)) -lt 470 ] && step bench_none2 $B pi05 --profile none --batches 1 --iters 200 \
    --out "$K/bench_none2.json"
  ;;
groot)  # GR00T likewise (merged into the H100 profile), then the node's start-up tuning on a fresh cache, twice
  cp profiles/h100.json "$K/h100.json"
  step g_none   $B groot_n17 --views 1 --batches 1 --iters 200 --profile none --out "$K/g_bench_none.json"
  step g_full   $B profile_ops --groot "$GR/checkpoint_1view" --groot "$GR/checkpoint_2views" --merge \
    --out "$K/h100.json"
  step g_fast   $B profile_ops --groot "$GR/checkpoint_1view" --fast 30 --out "$K/g_fast.json"
  step g_bfast  $B groot_n17 --views 1 --batches 1 --iters 200 --profile "$K/g_fast.json" --out "$K/g_bench_fast.json"
  step g_bfull  $B groot_n17 --views 1 --batches 1 --iters 200 --profile "$K/h100.json" --out "$K/g_bench_full.json"
  [ -f "$CK/model.safetensors" ] || step ckpt $B pi05 --profile none --batches 1 --iters 5 --out "$K/ckpt.json"
  export PHYAI_PROFILE_CACHE=$K/cache PHYAI_PROFILES_DIR=/tmp/h200only
  step node_tune  $B pi05 --checkpoint "$CK" --iters 200 --out "$K/node_tune_bench.json"
  step node_again $B pi05 --checkpoint "$CK" --iters 200 --out "$K/node_again_bench.json"
  cp "$K"/cache/*.json "$K/cache_tuned.json"
  unset PHYAI_PROFILE_CACHE PHYAI_PROFILES_DIR
  step bench_cache $B pi05 --profile "$K/cache_tuned.json" --batches 1 --iters 200 --out "$K/bench_cache.json"
  step bench_full  $B pi05 --profile profiles/h100.json --batches 1 --iters 200 --out "$K/bench_full.json"
  ;;
groot_full)  # GR00T's full profile (one view) merged into the H100 profile, benched
  cp profiles/h100.json "$K/h100.json"
  step g_full  $B profile_ops --groot "$GR/checkpoint_1view" --merge --out "$K/h100.json"
  step g_bfull $B groot_n17 --views 1 --batches 1 --iters 200 --profile "$K/h100.json" --out "$K/g_bench_full.json"
  step g_none  $B groot_n17 --views 1 --batches 1 --iters 200 --profile none --out "$K/g_bench_none.json"
  ;;
quant)  # the measured plan against every-linear and bf16, batches 1, 8, 32, on one profile file
  Q=qlinear,qlinear_geglu,qlinear_add_rms_norm,qlinear_gated_ada_rms_norm,qlinear_add_layer_norm,qlinear_gelu_tanh
  step w8a8_measured $B pi05 --quant w8a8 --batches 1,8,32 --iters 200 --batch-iters 20 --profile profiles/h100.json \
    --autotune "$K/q.json" --autotune-ops $Q --out "$K/w8a8_measured_bench.json"
  step bf16          $B pi05 --batches 1,8,32 --iters 200 --batch-iters 20 --profile "$K/q.json" --out "$K/bf16_bench.json"
  step w8a8_all      $B pi05 --quant w8a8 --batches 1,8,32 --iters 200 --batch-iters 20 --profile "$K/q.json" \
    --out "$K/w8a8_all_bench.json" -- --quant-plan all
  for s in w8a16 w4a16; do
    [ $((SECONDS - T0)) -lt 380 ] && step ${s}_measured $B pi05 --quant $s --batches 1,8,32 --iters 200 \
      --batch-iters 20 --profile "$K/q.json" --autotune "$K/q.json" --autotune-ops $Q --autotune-fast 45 \
      --out "$K/${s}_measured_bench.json"
  done
  ;;
tests)
  step gpu_tests timeout 400 python3 -m pytest -q -m gpu -n 6 --dist load -p no:cacheprovider \
    test/test_op_profiles_gpu.py test/test_quant_gpu.py test/test_profile_ops.py \
    test/test_dispatch.py
  ;;
esac
