"""Stage model: what a change measured on the H200 means on the robot's Jetson Thor, before anyone has a Thor.

Per stage (vision, prefix, denoising loop; ``roofline.flow_stage_costs``) the logical FLOPs and bytes give a
roofline floor on a device, max(FLOPs at their tensor-core rates, bytes / bandwidth). The measured H200 time of a
stage against its floor on the H200 is the stage's *efficiency* (floor / measured, both bf16). The projection to
another device is that device's floor for the stage (in the chosen weight formats) divided by the same
efficiency: it assumes the kernels reach the same fraction of the roofline there as on the H200. Two more
columns bracket it: the pure floor (efficiency 1: no implementation is faster), and "floor + H200 gap" (the
H200's time beyond its floor carried over unchanged, as if it were a fixed latency cost: kernel launches and
gaps, which a bandwidth-bound stage on Thor may partly hide).

Where the assumptions bite: the H200 loop is latency-bound (many short kernels), not bandwidth-bound, so its low
efficiency divided into Thor's bandwidth floor is pessimistic for the loop; and efficiencies are measured in
bf16, so a quantized scheme's projection assumes its kernels reach the bf16 kernels' fraction of the roofline.

Device figures (dense tensor-core FLOP/s, memory bandwidth):
- H200, spec: NVIDIA H200 datasheet, BF16 1,979 TFLOPS and FP8 3,958 TFLOPS *with sparsity* (dense: half, 989
  and 1,979), HBM3e 4.8 TB/s. Measured on this project's H200 on 2026-12-01 by ``scripts/bench_runtime.py``'s
  ceilings (an 8192^3 bf16 GEMM, a 4 GiB copy): ~760-790 TFLOP/s and ~4.25-4.27 TB/s (docs/device_runs/
  2026-12-01-refactor/bench_*.json), i.e. ~79% and ~89% of spec.
- Jetson Thor (Blackwell, sm_110, 20 SMs): 273 GB/s LPDDR5X (NVIDIA's Jetson AGX Thor / T5000 figure); bf16
  dense ~257 TFLOP/s, which is NVIDIA's
  headline 2,070 FP4 TFLOPS (sparse) halved three times (sparse -> dense, FP4 -> FP8 -> BF16); FP8 dense twice
  bf16 (~514) is an assumption from Blackwell's tensor-core ratios, not a published or measured Thor figure.
Projections use spec figures on both devices (the efficiency is relative to the spec roofline), since Thor's
achievable ceilings are unmeasured.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from phyai_ros.runtime.op_costs import parse_key
from phyai_ros.runtime.roofline import BF16, PARTS, WeightFormat, flow_stage_costs

STAGES = ("vision", "prefix", "loop")


@dataclass(frozen=True)
class DeviceSpec:
    """Dense tensor-core peaks per rate (FLOP/s) and memory bandwidth (B/s), with where they come from."""
    name: str
    peak: Mapping[str, float]
    bandwidth: float
    source: str = ""


H200 = DeviceSpec("H200", {"bf16": 989e12, "fp8": 1979e12}, 4.8e12,
                  "NVIDIA H200 datasheet: 1,979 / 3,958 TFLOPS bf16 / fp8 with sparsity (dense: half); 4.8 TB/s")
H200_MEASURED = DeviceSpec("H200 (measured ceilings)", {"bf16": 780e12, "fp8": 1560e12}, 4.28e12,
                           "bench_runtime.py ceilings 2026-12-01 (bf16 GEMM, copy); fp8 = 2x bf16 assumed")
THOR = DeviceSpec("Jetson Thor", {"bf16": 257e12, "fp8": 514e12}, 273e9,
                  "273 GB/s LPDDR5X (NVIDIA); bf16 dense ~257 TFLOP/s (project notes: 2,070 FP4 sparse / 8); "
                  "fp8 = 2x bf16 assumed")
DEVICES = {"h200": H200, "h200-measured": H200_MEASURED, "thor": THOR}


@dataclass(frozen=True)
class StageTimes:
    """Measured seconds per stage at batch 1 (bf16, CUDA graphs, 3 cameras, full prompt budget)."""
    vision: float
    prefix: float
    loop: float
    source: str = ""

    def get(self, stage: str) -> float:
        return getattr(self, stage)


# The newest per-stage figures, H200, 2026-12-01 (commit 244862a, profiles/h200.json, 300 runs, batch 1):
# pi0.5 from docs/benchmarks.md "Before and after the restructuring (issue 12)"; pi0 from the same run's
# docs/device_runs/2026-12-01-refactor/bench_pi0.json.
MEASURED_H200 = {
    "pi05": StageTimes(2.14e-3, 6.85e-3, 8.08e-3, "docs/benchmarks.md (issue 12 'after'), H200, 2026-12-01"),
    "pi0": StageTimes(2.14e-3, 5.85e-3, 7.98e-3,
                      "docs/device_runs/2026-12-01-refactor/bench_pi0.json, H200, 2026-12-01"),
}


@dataclass(frozen=True)
class StageProjection:
    stage: str
    measured_s: float      # on the source device, bf16
    source_floor_s: float  # the source device's floor, bf16
    floor_s: float         # the target's floor in the chosen formats
    bound: str             # what bounds the target floor: "compute" or "memory"
    gap_s: float           # measured - source floor (the time beyond the roofline on the source)

    @property
    def efficiency(self) -> float:
        return self.source_floor_s / self.measured_s

    @property
    def projected_s(self) -> float:
        """Target floor / the source's efficiency (same fraction of the roofline on both)."""
        return self.floor_s / self.efficiency

    @property
    def floor_plus_gap_s(self) -> float:
        return self.floor_s + self.gap_s


