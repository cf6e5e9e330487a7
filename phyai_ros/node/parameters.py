"""The node's parameters: one table with type, default, range and description.

Declaring from a table keeps the YAML files, the launch file and the docs honest:
every parameter is typed and documented where it is declared, and none can
change under a running node (all are read at start, so all are read-only).
"""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from phyai_ros import needs_ros
from phyai_ros.control.loop import ControlConfig
from phyai_ros.control.rtc import RTC_MODES
from phyai_ros.models import MODEL_TYPES

if TYPE_CHECKING:
    from rcl_interfaces.msg import ParameterDescriptor


@dataclass(frozen=True)
class Spec:
    default: Any
    description: str
    range: Optional[tuple[float, float]] = None
    choices: tuple[str, ...] = ()


def _loop(field: str) -> Any:
    """The control loop's default for a parameter that configures it: ControlConfig is its one source."""
    return next(f.default for f in dataclasses.fields(ControlConfig) if f.name == field)


# name -> spec; dotted names become nested YAML keys under ros__parameters.
SPECS: dict[str, Spec] = {
    # Model
    "model.type": Spec("", "policy type (an entry of phyai_ros.models.MODEL_TYPES); empty: the checkpoint's "
                           "config.json type, which a given type must match", choices=("",) + tuple(MODEL_TYPES)),
    "model.id": Spec("pi05", "model id written into every ActionChunk"),
    "model.checkpoint": Spec("", "LeRobot/openpi checkpoint folder (config.json + model.safetensors); "
                                 "empty with model.random_init runs random weights for tests"),
    "model.tokenizer": Spec("", "SentencePiece tokenizer.model file (pi0, pi0.5; GR00T N1.7 reads its backbone's: empty)"),
    "model.embodiment": Spec("", "embodiment of a multi-embodiment policy (GR00T N1.7): a tag of the checkpoint's "
                                 "processor config or its numeric id; empty: the checkpoint's own"),
    "model.norm_stats": Spec("", "normalization stats (norm_stats.json); empty: checkpoint folder's"),
    "model.device": Spec("cuda", "torch device", choices=("cuda", "cpu")),
    "model.dtype": Spec("bfloat16", "weights/activations dtype", choices=("bfloat16", "float32")),
    "model.cuda_graphs": Spec(True, "replay prefix and denoising loop from CUDA graphs (cuda only)"),
    "model.noise_seed": Spec(0, "seed of the flow-matching noise generator", range=(0, 2**31 - 1)),
    "model.token_bucket": Spec(0, "cut the prompt's right-padding to a multiple of this many tokens (one CUDA "
                                  "graph per length, all captured at start-up); 0 keeps the full budget",
                               range=(0, 1024)),
    "model.op_profile": Spec("", "operator profile JSON written by scripts/profile_ops.py on this device; empty: "
                                 "this device's cached profile (model.op_autotune), else a shipped one found by "
                                 "device name (profiles/*.json), else every fused kernel that builds here"),
    "model.op_autotune": Spec(False, "when no operator profile has a table for this device (or its cached one lacks "
                                     "shapes this model calls): profile the (op, shape) calls of the warm-up "
                                     "(each usable candidate: a CUDA graph of 10 calls, 3 replays; Triton compiles "
                                     "kernel variants it has not built on this machine) and cache the choices per "
                                     "device for the next start"),
    "model.warmup_runs": Spec(2, "inferences run before the node starts acting (graph capture, cold start)",
                              range=(0, 100)),
    # Where the policy runs: in this process, or on a serve endpoint (phyai_ros.serve; robot id = node name).
    "policy.backend": Spec("onboard", "onboard: the model runs in this node; remote: snapshots go to "
                                      "policy.endpoint (Ray Serve) over HTTP and chunks come back",
                           choices=("onboard", "remote")),
    "policy.endpoint": Spec("http://127.0.0.1:8000", "the serve endpoint (remote backend)"),
    "policy.timeout": Spec(1.0, "a remote call not answered within this (s) is an inference error",
                           range=(0.001, 60.0)),
    # Cameras: parallel arrays, one entry per policy camera slot, in slot order.
    "cameras.slots": Spec(["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"],
                          "policy camera slot names, in the model's slot order"),
    "cameras.topics": Spec(["cameras/base/image", "cameras/left_wrist/image", "cameras/right_wrist/image"],
                           "image topic per slot (remap these in the launch file)"),
    "cameras.compressed": Spec([False, False, False],
                               "per slot: true subscribes sensor_msgs/CompressedImage, false sensor_msgs/Image"),
    "cameras.required": Spec([True, True, False],
                             "per slot: a required camera that is missing or old makes the observation stale; "
                             "an optional one is masked out instead (and its slot skipped: the start-up captures "
                             "every camera count from the required ones up)"),
    "max_observation_age": Spec(_loop("max_observation_age"), "a required camera older than this (s) makes the observation stale",
                                range=(0.001, 10.0)),
    # State and instruction
    "state.topic": Spec("joint_states", "sensor_msgs/JointState topic"),
    "state.joint_names": Spec(["joint_0", "joint_1", "joint_2", "joint_3", "joint_4", "joint_5", "gripper"],
                              "joint names in the policy's state order"),
    "state.max_age": Spec(0.25, "state older than this (s) makes the observation stale", range=(0.001, 10.0)),
    "instruction.topic": Spec("instruction", "std_msgs/String topic (transient local)"),
    "instruction.default": Spec(_loop("default_instruction"), "instruction used until one arrives; empty waits for one"),
    # Control
    "control.dt": Spec(0.02, "action period (s); the action timer runs at 1/dt", range=(0.001, 1.0)),
    "control.horizon": Spec(0, "actions per chunk (H); 0: the checkpoint's chunk size, which a given value must "
                               "match", range=(0, 1000)),
    "control.action_names": Spec(["joint_0", "joint_1", "joint_2", "joint_3", "joint_4", "joint_5", "gripper"],
                                 "names of the D action values, in the policy's action order"),
    "control.deadline_policy": Spec(_loop("deadline_policy"), "what the timer does when the chunk runs out",
                                    choices=("hold_last", "stop", "extrapolate_tail")),
    # Real-time chunking
    "rtc.mode": Spec(_loop("rtc_mode"), "real-time chunking mode (the model type must support it: see "
                                        "phyai_ros.models.check_rtc_mode)", choices=RTC_MODES),
    "rtc.schedule": Spec(_loop("rtc_schedule"), "soft-mask schedule over the overlap", choices=("exp", "linear")),
    "rtc.overlap": Spec(_loop("rtc_overlap"), "s: the next inference starts when this many actions of the current chunk remain "
                           "beyond the expected delay d", range=(0, 1000)),
    "rtc.delay_quantile": Spec(_loop("delay_quantile"), "quantile of measured latency used as the expected delay d",
                               range=(0.5, 1.0)),
    "rtc.jacobian": Spec("identity", "guided RTC correction: 'identity' (LeRobot's form, captured in the CUDA "
                                     "graph) or 'vjp' (the paper's vector-Jacobian product: one backward pass "
                                     "per step, run eagerly)", choices=("identity", "vjp")),
    "rtc.max_guidance": Spec(10.0, "largest guidance weight", range=(0.0, 100.0)),
    # Outputs
    "output.command_topic": Spec("command", "per-tick command topic"),
    "output.command_type": Spec("joint_trajectory", "per-tick command message",
                                choices=("joint_trajectory", "float64_multi_array")),
    "output.chunk_topic": Spec("action_chunk", "phyai_ros/ActionChunk topic"),
    "output.chunk_trajectory_topic": Spec("", "if set, every chunk is also published as a JointTrajectory "
                                              "(for ros2_control's joint_trajectory_controller)"),
    "output.margin_topic": Spec("control_margin", "phyai_ros/ControlMargin topic"),
    # Margin monitor
    "margin.window": Spec(_loop("margin_window"), "chunks in the sliding statistics window", range=(1, 100000)),
    "margin.eps": Spec(_loop("eps"), "budget: P(M_ctrl >= 0) >= 1 - eps", range=(0.0, 1.0)),
    "margin.confidence": Spec(_loop("confidence"), "confidence of the lower bound on P(M_ctrl >= 0)", range=(0.5, 0.9999)),
    "margin.min_samples": Spec(_loop("min_samples"), "chunks needed in the window before the status can be OK", range=(1, 100000)),
    "margin.error_probability": Spec(_loop("error_p_threshold"), "ERROR when the estimated P(M_ctrl >= 0) falls below this; between "
                                          "this and an OK lower bound the status is WARN", range=(0.0, 1.0)),
    "margin.error_consecutive_misses": Spec(_loop("error_consecutive_misses"), "ERROR when this many chunks in a row had M_ctrl < 0",
                                            range=(1, 1000)),
    "diagnostics.period": Spec(1.0, "seconds between /diagnostics reports", range=(0.001, 60.0)),
}


