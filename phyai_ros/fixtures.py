"""Small model files for tests, demos and benchmarks: the parity fixtures' tokenizer and a small
random-weight pi0.5 / pi0 checkpoint.  ROS-free and free of the replay tools, so the demo, the test
helpers (``phyai_ros.testing`` re-exports these) and the scripts can all use it without importing
each other.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

PACKAGE_ROOT = Path(__file__).resolve().parents[1]   # folder holding the phyai_ros package

__all__ = ["fixtures_dir", "tokenizer_path", "require_tokenizer", "small_model_config", "make_small_checkpoint"]


def fixtures_dir() -> Path:
    env = os.environ.get("PHYAI_PARITY_FIXTURES")
    return Path(env) if env else PACKAGE_ROOT.parent / "shared" / "fixtures" / "lerobot_parity"


def tokenizer_path() -> Optional[Path]:
    """The fixture SentencePiece model (``$PHYAI_PARITY_FIXTURES/tokenizer/tokenizer.model``), or None."""
    p = fixtures_dir() / "tokenizer" / "tokenizer.model"
    return p if p.is_file() else None


def require_tokenizer() -> Path:
    """The fixture tokenizer, or ``pytest.skip`` with the reason."""
    p = tokenizer_path()
    if p is None:
        import pytest
        pytest.skip(f"no tokenizer at {fixtures_dir() / 'tokenizer' / 'tokenizer.model'} "
                    "(set PHYAI_PARITY_FIXTURES to the lerobot_parity fixture folder)")
    return p


def small_model_config(horizon: int = 50, image_size: int = 224, token_budget: int = 64, policy: str = "pi05"):
    """A small pi0.5 or pi0 (parity-fixture sizes: VLM 128x2, expert 64x2, SigLIP 64x2 at 224 px, vocab 1024,
    64-token prompt): one CPU inference takes ~50-100 ms on 2 cores."""
    from phyai_ros.modeling.config import GemmaConfig, SiglipConfig
    from phyai_ros.models.pi0 import Pi0Config
    from phyai_ros.models.pi05 import Pi05Config
    return {"pi05": Pi05Config, "pi0": Pi0Config}[policy](
        vlm=GemmaConfig(width=128, depth=2, mlp_dim=256, num_heads=8, num_kv_heads=1, head_dim=16),
        expert=GemmaConfig(width=64, depth=2, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16),
        siglip=SiglipConfig(width=64, depth=2, num_heads=4, mlp_dim=128, patch_size=14, image_size=image_size),
        vocab_size=1024, chunk_size=horizon, num_steps=10, token_budget=token_budget)


def make_small_checkpoint(directory, *, horizon: int = 50, state_dim: int = 8, action_dim: int = 7, seed: int = 0,
                          cameras: Sequence[str] = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"),
                          image_size: int = 224, token_budget: int = 64, policy: str = "pi05") -> Path:
    """Write a random-weight small pi0.5 (or, policy="pi0", pi0) checkpoint (LeRobot layout) into
    ``directory``; its chunk size must equal the node's ``control.horizon``, state/action dims its
    joint/action name counts."""
    import torch
    from phyai_ros.models import pi0, pi05
    directory = Path(directory)
    writer = {"pi05": pi05.make_random_checkpoint, "pi0": pi0.make_random_checkpoint}[policy]
    writer(directory, small_model_config(horizon, image_size, token_budget, policy), seed=seed,
                           dtype=torch.float32, std=0.1,
                           camera_names=tuple(cameras), state_dim=state_dim, action_dim=action_dim)
    return directory
