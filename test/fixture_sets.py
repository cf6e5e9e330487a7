"""Where the tests find each family's shared parity fixture set (GR00T N1.7's beside the pi ones, Cosmos3's beside
lerobot_parity), kept with the tests so that no shared module of the package names a family."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest
from safetensors.torch import load_file

from phyai_ros.fixtures import fixtures_dir
from phyai_ros.models.cases import IMG_PREFIX


def groot_fixture_dir() -> Path:
    """The GR00T N1.7 parity fixture folder (``$PHYAI_PARITY_FIXTURES/groot_n17``; may not exist)."""
    return fixtures_dir() / "groot_n17"


def load_groot_fixture(folder: Optional[Path] = None) -> dict:
    """The GR00T fixture set: inputs ``inp``, expected outputs ``exp``, ``meta`` (inputs.json) and ``images``
    (camera -> uint8 [B, H, W, 3])."""
    folder = Path(folder) if folder is not None else groot_fixture_dir()
    inp = load_file(str(folder / "inputs.safetensors"))
    return {"inp": inp, "exp": load_file(str(folder / "expected.safetensors")),
            "meta": json.loads((folder / "inputs.json").read_text()),
            "images": {k[len(IMG_PREFIX):]: v for k, v in inp.items() if k.startswith(IMG_PREFIX)}}


def require_groot_fixture() -> Path:
    """The GR00T fixture folder, or ``pytest.skip`` with the reason."""
    folder = groot_fixture_dir()
    if not (folder / "expected.safetensors").is_file():
        pytest.skip(f"GR00T N1.7 parity fixtures not found at {folder} (set PHYAI_PARITY_FIXTURES)")
    return folder


def cosmos3_fixture_dir() -> Path:
    """The Cosmos3 parity fixture folder, beside lerobot_parity (``<fixtures_dir>/../cosmos3``; may not exist)."""
    return fixtures_dir().parent / "cosmos3"


def minicpm_fixture_dir() -> Path:
    """The MiniCPM-Robot parity set A, beside lerobot_parity (``<fixtures_dir>/../minicpm_parity``; may not
    exist)."""
    return fixtures_dir().parent / "minicpm_parity"


def load_minicpm_set(folder: Optional[Path] = None) -> tuple:
    """A MiniCPM-Robot parity set's (expected, inputs, config.json) tensors and metadata."""
    folder = Path(folder) if folder is not None else minicpm_fixture_dir()
    return (load_file(str(folder / "expected.safetensors")), load_file(str(folder / "inputs.safetensors")),
            json.loads((folder / "config.json").read_text()))


def load_pi_fixture_policy(name: str, device="cpu", dtype=None):
    """The pi0 / pi0.5 fixture checkpoint (``$PHYAI_PARITY_FIXTURES/<name>``) as its adapter, with the fixture
    tokenizer, or ``pytest.skip`` with the reason."""
    import torch
    from phyai_ros.models import family
    folder = fixtures_dir() / name
    tokenizer = fixtures_dir() / "tokenizer" / "tokenizer.model"
    if not (folder / "checkpoint").is_dir() or not tokenizer.is_file():
        pytest.skip(f"{name} parity fixtures not found at {folder} (set PHYAI_PARITY_FIXTURES)")
    return family(name).from_files(folder / "checkpoint", tokenizer, folder / "norm_stats.json", device=device,
                                   dtype=dtype or torch.float32)
