"""pi0.5 adapter input validation, checkpoint loading errors and the random-checkpoint round trip.

Uses a tiny random config (28 px images, 1-layer stacks) so every test runs in milliseconds; the fixture
tokenizer (1024 pieces) is the only fixture file needed.
"""
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from phyai_ros.control.rtc import make_request
from phyai_ros.models.pi.modeling.config import GemmaConfig, SiglipConfig
from phyai_ros.models.pi.normalize import load_norm_stats
from phyai_ros.models.pi.pi05 import (CheckpointError, Pi05Config, Pi05Adapter, PromptTruncatedWarning,
                                   load_pi05_checkpoint, make_random_checkpoint)
from phyai_ros.models.pi.pi05.checkpoint import EXP, LM, VIS

FIXTURES = Path(os.environ.get("PHYAI_PARITY_FIXTURES") or
                Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "lerobot_parity")
TOKENIZER = FIXTURES / "tokenizer" / "tokenizer.model"
needs_tokenizer = pytest.mark.skipif(not TOKENIZER.is_file(), reason=f"fixture tokenizer not found at {TOKENIZER}")

TINY = Pi05Config(vlm=GemmaConfig(width=32, depth=1, mlp_dim=64, num_heads=2, num_kv_heads=1, head_dim=8),
                  expert=GemmaConfig(width=16, depth=1, mlp_dim=32, num_heads=2, num_kv_heads=1, head_dim=8),
                  siglip=SiglipConfig(width=16, depth=1, num_heads=2, mlp_dim=32, patch_size=14, image_size=28),
                  vocab_size=1024, chunk_size=10, num_steps=3, token_budget=48)
CAMS = ("base_0_rgb", "left_wrist_0_rgb")


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_pi05")
    make_random_checkpoint(d, TINY, seed=3, std=0.1, camera_names=CAMS, state_dim=5, action_dim=4)
    return d


@pytest.fixture(scope="module")
def policy(ckpt_dir):
    if not TOKENIZER.is_file():
        pytest.skip(f"fixture tokenizer not found at {TOKENIZER}")
    return Pi05Adapter.from_files(ckpt_dir, TOKENIZER, ckpt_dir / "norm_stats.json")


def obs(h=40, w=30):
    rng = np.random.default_rng(0)
    return ({"base_0_rgb": rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
             "left_wrist_0_rgb": rng.integers(0, 256, (h + 5, w, 3), dtype=np.uint8)},
            np.linspace(-1, 1, 5).astype(np.float32))


# ------------------------------------------------------------------ good path / round trip
def test_round_trip_random_checkpoint(ckpt_dir, policy):
    sd = load_file(str(ckpt_dir / "model.safetensors"))
    m = load_pi05_checkpoint(ckpt_dir).model
    layer = m.vlm_layers[0]
    qkv = torch.cat([sd[f"{LM}layers.0.self_attn.{n}_proj.weight"] for n in "qkv"])
    assert torch.equal(layer.qkv_w, qkv)
    gu = torch.cat([sd[f"{EXP}layers.0.mlp.gate_proj.weight"], sd[f"{EXP}layers.0.mlp.up_proj.weight"]])
    assert torch.equal(m.expert_layers[0].gate_up_w, gu)
    assert torch.equal(m.vision.patch_w, sd[f"{VIS}embeddings.patch_embedding.weight"])
    assert torch.equal(m.embed_tokens, sd[f"{LM}embed_tokens.weight"])
    assert policy.camera_names == list(CAMS) and policy.state_dim == 5 and policy.action_dim == 4
    images, state = obs()
    a = policy.predict(images, state, "pick up the cup", noise=torch.zeros(10, 32))
    assert a.shape == (10, 4) and a.dtype == np.float32 and np.isfinite(a).all()
    # deterministic given the noise; a missing camera is allowed and changes the result
    assert np.array_equal(a, policy.predict(images, state, "pick up the cup", noise=torch.zeros(10, 32)))
    b = policy.predict({"base_0_rgb": images["base_0_rgb"], "left_wrist_0_rgb": None}, state, "pick up the cup",
                       noise=torch.zeros(10, 32))
    assert not np.allclose(a, b)
    r = policy.predict(images, state, "pick up the cup", rtc=make_request(np.zeros((6, 4), np.float32), 2, mode="guided",
                                                                     schedule="exp", horizon=10))
    assert r.shape == (10, 4)


