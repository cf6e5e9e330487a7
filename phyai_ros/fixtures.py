"""Small model files for tests, demos and benchmarks: where the shared parity fixtures are (their tokenizer) and
small random-weight checkpoints of any registered family (each family makes its own: ``make_small_checkpoint`` of
its adapter class; the families' own fixture sets are located by the tests, test/fixture_sets.py). ROS-free and rosbags-free (the GPU machines have neither) and
free of the replay tools, so the demo, the test helpers (``phyai_ros.testing`` re-exports these) and the
scripts can all use it without importing each other.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from phyai_ros.models import family

PACKAGE_ROOT = Path(__file__).resolve().parents[1]   # folder holding the phyai_ros package

__all__ = ["fixtures_dir", "tokenizer_path", "require_tokenizer", "make_small_checkpoint"]


def fixtures_dir() -> Path:
    """The LeRobot parity fixture folder (``$PHYAI_PARITY_FIXTURES``, else ../shared/fixtures/lerobot_parity)."""
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
        import pytest   # only tests call this; plain-Python users of the module need no pytest
        pytest.skip(f"no tokenizer at {fixtures_dir() / 'tokenizer' / 'tokenizer.model'} "
                    "(set PHYAI_PARITY_FIXTURES to the lerobot_parity fixture folder)")
    return p


def make_small_checkpoint(directory, *, policy: str = "pi05", **sizes) -> Path:
    """A small random-weight checkpoint of family ``policy`` in ``directory`` (its maker's ``sizes``: horizon,
    state_dim, action_dim, cameras, seed, ...); returns the folder to load. Families that copy files from the
    shared fixtures (GR00T N1.7's processor and backbone configs) get their folder."""
    return family(policy).make_small_checkpoint(directory, fixtures=fixtures_dir(), **sizes)
