#!/usr/bin/env bash
# One GPU session's measurements, as recorded in docs/benchmarks.md. Results land in $OUT: run.log (every
# step's output) and the JSON files (at most 8 files come back from the device).
#   default:        random full-size pi0.5 and pi0 checkpoints -> GPU tests -> operator profile of both models
#                   -> pi0.5 and pi0 benchmarks with that profile -> LeRobot pi0 eager (same call)
#                   (TESTS=0 skips the GPU tests, LEROBOT=0 the LeRobot run)
#   COMPILED=1:     pi0 checkpoint, its operator profile, pi0 batch-1 benchmark -> LeRobot pi0 eager + torch.compile
#                   reduce-overhead (its compilation takes ~6.5 min)
#   QUICK=1:        for a short device budget, most important first: the GPU tests of the loop's kernels and the
#                   pi0 bf16 parity (checkpoints written meanwhile) -> profile of both models -> pi0 batch 1 with and
#                   without programmatic dependent launch (PHYAI_PDL=0) -> pi0.5 batch 1 -> the other GPU tests
#   CAMERAS=1:      a camera absent: the runner's GPU test of skipping it under graphs, then pi0.5 batch 1 with 3
#                   cameras, with 2 (the third skipped) and with 2 computed masked (--keep-absent)
#   EXPERT=1:       the expert layer stack (issue 21): scripts/bench_expert_layer.py (correctness of every variant,
#                   time per layer-step, kernel timeline, the loop in the runner; ~7 min, its JSON in $OUT)
#   EXPERT_TESTS=1: its GPU tests and those of the ops around it (one device call of its own, ~5 min):
#                   pytest -m gpu test/test_expert_layer_gpu.py test/test_dispatch.py test/test_runner.py
#                   test/test_pi05_parity.py test/test_pi0_parity.py
#   PREFETCH=1:     the expert stack with its GEMMs' weights prefetched into L2 during attention (issue 21,
#                   2026-12-02): its GPU tests, bench_expert_layer's check + time of every prefetching form against
#                   today's path (pi0.5 and pi0, batch 1 and 32), expert_stack profiled into a copy of the shipped
#                   profile, then pi0.5 and pi0 batch 1 on the shipped profile and on that copy
#   L2_GROOT=1:     the second round of it (the bulk prefetch with more programs; pi0.5 batch 1 check, time and
#                   the runner's loop with the stack forced to each form) beside GR00T one and two views, batch 1
#                   and 32, on the shipped profile (the backbone's residual adds fused into its norms, SwiGLU fused)
#   ROPE_GELU=1:    RoPE over row blocks (one program per 16-64 (token, head) rows, not one per row) and the
#                   library GEMM's GELU epilogue for many rows: their GPU tests; linear_gelu_tanh profiled into a
#                   copy of the shipped profile; GR00T (one and two views, batch 1 and 32) before (.before/ = the
#                   tree before) and after (on that copy); pi0.5 batch 1 likewise (pi0's profile entries are
#                   made too)
#   ROPE_SWEEP=1:   qkv_rope's rows per program x warps at the four models' shapes (bench_kernels.py --rope-sweep),
#                   then pi0.5 batch 1 and GR00T one and two views batch 1, before (.before/) and after, on the
#                   shipped profile (its many-row linear_gelu_tanh entries from ROPE_GELU's call)
#   ROPE_FINAL=1:   the RoPE launch plan as committed (blocks of rows from 2048 rows up): the GPU tests it and the
#                   many-row GELU epilogue touch, pi0.5 and pi0 batch 1 before (.before/) and after, GR00T one and
#                   two views batch 1 and 32 on the shipped profile
#   PDL_LATE=1:     the late PDL trigger (PHYAI_PDL_TRIGGER=late: GEMM / attention kernels let the next kernel in
#                   after their main loop): its GPU test, then pi0.5, pi0 and GR00T batch 1 with each trigger
#   ROUND9=1:       PDL_LATE's and ATTN_PROFILE's measurements in one call, the prefix's eight-warp tilings with them
#   ROUND9B=1:      ROUND9's profile again with the tests' tracebacks and GR00T's views / batch 32 (one tarball)
#   ROUND9C=1:      the short-attention default before / after, GR00T's two-view profile, pi0.5 batch 32
#   ROUND9D=1:      the five-stage skinny tilings profiled at the few-row GEMM ops, each model before / after
#   GPU_SUITE=a / b / c / d: the whole gpu suite in four calls (kernel files, models and runners, the expert
#                   stack's bf16 forms, its fp32 / graph / selector tests); GPU_SUITE=all: in one call, over
#                   GPU_WORKERS (8) pytest-xdist workers
#   COSMOS_BATCH=1: Cosmos3's start-up, batch 1 (the swiglu gate) and batches 2, 4, 8 at 480x832
#   COSMOS_PROFILE=1: Cosmos3's shapes profiled into a copy of the shipped profile; Cosmos3 on each
#   HOST_PRECISION=1: the pi policy path's host time under cProfile; Cosmos3 fp32 / bf16 / fp8 at full size
#   PINNED=1:       frames pinned where they arrive (no staging copy on the chunk's path): GPU tests (with GR00T's
#                   projected attention), the pi policy path, GR00T's image to chunk, on the shipped profile
#   PROFILE_ATTN=1: the pi prefix attention's two-split tilings and GR00T's projected attention profiled into a copy
#                   of the shipped profile; pi0.5, pi0 and GR00T on it
#   POLICY_FP8=1:   the pi policy path with the vision graph started early; Cosmos3 bf16 and fp8 end to end
#   POST_NORM=1:    2026-12-02 (fourth session, call 1): the norm after the next GEMM's dot (GR00T's DiT, the pi expert), tested, profiled, timed
#   ATTN_PROFILE=1: the short-query attention tilings (16 / 32-row tiles) profiled for GR00T into a copy of the
#                   shipped profile, GR00T one and two views on each; with the GPU tests landed untested on
#                   2026-12-02 (every attention tiling, the Cosmos3 runner's text-cache graphs)
#   GROOT_PROFILE=1 / GROOT_FINAL=1 / SHIPPED=1: GR00T's operator-profile round (issue 23, 2026-12-02): its
#                   shapes profiled into the shipped profile, GR00T / pi0.5 / pi0 on it, start-up and the GPU suite
#                   on the committed file (each block below says what it runs)
# Expects (carried to the GPU machine): .device_shared/ = a copy of ../shared (tokenizer, parity fixtures) and
# .whl/ = LeRobot's wheels (see ../shared/device-wheels/README.md).
set -u
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export PHYAI_PARITY_FIXTURES=$PWD/.device_shared/fixtures/lerobot_parity
TOK=$PHYAI_PARITY_FIXTURES/tokenizer/tokenizer.model
OUT=${OUT:-/tmp/phyai_out}; mkdir -p "$OUT"
LOG=$OUT/run.log
step() { local name=$1 limit=$2; shift 2; echo "=== $name" | tee -a "$LOG"; local t=$SECONDS
  timeout "$limit" "$@" >> "$LOG" 2>&1; echo "rc=$? $name $((SECONDS - t)) s" | tee -a "$LOG"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv >> "$LOG"
B="python3 scripts/bench_runtime.py --tokenizer $TOK"
LR="python3 scripts/lerobot_reference.py --policy pi0"
lerobot() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl >> "$LOG" 2>&1; PYTHONPATH=/tmp/site step "$@"; }
PROFILE=$OUT/profile_h200.json
# Full-size random checkpoints written in the background (pi05 -> /tmp/ck05, pi0 -> /tmp/ck0, groot -> /tmp/groot);
# `wait; cat "$OUT/ckpt.log" >> "$LOG"` before their first use.
checkpoints() { ( for what in "$@"; do case $what in
    pi05) $B --checkpoint /tmp/ck05 --checkpoint-only ;;
    pi0) $B --model pi0 --checkpoint /tmp/ck0 --checkpoint-only ;;
    groot) python3 scripts/bench_groot.py --root /tmp/groot --views "" --skip-startup --out /tmp/groot_ckpt.json ;;
  esac; done > "$OUT/ckpt.log" 2>&1 ) & }
