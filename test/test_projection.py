"""The stage model behind the Thor projection (runtime/roofline.py weight formats, runtime/projection.py): floors of a
tiny config worked out by hand, the full models' bf16 costs unchanged for the benchmark's callers, the projection's
arithmetic, and its monotonicity (fewer weight bytes are never slower, the fp8 rate never slower)."""
import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from phyai_ros.models.pi.modeling.config import GemmaConfig, SiglipConfig
from phyai_ros.models.pi.pi0 import Pi0Config
from phyai_ros.models.pi.pi05 import Pi05Config
from phyai_ros.runtime.projection import (H200, MEASURED_H200, THOR, DeviceSpec, StageTimes, formats_for, project,
                                          total)
from phyai_ros.runtime.roofline import (BF16, PARTS, W4A16, W8A8_FP8, W8A16, WeightFormat, flow_stage_costs)

REPO = Path(__file__).resolve().parents[1]
# SigLIP: 2 x 2 patches of 14 px, width 4, 1 layer, MLP 8; VLM: width 8, 2 layers, MLP 16, one head of 4 (q = kv = 4);
# expert: width 4, 2 layers, MLP 8, same heads; H = 2 actions of 2 dims, 3 steps, 4 prompt tokens.
TINY = Pi05Config(siglip=SiglipConfig(width=4, depth=1, num_heads=1, mlp_dim=8, image_size=28),
                  vlm=GemmaConfig(width=8, depth=2, mlp_dim=16, num_heads=1, num_kv_heads=1, head_dim=4),
                  expert=GemmaConfig(width=4, depth=2, mlp_dim=8, num_heads=1, num_kv_heads=1, head_dim=4),
                  chunk_size=2, max_action_dim=2, num_steps=3, token_budget=4, vocab_size=16)
SLOW = DeviceSpec("memory-bound", {"bf16": 1000.0, "fp8": 2000.0}, 100.0)
FAST = DeviceSpec("compute-bound", {"bf16": 1000.0, "fp8": 2000.0}, 1000.0)


def test_tiny_config_floors_by_hand():
    c = flow_stage_costs(TINY, batch=1, n_cameras=1)
    # Vision, 4 patches of 3*14*14 = 588 inputs: layer GEMMs 4*4^2 + 2*4*8 = 128 weights; patch embedding 588*4 and
    # projector 4*8: 2384 more. FLOPs 2*4*(128 + 2384) + attention 4*4*4*4 = 20352; bytes: weights 2*2512, the
    # fp32 image 3*28*28*4 = 9408, 4 tokens of 8 in bf16 = 64.
    assert (c["vision"].flops, c["vision"].bytes) == (20352, 5024 + 9408 + 64)
    # Prefix, 4 image + 4 prompt = 8 tokens: a VLM layer 8*(4+8) + 4*8 + 3*8*16 = 512 weights, one full layer and
    # the last one's qkv 8*12 = 96: 608. FLOPs 2*8*608 + 4*8*8*4 = 10752; bytes 2*608 + 8 tokens * 8 * 2 + KV
    # 2 layers * (K, V) * 8 * 4 * 2 B = 256.
    assert (c["prefix"].flops, c["prefix"].bytes) == (10752, 1216 + 128 + 256)
    # Loop, 3 steps of 2 action tokens attending to 8 + 2 keys: expert layer 4*12 + 4*4 + 3*4*8 = 160 weights x 2
    # layers + action in/out 2*2*4 = 16. Per step FLOPs 2*2*336 + 2*4*2*10*4 = 1984; bytes 2*336 + KV 256 + 2
    # tokens * 4 * 2 B * 2 = 960.
    assert (c["loop"].flops, c["loop"].bytes) == (3 * 1984, 3 * 960)
    floors = {s: cost.floor_at(SLOW.peak, SLOW.bandwidth) for s, cost in c.items()}
    assert floors == pytest.approx({"vision": 144.96, "prefix": 16.0, "loop": 28.8})        # bytes / 100
    floors = {s: cost.floor_at(FAST.peak, FAST.bandwidth) for s, cost in c.items()}
    assert floors == pytest.approx({"vision": 20.352, "prefix": 10.752, "loop": 5.952})     # FLOPs / 1000
    # floor_s (the benchmark's call) is the same for bf16 costs.
    assert c["loop"].floor_s(1000.0, 100.0) == pytest.approx(28.8)


