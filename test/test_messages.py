"""The generated messages cross real DDS between processes intact; malformed ones are rejected."""
import math

import numpy as np
import pytest

from phyai_ros.messages import (MalformedMessageError, chunk_to_msg, margin_to_msg, msg_to_chunk,
                                msg_to_margin, ns_to_time, time_to_ns)
from ros_helpers import spawn_python, spin_until, stop
from sample_messages import MARGIN_STAMP_NS, sample_chunk_data, sample_margin_values


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

    expected = sample_chunk_data()
    chunk = msg_to_chunk(got["chunk"])
    assert chunk.actions.shape == (50, 32) and chunk.actions.dtype == np.float32
    np.testing.assert_array_equal(chunk.actions, expected.actions)  # bit-exact float32
    for field in ("seq", "t0_ns", "observation_ns", "dt", "frozen_prefix", "action_names",
                  "model_id", "inference_latency", "frame_id"):
        assert getattr(chunk, field) == getattr(expected, field), field

    margin = msg_to_margin(got["margin"])
    assert margin.pop("stamp_ns") == MARGIN_STAMP_NS
    assert margin == sample_margin_values()


def test_actions_length_must_match_horizon_times_dim():
    msg = chunk_to_msg(sample_chunk_data())
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
    msg = chunk_to_msg(sample_chunk_data())
    mutate(msg)
    with pytest.raises(MalformedMessageError, match=match):
        msg_to_chunk(msg)


def test_chunk_to_msg_checks_its_input():
    data = sample_chunk_data()
    with pytest.raises(ValueError, match="must be \\[H, D\\]"):
        chunk_to_msg(data.__class__(**{**data.__dict__, "actions": data.actions.reshape(-1)}))
    with pytest.raises(ValueError, match="3 action names"):
        chunk_to_msg(data.__class__(**{**data.__dict__, "action_names": ("a", "b", "c")}))


def test_time_round_trip_and_margin_level_check():
    for ns in (0, 1, 999_999_999, 1_000_000_000, 1_764_000_123_456_789_012):
        assert time_to_ns(ns_to_time(ns)) == ns
    with pytest.raises(ValueError):
        ns_to_time(-1)
    with pytest.raises(ValueError, match="OK\\(0\\), WARN\\(1\\) or ERROR\\(2\\)"):
        margin_to_msg(0, {**sample_margin_values(), "level": 7})