def descriptor(name: str, spec: Spec) -> ParameterDescriptor:
    """Every parameter is read-only: the node reads them once at start (they size buffers, pick the
    model, name topics, configure the loop), so a change at run time is refused instead of being
    silently ignored."""
    with needs_ros(__name__):  # the table (SPECS) is read without ROS by the replay tools
        from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
    text = spec.description + (f" (one of: {', '.join(spec.choices)})" if spec.choices else "")
    desc = ParameterDescriptor(description=text, read_only=True)
    if spec.range is not None and not isinstance(spec.default, bool):
        lo, hi = spec.range
        if isinstance(spec.default, int):
            desc.integer_range = [IntegerRange(from_value=int(lo), to_value=int(hi), step=0)]
        else:
            desc.floating_point_range = [FloatingPointRange(from_value=float(lo), to_value=float(hi), step=0.0)]
    return desc


class ParameterError(ValueError):
    """Parameters that contradict each other or name a bad choice."""


_YAML_BOOLS = {"off", "on", "yes", "no", "y", "n", "true", "false"}


# Overrides ROS itself may consume on any node (QoS overrides of publishers/subscriptions).
_ROS_PREFIXES = ("qos_overrides.",)


def unknown_overrides(node) -> list[str]:
    """Names given to this node (params file for its name or /**, -p) that neither this table nor ROS
    (use_sim_time, ... already declared on the node) declares: a typo there would silently keep the default."""
    given = getattr(node, "_parameter_overrides", {})  # rclpy keeps rcl's overrides here (no public accessor)
    return sorted(name for name in given if name not in SPECS and not node.has_parameter(name)
                  and not name.startswith(_ROS_PREFIXES))


