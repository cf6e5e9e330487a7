"""GR00T N1.7 parity against LeRobot 0.6.1 fixtures (shared/fixtures/lerobot_parity/groot_n17, README there).

CPU, float32. Integer / bool data (tokens, masks, grids, positions, timesteps) and images must match exactly;
floats within 1e-4 max-abs (the fixture README: LeRobot itself moves by ~1e-5 across CPU builds).
"""
import shutil
from pathlib import Path

import pytest
import torch

from fixture_sets import groot_fixture_dir, load_groot_fixture

GROOT = groot_fixture_dir()
TOL = 1e-4
pytestmark = pytest.mark.skipif(not (GROOT / "expected.safetensors").is_file(),
                                reason=f"GR00T N1.7 parity fixtures not found at {GROOT}")


def maxabs(a, b):
    return (a.detach().float().cpu() - b.float()).abs().max().item()


@pytest.fixture(scope="module")
def fx():
    return load_groot_fixture(GROOT)


def load(name="checkpoint", **kw):
    from phyai_ros.models.groot_n17 import GrootAdapter
    return GrootAdapter.from_files(GROOT / name, **kw)


@pytest.fixture(scope="module")
def policy():
    return load()


@pytest.fixture(scope="module")
def plain(policy, fx):
    """The plain case: inputs, actions and every traced intermediate."""
    ids = fx["inp"]["embodiment_id"].tolist()
    inputs = policy.prepare(fx["images"], fx["inp"]["raw.observation.state"], fx["meta"]["tasks"], ids)
    trace = {}
    actions = policy.sample_actions(inputs, fx["inp"]["noise"], trace=trace)
    return inputs, actions, trace


@pytest.fixture(scope="module")
def relative(fx):
    pol = load("checkpoint_relative")
    inputs = pol.prepare(fx["images"], fx["inp"]["raw.observation.state"], fx["meta"]["tasks"])
    return pol, inputs, pol.sample_actions(inputs, fx["inp"]["noise"])


# ------------------------------------------------------------------ preprocessing (exact)
def test_tokens_masks_grid_state_exact(plain, fx):
    inputs, exp, case = plain[0], fx["exp"], fx["meta"]["cases"]["plain"]
    assert inputs.cameras == [c.split(".")[-1] for c in case["camera_order"]]
    assert inputs.prompts == case["prompts"]
    assert inputs.input_ids.tolist() == case["input_ids"]
    for ours, key in ((inputs.input_ids, "pre.input_ids"), (inputs.attention_mask, "pre.attention_mask"),
                      (inputs.image_grid_thw, "pre.image_grid_thw"), (inputs.vlm_images, "pre.vlm_images")):
        assert torch.equal(ours.cpu(), exp[key]), key
    assert maxabs(inputs.pixel_values, exp["pre.pixel_values"]) <= 1e-6
    assert maxabs(inputs.state, exp["pre.state"]) <= 1e-6
    assert inputs.embodiment_id.tolist() == case["embodiment_id_used"]


def test_relative_preprocessing_exact(relative, fx):
    pol, inputs, _ = relative
    exp, case = fx["exp"], fx["meta"]["cases"]["relative"]
    assert inputs.cameras == ["wrist", "front"]       # the pack step's video_modality_keys, not sorted
    for ours, key in ((inputs.input_ids, "relative.pre.input_ids"),
                      (inputs.attention_mask, "relative.pre.attention_mask"),
                      (inputs.image_grid_thw, "relative.pre.image_grid_thw"),
                      (inputs.vlm_images, "relative.pre.vlm_images")):
        assert torch.equal(ours.cpu(), exp[key]), key
    assert maxabs(inputs.state, exp["relative.pre.state"]) <= 1e-6
    assert inputs.embodiment_id.tolist() == case["embodiment_id_used"] == exp["relative.pre.embodiment_id"].tolist()
    assert pol.chunk_size == 12


