"""GPU: the host -> device path of a chunk (runtime/transfer.py; issues 21 and 23). Frames staged through pinned
memory arrive exactly, even when the staging blocks are reused while copies queue behind other work; the host
does not wait for the stream's queued work (a pageable copy does); frames already in pinned memory (the node's
intake) go over in place, exactly, while the blocks they were in are freed and reused; and the GR00T processor's
frames, resized on the device, agree with the host float path to one grey level."""
import time

import numpy as np
import pytest
import torch

from fixture_sets import groot_fixture_dir
from phyai_ros.runtime.transfer import PinnedArray, _in_place, pinned_array, stack_to_device, to_device

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
GROOT = groot_fixture_dir()
SLEEP_CYCLES = 400_000_000      # ~0.2 s of GPU time at ~2 GHz: work queued ahead of the copies


def test_staged_frames_arrive_exactly_while_the_stream_is_busy():
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for _ in range(12)]
    source = np.empty_like(frames[0])
    torch.cuda._sleep(SLEEP_CYCLES)                 # every copy below queues behind this
    out = []
    for f in frames:
        source[...] = f                             # one host buffer, overwritten after each call
        out.append(to_device(source[..., ::-1], "cuda"))   # a strided view (BGR -> RGB)
    torch.cuda.synchronize()
    for f, t in zip(frames, out):
        assert np.array_equal(t.cpu().numpy(), f[..., ::-1])


def test_the_host_does_not_wait_for_queued_work_but_a_pageable_copy_does():
    frame = np.random.default_rng(1).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    to_device(frame, "cuda")
    torch.cuda.synchronize()

    def host_seconds(copy) -> float:
        torch.cuda._sleep(SLEEP_CYCLES)
        t = time.perf_counter()
        copy()
        took = time.perf_counter() - t
        torch.cuda.synchronize()
        return took

    t = time.perf_counter()
    torch.cuda._sleep(SLEEP_CYCLES)
    torch.cuda.synchronize()
    sleep_s = time.perf_counter() - t
    staged = host_seconds(lambda: to_device(frame, "cuda"))
    pageable = host_seconds(lambda: torch.from_numpy(frame).to("cuda"))
    assert sleep_s > 0.05, f"the queued work took {sleep_s:.3f} s: too short to tell waiting from not"
    assert staged < 0.5 * sleep_s, (staged, sleep_s)
    assert pageable > 0.5 * sleep_s, (pageable, sleep_s)


def test_groot_frames_resized_on_the_device_match_the_host_float_path():
    if not (GROOT / "checkpoint").is_dir():
        pytest.skip(f"no GR00T N1.7 fixture at {GROOT}")
    from phyai_ros.models.groot_n17 import GrootAdapter
    on_gpu = GrootAdapter.from_files(GROOT / "checkpoint", device="cuda", resize_mode="float")
    on_host = GrootAdapter.from_files(GROOT / "checkpoint", device="cpu", resize_mode="float")
    rng = np.random.default_rng(2)
    for shape in ((480, 640), (256, 256), (720, 1280)):
        images = {c: rng.integers(0, 256, (1, *shape, 3), dtype=np.uint8) for c in on_gpu.camera_names}
        state = rng.standard_normal((1, on_gpu.state_dim)).astype(np.float32)
        a, b = on_gpu.prepare(images, state, "pick up the cup"), on_host.prepare(images, state, "pick up the cup")
        assert a.vlm_images.device.type == "cuda"
        diff = (a.vlm_images.cpu().int() - b.vlm_images.int()).abs()
        assert int(diff.max()) <= 1, shape                      # bicubic in float, rounded: ties may flip
        assert float((diff > 0).float().mean()) < 1e-2, shape
        assert torch.equal(a.input_ids.cpu(), b.input_ids) and torch.equal(a.image_grid_thw.cpu(), b.image_grid_thw)
        step = 1.0 / (255 * min(on_gpu.processor.images.std))      # one grey level in pixel units
        assert float((a.pixel_values.cpu() - b.pixel_values).abs().max()) <= step * 1.001 + 1e-5, shape


