"""The onboard policy node: topics in, time-stamped chunks and per-tick commands out.

A thin rclpy shell around ``phyai_ros.control.ControlLoop``: subscriptions feed the
loop, a timer at 1/dt calls ``tick()`` and publishes the action whose time it is, the
loop's worker thread runs the policy and hands chunks back through ``on_chunk``.
Everything that can go wrong with inputs is counted by the loop and reported on
/diagnostics; nothing here raises into the executor.

Threads: the executor (one thread) runs subscriptions, the action timer and diagnostics; the
loop's worker thread runs inference and publishes each chunk as it is delivered. The timer
never waits for inference: it only takes the loop's short bookkeeping lock.

A managed (lifecycle) node: configure loads, warms up and captures the policy; activate starts the
action timer; deactivate applies the deadline policy's safe behaviour; cleanup releases everything.
``lifecycle.autostart`` (default ``active``) brings it there by itself at start; ``unconfigured`` leaves
the transitions to a lifecycle manager (``ros2 lifecycle set /phyai_policy configure``, Nav2's manager).

Run: ``python -m phyai_ros.node.main --ros-args --params-file config/pi05_cpu_test.yaml
-p model.checkpoint:=DIR -p model.tokenizer:=FILE`` (``ros2 run phyai_ros onboard_node`` or
``ros2 launch phyai_ros pi05_thor.launch.py`` on a ROS install). A node that cannot start logs
why and exits with status 1.
"""
from __future__ import annotations

import dataclasses
import gc
import sys
import time
from collections import deque
from typing import Callable, Optional

import numpy as np

from phyai_ros import needs_ros

with needs_ros(__name__):  # the one module that needs ROS to import: a missing ROS is one clear error
    import rclpy
    from builtin_interfaces.msg import Duration
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
    from rcl_interfaces.msg import SetParametersResult
    from rclpy.clock import Clock, ClockType
    from rclpy.event_handler import SubscriptionEventCallbacks
    from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
    from rclpy.lifecycle import LifecycleNode, TransitionCallbackReturn
    from sensor_msgs.msg import CompressedImage, Image, JointState
    from std_msgs.msg import Float64MultiArray, MultiArrayDimension, String
    from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint
    from phyai_ros.msg import ActionChunk, ControlMargin

from phyai_ros import diagnostics
from phyai_ros.control import CallableClock, ControlLoop, stamp_to_ns
from phyai_ros.messages import chunk_to_msg, margin_to_msg, ns_to_time
from phyai_ros.node.images import ImageConverter, ImageDecodeError
from phyai_ros.node.instruction import TaskFitter
from phyai_ros.node.logs import forwarded_logs
from phyai_ros.node.parameters import declare_and_read
from phyai_ros.node.qos import LATCHED, RELIABLE, SENSOR
from phyai_ros.policies import build_policy, resolved_parameters
from phyai_ros.runtime.transfer import pinned_array

_LEVEL_BYTES = {0: DiagnosticStatus.OK, 1: DiagnosticStatus.WARN, 2: DiagnosticStatus.ERROR}
# Counters whose growth during a diagnostics period turns the input status to WARN.
_INPUT_PROBLEMS = ("stale_snapshots", "bad_image", "bad_state", "missing_joint", "unknown_camera", "bad_input",
                   "out_of_order", "future_stamp", "clock_jumps", "inference_errors", "bad_chunks",
                   "deadline_misses", "missed_slots", "callback_errors", "truncated_instructions")


