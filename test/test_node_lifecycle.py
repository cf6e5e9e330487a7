"""The node as a managed (lifecycle) node, driven over DDS through its lifecycle services as Nav2's manager or
`ros2 lifecycle set` would: configured it loads and buffers but commands nothing (and /diagnostics says so);
active it acts; deactivated it stops with the deadline policy's safe behaviour (hold_last: the last command once
more; stop: nothing); activated again it starts a fresh timeline; cleanup releases the policy; a failed configure
leaves it unconfigured and running, explained; shutdown finalizes it."""
from __future__ import annotations

import time

import numpy as np
import pytest

from node_harness import (FakeRobot, NodeProcess, command_action, diagnostics_status, make_small_checkpoint,
                          node_ros_args, require_tokenizer)

pytestmark = pytest.mark.ros

LIFECYCLE_SERVICES = ("change_state", "get_state", "get_available_states", "get_available_transitions",
                      "get_transition_graph")


class Lifecycle:
    """Clients of the node's lifecycle services, as a lifecycle manager holds them: on a participant of their own,
    spun together with the fake robot's executor (whose recordings go on meanwhile)."""

    def __init__(self, robot: FakeRobot, node: str = "/phyai_policy"):
        from lifecycle_msgs.srv import ChangeState, GetState
        self.robot = robot
        self._services = {"get": (GetState, f"{node}/get_state"), "change": (ChangeState, f"{node}/change_state")}
        self._types = (ChangeState, GetState)
        self._open()

    def _open(self) -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node("lifecycle_manager", context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._clients = {key: self.node.create_client(*spec) for key, spec in self._services.items()}

    def close(self) -> None:
        import rclpy
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)

    def spin_until(self, predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            self.executor.spin_once(timeout_sec=0.0)
            self.robot.executor.spin_once(timeout_sec=0.01)
        return predicate()

    def _ready(self, key: str):
        """The service's client once the service is discovered. Discovery can take long on a loaded 2-core CI
        machine while the node warms up (a full-suite run once needed more than 60 s; alone about one), and two
        full-suite runs never matched a client within 150-240 s while the node's topics flowed, where the next
        test's fresh participant matched at once: a client not matched within 30 s gets a fresh participant (a
        new discovery from scratch), for up to 240 s in all."""
        deadline = time.monotonic() + 240
        while True:
            client = self._clients[key]
            if self.spin_until(client.service_is_ready, min(30.0, max(deadline - time.monotonic(), 0.0))):
                return client
            assert time.monotonic() < deadline, f"lifecycle service {self._services[key][1]} not up"
            self.close()
            self._open()

    def _call(self, key: str, request, timeout: float = 120.0, resend_s: float = 0.0):
        """One request (a query is sent again every ``resend_s`` until answered: a reply can be lost while the
        client's response reader is still being discovered, which service_is_ready does not cover)."""
        client = self._ready(key)
        deadline = time.monotonic() + timeout
        while True:
            future = client.call_async(request)
            wait = min(resend_s or timeout, deadline - time.monotonic())
            if self.spin_until(future.done, max(wait, 0.0)):
                return future.result()
            assert time.monotonic() < deadline, "no answer"

    def state(self) -> str:
        return self._call("get", self._types[1].Request(), resend_s=5.0).current_state.label

    def transition(self, label: str) -> bool:
        from lifecycle_msgs.msg import Transition
        ids = {"configure": Transition.TRANSITION_CONFIGURE, "activate": Transition.TRANSITION_ACTIVATE,
               "deactivate": Transition.TRANSITION_DEACTIVATE, "cleanup": Transition.TRANSITION_CLEANUP,
               "shutdown": Transition.TRANSITION_INACTIVE_SHUTDOWN}
        request = self._types[0].Request()
        request.transition.id = ids[label]
        return self._call("change", request).success


def margin_message(robot: FakeRobot) -> str:
    for r in reversed(robot.diagnostics):
        status = diagnostics_status(r.msg, "control margin")
        if status is not None:
            return status.message
    return ""


@pytest.fixture
def checkpoint(tmp_path):
    return make_small_checkpoint(tmp_path / "pi05_small"), require_tokenizer()


def _start(checkpoint, autostart: str, **overrides):
    ckpt, tokenizer = checkpoint
    node = NodeProcess(ckpt, tokenizer, overrides={"lifecycle.autostart": autostart, **overrides})
    robot = FakeRobot(node.params)
    return node, robot, Lifecycle(robot)


def test_configured_inactive_active_deactivated_reactivated_cleaned_up(checkpoint):
    node, robot, lc = _start(checkpoint, "configured")
    try:
        robot.set_instruction("pick up the cup")
        assert robot.spin_until(lambda: "inactive (lifecycle)" in margin_message(robot), 90), node.output()
        assert lc.state() == "inactive"
        robot.spin_for(1.0)
        assert not robot.commands and not robot.chunks, "an inactive node commands nothing"

        assert lc.transition("activate") and lc.state() == "active"
        assert robot.spin_until(lambda: len(robot.chunks) >= 2 and len(robot.commands) >= 10, 60), node.output()
        first_seqs = [r.msg.seq for r in robot.chunks]

        assert lc.transition("deactivate") and lc.state() == "inactive"
        robot.spin_for(0.3)
        n_commands = len(robot.commands)
        held = command_action(robot.commands[-1].msg)
        robot.spin_for(1.5)
        assert len(robot.commands) == n_commands, "no command after deactivate but the held one"
        # hold_last: the final command repeats the last action the robot was given
        np.testing.assert_allclose(held, command_action(robot.commands[-2].msg))
        assert "inactive (lifecycle)" in margin_message(robot)

        assert lc.transition("activate")
        assert robot.spin_until(lambda: len(robot.commands) >= n_commands + 10, 60), node.output()
        assert [r.msg.seq for r in robot.chunks][-1] > first_seqs[-1]   # a fresh timeline, the same seq counter

        assert lc.transition("deactivate") and lc.transition("cleanup") and lc.state() == "unconfigured"
        assert lc.transition("configure") and lc.state() == "inactive"   # loads again
        assert lc.transition("shutdown") and lc.state() == "finalized"
    finally:
        lc.close()
        robot.close()
        log = node.stop()
    assert "configured: inputs are buffered" in log and "active: acting on the robot" in log, log[-3000:]


def test_deactivate_with_stop_publishes_nothing_more(checkpoint):
    node, robot, lc = _start(checkpoint, "active", **{"control.deadline_policy": "stop"})
    try:
        robot.set_instruction("pick up the cup")
        assert robot.spin_until(lambda: len(robot.commands) >= 10, 90), node.output()
        assert lc.transition("deactivate")
        robot.spin_for(0.3)
        n = len(robot.commands)
        robot.spin_for(1.5)
        assert len(robot.commands) == n
    finally:
        lc.close()
        robot.close()
        node.stop()


def test_unconfigured_start_and_a_failed_configure_keep_the_node_up(checkpoint, tmp_path):
    _, tokenizer = checkpoint
    node = NodeProcess(tmp_path / "no_such_checkpoint", tokenizer, overrides={"lifecycle.autostart": "unconfigured"})
    robot = FakeRobot(node.params)
    lc = Lifecycle(robot)
    try:
        assert lc.state() == "unconfigured"
        assert not lc.transition("configure")          # the checkpoint is missing: FAILURE, not a crash
        assert lc.state() == "unconfigured"
        assert node.proc.poll() is None, "the node keeps running for the manager to retry"
    finally:
        lc.close()
        robot.close()
        log = node.stop()
    assert "cannot configure: FileNotFoundError: model.checkpoint: no checkpoint folder" in log, log[-2000:]


def test_a_destroyed_node_leaves_no_lifecycle_services_behind(checkpoint, tmp_path):
    """A node destroyed in a process that goes on takes its lifecycle services out of the graph: left there (rclpy
    keeps them until garbage collection) they are ghosts that a later node of the same name shares its service
    names with."""
    import rclpy

    from phyai_ros.node.main import PolicyNode

    _, tokenizer = checkpoint
    context, observer_context = rclpy.Context(), rclpy.Context()
    rclpy.init(context=context)
    rclpy.init(context=observer_context)
    observer = rclpy.create_node("lifecycle_observer", context=observer_context)
    node = PolicyNode(context=context, cli_args=["--ros-args", *node_ros_args(
        tmp_path / "no_model_needed", tokenizer, overrides={"lifecycle.autostart": "unconfigured"})])

    expected = {f"/{node.get_name()}/{service}" for service in LIFECYCLE_SERVICES}

    def lifecycle_services():
        return {name for name, _ in observer.get_service_names_and_types()} & expected

    def settles(predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    destroyed = False
    try:
        assert settles(lambda: lifecycle_services() == expected, 60), lifecycle_services()
        node.destroy_node()
        destroyed = True
        assert settles(lambda: not lifecycle_services(), 30), f"left in the graph: {sorted(lifecycle_services())}"
    finally:
        if not destroyed:
            node.destroy_node()
        rclpy.try_shutdown(context=context)
        observer.destroy_node()
        rclpy.try_shutdown(context=observer_context)