def test_pi_prepare_on_the_gpu_equals_the_cpu_one():
    """One upload and one resize per frame size on the GPU: the same images as the CPU path (float bilinear)."""
    from fixture_sets import load_pi_fixture_policy
    gpu, cpu = load_pi_fixture_policy("pi05", device="cuda"), load_pi_fixture_policy("pi05")
    rng = np.random.default_rng(3)
    names = gpu.camera_names
    images = {names[0]: rng.integers(0, 256, (480, 640, 3), dtype=np.uint8),
              names[1]: rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)[:, ::-1],
              names[2]: rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)}
    state = rng.standard_normal(gpu.state_dim).astype(np.float32)
    for frames in (images, {k: v for k, v in images.items() if k != names[1]}):
        a, b = gpu.prepare(frames, state, "pick up the cup"), cpu.prepare(frames, state, "pick up the cup")
        assert a.images.device.type == "cuda" and a.slot_names == b.slot_names
        assert float((a.images.cpu() - b.images).abs().max()) <= 1e-5
        assert torch.equal(a.image_masks.cpu(), b.image_masks) and torch.equal(a.tokens.cpu(), b.tokens)


def test_pinned_frames_go_over_in_place_and_arrive_exactly_while_their_blocks_are_reused():
    rng = np.random.default_rng(4)
    frames = [rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for _ in range(12)]
    pinned = [pinned_array(f) for f in frames]
    assert all(isinstance(a, PinnedArray) and a.block.is_pinned() and np.array_equal(a, f) and not a.flags.writeable
               for a, f in zip(pinned, frames))
    readonly = pinned[0].view()
    readonly.flags.writeable = False                      # as the observation buffer holds a frame
    assert _in_place(readonly) is not None and _in_place(readonly[None]) is not None
    assert _in_place(pinned[0][:, ::-1]) is None and _in_place(pinned[0][1:]) is None   # views: staged instead
    torch.cuda._sleep(SLEEP_CYCLES)                       # every copy below queues behind this
    one = [to_device(a, "cuda") for a in pinned[:6]]
    stacked = stack_to_device(pinned[6:], "cuda")
    sliced = to_device(pinned[0][:, ::-1], "cuda")
    del pinned, readonly                                 # the blocks go back to the caching host allocator ...
    refill = [pinned_array(np.full((480, 640, 3), 7, np.uint8)) for _ in range(12)]   # ... which must not hand
    torch.cuda.synchronize()                                                            # them out in flight
    for f, t in zip(frames, one):
        assert np.array_equal(t.cpu().numpy(), f)
    assert np.array_equal(stacked.cpu().numpy(), np.stack(frames[6:]))
    assert np.array_equal(sliced.cpu().numpy(), frames[0][:, ::-1])
    assert all(int(r.min()) == 7 for r in refill)


def test_a_pinned_frame_upload_does_not_wait_and_makes_no_staging_copy():
    frame = pinned_array(np.random.default_rng(5).integers(0, 256, (480, 640, 3), dtype=np.uint8))
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    t = time.perf_counter()
    out = stack_to_device([frame, frame, frame], "cuda")
    took = time.perf_counter() - t
    torch.cuda.synchronize()
    assert took < 0.05, took
    assert np.array_equal(out[2].cpu().numpy(), frame)


def test_pi_prepare_of_pinned_frames_equals_that_of_plain_ones():
    from fixture_sets import load_pi_fixture_policy
    policy = load_pi_fixture_policy("pi05", device="cuda")
    rng = np.random.default_rng(6)
    images = {name: rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for name in policy.camera_names}
    state = rng.standard_normal(policy.state_dim).astype(np.float32)
    a = policy.prepare({k: pinned_array(v) for k, v in images.items()}, state, "pick up the cup")
    b = policy.prepare(images, state, "pick up the cup")
    assert torch.equal(a.images, b.images) and torch.equal(a.tokens, b.tokens)
