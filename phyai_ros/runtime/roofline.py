"""Logical FLOPs and bytes of the pi0 / pi0.5 stages, for the stage-level roofline.

"Logical": what the math needs, not what kernels do: each weight read once per
use of the stage (the expert's weights once per denoising step), activations and
the KV cache read/written once, 2 FLOPs per multiply-add. Attention FLOPs count
every (query, key) pair the shapes carry, masked ones included, as the kernels do.

Weight formats per part (issue 15's schemes): the transformer layers' GEMM weights of each part (vision = SigLIP,
prefix = the VLM, expert = the action expert) may be stored in another format (``WeightFormat``: bytes per weight,
scales, and the tensor-core rate its GEMMs run at); the patch embedding, the vision projector, the action in/out
projections and pi0's action-time MLP stay at ``weight_bytes`` and the bf16 rate, as do attention's FLOPs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional


@dataclass(frozen=True)
class WeightFormat:
    """How one part's GEMM weights are stored and at which tensor-core rate its GEMMs run.

    Scales: per output channel (group 0: one scale per weight row) or one per ``group`` weights along K."""
    name: str
    bytes_per_weight: float
    scale_bytes: float = 0.0
    group: int = 0
    compute: str = "bf16"

    def bytes(self, weights: float, rows: float) -> float:
        """Bytes of ``weights`` GEMM weights in ``rows`` output channels, scales included."""
        scales = weights / self.group if self.group else (rows if self.scale_bytes else 0)
        return weights * self.bytes_per_weight + scales * self.scale_bytes


# Issue 15's schemes with the quantizer's scale widths (phyai_ros/layers/quantized.py): fp32 scales per output
# channel, and fp32 per group of 128 along K for int4.
BF16 = WeightFormat("bf16", 2)
W8A16 = WeightFormat("W8A16", 1, scale_bytes=4)                       # int8 / fp8 weights, bf16 GEMM
W8A8_FP8 = WeightFormat("W8A8-FP8", 1, scale_bytes=4, compute="fp8")  # fp8 weights and activations
W4A16 = WeightFormat("W4A16", 0.5, scale_bytes=4, group=128)          # int4 weights, group-128 scales
SCHEMES = {f.name: f for f in (BF16, W8A16, W8A8_FP8, W4A16)}
PARTS = ("vision", "prefix", "expert")


@dataclass(frozen=True)
class StageCost:
    flops: float
    bytes: float
    by_rate: tuple = ()   # (rate, FLOPs) pairs summing to flops, e.g. (("bf16", x), ("fp8", y)); () = all bf16

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    def floor_s(self, peak_flops: float, bandwidth: float) -> float:
        """Roofline time: whichever of compute and memory takes longer."""
        return max(self.flops / peak_flops, self.bytes / bandwidth)

    def compute_s(self, peaks: Mapping[str, float]) -> float:
        """Seconds of tensor-core work, each FLOP at its own rate (peaks: rate -> FLOP/s)."""
        return sum(f / peaks[rate] for rate, f in (self.by_rate or (("bf16", self.flops),)) if f)

    def floor_at(self, peaks: Mapping[str, float], bandwidth: float) -> float:
        """Roofline time with FLOPs at their rates: max(compute, bytes / bandwidth)."""
        return max(self.compute_s(peaks), self.bytes / bandwidth)


def _gemma_layer_params(width: int, q_dim: int, kv_dim: int, mlp: int) -> int:
    return width * (q_dim + 2 * kv_dim) + q_dim * width + 3 * width * mlp


def _gemma_layer_rows(width: int, q_dim: int, kv_dim: int, mlp: int) -> int:
    """Output channels of a Gemma layer's GEMMs: qkv, o, gate + up, down."""
    return (q_dim + 2 * kv_dim) + width + 2 * mlp + width


def _cost(flops_by_rate: dict, nbytes: float) -> StageCost:
    rates = tuple((r, f) for r, f in flops_by_rate.items() if f)
    return StageCost(sum(flops_by_rate.values()), nbytes, rates if set(flops_by_rate) - {"bf16"} else ())


def _add(d: dict, rate: str, flops: float) -> dict:
    d[rate] = d.get(rate, 0) + flops
    return d


