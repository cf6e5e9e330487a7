"""Cosmos3: what is read from outside is checked (checkpoint folder files, the request, settings, noise), the
full-size configuration and its parameter count, the tokenizer's byte-level split, and the benchmark's CPU path.
No fixtures needed: a tiny random checkpoint is written here."""
import dataclasses
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from phyai_ros.models.files import CheckpointError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from phyai_ros.models.cosmos3 import TransformerConfig, VaeConfig, write_random_checkpoint
    t = TransformerConfig(hidden_size=32, head_dim=16, num_heads=4, num_kv_heads=2, intermediate_size=64,
                          num_layers=1, rope_axes_dim=(4, 2, 2), action_dim=12, vocab_size=272)
    v = VaeConfig(base_dim=8, dim_mult=(1, 1, 1, 1), num_res_blocks=1)
    return write_random_checkpoint(tmp_path_factory.mktemp("cosmos3_in") / "pipeline", t, v, std=0.2)


def settings(**kw):
    from phyai_ros.models.cosmos3 import Cosmos3Settings
    base = dict(num_steps=2, guidance=2.0, chunk_size=4, resolution_tier=256, domain="bridge_orig_lerobot")
    return Cosmos3Settings(**{**base, **kw})


@pytest.fixture(scope="module")
def pol(ckpt):
    from phyai_ros.models.cosmos3 import Cosmos3Adapter
    return Cosmos3Adapter.from_files(ckpt, settings=settings())


def copy(ckpt, tmp_path) -> Path:
    dst = tmp_path / "pipeline"
    shutil.copytree(ckpt, dst)
    return dst


def edit_json(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


IMAGE = np.random.default_rng(0).integers(0, 256, (64, 96, 3), dtype=np.uint8)


# ------------------------------------------------------------------ checkpoint files
@pytest.mark.parametrize("edit,match", [
    (lambda d: d["model_index.json"].write_text("{not json"), "not valid JSON"),
    (lambda d: edit_json(d["model_index.json"], lambda j: j.update(_class_name="FluxPipeline")), "Cosmos3OmniPipeline"),
    (lambda d: edit_json(d["transformer/config.json"], lambda j: j.update(action_gen=False)), "no action head"),
    (lambda d: edit_json(d["transformer/config.json"], lambda j: j.update(num_key_value_heads=3)), "KV heads"),
    (lambda d: edit_json(d["transformer/config.json"], lambda j: j.update(hidden_size="32")), "hidden_size"),
    (lambda d: edit_json(d["transformer/config.json"], lambda j: j.update(rope_axes_dim=[4, 2])), "rope_axes_dim"),
    (lambda d: edit_json(d["vae/config.json"], lambda j: j.update(is_residual=False)), "non-residual"),
    (lambda d: edit_json(d["vae/config.json"], lambda j: j.update(z_dim=16, latents_mean=[0.0] * 16,
                                                                  latents_std=[1.0] * 16)), "z_dim"),
    (lambda d: edit_json(d["scheduler/scheduler_config.json"], lambda j: j.update(prediction_type="epsilon")),
     "flow_prediction"),
    (lambda d: edit_json(d["scheduler/scheduler_config.json"], lambda j: j.update(use_karras_sigmas=True)),
     "use_karras_sigmas"),
    (lambda d: edit_json(d["scheduler/scheduler_config.json"], lambda j: j.update(_class_name="DDIMScheduler")),
     "only UniPCMultistepScheduler"),
    (lambda d: d["transformer/diffusion_pytorch_model.safetensors"].write_bytes(b"\x00" * 10), "unreadable"),
    (lambda d: d["vae/diffusion_pytorch_model.safetensors"].unlink(), "file not found"),
])
def test_bad_checkpoint_files_name_themselves(ckpt, tmp_path, edit, match):
    from phyai_ros.models.cosmos3 import load_cosmos3_checkpoint
    folder = copy(ckpt, tmp_path)
    files = {str(p.relative_to(folder)): p for p in folder.rglob("*") if p.is_file()}
    edit(files)
    with pytest.raises((CheckpointError, FileNotFoundError), match=match):
        load_cosmos3_checkpoint(folder)


def test_weight_keys_shapes_and_values_are_checked(ckpt, tmp_path):
    from safetensors.torch import load_file, save_file

    from phyai_ros.models.cosmos3 import load_cosmos3_checkpoint
    from phyai_ros.models.cosmos3.checkpoint import load_transformer_weights
    folder = copy(ckpt, tmp_path)
    path = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    good = load_file(str(path))
    bad = dict(good)
    bad.pop("proj_in.bias")
    bad["layers.0.mlp.down_proj.weight"] = torch.zeros(3, 3)
    bad["extra.weight"] = torch.zeros(1)
    save_file(bad, str(path))
    with pytest.raises(CheckpointError) as err:
        load_cosmos3_checkpoint(folder)
    msg = str(err.value)
    assert "proj_in.bias" in msg and "down_proj" in msg and "extra.weight" in msg
    nan = dict(good)
    nan["proj_out.weight"] = torch.full_like(good["proj_out.weight"], float("nan"))
    save_file(nan, str(path))
    with pytest.raises(CheckpointError, match="proj_out"):
        load_transformer_weights(load_cosmos3_checkpoint(folder), torch.float32, "cpu")


def test_sharded_weights_load_like_one_file(ckpt, tmp_path, pol):
    from safetensors.torch import load_file, save_file

    from phyai_ros.models.cosmos3 import Cosmos3Adapter
    folder = copy(ckpt, tmp_path)
    t = folder / "transformer"
    sd = load_file(str(t / "diffusion_pytorch_model.safetensors"))
    keys = sorted(sd)
    parts = {"a.safetensors": keys[::2], "b.safetensors": keys[1::2]}
    for name, ks in parts.items():
        save_file({k: sd[k] for k in ks}, str(t / name))
    (t / "diffusion_pytorch_model.safetensors").unlink()
    (t / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: n for n, ks in parts.items() for k in ks}}))
    other = Cosmos3Adapter.from_files(folder, settings=settings())
    for k, v in pol.transformer_weights.items():
        assert torch.equal(v, other.transformer_weights[k]), k
    (t / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "../x"}}))
    with pytest.raises(CheckpointError, match="shard file names"):
        Cosmos3Adapter.from_files(folder, settings=settings())


