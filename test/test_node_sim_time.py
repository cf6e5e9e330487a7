"""Bag replay with simulated time: the node runs with use_sim_time and follows /clock; when the
clock jumps back (the bag loops), the jump is counted and reported, the node resets its
observation buffer and chunk timeline, and goes on acting on the new timeline.

This node publishes commands as std_msgs/Float64MultiArray (the other output type) and gets its
instruction from a volatile publisher (the other instruction QoS).
"""
import time

import numpy as np
import pytest

from node_harness import FakeRobot, NodeProcess, make_small_checkpoint, paced_dt, require_tokenizer

pytestmark = pytest.mark.ros
SIM_START_NS = 500 * 10**9  # far from the wall clock: a stamp on the wrong clock cannot pass


def test_clock_jump_back_under_sim_time(tmp_path):
    tokenizer = require_tokenizer()
    ckpt = make_small_checkpoint(tmp_path / "pi05_small")
    # 50 Hz, or slower on a machine too slow to keep chunks ahead of the timer at that rate
    node = NodeProcess(ckpt, tokenizer, use_sim_time=True,
                       overrides={"output.command_type": "float64_multi_array", "control.dt": paced_dt(ckpt, tokenizer)})
    # The instruction comes from a volatile publisher here (as from a bag replay or `ros2 topic pub`).
    robot = FakeRobot(node.params, sim_time=True, sim_start_ns=SIM_START_NS, latched_instruction=False)
    try:
        assert robot.wait_for_node(timeout=90), node.output()
        robot.set_instruction("wipe the table")
        assert robot.spin_until(lambda: len(robot.chunks) >= 3, timeout=60), node.output()
        before = robot.counters()
        # Stamps are simulated time, not the wall clock.
        for r in robot.chunks:
            assert SIM_START_NS < r.msg.header.stamp.sec * 10**9 < SIM_START_NS + 120 * 10**9
        first_t0 = robot.chunks[0].msg.header.stamp.sec
        # commands follow the control timer, not the chunks: on a loaded machine three chunks can arrive before
        # ten commands (one full-suite run counted 8)
        assert robot.spin_until(lambda: len(robot.commands) > 10, timeout=30), node.output()
        last_seq, n_commands = robot.last_seq(), len(robot.commands)
        assert n_commands > 10 and all(len(r.msg.data) == len(node.params["control.action_names"])
                                       for r in robot.commands)

        t_jump = time.monotonic()
        robot.jump_clock(-(robot.now_ns() - SIM_START_NS) / 1e9 - 5.0)  # back to before the first chunk
        assert robot.wait_counter("clock_jumps", before["clock_jumps"], timeout=30), \
            f"{robot.counters()}\n{node.output()}"
        assert robot.wait_chunks_after(last_seq, count=3, timeout=60), node.output()
        after = [r.msg for r in robot.chunks if r.msg.seq > last_seq]
        # New chunks live on the restarted timeline, with sequence numbers still increasing.
        late = [m for m in after if m.header.stamp.sec >= first_t0]
        assert len(late) <= 1, "chunks kept the pre-jump timeline"  # one computed before the jump may slip
        new = [m for m in after if m.header.stamp.sec < first_t0]
        assert len(new) >= 2 and np.all(np.diff([m.seq for m in new]) > 0)
        dt_ns = round(node.params["control.dt"] * 1e9)
        stamps = [m.header.stamp.sec * 10**9 + m.header.stamp.nanosec for m in new]
        assert all((b - a) % dt_ns == 0 and b > a for a, b in zip(stamps, stamps[1:]))
        assert robot.wait_commands(count=10, timeout=10)
        assert any("clock_jumps" in m for m in robot.input_warnings(since=t_jump))
        assert node.alive
        counters = robot.counters()
        assert counters["callback_errors"] == 0 and counters["worker_crashes"] == 0, counters
    finally:
        robot.close()
        print(node.stop())