def flow_stage_costs(cfg, batch: int, n_cameras: int, weight_bytes: int = 2, act_bytes: int = 2,
                     state_token: bool = False, formats: Optional[Mapping[str, WeightFormat]] = None) -> dict:
    """Costs of 'vision' (SigLIP + projector + embeddings), 'prefix' (VLM over the prefix) and
    'loop' (all denoising steps of the action expert) for one batch.

    state_token: pi0's suffix, i.e. one continuous state token before the H action tokens and the
    action+time MLP (two width x width GEMMs per action token); pi0.5 has neither (its time
    conditioning is a per-step table computed before the loop).
    formats: part ("vision", "prefix", "expert") -> WeightFormat of its transformer layers' GEMM weights; a part
    not named (and every weight without formats) takes ``weight_bytes`` per weight at the bf16 rate."""
    s, v, e = cfg.siglip, cfg.vlm, cfg.expert
    formats = formats or {}
    plain = WeightFormat("plain", weight_bytes)
    fmt = {part: formats.get(part, plain) for part in PARTS}
    b = batch
    # Vision: per image, T patches through depth layers.
    t = s.num_patches
    imgs = b * n_cameras
    patch_in = 3 * s.patch_size ** 2
    vis_layers = s.depth * (4 * s.width ** 2 + 2 * s.width * s.mlp_dim)
    vis_rows = s.depth * (3 * s.width + s.width + s.mlp_dim + s.width)
    vis_other = patch_in * s.width + s.width * v.width
    vis_flops = _add({"bf16": imgs * (2 * t * vis_other + s.depth * 4 * t * t * s.width)},
                     fmt["vision"].compute, imgs * 2 * t * vis_layers)
    vis_bytes = (fmt["vision"].bytes(vis_layers, vis_rows) + vis_other * weight_bytes
                 + imgs * (3 * s.image_size ** 2 * 4 + t * v.width * act_bytes))
    # Prefix: P tokens through the VLM (the last layer's attention/MLP are skipped: only its K/V are used).
    p = n_cameras * s.num_patches + cfg.token_budget
    layer = _gemma_layer_params(v.width, v.q_dim, v.kv_dim, v.mlp_dim)
    kv_proj = v.width * (v.q_dim + 2 * v.kv_dim)
    pre_params = (v.depth - 1) * layer + kv_proj
    pre_rows = (v.depth - 1) * _gemma_layer_rows(v.width, v.q_dim, v.kv_dim, v.mlp_dim) + v.q_dim + 2 * v.kv_dim
    pre_flops = _add({"bf16": b * (v.depth - 1) * 4 * p * p * v.q_dim}, fmt["prefix"].compute, b * 2 * p * pre_params)
    kv_cache = b * v.depth * 2 * p * v.kv_dim * act_bytes
    pre_bytes = fmt["prefix"].bytes(pre_params, pre_rows) + b * p * v.width * act_bytes + kv_cache
    # Loop: H action tokens attend to P + H keys, every step.
    h = cfg.chunk_size + int(state_token)
    ex_layers = e.depth * _gemma_layer_params(e.width, e.q_dim, e.kv_dim, e.mlp_dim)
    ex_rows = e.depth * _gemma_layer_rows(e.width, e.q_dim, e.kv_dim, e.mlp_dim)
    ex_io = 2 * cfg.max_action_dim * e.width
    mix_params = 2 * e.width * e.width if state_token else 0
    step_flops = _add({"bf16": b * (2 * h * ex_io + e.depth * 4 * h * (p + h) * e.q_dim
                                    + 2 * cfg.chunk_size * mix_params)},
                      fmt["expert"].compute, b * 2 * h * ex_layers)
    step_bytes = (fmt["expert"].bytes(ex_layers, ex_rows) + (ex_io + mix_params) * weight_bytes + kv_cache
                  + b * h * e.width * act_bytes * 2)
    return {
        "vision": _cost(vis_flops, vis_bytes),
        "prefix": _cost(pre_flops, pre_bytes),
        "loop": _cost({r: cfg.num_steps * f for r, f in step_flops.items()}, cfg.num_steps * step_bytes),
    }
