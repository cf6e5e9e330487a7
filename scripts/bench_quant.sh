#!/usr/bin/env bash
# Quantized execution on one CUDA device, as recorded in docs/benchmarks.md (issue 15), bf16 from the same call:
#   STEPS=tests,accuracy,prep,bench (default: all), MODELS="pi05 pi0", SCHEMES="w8a16 w8a8 w4a16".
#   tests:    the GPU tests of the quantized kernels / ops / graphs (and flashinfer's, the profiles', when present)
#   accuracy: scripts/quant_accuracy.py --full per model (full size, random weights, vs bf16, same noise)
#   prep:     a random full-size bf16 checkpoint per model, quantized by `python -m phyai_ros.quant --device cuda`
#             per scheme;
#   bench:    each timed by scripts/bench_runtime.py (batch 1 and 32) with the operator profile in
#             force ($PHYAI_OP_PROFILE, else the device's shipped one); PROFILE=1 first profiles the quantized
#             models' ops (scripts/profile_ops.py) and benches with that profile.
# Everything lands in $OUT as run.log, the JSON files and one tarball (at most 8 files come back from a device).
# Expects .device_shared/ (a copy of ../shared/fixtures: tokenizer, parity fixtures) in the repo root.
set -u
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export PHYAI_PARITY_FIXTURES=$PWD/.device_shared/fixtures/lerobot_parity
TOK=$PHYAI_PARITY_FIXTURES/tokenizer/tokenizer.model
OUT=${OUT:-/tmp/phyai_out}; mkdir -p "$OUT/json"
LOG=$OUT/run.log
STEPS=${STEPS:-tests,accuracy,prep,bench}
MODELS=${MODELS:-pi05 pi0}
SCHEMES=${SCHEMES-w8a16 w8a8 w4a16}   # SCHEMES="": bf16 only
ITERS=${ITERS:-100}
step() { local name=$1 limit=$2; shift 2; echo "=== $name" | tee -a "$LOG"; local t=$SECONDS
  timeout "$limit" "$@" >> "$LOG" 2>&1; echo "rc=$? $name $((SECONDS - t)) s" | tee -a "$LOG"; }
has() { case ",$STEPS," in *",$1,"*) return 0;; esac; return 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv >> "$LOG"
B="python3 scripts/bench_runtime.py --tokenizer $TOK"

if has tests; then
  step gpu_tests 300 python3 -m pytest -q -m gpu -p no:cacheprovider \
    ${TESTS:-test/test_quant_gpu.py test/test_flashinfer_gpu.py test/test_op_profiles_gpu.py test/test_kernels_gpu.py}
fi
if has accuracy; then
  for m in $MODELS; do
    step "accuracy_$m" 240 python3 scripts/quant_accuracy.py --full --model "$m" --out "$OUT/json/accuracy_$m.json"
  done
fi
if has prep; then   # the checkpoints alone (e.g. in the background of other steps), then STEPS=bench
  for m in $MODELS; do
    ck=/tmp/ck_$m
    step "ckpt_$m" 120 $B --model "$m" --checkpoint "$ck" --checkpoint-only
    for s in $SCHEMES; do
      step "quantize_${m}_$s" 120 python3 -m phyai_ros.quant --checkpoint "$ck" --output "${ck}_$s" --scheme "$s" \
        --device cuda
    done
  done
fi
if has bench; then
  for m in $MODELS; do
    ck=/tmp/ck_$m
    if [ "${PROFILE:-0}" = 1 ]; then
      args=(); for s in bf16 $SCHEMES; do [ "$s" = bf16 ] && args+=(--checkpoint "$ck") || args+=(--checkpoint "${ck}_$s"); done
      step "profile_$m" 240 python3 scripts/profile_ops.py "${args[@]}" --tokenizer "$TOK" --out "$OUT/json/profile_$m.json"
      [ -f "$OUT/json/profile_$m.json" ] && export PHYAI_OP_PROFILE=$OUT/json/profile_$m.json
    fi
    for s in bf16 $SCHEMES; do
      path=$ck; [ "$s" = bf16 ] || path=${ck}_$s
      step "bench_${m}_$s" 150 $B --model "$m" --checkpoint "$path" --reuse-checkpoint --skip-startup \
        --iters "$ITERS" --batches 1,32 --batch-iters 10 --out "$OUT/json/bench_${m}_$s.json"
    done
  done
fi
if [ "${TAR:-1}" = 1 ]; then tar -czf "$OUT/results.tgz" -C "$OUT" json run.log 2>/dev/null && rm -rf "$OUT/json"; fi
