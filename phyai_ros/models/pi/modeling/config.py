"""Architecture dataclasses for the transformer stacks shared by pi0 / pi0.5.

Sizes live here (not in code) so the same modeling functions serve the full models, the tiny parity
fixtures and any mid-size benchmark config. Defaults are the full-size pi0.5 / pi0 parts.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class GemmaConfig:
    """One Gemma decoder stack (PaliGemma LM or the action expert)."""
    width: int = 2048
    depth: int = 18
    mlp_dim: int = 16384
    num_heads: int = 8
    num_kv_heads: int = 1
    head_dim: int = 256
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def to_dict(self) -> dict:
        return asdict(self)


# Full-size parts (PaliGemma's Gemma-2B and the pi0 / pi0.5 Gemma-300M action expert).
GEMMA_2B = GemmaConfig()
GEMMA_300M = GemmaConfig(width=1024, depth=18, mlp_dim=4096)


@dataclass(frozen=True)
class SiglipConfig:
    """SigLIP vision tower (no pooling head); default So400m/14 at 224 px."""
    width: int = 1152
    depth: int = 27
    num_heads: int = 16
    mlp_dim: int = 4304
    patch_size: int = 14
    image_size: int = 224
    ln_eps: float = 1e-6

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    def to_dict(self) -> dict:
        return asdict(self)


SIGLIP_SO400M = SiglipConfig()