if [ "${PREFETCH:-0}" = 1 ]; then
  checkpoints pi05 pi0
  step gpu_tests 100 python3 -m pytest -q -m gpu -p no:cacheprovider test/test_l2_prefetch_gpu.py \
    test/test_kernels_gpu.py -k "prefetch or add_rms_norm_real_shapes or swiglu_groot"
  wait; cat "$OUT/ckpt.log" >> "$LOG"
  forms=unfused,$(python3 -c "from phyai_ros.layers.expert_stack import PREFETCH_FORMS as F; print(','.join(f[0] for f in F))")
  step bench_expert 170 python3 scripts/bench_expert_layer.py --parts check,time --models pi05,pi0 --batches 1,32 \
    --variants "$forms" --budget-s 160 --out "$OUT/bench_expert_layer.json"
  cp profiles/h200.json "$PROFILE"
  step profile_stack 100 python3 scripts/profile_ops.py --checkpoint /tmp/ck05 --checkpoint /tmp/ck0 \
    --tokenizer "$TOK" --ops expert_stack --merge --out "$PROFILE"
  for m in pi05 pi0; do ck=/tmp/ck05; [ $m = pi0 ] && ck=/tmp/ck0
    step "${m}_shipped" 45 $B --model $m --checkpoint $ck --reuse-checkpoint --skip-startup --iters 200 --batches 1 \
      --out "$OUT/${m}_shipped.json"
    PHYAI_OP_PROFILE=$PROFILE step "${m}_l2" 45 $B --model $m --checkpoint $ck --reuse-checkpoint --skip-startup \
      --iters 200 --batches 1 --out "$OUT/${m}_l2.json"
  done
  grep -h "^time \|expert_stack \|batch 1:\|passed\|failed" "$LOG" | cut -c1-300
  exit 0
fi
if [ "${L2_GROOT:-0}" = 1 ]; then
  checkpoints pi05
  step gpu_tests 90 python3 -m pytest -q -m gpu -p no:cacheprovider test/test_l2_prefetch_gpu.py
  wait; cat "$OUT/ckpt.log" >> "$LOG"; ln -sfn /tmp/ck05 /tmp/bench_expert_pi05
  step bench_expert 200 python3 scripts/bench_expert_layer.py --parts check,time,runner --models pi05 --batches 1 \
    --variants unfused,unfused_l2_bulk16,unfused_l2_bulk64,unfused_l2_lines64 --budget-s 190 --runner-reserve-s 120 \
    --runner-iters 100 --ckpt-dir /tmp --out "$OUT/bench_expert_layer.json"
  step groot 220 python3 scripts/bench_groot.py --root /tmp/groot --views 1,2 --batches 1,32 --iters 200 \
    --skip-startup --out "$OUT/groot.json"
  grep -h "^time \|^runner \|passed\|failed\|view(s),\|^loop\|^backbone\|^context\|^ 32 " "$LOG" | cut -c1-300
  exit 0
fi
if [ "${ROPE_GELU:-0}" = 1 ]; then
  checkpoints pi05 pi0 groot
  step gpu_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider test/test_kernels_gpu.py test/test_dispatch.py \
    test/test_groot_n17_gpu.py -k "rope or qwen or cublaslt or groot or capture"
  wait; cat "$OUT/ckpt.log" >> "$LOG"
  cp profiles/h200.json "$PROFILE"
  step profile_gelu 110 python3 scripts/profile_ops.py --checkpoint /tmp/ck05 --checkpoint /tmp/ck0 --tokenizer "$TOK" \
    --groot /tmp/groot/checkpoint_1view --groot /tmp/groot/checkpoint_2views --ops linear_gelu_tanh --merge \
    --out "$PROFILE"
  G="python3 scripts/bench_groot.py --root /tmp/groot --reuse-checkpoint --skip-startup --iters 200"
  (cd .before && step groot_before 60 $G --views 1 --batches 1 --out "$OUT/groot_before.json")
  PHYAI_OP_PROFILE=$PROFILE step groot_rope_gelu 100 $G --views 1,2 --batches 1,32 --out "$OUT/groot_rope_gelu.json"
  for m in pi05; do ck=/tmp/ck05
    (cd .before && step "${m}_before" 30 python3 scripts/bench_runtime.py --tokenizer "$TOK" --model $m \
      --checkpoint $ck --reuse-checkpoint --skip-startup --iters 200 --batches 1 --out "$OUT/${m}_before.json")
    PHYAI_OP_PROFILE=$PROFILE step "${m}_after" 30 $B --model $m --checkpoint $ck --reuse-checkpoint --skip-startup \
      --iters 200 --batches 1 --out "$OUT/${m}_after.json"
  done
  grep -h "=== \|passed\|failed\|view(s),\|^loop\|^backbone\|^context\|^ 32 \|batch 1: median\|^vision\|^prefix\|linear_gelu_tanh " \
    "$LOG" | cut -c1-300
  exit 0
fi
if [ "${ROPE_SWEEP:-0}" = 1 ]; then
  checkpoints pi05 groot
  step rope_sweep 200 python3 scripts/bench_kernels.py --rope-sweep
  wait; cat "$OUT/ckpt.log" >> "$LOG"
  G="python3 scripts/bench_groot.py --root /tmp/groot --reuse-checkpoint --skip-startup --iters 200 --batches 1"
  R="python3 scripts/bench_runtime.py --tokenizer $TOK --checkpoint /tmp/ck05 --reuse-checkpoint --skip-startup \
    --iters 200 --batches 1"
  (cd .before && step pi05_before 35 $R --out "$OUT/pi05_before.json")
  step pi05_after 35 $R --out "$OUT/pi05_after.json"
  (cd .before && step groot_before 60 $G --views 1,2 --out "$OUT/groot_before.json")
  step groot_after 60 $G --views 1,2 --out "$OUT/groot_after.json"
  grep -h "=== \|^rope \|view(s),\|^loop\|^backbone\|^context\|batch 1: median\|^vision\|^prefix" "$LOG" | cut -c1-300
  exit 0
