"""What the replay tools need to know about the policy node: its input and output topics,
message types, ages, rates.  Taken from the live node's parameters (parameter service), from
the params file it was started with, or from the declared defaults, in that order of trust.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

import yaml

from phyai_ros.control.loop import ControlConfig
from phyai_ros.diagnostics import NODE_NAME
from phyai_ros.parameters import SPECS, Parameters
from phyai_ros.replay.bagtypes import absolute_topic

# The loop's fixed tolerances (not node parameters), read from the one place they are defined.
FUTURE_STAMP_TOLERANCE = ControlConfig.__dataclass_fields__["future_stamp_tolerance"].default
CLOCK_JUMP_TOLERANCE = ControlConfig.__dataclass_fields__["clock_jump_tolerance"].default

# The parameters the tools read (all declared by phyai_ros.node.parameters).
PARAMETER_NAMES = (
    "cameras.slots", "cameras.topics", "cameras.compressed", "cameras.required", "max_observation_age",
    "state.topic", "state.joint_names", "state.max_age", "instruction.topic", "control.dt", "control.horizon",
    "output.command_topic", "output.command_type", "output.chunk_topic", "output.chunk_trajectory_topic",
    "output.margin_topic", "diagnostics.period", "margin.eps", "margin.confidence", "margin.min_samples",
    "margin.error_probability", "margin.error_consecutive_misses", "model.id", "control.compute_clock",
)
_LOOP = ControlConfig.__dataclass_fields__  # the margin rules' defaults: the loop's, not copies


@dataclass(frozen=True)
class CameraInput:
    slot: str
    topic: str          # absolute
    compressed: bool
    required: bool

    @property
    def msgtype(self) -> str:
        return "sensor_msgs/msg/CompressedImage" if self.compressed else "sensor_msgs/msg/Image"


@dataclass(frozen=True)
class NodeInfo:
    cameras: Tuple[CameraInput, ...]
    state_topic: str
    joint_names: Tuple[str, ...]
    instruction_topic: str
    max_observation_age: float
    max_state_age: float
    dt: float
    horizon: int
    diagnostics_period: float
    chunk_topic: str
    margin_topic: str
    command_topic: str
    command_type: str
    chunk_trajectory_topic: str
    eps: float = _LOOP["eps"].default
    confidence: float = _LOOP["confidence"].default
    min_samples: int = _LOOP["min_samples"].default
    error_probability: float = _LOOP["error_p_threshold"].default
    error_consecutive_misses: int = _LOOP["error_consecutive_misses"].default
    model_id: str = ""
    compute_clock: str = _LOOP["compute_clock"].default
    name: str = NODE_NAME
    use_sim_time: Optional[bool] = None
    source: str = "defaults"

    # -- construction
    @classmethod
    def from_params(cls, p: Mapping[str, Any], *, source: str = "parameters", name: str = NODE_NAME) -> "NodeInfo":
        """From dotted parameter names (checked as the node checks them, phyai_ros.parameters); missing ones take
        the node's declared defaults; names the table does not declare (use_sim_time, ...) are not its."""
        v = Parameters.of({k: val for k, val in p.items() if k in SPECS and val is not None})
        cams = tuple(CameraInput(slot, absolute_topic(topic), bool(c), bool(r)) for slot, topic, c, r in
                     zip(v.cameras.slots, v.cameras.topics, v.cameras.compressed, v.cameras.required))
        out, traj = v.output, v.output.chunk_trajectory_topic
        return cls(
            cameras=cams, state_topic=absolute_topic(v.state.topic), joint_names=tuple(v.state.joint_names),
            instruction_topic=absolute_topic(v.instruction.topic),
            max_observation_age=v.max_observation_age, max_state_age=v.state.max_age,
            dt=v.control.dt, horizon=v.control.horizon, diagnostics_period=v.diagnostics.period,
            chunk_topic=absolute_topic(out.chunk_topic), margin_topic=absolute_topic(out.margin_topic),
            command_topic=absolute_topic(out.command_topic), command_type=out.command_type,
            chunk_trajectory_topic=absolute_topic(traj) if traj else "",
            eps=v.margin.eps, confidence=v.margin.confidence, min_samples=v.margin.min_samples,
            error_probability=v.margin.error_probability,
            error_consecutive_misses=v.margin.error_consecutive_misses, model_id=v.model.id,
            compute_clock=v.control.compute_clock, name=name, use_sim_time=p.get("use_sim_time"), source=source)

    @classmethod
    def from_params_file(cls, path, *, name: str = NODE_NAME, overrides: Optional[Mapping[str, Any]] = None
                         ) -> "NodeInfo":
        p = load_params_file(path, name)
        p.update(overrides or {})
        return cls.from_params(p, source=f"params file {path}", name=name)

    # -- queries
    @property
    def input_topics(self) -> Dict[str, str]:
        """absolute topic -> role ('camera', 'state', 'instruction')."""
        out = {c.topic: "camera" for c in self.cameras}
        out[self.state_topic] = "state"
        out[self.instruction_topic] = "instruction"
        return out

    def camera(self, topic: str) -> Optional[CameraInput]:
        for c in self.cameras:
            if c.topic == topic:
                return c
        return None

    def max_age(self, topic: str) -> Optional[float]:
        """Age (s) beyond which the node does not use the newest message of ``topic``; None: no limit."""
        if topic == self.state_topic:
            return self.max_state_age
        if self.camera(topic) is not None:
            return self.max_observation_age
        return None

    def output_types(self) -> Dict[str, str]:
        """absolute topic -> message type of everything the node publishes."""
        cmd = ("trajectory_msgs/msg/JointTrajectory" if self.command_type == "joint_trajectory"
               else "std_msgs/msg/Float64MultiArray")
        out = {self.chunk_topic: "phyai_ros/msg/ActionChunk", self.margin_topic: "phyai_ros/msg/ControlMargin",
               self.command_topic: cmd, "/diagnostics": "diagnostic_msgs/msg/DiagnosticArray"}
        if self.chunk_trajectory_topic:
            out[self.chunk_trajectory_topic] = "trajectory_msgs/msg/JointTrajectory"
        return out

    def to_dict(self) -> dict:
        return {"name": self.name, "source": self.source, "use_sim_time": self.use_sim_time,
                "cameras": [c.__dict__ for c in self.cameras], "state_topic": self.state_topic,
                "joint_names": list(self.joint_names), "instruction_topic": self.instruction_topic,
                "max_observation_age": self.max_observation_age, "max_state_age": self.max_state_age,
                "dt": self.dt, "horizon": self.horizon, "diagnostics_period": self.diagnostics_period,
                "outputs": self.output_types(), "command_topic": self.command_topic,
                "chunk_topic": self.chunk_topic, "margin_topic": self.margin_topic,
                "chunk_trajectory_topic": self.chunk_trajectory_topic, "eps": self.eps, "confidence": self.confidence,
                "min_samples": self.min_samples, "error_probability": self.error_probability,
                "error_consecutive_misses": self.error_consecutive_misses, "model_id": self.model_id,
                "compute_clock": self.compute_clock}