def _part_of(shapes: list, vision_width: int) -> str:
    x, (n, k) = shapes[0], shapes[-1]
    rows = 1
    for d in (x[1:-1] if len(x) >= 3 else x[:-1]):   # per batch item: a batch of 32 is still the expert's 50
        rows *= d
    if rows <= 64:
        return "expert"
    return "vision" if vision_width in (n, k) else "prefix"


def plan_part(key: str, vision_width: int) -> str:
    """The part a quantized op's profile key ('BxROWSxK,...,NxK|dtype|tag') belongs to in the pi family: few rows
    per batch item (<= 64: the expert's 50-51 tokens) the expert, the vision tower's width in the GEMM the vision
    part, the rest the prefix."""
    return _part_of(parse_key(key)[0], vision_width)


def plan_formats(table: Mapping[str, Mapping[str, str]], scheme: WeightFormat, vision_width: int,
                 leading: Optional[set] = None) -> dict:
    """part -> the format a measured plan (a device profile's table: {op: {key: candidate}}) amounts to for
    ``scheme``: per part, the share of its GEMM weights (by N x K, over the quantized ops' entries) that run
    quantized, the rest on the bf16 "dense" copy, blended into one format by bytes (its GEMMs at the scheme's rate
    where at least half run quantized). A part with no entries runs the scheme. ``leading``: only the calls whose
    first dimension is in it (one batch's: B, and B x cameras for the vision tower; a plan differs by batch)."""
    quant, whole = {p: 0.0 for p in PARTS}, {p: 0.0 for p in PARTS}
    family = scheme.name.split("-")[0].lower()     # "W8A8-FP8" -> keys tagged "w8a8-..."
    for op, keys in table.items():
        for key, name in keys.items():
            fields = key.split("|")
            # Only this scheme's quantized calls ('...|dtype|w8a8-fp8-dynamic'): another scheme's entries (one
            # profile holds several) and other tagged ops (the expert stack's '|ada18') say nothing of this plan.
            if len(fields) != 3 or fields[2].split("-")[0] != family:
                continue
            try:
                shapes, _ = parse_key(key)
                part = _part_of(shapes, vision_width)
            except (KeyError, ValueError):   # a key of another layout: not a GEMM this projection can weigh
                continue
            if leading is not None and shapes[0][0] not in leading:
                continue
            n, k = shapes[-1]
            whole[part] += n * k
            quant[part] += n * k if name != "dense" else 0
    out = {}
    for part in PARTS:
        f = quant[part] / whole[part] if whole[part] else 1.0
        out[part] = WeightFormat(f"{scheme.name} ({100 * f:.0f}% quantized)",
                                 f * scheme.bytes_per_weight + (1 - f) * BF16.bytes_per_weight,
                                 scale_bytes=f * scheme.scale_bytes, group=scheme.group,
                                 compute=scheme.compute if f >= 0.5 else "bf16")
    return out


def formats_for(scheme: WeightFormat, parts=PARTS) -> dict:
    """part -> format: ``scheme`` for the named parts, bf16 for the others."""
    return {part: (scheme if part in parts else BF16) for part in PARTS}


def project(cfg, measured: StageTimes, formats: Optional[Mapping[str, WeightFormat]] = None,
            source: DeviceSpec = H200, target: DeviceSpec = THOR, batch: int = 1, n_cameras: int = 3,
            state_token: bool = False, cameras_run: Optional[int] = None) -> dict:
    """stage -> StageProjection of ``cfg`` (pi0: state_token=True) from ``measured`` bf16 times on ``source``
    (taken with ``n_cameras``) to ``target`` with the parts' weight ``formats`` (None: all bf16).
    cameras_run: the camera slots the target computes, where fewer (absent cameras are skipped, not masked)."""
    bf16 = flow_stage_costs(cfg, batch, n_cameras, state_token=state_token)
    costs = flow_stage_costs(cfg, batch, cameras_run or n_cameras, state_token=state_token, formats=formats)
    out = {}
    for stage in STAGES:
        c = costs[stage]
        src_floor = bf16[stage].floor_at(source.peak, source.bandwidth)
        compute, memory = c.compute_s(target.peak), c.bytes / target.bandwidth
        out[stage] = StageProjection(stage, measured.get(stage), src_floor, max(compute, memory),
                                     "compute" if compute >= memory else "memory", measured.get(stage) - src_floor)
    return out


def total(proj: dict, what: str) -> float:
    """Sum over the stages of one StageProjection attribute (e.g. "projected_s")."""
    return sum(getattr(p, what) for p in proj.values())
