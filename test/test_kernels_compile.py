"""Every Triton kernel assembles for the H200 (sm_90) and Jetson Thor (sm_101, CUDA 12.8's name for sm_110) at
its production launch shapes, with programmatic dependent launch on: scripts/compile_kernels.py compiles ahead
of time with Triton's bundled ptxas, so this needs no GPU. That includes kernels/candidates/ (no shipped profile
picks them, but a Thor profile may). The interpreter tests check the kernels' math; this
checks their code generation (grid dependency control, the L2 prefetch's inline asm, tensor-core tiles,
shared memory per block)."""
import subprocess
import sys

import pytest

from ros_helpers import REPO

pytest.importorskip("triton.backends.nvidia.compiler")


def test_every_kernel_compiles_for_hopper_and_thor():
    # In a subprocess: the script switches the Triton interpreter off, which this process's other tests need on.
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "compile_kernels.py"), "--arch", "90", "--arch", "101"],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    ok = [line for line in r.stdout.splitlines() if line.startswith("ok")]
    total = int(r.stdout.split()[-1])
    assert total >= 2 * 16 and len(ok) == total and "0 failed" in r.stdout, r.stdout
    assert {line.split()[2] for line in ok} >= {"split_kv_attention._attn_partial_kernel",
                                                 "skinny_linear._skinny_kernel", "skinny_epilogue._gate_up_kernel",
                                                 "candidates.expert_layer._expert_kernel",
                                                 "candidates.post_norm._residual_stats_kernel"}


def test_the_loop_gemms_compile_pipelined_and_without_spills_as_launched():
    """With the launcher's run-time hints (--resources), the few-row GEMMs the loops run most (the skinny GEMM,
    the GeGLU gate_up, the split-KV attention's partial kernel) keep their K / key loops pipelined (asynchronous
    copies) and spill nothing on sm_90: a change that loses either shows here, not only as a slower device
    profile. Only the kernels the shipped profiles pick (--no-candidates): the loops never run the others."""
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "compile_kernels.py"), "--arch", "90", "--resources",
                        "--no-candidates"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [line.rstrip() for line in r.stdout.splitlines() if line.startswith("ok")]
    checked = 0
    assert not any(line.split()[2].startswith("candidates.") for line in lines)
    for name in ("skinny_linear._skinny_kernel", "skinny_epilogue._gate_up_kernel"):
        mine = [line for line in lines if line.split()[2] == name]
        assert mine, name
        for line in mine:
            assert "STACK:0 " in line and line.endswith("pipelined"), line
            checked += 1
    attention = [line for line in lines if "_attn_partial_kernel" in line and "'tf32'" in line]   # bf16, 2 stages
    assert attention and all(line.endswith("pipelined") for line in attention), attention
    assert checked >= 8


def test_every_gemm_tiling_a_thor_profile_may_pick_compiles_for_thor():
    """The Thor's profile comes from its own start-up autotune, which may pick any registered tiling of the
    weight-streaming GEMMs (bf16 plain and GeGLU, int8 / fp8 / int4 quantized): every one assembles for sm_101
    (CUDA 12.8's name for sm_110) within the shared memory of a block."""
    from phyai_ros.layers.linears import SKINNY_TILINGS
    from phyai_ros.layers.quant_dispatch import QUANT_TILINGS
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "compile_kernels.py"), "--arch", "101",
                        "--only-tilings"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    ok = [line for line in r.stdout.splitlines() if line.startswith("ok")]
    assert len(ok) == 2 * len(SKINNY_TILINGS) + 3 * len(QUANT_TILINGS) and "0 failed" in r.stdout, r.stdout