fi
if [ "${ROPE_FINAL:-0}" = 1 ]; then
  checkpoints pi05 pi0 groot
  step gpu_tests 230 python3 -m pytest -q -m gpu -p no:cacheprovider test/test_kernels_gpu.py test/test_dispatch.py \
    test/test_groot_n17_gpu.py test/test_op_profiles_gpu.py test/test_pi05_parity.py test/test_pi0_parity.py \
    -k "rope or qwen or groot or cublaslt or dispatch or profile or parity or capture"
  wait; cat "$OUT/ckpt.log" >> "$LOG"
  for m in pi05 pi0; do ck=/tmp/ck05; [ $m = pi0 ] && ck=/tmp/ck0
    R="python3 scripts/bench_runtime.py --tokenizer $TOK --model $m --checkpoint $ck --reuse-checkpoint --skip-startup \
      --iters 200 --batches 1"
    (cd .before && step "${m}_before" 35 $R --out "$OUT/${m}_before.json")
    step "${m}_after" 35 $R --out "$OUT/${m}_after.json"
  done
  step groot 100 python3 scripts/bench_groot.py --root /tmp/groot --reuse-checkpoint --skip-startup --iters 200 \
    --views 1,2 --batches 1,32 --out "$OUT/groot.json"
  grep -h "=== \|passed\|failed\|view(s),\|^loop\|^backbone\|^context\|^ 32 \|batch 1: median\|^vision\|^prefix" \
    "$LOG" | cut -c1-300
  exit 0
fi
if [ "${PDL_LATE:-0}" = 1 ]; then
  checkpoints pi05 pi0 groot
  step gpu_tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider test/test_kernels_gpu.py -k "pdl"
  wait; cat "$OUT/ckpt.log" >> "$LOG"
  for trigger in early late; do
    for m in pi05 pi0; do ck=/tmp/ck05; [ $m = pi0 ] && ck=/tmp/ck0
      PHYAI_PDL_TRIGGER=$trigger step "${m}_$trigger" 40 $B --model $m --checkpoint $ck --reuse-checkpoint \
        --skip-startup --iters 200 --batches 1 --out "$OUT/${m}_$trigger.json"
    done
    PHYAI_PDL_TRIGGER=$trigger step "groot_$trigger" 60 python3 scripts/bench_groot.py --root /tmp/groot \
      --reuse-checkpoint --skip-startup --iters 200 --views 1 --batches 1 --out "$OUT/groot_$trigger.json"
  done
  grep -h "=== \|passed\|failed\|view(s),\|^loop\|^backbone\|batch 1: median\|^vision\|^prefix" "$LOG" | cut -c1-300
  exit 0
fi
if [ "${ROUND9:-0}" = 1 ]; then
  # 2026-12-02, third session: the late PDL trigger and the attention tilings (eight warps for head_dim 256, 16 /
  # 32-row tiles for the DiT) profiled for pi0.5, pi0 and GR00T into a copy of the shipped profile; each model on
  # the shipped profile (early and late trigger) and on the copy.
  checkpoints pi05 pi0 groot
  step gpu_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider test/test_kernels_gpu.py test/test_dispatch.py \
    -k "pdl or attention_tiling"
  wait; cat "$OUT/ckpt.log" >> "$LOG"
  cp profiles/h200.json "$PROFILE"
  step profile_attention 190 python3 scripts/profile_ops.py --checkpoint /tmp/ck05 --checkpoint /tmp/ck0 \
    --tokenizer "$TOK" --groot /tmp/groot/checkpoint_1view --ops attention,attention_with_prefix --merge --out "$PROFILE"
  for m in pi05 pi0; do ck=/tmp/ck05; [ $m = pi0 ] && ck=/tmp/ck0
    step "${m}_shipped" 40 $B --model $m --checkpoint $ck --reuse-checkpoint --skip-startup --iters 200 --batches 1 \
      --out "$OUT/${m}_shipped.json"
    PHYAI_OP_PROFILE=$PROFILE step "${m}_attention" 40 $B --model $m --checkpoint $ck --reuse-checkpoint \
      --skip-startup --iters 200 --batches 1 --out "$OUT/${m}_attention.json"
  done
  PHYAI_PDL_TRIGGER=late step pi05_late 40 $B --checkpoint /tmp/ck05 --reuse-checkpoint --skip-startup --iters 200 \
    --batches 1 --out "$OUT/pi05_late.json"
  G="python3 scripts/bench_groot.py --root /tmp/groot --reuse-checkpoint --skip-startup --iters 200 --batches 1 --views 1"
  step groot_shipped 45 $G --out "$OUT/groot_shipped.json"
  PHYAI_OP_PROFILE=$PROFILE step groot_attention 45 $G --out "$OUT/groot_attention.json"
  PHYAI_PDL_TRIGGER=late step groot_late 45 $G --out "$OUT/groot_late.json"
  grep -h "=== \|passed\|failed\|view(s),\|^loop\|^backbone\|batch 1: median\|^vision\|^prefix\|^attention" "$LOG" \
    | cut -c1-300
  exit 0
