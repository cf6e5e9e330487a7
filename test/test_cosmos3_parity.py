"""Cosmos3 policy parity against diffusers 0.42.1's Cosmos3OmniPipeline (shared/fixtures/cosmos3, README there).

CPU, float32. Integer data (token ids, timesteps), the caption text, the canvas bytes and the mRoPE positions
must match exactly; every float within 1e-4 max-abs (the fixtures' bound; measured here: <= 7e-6). Every case
of the set: no CFG (a0), CFG with an empty negative prompt and odd latent sides (a1), CFG with a negative
prompt (a2).
"""
import json

import pytest
import torch

from fixture_sets import cosmos3_fixture_dir

FIX = cosmos3_fixture_dir()
TOL = 1e-4
pytestmark = pytest.mark.skipif(not (FIX / "expected.safetensors").is_file(),
                                reason=f"Cosmos3 parity fixtures not found at {FIX}")
CASES = ["a0_bridge_g1", "a1_av_g3", "a2_pusht_g3_neg"]


def maxabs(a, b):
    return (a.detach().float().cpu() - b.detach().float().cpu()).abs().max().item()


@pytest.fixture(scope="module")
def fx():
    from safetensors.torch import load_file
    meta = json.loads((FIX / "inputs.json").read_text())
    return {"meta": meta, "cases": {c["name"]: c for c in meta["cases"]},
            "inp": load_file(str(FIX / "inputs.safetensors")), "exp": load_file(str(FIX / "expected.safetensors"))}


@pytest.fixture(scope="module")
def runs(fx):
    """Per case: (policy, prepared inputs, actions, trace) of one traced run from the fixture's noise."""
    from phyai_ros.models.cosmos3 import Cosmos3Adapter
    from phyai_ros.models.cosmos3.cases import case_inputs, case_settings
    out = {}
    for name in CASES:
        case = fx["cases"][name]
        pol = Cosmos3Adapter.from_files(FIX / "pipeline", settings=case_settings(case))
        image, noise = case_inputs(fx["inp"], name)
        x = pol.prepare({"image": image}, case["instruction"])
        trace = {}
        out[name] = (pol, x, pol.sample_actions(x, noise, trace), trace)
    return out


def test_set_covers_the_readme_cases(fx):
    assert sorted(fx["cases"]) == CASES


# ------------------------------------------------------------------ request (exact)
@pytest.mark.parametrize("name", CASES)
def test_canvas_caption_and_token_ids_exact(fx, runs, name):
    from phyai_ros.models.cosmos3.canvas import canvas_uint8
    case, exp, inp = fx["cases"][name], fx["exp"], fx["inp"]
    _, x, _, _ = runs[name]
    assert [x.canvas.height, x.canvas.width] == case["canvas_hw"]
    assert [x.canvas.latent_h, x.canvas.latent_w] == case["latent_content_hw"]
    assert x.layout.frames == case["latent_t"]
    assert torch.equal(canvas_uint8(x.frames), exp[f"{name}.vae_input_canvas_uint8"])
    assert torch.equal(x.frames[0], exp[f"{name}.vae_input_canvas_uint8"].permute(2, 0, 1).float() / 255 * 2 - 1)
    assert x.captions[0] == case["cond_text"]
    assert x.cond_ids[0] == case["cond_input_ids"] == inp[f"{name}.cond_input_ids"].tolist()
    if case["cfg_active"]:
        assert x.uncond_ids[0] == inp[f"{name}.uncond_input_ids"].tolist()
    assert x.domain_ids == [case["domain_id"]] and x.raw_dims == [case["raw_action_dim"]]


@pytest.mark.parametrize("name", CASES)
def test_position_ids_exact(fx, runs, name):
    from phyai_ros.models.cosmos3.layout import position_ids
    pol, x, _, _ = runs[name]
    for p, ids in (("cond", x.cond_ids[0]), ("uncond", x.uncond_ids[0])):
        key = f"{name}.{p}_position_ids"
        if key in fx["exp"]:
            pos = position_ids(pol.config, len(ids), x.layout, x.settings.fps, pol.vae_config.scale_factor_temporal)
            assert torch.equal(pos, fx["exp"][key]), key


@pytest.mark.parametrize("name", CASES)
def test_schedule_exact(fx, runs, name):
    pol = runs[name][0]
    assert pol.stages.timesteps.tolist() == fx["exp"][f"{name}.timesteps"].long().tolist()
    assert torch.equal(pol.stages.sigmas, fx["exp"][f"{name}.sigmas"])


# ------------------------------------------------------------------ conditioning
@pytest.mark.parametrize("name", CASES)
def test_vae_latent_of_full_canvas(fx, runs, name):
    from phyai_ros.models.cosmos3 import vae
    pol, x, _, trace = runs[name]
    clip = x.frames[:, :, None].expand(-1, -1, x.settings.chunk_size + 1, -1, -1)
    full = vae.normalized_latent(pol.vae_weights, pol.vae_config, clip)
    full_exp = fx["exp"][f"{name}.cond_latent_full"]
    assert maxabs(full, full_exp) <= TOL
    h, w = x.canvas.latent_h, x.canvas.latent_w        # the content's latent crop; frame 0 is the condition
    # the policy encodes frame 0 alone (the encoder is causal in time): the pipeline's latent frame 0
    assert trace["clean_latent"].shape[2] == 1
    assert maxabs(trace["clean_latent"], full_exp[:, :, :1, :h, :w]) <= TOL
    assert maxabs(trace["clean_latent"], fx["exp"][f"{name}.init_vision_latents"][:, :, :1]) <= TOL


