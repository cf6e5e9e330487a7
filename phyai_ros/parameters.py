"""The node's parameters: one table (type, default, range, choices, description per name) and the typed object
generated from it, which the node, the replay tools and the policy bridge read. ROS-free.

Declaring from a table keeps the YAML files, the launch file and the docs honest: every parameter is typed and
documented where it is declared, and none can change under a running node (all are read at start). Dotted names
(``model.checkpoint``) are sections of the object (``params.model.checkpoint``) and nested YAML keys under
``ros__parameters``. The table checks what a value alone decides (type, range, choice, list lengths); facts that
need the model (its RTC modes, chunk size, dims) are checked where the model is loaded (phyai_ros.policies), and
the control loop's own rules by ``ControlConfig``.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from phyai_ros.control.loop import COMPUTE_CLOCKS, ControlConfig
from phyai_ros.control.rtc import RTC_MODES


@dataclass(frozen=True)
class Spec:
    default: Any
    description: str
    range: Optional[Tuple[float, float]] = None
    choices: Tuple[str, ...] = ()

    @property
    def kind(self) -> type:
        """The value's type: bool, int, float, str or list (of the default's element type)."""
        return type(self.default)


MAX_HORIZON = 1000   # the longest chunk (actions) a policy may have: control.horizon's range, the serve wire's limit


class ParameterError(ValueError):
    """Parameters that contradict each other, name a bad choice or have the wrong type."""


def _loop(field: str) -> Any:
    """The control loop's default for a parameter that configures it: ControlConfig is its one source."""
    return next(f.default for f in dataclasses.fields(ControlConfig) if f.name == field)


# name -> spec; dotted names become sections of Parameters and nested YAML keys under ros__parameters.
SPECS: dict[str, Spec] = {
    # Model
    "model.type": Spec("", "policy family (a registered one: phyai_ros.models); empty: the checkpoint's "
                           "config.json type, which a given family must match"),
    "model.id": Spec("pi05", "model id written into every ActionChunk"),
    "model.checkpoint": Spec("", "LeRobot/openpi checkpoint folder (config.json + model.safetensors); "
                                 "empty with model.random_init runs random weights for tests"),
    "model.tokenizer": Spec("", "SentencePiece tokenizer.model file (pi0, pi0.5; GR00T N1.7 reads its backbone's: empty)"),
    "model.options": Spec("", "the family's run settings that are not in its checkpoint, as 'key=value;key=value' "
                              "(e.g. Cosmos3: num_steps=4;guidance=3.0;chunk_size=32); families without any refuse "
                              "them; empty: the family's defaults"),
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
    "policy.timeout": Spec(1.0, "a remote call not answered within this (s, the whole call) is an inference error",
                           range=(0.001, 60.0)),
    "policy.token": Spec("", "bearer token the serve endpoint requires (its --token-file / PHYAI_SERVE_TOKEN); empty: "
                             "PHYAI_SERVE_TOKEN from the node's environment, else none. Never logged; other DDS "
                             "participants can read parameters, so prefer the environment variable there"),
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
    "cameras.max_pixels": Spec(_loop("max_image_pixels"), "largest frame accepted (width x height, read from a "
                                                          "compressed image's header or a raw image's fields "
                                                          "before decoding); larger ones are bad_image",
                               range=(1, 2**31 - 1)),
    "max_observation_age": Spec(_loop("max_observation_age"), "a required camera older than this (s) makes the observation stale",
                                range=(0.001, 10.0)),
    # State and instruction
    "state.topic": Spec("joint_states", "sensor_msgs/JointState topic"),
    "state.joint_names": Spec(["joint_0", "joint_1", "joint_2", "joint_3", "joint_4", "joint_5", "gripper"],
                              "joint names in the policy's state order"),
    "state.max_age": Spec(0.25, "state older than this (s) makes the observation stale", range=(0.001, 10.0)),
    "instruction.topic": Spec("instruction", "std_msgs/String topic (transient local)"),
    "instruction.default": Spec(_loop("default_instruction"), "instruction used until one arrives; empty waits for one"),
    "instruction.max_length": Spec(_loop("max_instruction_chars"), "longest instruction accepted (characters); a "
                                                                   "longer one is refused (bad_input), the task kept",
                                   range=(1, 10_000_000)),
    # Control
    "control.dt": Spec(0.02, "action period (s); the action timer runs at 1/dt", range=(0.001, 1.0)),
    "control.horizon": Spec(0, "actions per chunk (H); 0: the checkpoint's chunk size, which a given value must "
                               "match", range=(0, MAX_HORIZON)),
    "control.action_names": Spec(["joint_0", "joint_1", "joint_2", "joint_3", "joint_4", "joint_5", "gripper"],
                                 "names of the D action values, in the policy's action order"),
    "control.deadline_policy": Spec(_loop("deadline_policy"), "what the timer does when the chunk runs out",
                                    choices=("hold_last", "stop", "extrapolate_tail")),
    "control.compute_clock": Spec(_loop("compute_clock"), "clock of the compute segments (queue, inference, "
                                                          "actuate): monotonic, converted at the stamp clock's "
                                                          "measured rate (robot, real-time replay); stamp: ROS time "
                                                          "itself (a stepped replay holds /clock while the node "
                                                          "computes, so they take no simulated time)",
                                  choices=COMPUTE_CLOCKS),
    # Real-time chunking
    "rtc.mode": Spec(_loop("rtc_mode"), "real-time chunking mode (the model must support it: its adapter's "
                                        "rtc_modes)", choices=RTC_MODES),
    "rtc.schedule": Spec(_loop("rtc_schedule"), "soft-mask schedule over the overlap", choices=("exp", "linear")),
    "rtc.overlap": Spec(_loop("rtc_overlap"), "s: the next inference starts when this many actions of the current "
                                              "chunk remain beyond the expected delay d (below H)", range=(0, 1000)),
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
    "lifecycle.autostart": Spec("active", "how far the node brings itself at start: active (configure, then act), "
                                          "configured (policy loaded and warmed up, waiting for activate) or "
                                          "unconfigured (a lifecycle manager drives every transition)",
                                choices=("active", "configured", "unconfigured")),
    "diagnostics.period": Spec(1.0, "seconds between /diagnostics reports", range=(0.001, 60.0)),
}


