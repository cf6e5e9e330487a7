"""The executor thread stays free (issue 22): a slow prompt check of a new instruction must not hold the action timer,
and a stall of the executor must be named on /diagnostics (missed_slots among the problems of its WARN).

The node is built in this process (``PolicyNode`` with the real small pi0.5 adapter, spun by its own executor
thread, as ``main()`` does) so that the policy's task check can be slowed and the executor stalled on purpose;
everything it publishes is received over real DDS by the fake robot, a separate DDS participant.
"""
import threading
import time

import pytest

from node_harness import (DT, FakeRobot, make_small_checkpoint, node_params, node_ros_args, require_tokenizer,
                          with_test_defaults)

pytestmark = pytest.mark.ros


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    from phyai_ros.node.main import PolicyNode, start

    tokenizer = require_tokenizer()
    ckpt = make_small_checkpoint(tmp_path_factory.mktemp("pi05_small"))
    overrides = with_test_defaults()
    context = rclpy.Context()
    rclpy.init(context=context)
    node = PolicyNode(context=context,
                      cli_args=["--ros-args", *node_ros_args(ckpt, tokenizer, overrides=overrides)])
    start(node)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    robot = FakeRobot(node_params(ckpt, tokenizer, overrides=overrides))
    try:
        assert robot.wait_for_node(timeout=60)
        robot.set_instruction("open the drawer")
        assert robot.spin_until(lambda: len(robot.chunks) >= 2, timeout=60), robot.counters()
        yield node, robot
    finally:
        robot.close()
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown(context=context)


def longest_command_gap(robot, since: float) -> float:
    times = [since] + [r.t for r in robot.commands if r.t > since]
    return max(b - a for a, b in zip(times, times[1:])) if len(times) > 1 else float("inf")


def test_a_slow_prompt_check_does_not_hold_the_executor(live):
    """The new task's fit to the prompt budget (tokenising) takes 2 s here: commands go on at their rate meanwhile,
    and the task is taken at once."""
    node, robot = live
    adapter = node.policy.adapter
    real_fit, entered = adapter.fit_task, threading.Event()

    def slow_fit(task, state=None):
        entered.set()
        time.sleep(2.0)
        return real_fit(task, state)
    adapter.fit_task = slow_fit
    try:
        since = time.monotonic()
        robot.set_instruction("stack the blocks")
        assert robot.spin_until(lambda: entered.is_set(), timeout=10)
        robot.spin_for(2.5)
        assert node.loop.buffer.instruction == "stack the blocks"
        gap = longest_command_gap(robot, since)
        assert gap < 1.0, f"no command for {gap:.2f} s (dt {DT} s) while the task was checked"
    finally:
        adapter.fit_task = real_fit
    assert robot.spin_until(lambda: node._task_fitter.idle(), timeout=10)


def test_an_executor_stall_is_named_by_the_warn(live):
    """A callback that holds the executor 0.3 s (15 slots at 50 Hz) makes the action timer skip slots: the next
    /diagnostics 'inputs and loop' WARN names missed_slots, so a stall says why."""
    node, robot = live
    stalled = []

    def stall():
        if not stalled:
            stalled.append(time.monotonic())
            time.sleep(0.3)
    timer = node.create_timer(0.05, stall)
    try:
        since = time.monotonic()
        assert robot.spin_until(lambda: any("missed_slots" in m for m in robot.input_warnings(since=since)),
                                timeout=10), (robot.input_warnings(since=since), robot.counters())
    finally:
        node.destroy_timer(timer)
    assert stalled and robot.counters()["missed_slots"] > 0
