"""The runner's captured loop computes what the solver's reference loop computes (CPU eager here, CUDA graphs on
the device); the adapters sample through it."""
import json
import os
from pathlib import Path

import pytest
import torch

from phyai_ros.models.pi.pi05 import Pi05Adapter
from phyai_ros.models.pi.runner import FlowRunner

FIXTURES = Path(os.environ.get("PHYAI_PARITY_FIXTURES") or
                Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "lerobot_parity")
PI05 = FIXTURES / "pi05"
IMG = "raw.observation.images."
pytestmark = pytest.mark.skipif(not (PI05 / "expected.safetensors").is_file(),
                                reason=f"LeRobot parity fixtures not found at {FIXTURES}")


def load(device="cpu", dtype=torch.float32):
    from safetensors.torch import load_file
    policy = Pi05Adapter.from_files(PI05 / "checkpoint", FIXTURES / "tokenizer" / "tokenizer.model",
                                   PI05 / "norm_stats.json", device=device, dtype=dtype)
    inp = load_file(str(PI05 / "inputs.safetensors"))
    exp = load_file(str(PI05 / "expected.safetensors"))
    tasks = json.loads((PI05 / "inputs.json").read_text())["tasks"]
    images = {k[len(IMG):]: v.numpy() for k, v in inp.items() if k.startswith(IMG)}
    prepared = policy.prepare(images, inp["raw.observation.state"].numpy(), tasks)
    return policy, prepared, inp, exp


def run_runner(policy, prepared, noise, rtc=None, use_graphs=False):
    cfg = policy.config
    runner = FlowRunner(policy.model, cfg.num_steps, cfg.chunk_size, cfg.max_action_dim, use_graphs=use_graphs)
    bucket = runner.set_observation(prepared.images, prepared.image_masks, prepared.tokens, prepared.token_masks)
    return runner, bucket, runner.sample(bucket, noise.to(policy.device), rtc)


def rtc_params(policy, inp, schedule):
    return policy.rtc_tensors(inp["rtc.prev_chunk_left_over"], inference_delay=3, execution_horizon=10,
                              schedule=schedule)


@pytest.mark.parametrize("case", ["plain", "rtc_linear", "rtc_exp"])
def test_runner_matches_fixture_and_reference_solver(case):
    policy, prepared, inp, exp = load()
    rtc = None if case == "plain" else rtc_params(policy, inp, case.split("_")[1])
    runner, bucket, out = run_runner(policy, prepared, inp["noise"], rtc)
    ref = runner.sample(bucket, inp["noise"], rtc, trace={})   # a trace asks for the solver's reference loop
    assert (policy.sample_actions(prepared, inp["noise"], rtc) - out).abs().max().item() == 0.0  # the adapter's path
    key = "actions.model" if case == "plain" else f"{case}.actions.model"
    assert (out - exp[key]).abs().max().item() <= 1e-4
    assert (out - ref).abs().max().item() <= 1e-5


def test_frames_first_then_the_prompt_is_the_one_step_path_and_one_vision_serves_every_prompt_length():
    """predict_batch starts the vision stage on the frames before the prompt exists (set_images, then
    set_language); it computes what prepare + sample_actions compute, bit for bit. The frames' buffers and vision
    stage belong to the camera shape: prompts of two lengths (token buckets) share them."""
    policy, prepared, inp, _ = load()
    tasks = json.loads((PI05 / "inputs.json").read_text())["tasks"]
    images = {k[len(IMG):]: v.numpy() for k, v in inp.items() if k.startswith(IMG)}
    state = inp["raw.observation.state"].numpy()
    two_step = policy.unnormalize_actions(policy.sample_actions(prepared, inp["noise"])).clone()
    assert torch.equal(policy.predict_batch(images, state, tasks, noise=inp["noise"]), two_step)
    cfg = policy.config
    runner = FlowRunner(policy.model, cfg.num_steps, cfg.chunk_size, cfg.max_action_dim, use_graphs=False,
                        token_bucket=16)
    frames = runner.set_images(prepared.images, prepared.image_masks)
    short = prepared.token_masks.clone()
    short[:, 16:] = False
    a = runner.set_language(frames, prepared.tokens, short)
    b = runner.set_language(frames, prepared.tokens, prepared.token_masks)
    assert a is not b and a.tokens.shape[1] == 16 < b.tokens.shape[1] and a.frames is b.frames is frames
    assert runner.set_images(prepared.images, prepared.image_masks) is frames