def test_bf16_checkpoint_and_no_lm_heads(tmp_path):
    make_random_checkpoint(tmp_path, TINY, seed=1, dtype=torch.bfloat16, include_unused=False)
    sd = load_file(str(tmp_path / "model.safetensors"))
    assert all(v.dtype == torch.bfloat16 for v in sd.values()) and not any("lm_head" in k for k in sd)
    m = load_pi05_checkpoint(tmp_path, dtype=torch.float32).model
    assert m.embed_tokens.dtype == torch.float32
    assert torch.equal(m.embed_tokens, sd[f"{LM}embed_tokens.weight"].float())
    assert load_pi05_checkpoint(tmp_path, dtype=torch.bfloat16).model.embed_tokens.dtype == torch.bfloat16


def test_norm_stats_formats(tmp_path):
    lerobot_dir = FIXTURES / "pi05" / "checkpoint"
    if not lerobot_dir.is_dir():
        pytest.skip("fixture checkpoint not found")
    from_json = load_norm_stats(FIXTURES / "pi05" / "norm_stats.json")
    from_dir = load_norm_stats(lerobot_dir)  # LeRobot normalizer .safetensors
    for feat in ("observation.state", "action"):
        for stat in ("q01", "q99"):
            np.testing.assert_array_equal(from_json[feat][stat], from_dir[feat][stat])
    openpi = {"norm_stats": {"state": {k: v.tolist() for k, v in from_json["observation.state"].items()},
                             "actions": {k: v.tolist() for k, v in from_json["action"].items()}}}
    (tmp_path / "openpi.json").write_text(json.dumps(openpi))
    np.testing.assert_array_equal(load_norm_stats(tmp_path / "openpi.json")["action"]["q99"],
                                  from_json["action"]["q99"])


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("bad, match", [
    (np.zeros((40, 30, 3), np.float32), "uint8"),
    (np.zeros((40, 30), np.uint8), r"one \[H, W, 3\]"),
    (np.zeros((40, 30, 4), np.uint8), r"\[H, W, 3\]"),
    (np.zeros((2, 40, 30, 3), np.uint8), r"one \[H, W, 3\]"),
    (np.zeros((0, 30, 3), np.uint8), "empty image"),
])
def test_bad_image(policy, bad, match):
    images, state = obs()
    images["base_0_rgb"] = bad
    with pytest.raises(ValueError, match=match):
        policy.predict(images, state, "task")


def test_bad_cameras(policy):
    images, state = obs()
    with pytest.raises(ValueError, match="unknown camera"):
        policy.predict({**images, "top_rgb": images["base_0_rgb"]}, state, "task")
    with pytest.raises(ValueError, match="at least one camera"):
        policy.predict({"base_0_rgb": None}, state, "task")


@pytest.mark.parametrize("state, match", [
    (np.zeros(4, np.float32), "shape"),
    (np.zeros(6, np.float32), "shape"),
    (np.zeros((1, 5), np.float32), "vector"),
    (np.array([0, 0, np.nan, 0, 0], np.float32), "NaN or inf"),
    (np.array([0, 0, 0, np.inf, 0], np.float32), "NaN or inf"),
    (np.array([-np.inf, 0, 0, 0, 0], np.float32), "NaN or inf"),
])
def test_bad_state(policy, state, match):
    images, _ = obs()
    with pytest.raises(ValueError, match=match):
        policy.predict(images, state, "task")


@pytest.mark.parametrize("task", ["", "   \n ", None])
def test_empty_task(policy, task):
    images, state = obs()
    with pytest.raises(ValueError, match="task"):
        policy.predict(images, state, task)


def test_bad_noise_and_rtc(policy):
    images, state = obs()
    with pytest.raises(ValueError, match="noise"):
        policy.predict(images, state, "task", noise=torch.zeros(50, 32))
    def request(prefix, schedule="linear", mode="guided"):
        return make_request(prefix, 2, mode=mode, schedule=schedule, horizon=10)
    with pytest.raises(ValueError, match="RTC prefix must be"):
        policy.predict(images, state, "task", rtc=request(np.zeros((5, 3), np.float32)))
    with pytest.raises(ValueError, match="NaN"):
        policy.predict(images, state, "task", rtc=request(np.full((5, 4), np.nan, np.float32)))
    with pytest.raises(ValueError, match="schedule"):
        policy.predict(images, state, "task", rtc=request(np.zeros((5, 4), np.float32), "cosine"))
    with pytest.raises(ValueError, match="RTC mode 'native' is not supported by Pi05Adapter"):
        policy.predict(images, state, "task", rtc=request(np.zeros((5, 4), np.float32), mode="native"))


