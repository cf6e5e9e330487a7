"""The onboard node in its own process, the small random-weight pi0.5, a fake robot over real DDS.

One node run (CPU config, 50 Hz or slower where this machine is slow (``paced_dt``), 20-action chunks,
guided RTC, one compressed camera, the instruction latched before the node starts) is recorded once for
the module; each test checks one property of what came out. Assertions are on order and content, never on
tight timing.
"""
import math

import numpy as np
import pytest

from node_harness import (DT, FakeRobot, NodeProcess, command_action, command_stamp_ns, diagnostics_status,
                          diagnostics_values, make_small_checkpoint, paced_dt, require_tokenizer)
from phyai_ros.control import COUNTERS
from phyai_ros.control.clock import stamp_to_ns
from phyai_ros.messages import msg_to_chunk, msg_to_margin

pytestmark = pytest.mark.ros
N_CHUNKS = 10
MAX_CHUNKS = 40     # a loaded machine misses deadlines: the run goes on until 3 pairs were on time, up to this


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Start the node, feed it for N_CHUNKS chunks, stop it; the robot keeps what it received."""
    tokenizer = require_tokenizer()
    ckpt = make_small_checkpoint(tmp_path_factory.mktemp("pi05_small"))
    dt = paced_dt(ckpt, tokenizer)
    node = NodeProcess(ckpt, tokenizer, overrides={"control.dt": dt})
    robot = FakeRobot(node.params)
    try:
        robot.set_instruction("pick up the red cup")  # latched, before the node is up: it must still get it
        assert robot.wait_for_node(timeout=90), node.output()
        ok = robot.spin_until(lambda: len(robot.chunks) >= N_CHUNKS and len(robot.margins) >= N_CHUNKS - 1
                              and (len(_on_time(robot)) >= 3 or len(robot.chunks) >= MAX_CHUNKS),
                              timeout=min(150 * dt / DT, 450))
        assert ok, f"{len(robot.chunks)} chunks, {len(robot.margins)} margins (dt {dt}); node said:\n{node.output()}"
        robot.spin_for(1.5)  # a few more diagnostics reports and commands after the last chunk
        assert node.alive, node.output()
    finally:
        robot.close()
        print(node.stop())  # shown by pytest when a test fails
    return robot


def chunks(run):
    return [msg_to_chunk(r.msg) for r in run.chunks]


def _on_time(run):
    reports = {m.chunk_seq: m for m in (msg_to_margin(r.msg) for r in run.margins)}
    cs = chunks(run)
    return [(prev, cur) for prev, cur in zip(cs, cs[1:])
            if prev.seq in reports and cur.seq in reports and not reports[prev.seq].expired
            and not reports[cur.seq].expired and not reports[cur.seq].margin < 0]


def on_time_pairs(run):
    """(previous, current) chunk pairs in which the previous one was executed and the current one met its
    deadline, by the node's own margin reports: what the timing properties below are about. On a machine
    too loaded to keep up, the node says which chunks expired or missed; those pairs are the monitor's
    business (test_control_overload), not these tests'."""
    pairs = _on_time(run)
    reports = {m.chunk_seq: m for m in (msg_to_margin(r.msg) for r in run.margins)}
    assert len(pairs) >= 3, f"only {len(pairs)} chunk pairs on time: {[(m.chunk_seq, m.margin, m.expired) for m in reports.values()]}"
    return pairs


def test_chunks_arrive_in_sequence_with_action0_stamps_on_the_dt_grid(run):
    p = run.params
    cs = chunks(run)
    dt_ns = round(p["control.dt"] * 1e9)
    assert [c.seq for c in cs] == list(range(cs[0].seq, cs[0].seq + len(cs))), "sequence numbers skip or repeat"
    for c in cs:
        assert c.actions.shape == (p["control.horizon"], len(p["control.action_names"]))
        assert c.action_names == tuple(p["control.action_names"])
        assert c.model_id == p["model.id"] and c.dt_ns == round(p["control.dt"] * 1e9)
        assert c.observation_stamp_ns <= c.t0_ns < c.observation_stamp_ns + 2 * 10**9, "action 0 is after the observation"
        assert c.inference_latency > 0
    for prev, cur in zip(cs, cs[1:]):
        # Every chunk after the first is placed on its predecessor's grid, later in time.
        assert cur.t0_ns > prev.t0_ns
        assert (cur.t0_ns - prev.t0_ns) % dt_ns == 0, "chunk stamps are off the dt grid"
    for prev, cur in on_time_pairs(run):
        assert cur.t0_ns - prev.t0_ns < prev.horizon * dt_ns, "a chunk on time started after its predecessor ran out"


def test_chunk_is_also_published_as_a_joint_trajectory(run):
    by_stamp = {c.t0_ns: c for c in chunks(run)}
    assert len(run.chunk_trajectories) >= len(by_stamp) - 1
    for r in run.chunk_trajectories:
        traj = r.msg
        c = by_stamp[stamp_to_ns(traj.header.stamp)]
        assert list(traj.joint_names) == list(c.action_names)
        assert len(traj.points) == c.horizon
        for i, point in enumerate(traj.points):
            assert point.time_from_start.sec * 10**9 + point.time_from_start.nanosec == i * c.dt_ns
            np.testing.assert_array_equal(np.asarray(point.positions), c.actions[i].astype(np.float64))