def test_a_bad_rtc_request_fails_alone_after_the_vision_stage_started():
    """predict builds the RTC tensors while the vision stage runs on the frames already sent: a bad request
    (a NaN in Y) fails with its own error then, and the next call gives what it gives without that failure."""
    import numpy as np

    from phyai_ros.control.rtc import RtcRequest
    policy, _, inp, _ = load()
    task = json.loads((PI05 / "inputs.json").read_text())["tasks"][0]
    images = {k[len(IMG):]: v[0].numpy() for k, v in inp.items() if k.startswith(IMG)}
    state, noise = inp["raw.observation.state"][0].numpy(), inp["noise"][0]
    want = policy.predict(images, state, task, noise=noise)
    prefix = np.zeros((10, policy.action_dim), np.float32)
    prefix[4, 2] = np.nan
    bad = RtcRequest("guided", "linear", prefix, 3, 10, 0, 20_000_000)
    other = {name: np.ascontiguousarray(img[::-1]) for name, img in images.items()}   # different frames go up
    with pytest.raises(ValueError, match="RTC prefix contains NaN"):
        policy.predict(other, state, task, noise=noise, rtc=bad)
    assert np.array_equal(policy.predict(images, state, task, noise=noise), want)


def test_prefix_state_is_invalidated_and_reused_explicitly():
    policy, prepared, inp, _ = load()
    runner, bucket, first = run_runner(policy, prepared, inp["noise"])
    first = first.clone()
    # The same prefix state serves another noise sample without recomputing the prefix.
    again = runner.sample(bucket, inp["noise"])
    assert torch.equal(first, again)
    other = runner.sample(bucket, inp["noise"] * 0.5)
    assert (other - first).abs().max().item() > 1e-3
    bucket.prefix_for = None  # what set_observation does first for a new observation
    with pytest.raises(RuntimeError, match="prefix state is invalid"):
        runner.sample(bucket, inp["noise"])


def test_runner_runs_the_uncapturable_vjp_form_through_its_reference_loop():
    policy, prepared, inp, _ = load()
    runner, bucket, _ = run_runner(policy, prepared, inp["noise"])
    prev = inp["rtc.prev_chunk_left_over"]
    ident = runner.sample(bucket, inp["noise"], policy.rtc_tensors(prev, 3, 10, "exp")).clone()
    vjp = runner.sample(bucket, inp["noise"], policy.rtc_tensors(prev, 3, 10, "exp", jacobian="vjp"))
    assert torch.isfinite(vjp).all() and (vjp - ident).abs().max().item() > 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["plain", "rtc_exp"])
