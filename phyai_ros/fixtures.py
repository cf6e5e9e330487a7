"""Small model files for tests, demos and benchmarks: the parity fixtures' tokenizer, a small random-weight
pi0.5 / pi0 checkpoint, the GR00T N1.7 fixture set and a small random GR00T N1.7 checkpoint.  ROS-free and
rosbags-free (the GPU machines have neither) and free of the replay tools, so the demo, the test
helpers (``phyai_ros.testing`` re-exports these) and the scripts can all use it without importing
each other.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

PACKAGE_ROOT = Path(__file__).resolve().parents[1]   # folder holding the phyai_ros package

__all__ = ["fixtures_dir", "tokenizer_path", "require_tokenizer", "small_model_config", "make_small_checkpoint",
           "groot_fixture_dir", "load_groot_fixture", "make_small_groot_checkpoint", "require_groot_fixture",
           "cosmos3_fixture_dir"]


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


# ----------------------------------------------------------------------------- GR00T N1.7
GROOT_IMAGE_PREFIX = "raw.observation.images."


def groot_fixture_dir() -> Path:
    """The GR00T N1.7 parity fixture folder (``$PHYAI_PARITY_FIXTURES/groot_n17``; may not exist)."""
    return fixtures_dir() / "groot_n17"


def load_groot_fixture(folder: Optional[Path] = None) -> dict:
    """The GR00T fixture set as the tests use it: inputs ``inp``, expected outputs ``exp``, ``meta``
    (inputs.json) and ``images`` (camera -> uint8 [B, H, W, 3])."""
    import json

    from safetensors.torch import load_file
    folder = Path(folder) if folder is not None else groot_fixture_dir()
    inp = load_file(str(folder / "inputs.safetensors"))
    return {"inp": inp, "exp": load_file(str(folder / "expected.safetensors")),
            "meta": json.loads((folder / "inputs.json").read_text()),
            "images": {k[len(GROOT_IMAGE_PREFIX):]: v for k, v in inp.items() if k.startswith(GROOT_IMAGE_PREFIX)}}


def _random_tensor(name: str, shape, gen):
    """Norm scales 1, biases 0, everything else N(0, 0.05): finite, well-scaled actions from random weights."""
    import torch
    if name.endswith(".bias"):
        return torch.zeros(shape)
    if name.endswith(".weight") and len(shape) == 1:
        return torch.ones(shape)
    return torch.randn(shape, generator=gen) * 0.05


def _groot_pipelines(src: Path, dst: Path, cameras, state_dim: int, action_dim: int, tag: str, mapping) -> None:
    """The fixture checkpoint's processor pipelines with this checkpoint's cameras, dims and embodiments;
    statistics: state and actions within [-1, 1] per dim."""
    import json

    import torch
    from safetensors.torch import save_file
    stats = {"observation.state.min": -torch.ones(state_dim), "observation.state.max": torch.ones(state_dim),
             "action.min": -torch.ones(action_dim), "action.max": torch.ones(action_dim)}
    for name in ("policy_preprocessor.json", "policy_postprocessor.json"):
        pipeline = json.loads((src / name).read_text())
        for step in pipeline["steps"]:
            cfg = step.get("config") or {}
            if step["registry_name"] == "groot_n1_7_pack_inputs_v1":
                cfg.update(embodiment_tag=tag, embodiment_mapping=dict(mapping), video_modality_keys=list(cameras))
            if step["registry_name"] == "groot_action_unpack_unnormalize_v2":
                cfg["env_action_dim"] = action_dim
            if step.get("state_file"):
                save_file(stats, str(dst / step["state_file"]))
        (dst / name).write_text(json.dumps(pipeline, indent=2))


def make_small_groot_checkpoint(directory, *, state_dim: int = 13, action_dim: int = 12, horizon: int = 16,
                                cameras: Sequence[str] = ("front", "wrist"), seed: int = 0,
                                tag: str = "new_embodiment", mapping: Optional[dict] = None) -> Path:
    """A random-weight GR00T N1.7 of the parity fixture's tiny sizes (LeRobot layout) in ``directory``:
    ``checkpoint/`` (the folder to load), ``base_model/`` and ``backbone/`` (its files copied from the
    fixture set, which must exist: ``require_groot_fixture``). Returns the checkpoint folder. horizon <= 16."""
    import json
    import shutil

    import torch
    from safetensors.torch import save_file

    from phyai_ros.models.groot_n17.checkpoint import PREFIX, groot_key_shapes
    from phyai_ros.models.groot_n17.config import groot_config
    src, root = groot_fixture_dir(), Path(directory)
    mapping = dict(mapping or {tag: 3, "second_robot": 5})
    for folder in ("backbone", "base_model"):
        (root / folder).mkdir(parents=True, exist_ok=True)
        for f in (src / folder).iterdir():
            if f.suffix != ".safetensors" and f.name != "embodiment_id.json":
                shutil.copyfile(f, root / folder / f.name)
    (root / "base_model" / "embodiment_id.json").write_text(json.dumps(mapping))
    base = json.loads((src / "base_model" / "config.json").read_text())
    if not 1 <= horizon <= base["action_horizon"] or action_dim > base["max_action_dim"] \
            or state_dim > base["max_state_dim"] or max(mapping.values()) >= base["max_num_embodiments"]:
        raise ValueError(f"horizon <= {base['action_horizon']}, action_dim <= {base['max_action_dim']}, state_dim <= "
                         f"{base['max_state_dim']}, ids < {base['max_num_embodiments']} (the fixture's sizes)")
    ckpt = root / "checkpoint"
    ckpt.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "checkpoint" / "config.json").read_text())
    config["input_features"] = {**{f"observation.images.{c}": {"type": "VISUAL", "shape": [3, 120, 160]}
                                   for c in cameras},
                                "observation.state": {"type": "STATE", "shape": [state_dim]}}
    config["output_features"] = {"action": {"type": "ACTION", "shape": [action_dim]}}
    config.update(chunk_size=horizon, n_action_steps=horizon, embodiment_tag=tag, base_model_path="./base_model")
    (ckpt / "config.json").write_text(json.dumps(config, indent=2))
    _groot_pipelines(src / "checkpoint", ckpt, cameras, state_dim, action_dim, tag, mapping)
    cfg = groot_config(json.loads((root / "backbone" / "config.json").read_text()), base, "backbone", "base_model")
    gen = torch.Generator().manual_seed(seed)
    weights = {PREFIX + k: _random_tensor(k, shape, gen) for k, shape in groot_key_shapes(cfg).items()}
    save_file(weights, str(ckpt / "model.safetensors"))
    return ckpt


def require_groot_fixture() -> Path:
    """The GR00T fixture folder, or ``pytest.skip`` with the reason."""
    folder = groot_fixture_dir()
    if not (folder / "expected.safetensors").is_file():
        import pytest
        pytest.skip(f"GR00T N1.7 parity fixtures not found at {folder} (set PHYAI_PARITY_FIXTURES)")
    return folder


# ----------------------------------------------------------------------------- Cosmos3
def cosmos3_fixture_dir() -> Path:
    """The Cosmos3 parity fixture folder, beside lerobot_parity (``<fixtures_dir>/../cosmos3``; may not exist)."""
    return fixtures_dir().parent / "cosmos3"