def test_files_linked_out_of_the_folder_are_refused(ckpt, tmp_path):
    """A shard or a component folder that is a symlink leaving the pipeline folder is refused (models.files.inside)
    like a '../' name, so a checkpoint cannot read files elsewhere."""
    from phyai_ros.models.cosmos3 import load_cosmos3_checkpoint
    folder = copy(ckpt, tmp_path)
    t = folder / "transformer"
    outside = tmp_path / "outside.safetensors"
    (t / "diffusion_pytorch_model.safetensors").rename(outside)
    (t / "a.safetensors").symlink_to(outside)
    (t / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "a.safetensors"}}))
    with pytest.raises(CheckpointError, match="shard file names.*not inside"):
        load_cosmos3_checkpoint(folder)
    shutil.move(str(folder / "vae"), str(tmp_path / "vae_elsewhere"))
    (folder / "vae").symlink_to(tmp_path / "vae_elsewhere")
    with pytest.raises(CheckpointError, match="component folder 'vae' is not inside"):
        load_cosmos3_checkpoint(folder)


# ------------------------------------------------------------------ request, settings, noise
@pytest.mark.parametrize("images,task,match", [
    ({"image": IMAGE.astype(np.float32)}, "go", "uint8"),
    ({"image": IMAGE[..., :2]}, "go", r"\[H, W, 3\]"),
    ({"image": IMAGE[:8]}, "go", "16.."),
    ({"front": IMAGE}, "go", "missing camera"),
    ({"image": IMAGE}, 42, "tasks must be text"),
    ({"image": IMAGE}, "x" * 5000, "max_prompt_tokens"),
    ({"image": np.stack([IMAGE, IMAGE])}, ["one"], "2 tasks|1 tasks"),
])
def test_bad_requests(pol, images, task, match):
    with pytest.raises(ValueError, match=match):
        pol.prepare(images, task)


