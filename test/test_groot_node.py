"""GR00T N1.7 in the onboard node: the registry's "groot_n17" behind the same bridge as the pi family.

Over real DDS: the node in its own process runs a small random GR00T (the parity fixture's tiny sizes,
phyai_ros.fixtures.make_small_checkpoint(policy="groot_n17")) with config/groot_cpu_test.yaml and native RTC, a fake robot
feeds it; chunks, RTC's frozen prefix and margins are checked on what comes out. In-process (build_policy with
the same parameters): what the node refuses at start, each with a message naming the valid choices.
"""
import numpy as np
import pytest

from node_harness import REPO, FakeRobot, NodeProcess, load_params, paced_dt
from phyai_ros.fixtures import make_small_checkpoint
from fixture_sets import require_groot_fixture
from phyai_ros.messages import msg_to_chunk
from phyai_ros.parameters import SPECS

GROOT_CPU = REPO / "config" / "groot_cpu_test.yaml"
HORIZON = 16          # the small GR00T's chunk size
N_CHUNKS = 8
DT = 0.01            # inference (~20 ms here) spans ticks, so the measured delay and RTC's frozen prefix are > 0


def groot_params(checkpoint, **overrides) -> dict:
    """What the node reads with groot_cpu_test.yaml and this checkpoint (declared defaults filled in)."""
    return {**{n: s.default for n, s in SPECS.items()}, **load_params(GROOT_CPU),
            "model.checkpoint": str(checkpoint), **overrides}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    require_groot_fixture()
    return make_small_checkpoint(tmp_path_factory.mktemp("groot_small"), policy="groot_n17", state_dim=8, action_dim=7,
                                       horizon=HORIZON)


# ----------------------------------------------------------------------------- over DDS
@pytest.fixture(scope="module")
def run(checkpoint):
    """The node with the small GR00T for N_CHUNKS chunks (no model.tokenizer: GR00T reads its backbone's)."""
    # DT, or slower on a machine too slow to keep chunks ahead of the timer at that rate
    dt = paced_dt(checkpoint, "", dt=DT, horizon=HORIZON, params_file=GROOT_CPU, overrides={"control.horizon": 0})
    node = NodeProcess(checkpoint, "", params_file=GROOT_CPU, overrides={"control.horizon": 0, "control.dt": dt})
    robot = FakeRobot(node.params)
    try:
        robot.set_instruction("Pick up the red cup!")
        assert robot.wait_for_node(timeout=90), node.output()
        ok = robot.spin_until(lambda: len(robot.chunks) >= N_CHUNKS and len(robot.margins) >= N_CHUNKS - 1,
                              timeout=120)
        assert ok, f"{len(robot.chunks)} chunks, {len(robot.margins)} margins; node said:\n{node.output()}"
        assert node.alive, node.output()
    finally:
        robot.close()
        print(node.stop())
    return robot


@pytest.mark.ros
def test_groot_chunks_in_sequence_on_the_dt_grid_finite_in_the_checkpoints_dims(run):
    cs = [msg_to_chunk(r.msg) for r in run.chunks]
    dt_ns = round(run.params["control.dt"] * 1e9)
    assert [c.seq for c in cs] == list(range(cs[0].seq, cs[0].seq + len(cs))), "sequence numbers skip or repeat"
    for c in cs:
        assert c.actions.shape == (HORIZON, 7) and np.isfinite(c.actions).all()
        assert c.model_id == "groot-small-cpu" and c.dt_ns == dt_ns
    for prev, cur in zip(cs, cs[1:]):
        assert cur.t0_ns > prev.t0_ns and (cur.t0_ns - cs[0].t0_ns) % dt_ns == 0, "action 0 off the dt grid"


