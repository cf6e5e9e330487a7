"""MiniCPM-Robot on CUDA: set A parity in fp32 (eager and through the captured runner), bf16 VLM against fp32,
graph replay on new observations, batches, native RTC through the graph, padded prompt buckets, and the GPU
resize against PIL's. Skipped without CUDA (run on the device: scripts/test.sh -m gpu -k minicpm)."""

import numpy as np
import pytest
import torch
from PIL import Image

from fixture_sets import minicpm_fixture_dir
from phyai_ros import predict
from phyai_ros.control.rtc import make_request
from phyai_ros.models.minicpm.adapter import MiniCpmAdapter
from phyai_ros.models.minicpm.processor import resize_float, resize_pil

SET = minicpm_fixture_dir()
if torch.cuda.is_available():   # fp32 is IEEE fp32 here, as predict --dtype float32 sets it
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
TOL = 1e-4
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(not (SET / "expected.safetensors").is_file(), reason=f"no parity set at {SET}")]


def raw_frames(meta):
    facts = next(c for c in meta["cases"] if c["name"] == "a0_e2e")
    cams = sorted(facts["cams"], key=lambda c: (c["item"], c["cam"]))
    return [np.asarray(Image.open(SET / c["file"]).convert("RGB")) for c in cams], facts


def prepared(policy, meta, inp, batch=1):
    frames, facts = raw_frames(meta)
    state = inp["a0_e2e.state"][:, 0].numpy().repeat(batch, 0)
    return policy.prepare(frames * batch, state, [facts["items"][0]["instruction"]] * batch,
                          facts["embodiment_id"] * batch)


@pytest.mark.parametrize("case", ["a0_e2e", "a1_head_only"])
def test_predict_cuda_fp32(case, tmp_path, capsys):
    out = tmp_path / "o.safetensors"
    rc = predict.main(["--checkpoint", str(SET), "--inputs", str(SET / "inputs.safetensors"), "--tasks-json",
                       str(SET / "config.json"), "--expected", str(SET / "expected.safetensors"), "--case", case,
                       "--device", "cuda", "--output", str(out), "--tolerance", str(TOL)])
    assert rc == 0, capsys.readouterr().out


def test_graphs_fp32_match_the_set(meta, inp, exp):
    """The captured runner (backbone, context and the whole 4-step loop as graphs), fp32 with the PIL resize:
    set A within 1e-4; a second observation replays the same graphs and matches its eager run."""
    policy = MiniCpmAdapter.load(SET, device="cuda", options={"resize": "pil"})
    policy.use_runner(use_graphs=True)
    x = prepared(policy, meta, inp)
    actions = policy.sample_actions(x, inp["a0_e2e.noise"]).clone()
    assert (actions.cpu() - exp["a0_e2e.actions"]).abs().max().item() <= TOL
    assert len(policy.runner.buckets()) == 1
    other = policy.prepare([f[::-1].copy() for f in raw_frames(meta)[0]], inp["a0_e2e.state"][:, 0].numpy() + 0.3,
                           ["Task: open the drawer."], [0])
    replayed = policy.sample_actions(other, inp["a0_e2e.noise"]).clone()
    _, eager = policy.run_eager(other, inp["a0_e2e.noise"])
    assert (replayed - eager).abs().max().item() <= 1e-5
    assert (replayed - actions).abs().max().item() > 1e-3     # a new observation, not the last one's result


def test_bf16_vlm_fp32_head_close_to_fp32(meta, inp, exp):
    policy = MiniCpmAdapter.load(SET, device="cuda", dtype=torch.bfloat16)
    policy.use_runner(use_graphs=True)
    assert policy.head_dtype == torch.float32
    actions = policy.sample_actions(prepared(policy, meta, inp), inp["a0_e2e.noise"]).cpu()
    err = (actions - exp["a0_e2e.actions"]).abs().max().item()
    assert err < 0.1 * exp["a0_e2e.actions"].abs().max().item(), err
    bf16 = MiniCpmAdapter.load(SET, device="cuda", dtype=torch.bfloat16, options={"head_dtype": "bfloat16"})
    bf16.use_runner(use_graphs=True)
    actions16 = bf16.sample_actions(prepared(bf16, meta, inp), inp["a0_e2e.noise"]).cpu()
    assert torch.isfinite(actions16).all()
    assert (actions16 - exp["a0_e2e.actions"]).abs().max().item() < 0.2 * exp["a0_e2e.actions"].abs().max().item()


