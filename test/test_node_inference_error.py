"""An exception inside inference (and a chunk with NaN, and a stalled inference) does not stop the
node, and the action timer does not wait for inference.

The node is built in this process (``PolicyNode`` with the real small pi0.5 adapter, spun by
its own executor thread, as ``main()`` does) so that its policy can be wrapped to fail on
chosen calls; everything it publishes is received over real DDS by the fake robot, a
separate DDS participant.
"""
import math
import threading
import time

import numpy as np
import pytest

from node_harness import (HORIZON, FakeRobot, diagnostics_counters, make_small_checkpoint, node_params, node_ros_args,
                          paced_dt, require_tokenizer, with_test_defaults)

pytestmark = pytest.mark.ros


class FailingPolicy:
    """The node's real policy, except that chosen calls raise, return a chunk with NaN, or take
    ``slow_s`` longer (a stall: the GPU busy with something else, a page fault storm)."""

    def __init__(self, policy, raise_on, nan_on, slow_on, slow_s=1.0):
        self.policy, self.raise_on, self.nan_on, self.slow_on = policy, set(raise_on), set(nan_on), set(slow_on)
        self.slow_s = slow_s
        self.calls = 0
        self.slow_window = None

    def __call__(self, snapshot, rtc=None):
        self.calls += 1
        if self.calls in self.raise_on:
            raise RuntimeError(f"injected failure in call {self.calls}")
        if self.calls in self.slow_on:
            start = time.monotonic()
            time.sleep(self.slow_s)
            self.slow_window = (start, time.monotonic())
        actions = self.policy(snapshot, rtc)
        if self.calls in self.nan_on:
            actions = actions.copy()
            actions[3, 1] = math.nan
        return actions


def test_exception_inside_inference_is_counted_and_the_node_keeps_publishing(tmp_path):
    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    from phyai_ros.node.main import PolicyNode, start

    tokenizer = require_tokenizer()
    ckpt = make_small_checkpoint(tmp_path / "pi05_small")
    # The stall's tick count is an on-time property: paced to this machine, and the stall 40 ticks (>= 2 s) long, so a
    # timer that waited for the stalled inference leaves a gap an order of magnitude above a late tick's.
    dt = paced_dt(ckpt, tokenizer)
    stall_s = max(2.0, 40 * dt)
    chunk_s = HORIZON * dt   # waits for chunks scale with how long one lasts at the paced rate
    overrides = with_test_defaults({"control.dt": dt})

    context = rclpy.Context()
    rclpy.init(context=context)
    node = PolicyNode(context=context, cli_args=["--ros-args", *node_ros_args(ckpt, tokenizer, overrides=overrides)])
    start(node)
    policy = FailingPolicy(node.loop.policy, raise_on={3, 4}, nan_on={6}, slow_on={8}, slow_s=stall_s)
    node.loop.policy = policy
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    robot = FakeRobot(node_params(ckpt, tokenizer, overrides=overrides))
    try:
        assert robot.wait_for_node(timeout=60)
        robot.set_instruction("open the drawer")
        ok = robot.spin_until(lambda: len(robot.chunks) >= 6 and robot.counters().get("bad_chunks", 0) >= 1,
                              timeout=max(60, 10 * chunk_s))
        assert ok, (len(robot.chunks), robot.counters())
        counters = robot.counters()
        assert counters["inference_errors"] == 2 and counters["bad_chunks"] == 1, counters
        assert counters["worker_crashes"] == 0 and counters["callback_errors"] == 0, counters
        assert any("inference_errors" in m for m in robot.input_warnings())
        assert any("bad_chunks" in m for m in robot.input_warnings())
        # Failed inferences take no sequence number; the chunks that did arrive are consecutive and finite.
        seqs = [r.msg.seq for r in robot.chunks]
        assert seqs == list(range(len(seqs)))
        assert all(np.all(np.isfinite(np.asarray(r.msg.actions))) for r in robot.chunks)
        assert policy.calls >= len(seqs) + 3
        # ... and it goes on: new chunks and commands after the failures.
        assert robot.wait_chunks_after(robot.last_seq(), count=2, timeout=max(30, 4 * chunk_s))
        assert robot.wait_commands(count=10, timeout=10 + 10 * dt)

        # The action timer never waits for inference: during a stall of one inference the commands keep
        # coming at about 1/dt (the chunk runs out: hold_last, deadline misses counted).
        assert robot.spin_until(lambda: policy.slow_window is not None, timeout=max(60, 4 * chunk_s))
        assert robot.wait_chunks_after(robot.last_seq(), count=2, timeout=max(30, 4 * chunk_s))
        start, end = policy.slow_window
        during = [r.t for r in robot.commands if start <= r.t <= end]
        assert len(during) >= 0.5 * (end - start) / dt, \
            f"{len(during)} commands during a {end - start:.2f} s stall at dt {dt}"
        gap = max(np.diff([start, *during, end]))
        assert gap < 0.25 * stall_s, f"the timer stalled with the inference: a {gap:.2f} s gap in a {stall_s} s stall"
        misses = [(r.t, diagnostics_counters(r.msg).get("deadline_misses")) for r in robot.diagnostics]
        before = [m for t, m in misses if m is not None and t <= start][-1]
        assert robot.spin_until(lambda: robot.counters()["deadline_misses"] > before, timeout=10 + chunk_s), \
            "the stall's deadline misses were not counted"
        assert spinner.is_alive()
    finally:
        robot.close()
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown(context=context)
        spinner.join(5)