def test_tiny_config_weight_formats_by_hand():
    # FP8 expert: its 320 layer weights in 1 B plus one 4 B scale per output channel (2 layers x (12 qkv + 4 o +
    # 16 gate/up + 4 down) = 72), the action projections stay bf16: per step 320 + 288 + 32 + 256 + 32 = 928 B;
    # GEMM FLOPs of the layers 2*2*320 = 1280 at the fp8 rate, the rest (64 + 640 attention) at bf16.
    loop = flow_stage_costs(TINY, 1, 1, formats={"expert": W8A8_FP8})["loop"]
    assert loop.bytes == 3 * 928 and dict(loop.by_rate) == {"bf16": 3 * 704, "fp8": 3 * 1280}
    assert loop.compute_s(FAST.peak) == pytest.approx(3 * (1280 / 2000 + 704 / 1000))
    assert loop.floor_at(FAST.peak, FAST.bandwidth) == pytest.approx(4.032)
    # W4A16: 0.5 B per weight plus a 4 B (fp32, the quantizer's) scale per 128 weights, at the bf16 rate.
    loop = flow_stage_costs(TINY, 1, 1, formats={"expert": W4A16})["loop"]
    assert loop.bytes == 3 * (160 + 10 + 32 + 256 + 32) and loop.by_rate == ()
    # Vision in W8A16: 128 weights + 1 scale of 4 B for each of 4*3 + 4 + 8 + 4 = 28 rows; 2384 others in bf16.
    vis = flow_stage_costs(TINY, 1, 1, formats={"vision": W8A16})["vision"]
    assert vis.bytes == 128 + 28 * 4 + 2 * 2384 + 9408 + 64 and vis.flops == 20352


def test_full_models_bf16_costs_are_the_benchmarks():
    """What bench_runtime.py printed on the H200 (docs/device_runs/2026-12-01-refactor/bench_*.json) with the
    costs before weight formats existed: the callers' figures do not move."""
    for cfg, state_token, want in (
            (Pi05Config(), False, {"vision": (0.6605, 0.8332), "prefix": (3.7643, 3.7757), "loop": (0.3865, 6.4103)}),
            (Pi0Config(), True, {"vision": (0.6605, 0.8332), "prefix": (3.1559, 3.7723), "loop": (0.3850, 6.4243)})):
        plain = flow_stage_costs(cfg, 1, 3, state_token=state_token)
        explicit = flow_stage_costs(cfg, 1, 3, state_token=state_token, formats=formats_for(BF16))
        for stage, (tflop, gb) in want.items():
            assert plain[stage].flops / 1e12 == pytest.approx(tflop, abs=1e-4)
            assert plain[stage].bytes / 1e9 == pytest.approx(gb, abs=1e-4)
            assert (explicit[stage].flops, explicit[stage].bytes) == (plain[stage].flops, plain[stage].bytes)


def test_projection_arithmetic():
    measured = StageTimes(vision=200.0, prefix=20.0, loop=57.6)
    proj = project(TINY, measured, source=FAST, target=SLOW, n_cameras=1)
    loop = proj["loop"]
    assert loop.source_floor_s == pytest.approx(5.952) and loop.efficiency == pytest.approx(5.952 / 57.6)
    assert (loop.floor_s, loop.bound) == (pytest.approx(28.8), "memory")
    assert loop.projected_s == pytest.approx(28.8 * 57.6 / 5.952)
    assert loop.floor_plus_gap_s == pytest.approx(28.8 + 57.6 - 5.952)
    assert total(proj, "floor_s") == pytest.approx(144.96 + 16.0 + 28.8)
    # Projected onto the device it was measured on, in bf16, the model gives back the measurement.
    same = project(TINY, measured, source=FAST, target=FAST, n_cameras=1)
    assert {s: p.projected_s for s, p in same.items()} == pytest.approx({"vision": 200.0, "prefix": 20.0, "loop": 57.6})
    full = project(Pi05Config(), MEASURED_H200["pi05"], target=H200)
    assert total(full, "projected_s") == pytest.approx(2.14e-3 + 6.85e-3 + 8.08e-3)


@pytest.mark.parametrize("model", ["pi05", "pi0"])
def test_fewer_weight_bytes_and_the_fp8_rate_are_never_slower(model):
    cfg, state_token = (Pi05Config(), False) if model == "pi05" else (Pi0Config(), True)
    measured = MEASURED_H200[model]
    ladder = [BF16, W8A16, W4A16, WeightFormat("W2", 0.25, 2, 64)]   # fewer bytes per weight, same bf16 rate
    for target, part in itertools.product((THOR, H200), PARTS):
        def run(fmt):
            return project(cfg, measured, {part: fmt}, target=target, state_token=state_token)
        times = [run(f) for f in ladder]
        for heavier, lighter in zip(times, times[1:]):
            for s in heavier:
                for what in ("floor_s", "projected_s", "floor_plus_gap_s"):
                    assert getattr(lighter[s], what) <= getattr(heavier[s], what), (target.name, part, s, what)
        fp8, int8 = run(W8A8_FP8), run(W8A16)   # the same bytes, the faster rate
        for s in fp8:
            assert fp8[s].floor_s <= int8[s].floor_s and fp8[s].projected_s <= int8[s].projected_s
    # And where it matters, strictly: Thor's loop is bandwidth-bound (8-bit expert weights about halve it), its
    # prefix compute-bound in pi0.5 (the fp8 rate about halves it).
    thor = {f.name: project(cfg, measured, formats_for(f), state_token=state_token) for f in (BF16, W8A16, W8A8_FP8)}
    assert thor["W8A16"]["loop"].floor_s < 0.55 * thor["bf16"]["loop"].floor_s
    if model == "pi05":
        assert thor["bf16"]["prefix"].bound == "compute"
        assert thor["W8A8-FP8"]["prefix"].floor_s < 0.55 * thor["W8A16"]["prefix"].floor_s


