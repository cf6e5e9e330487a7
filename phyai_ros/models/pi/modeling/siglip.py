"""SigLIP vision tower (pre-LN ViT, no pooling head) as a stateless stage over fused weights.

Why its own module: pi0 and pi0.5 both embed camera images this way. q/k/v are one fused GEMM; the patch
embedding and the unmasked attention go through phyai_ros.layers.ops (conv / SDPA, the reference's own
choices, which keeps the image tokens bitwise equal to it on CPU), so the runtime can swap in kernels. The
linear layers go through dispatch (a quantized weight runs its kernels there); each residual add goes through
dispatch with its output GEMM and the LayerNorm after it, which a fused kernel runs as
one pass over the tokens on the GPU.
"""
from __future__ import annotations

import torch
from torch import nn

from phyai_ros.layers import dispatch, ops

from .config import SiglipConfig


def _buf(shape, dtype, device):
    return torch.empty(shape, dtype=dtype, device=device)


class SiglipLayer(nn.Module):
    """Weights of one encoder layer: LN -> MHA (fused qkv) -> residual, LN -> MLP(gelu_tanh) -> residual."""

    def __init__(self, cfg: SiglipConfig, dtype: torch.dtype, device=None):
        super().__init__()
        w, m = cfg.width, cfg.mlp_dim
        f32 = torch.float32
        self.register_buffer("ln1_w", _buf((w,), f32, device))
        self.register_buffer("ln1_b", _buf((w,), f32, device))
        self.register_buffer("qkv_w", _buf((3 * w, w), dtype, device))
        self.register_buffer("qkv_b", _buf((3 * w,), dtype, device))
        self.register_buffer("o_w", _buf((w, w), dtype, device))
        self.register_buffer("o_b", _buf((w,), dtype, device))
        self.register_buffer("ln2_w", _buf((w,), f32, device))
        self.register_buffer("ln2_b", _buf((w,), f32, device))
        self.register_buffer("fc1_w", _buf((m, w), dtype, device))
        self.register_buffer("fc1_b", _buf((m,), dtype, device))
        self.register_buffer("fc2_w", _buf((w, m), dtype, device))
        self.register_buffer("fc2_b", _buf((w,), dtype, device))


class SiglipEncoder(nn.Module):
    """pixels [N, 3, S, S] in [-1, 1] -> tokens [N, (S/p)^2, width] (after post_layernorm)."""

    def __init__(self, cfg: SiglipConfig, dtype: torch.dtype = torch.float32, device=None):
        super().__init__()
        self.cfg = cfg
        p, w = cfg.patch_size, cfg.width
        self.register_buffer("patch_w", _buf((w, 3, p, p), dtype, device))
        self.register_buffer("patch_b", _buf((w,), dtype, device))
        self.register_buffer("pos_emb", _buf((cfg.num_patches, w), dtype, device))
        self.layers = nn.ModuleList(SiglipLayer(cfg, dtype, device) for _ in range(cfg.depth))
        self.register_buffer("post_ln_w", _buf((w,), torch.float32, device))
        self.register_buffer("post_ln_b", _buf((w,), torch.float32, device))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        # The conv's tokens are channel-major and the add keeps that layout: make the residual stream token-major
        # once, so the row-wise LayerNorm kernels read it in place.
        h = (ops.patch_embed(pixels.to(self.patch_w.dtype), self.patch_w, self.patch_b) + self.pos_emb).contiguous()
        n, t = h.shape[:2]
        nh, hd, eps = cfg.num_heads, cfg.head_dim, cfg.ln_eps
        # Each residual add is fused with the LayerNorm after it: LN2, the next layer's LN1, the post-LN.
        next_ln = [(nxt.ln1_w, nxt.ln1_b) for nxt in self.layers[1:]] + [(self.post_ln_w, self.post_ln_b)]
        first = self.layers[0]
        y = dispatch.layer_norm(h, first.ln1_w, first.ln1_b, eps)
        for layer, (ln_w, ln_b) in zip(self.layers, next_ln):
            qkv = dispatch.linear(y, layer.qkv_w, layer.qkv_b).view(n, t, 3, nh, hd)
            q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # strided views, no copy
            # SDPA writes its output token-major, so merging the heads back is a view, not a copy.
            a = ops.attention_unmasked(q, k, v).transpose(1, 2).reshape(n, t, nh * hd)
            h, y = dispatch.linear_add_layer_norm(h, a, layer.o_w, layer.o_b, layer.ln2_w, layer.ln2_b, eps)
            m = dispatch.linear_gelu_tanh(y, layer.fc1_w, layer.fc1_b)
            h, y = dispatch.linear_add_layer_norm(h, m, layer.fc2_w, layer.fc2_b, ln_w, ln_b, eps)
        return y