def test_float_resize_frames_exact(fx):
    pol = load(resize_mode="float")
    inputs = pol.prepare(fx["images"], fx["inp"]["raw.observation.state"], fx["meta"]["tasks"])
    assert torch.equal(inputs.vlm_images, fx["exp"]["float_resize.pre.vlm_images"])
    assert not torch.equal(inputs.vlm_images, fx["exp"]["pre.vlm_images"])


# ------------------------------------------------------------------ intermediates
BACKBONE = ("visual_patch_embed", "visual_pos_embeds", "visual_block_out.0", "visual_block_out.1",
            "visual_deepstack.0", "visual_merged", "inputs_embeds", "layer_out.0", "features")


@pytest.mark.parametrize("key", BACKBONE)
def test_backbone_intermediates(plain, fx, key):
    assert maxabs(plain[2][key], fx["exp"]["backbone." + key]) <= TOL


def test_mrope_positions_exact(plain, fx):
    exp = fx["exp"]["backbone.position_ids"]
    assert torch.equal(plain[2]["position_ids"], exp[1:])   # LeRobot's row 0 only repeats row 1


@pytest.mark.parametrize("key", ["vlln", "vl_self_attention", "state_features"])
def test_head_intermediates(plain, fx, key):
    assert maxabs(plain[2][key], fx["exp"]["head." + key]) <= TOL


@pytest.mark.parametrize("key", ["x_t", "action_features", "sa_embs", "temb", "dit_out", "v"])
def test_denoise_steps(plain, fx, key):
    assert maxabs(torch.stack(plain[2][key]), fx["exp"]["denoise." + key]) <= TOL


def test_timestep_buckets_exact(plain, fx):
    assert torch.equal(torch.stack(plain[2]["timestep"]), fx["exp"]["denoise.timestep"])


# ------------------------------------------------------------------ actions, every case
def test_plain_actions(policy, plain, fx):
    inputs, actions, _ = plain
    exp = fx["exp"]
    assert maxabs(actions, exp["actions.model"]) <= TOL
    assert maxabs(policy.policy_actions(actions), exp["actions.policy_normalized"]) <= TOL
    assert maxabs(policy.decode(actions, inputs), exp["actions.unnormalized"]) <= TOL


def test_native_rtc_actions(policy, plain, fx):
    from phyai_ros.models.groot_n17 import GrootRtc
    from phyai_ros.models.groot_n17.action_head import native_rtc, rtc_weights
    inputs, exp, case = plain[0], fx["exp"], fx["meta"]["cases"]["rtc"]
    prev = fx["inp"]["rtc.prev_chunk_left_over"]
    rtc = native_rtc(prev, case["inference_delay"], case["execution_horizon"], policy.config.head, 2)
    assert maxabs(rtc.prefix, exp["rtc.prefix_actions"]) == 0
    assert maxabs(rtc_weights(rtc, policy.config.head, prev).expand(2, -1, 14), exp["rtc.vel_strength"]) <= 1e-6
    trace = {}
    actions = policy.sample_actions(inputs, fx["inp"]["noise"],
                                    GrootRtc(prev, case["inference_delay"], case["execution_horizon"]), trace)
    assert maxabs(torch.stack(trace["x_t"]), exp["rtc.denoise.x_t"]) <= TOL
    assert maxabs(torch.stack(trace["v"]), exp["rtc.denoise.v"]) <= TOL
    assert maxabs(actions, exp["rtc.actions.model"]) <= TOL
    assert maxabs(policy.decode(actions, inputs), exp["rtc.actions.unnormalized"]) <= TOL


def test_relative_actions(relative, fx):
    pol, inputs, actions = relative
    exp = fx["exp"]
    assert maxabs(actions, exp["relative.actions.model"]) <= TOL
    assert maxabs(pol.policy_actions(actions), exp["relative.actions.policy_normalized"]) <= TOL
    assert maxabs(pol.decode(actions, inputs), exp["relative.actions.unnormalized"]) <= TOL
    with pytest.raises(ValueError, match="relative-action"):
        from phyai_ros.models.groot_n17 import GrootRtc
        pol.sample_actions(inputs, fx["inp"]["noise"], GrootRtc(fx["inp"]["rtc.prev_chunk_left_over"], 3, 8))


