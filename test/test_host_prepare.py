"""The host side of a chunk (issues 21 and 23): frames and tokens reach the device without stalling its stream
(runtime/transfer.py), and GR00T tokenises and plans its prompt once per instruction, in bounded caches. CPU,
float32, the fixture checkpoints; the pinned path itself is tested on the GPU (test_transfer_gpu.py)."""
import numpy as np
import pytest
import torch

from fixture_sets import groot_fixture_dir, load_pi_fixture_policy
from phyai_ros.runtime.transfer import PinnedArray, _in_place, pinned_array, to_device

GROOT = groot_fixture_dir()


def test_to_device_copies_read_only_and_strided_arrays_as_they_are():
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    bgr_view = frame[..., ::-1]                      # negatively strided, as a BGR -> RGB view
    read_only = frame.copy()
    read_only.flags.writeable = False
    for a in (frame, bgr_view, read_only, frame[::2, 1:]):
        t = to_device(a, "cpu")
        assert t.dtype == torch.uint8 and tuple(t.shape) == a.shape
        assert np.array_equal(t.numpy(), a)
    assert to_device(np.ones(3, np.float64), "cpu", torch.float32).dtype == torch.float32
    same = torch.arange(4)
    assert to_device(same, "cpu") is same            # nothing to move


def test_which_arrays_go_over_in_place_from_their_block():
    """A frame over a whole block (read-only view, batch axis added) is uploaded in place; a slice, a strided view,
    a copy that inherited the block attribute, or an array of another size is staged. (The block is a plain CPU
    tensor here; pinned_array itself needs CUDA and without it returns its argument.)"""
    block = torch.arange(6 * 8 * 3, dtype=torch.uint8).view(6, 8, 3)
    frame = block.numpy().view(PinnedArray)
    frame.block = block
    held = frame.view()
    held.flags.writeable = False                     # as the observation buffer keeps a frame
    assert _in_place(held).data_ptr() == block.data_ptr() and tuple(_in_place(held[None]).shape) == (1, 6, 8, 3)
    for staged in (frame[1:], frame[..., ::-1], frame.astype(np.float32), frame.copy(), np.asarray(frame)):
        assert _in_place(staged) is None
    assert np.array_equal(to_device(held, "cpu").numpy(), frame)
    if not torch.cuda.is_available():
        plain = np.zeros((2, 2, 3), np.uint8)
        assert pinned_array(plain) is plain


def load_pi_policy():
    return load_pi_fixture_policy("pi05")


@pytest.fixture(scope="module")
def groot():
    if not (GROOT / "checkpoint").is_dir():
        pytest.skip(f"no GR00T N1.7 fixture at {GROOT}")
    from phyai_ros.models.groot_n17 import GrootAdapter
    return GrootAdapter.from_files(GROOT / "checkpoint")


def _observation(policy, seed: int):
    rng = np.random.default_rng(seed)
    images = {c: rng.integers(0, 256, (1, 120, 160, 3), dtype=np.uint8) for c in policy.camera_names}
    return images, rng.standard_normal((1, policy.state_dim)).astype(np.float32)


def test_groot_prompt_and_plan_are_cached_per_instruction_and_bounded(groot):
    from phyai_ros.models.groot_n17 import processor, qwen3vl
    proc, model = groot.processor, groot.model
    images, state = _observation(groot, 0)
    first = groot.prepare(images, state, "pick up the cup")
    obs_first = model.observation(first)
    assert first.host_layout is not None
    for host, dev in zip(first.host_layout, (first.input_ids, first.attention_mask, first.image_grid_thw)):
        assert host.device.type == "cpu" and torch.equal(host, dev.cpu())
    # New instructions fill the caches to their bounds, never beyond.
    for i in range(processor.PROMPT_CACHE + 8):
        x = groot.prepare(images, state, f"move block {i} to the left")
        model.observation(x)
        assert len(proc._prompt_cache) <= processor.PROMPT_CACHE
        assert len(model._plans) <= qwen3vl.PLAN_CACHE
    assert len(proc._prompt_cache) == processor.PROMPT_CACHE
    assert ("pick up the cup", ) not in [k[:1] for k in proc._prompt_cache]      # evicted
    # After eviction the same instruction gives the same tokens and plan as the first time, and a cached
    # instruction gives them again from the cache.
    for _ in range(2):
        again = groot.prepare(images, state, "pick up the cup")
        assert torch.equal(again.input_ids, first.input_ids) and torch.equal(again.attention_mask,
                                                                               first.attention_mask)
        assert again.prompts == first.prompts
        obs = model.observation(again)
        for k in ("text_cos", "text_sin", "image_index", "vision_pos"):
            assert torch.equal(obs[k], obs_first[k]), k