def test_batch_rows_are_what_each_item_computes(meta, inp):
    policy = MiniCpmAdapter.load(SET, device="cuda", options={"resize": "pil"})
    policy.use_runner(use_graphs=True)
    frames, facts = raw_frames(meta)
    state = np.stack([inp["a0_e2e.state"][0, 0].numpy(), inp["a0_e2e.state"][0, 0].numpy() - 0.4])
    noise = torch.randn(2, 5, 6, generator=torch.Generator().manual_seed(3))
    both = policy.sample_actions(policy.prepare(frames + frames[::-1], state, ["Task: a.", "Task: b."], [2, 0]),
                                 noise).clone()
    one = policy.sample_actions(policy.prepare(frames, state[:1], ["Task: a."], [2]), noise[:1]).clone()
    two = policy.sample_actions(policy.prepare(frames[::-1], state[1:], ["Task: b."], [0]), noise[1:]).clone()
    assert (both[0] - one[0]).abs().max().item() <= 1e-4
    assert (both[1] - two[0]).abs().max().item() <= 1e-4


def test_native_rtc_freezes_the_prefix_under_graphs(meta, inp):
    policy = MiniCpmAdapter.load(SET, camera_names=["base", "wrist"], device="cuda")
    policy.use_runner(use_graphs=True)
    frames, facts = raw_frames(meta)
    images = {"base": frames[0], "wrist": frames[1]}
    state = inp["a0_e2e.state"][0, 0].numpy()
    prev = np.linspace(-0.5, 0.5, 4 * 6, dtype=np.float32).reshape(4, 6)
    chunk = policy.predict(images, state, "open it", noise=torch.Generator().manual_seed(0),
                           rtc=make_request(prev, 2, mode="native", schedule="exp", horizon=5))
    assert np.array_equal(chunk[:2], prev[:2])
    assert not np.allclose(chunk[2:4], prev[2:4])
    free = policy.predict(images, state, "open it", noise=torch.Generator().manual_seed(0))
    assert not np.allclose(free[:2], prev[:2])


def test_padded_prompt_bucket_matches_the_unpadded_prompt(meta, inp):
    """token_bucket: the prompt left-padded to a bucket computes the unpadded chunk (zeroed GDN rows, masked keys,
    relative RoPE), up to rounding."""
    policy = MiniCpmAdapter.load(SET, device="cuda", options={"resize": "pil"})
    policy.use_runner(use_graphs=True)
    x = prepared(policy, meta, inp)
    plain = policy.sample_actions(x, inp["a0_e2e.noise"]).clone()
    frames, facts = raw_frames(meta)
    padded = policy.prepare(frames, inp["a0_e2e.state"][:, 0].numpy(), [facts["items"][0]["instruction"]],
                            facts["embodiment_id"], pad_to=x.input_ids.shape[1] + 27)
    assert padded.input_ids.shape[1] == x.input_ids.shape[1] + 27
    assert (policy.sample_actions(padded, inp["a0_e2e.noise"]) - plain).abs().max().item() <= 1e-4


def test_gpu_resize_within_one_level_of_pil(meta):
    frames, _ = raw_frames(meta)
    policy = MiniCpmAdapter.load(SET)
    for f in frames:
        pil = torch.from_numpy(resize_pil(f, policy.settings))
        gpu = resize_float(torch.from_numpy(f)[None].cuda(), (448, 448))[0].cpu()
        diff = (pil.int() - gpu.int()).abs()
        assert diff.max().item() <= (0 if f.shape[:2] == (448, 448) else 2), diff.max().item()
        assert diff.float().mean().item() < 0.5