def test_float_resize_actions(fx):
    pol = load(resize_mode="float")
    inputs = pol.prepare(fx["images"], fx["inp"]["raw.observation.state"], fx["meta"]["tasks"],
                         fx["inp"]["embodiment_id"].tolist())
    trace = {}
    actions = pol.sample_actions(inputs, fx["inp"]["noise"], trace=trace)
    exp = fx["exp"]
    assert maxabs(trace["features"], exp["float_resize.backbone.features"]) <= TOL
    assert maxabs(actions, exp["float_resize.actions.model"]) <= TOL
    assert maxabs(pol.decode(actions, inputs), exp["float_resize.actions.unnormalized"]) <= TOL


def test_predict_batch1_api(policy, fx):
    """The node-facing call: one observation in robot units -> [chunk, action_dim] in robot units."""
    images = {k: v[1].numpy() for k, v in fx["images"].items()}
    out = policy.predict(images, fx["inp"]["raw.observation.state"][1].numpy(), fx["meta"]["tasks"][1],
                         noise=fx["inp"]["noise"][1])
    assert out.shape == (16, 12) and out.dtype.name == "float32"
    with pytest.raises(ValueError, match="camera 'wrist'"):
        policy.predict({"front": images["front"]}, fx["inp"]["raw.observation.state"][1].numpy(), "x")


def test_auto_resize_follows_the_policys_device_not_the_frames(policy):
    """Frames arrive on the CPU whatever the device: 'auto' is the uint8 kernel for a CPU policy (the fixtures'
    CPU path, bit-exact above) and the float path for a CUDA one (LeRobot's processor on CUDA)."""
    from phyai_ros.models.groot_n17.processor import resolve_resize_mode
    assert policy.resize_mode == "uint8"
    assert [resolve_resize_mode("auto", d) for d in ("cpu", "cuda", "cuda:1")] == ["uint8", "float", "float"]
    assert resolve_resize_mode("float", "cpu") == "float" and resolve_resize_mode("uint8", "cuda") == "uint8"
    with pytest.raises(ValueError, match="resize_mode 'bilinear'"):
        resolve_resize_mode("bilinear", "cpu")


def test_fixture_helpers_import_without_rosbags():
    """The GPU machines have no rosbags: the fixture helpers (and phyai_ros.testing, which re-exports them) must
    import there; the replay tools load when first used."""
    import subprocess
    import sys
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'rosbags':\n"
            "            raise ImportError('rosbags blocked')\n"
            "sys.meta_path.insert(0, Block())\n"
            "import phyai_ros.testing, phyai_ros.fixtures\n"
            "assert phyai_ros.testing.fixtures_dir() == phyai_ros.fixtures.fixtures_dir()\n"
            "assert 'rosbags' not in sys.modules\n")
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo)
    assert out.returncode == 0, out.stderr


# ------------------------------------------------------------------ loading errors
def _copy_checkpoint(tmp_path, edit):
    from safetensors.torch import load_file, save_file
    dst = tmp_path / "ckpt"
    shutil.copytree(GROOT / "checkpoint", dst)
    sd = load_file(str(dst / "model.safetensors"))
    edit(sd)
    save_file(sd, str(dst / "model.safetensors"))
    return dst


def test_checkpoint_key_errors_listed_at_once(tmp_path):
    from phyai_ros.models.groot_n17 import CheckpointError, load_groot_checkpoint
    vlln = "_groot_model.action_head.vlln.weight"
    pos = "_groot_model.action_head.position_embedding.weight"

    def edit(sd):
        sd["_groot_model.action_head.extra.weight"] = sd.pop(vlln)
        sd[pos] = sd[pos][:8]
    dst = _copy_checkpoint(tmp_path, edit)
    with pytest.raises(CheckpointError) as err:
        load_groot_checkpoint(dst, base_model=str(GROOT / "base_model"), backbone=str(GROOT / "backbone"))
    msg = str(err.value)
    assert str(dst / "model.safetensors") in msg
    assert "missing keys (1)" in msg and "action_head.vlln.weight" in msg
    assert "unexpected keys (1)" in msg and "action_head.extra.weight" in msg
    assert "shape mismatches (1)" in msg and "(8, 32)" in msg and "(32, 32)" in msg