def test_cuda_graph_replay_matches_eager_on_the_device(case):
    """fp32 on CUDA (TF32 off): graph replay equals eager execution of the same functions, and the fixture."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    policy, prepared, inp, exp = load(device="cuda")
    rtc = None if case == "plain" else rtc_params(policy, inp, "exp")
    _, _, eager = run_runner(policy, prepared, inp["noise"], rtc, use_graphs=False)
    eager = eager.clone()
    runner, bucket, graphed = run_runner(policy, prepared, inp["noise"], rtc, use_graphs=True)
    graphed = graphed.clone()  # static output: the next replay overwrites it
    assert runner.registry is not None and len(runner.registry.keys()) == 3
    key = "actions.model" if case == "plain" else f"{case}.actions.model"
    assert (graphed - eager).abs().max().item() <= 1e-5
    assert (graphed.cpu() - exp[key]).abs().max().item() <= 5e-4
    # A second observation through the same graphs gives that observation's answer.
    flipped = prepared.images.flip(-1).contiguous()
    bucket = runner.set_observation(flipped, prepared.image_masks, prepared.tokens, prepared.token_masks)
    graphed2 = runner.sample(bucket, inp["noise"].cuda(), rtc).clone()
    runner_e = FlowRunner(policy.model, 10, 50, 32, use_graphs=False)
    b2 = runner_e.set_observation(flipped, prepared.image_masks, prepared.tokens, prepared.token_masks)
    eager2 = runner_e.sample(b2, inp["noise"].cuda(), rtc)
    assert (graphed2 - eager2).abs().max().item() <= 1e-5
    assert (graphed2 - graphed).abs().max().item() > 1e-4


def test_token_buckets_cut_only_padding_and_capture_every_length():
    policy, prepared, inp, exp = load()
    cfg = policy.config
    full = FlowRunner(policy.model, cfg.num_steps, cfg.chunk_size, cfg.max_action_dim, use_graphs=False)
    cut = FlowRunner(policy.model, cfg.num_steps, cfg.chunk_size, cfg.max_action_dim, use_graphs=False,
                     token_bucket=32)
    args = (prepared.images, prepared.image_masks, prepared.tokens, prepared.token_masks)
    n_valid = int(prepared.token_masks.sum(1).max())
    assert cut.bucket_length(prepared.token_masks) == -(-n_valid // 32) * 32 < prepared.tokens.shape[1]
    want = full.sample(full.set_observation(*args), inp["noise"])
    got = cut.sample(cut.set_observation(*args), inp["noise"])
    assert (got - want).abs().max().item() <= 1e-5
    assert (got - exp["actions.model"]).abs().max().item() <= 1e-4
    keys = cut.capture_all_buckets(*args, inp["noise"])
    assert sorted(k[2] for k in keys) == list(range(32, 200, 32)) + [200]


@pytest.mark.parametrize("case", ["plain", "rtc_linear"])
def test_the_same_runner_runs_pi0(case):
    """pi0 (state as a suffix token, action-time MLP) through the unchanged runner: the adapter boundary holds."""
    from safetensors.torch import load_file

    from phyai_ros.models.pi.pi0 import Pi0Adapter
    pi0 = FIXTURES / "pi0"
    policy = Pi0Adapter.from_files(pi0 / "checkpoint", FIXTURES / "tokenizer" / "tokenizer.model",
                                  pi0 / "norm_stats.json")
    inp, exp = load_file(str(pi0 / "inputs.safetensors")), load_file(str(pi0 / "expected.safetensors"))
    tasks = json.loads((pi0 / "inputs.json").read_text())["tasks"]
    images = {k[len(IMG):]: v.numpy() for k, v in inp.items() if k.startswith(IMG)}
    x = policy.prepare(images, inp["raw.observation.state"].numpy(), tasks)
    cfg = policy.config
    runner = FlowRunner(policy.model, cfg.num_steps, cfg.chunk_size, cfg.max_action_dim, use_graphs=False,
                        state_dim=cfg.max_state_dim)
    bucket = runner.set_observation(x.images, x.image_masks, x.tokens, x.token_masks, policy.state_padded(x))
    rtc = None if case == "plain" else rtc_params(policy, inp, "linear")
    out = runner.sample(bucket, inp["noise"], rtc)
    key = "actions.model" if case == "plain" else f"{case}.actions.model"
    assert (out - exp[key]).abs().max().item() <= 1e-4


def pi0_inputs():
    from safetensors.torch import load_file

    from phyai_ros.models.pi.pi0 import Pi0Adapter
    pi0 = FIXTURES / "pi0"
    policy = Pi0Adapter.from_files(pi0 / "checkpoint", FIXTURES / "tokenizer" / "tokenizer.model",
                                  pi0 / "norm_stats.json")
    inp = load_file(str(pi0 / "inputs.safetensors"))
    tasks = json.loads((pi0 / "inputs.json").read_text())["tasks"]
    images = {k[len(IMG):]: v.numpy() for k, v in inp.items() if k.startswith(IMG)}
    return policy, policy.prepare(images, inp["raw.observation.state"].numpy(), tasks), inp


@pytest.mark.parametrize("model", ["pi05", "pi0"])
def test_a_camera_absent_from_the_batch_is_skipped_not_computed_masked(model):
    """The fixtures' third camera is absent from both rows: the runner computes two slots (512 fewer prefix
    rows, one vision pass less) and gets what computing it masked gets; LeRobot's own answer is checked
    through the same default path in test_runner_matches_fixture_and_reference_solver."""
    policy, x, inp = pi0_inputs() if model == "pi0" else load()[:3]
    assert x.image_masks.tolist() == [[True, True, False]] * 2
    cfg, out = policy.config, {}
    for skip in (True, False):
        runner = FlowRunner(policy.model, cfg.num_steps, cfg.chunk_size, cfg.max_action_dim, use_graphs=False,
                            state_dim=cfg.max_state_dim, skip_absent_cameras=skip)
        bucket = runner.set_observation(x.images, x.image_masks, x.tokens, x.token_masks, policy.state_padded(x))
        assert bucket.frames.images.shape[1] == (2 if skip else 3)
        kv = bucket.prefix.outputs[0][0][0]   # layer 0's prefix keys [B, Hkv, P, hd]
        assert kv.shape[2] == (2 if skip else 3) * 256 + x.tokens.shape[1]
        out[skip] = runner.sample(bucket, inp["noise"]).clone()
    assert (out[True] - out[False]).abs().max().item() <= 1e-5


def test_only_an_absent_tail_is_skipped():
    """A slot absent in one row but present in another is computed (masked in that row); absent in every
    row but followed by a present one, it is computed too (positions and masks stay those of the slots)."""
    policy, x, inp, _ = load()
    cfg = policy.config
    runner = FlowRunner(policy.model, cfg.num_steps, cfg.chunk_size, cfg.max_action_dim, use_graphs=False)
    masks = torch.tensor([[True, True, False], [True, False, True]])
    assert runner.slots_kept(masks) == 3
    assert runner.slots_kept(torch.tensor([[True, False, True]] * 2)) == 3
    assert runner.slots_kept(torch.tensor([[True, False, False]] * 2)) == 1
    assert runner.slots_kept(torch.zeros(2, 3, dtype=torch.bool)) == 3
    bucket = runner.set_observation(x.images, masks, x.tokens, x.token_masks)
    assert bucket.frames.images.shape[1] == 3


def test_start_up_covers_every_camera_count_from_the_required_ones():
    """capture_buckets(min_cameras=k) runs every count of cameras present from k up (the trailing ones
    absent), so an optional camera that goes missing is skipped in a bucket made at start-up."""
    policy, x, inp, _ = load()
    images = {k[len(IMG):]: v[0].numpy() for k, v in inp.items() if k.startswith(IMG)}
    images = {name: images.get(name, images["base_0_rgb"]) for name in policy.camera_names}   # all three present
    state = inp["raw.observation.state"][0].numpy()
    keys = policy.capture_buckets(images, state, eager=True, min_cameras=1)
    assert sorted(k[1] for k in keys) == [1, 2, 3]
    policy.use_runner()
    assert [k[1] for k in policy.capture_buckets(images, state, eager=True)] == [3]


@pytest.mark.gpu
def test_under_graphs_an_absent_camera_is_skipped_only_into_a_start_up_bucket():
    """Graphs: with the two-camera bucket captured at start-up the absent camera is skipped (no capture in
    control, the eager answer); without it the three-slot graphs serve it masked (still no capture)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    policy, x, inp, _ = load(device="cuda")
    cfg = policy.config
    noise = inp["noise"].cuda()
    eager = FlowRunner(policy.model, cfg.num_steps, cfg.chunk_size, cfg.max_action_dim, use_graphs=False)
    want = eager.sample(eager.set_observation(x.images, x.image_masks, x.tokens, x.token_masks), noise).clone()
    all_present = torch.ones_like(x.image_masks)
    for min_slots, slots in ((2, 2), (None, 3)):
        runner = FlowRunner(policy.model, cfg.num_steps, cfg.chunk_size, cfg.max_action_dim, use_graphs=True)
        runner.capture_all_buckets(x.images, all_present, x.tokens, x.token_masks, noise, min_slots=min_slots)
        captured = runner.registry.keys()
        bucket = runner.set_observation(x.images, x.image_masks, x.tokens, x.token_masks)
        got = runner.sample(bucket, noise).clone()
        assert runner.registry.keys() == captured and bucket.frames.images.shape[1] == slots
        assert (got - want).abs().max().item() <= 1e-5


def test_bucket_cache_keeps_the_most_recently_used_and_forgets_the_graphs_of_the_rest():
    """graphs.BucketCache: a bounded LRU of a runner's buckets; an evicted bucket's graphs leave the registry."""
    from phyai_ros.runtime.graphs import BucketCache, CapturedCall, GraphRegistry
    registry = GraphRegistry(pool=object())
    cache = BucketCache(registry, ("a", "b"), max_buckets=2)
    for key in ((1,), (2,)):
        cache.add(key, f"bucket{key[0]}")
        for stage in ("a", "b"):
            registry.calls[(stage,) + key] = CapturedCall(graph=None, inputs=(), outputs=None)
    assert cache.get((1,)) == "bucket1"            # (1,) is now the most recently used
    cache.add((3,), "bucket3")                      # evicts (2,)
    assert cache.keys() == [(1,), (3,)] and cache.get((2,)) is None
    assert sorted(registry.keys()) == [("a", 1), ("b", 1)]
    assert BucketCache(None, ("a",), max_buckets=0).max_buckets == 1