fi
if [ "${ROUND9B:-0}" = 1 ]; then
  # ROUND9's profile again (its file did not come back), the attention-tiling and Cosmos3 GPU tests with their
  # tracebacks, GR00T one and two views, batch 1 and 32, on the new profile. Everything under $OUT in one tarball.
  checkpoints pi05 pi0 groot
  step gpu_tests 170 python3 -m pytest -q -m gpu -p no:cacheprovider --tb=short test/test_dispatch.py \
    test/test_cosmos3_runner.py -k "prefix_attention_tiling or cosmos3"
  wait; cat "$OUT/ckpt.log" >> "$LOG"
  cp profiles/h200.json "$PROFILE"
  step profile_attention 190 python3 scripts/profile_ops.py --checkpoint /tmp/ck05 --checkpoint /tmp/ck0 \
    --tokenizer "$TOK" --groot /tmp/groot/checkpoint_1view --ops attention,attention_with_prefix --merge --out "$PROFILE"
  PHYAI_OP_PROFILE=$PROFILE step groot_attention 120 python3 scripts/bench_groot.py --root /tmp/groot \
    --reuse-checkpoint --skip-startup --iters 200 --batches 1,32 --views 1,2 --out "$OUT/groot_attention.json"
  grep -h "=== \|passed\|failed\|view(s),\|^loop\|^backbone\|batch 32" "$LOG" | cut -c1-300
  tar -C "$OUT" -czf /tmp/round9b.tgz . && rm -rf "${OUT:?}"/* && mv /tmp/round9b.tgz "$OUT/"
  exit 0
fi
if [ "${ROUND9C:-0}" = 1 ]; then
  # The short-attention default (no profile: GR00T's attention on 16-row tiles, not SDPA) before (.before/) and
  # after; GR00T's two-view attention shapes profiled; pi0.5 at batch 1 and 32 on the new shipped profile and
  # unprofiled; the fixed prefix-tiling test and GR00T's GPU tests. One tarball.
  checkpoints pi05 groot
  step gpu_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider --tb=short test/test_dispatch.py \
    test/test_groot_n17_gpu.py -k "prefix_attention_tiling or groot"
  wait; cat "$OUT/ckpt.log" >> "$LOG"
  cp profiles/h200.json "$PROFILE"
  step profile_2views 120 python3 scripts/profile_ops.py --groot /tmp/groot/checkpoint_2views --ops attention --merge \
    --out "$PROFILE"
  G="scripts/bench_groot.py --root /tmp/groot --reuse-checkpoint --skip-startup --iters 200 --batches 1"
  (cd .before && PHYAI_OP_PROFILE=none step groot_none_before 50 python3 $G --views 1 --out "$OUT/groot_none_before.json")
  PHYAI_OP_PROFILE=none step groot_none_after 50 python3 $G --views 1 --out "$OUT/groot_none_after.json"
  PHYAI_OP_PROFILE=$PROFILE step groot_profiled 70 python3 $G --views 1,2 --out "$OUT/groot_profiled.json"
  step pi05_shipped 60 $B --checkpoint /tmp/ck05 --reuse-checkpoint --skip-startup --iters 200 --batches 1,32 \
    --out "$OUT/pi05_shipped.json"
  PHYAI_OP_PROFILE=none step pi05_none 40 $B --checkpoint /tmp/ck05 --reuse-checkpoint --skip-startup --iters 200 \
    --batches 1 --out "$OUT/pi05_none.json"
  grep -h "=== \|passed\|failed\|view(s),\|^loop\|^backbone\|batch 32\|batch 1: median\|^prefix\|chunks/s" "$LOG" \
    | cut -c1-300
  tar -C "$OUT" -czf /tmp/round9c.tgz . && rm -rf "${OUT:?}"/* && mv /tmp/round9c.tgz "$OUT/"
  exit 0
fi
if [ "${ROUND9D:-0}" = 1 ]; then
  # The five-stage skinny tilings (from --gemm-sweep) profiled at every few-row GEMM op of pi0.5, pi0 and GR00T
  # into a copy of the shipped profile, each model on the copy and on the shipped profile; the new tilings' GPU
  # tests. At most 8 files under $OUT (what a call brings back), each written as soon as it is made.
  checkpoints pi05 pi0 groot
  step gpu_tests 70 python3 -m pytest -q -m gpu -p no:cacheprovider --tb=short test/test_dispatch.py -k "st5"
  wait; cat "$OUT/ckpt.log" >> "$LOG"; rm -f "$OUT/ckpt.log"
  cp profiles/h200.json "$PROFILE"
  step profile_gemms 200 python3 scripts/profile_ops.py --checkpoint /tmp/ck05 --checkpoint /tmp/ck0 \
    --tokenizer "$TOK" --groot /tmp/groot/checkpoint_1view \
    --ops linear,linear_geglu,linear_gated_ada_rms_norm,linear_add_rms_norm,linear_add_layer_norm,linear_gelu_tanh \
    --merge --out "$PROFILE"
  G="python3 scripts/bench_groot.py --root /tmp/groot --reuse-checkpoint --skip-startup --iters 200 --batches 1 --views 1"
  PHYAI_OP_PROFILE=$PROFILE step groot_gemms 40 $G --out "$OUT/groot_gemms.json"
  PHYAI_OP_PROFILE=$PROFILE step pi05_gemms 35 $B --checkpoint /tmp/ck05 --reuse-checkpoint --skip-startup \
    --iters 200 --batches 1 --out "$OUT/pi05_gemms.json"
  step groot_shipped 40 $G --out "$OUT/groot_shipped.json"
  step pi05_shipped 35 $B --checkpoint /tmp/ck05 --reuse-checkpoint --skip-startup --iters 200 --batches 1 \
    --out "$OUT/pi05_shipped.json"
  PHYAI_OP_PROFILE=$PROFILE step pi0_gemms 35 $B --model pi0 --checkpoint /tmp/ck0 --reuse-checkpoint --skip-startup \
    --iters 200 --batches 1 --out "$OUT/pi0_gemms.json"
  grep -h "=== \|passed\|failed\|view(s),\|^loop\|^backbone\|batch 1: median\|^prefix\|^vision" "$LOG" | cut -c1-300
  exit 0
fi
if [ -n "${GPU_SUITE:-}" ]; then
  # The whole `gpu` suite in four calls (a fresh machine compiles every Triton kernel first: one call does not
  # fit; 2026-12-02, seventh session: the kernel files and 24 expert-stack tests took the 540 s of one call):
  # GPU_SUITE=a the kernel files, b the models' and runners' files, c the expert stack's fused forms in bf16
  # (24 tests, ~300 s), d its fp32, graph-replay and selector tests (9; each compiles several persistent kernels,
  # 20-60 s apiece). -v with unbuffered output: every test's verdict reaches the log even when the limit ends it.
  kernels="test/test_kernels_gpu.py test/test_dispatch.py test/test_post_norm.py test/test_l2_prefetch_gpu.py \
    test/test_op_profiles_gpu.py"
  expert="test/test_expert_layer_gpu.py"
  pick=()
  case $GPU_SUITE in
    a) files=$kernels ;;
    c) files=$expert; pick=(-k test_stack_bf16_vs_fp32) ;;
    d) files=$expert; pick=(-k "not test_stack_bf16_vs_fp32") ;;
    all) files=$(grep -l "mark.gpu" test/*.py | tr '\n' ' ')
      # every gpu file in one call, over worker processes (pytest-xdist is in the device image): the time is
      # Triton compiling on the CPU, which one process does serially. No test times anything.
      pick=(-n "${GPU_WORKERS:-8}" --dist load) ;;
    *) files=$(grep -l "mark.gpu" test/*.py | grep -v -F -x -f <(printf '%s\n' $kernels $expert) | tr '\n' ' ') ;;
  esac
  step "gpu_suite_$GPU_SUITE" 560 python3 -u -m pytest -v -rfEs -m gpu "${pick[@]}" -p no:cacheprovider \
    --tb=short --durations=15 $files
  if [ "$GPU_SUITE" = all ]; then  # every verdict is in run.log; here what failed, the slowest and the tally
    grep -h "=== \|FAILED\|ERROR\|SKIPPED\|passed\|failed\|rc=\|^[0-9.]*s \(call\|setup\)" "$LOG" | cut -c1-300
  else
    grep -h "=== \|PASSED\|FAILED\|ERROR\|SKIPPED\|passed\|failed\|rc=" "$LOG" | cut -c1-300
  fi
  exit 0
fi
if [ "${COSMOS_BATCH:-0}" = 1 ]; then
  # Issue 25's unmeasured items (2026-12-02, seventh session): Cosmos3's start-up to the first chunk in a fresh
  # process (weights drawn on the device), batch 1 at 480x832 with the MLP gate through dispatch.swiglu (fifth
  # session, untimed), and batches 2, 4, 8 (8 ran out of memory on 2026-12-01, when the VAE still encoded the
  # whole 33-frame clip), on the shipped profile. diffusers' 1431 ms (2026-12-01) is cited, not re-run.
  step cosmos3_batches 560 python3 -u scripts/bench_cosmos3.py --startup memory --diffusers off --images 480x832 \
    --iters 5 --batches 2,4,8 --batch-iters 2 --out "$OUT/cosmos3_batches.json"
  grep -h "=== \|start-up\|^480x832 \|^batch \|rc=" "$LOG" | cut -c1-400
  exit 0
fi
if [ "${COSMOS_PROFILE:-0}" = 1 ]; then
  # 2026-12-02, fourth session: Cosmos3's shapes into a copy of the shipped operator profile (random full-size
  # weights, one 480x832 chunk), then Cosmos3 at 480x832 on the shipped profile and on the copy (bf16; the copy
  # also with fp8 generation).
  cp profiles/h200.json "$PROFILE"
  step profile_cosmos3 300 python3 scripts/profile_ops.py --cosmos3 full --merge --out "$PROFILE"
  C="python3 scripts/bench_cosmos3.py --startup skip --diffusers off --images 480x832 --iters 5"
  step cosmos3_shipped 80 $C --batches "" --out "$OUT/cosmos3_shipped.json"
  PHYAI_OP_PROFILE=$PROFILE step cosmos3_profiled 120 $C --batches "" --quantized w8a8 \
    --out "$OUT/cosmos3_profiled.json"
  grep -h "=== \|^attention\|^linear\|^rms_norm\|^qkv_norm\|written to\|^480x832 \(batch\|stages\)\|^quantized" \
    "$LOG" | cut -c1-400
  exit 0
fi
if [ "${HOST_PRECISION:-0}" = 1 ]; then
  # 2026-12-02, fourth session: where the pi policy path's host time goes until launched (cProfile over
  # predict_batch), and Cosmos3's full-size precision: one chunk in fp32, bf16 and bf16 + fp8 generation.
  checkpoints pi05 pi0
  step cosmos3_precision 200 python3 scripts/bench_cosmos3.py --precision --images 480x832 \
    --out "$OUT/cosmos3_precision.json"
  wait; cat "$OUT/ckpt.log" >> "$LOG"; rm -f "$OUT/ckpt.log"
  for m in pi05 pi0; do ck=/tmp/ck05; [ $m = pi0 ] && ck=/tmp/ck0
    step "$m" 50 $B --model $m --checkpoint $ck --reuse-checkpoint --skip-startup --iters 200 --batches 1 \
      --host-profile --out "$OUT/$m.json"
  done
  grep -h "=== \|batch 1: median\|policy path\|then graphs\|^fp32\|^bf16\|^w8a8" "$LOG" | cut -c1-400
  exit 0
fi
if [ "${PINNED:-0}" = 1 ]; then
  # 2026-12-02, fifth session (written without device time): frames already in pinned memory (the node's camera
  # callback puts them there) go over without a staging copy; the pi frames of one size are no longer copied into a
  # -1-filled buffer. The GPU tests of that, of the new prefix tilings and of GR00T's projected attention; pi0.5 /
  # pi0 policy path in all three forms (pi0.5 with cProfile of the node's form), GR00T one view's image to chunk
  # both ways, on the shipped profile. PROFILE_ATTN=1 is the second call.
  checkpoints pi05 groot pi0
  step gpu_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider --tb=short -rf test/test_transfer_gpu.py \
    test/test_runner.py test/test_pi05_parity.py test/test_projected_attention.py test/test_groot_n17_gpu.py \
    test/test_dispatch.py::test_every_prefix_attention_tiling_matches_fp32
  wait; cat "$OUT/ckpt.log" >> "$LOG"; rm -f "$OUT/ckpt.log"
  step pi05 45 $B --checkpoint /tmp/ck05 --reuse-checkpoint --skip-startup --iters 200 --batches 1 --host-profile \
    --out "$OUT/pi05.json"
  step groot 60 python3 scripts/bench_groot.py --root /tmp/groot --reuse-checkpoint --skip-startup --iters 200 \
    --batches 1 --views 1 --out "$OUT/groot.json"
  step pi0 40 $B --model pi0 --checkpoint /tmp/ck0 --reuse-checkpoint --skip-startup --iters 200 --batches 1 \
    --out "$OUT/pi0.json"
  grep -h "=== \|passed\|failed\|FAILED\|batch 1: median\|policy path\|then graphs\|as the node\|image to chunk\|rc=" \
    "$LOG" | cut -c1-400
  exit 0
fi
if [ "${PROFILE_ATTN:-0}" = 1 ]; then
  # 2026-12-02, fifth session (written without device time): the pi prefix attention's two-split / three-stage
  # tilings and GR00T's projected attention (one kernel for a DiT block's input projection and attention) profiled
  # into a copy of the shipped profile; pi0.5, pi0 and GR00T (one view, batch 1 and 32) on the copy, to compare
  # with PINNED's shipped-profile figures of the same session (GR00T also on the shipped profile here).
  checkpoints pi05 groot pi0
  wait; cat "$OUT/ckpt.log" >> "$LOG"; rm -f "$OUT/ckpt.log"
  cp profiles/h200.json "$PROFILE"
  step profile_attention 240 python3 scripts/profile_ops.py --checkpoint /tmp/ck05 --checkpoint /tmp/ck0 \
    --groot /tmp/groot/checkpoint_1view --tokenizer "$TOK" --ops attention,projected_attention --merge \
    --out "$PROFILE"
  for m in pi05 pi0; do ck=/tmp/ck05; [ $m = pi0 ] && ck=/tmp/ck0
    PHYAI_OP_PROFILE=$PROFILE step "${m}_attention" 40 $B --model $m --checkpoint $ck --reuse-checkpoint \
      --skip-startup --iters 200 --batches 1 --out "$OUT/${m}_attention.json"
  done
  G="python3 scripts/bench_groot.py --root /tmp/groot --reuse-checkpoint --skip-startup --iters 200 --views 1"
  step groot_shipped 50 $G --batches 1 --out "$OUT/groot_shipped.json"
  PHYAI_OP_PROFILE=$PROFILE step groot_attention 60 $G --batches 1,32 --out "$OUT/groot_attention.json"
  grep -h "=== \|batch 1: median\|batch 32\|^attention\|^projected_attention\|image to chunk\|rc=" "$LOG" | \
    cut -c1-400
  exit 0
fi
if [ "${POLICY_FP8:-0}" = 1 ]; then
  # 2026-12-02, fourth session: the pi family's policy path with the vision graph started before the prompt is
  # built (both forms in each bench_runtime run), and Cosmos3 end to end in bf16, then with its generation
  # pathway in fp8 (the same weights, quantized as the adapter loads them). At most 8 files.
  checkpoints pi05 pi0
  step gpu_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider --tb=short test/test_cosmos3_quantized.py \
    test/test_cosmos3_runner.py test/test_transfer_gpu.py
  wait; cat "$OUT/ckpt.log" >> "$LOG"; rm -f "$OUT/ckpt.log"
  for m in pi05 pi0; do ck=/tmp/ck05; [ $m = pi0 ] && ck=/tmp/ck0
    step "$m" 40 $B --model $m --checkpoint $ck --reuse-checkpoint --skip-startup --iters 200 --batches 1 \
      --out "$OUT/$m.json"
  done
  step cosmos3 290 python3 scripts/bench_cosmos3.py --startup skip --diffusers off --images 480x832,180x320 \
    --batches "" --iters 5 --quantized w8a8 --out "$OUT/cosmos3.json"
  grep -h "=== \|passed\|failed\|batch 1: median\|policy path\|then graphs\|^480x832\|^180x320\|^quantized" \
    "$LOG" | cut -c1-400
  exit 0
fi
if [ "${POST_NORM:-0}" = 1 ]; then
  # Next session (written 2026-12-02, not yet run): the norm after the next GEMM's dot (kernels/post_norm.py):
  # GR00T's DiT (linear_add_norm_gelu) and the pi expert (linear_gated_norm_geglu): the GPU tests, both ops
  # profiled into a copy of the shipped profile, each model on the copy and on the shipped one. At most 8 files.
  checkpoints pi05 pi0 groot
  step gpu_tests 170 python3 -m pytest -q -m gpu -p no:cacheprovider --tb=short test/test_post_norm.py \
    test/test_groot_n17_gpu.py test/test_pi05_parity.py test/test_runner.py
  wait; cat "$OUT/ckpt.log" >> "$LOG"; rm -f "$OUT/ckpt.log"
  cp profiles/h200.json "$PROFILE"
  step profile_post_norm 180 python3 scripts/profile_ops.py --checkpoint /tmp/ck05 --checkpoint /tmp/ck0 \
    --tokenizer "$TOK" --groot /tmp/groot/checkpoint_1view --ops linear_add_norm_gelu,linear_gated_norm_geglu \
    --merge --out "$PROFILE"
  G="python3 scripts/bench_groot.py --root /tmp/groot --reuse-checkpoint --skip-startup --iters 200 --batches 1"
  PHYAI_OP_PROFILE=$PROFILE step groot_post_norm 45 $G --views 1 --out "$OUT/groot_post_norm.json"
  step groot_shipped 45 $G --views 1 --out "$OUT/groot_shipped.json"
  for m in pi05 pi0; do ck=/tmp/ck05; [ $m = pi0 ] && ck=/tmp/ck0
    PHYAI_OP_PROFILE=$PROFILE step "${m}_post_norm" 30 $B --model $m --checkpoint $ck --reuse-checkpoint \
      --skip-startup --iters 200 --batches 1 --out "$OUT/${m}_post_norm.json"
    step "${m}_shipped" 30 $B --model $m --checkpoint $ck --reuse-checkpoint --skip-startup --iters 200 --batches 1 \
      --out "$OUT/${m}_shipped.json"
  done
  grep -h "=== \|passed\|failed\|view(s),\|^loop\|^backbone\|batch 1: median\|_norm_ge\|policy path\|then graphs" \
    "$LOG" | cut -c1-300
  exit 0
fi
if [ "${ATTN_PROFILE:-0}" = 1 ]; then
  checkpoints groot
  step gpu_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider test/test_dispatch.py test/test_cosmos3_runner.py \
    -k "attention_tiling or cosmos3"
  wait; cat "$OUT/ckpt.log" >> "$LOG"
  cp profiles/h200.json "$PROFILE"
  step profile_attention 120 python3 scripts/profile_ops.py --groot /tmp/groot/checkpoint_1view \
    --groot /tmp/groot/checkpoint_2views --ops attention --merge --out "$PROFILE"
  G="python3 scripts/bench_groot.py --root /tmp/groot --reuse-checkpoint --skip-startup --iters 200 --batches 1"
  step groot_shipped 60 $G --views 1,2 --out "$OUT/groot_shipped.json"
  PHYAI_OP_PROFILE=$PROFILE step groot_attention 60 $G --views 1,2 --out "$OUT/groot_attention.json"
  grep -h "=== \|passed\|failed\|view(s),\|^loop\|^backbone\|^attention " "$LOG" | cut -c1-300
  exit 0
fi
if [ "${QUICK:-0}" = 1 ]; then
  ( $B --model pi0 --checkpoint /tmp/ck0 --checkpoint-only > "$OUT/ckpt.log" 2>&1
    $B --checkpoint /tmp/ck05 --checkpoint-only >> "$OUT/ckpt.log" 2>&1 ) &
  step gpu_tests_loop 150 python3 -m pytest -q -m gpu -p no:cacheprovider test/test_kernels_gpu.py \
    test/test_pi0_parity.py test/test_runner.py -k "pdl or rope or cuda_graph or pi0 or fp32_and_bf16 or graph"
  wait; cat "$OUT/ckpt.log" >> "$LOG"
  step profile 120 python3 scripts/profile_ops.py --checkpoint /tmp/ck0 --checkpoint /tmp/ck05 --tokenizer "$TOK" \
    --out "$PROFILE"
  [ -f "$PROFILE" ] || PROFILE=profiles/h200.json
  PHYAI_OP_PROFILE=$PROFILE step bench_pi0 90 $B --model pi0 --checkpoint /tmp/ck0 --reuse-checkpoint \
    --skip-startup --iters 300 --batches 1 --out "$OUT/bench_pi0.json"
  PHYAI_PDL=0 PHYAI_OP_PROFILE=$PROFILE step bench_pi0_no_pdl 90 $B --model pi0 --checkpoint /tmp/ck0 \
    --reuse-checkpoint --skip-startup --iters 300 --batches 1 --out "$OUT/bench_pi0_no_pdl.json"
  PHYAI_OP_PROFILE=$PROFILE step bench_pi05 90 $B --checkpoint /tmp/ck05 --reuse-checkpoint --skip-startup \
    --iters 300 --batches 1 --out "$OUT/bench_pi05.json"
  step gpu_tests_rest 200 python3 -m pytest -q -m gpu -p no:cacheprovider test/test_kernels_gpu.py \
    test/test_dispatch.py test/test_runner.py test/test_pi05_parity.py test/test_pi0_parity.py test/test_profile_ops.py \
    -k "not (pdl or rope or cuda_graph or pi0 or fp32_and_bf16 or graph)"
  exit 0
fi
if [ "${HOST:-0}" = 1 ]; then
  # The host side of a chunk (issues 21 and 23): pi0.5's policy path and GR00T's host prepare / image to chunk,
  # before (.before/ = the tree before the change, with this tree's bench scripts) and after, then the GPU tests.
  # Checkpoints stay in /tmp for a following serving call (SERVE=1) on the same warm machine.
  ( $B --checkpoint /tmp/ck05 --checkpoint-only > "$OUT/ckpt.log" 2>&1 ) &
  step gpu_tests_host 200 python3 -m pytest -q -m gpu -p no:cacheprovider test/test_transfer_gpu.py \
    test/test_groot_n17_gpu.py test/test_runner.py test/test_pi05_parity.py
  wait; cat "$OUT/ckpt.log" >> "$LOG"
  # Start-up to the first chunk in a fresh process, Triton's cache empty (the first start after an install) and
  # then filled by that start (every later start on the robot: the cache persists in ~/.triton).
  for cache in cold warm; do
    TRITON_CACHE_DIR=/tmp/triton_startup step "startup_$cache" 90 $B --first-chunk --checkpoint /tmp/ck05
  done
  step pi05_after 150 $B --checkpoint /tmp/ck05 --reuse-checkpoint --skip-startup --iters 200 --batches 1 \
    --out "$OUT/pi05_after.json"
  (cd .before && step pi05_before 100 python3 scripts/bench_runtime.py --tokenizer "$TOK" --checkpoint /tmp/ck05 \
    --reuse-checkpoint --skip-startup --iters 200 --batches 1 --out "$OUT/pi05_before.json")
  step groot_after 120 python3 scripts/bench_groot.py --root /tmp/groot --views 1,2 --batches 1,32 --no-profile \
    --out "$OUT/groot_after.json"
  (cd .before && step groot_before 90 python3 scripts/bench_groot.py --root /tmp/groot --reuse-checkpoint \
    --skip-startup --views 1,2 --batches 1 --no-profile --out "$OUT/groot_before.json")
  step gpu_tests_rest $((575 - SECONDS)) python3 -m pytest -q -m gpu -p no:cacheprovider test/ -k \
    "not (test_transfer_gpu or test_groot_n17_gpu or test_runner or test_pi05_parity or test_expert_layer_gpu) \
    or through_the_selector"
  grep -h "policy path\|batch 1:\|view(s),\|start-up\|passed\|failed" "$LOG" | cut -c1-400
  exit 0
fi
if [ "${HOST_FINAL:-0}" = 1 ]; then
  # The host path after its last change: the GPU tests it touches, pi0.5 and pi0 (batch 1 with the policy path's
  # host split, batch 32) and GR00T's image to chunk.
  ( $B --checkpoint /tmp/ck05 --checkpoint-only > "$OUT/ckpt.log" 2>&1
    $B --model pi0 --checkpoint /tmp/ck0 --checkpoint-only >> "$OUT/ckpt.log" 2>&1 ) &
  step gpu_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider test/test_transfer_gpu.py test/test_runner.py \
    test/test_pi05_parity.py test/test_pi0_parity.py test/test_groot_n17_gpu.py test/test_quant_gpu.py
  wait; cat "$OUT/ckpt.log" >> "$LOG"
  step pi05 120 $B --checkpoint /tmp/ck05 --reuse-checkpoint --skip-startup --iters 200 --batches 1,32 \
    --batch-iters 10 --out "$OUT/pi05.json"
  step pi0 120 $B --model pi0 --checkpoint /tmp/ck0 --reuse-checkpoint --skip-startup --iters 200 --batches 1,32 \
    --batch-iters 10 --out "$OUT/pi0.json"
  step groot_path 150 python3 scripts/bench_groot.py --root /tmp/groot --views 1,2 --batches 1,32 --no-profile \
    --skip-startup --out "$OUT/groot_path.json"
  grep -h "policy path\|batch 1:\| 32 \|view(s),\|passed\|failed" "$LOG" | cut -c1-300
  exit 0
fi
if [ "${SHIPPED:-0}" = 1 ]; then
  # After committing the profile: GR00T's start-up to the first chunk in a fresh process (Triton's cache empty,
  # then filled), one view batch 1 on the shipped file as a node finds it (no PHYAI_OP_PROFILE), then the GPU
  # suite, the tests that the reduce kernels and the selector touch first.
  step ckpt 120 python3 scripts/bench_groot.py --root /tmp/groot --views "" --skip-startup --out "$OUT/ckpt.json"
  for cache in cold warm; do
    TRITON_CACHE_DIR=/tmp/triton_startup step "startup_$cache" 90 python3 scripts/bench_groot.py --first-chunk \
      --root /tmp/groot
  done
  step groot 120 python3 scripts/bench_groot.py --root /tmp/groot --reuse-checkpoint --skip-startup --views 1 \
    --batches 1 --iters 300 --no-profile --out "$OUT/groot_shipped.json"
  step gpu_tests $((570 - SECONDS)) python3 -m pytest -q -m gpu -p no:cacheprovider test/test_pi05_parity.py \
    test/test_pi0_parity.py test/test_quant_gpu.py test/test_expert_layer_gpu.py test/test_transfer_gpu.py test/
  grep -h "passed\|failed\|view(s),\|^loop\|^backbone\|^context\|operator profile\|first_chunk\|^FAILED\|^ERROR" \
    "$LOG" | cut -c1-400
  exit 0
fi
if [ "${GROOT_FINAL:-0}" = 1 ]; then
  # Issue 23's profile round, final: GR00T's shapes profiled (the reduce kernels' unrolled split loops, the
  # token-major Triton attention, the bias GEMMs' skinny tilings) into a copy of the shipped profile (the file
  # committed as profiles/h200.json), GR00T on it (one and two views, batch 1 and 32, where host prepare goes),
  # pi0.5 and pi0 on it, then the GPU tests of the selector, the profile and the runners.
  cp profiles/h200.json "$PROFILE"
  ( python3 scripts/bench_groot.py --root /tmp/groot --views "" --skip-startup --out "$OUT/ckpt.json"
    $B --checkpoint /tmp/ck05 --checkpoint-only; $B --model pi0 --checkpoint /tmp/ck0 --checkpoint-only ) \
    > "$OUT/ckpt.log" 2>&1 &
  sleep 45   # the GR00T checkpoint first (written in ~30 s)
  for _ in $(seq 90); do grep -q "^checkpoint" "$OUT/ckpt.log" && break; sleep 2; done
  step profile 150 python3 scripts/profile_ops.py --groot /tmp/groot/checkpoint_1view \
    --groot /tmp/groot/checkpoint_2views --merge --out "$PROFILE"
  PHYAI_OP_PROFILE=$PROFILE step groot 150 python3 scripts/bench_groot.py --root /tmp/groot --reuse-checkpoint \
    --skip-startup --views 1,2 --batches 1,32 --iters 200 --host-profile --out "$OUT/groot.json"
  wait; cat "$OUT/ckpt.log" >> "$LOG"
  PHYAI_OP_PROFILE=$PROFILE step pi05 100 $B --checkpoint /tmp/ck05 --reuse-checkpoint --skip-startup --iters 200 \
    --batches 1,32 --batch-iters 10 --out "$OUT/pi05.json"
  PHYAI_OP_PROFILE=$PROFILE step pi0 90 $B --model pi0 --checkpoint /tmp/ck0 --reuse-checkpoint --skip-startup \
    --iters 200 --batches 1 --out "$OUT/pi0.json"
  step gpu_tests $((570 - SECONDS)) python3 -m pytest -q -m gpu -p no:cacheprovider \
    test/test_dispatch.py test/test_profile_ops.py test/test_runner.py test/test_groot_n17_gpu.py
  grep -h "passed\|failed\|view(s),\|^loop\|^backbone\|^context\|written to\|^ 32 \|batch 1:\|policy path" "$LOG" \
    | cut -c1-300
  exit 0
fi
if [ "${GROOT_PROFILE:-0}" = 1 ]; then
  # GR00T's shapes in the operator profile (issue 23): the GR00T GPU tests (the AdaLayerNorm fold, the gathered
  # embodiment weights), one view batch 1 on the shipped profile (no GR00T entries: the defaults) with the eager
  # kernel profile and the loop's kernel timeline, profile_ops over both GR00T checkpoints merged into a copy of
  # the shipped profile, then one and two views on it, batch 1 and 32.
  cp profiles/h200.json "$PROFILE"
  ( python3 scripts/bench_groot.py --root /tmp/groot --views "" --skip-startup --out "$OUT/ckpt.json" \
      > "$OUT/ckpt.log" 2>&1 ) &
  step gpu_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider test/test_groot_n17_gpu.py \
    test/test_kernels_gpu.py -k "groot or layer_norm or capture"
  wait; cat "$OUT/ckpt.log" >> "$LOG"
  step groot_shipped 120 python3 scripts/bench_groot.py --root /tmp/groot --reuse-checkpoint --skip-startup \
    --views 1 --batches 1 --iters 200 --out "$OUT/groot_shipped.json"
  step profile 200 python3 scripts/profile_ops.py --groot /tmp/groot/checkpoint_1view \
    --groot /tmp/groot/checkpoint_2views --merge --out "$PROFILE"
  PHYAI_OP_PROFILE=$PROFILE step groot_profiled 150 python3 scripts/bench_groot.py --root /tmp/groot \
    --reuse-checkpoint --skip-startup --views 1,2 --batches 1,32 --iters 200 --out "$OUT/groot_profiled.json"
  grep -h "passed\|failed\|view(s),\|^loop\|^backbone\|^context\|written to\|^ 32 " "$LOG" | cut -c1-300
  exit 0
fi
if [ "${GROOT_FOLD:-0}" = 1 ]; then
  # GR00T's AdaLayerNorm modulation as the LayerNorm's affine: the GPU tests, then one view batch 1.
  step gpu_tests 80 python3 -m pytest -q -m gpu -p no:cacheprovider test/test_groot_n17_gpu.py
  step groot 100 python3 scripts/bench_groot.py --root /tmp/groot --views 1 --batches 1 --iters 200 --no-profile \
    --skip-startup --out "$OUT/groot_fold.json"
  grep -h "passed\|failed\|view(s),\|^loop\|^backbone\|^context" "$LOG" | cut -c1-300
  exit 0
fi
if [ "${RUNNERS:-0}" = 1 ]; then
  # The runners' GPU tests after the bounded bucket cache, and where pi0.5's prepare spends its host time.
  ( $B --checkpoint /tmp/ck05 --checkpoint-only > "$OUT/ckpt.log" 2>&1 ) &
  step gpu_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider test/test_runner.py test/test_groot_n17_gpu.py \
    test/test_cosmos3_runner.py test/test_transfer_gpu.py
  wait; cat "$OUT/ckpt.log" >> "$LOG"
  step host_profile 90 $B --checkpoint /tmp/ck05 --reuse-checkpoint --skip-startup --iters 50 --batches 1 \
    --host-profile --out "$OUT/pi05_host.json"
  grep -h "passed\|failed\|policy path" "$LOG"; grep -A30 "Ordered by" "$LOG" | cut -c1-160
  exit 0
fi
if [ "${UNPROFILED:-0}" = 1 ]; then
  # An unprofiled GPU (PHYAI_OP_PROFILE=none: the candidates' default order, the skinny GEMMs' depth_tiling)
  # against the shipped profile, pi0.5 and pi0 batch 1, with the selector's GPU tests.
  ( $B --checkpoint /tmp/ck05 --checkpoint-only > "$OUT/ckpt.log" 2>&1
    $B --model pi0 --checkpoint /tmp/ck0 --checkpoint-only >> "$OUT/ckpt.log" 2>&1 ) &
  step gpu_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider test/test_dispatch.py
  wait; cat "$OUT/ckpt.log" >> "$LOG"
  for m in pi05 pi0; do ck=/tmp/ck05; [ $m = pi0 ] && ck=/tmp/ck0
    PHYAI_OP_PROFILE=none step "${m}_none" 90 $B --model $m --checkpoint $ck --reuse-checkpoint --skip-startup \
      --iters 200 --batches 1 --out "$OUT/${m}_none.json"
    step "${m}_profiled" 90 $B --model $m --checkpoint $ck --reuse-checkpoint --skip-startup --iters 200 \
      --batches 1 --out "$OUT/${m}_profiled.json"
  done
  grep -h "=== \|batch 1: median\|loop\|passed\|failed" "$LOG" | cut -c1-200
  exit 0
fi
if [ "${GROOT_PATH:-0}" = 1 ]; then
  # GR00T's image to chunk through the adapter's graphs (as the node runs it), and the checkpoints a following
  # SERVE=1 call on the same warm machine serves.
  ( $B --checkpoint /tmp/ck05 --checkpoint-only > "$OUT/ckpt.log" 2>&1 ) &
  step groot_path 200 python3 scripts/bench_groot.py --root /tmp/groot --views 1,2 --batches 1 --no-profile \
    --skip-startup --out "$OUT/groot_path.json"
  wait; cat "$OUT/ckpt.log" >> "$LOG"
  grep -h "view(s)," "$LOG" | cut -c1-400
  exit 0
fi
if [ "${SERVE:-0}" = 1 ]; then
  # Ray Serve on the GPU (issue 22): Ray's wheel arrives in two parts over two calls (../shared/device-wheels);
  # the checkpoints are those a HOST=1 call left in /tmp on this warm machine.
  export PYTHONPATH=/tmp/site
  step serve_pi05 200 python3 scripts/bench_serve.py --checkpoint /tmp/ck05 --tokenizer "$TOK" --dtype bfloat16 \
    --out "$OUT/serve_pi05.json"
  step serve_groot 200 python3 scripts/bench_serve.py --checkpoint /tmp/groot/checkpoint_1view --dtype bfloat16 \
    --out "$OUT/serve_groot.json"
  tail -n 40 "$LOG"
  exit 0
fi
if [ "${CAMERAS:-0}" = 1 ]; then
  $B --checkpoint /tmp/ck05 --checkpoint-only > "$OUT/ckpt.log" 2>&1 &
  step gpu_tests_cameras 150 python3 -m pytest -q -m gpu -p no:cacheprovider test/test_runner.py
  wait; cat "$OUT/ckpt.log" >> "$LOG"
  for run in "3 " "2 " "2 --keep-absent"; do set -- $run
    step "bench_pi05_cameras_$1${2:+_masked}" 120 $B --checkpoint /tmp/ck05 --reuse-checkpoint --skip-startup \
      --iters 300 --batches 1 --cameras "$1" ${2:-} --out "$OUT/bench_pi05_cam$1${2:+_masked}.json"
  done
  exit 0
fi
if [ "${EXPERT:-0}" = 1 ]; then
  step bench_expert_layer 470 python3 scripts/bench_expert_layer.py --out "$OUT/bench_expert_layer.json"
  tail -n 80 "$LOG"
  exit 0
fi
if [ "${EXPERT_TESTS:-0}" = 1 ]; then
  step gpu_tests_expert 560 python3 -m pytest -q -m gpu -p no:cacheprovider test/test_expert_layer_gpu.py \
    test/test_dispatch.py test/test_runner.py test/test_pi05_parity.py test/test_pi0_parity.py
  tail -n 60 "$LOG"
  exit 0
fi
if [ "${COMPILED:-0}" = 1 ]; then
  step ckpt_pi0 120 $B --model pi0 --checkpoint /tmp/ck0 --checkpoint-only
  step profile 150 python3 scripts/profile_ops.py --checkpoint /tmp/ck0 --tokenizer "$TOK" --out "$PROFILE"
  PHYAI_OP_PROFILE=$PROFILE step bench_pi0 150 $B --model pi0 --checkpoint /tmp/ck0 --reuse-checkpoint \
    --skip-startup --iters 300 --batches 1 --out "$OUT/bench_pi0.json"
  lerobot lerobot_pi0 500 $LR --batches "" --iters 20 --out "$OUT/lerobot_pi0.json"
  exit 0
fi
step ckpt_pi05 120 $B --checkpoint /tmp/ck05 --checkpoint-only
step ckpt_pi0 120 $B --model pi0 --checkpoint /tmp/ck0 --checkpoint-only
[ "${TESTS:-1}" = 1 ] && step gpu_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider test/test_kernels_gpu.py \
  test/test_dispatch.py test/test_runner.py test/test_pi05_parity.py test/test_pi0_parity.py test/test_profile_ops.py
step profile 150 python3 scripts/profile_ops.py --checkpoint /tmp/ck05 --checkpoint /tmp/ck0 --tokenizer "$TOK" \
  --out "$PROFILE"
[ -f "$PROFILE" ] || PROFILE=profiles/h200.json
PHYAI_OP_PROFILE=$PROFILE step bench_pi05 120 $B --checkpoint /tmp/ck05 --reuse-checkpoint --skip-startup \
  --iters 300 --batches 1,32 --batch-iters 10 --out "$OUT/bench_pi05.json"
PHYAI_OP_PROFILE=$PROFILE step bench_pi0 150 $B --model pi0 --checkpoint /tmp/ck0 --reuse-checkpoint \
  --iters 300 --batches 1,2,4,8,16,32 --batch-iters 10 --out "$OUT/bench_pi0.json"
[ "${LEROBOT:-1}" = 1 ] && lerobot lerobot_pi0_eager 120 $LR --no-compile --out "$OUT/lerobot_pi0_eager.json"
true