def _element_kind(spec: Spec) -> type:
    return type(spec.default[0]) if spec.default else str


def _coerce(name: str, spec: Spec, value: Any) -> Any:
    """The value in the spec's type (an int where a float belongs is taken; nothing else is converted)."""
    kind = spec.kind

    def one(v, k):
        if k is float and isinstance(v, int) and not isinstance(v, bool):
            return float(v)
        if k is int and isinstance(v, bool) or not isinstance(v, k):
            raise ParameterError(f"{name} = {value!r}: expected {'a list of ' + k.__name__ if kind is list else k.__name__}")
        return v

    if kind is list:   # a list, tuple or rclpy's array
        if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
            raise ParameterError(f"{name} = {value!r}: expected a list of {_element_kind(spec).__name__}")
        return tuple(one(v, _element_kind(spec)) for v in value)
    return one(value, kind)


def _check(name: str, spec: Spec, value: Any) -> None:
    if spec.choices and value not in spec.choices:
        raise ParameterError(f"{name} = {value!r}: must be one of {', '.join(spec.choices)}")
    if spec.range is not None and spec.kind in (int, float):
        lo, hi = spec.range
        if not lo <= value <= hi:
            raise ParameterError(f"{name} = {value!r}: must be in [{lo}, {hi}]")


def _sections() -> Dict[str, list]:
    out: Dict[str, list] = {}
    for name in SPECS:
        section, _, field = name.rpartition(".")
        out.setdefault(section, []).append((field, name))
    return out


_SECTIONS = _sections()   # section ('' for top-level names) -> [(field, dotted name)], in table order


def _make_classes():
    """The Parameters dataclass and one frozen dataclass per section, generated from SPECS."""
    fields = []
    sections = {}
    for section, members in _SECTIONS.items():
        if not section:
            fields += [(field, Any) for field, _ in members]
            continue
        cls = dataclasses.make_dataclass(f"{section.title()}Parameters", [(f, Any) for f, _ in members], frozen=True)
        sections[section] = cls
        fields.append((section, cls))
    return dataclasses.make_dataclass("ParameterValues", fields, frozen=True), sections


_Values, _SECTION_CLASSES = _make_classes()