def load_params_file(path, name: str = NODE_NAME) -> Dict[str, Any]:
    """The ``ros__parameters`` for ``name`` (or ``/**``) of a ROS 2 params file, flattened to dotted names."""
    raw = yaml.safe_load(Path(path).read_text()) or {}
    section = raw.get(name) or raw.get("/" + name) or raw.get("/**") or {}
    out: Dict[str, Any] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for k, val in value.items():
                walk(f"{prefix}{k}.", val)
        else:
            out[prefix[:-1]] = value

    walk("", section.get("ros__parameters", {}))
    return out


def query_node(ros_node, name: str = NODE_NAME, timeout: float = 10.0) -> Optional[NodeInfo]:
    """Ask a running policy node for its parameters (rclpy node of the caller; its executor must be
    spinning in another thread).  None if the node's parameter service does not answer in time."""
    import time

    from rcl_interfaces.srv import GetParameters
    from rclpy.parameter import parameter_value_to_python

    client = ros_node.create_client(GetParameters, f"/{name.lstrip('/')}/get_parameters")
    try:
        if not client.wait_for_service(timeout_sec=timeout):
            return None
        names = list(PARAMETER_NAMES) + ["use_sim_time"]
        future = client.call_async(GetParameters.Request(names=names))
        deadline = time.monotonic() + timeout
        while not future.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not future.done() or future.result() is None:
            return None
        values = {}
        for n, pv in zip(names, future.result().values):
            value = parameter_value_to_python(pv)
            if value is not None:
                values[n] = list(value) if isinstance(value, (list, tuple)) else value
        return NodeInfo.from_params(values, source=f"parameters of /{name.lstrip('/')}", name=name)
    finally:
        ros_node.destroy_client(client)