def check_no_unknown(node) -> None:
    """Refuse unknown parameter names, each with the closest declared name as a hint."""
    unknown = unknown_overrides(node)
    if not unknown:
        return
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, SPECS, n=1, cutoff=0.6)
        parts.append(name + (f" (did you mean {close[0]}?)" if close else ""))
    raise ParameterError(f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(parts)}: not declared "
                         "by this node (check the params file's keys and the -p names)")


def declare_and_read(node) -> dict[str, Any]:
    """Declare every parameter on an rclpy node and return their values by name, validated."""
    from rclpy.exceptions import InvalidParameterTypeException
    check_no_unknown(node)
    values = {}
    for name, spec in SPECS.items():
        try:
            node.declare_parameter(name, spec.default, descriptor(name, spec))
        except InvalidParameterTypeException as exc:
            hint = ""
            if isinstance(spec.default, float):
                hint = " (a float parameter: write 1.0, not 1)"
            if isinstance(spec.default, str) and any(c.lower() in _YAML_BOOLS for c in spec.choices):
                hint = (" (YAML reads off/on/yes/no as booleans: quote the value, e.g. "
                        f"{name.split('.')[-1]}: 'off' in a params file or -p \"{name}:='off'\")")
            raise ParameterError(f"{exc}{hint}") from None
        values[name] = node.get_parameter(name).value
    validate(values)
    return values


def validate(values: dict[str, Any]) -> None:
    for name, spec in SPECS.items():
        if spec.choices and values[name] not in spec.choices:
            raise ParameterError(f"{name} = {values[name]!r}: must be one of {', '.join(spec.choices)}")
    n = len(values["cameras.slots"])
    for key in ("cameras.topics", "cameras.compressed", "cameras.required"):
        if len(values[key]) != n:
            raise ParameterError(f"{key} has {len(values[key])} entries for {n} cameras.slots")
    if not values["state.joint_names"]:
        raise ParameterError("state.joint_names is empty")
    if not values["control.action_names"]:
        raise ParameterError("control.action_names is empty")
    if values["control.horizon"] and values["rtc.overlap"] >= values["control.horizon"]:  # 0: checked at load
        raise ParameterError(
            f"rtc.overlap ({values['rtc.overlap']}) must be below control.horizon ({values['control.horizon']})")