class PolicyNode(LifecycleNode):
    """A managed (lifecycle) node, as Nav2 and ros2_control deploy theirs. Construction declares and checks the
    parameters (cheap, no model). configure: load the policy, warm it up, capture its graphs, make the control loop,
    publishers, subscriptions and /diagnostics (inputs are buffered, nothing is commanded). activate: the action
    timer starts and commands flow. deactivate: the timer stops and the deadline policy's safe behaviour applies
    (hold_last / extrapolate_tail: the last command is published once more and held; stop: nothing more); a chunk
    in flight is discarded and control starts anew at the next activate. cleanup / shutdown: everything is
    released, the GPU memory included. ``lifecycle.autostart`` says how far the node brings itself at start."""

    def __init__(self, **kwargs):
        super().__init__(diagnostics.NODE_NAME, **kwargs)
        self.p = declare_and_read(self)
        self._names = list(self.p.control.action_names)
        self._images = ImageConverter(self.p.cameras.max_pixels)
        # A policy on this machine's GPU uploads frames that already lie in pinned memory without a staging copy:
        # the copy is made here, in the camera's callback, instead of on each chunk's path (runtime/transfer.py).
        self._stage_frame = pinned_array if self.p.policy.backend != "remote" and self.p.model.device == "cuda" \
            else None
        self._event_log_times: dict[str, float] = {}
        self._last_counters: dict[str, int] = {}
        self.policy = None
        self.loop: Optional[ControlLoop] = None
        self.active = False
        self.configure_error = ""
        self._action_timer = None
        self._clock_watchdog = None
        self._diagnostics_timer = None
        self._entities: list = []   # subscriptions, timers and publishers made at configure, destroyed at cleanup
        # Every parameter of the table is read-only; rclpy's own use_sim_time is not, and switched at run time (to
        # true with nothing on /clock) it would stop the action timer and every report at once.
        self.add_on_set_parameters_callback(self._on_set_parameters)

    # -- lifecycle ------------------------------------------------------------------------------
    def on_configure(self, state) -> TransitionCallbackReturn:
        try:
            self._configure()
        except Exception as exc:  # noqa: BLE001 - a failed configure leaves the node unconfigured, explained
            self.configure_error = f"{type(exc).__name__}: {exc}"
            self.get_logger().error(f"cannot configure: {self.configure_error}")
            self._release()
            return TransitionCallbackReturn.FAILURE
        self.configure_error = ""
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state) -> TransitionCallbackReturn:
        self._action_timer = self.create_timer(self.p.control.dt, self._guarded("action timer", self._tick))
        # On the steady clock: when ROS time stands still (use_sim_time and /clock stopped) the timers on it stop,
        # the diagnostics' included, and only this one can still say so (ControlLoop.timer_stalled).
        self._clock_watchdog = self.create_timer(self.p.diagnostics.period,
                                                 self._guarded("clock watchdog", self._watch_clock),
                                                 clock=Clock(clock_type=ClockType.STEADY_TIME))
        # The executor serves timers due together in the order they were made: the report follows the tick it
        # reports on (a stepped replay reads from it whether the tick's inference is still in flight).
        self._restart_diagnostics_timer()
        self.active = True
        self.get_logger().info("active: acting on the robot")
        return super().on_activate(state)

    def on_deactivate(self, state) -> TransitionCallbackReturn:
        self._stop_acting()
        return super().on_deactivate(state)

    def on_cleanup(self, state) -> TransitionCallbackReturn:
        self._release()
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state) -> TransitionCallbackReturn:
        if self.active:
            self._stop_acting()
        self._release()
        return TransitionCallbackReturn.SUCCESS

    def _configure(self) -> None:
        t = time.monotonic()
        with forwarded_logs(self.get_logger()):   # the profile's choice, the autotune's progress, the quantized plan
            self.policy = build_policy(self.p, robot_id=self.get_fully_qualified_name())
        self.p = resolved_parameters(self.p, self.policy)   # model.type and control.horizon: the checkpoint's
        m = self.p.model
        self.get_logger().info(f"policy {m.id} ({m.type}, H = {self.p.control.horizon}) ready in "
                               f"{time.monotonic() - t:.1f} s ({m.device}, {m.dtype})")
        if getattr(self.policy, "op_profile", None) is not None:   # onboard (the profile's line came through
            self.get_logger().info(self.policy.adapter.quantization())   # forwarded_logs): the checkpoint's scheme
        self._make_publishers()
        self.loop = ControlLoop(self.p.control_config(self.policy.image_input_size), self.policy,
                                clock=CallableClock(lambda: self.get_clock().now().nanoseconds),
                                on_chunk=self._publish_chunk, on_margin=self._publish_margin,
                                on_event=self._on_event)
        self._task_fitter = TaskFitter(lambda text, state: self.policy.adapter.fit_task(text, state),
                                       self._report_cut, lambda exc: self.loop.report_bad_input(
                                           "callback_errors", f"instruction: {type(exc).__name__}: {exc}"))
        self._make_subscriptions()
        self._restart_diagnostics_timer()
        self.get_logger().info("configured: inputs are buffered; activate to act")

    def _restart_diagnostics_timer(self) -> None:
        old = self._diagnostics_timer
        if old is not None and old in self._entities:
            self._entities.remove(old)
            self.destroy_timer(old)
        self._diagnostics_timer = self._made(self.create_timer(self.p.diagnostics.period,
                                                               self._guarded("diagnostics", self._publish_diagnostics)))

    def _stop_acting(self) -> None:
        """The action timer stops; the deadline policy's safe behaviour is the last word to the robot."""
        for timer in (self._action_timer, self._clock_watchdog):
            if timer is not None:
                self.destroy_timer(timer)
        self._action_timer = self._clock_watchdog = None
        self.active = False
        held = self.loop.pause() if self.loop is not None else None
        if held is not None:
            self._publish_command(held, self.get_clock().now().nanoseconds)
        self.get_logger().info("inactive: no more commands" + (" (the last one held)" if held is not None else ""))

    def _release(self) -> None:
        """Everything configure made, the policy and its device memory included."""
        for entity in reversed(self._entities):
            destroy = {"Timer": self.destroy_timer, "Subscription": self.destroy_subscription,
                       "LifecyclePublisher": self.destroy_lifecycle_publisher}.get(type(entity).__name__,
                                                                                    self.destroy_publisher)
            destroy(entity)
        self._entities.clear()
        self._diagnostics_timer = None
        if self.loop is not None:
            self.loop.close()
        if self.policy is not None:
            self.policy.release()
        self.loop, self.policy = None, None
        gc.collect()
        if _cuda_in_use():   # the policy ran on a GPU: its cached memory goes back too
            sys.modules["torch"].cuda.empty_cache()

    def _on_set_parameters(self, params) -> SetParametersResult:
        """Refuse a change of use_sim_time while active: the action timer, the stamps and the margins run on that
        clock, and one switched under them (to simulated time with nothing on /clock) stops control silently."""
        for param in params:
            if param.name == "use_sim_time" and self.active and self.has_parameter("use_sim_time") \
                    and param.value != self.get_parameter("use_sim_time").value:
                return SetParametersResult(successful=False, reason=(
                    "use_sim_time cannot change while the node is active (the action timer, stamps and margins run "
                    "on that clock): deactivate first, or restart the node with -p use_sim_time:=..."))
        return SetParametersResult(successful=True)

    def _watch_clock(self) -> None:
        """The report the stalled timers no longer make: /diagnostics with the watchdog's ERROR."""
        if self.active and self.loop is not None and self.loop.timer_stalled():
            self._publish_diagnostics()

    def _guarded(self, what: str, fn: Callable, with_info: bool = False) -> Callable:
        """An executor callback that cannot raise: an exception (a bug or an input no check foresaw) is
        counted under ``callback_errors`` and reported, and the node keeps running. ``with_info``: a
        subscription callback that also gets the message info (rclpy passes it to two-argument callbacks)."""
        def call(*args) -> None:
            try:
                fn(*args)
            except Exception as exc:  # noqa: BLE001 - nothing may propagate into the executor
                self.loop.report_bad_input("callback_errors", f"{what}: {type(exc).__name__}: {exc}")
        if with_info:
            return lambda msg, info: call(msg, info)
        return lambda *args: call(*args)

    # -- wiring ---------------------------------------------------------------------------------
    def _make_publishers(self) -> None:
        p = self.p
        self._command_is_trajectory = p.output.command_type == "joint_trajectory"
        command_type = JointTrajectory if self._command_is_trajectory else Float64MultiArray
        # What acts on the robot publishes only while active (lifecycle publishers); /diagnostics always.
        self.command_pub = self._made(self.create_lifecycle_publisher(command_type, p.output.command_topic, RELIABLE))
        self.chunk_pub = self._made(self.create_lifecycle_publisher(ActionChunk, p.output.chunk_topic, RELIABLE))
        self.chunk_traj_pub = (self._made(self.create_lifecycle_publisher(JointTrajectory,
                                                                          p.output.chunk_trajectory_topic, RELIABLE))
                               if p.output.chunk_trajectory_topic else None)
        self.margin_pub = self._made(self.create_lifecycle_publisher(ControlMargin, p.output.margin_topic, RELIABLE))
        self.diag_pub = self._made(self.create_publisher(DiagnosticArray, "/diagnostics", RELIABLE))

    def _made(self, entity):
        self._entities.append(entity)
        return entity

    def _make_subscriptions(self) -> None:
        p = self.p
        for slot, topic, compressed in zip(p.cameras.slots, p.cameras.topics, p.cameras.compressed):
            msg_type = CompressedImage if compressed else Image
            self._made(self.create_subscription(msg_type, topic, self._guarded(
                f"camera {slot}", self._camera_callback(slot, compressed)), SENSOR))
        self._made(self.create_subscription(JointState, p.state.topic,
                                            self._guarded("joint state", self._on_joint_state), SENSOR))
        # The instruction is latched: a transient-local subscription gets the last instruction of a
        # publisher that started earlier. A volatile publisher (a plain `ros2 topic pub`, a bag replay)
        # cannot match it, so a second, volatile subscription takes those. A latched publisher matches
        # both, and the executor may serve the two queues interleaved (A, B on one, then A, B on the
        # other): each publication is therefore taken once, by its source stamp, or the task would
        # flap back to A for a moment and a long B be counted twice.
        self._instructions_taken: deque = deque(maxlen=64)
        on_instruction = self._guarded("instruction", self._on_instruction, with_info=True)
        self._made(self.create_subscription(String, p.instruction.topic, on_instruction, LATCHED,
                                            event_callbacks=SubscriptionEventCallbacks(
                                                incompatible_qos=lambda _: None)))
        self._made(self.create_subscription(String, p.instruction.topic, on_instruction, RELIABLE))

    # -- inputs ---------------------------------------------------------------------------------
    def _camera_callback(self, slot: str, compressed: bool):
        decode = self._images.from_compressed if compressed else self._images.from_image
        topic = dict(zip(self.p.cameras.slots, self.p.cameras.topics))[slot]

        def callback(msg) -> None:
            try:
                rgb = decode(msg)
            except ImageDecodeError as exc:
                self.loop.report_bad_input("bad_image", f"camera {slot!r} on {topic}: {exc}")
                return
            if self._stage_frame is not None:
                rgb = self._stage_frame(rgb)
            self.loop.on_image(slot, rgb, stamp_to_ns(msg.header.stamp))

        return callback

    def _on_joint_state(self, msg: JointState) -> None:
        if len(msg.position) != len(msg.name):
            self.loop.report_bad_input("bad_state", f"JointState has {len(msg.name)} names and "
                                                    f"{len(msg.position)} positions")
            return
        self.loop.on_joint_state(list(msg.name), np.asarray(msg.position, dtype=np.float64),
                                 stamp_to_ns(msg.header.stamp))

    def _on_instruction(self, msg: String, info: Optional[dict] = None) -> None:
        """A new task (a blank one, or one longer than instruction.max_length, is refused by the loop). One too long
        for the prompt's token budget is accepted, since the policy cuts the task and never the state, and counted
        once: the check tokenises, so it runs off the executor (TaskFitter). A publication already taken through
        the other subscription is skipped (see the subscriptions)."""
        text = msg.data
        stamp = (info or {}).get("source_timestamp") or 0
        if stamp:   # 0: the middleware gives no source stamp; fall back on the text alone
            taken = (stamp, hash(text), len(text))   # not the text: a refused 8 MB one is not kept 64 times
            if taken in self._instructions_taken:
                return
            self._instructions_taken.append(taken)
        if text == self.loop.buffer.instruction or not self.loop.on_instruction(text):
            return  # the same text again (latched and volatile subscriptions both take it), or refused
        self._task_fitter.submit(text, self.loop.buffer.latest_state)

    def _report_cut(self, text: str, prompt: str) -> None:
        budget = self.policy.adapter.token_budget
        self.loop.report_bad_input("truncated_instructions",
                                   f"instruction of {len(text)} characters does not fit the {budget}-token "
                                   f"prompt; the policy gets its start only (prompt {prompt[:120]!r}...), the "
                                   "state is kept")

    # -- outputs --------------------------------------------------------------------------------
    def _tick(self) -> None:
        emission = self.loop.tick()
        if emission is None or emission.kind == "duplicate":
            # Nothing to act on (no chunk yet, or the deadline policy 'stop'), or a tick whose slot was already
            # served (timer jitter: the command for that slot is out already and the loop counted the duplicate).
            return
        self._publish_command(emission.action, emission.slot_ns)

    def _publish_command(self, action: np.ndarray, slot_ns: int) -> None:
        action = np.asarray(action, dtype=np.float64)
        if self._command_is_trajectory:
            msg = JointTrajectory()
            msg.header.stamp = ns_to_time(max(0, slot_ns))
            msg.joint_names = self._names
            msg.points = [JointTrajectoryPoint(positions=action.tolist(), time_from_start=Duration())]
        else:
            msg = Float64MultiArray()
            msg.layout.dim = [MultiArrayDimension(label="action", size=len(action), stride=len(action))]
            msg.data = action.tolist()
        self.command_pub.publish(msg)

    def _publish_chunk(self, chunk) -> None:
        """Runs on the inference worker thread, right after the chunk is handed to the timer. Takes no
        lock the executor thread could wait on (rcl publishers are thread-safe, and only this thread
        publishes chunks)."""
        self.chunk_pub.publish(chunk_to_msg(dataclasses.replace(chunk, action_names=tuple(self._names))))
        if self.chunk_traj_pub is not None:
            self.chunk_traj_pub.publish(self._chunk_trajectory(chunk))

    def _chunk_trajectory(self, chunk) -> JointTrajectory:
        msg = JointTrajectory()
        msg.header.stamp = ns_to_time(chunk.t0_ns)
        msg.joint_names = self._names
        for i, row in enumerate(chunk.actions.astype(np.float64)):
            sec, nanosec = divmod(i * chunk.dt_ns, 1_000_000_000)
            msg.points.append(JointTrajectoryPoint(positions=row.tolist(),
                                                   time_from_start=Duration(sec=sec, nanosec=nanosec)))
        return msg

    def _publish_margin(self, report) -> None:
        self.margin_pub.publish(margin_to_msg(report))

    def _on_event(self, kind: str, detail: str) -> None:
        """Log each kind of event at most every 2 s (counters keep the exact numbers)."""
        now = time.monotonic()
        if now - self._event_log_times.get(kind, -1e9) >= 2.0:
            self._event_log_times[kind] = now
            self.get_logger().warning(f"{kind}: {detail}")

    def _publish_diagnostics(self) -> None:
        counters = self.loop.counters()
        report = self.loop.last_report
        grown = [k for k in _INPUT_PROBLEMS if counters.get(k, 0) > self._last_counters.get(k, 0)]
        self._last_counters = counters

        name = self.get_name()
        margin = DiagnosticStatus(name=diagnostics.status_name(name, diagnostics.MARGIN_STATUS),
                                  hardware_id=self.p.model.id)
        if self.active:
            level, margin.message = self.loop.health()
        else:   # configured and inactive: deliberately not commanding, which a monitor must still see
            level, margin.message = 1, "inactive (lifecycle): the policy is loaded, no commands are published"
        margin.level = _LEVEL_BYTES[level]
        margin.values = [KeyValue(key=k, value=f"{v:.6g}") for k, v in diagnostics.margin_values(
            report, self.loop.delivery.summary(), self.loop.clock_rate.rate())]
        inputs = DiagnosticStatus(name=diagnostics.status_name(name, diagnostics.LOOP_STATUS),
                                  hardware_id=self.p.model.id)
        inputs.level = DiagnosticStatus.WARN if grown else DiagnosticStatus.OK
        inputs.message = ("problems this period: " + ", ".join(grown)) if grown else "ok"
        inputs.values = [KeyValue(key=k, value=v) for k, v in diagnostics.loop_values(
            counters, self.loop.delay_estimate(), self.loop.inference_in_flight)]
        array = DiagnosticArray(status=[margin, inputs])
        array.header.stamp = self.get_clock().now().to_msg()
        self.diag_pub.publish(array)

    def destroy_node(self) -> None:
        if self.loop is not None:
            self.loop.close()
        super().destroy_node()
        # rclpy's LifecycleNode does not finalize its state machine here: its lifecycle services (which it owns,
        # with a hold on the node's handle) stay in the ROS graph, unanswered, until garbage collection. In a
        # process that goes on (composition, tests) a later node of the same name would share its service names
        # with these ghosts.
        state_machine = getattr(self, "_state_machine", None)
        if state_machine is not None:
            state_machine.destroy_when_not_in_use()


