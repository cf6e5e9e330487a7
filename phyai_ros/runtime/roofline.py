"""Logical FLOPs and bytes of the pi0 / pi0.5 stages, for the stage-level roofline.

"Logical": what the math needs, not what kernels do: each weight read once per
use of the stage (the expert's weights once per denoising step), activations and
the KV cache read/written once, 2 FLOPs per multiply-add. Attention FLOPs count
every (query, key) pair the shapes carry, masked ones included, as the kernels do.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageCost:
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    def floor_s(self, peak_flops: float, bandwidth: float) -> float:
        """Roofline time: whichever of compute and memory takes longer."""
        return max(self.flops / peak_flops, self.bytes / bandwidth)


def _gemma_layer_params(width: int, q_dim: int, kv_dim: int, mlp: int) -> int:
    return width * (q_dim + 2 * kv_dim) + q_dim * width + 3 * width * mlp


def flow_stage_costs(cfg, batch: int, n_cameras: int, weight_bytes: int = 2, act_bytes: int = 2,
                     state_token: bool = False) -> dict:
    """Costs of 'vision' (SigLIP + projector + embeddings), 'prefix' (VLM over the prefix) and
    'loop' (all denoising steps of the action expert) for one batch.

    state_token: pi0's suffix, i.e. one continuous state token before the H action tokens and the
    action+time MLP (two width x width GEMMs per action token); pi0.5 has neither (its time
    conditioning is a per-step table computed before the loop)."""
    s, v, e = cfg.siglip, cfg.vlm, cfg.expert
    b = batch
    # Vision: per image, T patches through depth layers.
    t = s.num_patches
    imgs = b * n_cameras
    patch_in = 3 * s.patch_size ** 2
    vis_params = patch_in * s.width + s.depth * (4 * s.width ** 2 + 2 * s.width * s.mlp_dim) + s.width * v.width
    vis_flops = imgs * (2 * t * vis_params + s.depth * 4 * t * t * s.width)
    vis_bytes = vis_params * weight_bytes + imgs * (3 * s.image_size ** 2 * 4 + t * v.width * act_bytes)
    # Prefix: P tokens through the VLM (the last layer's attention/MLP are skipped: only its K/V are used).
    p = n_cameras * s.num_patches + cfg.token_budget
    layer = _gemma_layer_params(v.width, v.q_dim, v.kv_dim, v.mlp_dim)
    kv_proj = v.width * (v.q_dim + 2 * v.kv_dim)
    pre_params = (v.depth - 1) * layer + kv_proj
    pre_flops = b * (2 * p * pre_params + (v.depth - 1) * 4 * p * p * v.q_dim)
    kv_cache = b * v.depth * 2 * p * v.kv_dim * act_bytes
    pre_bytes = pre_params * weight_bytes + b * p * v.width * act_bytes + kv_cache
    # Loop: H action tokens attend to P + H keys, every step.
    h = cfg.chunk_size + int(state_token)
    ex_layer = _gemma_layer_params(e.width, e.q_dim, e.kv_dim, e.mlp_dim)
    ex_params = e.depth * ex_layer + 2 * cfg.max_action_dim * e.width
    mix_params = 2 * e.width * e.width if state_token else 0
    step_flops = b * (2 * h * ex_params + e.depth * 4 * h * (p + h) * e.q_dim + 2 * cfg.chunk_size * mix_params)
    step_bytes = (ex_params + mix_params) * weight_bytes + kv_cache + b * h * e.width * act_bytes * 2
    return {
        "vision": StageCost(vis_flops, vis_bytes),
        "prefix": StageCost(pre_flops, pre_bytes),
        "loop": StageCost(cfg.num_steps * step_flops, cfg.num_steps * step_bytes),
    }