class Parameters(_Values):
    """The node's parameters, typed and checked (one attribute per table entry: ``p.model.checkpoint``,
    ``p.max_observation_age``). Built with ``Parameters.of(values)`` from dotted names."""

    @classmethod
    def of(cls, values: Mapping[str, Any] = ()) -> "Parameters":
        """From dotted names (missing ones take their defaults), each value type- and range-checked; unknown
        names are refused with the closest declared one as a hint."""
        values = dict(values)
        unknown = sorted(set(values) - set(SPECS))
        if unknown:
            raise unknown_names_error(unknown)
        flat = {}
        for name, spec in SPECS.items():
            value = _coerce(name, spec, values[name]) if name in values else (
                tuple(spec.default) if isinstance(spec.default, list) else spec.default)
            _check(name, spec, value)
            flat[name] = value
        _check_together(flat)
        kwargs: Dict[str, Any] = {}
        for section, members in _SECTIONS.items():
            if not section:
                kwargs.update({field: flat[name] for field, name in members})
            else:
                kwargs[section] = _SECTION_CLASSES[section](**{field: flat[name] for field, name in members})
        return cls(**kwargs)

    def values(self) -> Dict[str, Any]:
        """The dotted-name view (lists as lists), e.g. for ROS parameter files and logs."""
        out = {}
        for section, members in _SECTIONS.items():
            holder = getattr(self, section) if section else self
            for field, name in members:
                v = getattr(holder, field)
                out[name] = list(v) if isinstance(v, tuple) else v
        return out

    def replace(self, **dotted: Any) -> "Parameters":
        """A copy with some dotted names changed (``p.replace(**{"control.horizon": 50})``), checked again."""
        return Parameters.of({**self.values(), **dotted})

    def control_config(self, image_input_size: Optional[int] = None) -> ControlConfig:
        """The control loop's configuration (the one mapping from parameters to it); ``control.horizon`` must be
        known by now (the checkpoint's, see phyai_ros.policies)."""
        c = self.cameras
        try:
            return ControlConfig(
                dt=self.control.dt, horizon=self.control.horizon, action_dim=len(self.control.action_names),
                cameras=[s for s, r in zip(c.slots, c.required) if r],
                optional_cameras=[s for s, r in zip(c.slots, c.required) if not r],
                state_joint_names=list(self.state.joint_names),
                max_observation_age=self.max_observation_age, max_state_age=self.state.max_age,
                max_image_pixels=self.cameras.max_pixels, max_instruction_chars=self.instruction.max_length,
                default_instruction=self.instruction.default, require_instruction=True,
                rtc_mode=self.rtc.mode, rtc_schedule=self.rtc.schedule, rtc_overlap=self.rtc.overlap,
                delay_quantile=self.rtc.delay_quantile,
                cold_start_inferences=0 if self.model.warmup_runs > 0 else 1,
                deadline_policy=self.control.deadline_policy,
                margin_window=self.margin.window, eps=self.margin.eps, confidence=self.margin.confidence,
                min_samples=self.margin.min_samples, error_p_threshold=self.margin.error_probability,
                error_consecutive_misses=self.margin.error_consecutive_misses, model_id=self.model.id,
                image_input_size=image_input_size, compute_clock=self.control.compute_clock)
        except ValueError as exc:   # the loop's own rules, in the parameters' names
            raise ParameterError(f"control configuration from the parameters: {_in_parameter_names(str(exc))} "
                                 f"(control.horizon = {self.control.horizon})") from None


# The loop's field names in its messages -> the parameters that set them.
_LOOP_NAMES = {"rtc_overlap": "rtc.overlap", "horizon": "control.horizon", "margin_window": "margin.window",
               "eps": "margin.eps", "confidence": "margin.confidence", "dt": "control.dt"}


def _in_parameter_names(text: str) -> str:
    return re.sub(r"\b(" + "|".join(_LOOP_NAMES) + r")\b", lambda m: _LOOP_NAMES[m.group(1)], text)


def _check_together(v: Mapping[str, Any]) -> None:
    n = len(v["cameras.slots"])
    for key in ("cameras.topics", "cameras.compressed", "cameras.required"):
        if len(v[key]) != n:
            raise ParameterError(f"{key} has {len(v[key])} entries for {n} cameras.slots")
    if not v["state.joint_names"]:
        raise ParameterError("state.joint_names is empty")
    if not v["control.action_names"]:
        raise ParameterError("control.action_names is empty")


def unknown_names_error(unknown) -> ParameterError:
    """Unknown parameter names, each with the closest declared name as a hint (a typo would keep the default)."""
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, SPECS, n=1, cutoff=0.6)
        parts.append(name + (f" (did you mean {close[0]}?)" if close else ""))
    return ParameterError(f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(parts)}: not declared "
                          "by this node (check the params file's keys and the -p names)")


__all__ = ["Spec", "SPECS", "Parameters", "ParameterError", "unknown_names_error"]