def reconcile_with_graph(info: NodeInfo, ros_node) -> tuple:
    """Check the node's topics against the ROS graph (a launch file may have remapped them).

    Outputs found under another name (by their type, or a name ending like the parameter's) replace
    the parameter's; inputs the node does not subscribe under the parameter's name are reported
    (the bag's topics must then be remapped onto the node's actual ones).  Returns (info, warnings)."""
    import dataclasses
    try:
        pubs = dict(ros_node.get_publisher_names_and_types_by_node(info.name, "/"))
        subs = dict(ros_node.get_subscriber_names_and_types_by_node(info.name, "/"))
    except Exception:  # noqa: BLE001 - node not (yet) on the graph: keep the parameters' view
        return info, []
    warnings = []

    def find(topic: str, msgtype: str, unique_type: bool) -> str:
        if not topic or topic in pubs:
            return topic
        by_type = [t for t, types in pubs.items() if msgtype in types]
        base = topic.rsplit("/", 1)[-1]
        named = [t for t in by_type if t.rsplit("/", 1)[-1] == base]
        hit = named[0] if named else (by_type[0] if unique_type and len(by_type) == 1 else None)
        if hit is None:
            warnings.append(f"the node publishes no {msgtype} on {topic}; its output there is not recorded")
            return topic
        warnings.append(f"the node publishes {topic} as {hit} (remapped); recording {hit}")
        return hit

    cmd_type = ("trajectory_msgs/msg/JointTrajectory" if info.command_type == "joint_trajectory"
                else "std_msgs/msg/Float64MultiArray")
    new = dataclasses.replace(
        info,
        chunk_topic=find(info.chunk_topic, "phyai_ros/msg/ActionChunk", True),
        margin_topic=find(info.margin_topic, "phyai_ros/msg/ControlMargin", True),
        command_topic=find(info.command_topic, cmd_type, False),
        chunk_trajectory_topic=find(info.chunk_trajectory_topic, "trajectory_msgs/msg/JointTrajectory", False))
    for topic, role in info.input_topics.items():
        if subs and topic not in subs:
            warnings.append(f"the node does not subscribe {topic} ({role}): remapped? Remap the bag's topic onto "
                            "the node's actual one (--remap BAG_TOPIC:=NODE_TOPIC)")
    return new, warnings


def shared_domain(info: NodeInfo, ros_node, input_topics=()) -> list:
    """What else on the DDS domain could mix into a replay of ``info``'s node by ``ros_node`` (the replay's):
    other nodes of the same name, publishers of the node's outputs that are not a node of its name (their
    messages would be recorded as its own: a topic carries no sender), publishers of ``input_topics`` that are
    not the replay (the node would take their messages too).  One sentence each; empty when the domain is the
    replay's own (README: ROS_DOMAIN_ID)."""
    out = []
    try:
        same = [ns for n, ns in ros_node.get_node_names_and_namespaces() if n == info.name]
        if len(same) > 1:
            out.append(f"{len(same)} nodes named /{info.name} are on this DDS domain: only the judged one's "
                       "/diagnostics are used, but their chunks, margins and commands share topics")
        mine = ros_node.get_name()
        outputs = [t for t in info.output_types() if t != "/diagnostics"]
        for topic, allowed, what in ([(t, info.name, "recorded as the node's") for t in outputs]
                                     + [(t, mine, "taken by the node too") for t in input_topics]):
            others = sorted({f"{e.node_namespace.rstrip('/')}/{e.node_name}"
                             for e in ros_node.get_publishers_info_by_topic(topic) if e.node_name != allowed})
            if others:
                out.append(f"{topic} is also published by {', '.join(others)}: its messages are {what}")
    except Exception:  # noqa: BLE001 - the graph cannot be read (shutting down): nothing to say
        return []
    return out


__all__ = ["NodeInfo", "CameraInput", "NODE_NAME", "load_params_file", "query_node", "reconcile_with_graph",
           "shared_domain",
           "FUTURE_STAMP_TOLERANCE", "CLOCK_JUMP_TOLERANCE"]
