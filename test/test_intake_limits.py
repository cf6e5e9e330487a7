"""Intake limits (issue 11, items 9-11): an input the loop accepts must never make every later inference
fail, and one it refuses is counted with a message that names the camera / joint / instruction and says
what is wrong with it. Control-level cases drive a real ControlLoop on a FakeClock; the policy runs the
models' real image preprocessing. Model-level cases check that an over-long task never costs the state."""
import numpy as np
import pytest
import torch

from phyai_ros.control import BadStateError, ControlConfig, JointStateMapper
from phyai_ros.control.observation import MAX_ABS_STATE, FrameLimits
from phyai_ros.control.testing import encode_call_index, make_sim
from phyai_ros.models.pi.image import preprocess_uint8_images, resized_hw

MS = 1_000_000
H = 10
SIZE = 224  # the pi-family image input (SigLIP 224x224)
GOOD = np.zeros((48, 64, 3), np.uint8)


def cfg(**kw):
    base = dict(dt=0.01, horizon=H, action_dim=2, cameras=("front",), optional_cameras=("side",), state_dim=3,
                rtc_overlap=2, initial_delay_ticks=2, max_observation_age=0.05, image_input_size=SIZE)
    base.update(kw)
    return ControlConfig(**base)


def preprocessing_policy(snap, rtc, i):
    """A policy that does what the real one does first: resize-with-pad every present camera."""
    for slot, img in snap.images.items():
        if snap.image_mask[slot]:
            preprocess_uint8_images(torch.from_numpy(np.array(img))[None], SIZE)
    return encode_call_index(snap, rtc, i, H, 2)


def sim_feeding(side_image, **kw):
    """A sim whose sensors are fresh at every tick, with ``side_image`` on the optional camera."""
    sim = make_sim(cfg(**kw), make=preprocessing_policy, latency_ns=5 * MS, feed=False)

    def feed(now):
        sim.loop.on_image("front", GOOD, now)
        sim.loop.on_image("side", side_image, now)
        sim.loop.on_state(np.zeros(3), now)
    sim.driver.feed = feed
    return sim


# ------------------------------------------------------------------ images (item 9)
@pytest.mark.parametrize("size", [SIZE, 28])
@pytest.mark.parametrize("long", [1, 2, 3, 223, 224, 225, 448, 449, 2000])
def test_aspect_limit_is_what_the_resize_needs(size, long):
    """The frame rule accepts a frame exactly when resize-with-pad to size x size keeps >= 1 px per side,
    and every frame it accepts goes through the real preprocessing."""
    for short in (1, 2):
        for hw in ((short, long), (long, short)):
            frame = np.zeros((*hw, 3), np.uint8)
            resizable = min(resized_hw(*hw, size, size)) >= 1
            try:
                FrameLimits(input_size=size).check(frame)
                accepted = True
            except ValueError:
                accepted = False
            assert accepted == resizable, (hw, size)
            if accepted:
                assert preprocess_uint8_images(torch.from_numpy(frame)[None], size).shape == (1, 3, size, size)


@pytest.mark.parametrize("hw", [(1, 2000), (3000, 2)])
def test_elongated_frame_on_optional_camera_is_masked_not_fatal(hw):
    sim = sim_feeding(np.zeros((*hw, 3), np.uint8))
    sim.driver.run(40)
    c = sim.loop.counters()
    assert c["inference_errors"] == 0 and c["bad_image"] == 40, c
    assert len(sim.chunks) >= 3
    assert all(not snap.image_mask["side"] for snap, _ in sim.policy.calls)
    kind, detail = next(e for e in sim.events if e[0] == "bad_image")
    assert "'side'" in detail and f"{hw[1]}x{hw[0]}" in detail and f"{SIZE}:1" in detail, detail


def test_elongated_frame_on_required_camera_is_refused_and_named():
    sim = sim_feeding(GOOD)
    sim.driver.run(5)
    before = sim.loop.counters()
    assert not sim.loop.on_image("front", np.zeros((1, 2000, 3), np.uint8), sim.clock.now())
    assert sim.loop.counters()["bad_image"] == before["bad_image"] + 1
    assert sim.events[-1][0] == "bad_image" and "camera 'front'" in sim.events[-1][1]
    n = len(sim.chunks)
    sim.driver.run(30)
    assert len(sim.chunks) > n and sim.loop.counters()["inference_errors"] == 0


# ------------------------------------------------------------------ instruction (item 9)
@pytest.mark.parametrize("blank", ["", "   ", " \n\t "])
def test_blank_instruction_is_refused_and_the_task_kept(blank):
    sim = sim_feeding(GOOD, require_instruction=True)
    assert sim.loop.on_instruction("stack the blocks")
    sim.driver.run(5)
    assert not sim.loop.on_instruction(blank)
    assert sim.loop.counters()["bad_input"] == 1
    assert sim.events[-1][0] == "bad_input" and "instruction" in sim.events[-1][1]
    n = len(sim.policy.calls)
    sim.driver.run(30)
    assert len(sim.policy.calls) > n and sim.policy.calls[-1][0].instruction == "stack the blocks"


