"""The per-op floors (issue 41): each op's logical bytes and FLOPs from its profile key (runtime/op_costs.py),
worked by hand, and the table of scripts/op_floors.py from the shipped H200 profile: no op of the loops comes in
far under its floor (the cost model would be wrong) and every loop has its rows."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from phyai_ros.layers.selector import read_profile
from phyai_ros.runtime.op_costs import OpCost, op_cost
from phyai_ros.runtime.projection import H200_MEASURED

REPO = Path(__file__).resolve().parents[1]


def test_costs_by_hand():
    # The expert's qkv GEMM: x 50x1024, W 2560x1024, y 50x2560, bf16.
    c = op_cost("linear", "1x50x1024,2560x1024|bfloat16")
    assert (c.bytes, c.flops) == (2 * (50 * 1024 + 2560 * 1024 + 50 * 2560), 2 * 50 * 2560 * 1024)
    # gate_up + GeGLU: [gate; up] 8192x1024 -> 50 x 4096 out.
    assert op_cost("linear_geglu", "1x50x1024,8192x1024|bfloat16").bytes == 2 * (50 * 1024 + 8192 * 1024 + 50 * 4096)
    # Residual in and out and the norm weight on top of the GEMM's.
    assert op_cost("linear_add_rms_norm", "1x51x2048,1024x2048|bfloat16").bytes == \
        2 * (51 * 2048 + 1024 * 2048 + 3 * 51 * 1024 + 1024)
    # The expert's 8 query heads over 968 prefix keys and its own 50, one KV head of 256.
    a = op_cost("attention_with_prefix", "1x8x50x256,1x1x968x256|bfloat16")
    assert (a.bytes, a.flops) == (2 * (2 * 8 * 50 * 256 + 2 * 1018 * 256), 4 * 8 * 50 * 1018 * 256)
    assert op_cost("rope_attention_with_prefix", "1x50x2560,1x1x968x256|bfloat16").flops == \
        4 * 8 * 50 * (968 + 50) * 256
    assert op_cost("rms_norm", "1x50x1024|float32").bytes == 4 * (2 * 50 * 1024 + 1024)
    assert op_cost("projected_attention", "1x41x1536,4608x1536|bfloat16") is None
    assert op_cost("qlinear", "1x50x1024,2560x1024|bfloat16|w8a16-int8") is None
    assert OpCost(4.28e6, 0.0).floor_us(780e12, 4.28e12) == (1.0, "bytes")
    assert OpCost(0.0, 7.8e8).floor_us(780e12, 4.28e12) == (pytest.approx(1.0), "FLOPs")


H100_RECORD = REPO / "docs" / "device_runs" / "2026-12-07-autotune" / "pi05" / "bench_full.json"


def _h100_ceilings():
    """The GEMM and copy ceilings measured in the call that made the shipped H100 profile's pi0.5 part."""
    c = json.loads(H100_RECORD.read_text())["result"]["bench"]["ceilings"]
    return c["gemm_tflops"] * 1e12, c["copy_tbps"] * 1e12


@pytest.mark.parametrize("name, signature", [("h200.json", "cuda:sm90:NVIDIA H200"),
                                             ("h100.json", "cuda:sm90:NVIDIA H100 80GB HBM3")])
def test_no_op_of_a_shipped_profile_is_far_under_its_floor(name, signature):
    timings = read_profile(REPO / "profiles" / name)["timings"][signature]
    gemm, copy = (H200_MEASURED.peak["bf16"], H200_MEASURED.bandwidth) if "H200" in signature else _h100_ceilings()
    checked = 0
    for op, keys in timings.items():
        for key, entry in keys.items():
            cost = op_cost(op, key)
            us = [r["us"] for r in entry.values() if isinstance(r, dict) and r.get("ok")]
            if cost is None or not us:
                continue
            floor, _ = cost.floor_us(gemm, copy)
            # Under it at most by what an L2-resident activation or one GEMM's own ceiling explains.
            assert min(us) >= 0.85 * floor, (op, key, min(us), floor)
            checked += 1
    assert checked >= 30


def test_the_table_has_every_loop():
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "op_floors.py"), str(REPO / "profiles" / "h200.json")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for loop in ("pi0.5 expert (50 rows)", "pi0 expert (51 rows)", "GR00T DiT (41 rows)"):
        assert loop in r.stdout
    assert "| `attention_with_prefix` | 1x8x50x256,1x1x968x256 |" in r.stdout
    # The H100's: its quantized ops' rows say their scheme (one profile holds three), the expert stack its form.
    h100 = subprocess.run([sys.executable, str(REPO / "scripts" / "op_floors.py"), str(REPO / "profiles" / "h100.json"),
                           "--ceilings", str(H100_RECORD)], capture_output=True, text=True, timeout=120)
    assert h100.returncode == 0, h100.stderr
    for tag in ("w8a8-fp8-dynamic", "w8a16-int8", "w4a16-int4-g128"):
        assert f"| `qlinear` | 1x50x1024,2560x1024 ({tag}) |" in h100.stdout, h100.stdout
    bad = subprocess.run([sys.executable, str(REPO / "scripts" / "op_floors.py"), str(REPO / "README.md")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unreadable" in bad.stderr
