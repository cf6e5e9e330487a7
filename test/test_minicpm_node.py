"""MiniCPM-Robot in the onboard node: the registry's "minicpm_robot" behind the same bridge as the other families.

Over real DDS: the node in its own process runs a small random MiniCPM-Robot (the parity set's tiny backbone,
phyai_ros.fixtures.make_small_checkpoint(policy="minicpm_robot")) with config/minicpm_cpu_test.yaml and native RTC;
a fake robot feeds it, then hostile inputs (a state of the wrong width, frames of another size, an instruction far
beyond the token budget): the node keeps publishing finite chunks. In-process (build_policy with the same
parameters): what the node refuses at start, each with a message naming the valid choices, and the bridge's path
for bad observations.
"""
import numpy as np
import pytest

from fixture_sets import minicpm_fixture_dir
from node_harness import REPO, FakeRobot, NodeProcess, load_params, paced_dt
from phyai_ros.control.rtc import make_request
from phyai_ros.fixtures import make_small_checkpoint
from phyai_ros.messages import msg_to_chunk
from phyai_ros.parameters import SPECS

CPU = REPO / "config" / "minicpm_cpu_test.yaml"
HORIZON = 16
N_CHUNKS = 8
DT = 0.01


def params(checkpoint, **overrides) -> dict:
    return {**{n: s.default for n, s in SPECS.items()}, **load_params(CPU), "model.checkpoint": str(checkpoint),
            **overrides}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    if not (minicpm_fixture_dir() / "backbone_config.json").is_file():
        pytest.skip(f"MiniCPM-Robot parity set not found at {minicpm_fixture_dir()}")
    return make_small_checkpoint(tmp_path_factory.mktemp("minicpm_small"), policy="minicpm_robot", horizon=HORIZON)


@pytest.fixture(scope="module")
def run(checkpoint):
    """The node for N_CHUNKS chunks, then hostile inputs, then N_CHUNKS more."""
    dt = paced_dt(checkpoint, "", dt=DT, horizon=HORIZON, params_file=CPU, overrides={"control.horizon": 0})
    node = NodeProcess(checkpoint, "", params_file=CPU, overrides={"control.horizon": 0, "control.dt": dt})
    robot = FakeRobot(node.params, image_hw=(60, 80))
    try:
        robot.set_instruction("put the red cube in the blue bowl")
        assert robot.wait_for_node(timeout=90), node.output()
        ok = robot.spin_until(lambda: len(robot.chunks) >= N_CHUNKS and len(robot.margins) >= N_CHUNKS - 1,
                              timeout=120)
        assert ok, f"{len(robot.chunks)} chunks, {len(robot.margins)} margins; node said:\n{node.output()}"
        before = robot.last_seq()
        robot.set_instruction("stack " * 3000)                                    # far beyond the token budget
        robot.publish_state(robot.joint_state_msg(positions=[0.1] * 3, names=["joint_0", "joint_1", "joint_2"]))
        robot.image_hw = (300, 200)                                             # portrait frames of another size
        robot._frames = {slot: np.full((300, 200, 3), 40 * i, np.uint8) for i, slot in enumerate(robot.slots)}
        assert robot.wait_chunks_after(before, N_CHUNKS, timeout=120), node.output()
        assert node.alive, node.output()
    finally:
        robot.close()
        print(node.stop())
    robot.hostile_after = before
    return robot


@pytest.mark.ros
def test_chunks_in_sequence_on_the_grid_finite_in_the_checkpoints_dims(run):
    cs = [msg_to_chunk(r.msg) for r in run.chunks]
    dt_ns = round(run.params["control.dt"] * 1e9)
    assert [c.seq for c in cs] == list(range(cs[0].seq, cs[0].seq + len(cs)))
    for c in cs:
        assert c.actions.shape == (HORIZON, 6) and np.isfinite(c.actions).all()
        assert c.model_id == "minicpm-small-cpu" and c.dt_ns == dt_ns
    for prev, cur in zip(cs, cs[1:]):
        assert cur.t0_ns > prev.t0_ns and (cur.t0_ns - cs[0].t0_ns) % dt_ns == 0


