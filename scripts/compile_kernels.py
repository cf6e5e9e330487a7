#!/usr/bin/env python3
"""Compile every Triton kernel of phyai_ros.kernels to machine code for named GPU architectures, no GPU needed.

Why: the interpreter (how CI runs the kernels) checks their math, not their code generation. Triton compiles
ahead of time for a target with its bundled ptxas, so this catches, on any machine, what would otherwise
only show on the robot: PTX that does not assemble (grid dependency control, the L2 prefetch's inline asm),
tensor-core tiles that do not lower, shared memory past the per-block limit. Each kernel is compiled at the
launch shapes the expert loop, the prefix and SigLIP use, with programmatic dependent launch on: the kernels the
shipped profiles pick (``SPECS``), then those of kernels/candidates/ (``CANDIDATE_SPECS``: no shipped or measured
profile picks them, but they stay registered, so a Thor profile may, and they must assemble there).

    python scripts/compile_kernels.py                 # sm_90 (H200) and sm_101 (Jetson Thor)
    python scripts/compile_kernels.py --arch 90 --arch 100
    python scripts/compile_kernels.py --resources     # also registers, spills, pipelining per kernel
    python scripts/compile_kernels.py --no-candidates # only the kernels the shipped profiles pick
    python scripts/compile_kernels.py --arch 101 --tilings   # + every GEMM tiling a Thor profile may pick

--resources compiles as Triton's launcher specialises at run time (pointers and 16-multiple integers hinted)
and reads the cubin's resource usage with the bundled cuobjdump: registers per thread, spill stack, shared
memory, and whether the K loop's loads were pipelined (cp.async / bulk copies). Without those hints a compile
reports an unpipelined, scalar-load kernel that never runs (2026-12-02: the attention showed 2-byte loads and
1 KB of spills that way).

Thor is sm_110 under CUDA 13 and sm_101 under CUDA 12.8, the ptxas this Triton bundles; the two names are one
architecture. Exit status 1 if any kernel fails; one line per kernel and architecture otherwise.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # JIT functions, not interpreted ones: compile needs their source
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from phyai_ros.kernels.candidates.expert_layer import (ATTN, DOWN, FINAL, GATE_UP, LAYER, OPROJ, QKV,  # noqa: E402
                                                        ROWS)

SHARED_LIMIT = 227 * 1024  # dynamic shared memory per block on sm_90 / sm_100-class GPUs

# The expert stack's kernel at pi0.5's shapes (W 1024, 8 heads of 256, one KV head; 50 rows): default tiling.
_EXPERT = dict(TABLES=False, ADA=True, ITEMS=False, D=256, BLOCK_M=64, BN_Q=32, BK_Q=128, BN_O=32, BK_O=128, BN_G=32,
               BK_G=128, BN_D=32, BK_D=128, AM=16, AN=64, MASK_MODE=2, MASK_PER_KEY=False, DOT_PREC="tf32", RM=16,
               STATS_BLOCK=32, PDL=True, PREFETCH=True, LINE=64)
_EXPERT_TYPES = {"W": "i32", "P": "i32", "SC": "*fp32", "SH": "*fp32", "GT": "*fp32", "NREF": "*fp32",
                 "STATS": "*fp32", "WS": "*fp32", "CNT": "*i32", "BAR": "*i32", "MASK": "*fp32"}
# the persistent launch reads its per-layer operands through int64 address tables
_PERSISTENT_TYPES = {**_EXPERT_TYPES, **{k: "*i64" for k in ("QKV_W", "O_W", "GU_W", "DN_W", "KP", "VP", "SC", "SH",
                                                             "GT")}}


def _fp32_persistent_stages() -> int:
    """The stages StackLaunch gives a persistent launch on fp32 operands at pi0.5's batch 2 (qkv asks three)."""
    import torch

    from phyai_ros.kernels.candidates.expert_layer import launch_stages, stack_plans
    _, plans = stack_plans(100, 2, 50, 1024, 4096, 8, 1, 256, 1018, torch.device("cpu"))
    return launch_stages(plans, 256, 4)["persistent"]


