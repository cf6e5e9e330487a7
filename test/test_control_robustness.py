"""Bad input never kills the loop: stale/missing cameras, malformed images, bad state,
out-of-order and future stamps, clock jump back (bag loop), policy exceptions, bad chunks,
throwing callbacks.  Each is counted/reported and the loop keeps producing actions."""
import numpy as np
import pytest

from phyai_ros.control import (ControlConfig, ControlLoop, FakeClock, JointStateMapper, ManualExecutor,
                               MissingJointError, BadStateError)
from phyai_ros.control.testing import make_sim

MS = 1_000_000
DT = 10 * MS
H = 10
IMG = np.zeros((4, 4, 3), np.uint8)


def cfg(**kw):
    base = dict(dt=0.01, horizon=H, action_dim=2, cameras=("front",), state_dim=3, rtc_overlap=2,
                initial_delay_ticks=2, max_observation_age=0.05)
    base.update(kw)
    return ControlConfig(**base)


def test_stale_camera_blocks_inference_and_is_counted():
    sim = make_sim(cfg(cameras=("front", "wrist")), latency_ns=5 * MS, feed=False)
    loop, clk = sim.loop, sim.clock
    t = clk.now()
    loop.on_image("front", IMG, t)
    loop.on_image("wrist", IMG, t - 80 * MS)  # older than 50 ms
    loop.on_state(np.zeros(3), t)
    assert loop.tick() is None
    assert not sim.executor.pending and loop.counters()["stale_snapshots"] == 1
    kind, detail = sim.events[-1]
    assert kind == "stale_observation" and "wrist" in detail and "0.080" in detail
    loop.on_image("wrist", IMG, t - 1 * MS)
    clk.advance(DT)
    loop.on_image("front", IMG, clk.now())
    loop.on_state(np.zeros(3), clk.now())
    loop.tick()
    assert sim.executor.pending  # fresh -> inference starts


def test_stale_state_and_missing_instruction():
    sim = make_sim(cfg(max_state_age=0.02, require_instruction=True), latency_ns=5 * MS, feed=False)
    loop, clk = sim.loop, sim.clock
    t = clk.now()
    loop.on_image("front", IMG, t)
    loop.on_state(np.zeros(3), t - 30 * MS)  # fine for cameras (50 ms), too old for state (20 ms)
    loop.tick()
    assert sim.events[-1] == ("stale_observation", "state: 0.030 s old")
    loop.on_state(np.zeros(3), t)
    loop.tick()
    assert sim.events[-1] == ("stale_observation", "instruction: no data")
    assert loop.counters()["stale_snapshots"] == 2 and not sim.executor.pending
    loop.on_instruction("pick up the cube")
    loop.tick()
    sim.driver.run_pending()
    assert sim.policy.calls[0][0].instruction == "pick up the cube"


def test_missing_camera_and_optional_slot():
    sim = make_sim(cfg(optional_cameras=("side",)), latency_ns=5 * MS, feed=False)
    loop, clk = sim.loop, sim.clock
    loop.on_state(np.zeros(3), clk.now())
    loop.tick()
    assert loop.counters()["stale_snapshots"] == 1 and "front: no data" in sim.events[-1][1]
    loop.on_image("front", IMG, clk.now())
    loop.tick()  # the optional 'side' camera is missing: masked, not stale
    sim.driver.run_pending()
    snap = sim.policy.calls[0][0]
    assert snap.image_mask == {"front": True, "side": False} and snap.images["side"] is None
    assert snap.images["front"] is not None and not snap.images["front"].flags.writeable


@pytest.mark.parametrize("call,kind", [
    (lambda L, t: L.on_image("front", np.zeros((4, 4, 3), np.float32), t), "bad_image"),
    (lambda L, t: L.on_image("front", np.zeros((4, 4)), t), "bad_image"),
    (lambda L, t: L.on_image("front", b"\x00\x01", t), "bad_image"),
    (lambda L, t: L.on_image("rear", IMG, t), "unknown_camera"),
    (lambda L, t: L.on_state(np.zeros(5), t), "bad_state"),
    (lambda L, t: L.on_state([0.0, float("nan"), 1.0], t), "bad_state"),
    (lambda L, t: L.on_state(["a", "b", "c"], t), "bad_state"),
    (lambda L, t: L.on_image("front", IMG, t - 30 * MS), "out_of_order"),
    (lambda L, t: L.on_image("front", IMG, t + 2_000 * MS), "future_stamp"),
    (lambda L, t: L.on_image("front", IMG, "not a stamp"), "bad_input"),
    (lambda L, t: L.on_instruction(42), "bad_input"),
])
def test_bad_input_is_rejected_counted_and_loop_continues(call, kind):
    sim = make_sim(cfg(), latency_ns=5 * MS)
    sim.driver.run(5)
    before = sim.loop.counters()
    t = sim.clock.now()
    assert call(sim.loop, t) is False
    after = sim.loop.counters()
    assert after[kind] == before[kind] + 1
    assert sim.events[-1][0] == kind
    n_chunks = len(sim.chunks)
    sim.driver.run(20)
    assert len(sim.chunks) > n_chunks and sim.driver.ticks[-1][1] is not None


