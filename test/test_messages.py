"""The generated messages cross real DDS between processes intact; malformed ones are rejected."""
import dataclasses
import math

import numpy as np
import pytest

from phyai_ros.control.clock import stamp_to_ns
from phyai_ros.control.margin import MarginReport
from phyai_ros.messages import (MalformedMessageError, chunk_to_msg, margin_to_msg, msg_to_chunk,
                                msg_to_margin, ns_to_time)
from ros_helpers import spawn_python, spin_until, stop
from sample_messages import sample_chunk, sample_margin

# The fields of a chunk that travel (the rest is the loop's bookkeeping).
CHUNK_WIRE_FIELDS = ("seq", "t0_ns", "dt_ns", "d", "observation_stamp_ns", "model_id", "action_names",
                     "frame_id", "inference_latency")


def wire_fields(margin: MarginReport) -> dict:
    """A margin report's fields that travel: every ControlMargin field (the stamp as stamp_ns)."""
    from phyai_ros.msg import ControlMargin
    names = ["stamp_ns" if n == "stamp" else n for n in ControlMargin.get_fields_and_field_types()]
    return {n: getattr(margin, n) for n in names}


@pytest.mark.ros
def test_chunk_and_margin_cross_dds_between_processes_intact():
    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    from phyai_ros.msg import ActionChunk, ControlMargin

    peer = spawn_python(["test/sample_messages.py"])
    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        node = rclpy.create_node("phyai_sample_listener", context=context)
        got = {}
        node.create_subscription(ActionChunk, "/phyai_test/chunk", lambda m: got.setdefault("chunk", m), 10)
        node.create_subscription(ControlMargin, "/phyai_test/margin", lambda m: got.setdefault("margin", m), 10)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        ok = spin_until(executor, lambda: len(got) == 2, timeout=30.0)
        assert ok, f"no messages from the peer process; it said:\n{stop(peer)}"
    finally:
        rclpy.shutdown(context=context)
        stop(peer)

    expected = sample_chunk()
    chunk = msg_to_chunk(got["chunk"])
    assert chunk.actions.shape == (50, 32) and chunk.actions.dtype == np.float32
    np.testing.assert_array_equal(chunk.actions, expected.actions)  # bit-exact float32
    for field in CHUNK_WIRE_FIELDS:
        assert getattr(chunk, field) == getattr(expected, field), field

    margin = msg_to_margin(got["margin"])
    assert isinstance(margin, MarginReport)
    assert wire_fields(margin) == wire_fields(sample_margin())


def test_the_loops_chunk_and_margin_report_are_the_messages_types():
    """What the control loop produces goes to the message and back as the same type, every field that
    travels unchanged; the margin report carries every ControlMargin field by the message's name."""
    from phyai_ros.control.margin import LatencyRecord, MarginMonitor
    rec = LatencyRecord(stamp_ns=10**9, recv_ns=10**9 + 3 * 10**6, snapshot_ns=10**9 + 5 * 10**6,
                        ready_ns=10**9 + 90 * 10**6, cover_end_ns=10**9 + 400 * 10**6, inference_ns=70 * 10**6)
    chunk = dataclasses.replace(sample_chunk(), inference_latency=None, latency=rec, n_prefix=9, rtc_mode="guided",
                                epoch=2)
    assert chunk.inference_latency == pytest.approx(0.070)  # from the latency record
    back = msg_to_chunk(chunk_to_msg(chunk))
    assert {f: getattr(back, f) for f in CHUNK_WIRE_FIELDS} == {f: getattr(chunk, f) for f in CHUNK_WIRE_FIELDS}
    assert (back.latency, back.n_prefix, back.rtc_mode, back.epoch) == (None, 0, "off", 0)

    report = MarginMonitor(window=50, min_samples=1).add_chunk(rec, seq=7, consumed=2, now_ns=2 * 10**9)
    got = msg_to_margin(margin_to_msg(report))
    assert wire_fields(got) == wire_fields(report)
    assert got.budget == pytest.approx(0.4) and got.window_size == 1 and got.chunk_seq == 7
    assert got.in_window is None and report.in_window is True and report.consumed == 2


def test_actions_length_must_match_horizon_times_dim():
    msg = chunk_to_msg(sample_chunk())
    msg.actions = np.zeros(50 * 32 - 1, dtype=np.float32)
    with pytest.raises(MalformedMessageError, match=r"1599 values in actions, expected horizon\*action_dim = 50\*32 = 1600"):
        msg_to_chunk(msg)


@pytest.mark.parametrize("mutate, match", [
    (lambda m: setattr(m, "horizon", 0), "must be positive"),
    (lambda m: setattr(m, "action_names", ["a", "b"]), "2 action_names for action_dim 32"),
    (lambda m: setattr(m, "frozen_prefix", 51), "frozen_prefix 51 exceeds horizon 50"),
    (lambda m: setattr(m, "dt", 0.0), "dt must be positive"),
    (lambda m: m.actions.__setitem__(3, math.nan), "NaN or inf"),
])
def test_inconsistent_chunks_are_rejected(mutate, match):
    msg = chunk_to_msg(sample_chunk())
    mutate(msg)
    with pytest.raises(MalformedMessageError, match=match):
        msg_to_chunk(msg)


def test_chunk_to_msg_checks_its_input():
    chunk = sample_chunk()
    with pytest.raises(ValueError, match="must be \\[H, D\\]"):
        chunk_to_msg(dataclasses.replace(chunk, actions=chunk.actions.reshape(-1)))
    with pytest.raises(ValueError, match="3 action names"):
        chunk_to_msg(dataclasses.replace(chunk, action_names=("a", "b", "c")))


def test_time_round_trip_and_margin_level_check():
    for ns in (0, 1, 999_999_999, 1_000_000_000, 1_764_000_123_456_789_012):
        assert stamp_to_ns(ns_to_time(ns)) == ns
    with pytest.raises(ValueError):
        ns_to_time(-1)
    with pytest.raises(ValueError, match="OK\\(0\\), WARN\\(1\\) or ERROR\\(2\\)"):
        margin_to_msg(dataclasses.replace(sample_margin(), level=7))