# ------------------------------------------------------------------ joint state (item 11)
def test_duplicate_joint_names_are_refused_naming_the_joint():
    m = JointStateMapper(["j1", "j2", "j3"])
    with pytest.raises(BadStateError, match=r"duplicate joint names.*\['j2'\]"):
        m.map(["j1", "j2", "j3", "j2"], [1.0, 2.0, 3.0, 4.0])  # which j2 is meant?
    with pytest.raises(BadStateError, match=r"duplicate joint names.*\['extra'\]"):
        m.map(["j1", "extra", "j2", "j3", "extra"], [1.0, 0.0, 2.0, 3.0, 0.0])


@pytest.mark.parametrize("value,says,never", [
    (1e30, "beyond", "non-finite"), (1e300, "beyond", "non-finite"), (-1e300, "beyond", "non-finite"),
    (float("nan"), "non-finite", "beyond"), (float("inf"), "non-finite", "beyond"),
])
def test_absurd_joint_positions_are_refused_saying_what_they_are(value, says, never):
    m = JointStateMapper(["j1", "j2", "j3"])
    with pytest.raises(BadStateError) as e:
        m.map(["j3", "j1", "j2"], [0.0, 0.0, value])
    msg = str(e.value)
    assert says in msg and never not in msg and "'j2'" in msg, msg
    if says == "beyond":
        assert "MAX_ABS_STATE" in msg and f"{MAX_ABS_STATE:g}" in msg
    sim = sim_feeding(GOOD, state_dim=None, state_joint_names=("j1", "j2", "j3"))
    assert not sim.loop.on_joint_state(["j1", "j2", "j3"], [0.0, value, 0.0], sim.clock.now())
    assert not sim.loop.on_state([0.0, value, 0.0], sim.clock.now()) and sim.loop.counters()["bad_state"] == 2
    assert never not in sim.events[-1][1]


def test_positions_at_the_bound_are_accepted():
    m = JointStateMapper(["j1", "j2"])
    np.testing.assert_array_equal(m.map(["j1", "j2"], [MAX_ABS_STATE, -MAX_ABS_STATE]), [1e6, -1e6])


# ------------------------------------------------------------------ prompt budget (item 10)
@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    from node_harness import require_tokenizer
    from phyai_ros.models.pi.pi0 import Pi0Adapter
    from phyai_ros.models.pi.pi05 import Pi05Adapter
    from phyai_ros.testing import make_small_checkpoint
    tokenizer = require_tokenizer()
    out = {}
    for name, cls in (("pi05", Pi05Adapter), ("pi0", Pi0Adapter)):
        d = make_small_checkpoint(tmp_path_factory.mktemp(name), horizon=H, state_dim=8, action_dim=7,
                                  token_budget=48, policy=name)
        out[name] = cls.from_files(d, tokenizer, d / "norm_stats.json")
    return out


def _observation(policy):
    images = {c: np.zeros((48, 64, 3), np.uint8) for c in policy.camera_names}
    return images, np.linspace(-0.5, 0.5, policy.state_dim).astype(np.float32)


LONG_TASK = ("pick up the red cup and put it in the sink " * 240)[:10_000]


def test_10000_character_task_keeps_state_and_action_in_pi05_tokens(adapters):
    policy = adapters["pi05"]
    images, state = _observation(policy)
    full = policy.build_prompts([LONG_TASK], policy.state_norm.normalize(torch.from_numpy(state[None])).numpy())[0]
    state_text = full[full.index(", State: "):]  # ", State: b0 ... b7;\nAction: "
    with pytest.warns(UserWarning, match="task was cut"):
        inputs = policy.prepare(images, state, LONG_TASK)
    ids = inputs.tokens[0][inputs.token_masks[0]].tolist()
    text = policy.tokenizer.sp.decode(ids)
    assert inputs.truncated == [True] and len(ids) <= policy.config.token_budget
    assert text.startswith("Task: pick up the red cup") and text.endswith(state_text), text
    assert "State:" in text and "Action:" in text


def test_prompt_that_fits_is_unchanged(adapters):
    """Token parity: a prompt within the budget is tokenized exactly as before (BOS + whole prompt)."""
    policy = adapters["pi05"]
    images, state = _observation(policy)
    inputs = policy.prepare(images, state, "stack the blocks")
    ids = policy.tokenizer.sp.encode(inputs.prompts[0], add_bos=True)
    assert inputs.truncated == [False] and inputs.prompts[0].startswith("Task: stack the blocks, State: ")
    assert inputs.tokens[0, :len(ids)].tolist() == ids and int(inputs.token_masks.sum()) == len(ids)


def test_pi0_long_task_is_cut_before_its_newline(adapters):
    """pi0 has its own state token, so the state is safe; the task is cut, the prompt keeps its '\\n'."""
    policy = adapters["pi0"]
    images, state = _observation(policy)
    with pytest.warns(UserWarning, match="task was cut"):
        inputs = policy.prepare(images, state, LONG_TASK)
    assert inputs.truncated == [True] and inputs.prompts[0].endswith("\n")
    assert inputs.prompts[0].startswith("pick up the red cup")
    assert len(policy.tokenizer.sp.encode(inputs.prompts[0], add_bos=True)) <= policy.config.token_budget
    prompt, cut = policy.fit_task(LONG_TASK, state)
    assert cut and prompt == inputs.prompts[0]