def test_batch_needs_one_canvas(pol):
    with pytest.raises(ValueError, match="batch items need one canvas"):
        pol.prepare({"image": [IMAGE, np.zeros((96, 96, 3), np.uint8)]}, ["a", "b"])


@pytest.mark.parametrize("kw,match", [
    (dict(num_steps=0), "num_steps"), (dict(guidance=float("nan")), "guidance"), (dict(chunk_size=0), "chunk_size"),
    (dict(fps=-1.0), "fps"), (dict(negative_prompt=3), "negative_prompt"),
])
def test_bad_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        settings(**kw)


@pytest.mark.parametrize("kw,match", [
    (dict(domain="no_action"), "no fixed action width"), (dict(domain="mars_rover"), "unknown embodiment"),
    (dict(domain="hand_pose"), "does not fit"), (dict(view_point="drone_view"), "view point"),
    (dict(resolution_tier=333), "resolution tier"),
])
def test_settings_the_checkpoint_refuses(ckpt, kw, match):
    from phyai_ros.models.cosmos3 import Cosmos3Adapter
    with pytest.raises(ValueError, match=match):
        Cosmos3Adapter.from_files(ckpt, settings=settings(**kw)).prepare({"image": IMAGE}, "go")


def test_a_bad_view_point_is_refused_wherever_settings_come_from(pol):
    """Options, a replaced setting and a fixture case (the case runner's use_settings) all refuse a view point
    the caption has no framing sentence for, rather than dropping it from the caption."""
    from phyai_ros.models.cases import InputError
    from phyai_ros.models.contract import PredictCase
    from phyai_ros.models.cosmos3 import Cosmos3Adapter
    with pytest.raises(ValueError, match="view point 'drone_view'"):
        Cosmos3Adapter.check_options({"view_point": "drone_view"})
    with pytest.raises(ValueError, match="view point 'drone_view'"):
        dataclasses.replace(pol.settings, view_point="drone_view")
    before = pol.settings
    entry = {"name": "c", "num_inference_steps": 2, "guidance_scale": 2.0, "chunk_size": 4, "fps": 24.0,
             "resolution_tier": 256, "view_point": "drone_view", "domain_name": "bridge_orig_lerobot",
             "negative_prompt": None}
    inputs = {"c.image_uint8": torch.from_numpy(IMAGE), "c.vision_noise": torch.zeros(1),
              "c.action_noise": torch.zeros(4, 12)}
    case = PredictCase(inputs, {}, torch.zeros(1, 0), ["go"], meta={"cases": [entry]}, case="c")
    with pytest.raises(InputError, match="view point 'drone_view'"):
        pol.case_runner(case, None)
    assert pol.settings is before


def test_bad_noise_and_rtc(pol):
    x = pol.prepare({"image": IMAGE}, "go")
    vis, act = pol.make_noise(x)
    with pytest.raises(ValueError, match="noise: expected"):
        pol.sample_actions(x, (vis[:, :, :1], act))
    with pytest.raises(ValueError, match="NaN"):
        pol.sample_actions(x, (vis, torch.full_like(act, float("inf"))))
    with pytest.raises(ValueError, match="real-time chunking"):
        pol.predict({"image": IMAGE}, None, "go", rtc=object())
    out = pol.predict({"image": IMAGE}, np.zeros(3), "go", noise=torch.Generator().manual_seed(1))
    assert out.shape == (4, 10) and np.isfinite(out).all()
    assert np.array_equal(out, pol.predict({"image": IMAGE}, None, "go", noise=torch.Generator().manual_seed(1)))


def test_fit_task_cuts_a_long_instruction(pol):
    assert pol.fit_task("go", None) == ("go", False)
    long = " ".join(["wipe the table"] * 600)
    kept, cut = pol.fit_task(long, None)
    assert cut and long.startswith(kept) and len(kept) < len(long)
    assert pol.prepare({"image": IMAGE}, kept).cond_ids           # fits now


def test_warm_up_eager_and_runner(pol):
    pol.capture_buckets({"image": IMAGE}, None, eager=True)
    pol.capture_buckets({"image": IMAGE}, None)
    assert len(pol.runner.buckets()) >= 1