# (module, kernel, argument types where the default is wrong, constexprs, launch options) at production
# launch shapes. Default types: see ``signature``.
SPECS = [
    ("skinny_linear", "_skinny_kernel", {"P": "*fp32"},
     dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=128, PDL=True, PREFETCH=True, LINE=64, HAS_BIAS=False, ACT=0),
     dict(num_warps=4, num_stages=4)),
    ("skinny_linear", "_skinny_kernel", {"P": "*fp32"},
     dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, PDL=True, PREFETCH=False, LINE=64, HAS_BIAS=False, ACT=0),
     dict(num_warps=8, num_stages=4)),
    ("skinny_linear", "_skinny_kernel", {"P": "*fp32"},        # PHYAI_PDL_TRIGGER=late: dependents after the loop
     dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=128, PDL=2, PREFETCH=True, LINE=64, HAS_BIAS=False, ACT=0),
     dict(num_warps=4, num_stages=4)),
    ("skinny_linear", "sum_splits_kernel", {"P": "*fp32"}, dict(BLOCK=1024, PDL=True, HAS_BIAS=False, ACT=0,
                                                                      SPLITS=5), {}),
    # five stages, 64-wide (the GELU up's profiled tiling, `triton_n64_s1_st5`)
    ("skinny_linear", "_skinny_kernel", {},
     dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, PDL=True, PREFETCH=False, LINE=64, HAS_BIAS=True, ACT=1),
     dict(num_warps=4, num_stages=5)),
    # GR00T's DiT (41 rows, bf16 bias): bias + GELU-tanh in the one-split GEMM and in the split-K sum
    ("skinny_linear", "_skinny_kernel", {},
     dict(BLOCK_M=64, BLOCK_N=16, BLOCK_K=128, PDL=True, PREFETCH=True, LINE=64, HAS_BIAS=True, ACT=1),
     dict(num_warps=4, num_stages=4)),
    ("skinny_linear", "sum_splits_kernel", {"P": "*fp32"}, dict(BLOCK=1024, PDL=True, HAS_BIAS=True, ACT=1,
                                                                      SPLITS=3), {}),
    ("skinny_epilogue", "_sum_splits_layer_norm_kernel", {"P": "*fp32"}, dict(BLOCK_N=2048, PDL=True, SPLITS=5),
     dict(num_warps=4)),
    ("skinny_epilogue", "_gate_up_kernel", {"P": "*fp32"},
     dict(SPLIT=True, BLOCK_M=64, BLOCK_N=32, BLOCK_K=256, PDL=True, PREFETCH=True, LINE=64), dict(num_stages=3)),
    ("skinny_epilogue", "_gate_up_kernel", {},
     dict(SPLIT=False, BLOCK_M=64, BLOCK_N=32, BLOCK_K=128, PDL=True, PREFETCH=True, LINE=64), dict(num_stages=4)),
    ("skinny_epilogue", "_gate_up_kernel", {},
     dict(SPLIT=False, BLOCK_M=64, BLOCK_N=32, BLOCK_K=128, PDL=2, PREFETCH=True, LINE=64), dict(num_stages=4)),
    ("skinny_epilogue", "_sum_splits_geglu_kernel", {"P": "*fp32"}, dict(BLOCK=1024, PDL=True, SPLITS=4), {}),
    ("skinny_epilogue", "_sum_splits_norm_kernel", {"P": "*fp32", "G": "*fp32", "SC": "*fp32", "SH": "*fp32"},
     dict(ADA=True, BLOCK_N=1024, PDL=True, SPLITS=4), dict(num_warps=4)),
    ("split_kv_attention", "_attn_partial_kernel", {"WS": "*fp32", "P": "i32"},
     dict(MASK_MODE=2, MASK_PER_KEY=False, DOT_PREC="tf32", ROPE=True, DIRECT=False, BLOCK_M=64, BLOCK_N=32,
          BLOCK_D=256, BLOCK_H=128, PDL=True), dict(num_warps=4, num_stages=2)),
    ("split_kv_attention", "_attn_partial_kernel", {"WS": "*fp32", "MASK": "*i1", "P": "i32"},
     dict(MASK_MODE=1, MASK_PER_KEY=True, DOT_PREC="tf32", ROPE=False, DIRECT=False, BLOCK_M=32, BLOCK_N=32,
          BLOCK_D=256, BLOCK_H=128, PDL=True), dict(num_warps=4, num_stages=2)),
    ("split_kv_attention", "_attn_partial_kernel", {"WS": "*fp32", "P": "i32"},   # 16-row query tiles (profiled)
     dict(MASK_MODE=2, MASK_PER_KEY=False, DOT_PREC="tf32", ROPE=False, DIRECT=False, BLOCK_M=16, BLOCK_N=32,
          BLOCK_D=256, BLOCK_H=128, PDL=True), dict(num_warps=4, num_stages=2)),
    ("split_kv_attention", "_attn_partial_kernel", {"WS": "*fp32", "P": "i32"},   # ... with the late trigger
     dict(MASK_MODE=2, MASK_PER_KEY=False, DOT_PREC="tf32", ROPE=False, DIRECT=False, BLOCK_M=16, BLOCK_N=32,
          BLOCK_D=256, BLOCK_H=128, PDL=2), dict(num_warps=4, num_stages=2)),
    ("split_kv_attention", "_attn_partial_kernel", {"WS": "*fp32", "P": "i32"},   # the prefix pass, one split
     dict(MASK_MODE=2, MASK_PER_KEY=False, DOT_PREC="tf32", ROPE=False, DIRECT=True, BLOCK_M=128, BLOCK_N=64,
          BLOCK_D=256, BLOCK_H=128, PDL=True), dict(num_warps=8, num_stages=2)),
    ("split_kv_attention", "_attn_partial_kernel", {"WS": "*fp32", "P": "i32"},
     dict(MASK_MODE=2, MASK_PER_KEY=False, DOT_PREC="tf32", ROPE=False, DIRECT=True, BLOCK_M=64, BLOCK_N=32,
          BLOCK_D=256, BLOCK_H=128, PDL=True), dict(num_warps=4, num_stages=2)),
    ("split_kv_attention", "_attn_partial_kernel", {"WS": "*fp32", "P": "i32"},   # pi0.5's prefix (profiled)
     dict(MASK_MODE=2, MASK_PER_KEY=False, DOT_PREC="tf32", ROPE=False, DIRECT=True, BLOCK_M=64, BLOCK_N=64,
          BLOCK_D=256, BLOCK_H=128, PDL=True), dict(num_warps=8, num_stages=2)),
    ("split_kv_attention", "_attn_partial_kernel", {"WS": "*fp32", "P": "i32", "MASK": "*i1"},   # the DiT's short
     dict(MASK_MODE=1, MASK_PER_KEY=True, DOT_PREC="tf32", ROPE=False, DIRECT=True, BLOCK_M=16, BLOCK_N=128,
          BLOCK_D=64, BLOCK_H=32, PDL=True), dict(num_warps=4, num_stages=2)),
    ("split_kv_attention", "_attn_partial_kernel", {"WS": "*fp32", "P": "i32", "O": "*fp32", "Q": "*fp32",
                                                    "KP": "*fp32", "VP": "*fp32", "KS": "*fp32", "VS": "*fp32",
                                                    "COS": "*fp32", "SIN": "*fp32", "MASK": "*fp32"},
     dict(MASK_MODE=2, MASK_PER_KEY=False, DOT_PREC="ieee", ROPE=True, DIRECT=False, BLOCK_M=64, BLOCK_N=32,
          BLOCK_D=256, BLOCK_H=128, PDL=True), dict(num_warps=8, num_stages=1)),   # fp32 expert attention
    ("split_kv_attention", "_attn_combine_kernel", {"WS": "*fp32"},
     dict(SPLIT_BLOCK=32, BLOCK_D=256, PDL=True), dict(num_warps=4)),
    ("rope", "_qkv_rope_kernel", {"K": "*bf16"}, dict(HALF=128, BLOCK=128, ROWS=4, PDL=True, NORM=False),
     dict(num_warps=4)),
    ("rope", "_qkv_rope_kernel", {"K": "*bf16"}, dict(HALF=128, BLOCK=128, ROWS=1, PDL=True, NORM=False),
     dict(num_warps=2)),                                               # the expert's 450 rows: a row per program
    # Qwen3-VL: the LLM's q / k norm + mRoPE (bf16 tables), the vision tower's 2-D RoPE (fp32 tables)
    ("rope", "_qkv_rope_kernel", {"K": "*bf16"}, dict(HALF=64, BLOCK=64, ROWS=8, PDL=True, NORM=True),
     dict(num_warps=4)),
    ("rope", "_qkv_rope_kernel", {"K": "*bf16", "COS": "*fp32", "SIN": "*fp32"},
     dict(HALF=32, BLOCK=32, ROWS=16, PDL=True, NORM=False), dict(num_warps=4)),
    ("rms_norm", "_rms_norm_kernel", {"W": "*fp32"},
     dict(HAS_RES=True, BLOCK_M=2, BLOCK_N=2048, PDL=True, UNIT_OFFSET=True), dict(num_warps=8)),
    ("rms_norm", "_rms_norm_kernel", {}, dict(HAS_RES=False, BLOCK_M=1, BLOCK_N=2048, PDL=True, UNIT_OFFSET=False),
     dict(num_warps=8)),
    ("ada_rms_norm", "_ada_rms_norm_kernel", {"G": "*bf16"}, dict(GATED=True, BLOCK_M=4, BLOCK_N=1024, PDL=True),
     dict(num_warps=4)),
    ("geglu", "_geglu_kernel", {}, dict(BLOCK=1024, PDL=True, ACT=0), dict(num_warps=4)),
    ("geglu", "_geglu_kernel", {}, dict(BLOCK=1024, PDL=True, ACT=1), dict(num_warps=4)),   # SwiGLU (GR00T)
    ("layer_norm", "_layer_norm_kernel", {}, dict(HAS_ADD=True, BLOCK=2048, PDL=True), dict(num_warps=8)),
    # MiniCPM-Robot's Gated-DeltaNet layers (16 K / 16 V heads of 128): conv + SiLU + l2 norms + gates, the gated norm
    ("gated_delta_prep", "_conv_qkv_gates_kernel",
     {"ALOG": "*bf16", "DTB": "*bf16", "Q": "*fp32", "K": "*fp32", "V": "*fp32", "BETA": "*fp32", "G": "*fp32",
      "sp_b": "i32", "sp_s": "i32"},
     dict(HK=16, HV=16, DK=128, DV=128, KERNEL=4, BLOCK=128, PDL=True), dict(num_warps=1)),
    ("gated_delta_prep", "_gated_rms_kernel", {"X": "*fp32", "H": "i32", "sx": "i32", "sz": "i32", "so": "i32"},
     dict(D=128, BLOCK=128, PDL=True), dict(num_warps=1)),
    # quantized expert GEMMs: int8 weights (GeGLU in the one-split epilogue); fp8 x fp8 on tensor cores (W8A8,
    # split-K partials); int4 groups (bias + GELU epilogue)
    ("quant_linear", "_quant_skinny_kernel", {"XS": "*fp32", "W": "*i8", "WS": "*fp32", "P": "*bf16", "B": "*fp32"},
     dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=128, INT4=False, XQ=False, FP8_DOT=False, F32=False, GEGLU=True,
          DIRECT=True, HAS_BIAS=False, ACT=0, PDL=True), dict(num_warps=4, num_stages=4)),
    ("quant_linear", "_quant_skinny_kernel", {"X": "*fp8e4nv", "XS": "*fp32", "W": "*fp8e4nv", "WS": "*fp32",
                                              "P": "*fp32", "Y": "*fp32", "B": "*fp32"},
     dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=256, INT4=False, XQ=True, FP8_DOT=True, F32=False, GEGLU=False,
          DIRECT=False, HAS_BIAS=False, ACT=0, PDL=True), dict(num_warps=4, num_stages=3)),
    ("quant_linear", "_quant_skinny_kernel", {"XS": "*fp32", "W": "*u8", "WS": "*fp32", "P": "*bf16"},
     dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=128, INT4=True, XQ=False, FP8_DOT=False, F32=False, GEGLU=False,
          DIRECT=True, HAS_BIAS=True, ACT=1, PDL=True), dict(num_warps=4, num_stages=4)),
    ("quant_linear", "_quantize_rows_kernel", {"XS": "*fp32", "Y": "*fp8e4nv", "S": "*fp32"},
     dict(BLOCK=16384, STATIC=False, PDL=True), dict(num_warps=8)),
]
# kernels/candidates/ (no shipped or measured profile picks them; kernels/candidates/README.md says what each lost to)
CANDIDATE_SPECS = [
    # GR00T's DiT MLP LayerNorm after the up-projection's dot (post_norm.py): the residual GEMM with its per-block
    # statistics (16-wide blocks), the up-projection that merges them (96 blocks, 64-wide)
    ("candidates.post_norm", "_residual_stats_kernel", {"STATS": "*fp32"},
     dict(HAS_BIAS=True, BLOCK_M=64, BLOCK_N=16, BLOCK_K=128, PDL=True), dict(num_warps=4, num_stages=5)),
    ("candidates.post_norm", "_norm_gemm_gelu_kernel", {"CS": "*fp32", "STATS": "*fp32"},
     dict(HAS_BIAS=True, STATS_BLOCK=128, BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, PDL=True),
     dict(num_warps=4, num_stages=5)),
    # the pi expert's (ada)RMSNorm after gate_up's dot: o-proj with the gated residual, xs and row sums; gate_up
    # with rstd, shift's row and GeGLU (pi0.5's adaRMS)
    ("candidates.post_norm", "_gated_residual_rms_kernel",
     {"STATS": "*fp32", "G": "*fp32", "SC": "*fp32", "SH": "*fp32"},
     dict(HAS_GATE=True, HAS_SHIFT=True, BLOCK_M=64, BLOCK_N=16, BLOCK_K=128, PDL=True),
     dict(num_warps=4, num_stages=5)),
    ("candidates.post_norm", "_rms_gemm_geglu_kernel", {"STATS": "*fp32"},
     dict(HAS_SHIFT=True, STATS_BLOCK=64, BLOCK_M=64, BLOCK_N=32, BLOCK_K=128, PDL=True),
     dict(num_warps=4, num_stages=4)),
    # GR00T's DiT attention blocks (41 rows, 32 heads of 48, width 1536): the q / k / v projection split over K with
    # the last split's attention over the rows; the q projection with attention over 103 cached keys, key mask
    ("candidates.projected_attention", "_projected_attention_kernel", {"WS": "*fp32", "CNT": "*i32"},
     dict(D=48, SELF=True, HAS_BIAS=True, HAS_MASK=False, BLOCK_T=64, BLOCK_D=64, BLOCK_K=64, BLOCK_L=64,
          DOT_PREC="tf32", PDL=True), dict(num_warps=4, num_stages=2)),
    ("candidates.projected_attention", "_projected_attention_kernel", {"WS": "*fp32", "CNT": "*i32"},
     dict(D=48, SELF=False, HAS_BIAS=True, HAS_MASK=True, BLOCK_T=64, BLOCK_D=64, BLOCK_K=64, BLOCK_L=128,
          DOT_PREC="tf32", PDL=True), dict(num_warps=4, num_stages=2)),
    # weights into L2 from a side branch: one line per lane, one bulk prefetch per segment (sm_90 and newer)
    ("candidates.l2_prefetch", "_l2_prefetch_kernel", {"TABLE": "*i64"}, dict(BULK=False, BLOCK=512),
     dict(num_warps=4)),
    ("candidates.l2_prefetch", "_l2_prefetch_kernel", {"TABLE": "*i64"}, dict(BULK=True, BLOCK=32),
     dict(num_warps=1)),
    # the expert layer stack (expert_layer.py): each phase as its own kernel (pi0.5's adaRMS, split K and split keys
    # with last-arriving merges), pi0's plain norm, the wide tiling, and the persistent step kernel
    *(("candidates.expert_layer", "_expert_kernel", _EXPERT_TYPES, dict(_EXPERT, PHASES=phase, PREFETCH=prefetch),
       {}) for phase, prefetch in ((ROWS, False), (QKV, True), (ATTN, True), (OPROJ, True), (GATE_UP, True),
                                   (DOWN, True), (FINAL, False))),
    ("candidates.expert_layer", "_expert_kernel", _EXPERT_TYPES, dict(_EXPERT, PHASES=QKV, ADA=False, ITEMS=False),
     {}),
    ("candidates.expert_layer", "_expert_kernel", _EXPERT_TYPES,
     dict(_EXPERT, PHASES=GATE_UP, BLOCK_M=128, BN_G=64, BK_G=64, ITEMS=True), dict(num_warps=8)),
    ("candidates.expert_layer", "_expert_kernel", _PERSISTENT_TYPES,
     dict(_EXPERT, PHASES=ROWS | LAYER | FINAL, TABLES=True), {}),
    # the persistent kernel on fp32 operands at the stages launch_stages fits (three compiled to 284 KB of
    # shared memory on sm_90 and failed to launch on the H200 at batch 2, 2026-12-03)
    ("candidates.expert_layer", "_expert_kernel",
     {**_PERSISTENT_TYPES, **{k: "*fp32" for k in ("H0", "HB", "XO", "QB", "AB", "MB", "COS", "SIN")}},
     dict(_EXPERT, PHASES=ROWS | LAYER | FINAL, TABLES=True, DOT_PREC="ieee", LINE=32),
     dict(num_warps=4, num_stages=_fp32_persistent_stages())),
]