def test_missing_base_model_folder_is_named(tmp_path):
    from phyai_ros.models.groot_n17 import load_groot_checkpoint
    dst = _copy_checkpoint(tmp_path, lambda sd: None)
    with pytest.raises(FileNotFoundError, match="base_model_path './base_model'"):
        load_groot_checkpoint(dst)


# ------------------------------------------------------------------ offline CLI
@pytest.mark.parametrize("ckpt,case", [("checkpoint", "plain"), ("checkpoint", "rtc"),
                                       ("checkpoint_relative", "relative"), ("checkpoint", "float_resize")])
def test_predict_cli_cases(tmp_path, capsys, ckpt, case):
    from phyai_ros.predict import main
    rc = main(["--checkpoint", str(GROOT / ckpt), "--inputs", str(GROOT / "inputs.safetensors"),
               "--tasks-json", str(GROOT / "inputs.json"), "--expected", str(GROOT / "expected.safetensors"),
               "--case", case, "--output", str(tmp_path / "out.safetensors"), "--tolerance", str(TOL)])
    out = capsys.readouterr().out
    key = "actions.unnormalized" if case == "plain" else f"{case}.actions.unnormalized"
    assert rc == 0, out
    assert f"max-abs actions vs {key}: " in out


def test_language_model_norms_ride_on_the_residual_adds(policy):
    """The decoder layers hand the next layer its input norm from the residual add (add_rms_norm with Qwen's
    plain weight) except where a DeepStack merge comes between: the fixture keeps two layers with a merge after
    the first, so that path is checked here against the plain per-op order (add, then norm) on the fixture's
    weights, with and without a merge, with a left-pad row."""
    from phyai_ros.layers import ops
    from phyai_ros.models.groot_n17 import qwen3vl as q
    t = policy.model.config.text
    g = torch.Generator().manual_seed(0)
    # every norm its own weights (a checkpoint's may all be ones), so a norm taken from the wrong layer shows
    w = {k: (1 + 0.5 * torch.randn(v.shape, generator=g)).to(v.dtype) if k.endswith("layernorm.weight") else v
         for k, v in policy.model.weights.items()}
    b, length = 2, 7
    embeds = torch.randn(b, length, t.width, generator=g)
    valid = torch.ones(b, length, dtype=torch.long)
    valid[1, :2] = 0
    positions = torch.arange(length).expand(3, b, length)
    cos, sin = q.mrope_cos_sin(t, positions)
    image_index = torch.tensor([3, 4, length + 5])
    deep = [torch.randn(3, t.width, generator=g)]

    def reference(tc, deepstack):
        mask = q.additive_mask(q.causal_padding_mask(valid)[:, 0], embeds.dtype)
        qv = valid.bool()[..., None].to(embeds.dtype)
        x = embeds
        for i in range(tc.depth):
            p = f"{q.LLM}layers.{i}."
            a = q.text_attention(ops.rms_norm(x, w[p + "input_layernorm.weight"], t.rms_eps, 0.0), w,
                                 p + "self_attn.", tc, cos, sin, mask)
            x = x + a * qv
            gate, up = q.linear(ops.rms_norm(x, w[p + "post_attention_layernorm.weight"], t.rms_eps, 0.0), w,
                                p + "mlp.gate_up_proj").chunk(2, dim=-1)
            x = x + q.linear(torch.nn.functional.silu(gate) * up, w, p + "mlp.down_proj")
            if i < len(deepstack) and i < tc.depth - 1:
                x = x.reshape(-1, x.shape[-1]).index_add(0, image_index, deepstack[i]).view_as(x)
        return x

    for deepstack in (deep, []):      # with the fixture's merge after layer 0, and without (layer 1's norm fused)
        got = q.language_model(w, t, embeds, cos, sin, valid, image_index, deepstack)
        torch.testing.assert_close(got, reference(t, deepstack), rtol=1e-5, atol=1e-5)
    assert t.depth == 2