def test_select_embodiment(ckpt):
    from phyai_ros.models.cosmos3 import Cosmos3Adapter
    p = Cosmos3Adapter.from_files(ckpt, settings=settings())
    p.select_embodiment("pusht")
    assert p.action_dim == 2 and p.predict({"image": IMAGE}, None, "go").shape == (4, 2)
    with pytest.raises(ValueError, match="unknown embodiment"):
        p.select_embodiment("submarine")


def test_duplicate_leading_timesteps_are_refused():
    from phyai_ros.models.cosmos3.unipc import UniPCConfig, unipc_plan
    with pytest.raises(ValueError, match="duplicate leading timesteps"):
        unipc_plan(UniPCConfig(flow_shift=20.0), 200)


# ------------------------------------------------------------------ sizes
def test_full_size_parameter_count():
    from phyai_ros.models.cosmos3 import transformer as tfm
    from phyai_ros.models.cosmos3 import vae
    from phyai_ros.models.cosmos3.config import (FULL_TRANSFORMER, FULL_VAE, transformer_parameter_count,
                                                 vae_encoder_parameter_count)
    c = FULL_TRANSFORMER
    assert (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (4096, 36, 32, 8, 128)
    n = transformer_parameter_count(c)
    assert n == sum(math.prod(s) for s in tfm.key_shapes(c).values())
    assert 14.5e9 < n < 15.5e9                       # the published ~15 B (15.165 B with the unused lm_head)
    assert vae_encoder_parameter_count(FULL_VAE) == sum(math.prod(s) for s in vae.key_shapes(FULL_VAE).values())


def test_random_weights_at_any_size_load(ckpt):
    from phyai_ros.models.cosmos3 import load_cosmos3_checkpoint
    from phyai_ros.models.cosmos3.checkpoint import random_transformer_state
    from phyai_ros.models.cosmos3.config import transformer_parameter_count
    c = load_cosmos3_checkpoint(ckpt).transformer
    state = random_transformer_state(c, lm_head=True)
    assert sum(t.numel() for t in state.values()) == transformer_parameter_count(c)
    assert sum(t.numel() for t in random_transformer_state(c, lm_head=False).values()) == \
        transformer_parameter_count(c, lm_head=False)


# ------------------------------------------------------------------ tokenizer
def test_gpt2_byte_level_split(tmp_path):
    from phyai_ros.models.cosmos3.checkpoint import write_byte_tokenizer
    from phyai_ros.models.bpe import ByteLevelBPE
    bpe = ByteLevelBPE(write_byte_tokenizer(tmp_path) / "tokenizer.json")
    text = "it's 12 o'clock!  Überall <|im_start|>x"
    assert bpe._pieces("it's 12 o'clock!  Über") == ["it", "'s", "Ġ12", "Ġo", "'", "clock", "!", "Ġ", "ĠÃľber"]
    assert bpe.encode(text) == [*text[:text.index("<")].encode(), 257, ord("x")]


# ------------------------------------------------------------------ benchmark script, CPU path
def test_bench_script_cpu_tiny(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(REPO / "scripts" / "bench_cosmos3.py"), "--device", "cpu", "--config", "tiny",
           "--iters", "1", "--batches", "2", "--batch-iters", "1", "--images", "64x96,32x32", "--tier", "256", "--chunk", "4",
           "--steps", "2", "--diffusers", "off", "--root", str(tmp_path / "root"), "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["finite"] and res["startup"]["finite"]
    big, small = res["per_image"]["64x96"], res["per_image"]["32x32"]
    assert big["tokens"]["rows"] == 2 and big["tokens"]["latent"] == [2, 4, 6]
    assert small["tokens"]["latent"] == [2, 2, 2] and small["tokens"]["canvas"] == [256, 256]
    for r in (big, small):
        assert r["batch1"]["median_ms"] > 0 and set(r["stages"]) == {"vae", "conditioning", "generation"}
    assert res["batching"]["2"]["Q_per_s"] > 0
    assert res["parameters"]["transformer"] > res["parameters"]["transformer_without_lm_head"] > 0