def tiling_specs() -> list:
    """Every launch shape a device profile can pick for the weight-streaming GEMMs: each SKINNY_TILINGS entry as
    the plain GEMM and as the GeGLU gate_up kernel, each QUANT_TILINGS entry for int8, fp8 (W8A8) and int4
    weights, at the expert's 50 rows (BLOCK_M 64) with the stages the wrappers fit into shared memory, PDL on. A
    robot's profile (the Thor's, made by its start-up autotune) may choose any of them, so each must assemble for
    its architecture, not only the ones a shipped profile picks (``SPECS``)."""
    from phyai_ros.kernels.skinny_linear import fit_stages
    from phyai_ros.layers.linears import SKINNY_TILINGS
    from phyai_ros.layers.quant_dispatch import QUANT_TILINGS
    out = []
    for name, t in SKINNY_TILINGS.items():
        bn, bk, warps, stages = t.get("block_n", 64), t.get("block_k", 128), t.get("num_warps", 4), \
            t.get("num_stages", 3)
        split = t.get("splits") != 1
        pf = bool(t.get("prefetch"))
        out.append(("skinny_linear", "_skinny_kernel", {"P": "*fp32"} if split else {},
                    dict(BLOCK_M=64, BLOCK_N=bn, BLOCK_K=bk, PDL=True, PREFETCH=pf, LINE=64, HAS_BIAS=False, ACT=0),
                    dict(num_warps=warps, num_stages=fit_stages(stages, 64, bn, bk, 2))))
        out.append(("skinny_epilogue", "_gate_up_kernel", {"P": "*fp32"} if split else {},
                    dict(SPLIT=split, BLOCK_M=64, BLOCK_N=bn, BLOCK_K=bk, PDL=True, PREFETCH=pf, LINE=64),
                    dict(num_warps=warps, num_stages=fit_stages(stages, 64, 2 * bn, bk, 2))))
    formats = {   # weight format -> (argument types, constexprs)
        "int8": ({"XS": "*fp32", "W": "*i8", "WS": "*fp32"}, dict(INT4=False, XQ=False, FP8_DOT=False)),
        "fp8": ({"X": "*fp8e4nv", "XS": "*fp32", "W": "*fp8e4nv", "WS": "*fp32"},
                dict(INT4=False, XQ=True, FP8_DOT=True)),
        "int4": ({"XS": "*fp32", "W": "*u8", "WS": "*fp32"}, dict(INT4=True, XQ=False, FP8_DOT=False)),
    }
    for name, t in QUANT_TILINGS.items():
        bn, warps, stages = t.get("block_n", 64), t.get("num_warps", 4), t.get("num_stages", 3)
        direct = t.get("splits") == 1
        for fmt, (types, flags) in formats.items():
            bk = 128 if fmt == "int4" else t.get("block_k", 128)   # int4: one group per K block
            out.append(("quant_linear", "_quant_skinny_kernel",
                        {**types, "P": "*bf16" if direct else "*fp32", "Y": "*bf16" if direct else "*fp32"},
                        dict(BLOCK_M=64, BLOCK_N=bn, BLOCK_K=bk, **flags, F32=False, GEGLU=False, DIRECT=direct,
                             HAS_BIAS=False, ACT=0, PDL=True), dict(num_warps=warps, num_stages=stages)))
    return out