@pytest.mark.ros
def test_native_rtc_freezes_the_previous_chunks_actions(run):
    cs = [msg_to_chunk(r.msg) for r in run.chunks]
    dt_ns = round(run.params["control.dt"] * 1e9)
    frozen = 0
    for prev, cur in zip(cs, cs[1:]):
        offset = (cur.t0_ns - prev.t0_ns) // dt_ns
        assert offset + cur.d <= prev.horizon or cur.d == 0
        if cur.d:
            frozen += 1
            np.testing.assert_allclose(cur.actions[:cur.d], prev.actions[offset:offset + cur.d], rtol=0, atol=1e-6)
    assert frozen >= max(1, len(cs) // 3), [c.d for c in cs]


@pytest.mark.ros
def test_hostile_inputs_leave_the_node_acting(run):
    """After the long instruction, the short state and the other frame size: chunks still come, finite; the
    wrong-width state was refused at intake (counted), not passed to the model."""
    later = [msg_to_chunk(r.msg) for r in run.chunks if r.msg.seq > run.hostile_after]
    assert len(later) >= N_CHUNKS and all(np.isfinite(c.actions).all() for c in later)
    counters = {}
    for r in run.diagnostics:
        for status in r.msg.status:
            for kv in status.values:
                if kv.key in ("missing_joint", "bad_state"):
                    counters[kv.key] = max(counters.get(kv.key, 0), int(kv.value))
    assert counters.get("missing_joint", 0) + counters.get("bad_state", 0) >= 1, counters


# ----------------------------------------------------------------------------- in-process
def build(checkpoint, **overrides):
    from phyai_ros.policies import build_policy
    return build_policy(params(checkpoint, **{"model.warmup_runs": 0, **overrides}))


def test_type_horizon_embodiment_from_the_parameters(checkpoint):
    from phyai_ros.models import checkpoint_type
    policy = build(checkpoint)
    assert checkpoint_type(checkpoint) == "minicpm_robot"
    assert (policy.model_type, policy.horizon, policy.camera_slots) == ("minicpm_robot", HORIZON, ["base", "wrist"])
    assert policy.adapter.embodiment_id == 1
    assert policy.adapter.prompt_template == "Task: {task}"


@pytest.mark.parametrize("overrides, message", [
    ({"model.embodiment": "3"}, "embodiment '3' must be a bank index in [0, 2] (this checkpoint has 3 embodiment banks)"),
    ({"model.embodiment": "arm"}, "must be a bank index in [0, 2]"),
    ({"rtc.mode": "guided"}, "rtc.mode 'guided' is not supported by the checkpoint"),
    ({"cameras.slots": ["base", "side"], "cameras.topics": ["a", "b"]},
     "camera slots ['base', 'side'] must be the checkpoint's cameras ['base', 'wrist']"),
    ({"cameras.required": [True, False]}, "every slot must be required"),
    ({"state.joint_names": ["a", "b"]}, "state.joint_names has 2 names; the policy's state has 6 dims"),
    ({"model.options": "prompt_template=no task here"}, "must hold '{task}' once"),
    ({"model.options": "steps=3"}, "takes the options head_dtype, resize, prompt_template; got steps"),
    ({"model.tokenizer": "/tmp/tokenizer.json"}, "reads its tokenizer from its checkpoint folders"),
])
def test_refused_at_start_with_the_valid_choices(checkpoint, overrides, message):
    with pytest.raises(ValueError) as err:
        build(checkpoint, **overrides)
    assert message in str(err.value)


def test_bad_observations_are_clear_errors_and_long_tasks_are_cut(checkpoint):
    adapter = build(checkpoint).adapter
    rng = np.random.default_rng(0)
    images = {"base": rng.integers(0, 256, (120, 160, 3), dtype=np.uint8),
              "wrist": rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)}
    state = np.zeros(6, np.float32)
    chunk = adapter.predict(images, state, "pick")
    assert chunk.shape == (HORIZON, 6) and np.isfinite(chunk).all()
    with pytest.raises(ValueError, match="state must be"):
        adapter.predict(images, np.zeros(5, np.float32), "pick")
    with pytest.raises(ValueError, match="NaN"):
        adapter.predict(images, np.full(6, np.nan, np.float32), "pick")
    with pytest.raises(ValueError, match="camera 'wrist': no frame"):
        adapter.predict({"base": images["base"]}, state, "pick")
    with pytest.raises(ValueError, match="uint8"):
        adapter.predict({**images, "wrist": images["wrist"].astype(np.float32)}, state, "pick")
    text, cut = adapter.fit_task("stack " * 1000)
    assert cut and len(adapter.prompts.tokenizer.encode(text)) <= adapter.token_budget
    assert np.isfinite(adapter.predict(images, state, "stack " * 1000)).all()
    prev = np.linspace(-1, 1, 10 * 6, dtype=np.float32).reshape(10, 6)
    rtc = make_request(prev, 3, mode="native", schedule="exp", horizon=HORIZON)
    frozen = adapter.predict(images, state, "pick", rtc=rtc)
    assert np.array_equal(frozen[:3], prev[:3])
    with pytest.raises(ValueError, match="RTC prefix must be"):
        adapter.predict(images, state, "pick", rtc=make_request(prev[:, :4], 2, mode="native", schedule="exp",
                                                                horizon=HORIZON))


@pytest.mark.ros
def test_a_stepped_replay_of_a_real_bag_accounts_for_every_message(tmp_path):
    """A rosbag2 (mcap) session through the node with the small MiniCPM-Robot, stepped: every input message
    accounted for, finite chunks of the checkpoint's size, no inference error."""
    from phyai_ros.replay.demo_bag import DemoBagConfig, make_demo_bag
    from phyai_ros.testing import PolicyNode, replay
    if not (minicpm_fixture_dir() / "backbone_config.json").is_file():
        pytest.skip("MiniCPM-Robot parity set not found")
    cams = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")   # the default replay config's slots
    ckpt = make_small_checkpoint(tmp_path / "ckpt", policy="minicpm_robot", horizon=HORIZON, cameras=cams,
                                 state_dim=8, action_dim=7)
    bag = make_demo_bag(tmp_path / "bag", DemoBagConfig(duration=3.0, state_rate_hz=20.0, storage="mcap"))
    overrides = {"model.id": "minicpm-replay", "rtc.mode": "native", "model.embodiment": "2",
                 "cameras.required": [True, True, True], "control.horizon": 0}
    with PolicyNode(checkpoint=ckpt, overrides=overrides) as node:
        result = replay(bag.path, node, mode="stepped")
        log = node.output()
    assert f"policy minicpm-replay (minicpm_robot, H = {HORIZON})" in log, log[-2000:]
    assert result.complete and result.accounting.ok, (result.accounting.problems, log[-2000:])
    chunks = result.chunk_data
    assert len(chunks) >= 3 and all(c.actions.shape == (HORIZON, 7) and np.isfinite(c.actions).all() for c in chunks)
    assert result.node_counters.get("inference_errors", 0) == 0