def test_vae_is_causal_in_time(fx, runs):
    """Latent frame 0 of any clip (not only a repeated frame) is the latent of video frame 0 alone, and later
    frames do change later latent frames: what lets the policy encode one frame instead of the clip."""
    from phyai_ros.models.cosmos3 import vae
    pol = runs[CASES[0]][0]
    g = torch.Generator().manual_seed(3)
    clip = torch.rand(1, 3, 9, 64, 96, generator=g) * 2 - 1
    full = vae.encode(pol.vae_weights, pol.vae_config, clip)
    first = vae.encode(pol.vae_weights, pol.vae_config, clip[:, :, :1])
    assert first.shape[2] == 1 and full.shape[2] == 3
    assert maxabs(first, full[:, :, :1]) <= 1e-5
    changed = clip.clone()
    changed[:, :, 1:] = -changed[:, :, 1:]
    again = vae.encode(pol.vae_weights, pol.vae_config, changed)
    assert maxabs(again[:, :, :1], full[:, :, :1]) <= 1e-5 and maxabs(again[:, :, 1:], full[:, :, 1:]) > 1e-3


# ------------------------------------------------------------------ denoising
@pytest.mark.parametrize("name", CASES)
def test_per_step_latents_velocities_and_actions(fx, runs, name):
    exp, case = fx["exp"], fx["cases"][name]
    _, _, actions, trace = runs[name]
    e = lambda k: exp[f"{name}.{k}"]  # noqa: E731
    assert maxabs(trace["vision_latents"][0], e("init_vision_latents")) <= TOL
    assert maxabs(trace["action_latents"][0][0], e("init_action_latents")) <= TOL
    assert maxabs(torch.stack(trace["vision_latents"]), e("vision_latents_per_step")) <= TOL
    assert maxabs(torch.stack(trace["action_latents"])[:, 0], e("action_latents_per_step")) <= TOL
    passes = ("cond", "uncond") if case["cfg_active"] else ("cond",)
    assert ("uncond_action_velocity_raw" in trace) == case["cfg_active"]
    for p in passes:
        assert maxabs(torch.stack(trace[f"{p}_action_velocity_raw"])[:, 0], e(f"{p}_action_velocity_raw")) <= TOL
        assert maxabs(trace[f"{p}_vision_velocity_raw_step0"], e(f"{p}_vision_velocity_raw_step0")) <= TOL
    assert maxabs(trace["final_vision_latents"], e("final_vision_latents")) <= TOL
    assert actions.shape == (1, case["chunk_size"], case["raw_action_dim"])
    assert maxabs(actions[0], e("final_action")) <= TOL


def test_clean_frame_rides_through_unipc(fx, runs):
    """The conditioning frame is not re-imposed: it drifts by float rounding only (README gotcha 3)."""
    _, _, _, trace = runs["a1_av_g3"]
    lat = torch.stack(trace["vision_latents"])[:, :, :, 0]
    assert (lat - lat[:1]).abs().max().item() < 1e-5


@pytest.mark.parametrize("name", CASES)
def test_generator_noise_matches_the_pipeline_draw(fx, runs, name):
    """make_noise(seeded generator) draws the video noise (full latent shape) then the action noise, as the
    pipeline does: the fixture's noise from the case's seed."""
    pol, x, _, _ = runs[name]
    vis, act = pol.make_noise(x, torch.Generator().manual_seed(fx["cases"][name]["generator_seed"]))
    assert torch.equal(vis, fx["inp"][f"{name}.vision_noise"])
    assert torch.equal(act[0], fx["inp"][f"{name}.action_noise"])


def test_predict_returns_the_raw_width_chunk(fx, runs):
    pol, _, actions, _ = runs["a2_pusht_g3_neg"]
    name = "a2_pusht_g3_neg"
    from phyai_ros.models.cosmos3.cases import case_inputs
    image, noise = case_inputs(fx["inp"], name)
    out = pol.predict({"image": image.numpy()}, None, fx["cases"][name]["instruction"], noise=noise)
    assert out.shape == (4, 2) and out.dtype.name == "float32"
    assert maxabs(torch.from_numpy(out), fx["exp"][f"{name}.final_action"]) <= TOL


@pytest.mark.parametrize("case", CASES)
def test_predict_runs_each_case_with_the_other_families_flags(case, tmp_path, capsys):
    """``python -m phyai_ros.predict`` finds the family from the pipeline folder (model_index.json), runs the case's
    own settings and recorded noise, and prints its max-abs against ``<case>.final_action`` within the bound."""
    from phyai_ros.predict import main
    rc = main(["--checkpoint", str(FIX / "pipeline"), "--inputs", str(FIX / "inputs.safetensors"),
               "--tasks-json", str(FIX / "inputs.json"), "--expected", str(FIX / "expected.safetensors"),
               "--case", case, "--output", str(tmp_path / "out.safetensors"), "--tolerance", str(TOL)])
    out = capsys.readouterr().out
    assert rc == 0, out
    line = next(ln for ln in out.splitlines() if ln.startswith(f"max-abs actions vs {case}.final_action: "))
    assert float(line.rsplit(" ", 1)[1]) <= TOL and ", cosmos3)" in out