FLOAT_ARGS = {"eps", "qk_scale"}
INT_ARGS = {"M", "N", "K", "I", "D", "S", "G", "T", "L", "HQ", "HKV", "SPLITS"}  # sizes spelt in capitals


def signature(fn, types: dict, constexprs: dict) -> dict:
    """Triton signature of a JIT function: ``types`` where given, constexprs as such, the float scalars fp32,
    other capitalised names bf16 pointers (except the sizes in INT_ARGS), every other argument an int32."""
    sig = {}
    for p in fn.params:
        if p.is_constexpr:
            sig[p.name] = "constexpr"
        elif p.name in types:
            sig[p.name] = types[p.name]
        elif p.name in FLOAT_ARGS:
            sig[p.name] = "fp32"
        elif p.name.isupper() and p.name not in INT_ARGS:
            sig[p.name] = "*bf16"
        else:
            sig[p.name] = "i32"
    missing = [n for n, t in sig.items() if t == "constexpr" and n not in constexprs]
    if missing:
        raise ValueError(f"{fn.__name__}: constexprs not given: {missing}")
    return sig


# Integer arguments that take values off a multiple of 16 at the production shapes (row and token counts, head
# groups, split counts); every other integer (widths, K, strides) is one there, and the launcher hints it so.
UNALIGNED_INTS = {"M", "n_rows", "P", "S", "Lq", "Hkv", "G", "T", "tokens", "nsp", "n_splits", "n_parts", "chunk",
                  "n_stats", "n_mt", "rot_heads", "L", "s_mb"}