def test_the_script_prints_the_table():
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "thor_projection.py")], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    floor = total(project(Pi05Config(), MEASURED_H200["pi05"]), "floor_s")
    assert f"| bf16 | all bf16 | 3.1 / 14.6 / 23.5 = **{1e3 * floor:.1f}** |" in run.stdout
    assert run.stdout.count("| W4A16 | expert |") == 2 and "pi0 (prefix 816 tokens)" in run.stdout


def test_a_measured_plan_blends_each_parts_formats_by_the_share_run_quantized(tmp_path):
    """runtime.projection.plan_formats: per part, the GEMM weights the profile's quantized ops run quantized (not
    "dense"), by N x K; the expert by its few rows, the vision part by the tower's width, the rest the prefix."""
    from phyai_ros.runtime.projection import plan_formats, plan_part
    tag = "w8a8-fp8-dynamic"
    table = {"qlinear": {f"1x50x1024,2560x1024|bfloat16|{tag}": "dense",            # expert, 2560 * 1024
                         f"1x50x4096,1024x4096|bfloat16|{tag}": "triton_n32",       # expert, 1024 * 4096
                         f"1x800x2048,2560x2048|bfloat16|{tag}": "scaled_mm",       # prefix
                         f"3x256x1152,4304x1152|bfloat16|{tag}": "dense"},          # vision
             "linear": {"1x50x1024,2560x1024|bfloat16": "triton"}}                   # a float op: not counted
    assert [plan_part(k, 1152) for k in table["qlinear"]] == ["expert", "expert", "prefix", "vision"]
    f = plan_formats(table, W8A8_FP8, 1152)
    share = 1024 * 4096 / (2560 * 1024 + 1024 * 4096)
    assert f["expert"].bytes_per_weight == pytest.approx(share * 1 + (1 - share) * 2)
    assert f["expert"].compute == "fp8" and "62% quantized" in f["expert"].name
    assert (f["prefix"].bytes_per_weight, f["prefix"].compute) == (1, "fp8")
    assert (f["vision"].bytes_per_weight, f["vision"].compute, f["vision"].scale_bytes) == (2, "bf16", 0)
    # Never more bytes than bf16, never fewer than the scheme everywhere: the projection lies between the two.
    plan = total(project(Pi05Config(), MEASURED_H200["pi05"], f), "floor_s")
    assert total(project(Pi05Config(), MEASURED_H200["pi05"], formats_for(W8A8_FP8)), "floor_s") <= plan <= \
        total(project(Pi05Config(), MEASURED_H200["pi05"]), "floor_s")
    # What a real profile holds beside the plan: another scheme's calls, other batches', tagged float ops (the
    # expert stack's '|ada18' key, which has no N x K last), none of which count for batch 1's W8A8 plan.
    noisy = {op: dict(keys) for op, keys in table.items()}
    noisy["qlinear"].update({"1x50x1024,2560x1024|bfloat16|w8a16-int8": "triton",            # another scheme
                             f"32x50x1024,2560x1024|bfloat16|{tag}": "scaled_mm"})           # batch 32
    noisy["expert_stack"] = {"1x50x1024,1x1x968x256|bfloat16|ada18": "unfused_l2_bulk16_mlp"}
    assert plan_formats(noisy, W8A8_FP8, 1152, leading={1, 3}) == f
    assert plan_formats(noisy, W8A8_FP8, 1152)["expert"].name != f["expert"].name   # every batch: 32's count
    path = tmp_path / "plan.json"
    path.write_text(__import__("json").dumps({"devices": {"cuda:sm90:NVIDIA H100": noisy}}))
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "thor_projection.py"), "--plan", str(path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "| plan | W8A8-FP8 where NVIDIA H100's profile runs it quantized (vision 0%, prefix 100%, expert 62%)" \
        in r.stdout, r.stdout
    # A file that is not a profile: one line naming it, no traceback.
    bad = subprocess.run([sys.executable, str(REPO / "scripts" / "thor_projection.py"), "--plan", str(REPO / "README.md")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "thor_projection:" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