def action_for(chunk, t_ns):
    """The action chunk `chunk` holds for time t (hold_last past its end), or None before its start."""
    dt_ns = chunk.dt_ns
    if t_ns < chunk.t0_ns or (t_ns - chunk.t0_ns) % dt_ns:
        return None
    return chunk.actions[min((t_ns - chunk.t0_ns) // dt_ns, chunk.horizon - 1)].astype(np.float64)


def test_action_timer_emits_in_time_order_without_replaying_the_past(run):
    cs = chunks(run)
    dt_ns = round(run.params["control.dt"] * 1e9)
    stamps = [command_stamp_ns(r.msg) for r in run.commands]
    assert len(stamps) > 3 * run.params["control.horizon"]
    steps = np.diff(stamps)
    assert np.all(steps > 0), "a command repeated or went back in time"
    assert np.all(steps % dt_ns == 0), "command stamps are off the dt grid"
    assert np.median(steps) == dt_ns
    # Each command is the action some received chunk holds for that stamp, and the chunk it comes
    # from never goes back to an older one (a late chunk's past actions are skipped, not replayed).
    current = newest = cs[0].seq
    matched = 0
    for r, t in zip(run.commands, stamps):
        if t < cs[0].t0_ns:
            continue
        a = command_action(r.msg)
        sources = [c.seq for c in cs if (b := action_for(c, t)) is not None and np.array_equal(a, b)]
        if not sources and t >= cs[-1].t0_ns:
            continue  # from a chunk that arrived after the recording stopped
        assert sources, f"command at {t} matches no chunk's action for that time"
        later = [s for s in sources if s >= current]
        assert later, f"command at {t} replays chunk {max(sources)} after chunk {current} took over"
        current = min(later)
        newest = max(newest, max(sources))
        matched += 1
    assert matched > 3 * run.params["control.horizon"]
    assert newest >= cs[-2].seq, "the timer did not follow the newest chunks"


def test_rtc_frozen_prefix_equals_previous_chunk_for_the_same_times(run):
    cs = chunks(run)
    dt_ns = round(run.params["control.dt"] * 1e9)
    frozen = 0
    for prev, cur in on_time_pairs(run):
        d = cur.d
        offset = (cur.t0_ns - prev.t0_ns) // dt_ns
        assert offset + d <= prev.horizon, "frozen prefix reaches past the previous chunk"
        if d:
            frozen += 1
            np.testing.assert_allclose(cur.actions[:d], prev.actions[offset:offset + d], rtol=0, atol=1e-6)
    assert frozen >= 1, [c.d for c in cs]
    # Inference spans more than a tick at the paced rate, so the measured delay (and so d) is non-zero for most
    # chunks, on time or not (a loaded machine may leave only a few pairs on time).
    assert sum(c.d > 0 for c in cs[1:]) >= len(cs) // 2, [c.d for c in cs]


def test_margin_figures_are_finite_and_consistent(run):
    p = run.params
    margins = [msg_to_margin(r.msg) for r in run.margins]
    inference = {c.inference_latency for c in chunks(run)}
    steady = 0
    for m in margins:
        segments = [m.latency_observe, m.latency_transfer, m.latency_queue, m.latency_inference,
                    m.latency_actuate]
        assert all(math.isfinite(s) and s >= 0 for s in segments), m
        assert m.latency_inference in inference, "margin report for a chunk that was not published"
        assert m.target == pytest.approx(1 - p["margin.eps"])
        assert m.level in (0, 1, 2) and m.message
        if m.level == 0:
            assert m.window_size >= p["margin.min_samples"] and m.p_nonnegative_lower >= m.target
        if m.window_size < p["margin.min_samples"]:
            assert m.level != 0
        if math.isnan(m.budget):  # nothing was executing (the startup chunk, or after an expired one): no budget
            assert math.isnan(m.margin)
            continue
        steady += 1
        assert m.budget > 0 or m.margin < 0, m   # B_ctrl <= 0 only for a chunk that missed (an overload)
        assert m.margin == pytest.approx(m.budget - sum(segments), abs=1e-6)
        assert 0 <= m.p_nonnegative_lower <= m.p_nonnegative <= 1
        assert m.margin_p99 <= m.margin_p95 <= m.margin_p50
        assert 1 <= m.window_size <= p["margin.window"]
    expired = sum(m.expired for m in margins)
    assert steady >= len(margins) - 2 - expired


def test_diagnostics_margin_level_matches_the_margin_topic(run):
    margins = [msg_to_margin(r.msg) for r in run.margins]
    compared = 0
    for r in run.diagnostics:
        status = diagnostics_status(r.msg, "control margin")
        values = diagnostics_values(status)
        if "margin_s" not in values:  # before the first chunk (or tick): never OK; ERROR once later than a horizon
            waiting = ("waiting for the first chunk", "the action timer has not run yet")
            late = ("no chunk adopted since start", "the action timer has not run for")
            assert (status.level[0] == 1 and status.message.startswith(waiting)) or \
                (status.level[0] == 2 and status.message.startswith(late)), status
            continue
        if status.message.startswith("no chunk adopted"):   # the watchdog overrides a late chunk's report
            assert status.level[0] == 2, status
            continue
        same = [m for m in margins if f"{m.margin:.6g}" == values["margin_s"] and m.message == status.message]
        assert same, f"/diagnostics reports margin {values['margin_s']} that never appeared on the margin topic"
        assert status.level[0] == same[-1].level, (status.message, same[-1])
        compared += 1
    assert compared >= 2


def test_diagnostics_report_every_counter(run):
    reports = [r.msg for r in run.diagnostics]
    status = diagnostics_status(reports[-1], "inputs and loop")
    values = diagnostics_values(status)
    assert set(COUNTERS) <= set(values), set(COUNTERS) - set(values)
    assert status.hardware_id == run.params["model.id"]
    counters = {k: int(values[k]) for k in COUNTERS}
    assert counters["chunks"] >= N_CHUNKS and counters["inference_errors"] == 0
    assert counters["bad_image"] == counters["bad_state"] == counters["callback_errors"] == 0
    assert counters["ticks"] > counters["chunks"]