def runtime_hints(fn, sig: dict) -> dict:
    """tt.divisibility=16 where Triton's launcher finds it at the production shapes: every pointer (torch
    allocations are 16-byte aligned) and every integer not in UNALIGNED_INTS."""
    names = list(sig)
    hinted = [n for n in names if sig[n].startswith("*") or (sig[n] == "i32" and n not in UNALIGNED_INTS)]
    return {(names.index(n),): [["tt.divisibility", 16]] for n in hinted}


def resources(kernel) -> str:
    """'REG r STACK s' of a compiled kernel's cubin (cuobjdump), and whether its loads were pipelined."""
    import subprocess
    import tempfile

    import triton
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    usage = next((ln.split() for ln in out.splitlines() if "REG:" in ln), ["REG:?", "STACK:?"])
    ptx = kernel.asm["ptx"]
    piped = "cp.async" in ptx
    return f"{usage[0]} {usage[1]} {'pipelined' if piped else 'no async copies'}"


def compile_all(archs, specs, with_resources: bool = False) -> int:
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    failures = 0
    for arch in archs:
        target = GPUTarget("cuda", arch, 64 if arch < 100 else 32)
        for module, name, types, constexprs, options in specs:
            fn = getattr(importlib.import_module(f"phyai_ros.kernels.{module}"), name)
            label = f"sm_{arch} {module}.{name} {constexprs}"
            try:
                sig = signature(fn, types, constexprs)
                src = ASTSource(fn=fn, signature=sig, constexprs=constexprs,
                                attrs=runtime_hints(fn, sig) if with_resources else None)
                kernel = triton.compile(src, target=target, options={**options, "launch_pdl": True})
                ptx = kernel.asm["ptx"]
                problems = []
                if kernel.metadata.shared > SHARED_LIMIT:
                    problems.append(f"shared memory {kernel.metadata.shared} B > {SHARED_LIMIT}")
                if any(p.name == "PDL" for p in fn.params) and "griddepcontrol.wait" not in ptx:
                    problems.append("no griddepcontrol.wait (PDL would race)")
                if constexprs.get("PDL") and "griddepcontrol.launch_dependents" not in ptx:
                    problems.append("no griddepcontrol.launch_dependents (the next kernel waits for the exit)")
                if (constexprs.get("PREFETCH") or module.endswith("l2_prefetch")) and "prefetch.global.L2" not in ptx \
                        and "cp.async.bulk.prefetch.L2" not in ptx:
                    problems.append("no L2 prefetch")
            except Exception as exc:  # noqa: BLE001 - report every kernel, then fail
                problems = [f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"]
                kernel = None
            failures += bool(problems)
            shared = f"{kernel.metadata.shared:>7} B smem" if kernel is not None else ""
            if with_resources and kernel is not None:
                shared += f" {resources(kernel)}"
            print(f"{'FAIL' if problems else 'ok  '} {label} {shared} {'; '.join(problems)}", flush=True)
    return failures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, action="append", help="compute capability as 90, 101, ... (repeat)")
    ap.add_argument("--resources", action="store_true",
                    help="compile with the run-time divisibility hints and print registers / spills / pipelining")
    ap.add_argument("--no-candidates", action="store_true",
                    help="only the kernels the shipped profiles pick (not those of kernels/candidates/)")
    ap.add_argument("--tilings", action="store_true",
                    help="also every launch shape of the GEMM tilings a profile may pick (tiling_specs)")
    ap.add_argument("--only-tilings", action="store_true", help="only those (tiling_specs)")
    args = ap.parse_args()
    archs = args.arch or [90, 101]
    specs = [] if args.only_tilings else SPECS if args.no_candidates else SPECS + CANDIDATE_SPECS
    specs = specs + (tiling_specs() if args.tilings or args.only_tilings else [])
    failures = compile_all(archs, specs, args.resources)
    print(f"{failures} failed of {len(specs) * len(archs)}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