def test_groot_plan_from_the_host_layout_equals_the_plan_read_from_the_device(groot):
    from phyai_ros.models.groot_n17 import qwen3vl
    images, state = _observation(groot, 1)
    x = groot.prepare(images, state, "stack the red block on the blue one")
    c = groot.config
    args = (groot.model.weights, c.vision, c.text, c.tokens.image, x.input_ids, x.attention_mask, x.pixel_values,
            x.image_grid_thw)
    read = qwen3vl.backbone_plan(*args)                          # no cache, layout read from the tensors
    hosted = qwen3vl.backbone_plan(*args, cache=groot.model._plans, host=x.host_layout)
    assert read.keys() == hosted.keys()
    for k in read:
        assert torch.equal(read[k], hosted[k]), k


def test_groot_prepare_checks_frames_before_copying_them(groot):
    images, state = _observation(groot, 2)
    name = groot.camera_names[0]
    for bad, says in ((images[name].astype(np.float32), "uint8"), (images[name][..., :2], "[H, W, 3]"),
                      (np.zeros((1, 0, 4, 3), np.uint8), "empty image")):
        with pytest.raises(ValueError, match=f"camera '{name}'.*" + says.replace("[", r"\[").replace("]", r"\]")):
            groot.prepare({**images, name: bad}, state, "pick up the cup")


def test_pi_cameras_of_mixed_sizes_and_absent_ones_are_each_preprocessed_as_alone():
    """Same-size cameras share one upload and one resize; each slot still equals its frame preprocessed alone,
    in checkpoint order, for a batch of two, with an absent camera all -1 and masked."""
    from phyai_ros.models.pi.image import preprocess_uint8_images
    policy = load_pi_policy()
    rng = np.random.default_rng(3)
    names = policy.camera_names
    images = {names[0]: rng.integers(0, 256, (2, 120, 160, 3), dtype=np.uint8),
              names[2]: rng.integers(0, 256, (2, 120, 160, 3), dtype=np.uint8)[:, :, ::-1],   # strided view
              names[1]: rng.integers(0, 256, (2, 90, 90, 3), dtype=np.uint8)}
    x = policy.prepare(images, rng.standard_normal((2, policy.state_dim)).astype(np.float32), "pick up the cup")
    size = policy.image_size
    present = [n for n in names if n in images]
    assert x.slot_names == present and x.images.shape == (2, 3, 3, size, size)
    assert x.image_masks.all()
    for slot, name in enumerate(present):
        alone = preprocess_uint8_images(torch.from_numpy(np.ascontiguousarray(images[name])), size)
        assert torch.equal(x.images[:, slot], alone), name
    del images[names[1]]
    x = policy.prepare(images, rng.standard_normal((2, policy.state_dim)).astype(np.float32), "pick up the cup")
    assert x.slot_names == [names[0], names[2], names[1]]
    assert x.image_masks.tolist() == [[True, True, False]] * 2
    assert bool((x.images[:, 2] == -1).all())


def test_the_runner_picks_the_same_bucket_from_the_host_masks_as_from_the_device_ones():
    from phyai_ros.models.pi.runner import FlowRunner
    policy = load_pi_policy()
    runner = FlowRunner(policy.model, 2, policy.chunk_size, policy.config.max_action_dim, use_graphs=False,
                        token_bucket=16)
    rng = np.random.default_rng(4)
    for _ in range(20):
        images = rng.random((3, 3)) < 0.5
        tokens = np.zeros((3, 64), bool)
        for row, n in enumerate(rng.integers(1, 65, 3)):
            tokens[row, :n] = True
        assert runner.slots_kept(images) == runner.slots_kept(torch.from_numpy(images))
        assert runner.bucket_length(tokens) == runner.bucket_length(torch.from_numpy(tokens))
    x = policy.prepare({policy.camera_names[0]: rng.integers(0, 256, (96, 128, 3), dtype=np.uint8)},
                       np.zeros(policy.state_dim, np.float32), "pick up the cup")
    assert np.array_equal(x.host_masks[0], x.image_masks.numpy()) and np.array_equal(x.host_masks[1],
                                                                                       x.token_masks.numpy())
