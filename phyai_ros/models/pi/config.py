"""Architecture config of the pi family (pi0.5 and pi0 share every size: PaliGemma + a Gemma action expert).

Why a dataclass separate from LeRobot's config.json: config.json names variants (gemma_2b / gemma_300m) but
cannot describe other sizes (the parity fixture and mid-size benchmark models), so the sizes are read from a
`model_dims.json` (fixture schema, written by `make_random_checkpoint`) or inferred from tensor shapes.
Defaults are the full pi0.5: PaliGemma Gemma-2B + SigLIP So400m/14 + Gemma-300M action expert. Each policy's
config.py subclasses it (pi0: its token budget and model_dims label).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from phyai_ros.models.pi.modeling.config import (GEMMA_2B, GEMMA_300M, SIGLIP_SO400M, GemmaConfig,
                                            SiglipConfig)
from phyai_ros.models.files import Fields


@dataclass(frozen=True)
class PiConfig:
    vlm: GemmaConfig = field(default_factory=lambda: GEMMA_2B)
    expert: GemmaConfig = field(default_factory=lambda: GEMMA_300M)
    siglip: SiglipConfig = field(default_factory=lambda: SIGLIP_SO400M)
    vocab_size: int = 257152
    chunk_size: int = 50          # H: actions per chunk
    max_action_dim: int = 32      # A: padded action width of the network
    max_state_dim: int = 32
    num_steps: int = 10           # Euler steps
    token_budget: int = 200       # language tokens (BOS + prompt, padded)
    min_period: float = 0.004
    max_period: float = 4.0

    def __post_init__(self):
        v, e = self.vlm, self.expert
        if (v.depth, v.num_kv_heads, v.head_dim) != (e.depth, e.num_kv_heads, e.head_dim):
            raise ValueError("VLM and action expert must share depth, num_kv_heads and head_dim "
                             f"(vlm {v.depth}/{v.num_kv_heads}/{v.head_dim}, expert {e.depth}/{e.num_kv_heads}"
                             f"/{e.head_dim})")
        if v.num_heads % v.num_kv_heads or e.num_heads % e.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.siglip.width % self.siglip.num_heads:
            raise ValueError("SigLIP width must be a multiple of its head count")

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.vlm.width)

    def prefix_len(self, num_cameras: int) -> int:
        return num_cameras * self.siglip.num_patches + self.token_budget

    def replace(self, **kw) -> "PiConfig":
        return replace(self, **kw)

    # ---- model_dims.json (the parity fixture's schema) ----
    def to_model_dims(self) -> dict:
        def gemma(g: GemmaConfig, ada: bool):
            return {"width": g.width, "depth": g.depth, "mlp_dim": g.mlp_dim, "num_heads": g.num_heads,
                    "num_kv_heads": g.num_kv_heads, "head_dim": g.head_dim, "hidden_act": "gelu_pytorch_tanh",
                    "rms_norm_eps": g.rms_eps, "rope": {"rope_theta": g.rope_theta, "rope_type": "default"},
                    "attention_bias": False, "use_adarms": ada, "adarms_cond_dim": g.width if ada else None}
        s = self.siglip
        return {
            "policy_type": "pi05", "vocab_size": self.vocab_size,
            "vlm": {**gemma(self.vlm, False), "embed_scale": self.embed_scale},
            "expert": gemma(self.expert, True),
            "siglip": {"hidden_size": s.width, "num_hidden_layers": s.depth, "num_attention_heads": s.num_heads,
                       "intermediate_size": s.mlp_dim, "patch_size": s.patch_size, "image_size": s.image_size,
                       "num_patches": s.num_patches, "hidden_act": "gelu_pytorch_tanh",
                       "layer_norm_eps": s.ln_eps, "vision_use_head": False},
            "projector": {"in_features": s.width, "out_features": self.vlm.width, "bias": True},
            "chunk_size": self.chunk_size, "max_action_dim": self.max_action_dim,
            "max_state_dim": self.max_state_dim, "num_inference_steps": self.num_steps,
            "tokenizer_max_length": self.token_budget, "min_period": self.min_period,
            "max_period": self.max_period, "image_resolution": [s.image_size, s.image_size],
        }

    @classmethod
    def from_model_dims(cls, d: dict, source="model_dims.json") -> "PiConfig":
        """From a model_dims.json (as a dict), every size type- and range-checked (files.Fields: a wrong one names
        ``source`` and its key)."""
        f = Fields(d, source)
        width = lambda g, k: g.get(k, int, 1, 65536)  # noqa: E731

        def gemma(key: str) -> GemmaConfig:
            g = f.section(key)
            return GemmaConfig(width=width(g, "width"), depth=g.get("depth", int, 1, 1024), mlp_dim=width(g, "mlp_dim"),
                               num_heads=g.get("num_heads", int, 1, 1024), num_kv_heads=g.get("num_kv_heads", int, 1, 1024),
                               head_dim=g.get("head_dim", int, 1, 4096),
                               rms_eps=g.get("rms_norm_eps", float, 0, 1, default=1e-6),
                               rope_theta=g.section("rope", default={}).get("rope_theta", float, 1e-6, 1e12,
                                                                            default=10000.0))
        s = f.section("siglip")
        sig = SiglipConfig(width=width(s, "hidden_size"), depth=s.get("num_hidden_layers", int, 1, 1024),
                           num_heads=s.get("num_attention_heads", int, 1, 1024), mlp_dim=width(s, "intermediate_size"),
                           patch_size=s.get("patch_size", int, 1, 1024), image_size=s.get("image_size", int, 1, 4096),
                           ln_eps=s.get("layer_norm_eps", float, 0, 1, default=1e-6))
        return cls(vlm=gemma("vlm"), expert=gemma("expert"), siglip=sig, vocab_size=f.get("vocab_size", int, 1, 1 << 22),
                   chunk_size=f.get("chunk_size", int, 1, 1000, default=50),
                   max_action_dim=f.get("max_action_dim", int, 1, 4096, default=32),
                   max_state_dim=f.get("max_state_dim", int, 1, 4096, default=32),
                   num_steps=f.get("num_inference_steps", int, 1, 1000, default=10),
                   token_budget=f.get("tokenizer_max_length", int, 1, 4096,
                                      default=cls.__dataclass_fields__["token_budget"].default),
                   min_period=f.get("min_period", float, 1e-9, 1e9, default=0.004),
                   max_period=f.get("max_period", float, 1e-9, 1e9, default=4.0))