def test_node_reported_decode_failure_is_counted():
    sim = make_sim(cfg(), latency_ns=5 * MS)
    sim.loop.report_bad_input("bad_image", "cv_bridge: unsupported encoding 'bayer'")
    sim.loop.report_bad_input("weird", "x")
    c = sim.loop.counters()
    assert c["bad_image"] == 1 and c["bad_input"] == 1


def test_joint_state_mapping():
    m = JointStateMapper(["j1", "j2", "j3"])
    out = m.map(["j3", "extra", "j1", "j2"], [3.0, 9.0, 1.0, 2.0])
    np.testing.assert_array_equal(out, [1.0, 2.0, 3.0])
    with pytest.raises(MissingJointError, match="j2"):
        m.map(["j1", "j3"], [1.0, 3.0])
    with pytest.raises(BadStateError):
        m.map(["j1", "j2", "j3"], [1.0, 2.0])
    sim = make_sim(cfg(state_dim=None, state_joint_names=("j1", "j2", "j3")), latency_ns=5 * MS, feed=False)
    t = sim.clock.now()
    assert sim.loop.on_joint_state(["j2", "j1", "j3"], [2.0, 1.0, 3.0], t)
    assert not sim.loop.on_joint_state(["j2", "j1"], [2.0, 1.0], t)
    assert sim.loop.counters()["missing_joint"] == 1
    sim.loop.on_image("front", IMG, t)
    sim.loop.tick()
    sim.driver.run_pending()
    np.testing.assert_array_equal(sim.policy.calls[0][0].state, [1.0, 2.0, 3.0])


def test_clock_jump_back_resets_and_keeps_running():
    sim = make_sim(cfg(), latency_ns=25 * MS)
    sim.driver.run(30)
    seq_before = sim.chunks[-1].seq
    t_jump = sim.clock.now() - 10_000 * MS  # bag loop: sim time back by 10 s
    n_before = len(sim.driver.ticks)
    sim.driver.jump_clock(t_jump)
    sim.driver.run(40)
    c = sim.loop.counters()
    assert c["clock_jumps"] == 1 and "clock_jump" in sim.event_kinds()
    after = [e for t, e in sim.driver.ticks[n_before:] if e is not None]
    assert len(after) > 20
    slots = [e.slot_ns for e in after]
    assert slots == sorted(set(slots)) and slots[0] >= t_jump
    new_chunks = [ch for ch in sim.chunks if ch.epoch == 1]
    assert new_chunks and new_chunks[0].seq == seq_before + 1  # numbering continues
    assert new_chunks[0].latency.startup  # timeline restarted: no RTC prefix, not in the window
    assert sim.policy.calls[-len(new_chunks)][1] is None


def test_clock_jump_during_inference_discards_its_chunk():
    sim = make_sim(cfg(), latency_ns=25 * MS)
    sim.driver.run(10)
    victim = len(sim.policy.calls) + 1

    def jump_mid_inference(snap, rtc, call):
        if call == victim:
            sim.driver.jump_clock(sim.clock.now() - 5_000 * MS)
            sim.driver.tick_once()  # the executor thread's next tick sees the jump
        return np.zeros((H, 2), np.float32) + call

    sim.policy.make = jump_mid_inference
    sim.driver.run(40)
    c = sim.loop.counters()
    assert c["clock_jumps"] == 1 and c["discarded_after_reset"] == 1
    assert len(sim.chunks) >= 4 and sim.driver.ticks[-1][1] is not None


def test_inference_exception_counted_and_next_inference_works():
    sim = make_sim(cfg(), latency_ns=25 * MS, fail_on={2})
    sim.driver.run(60)
    c = sim.loop.counters()
    assert c["inference_errors"] == 1
    kinds = sim.event_kinds()
    assert "inference_error" in kinds and "injected failure" in dict(sim.events)["inference_error"]
    assert len(sim.policy.calls) >= 6 and len(sim.chunks) == len(sim.policy.calls) - 1
    assert [ch.seq for ch in sim.chunks] == list(range(len(sim.chunks)))
    assert sim.driver.ticks[-1][1] is not None and not sim.loop.inference_in_flight


@pytest.mark.parametrize("bad", [np.zeros((H, 3)), np.full((H, 2), np.nan), "garbage", None])
def test_bad_chunk_is_rejected(bad):
    def make(snap, rtc, call):
        return bad if call == 1 else np.zeros((H, 2), np.float32)
    sim = make_sim(cfg(), make=make, latency_ns=5 * MS)
    sim.driver.run(40)
    assert sim.loop.counters()["bad_chunks"] == 1
    assert len(sim.chunks) == len(sim.policy.calls) - 1 >= 3


def test_throwing_callbacks_do_not_kill_the_loop():
    clk, ex = FakeClock(), ManualExecutor()

    def boom(*a):
        raise RuntimeError("callback bug")

    loop = ControlLoop(cfg(), lambda s, r: np.zeros((H, 2), np.float32), clk, ex, on_chunk=boom, on_margin=boom,
                       on_event=boom)
    loop.on_image("front", IMG, clk.now())
    loop.on_state(np.zeros(3), clk.now())
    emitted = 0
    for _ in range(30):
        clk.advance(DT)
        loop.on_image("front", IMG, clk.now())
        loop.on_state(np.zeros(3), clk.now())
        loop.on_image("front", IMG, 0)  # out of order -> event -> callback raises
        emitted += loop.tick() is not None
        ex.run_pending()
    assert emitted >= 25
    assert loop.counters()["callback_errors"] >= 30