def test_prompt_longer_than_budget_is_truncated(policy):
    """The task is cut so the prompt fits the budget; the state and 'Action:' after it are kept (LeRobot's
    cut of the prompt's tail would lose them)."""
    images, state = obs()
    task = " ".join(["pick up the red block and place it carefully in the bowl"] * 12)
    with pytest.warns(PromptTruncatedWarning):
        inputs = policy.prepare(images, state, task)
    full, was_cut = policy.tokenizer.encode(inputs.prompts[0])
    assert not was_cut and inputs.truncated == [True] and inputs.prompts[0].endswith(";\nAction: ")
    ids = policy.tokenizer.sp.encode(inputs.prompts[0], add_bos=True)
    assert len(ids) <= 48 and inputs.tokens.shape == (1, 48)
    assert inputs.tokens[0, :len(ids)].tolist() == ids and inputs.tokens[0, 0].item() == policy.tokenizer.sp.bos_id()
    assert int(inputs.token_masks.sum()) == len(ids)
    with pytest.warns(PromptTruncatedWarning):
        a = policy.predict(images, state, task, noise=torch.zeros(10, 32))
    assert np.isfinite(a).all()


# ------------------------------------------------------------------ checkpoint errors
def _copy_ckpt(src: Path, dst: Path, edit=None):
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model_dims.json", "norm_stats.json"):
        (dst / name).write_text((src / name).read_text())
    sd = load_file(str(src / "model.safetensors"))
    if edit:
        edit(sd)
    save_file(sd, str(dst / "model.safetensors"))
    return dst


def test_missing_key(ckpt_dir, tmp_path):
    key = f"{LM}layers.0.self_attn.k_proj.weight"
    d = _copy_ckpt(ckpt_dir, tmp_path / "c", lambda sd: sd.pop(key))
    with pytest.raises(CheckpointError, match="missing keys") as e:
        load_pi05_checkpoint(d)
    assert key in str(e.value)


def test_unexpected_key(ckpt_dir, tmp_path):
    key = "model.state_proj.weight"
    d = _copy_ckpt(ckpt_dir, tmp_path / "c", lambda sd: sd.__setitem__(key, torch.zeros(16, 32)))
    with pytest.raises(CheckpointError, match="unexpected keys") as e:
        load_pi05_checkpoint(d)
    assert key in str(e.value)


def test_shape_mismatch(ckpt_dir, tmp_path):
    key = f"{EXP}layers.0.mlp.up_proj.weight"
    d = _copy_ckpt(ckpt_dir, tmp_path / "c", lambda sd: sd.__setitem__(key, torch.zeros(33, 16)))
    with pytest.raises(CheckpointError, match="shape mismatches") as e:
        load_pi05_checkpoint(d)
    assert key in str(e.value) and "(33, 16)" in str(e.value) and "(32, 16)" in str(e.value)


def test_missing_files(ckpt_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        load_pi05_checkpoint(tmp_path / "nope")
    d = _copy_ckpt(ckpt_dir, tmp_path / "c")
    (d / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_pi05_checkpoint(d)
    (d / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_pi05_checkpoint(d)
    with pytest.raises(FileNotFoundError, match="missing.model"):
        Pi05Adapter.from_files(ckpt_dir, tmp_path / "missing.model", ckpt_dir / "norm_stats.json")
    if TOKENIZER.is_file():
        with pytest.raises(FileNotFoundError, match="stats.json"):
            Pi05Adapter.from_files(ckpt_dir, TOKENIZER, tmp_path / "stats.json")


@needs_tokenizer
def test_camera_names_must_be_known(ckpt_dir):
    with pytest.raises(ValueError, match="camera_names"):
        Pi05Adapter.from_files(ckpt_dir, TOKENIZER, ckpt_dir / "norm_stats.json", camera_names=["top_rgb"])
    p = Pi05Adapter.from_files(ckpt_dir, TOKENIZER, ckpt_dir / "norm_stats.json",
                              camera_names=["observation.images.base_0_rgb"])
    assert p.camera_names == list(CAMS)


def test_read_only_and_flipped_images_accepted(policy):
    images, state = obs()
    ro = np.frombuffer(images["base_0_rgb"].tobytes(), np.uint8).reshape(images["base_0_rgb"].shape)
    bgr = images["left_wrist_0_rgb"][..., ::-1]
    a = policy.predict({"base_0_rgb": ro, "left_wrist_0_rgb": bgr[..., ::-1]}, state, "t", noise=torch.zeros(10, 32))
    b = policy.predict(images, state, "t", noise=torch.zeros(10, 32))
    assert np.array_equal(a, b)


def test_make_random_model_matches_checkpoint(tmp_path):
    from phyai_ros.models.pi.pi05 import make_random_model
    make_random_checkpoint(tmp_path, TINY, seed=5, std=0.05)
    a = load_pi05_checkpoint(tmp_path).model
    b = make_random_model(TINY, seed=5, std=0.05)
    assert all(torch.equal(x, y) for x, y in zip(a.buffers(), b.buffers()))
