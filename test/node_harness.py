"""Drive the onboard policy node over real DDS: a small random-weight pi0.5, the node as a
separate process, and a fake robot (an rclpy node in the test process) that publishes the
node's inputs and records everything it outputs.

Reusable by any test or tool that needs a live node (e.g. rosbag replay tests)::

    tokenizer = require_tokenizer()                          # pytest.skip if the fixture is absent
    ckpt = make_small_checkpoint(tmp_dir)                    # ~20 ms, random weights
    node = NodeProcess(ckpt, tokenizer, overrides={"rtc.mode": "off"})
    robot = FakeRobot(node.params)                           # topics/types from the node's parameters
    try:
        assert robot.wait_for_node(timeout=60), node.output()
        robot.set_instruction("pick up the cup")
        assert robot.spin_until(lambda: len(robot.chunks) >= 3, timeout=60), node.output()
    finally:
        robot.close()
        node.stop()

Tests in test/ import it as ``node_harness`` (pytest puts test/ on sys.path); a tool adds test/ to
sys.path. Besides the above: ``node_ros_args``/``node_params`` for a node built in-process
(``PolicyNode(cli_args=...)``, e.g. to wrap its policy), ``NodeProcess.from_ros_args`` for a
ready-made command line, ``remapped`` for a robot on remapped topics, ``FakeRobot(sim_time=True)``
for /clock-driven runs with ``jump_clock``, and ``diagnostics_*`` to read the node's reports.

Conventions: every wait has a generous timeout and returns a bool (assert on it with the
node's output as the message); received messages are kept with their arrival time
(``time.monotonic()``) in ``Received`` records. All times in messages are ROS time (int ns
helpers below). The node runs with ``config/pi05_cpu_test.yaml`` plus overrides; by default
``control.horizon = HORIZON`` (the checkpoint's chunk size must match) and ``control.dt = DT``:
short chunks at 50 Hz, so a test sees a chunk boundary every ~0.4 s and an inference of the
small model (0.1-0.2 s in the node on the 2-core machine) spans several ticks, which makes the RTC
frozen prefix non-empty. Tests of on-time properties take ``paced_dt`` instead, which slows the rate
on a machine too slow for it.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np

from phyai_ros.control.clock import NS_PER_S, stamp_to_ns
from phyai_ros import diagnostics, fixtures
from phyai_ros.diagnostics import NODE_NAME
from phyai_ros.fixtures import require_tokenizer, tokenizer_path  # noqa: F401  (re-exported for the tests)
from phyai_ros.replay import nodeproc  # the one node driver, shared with the replay tool
from phyai_ros.replay.nodeproc import param_arg  # noqa: F401  (re-exported for the tests)
from phyai_ros.replay.nodeinfo import load_params_file
from ros_helpers import REPO, python_env

CPU_CONFIG = REPO / "config" / "pi05_cpu_test.yaml"
THOR_CONFIG = REPO / "config" / "pi05_thor.yaml"
HORIZON = 20  # actions per chunk in tests (the CPU config says 50; overridden with the checkpoint)
DT = 0.02     # action period in tests (the CPU config says 0.05)


# ----------------------------------------------------------------------------- model files
def make_small_checkpoint(directory, *, horizon: int = HORIZON, state_dim: int = 8, action_dim: int = 7,
                          seed: int = 0, image_size: int = 224,
                          cameras: Sequence[str] = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"),
                          policy: str = "pi05") -> Path:
    """The users' helper (phyai_ros.fixtures) with the node tests' prompt budget of 48 tokens."""
    return fixtures.make_small_checkpoint(directory, horizon=horizon, state_dim=state_dim, action_dim=action_dim, seed=seed, cameras=cameras,
                image_size=image_size, token_budget=48, policy=policy)


# ----------------------------------------------------------------------------- parameters
def load_params(params_file: Path = CPU_CONFIG, node_name: str = NODE_NAME) -> Dict[str, Any]:
    """The ``ros__parameters`` of ``node_name`` (or ``/**``) in a params file, flattened to dotted names."""
    return load_params_file(params_file, node_name)


def remapped(params: Dict[str, Any], remaps: Dict[str, str]) -> Dict[str, Any]:
    """``params`` with every topic name that ``remaps`` (node name -> robot name) renames replaced, so
    a FakeRobot built from the result talks to a node started with those remappings."""
    topic_keys = ("state.topic", "instruction.topic", "output.command_topic", "output.chunk_topic",
                  "output.chunk_trajectory_topic", "output.margin_topic")
    out = dict(params)
    out["cameras.topics"] = [remaps.get(t, t) for t in params["cameras.topics"]]
    for key in topic_keys:
        out[key] = remaps.get(params[key], params[key])
    return out


# ----------------------------------------------------------------------------- the node
def with_test_defaults(overrides: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """``overrides`` with the test defaults (``control.horizon = HORIZON``, ``control.dt = DT``) filled in."""
    out = {"control.horizon": HORIZON, "control.dt": DT}
    out.update(overrides or {})
    return out


def inference_seconds(checkpoint, tokenizer, *, params_file: Path = CPU_CONFIG,
                      overrides: Optional[Dict[str, Any]] = None, runs: int = 5) -> float:
    """The median of ``runs`` CPU inferences of ``checkpoint`` (after a warm-up) in a worker thread of this process,
    now: how fast this machine runs the node's model (``params_file`` with ``overrides``) at the moment a test starts
    it. A worker thread, as the node's inference worker runs it: on this 2-core machine beside two busy processes the
    main thread's OpenMP team ran the small pi0.5 in 3.4 s, a worker thread in 0.13 s and the node in 0.36 s; a node
    paced to the main thread's figure ran chunks that no inference spanned. The median, not the fastest: under that
    load the node's GR00T took 6x a worker thread's fastest run."""
    from phyai_ros.parameters import SPECS
    from phyai_ros.policies import build_policy

    seconds: List[float] = []
    failure: List[BaseException] = []

    def measure() -> None:
        try:
            params = node_params(checkpoint, tokenizer, params_file=params_file,
                                 overrides=with_test_defaults({**(overrides or {}), "model.warmup_runs": 1}))
            policy = build_policy({**{n: spec.default for n, spec in SPECS.items()}, **params})
            images, state = policy.warmup_observation(policy.adapter.state_dim)
            for _ in range(runs):
                t0 = time.perf_counter()
                policy.predict(images, state, "pick up the red cup")
                seconds.append(time.perf_counter() - t0)
        except BaseException as e:   # re-raised in the caller's thread
            failure.append(e)

    worker = threading.Thread(target=measure, name="inference_seconds")
    worker.start()
    worker.join()
    if failure:
        raise failure[0]
    return float(np.median(seconds))


def paced_dt(checkpoint, tokenizer, *, dt: float = DT, horizon: int = HORIZON, params_file: Path = CPU_CONFIG,
             overrides: Optional[Dict[str, Any]] = None, chunk_per_inference: float = 5.0) -> float:
    """``control.dt`` for a node run whose timing properties must hold on this machine: ``dt``, or slower where one
    chunk (``horizon`` actions) would last less than ``chunk_per_inference`` measured inferences. A slow or loaded
    machine (a CI run measured 0.3 s per inference instead of ~50 ms) otherwise misses every deadline, and the run
    says nothing about on-time chunks. Not slower than that: an inference must still span a few ticks (horizon /
    chunk_per_inference), or RTC's measured delay, and so its frozen prefix, is 0 (a run paced to 8 inferences a
    chunk had GR00T's 16-tick chunks frozen in 2 of 8). Rounded up to whole milliseconds."""
    seconds = inference_seconds(checkpoint, tokenizer, params_file=params_file, overrides=overrides)
    paced = max(dt, math.ceil(chunk_per_inference * seconds / horizon * 1000) / 1000)
    print(f"paced_dt: inference {seconds:.3f} s here -> control.dt {paced}")   # shown with a failing test's output
    return paced


def _with_model(checkpoint, tokenizer, overrides: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    return {"model.checkpoint": str(checkpoint), "model.tokenizer": str(tokenizer), **(overrides or {})}


def node_ros_args(checkpoint, tokenizer, *, params_file: Path = CPU_CONFIG,
                  overrides: Optional[Dict[str, Any]] = None, remaps: Optional[Dict[str, str]] = None,
                  use_sim_time: bool = False) -> List[str]:
    """``phyai_ros.replay.nodeproc.node_ros_args`` with these model files (overrides taken as given:
    see ``with_test_defaults``). Also what an in-process ``PolicyNode(cli_args=["--ros-args", ...])`` takes."""
    return nodeproc.node_ros_args(params_file, _with_model(checkpoint, tokenizer, overrides), remaps, use_sim_time)


def node_params(checkpoint, tokenizer, *, params_file: Path = CPU_CONFIG,
                overrides: Optional[Dict[str, Any]] = None, remaps: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """What a node started with ``node_ros_args`` (same arguments) runs with, topics as remapped:
    the dict a matching ``FakeRobot`` is built from."""
    return remapped({**load_params(params_file), **_with_model(checkpoint, tokenizer, overrides)}, remaps or {})


class NodeProcess(nodeproc.PolicyNodeProcess):
    """The project's one node driver (``PolicyNodeProcess``) with the node tests' defaults: this test
    run's DDS domain, ``with_test_defaults`` overrides, no sim time unless asked. ``params`` is what the
    node runs with (``node_params``), for building a matching robot."""

    def __init__(self, checkpoint, tokenizer, *, params_file: Path = CPU_CONFIG,
                 overrides: Optional[Dict[str, Any]] = None, remaps: Optional[Dict[str, str]] = None,
                 use_sim_time: bool = False, module: str = "phyai_ros.node.main"):
        overrides = with_test_defaults(overrides)
        self.params = node_params(checkpoint, tokenizer, params_file=params_file, overrides=overrides,
                                  remaps=remaps)
        super().__init__(params_file, overrides=_with_model(checkpoint, tokenizer, overrides), remaps=remaps,
                         use_sim_time=use_sim_time, env=python_env(), module=module, cwd=REPO)

    @classmethod
    def from_ros_args(cls, ros_args: Sequence[str], params: Dict[str, Any],
                      module: str = "phyai_ros.node.main") -> "NodeProcess":
        """Start the node with a ready-made ``--ros-args`` list (e.g. what a launch file gives it);
        ``params`` is what those arguments amount to, for building a matching robot."""
        self = cls.__new__(cls)
        self.params = dict(params)
        nodeproc.PolicyNodeProcess.__init__(self, ros_args=list(ros_args), params=params, use_sim_time=False,
                                            env=python_env(), module=module, cwd=REPO)
        return self


# ----------------------------------------------------------------------------- the robot
@dataclass
class Received:
    t: float  # time.monotonic() at arrival
    msg: Any




def diagnostics_status(msg, status: str):
    """The node's DiagnosticStatus ``status`` (``phyai_ros.diagnostics.MARGIN_STATUS`` or ``LOOP_STATUS``), or None."""
    name = diagnostics.status_name(NODE_NAME, status)
    return next((st for st in msg.status if st.name == name), None)


def diagnostics_values(status) -> Dict[str, str]:
    return {kv.key: kv.value for kv in status.values}


def diagnostics_counters(msg) -> Dict[str, int]:
    """The loop's counters from one /diagnostics message ({} if it is not the node's)."""
    report = diagnostics.parse(msg, 0, NODE_NAME)
    return report["counters"] if report else {}


def pattern_image(hw, seed: int) -> np.ndarray:
    """A deterministic RGB frame (smooth pattern plus noise) of size hw."""
    h, w = hw
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), np.full_like(x, 40 * seed % 256)], -1)
    return np.clip(base + rng.integers(-20, 20, (h, w, 3)), 0, 255).astype(np.uint8)


class FakeRobot:
    """An rclpy node (own Context, so it is a separate DDS participant) that plays the robot.

    Publishes, from a timer at ``rate_hz`` while spinning: one frame per enabled camera (``Image``
    rgb8 or ``CompressedImage`` jpeg per ``cameras.compressed``, sensor-data QoS) and a JointState
    (joint names in reverse policy order, so the node's name mapping is exercised) stamped with
    ``now_ns()``, and the instruction (see ``set_instruction``). With ``sim_time`` it also
    publishes /clock at ``clock_hz`` (simulated time runs at the real rate from ``sim_start_ns``)
    and stamps with it; ``jump_clock`` moves it (a bag loop).

    Records ``chunks``, ``chunk_trajectories``, ``margins``, ``commands`` and ``diagnostics`` as lists of
    ``Received``. Drive it with ``spin_for`` / ``spin_until``; nothing happens between those calls.
    """

    def __init__(self, params: Dict[str, Any], *, image_hw=(48, 64), rate_hz: float = 20.0,
                 sim_time: bool = False, sim_start_ns: int = 1_000 * NS_PER_S, clock_hz: float = 200.0,
                 latched_instruction: bool = True, name: str = "fake_robot"):
        import rclpy
        from rclpy.executors import SingleThreadedExecutor
        from diagnostic_msgs.msg import DiagnosticArray
        from rosgraph_msgs.msg import Clock
        from sensor_msgs.msg import CompressedImage, Image, JointState
        from std_msgs.msg import Float64MultiArray, String
        from trajectory_msgs.msg import JointTrajectory

        from phyai_ros.msg import ActionChunk, ControlMargin
        from phyai_ros.node.qos import LATCHED, RELIABLE, SENSOR, reliable_depth

        self.params = params
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node(name, context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._types = dict(Image=Image, CompressedImage=CompressedImage, JointState=JointState, String=String,
                           Clock=Clock)

        self.slots = list(params["cameras.slots"])
        self.compressed = dict(zip(self.slots, params["cameras.compressed"]))
        self.camera_pubs = {
            slot: self.node.create_publisher(CompressedImage if self.compressed[slot] else Image, topic,
                                             SENSOR)
            for slot, topic in zip(self.slots, params["cameras.topics"])}
        self.state_pub = self.node.create_publisher(JointState, params["state.topic"], SENSOR)
        self.latched_instruction = latched_instruction
        self.instruction_pub = self.node.create_publisher(String, params["instruction.topic"],
                                                          LATCHED if latched_instruction else RELIABLE)
        self.instruction: Optional[str] = None
        self.joint_names = list(params["state.joint_names"])
        self.enabled_cameras = set(self.slots)
        self.state_enabled = True
        self.frames_published = 0
        self.image_hw = tuple(image_hw)
        self._frames = {slot: pattern_image(self.image_hw, i) for i, slot in enumerate(self.slots)}
        self._jpeg: Dict[str, bytes] = {}

        # simulated time
        self.sim_time = sim_time
        self._sim_start_ns = int(sim_start_ns)
        self._mono0 = time.monotonic_ns()
        self._sim_offset_ns = 0
        if sim_time:
            self.clock_pub = self.node.create_publisher(Clock, "/clock", RELIABLE)
            self.clock_timer = self.node.create_timer(1.0 / clock_hz, self.publish_clock)   # cancel(): /clock stalls

        # outputs
        self.chunks: List[Received] = []
        self.chunk_trajectories: List[Received] = []
        self.margins: List[Received] = []
        self.commands: List[Received] = []
        self.diagnostics: List[Received] = []

        def recorder(store):
            return lambda msg: store.append(Received(time.monotonic(), msg))

        command_type = (JointTrajectory if params["output.command_type"] == "joint_trajectory"
                        else Float64MultiArray)
        self.node.create_subscription(ActionChunk, params["output.chunk_topic"], recorder(self.chunks), RELIABLE)
        self.node.create_subscription(ControlMargin, params["output.margin_topic"], recorder(self.margins), RELIABLE)
        self.node.create_subscription(command_type, params["output.command_topic"], recorder(self.commands),
                                      reliable_depth(100))
        if params.get("output.chunk_trajectory_topic"):
            self.node.create_subscription(JointTrajectory, params["output.chunk_trajectory_topic"],
                                          recorder(self.chunk_trajectories), RELIABLE)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", recorder(self.diagnostics), RELIABLE)
        self.sensor_timer = self.node.create_timer(1.0 / rate_hz, self.publish_sensors)

    # -- time
    def now_ns(self) -> int:
        """Stamp time: the system clock, or with sim_time the simulated clock the node follows."""
        if self.sim_time:
            return self._sim_start_ns + (time.monotonic_ns() - self._mono0) + self._sim_offset_ns
        return self.node.get_clock().now().nanoseconds

    def jump_clock(self, seconds: float) -> None:
        """Move the simulated clock by ``seconds`` (negative: back, as a bag loop does)."""
        self._sim_offset_ns += int(seconds * NS_PER_S)
        self.publish_clock()

    def publish_clock(self) -> None:
        msg = self._types["Clock"]()
        msg.clock = self.time_msg(self.now_ns())
        self.clock_pub.publish(msg)

    @staticmethod
    def time_msg(ns: int):
        from builtin_interfaces.msg import Time
        sec, nanosec = divmod(int(ns), NS_PER_S)
        return Time(sec=sec, nanosec=nanosec)

    # -- inputs
    def camera_msg(self, slot: str, stamp: Optional[int] = None):
        """A well-formed frame for ``slot`` in the message type the node subscribes with."""
        stamp = self.now_ns() if stamp is None else stamp
        if self.compressed[slot]:
            msg = self._types["CompressedImage"]()
            if slot not in self._jpeg:
                import cv2
                ok, buf = cv2.imencode(".jpg", self._frames[slot][..., ::-1])
                assert ok
                self._jpeg[slot] = buf.tobytes()
            msg.format = "rgb8; jpeg compressed bgr8"
            msg.data = self._jpeg[slot]
        else:
            frame = self._frames[slot]
            msg = self._types["Image"]()
            msg.height, msg.width = frame.shape[:2]
            msg.encoding, msg.step = "rgb8", frame.shape[1] * 3
            msg.data = frame.tobytes()
        msg.header.stamp = self.time_msg(stamp)
        msg.header.frame_id = slot
        return msg

    def joint_state_msg(self, stamp: Optional[int] = None, positions: Optional[Iterable[float]] = None,
                        names: Optional[Sequence[str]] = None):
        """JointState in reverse policy order (positions given in policy order, default 0.1*i)."""
        stamp = self.now_ns() if stamp is None else stamp
        policy = list(positions) if positions is not None else [0.1 * i for i in range(len(self.joint_names))]
        msg = self._types["JointState"]()
        msg.header.stamp = self.time_msg(stamp)
        if names is None:
            msg.name = self.joint_names[::-1]
            msg.position = [float(v) for v in policy[::-1]]
        else:
            msg.name, msg.position = list(names), [float(v) for v in policy]
        return msg

    def publish_camera(self, slot: str, msg) -> None:
        self.camera_pubs[slot].publish(msg)

    def publish_state(self, msg) -> None:
        self.state_pub.publish(msg)

    def publish_sensors(self) -> None:
        stamp = self.now_ns()
        for slot in self.slots:
            if slot in self.enabled_cameras:
                self.publish_camera(slot, self.camera_msg(slot, stamp))
        if self.state_enabled:
            self.publish_state(self.joint_state_msg(stamp))
        if self.instruction is not None and not self.latched_instruction:
            self.instruction_pub.publish(self._types["String"](data=self.instruction))
        self.frames_published += 1

    def set_instruction(self, text: str) -> None:
        """Latched (transient local, once: a node that starts later still gets it) or, with
        ``latched_instruction=False``, volatile and repeated with every sensor frame."""
        self.instruction = text
        self.instruction_pub.publish(self._types["String"](data=text))

    # -- spinning
    def spin_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            self.executor.spin_once(timeout_sec=0.01)
        return predicate()

    def spin_for(self, seconds: float) -> None:
        self.spin_until(lambda: False, seconds)

    def wait_for_node(self, timeout: float = 60.0) -> bool:
        """Until the node's first /diagnostics report (it is up, its policy loaded)."""
        return self.spin_until(lambda: any(diagnostics_counters(r.msg) for r in self.diagnostics), timeout)

    # -- outputs
    def counters(self) -> Dict[str, int]:
        """The node's counters from its newest /diagnostics report ({} before the first)."""
        for r in reversed(self.diagnostics):
            c = diagnostics_counters(r.msg)
            if c:
                return c
        return {}

    def fresh_counters(self, timeout: float = 10.0) -> Dict[str, int]:
        """Counters from the first report that arrives after this call: ``counters()`` may be up to one
        diagnostics period old and miss events the node has already counted."""
        since = time.monotonic()
        fresh = lambda: [c for r in self.diagnostics if r.t > since for c in [diagnostics_counters(r.msg)] if c]
        assert self.spin_until(lambda: bool(fresh()), timeout), "no /diagnostics report"
        return fresh()[0]

    def wait_counter(self, name: str, above: int, timeout: float) -> bool:
        """Until the node reports counter ``name`` > ``above``."""
        return self.spin_until(lambda: self.counters().get(name, 0) > above, timeout)

    def last_seq(self) -> int:
        return self.chunks[-1].msg.seq if self.chunks else -1

    def wait_chunks_after(self, seq: int, count: int = 1, timeout: float = 30.0) -> bool:
        """Until ``count`` chunks with a sequence number above ``seq`` have arrived."""
        return self.spin_until(lambda: sum(r.msg.seq > seq for r in self.chunks) >= count, timeout)

    def wait_commands(self, count: int = 1, timeout: float = 30.0) -> bool:
        """Until ``count`` more commands than now have arrived."""
        target = len(self.commands) + count
        return self.spin_until(lambda: len(self.commands) >= target, timeout)

    def input_warnings(self, since: float = 0.0) -> List[str]:
        """Messages of the node's 'inputs and loop' diagnostics at WARN or worse, received after ``since``."""
        out = []
        for r in self.diagnostics:
            status = diagnostics_status(r.msg, "inputs and loop")
            if r.t >= since and status is not None and status.level[0] >= 1:
                out.append(status.message)
        return out

    def close(self) -> None:
        import rclpy
        try:
            self.executor.shutdown()
            self.node.destroy_node()
        finally:
            rclpy.try_shutdown(context=self.context)


def command_stamp_ns(msg) -> Optional[int]:
    """Slot time of a per-tick command (JointTrajectory header; None for Float64MultiArray)."""
    header = getattr(msg, "header", None)
    return None if header is None else stamp_to_ns(header.stamp)


def command_action(msg) -> np.ndarray:
    if hasattr(msg, "points"):
        return np.asarray(msg.points[0].positions, dtype=np.float64)
    return np.asarray(msg.data, dtype=np.float64)