@pytest.mark.ros
def test_groot_native_rtc_freezes_the_previous_chunks_actions(run):
    cs = [msg_to_chunk(r.msg) for r in run.chunks]
    dt_ns = round(run.params["control.dt"] * 1e9)
    frozen = 0
    for prev, cur in zip(cs, cs[1:]):
        offset = (cur.t0_ns - prev.t0_ns) // dt_ns
        # the frozen prefix never reaches past the previous chunk (one that came after it ran out freezes nothing)
        assert offset + cur.d <= prev.horizon or cur.d == 0, (offset, cur.d, prev.horizon)
        if cur.d:
            frozen += 1
            np.testing.assert_allclose(cur.actions[:cur.d], prev.actions[offset:offset + cur.d], rtol=0, atol=1e-6)
            # past the prefix the chunk is the model's own (the ramp lets it move off the old plan)
    # most chunks freeze a prefix; on a loaded machine more of them come after their predecessor ran out
    assert frozen >= max(1, len(cs) // 3), [c.d for c in cs]


@pytest.mark.ros
def test_groot_margins_published(run):
    assert len(run.margins) >= N_CHUNKS - 1
    seqs = {r.msg.seq for r in run.chunks}
    assert all(r.msg.chunk_seq in seqs for r in run.margins)
    assert all(np.isfinite(r.msg.margin) and r.msg.latency_inference > 0 for r in run.margins[1:])


# ----------------------------------------------------------------------------- refused at start
def build(checkpoint, **overrides):
    from phyai_ros.policies import build_policy
    return build_policy(groot_params(checkpoint, **{"model.warmup_runs": 0, **overrides}))


def test_type_and_horizon_come_from_the_checkpoint(checkpoint):
    from phyai_ros.models import checkpoint_type
    policy = build(checkpoint)
    assert checkpoint_type(checkpoint) == "groot_n17"
    assert (policy.model_type, policy.horizon, policy.camera_slots) == ("groot_n17", HORIZON, ["front", "wrist"])
    assert policy.adapter.default_embodiment_id == 3       # the checkpoint's own tag


@pytest.mark.parametrize("value", ["second_robot", "5"])
def test_embodiment_by_tag_or_id(checkpoint, value):
    adapter = build(checkpoint, **{"model.embodiment": value}).adapter
    assert (adapter.embodiment_tag, adapter.default_embodiment_id) == ("second_robot", 5)


@pytest.mark.parametrize("overrides, message", [
    ({"model.embodiment": "gr1"}, "model.embodiment: embodiment 'gr1' is not one of the checkpoint's embodiments: "
                                  "new_embodiment (id 3), second_robot (id 5)"),
    ({"model.embodiment": "4"}, "new_embodiment (id 3), second_robot (id 5)"),
    ({"rtc.mode": "guided"}, "rtc.mode 'guided' is not supported by the checkpoint"),
    ({"cameras.slots": ["front", "side"], "cameras.topics": ["a", "b"]},
     "camera slots ['front', 'side'] must be the checkpoint's cameras ['front', 'wrist']"),
    ({"cameras.required": [True, False]}, "every slot must be required"),
    ({"state.joint_names": ["a", "b"]}, "state.joint_names has 2 names; the policy's state has 8 dims"),
    ({"control.action_names": ["a"]}, "control.action_names has 1 names; the policy acts in 7 dims"),
    ({"control.horizon": 20}, "control.horizon 20 != the model's chunk size 16"),
    ({"model.tokenizer": "/tmp/tokenizer.model"}, "groot_n17 reads its tokenizer from its checkpoint folders; got a "
                                                  "separate file '/tmp/tokenizer.model' (leave it empty)"),
])
def test_refused_at_start_with_the_valid_choices(checkpoint, overrides, message):
    with pytest.raises(ValueError) as err:
        build(checkpoint, **overrides)
    assert message in str(err.value)


def test_guided_mode_message_names_the_models_modes(checkpoint):
    with pytest.raises(ValueError) as err:
        build(checkpoint, **{"rtc.mode": "trained"})
    assert "(it supports native, off)" in str(err.value)


def test_pi_types_refuse_an_embodiment(tmp_path):
    from phyai_ros.fixtures import make_small_checkpoint, require_tokenizer
    from phyai_ros.policies import build_policy
    tokenizer = require_tokenizer()
    ckpt = make_small_checkpoint(tmp_path / "pi05", horizon=20)
    p = {**{n: s.default for n, s in SPECS.items()}, **load_params(REPO / "config" / "pi05_cpu_test.yaml"),
         "model.checkpoint": str(ckpt), "model.tokenizer": str(tokenizer), "model.warmup_runs": 0,
         "model.embodiment": "new_embodiment"}
    with pytest.raises(ValueError, match="model type pi05 has no embodiments: leave it empty"):
        build_policy(p)


def test_relative_checkpoint_refuses_native_rtc():
    from fixture_sets import groot_fixture_dir
    from phyai_ros.policies import build_policy
    rel = require_groot_fixture() / "checkpoint_relative"
    p = groot_params(rel, **{"model.warmup_runs": 0, "state.joint_names": [f"j{i}" for i in range(13)],
                             "control.action_names": [f"a{i}" for i in range(12)]})
    with pytest.raises(ValueError, match=r"rtc.mode 'native' is not supported by the checkpoint .* \(it supports off\)"):
        build_policy(p)
    assert build_policy({**p, "rtc.mode": "off"}).model_type == "groot_n17"
    assert groot_fixture_dir() == rel.parent