def _cuda_in_use() -> bool:
    torch = sys.modules.get("torch")   # the policy imported it; a node that never loaded one has nothing to free
    return torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()


def start(node: PolicyNode) -> None:
    """Bring the node to ``lifecycle.autostart``: configured, then active (the default); 'unconfigured' leaves
    every transition to a lifecycle manager. RuntimeError with the cause when configure fails."""
    target = node.p.lifecycle.autostart
    if target == "unconfigured":
        return
    if node.trigger_configure() != TransitionCallbackReturn.SUCCESS:
        raise RuntimeError(node.configure_error or "configure failed")
    if target == "active":
        node.trigger_activate()


def main(args: Optional[list] = None) -> int:
    """Run the node until Ctrl-C / shutdown. A node that cannot start (bad parameters, missing model
    files, no CUDA) logs why on one line and exits with status 1 instead of a traceback."""
    rclpy.init(args=args)
    node = None
    try:
        try:
            node = PolicyNode()
            start(node)
        except (KeyboardInterrupt, ExternalShutdownException):
            raise
        except Exception as exc:  # noqa: BLE001 - any start-up failure ends here, explained
            cause = str(exc) if isinstance(exc, RuntimeError) and node is not None and node.configure_error \
                else f"{type(exc).__name__}: {exc}"
            rclpy.logging.get_logger(diagnostics.NODE_NAME).fatal(f"cannot start: {cause}")
            return 1
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
