"""The PaliGemma prefix shared by pi0 and pi0.5: SigLIP image tokens + scaled language embeddings, and the
Gemma LM pass that turns them into the per-layer K/V cache the action expert attends to.

Why shared: both policies build the prefix identically (LeRobot 0.6.1): camera slots of 256 tokens
(SigLIP -> projector, not rescaled) then the language tokens (embedding * sqrt(width)); bidirectional
attention among valid tokens; RoPE positions cumsum(pad) - 1. Stateless between calls; the LeRobot key
layout of these parts and their loader are adapter code (phyai_ros/models/pi/paligemma_keys.py).
"""
from __future__ import annotations

import math
from typing import List, Tuple

import torch
from torch import nn

from phyai_ros.layers import dispatch, ops

from .gemma import GemmaLayer, attn_out, mlp, qkv_rope, rope_inv_freq
from .siglip import SiglipEncoder

Tensor = torch.Tensor
PrefixKV = List[Tuple[Tensor, Tensor]]

def prefix_positions(prefix_pad: Tensor) -> Tensor:
    """RoPE positions of the prefix: cumsum(pad) - 1 (pad tokens do not advance the position)."""
    return torch.cumsum(prefix_pad.long(), dim=1) - 1


class PaliGemmaPrefix(nn.Module):
    """Base module of the pi-family models: owns the vision tower, projector, token embedding and LM layers.

    cfg needs .vlm (GemmaConfig), .siglip (SiglipConfig), .vocab_size."""

    def __init__(self, cfg, dtype: torch.dtype = torch.float32, device=None):
        super().__init__()
        self.cfg = cfg
        self.dtype = dtype
        v, s = cfg.vlm, cfg.siglip
        self.vision = SiglipEncoder(s, dtype, device)
        self.register_buffer("proj_w", torch.empty((v.width, s.width), dtype=dtype, device=device))
        self.register_buffer("proj_b", torch.empty((v.width,), dtype=dtype, device=device))
        self.register_buffer("embed_tokens", torch.empty((cfg.vocab_size, v.width), dtype=dtype, device=device))
        self.vlm_layers = nn.ModuleList(GemmaLayer(v, dtype, device) for _ in range(v.depth))
        self.register_buffer("vlm_inv_freq", rope_inv_freq(v, device))

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    def embed_images(self, images: Tensor) -> Tensor:
        """images [B,S,3,224,224] -> [B,S*256,W]: camera slots (SigLIP + projector) in slot order. Frames alone:
        the runner starts this stage while the host still builds the prompt (design.md §1, the host side)."""
        b, n_slots = images.shape[:2]
        size = self.cfg.siglip.image_size
        img = self.vision(images.reshape(b * n_slots, 3, size, size))
        img = ops.linear(img, self.proj_w, self.proj_b)
        return img.reshape(b, n_slots * img.shape[1], -1)

    def join_prefix(self, image_embs: Tensor, image_masks: Tensor, tokens: Tensor, token_masks: Tensor
                    ) -> Tuple[Tensor, Tensor]:
        """embed_images' output, image_masks [B,S], tokens/token_masks [B,L] -> prefix_embs [B,S*256+L,W],
        prefix_pad [B,S*256+L]: the camera slots, then language embeddings scaled by sqrt(width); pad = slot mask
        broadcast over its tokens, then token mask. Masked slots and pad tokens are embedded too (static shapes)."""
        b, n_slots = image_masks.shape
        n_tok = image_embs.shape[1] // n_slots
        lang = ops.embedding(tokens, self.embed_tokens) * math.sqrt(self.cfg.vlm.width)
        embs = torch.cat([image_embs, lang.to(image_embs.dtype)], dim=1)
        img_pad = image_masks[:, :, None].expand(b, n_slots, n_tok).reshape(b, n_slots * n_tok)
        return embs, torch.cat([img_pad, token_masks], dim=1)

    def embed_prefix(self, images: Tensor, image_masks: Tensor, tokens: Tensor, token_masks: Tensor
                     ) -> Tuple[Tensor, Tensor]:
        """images [B,S,3,224,224] and the prompt -> (prefix_embs, prefix_pad): embed_images, then join_prefix."""
        return self.join_prefix(self.embed_images(images), image_masks, tokens, token_masks)

    def prefix_kv(self, prefix_embs: Tensor, prefix_pad: Tensor) -> PrefixKV:
        """LM pass over the prefix (bidirectional among valid tokens) -> each layer's (k, v) [B,Hkv,P,hd],
        keys after RoPE. The last layer's attention/MLP and the final norm are skipped: nothing reads them."""
        cfg = self.cfg.vlm
        cos, sin = ops.rope_cos_sin(prefix_positions(prefix_pad), self.vlm_inv_freq, prefix_embs.dtype)
        # Keys only: every valid query attends to every valid key (a bidirectional prefix). Padding rows then
        # attend too, but nothing reads them: their keys are masked for every later query and for the expert.
        # A per-key mask is one mask row per key block for the attention kernel, not a [rows, keys] tile.
        mask = ops.bool_to_additive_mask(prefix_pad[:, None, :])
        h = prefix_embs
        layers = self.vlm_layers
        x = dispatch.rms_norm(h, layers[0].in_norm_w, cfg.rms_eps)
        kv: PrefixKV = []
        for i, layer in enumerate(layers):
            q, k, v = qkv_rope(x, layer, cfg, cos, sin)
            kv.append((k, v))
            if i == len(layers) - 1:
                break
            # Each residual add is fused with the norm that reads its result.
            x, h = dispatch.add_rms_norm(attn_out(dispatch.attention(q, k, v, mask), layer), h,
                                         layer.post_norm_w, cfg.rms_eps)
            x, h = dispatch.add_rms_norm(mlp(x, layer, cfg), h, layers[i + 1].in_norm_w, cfg.rms_eps)
        return kv
