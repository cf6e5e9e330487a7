"""The node's clock cannot be changed or stall silently (issue 38, item 1), over real DDS.

``use_sim_time`` is rclpy's own parameter, writable where every other one is read-only: set to true at run time
with nothing on /clock it froze the action timer, chunks and /diagnostics at once, the last status staying OK.
While active the node refuses the change, with the reason; and a /clock that stops (a simulator or a replay
that died) turns the "control margin" status to ERROR within seconds, naming the clock.
"""
import time

import pytest

from node_harness import FakeRobot, NodeProcess, diagnostics_status, make_small_checkpoint, require_tokenizer

pytestmark = pytest.mark.ros


def _set_use_sim_time(robot: FakeRobot, value: bool, timeout: float = 20.0):
    """SetParameters on the node's own service, from the robot's participant: the service's result."""
    from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
    from rcl_interfaces.srv import SetParameters

    client = robot.node.create_client(SetParameters, "/phyai_policy/set_parameters")
    try:
        assert robot.spin_until(client.service_is_ready, timeout), "no set_parameters service"
        request = SetParameters.Request(parameters=[Parameter(
            name="use_sim_time", value=ParameterValue(type=ParameterType.PARAMETER_BOOL, bool_value=value))])
        future = client.call_async(request)
        assert robot.spin_until(future.done, timeout), "set_parameters did not answer"
        return future.result().results[0]
    finally:
        robot.node.destroy_client(client)


def _margin_levels(robot: FakeRobot, since: float) -> list:
    out = []
    for r in robot.diagnostics:
        status = diagnostics_status(r.msg, "control margin")
        if r.t >= since and status is not None:
            out.append((status.level[0], status.message))
    return out


def test_use_sim_time_cannot_be_switched_on_while_active(tmp_path):
    node = NodeProcess(make_small_checkpoint(tmp_path / "pi05_small"), require_tokenizer())
    robot = FakeRobot(node.params)
    try:
        assert robot.wait_for_node(timeout=90), node.output()
        robot.set_instruction("wipe the table")
        assert robot.spin_until(lambda: len(robot.chunks) >= 2, timeout=60), node.output()
        result = _set_use_sim_time(robot, True)
        assert not result.successful, "use_sim_time switched on under an active node"
        assert "use_sim_time" in result.reason and "active" in result.reason, result.reason
        # the node goes on acting on its clock
        seq, t = robot.last_seq(), time.monotonic()
        assert robot.wait_chunks_after(seq, count=2, timeout=30), node.output()
        assert robot.wait_commands(count=10, timeout=10), node.output()
        assert robot.spin_until(lambda: len(_margin_levels(robot, t)) >= 2, timeout=10)
        assert node.alive
    finally:
        robot.close()
        print(node.stop())


def test_a_stalled_clock_turns_the_margin_status_to_error(tmp_path):
    node = NodeProcess(make_small_checkpoint(tmp_path / "pi05_small"), require_tokenizer(), use_sim_time=True)
    robot = FakeRobot(node.params, sim_time=True)
    try:
        assert robot.wait_for_node(timeout=90), node.output()
        robot.set_instruction("wipe the table")
        assert robot.spin_until(lambda: len(robot.chunks) >= 2, timeout=60), node.output()
        robot.clock_timer.cancel()   # /clock stops: the node's ROS time stands still
        t_stall = time.monotonic()
        errors = lambda: [m for level, m in _margin_levels(robot, t_stall) if level == 2]  # noqa: E731
        assert robot.spin_until(lambda: bool(errors()), timeout=15), \
            f"{_margin_levels(robot, t_stall)}\n{node.output()}"
        assert "/clock" in errors()[0] and "action timer has not run" in errors()[0], errors()[0]
        assert time.monotonic() - t_stall < 10
        # the clock comes back: so does control
        robot.clock_timer.reset()
        seq = robot.last_seq()
        assert robot.wait_chunks_after(seq, count=2, timeout=30), node.output()
        assert node.alive
    finally:
        robot.close()
        print(node.stop())


def test_sim_time_without_any_clock_is_an_error_not_silence(tmp_path):
    node = NodeProcess(make_small_checkpoint(tmp_path / "pi05_small"), require_tokenizer(), use_sim_time=True)
    robot = FakeRobot(node.params)   # no /clock at all: the node's ROS time never starts
    try:
        t = time.monotonic()
        errors = lambda: [m for level, m in _margin_levels(robot, t) if level == 2]  # noqa: E731
        assert robot.spin_until(lambda: bool(errors()), timeout=90), node.output()
        assert "is /clock published?" in errors()[0], errors()[0]
        assert node.alive
    finally:
        robot.close()
        print(node.stop())
