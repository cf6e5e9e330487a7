"""The node's parameters: one typed field per parameter, each with its default, range, choices and description
(its ``Spec``), in the section dataclasses below; the node, the replay tools and the policy bridge read them. ROS-free.

Declaring from these keeps the YAML files, the launch file and the docs honest: every parameter is typed and
documented where it is declared, and none can change under a running node (all are read at start). Dotted names
(``model.checkpoint``) are sections of the object (``params.model.checkpoint``) and nested YAML keys under
``ros__parameters``; ``SPECS`` is the same table by dotted name, read off the fields. A field's annotation is its
value's type (a list parameter is a tuple of its element type) and must agree with its default: checked at import,
so the two cannot drift. The table checks what a value alone decides (type, range, choice, list lengths); facts that
need the model (its RTC modes, chunk size, dims) are checked where the model is loaded (phyai_ros.policies), and
the control loop's own rules by ``ControlConfig``.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple, TypeVar

from phyai_ros.control.loop import COMPUTE_CLOCKS, ControlConfig
from phyai_ros.control.rtc import RTC_MODES


@dataclass(frozen=True)
class Spec:
    """One parameter's declaration: default (a list for a list parameter, as ROS declares it), description, the
    range of a number and the choices of a string; written on its field with ``param``."""

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


T = TypeVar("T")


def param(default: T, description: str, *, range: Optional[Tuple[float, float]] = None,
          choices: Tuple[str, ...] = ()) -> T:
    """One parameter's field: ``default`` (a tuple for a list parameter) and its Spec (a list default, as ROS
    declares it). Typed as its default, so a type checker holds the default to the field's annotation."""
    spec = Spec(list(default) if isinstance(default, tuple) else default, description, range, tuple(choices))
    return dataclasses.field(default=default, metadata={"spec": spec})


@dataclass(frozen=True)
class ModelParameters:
    """Which policy runs, from which files, on which device."""

    type: str = param("", "policy family (a registered one: phyai_ros.models); empty: the checkpoint's "
                          "config.json type, which a given family must match")
    id: str = param("pi05", "model id written into every ActionChunk")
    checkpoint: str = param("", "LeRobot/openpi checkpoint folder (config.json + model.safetensors); "
                                "empty with model.random_init runs random weights for tests")
    tokenizer: str = param("", "SentencePiece tokenizer.model file (pi0, pi0.5; GR00T N1.7 reads its backbone's: "
                               "empty)")
    options: str = param("", "the family's run settings that are not in its checkpoint, as 'key=value;key=value' "
                             "(e.g. Cosmos3: num_steps=4;guidance=3.0;chunk_size=32); families without any refuse "
                             "them; empty: the family's defaults")
    embodiment: str = param("", "embodiment of a multi-embodiment policy (GR00T N1.7): a tag of the checkpoint's "
                                "processor config or its numeric id; empty: the checkpoint's own")
    norm_stats: str = param("", "normalization stats (norm_stats.json); empty: checkpoint folder's")
    device: str = param("cuda", "torch device", choices=("cuda", "cpu"))
    dtype: str = param("bfloat16", "weights/activations dtype", choices=("bfloat16", "float32"))
    cuda_graphs: bool = param(True, "replay prefix and denoising loop from CUDA graphs (cuda only)")
    noise_seed: int = param(0, "seed of the flow-matching noise generator", range=(0, 2**31 - 1))
    token_bucket: int = param(0, "cut the prompt's right-padding to a multiple of this many tokens (one CUDA "
                                 "graph per length, all captured at start-up); 0 keeps the full budget",
                              range=(0, 1024))
    op_profile: str = param("", "operator profile JSON written by scripts/profile_ops.py on this device; empty: "
                                "this device's cached profile (model.op_autotune), else a shipped one found by "
                                "device name (profiles/*.json), else every fused kernel that builds here")
    op_autotune: str = param("auto", "when no operator profile has a table for this device (or its cached one "
                                     "lacks shapes this model calls): time a shortlist of candidates per (op, "
                                     "shape) call of the warm-up (the ones the nearest measured device found "
                                     "fastest, and the default) within model.op_autotune_budget, and cache the "
                                     "choices per device for the next start. auto: on CUDA devices; on: any "
                                     "device; off: never", choices=("auto", "on", "off"))
    op_autotune_budget: float = param(30.0, "wall-time budget of the start-up autotune (s); calls it does not "
                                            "reach keep their defaults and are tuned at the next start",
                                      range=(1.0, 3600.0))
    quant_plan: str = param("measured", "a quantized checkpoint's linears: measured: each runs its quantized "
                                        "kernels where this device's profile measured them faster, and the bf16 "
                                        "path on its dequantized weight elsewhere (a bf16 copy is kept for those); "
                                        "all: every quantized linear always runs its quantized kernels",
                            choices=("measured", "all"))
    warmup_runs: int = param(2, "inferences run before the node starts acting (graph capture, cold start)",
                             range=(0, 100))


@dataclass(frozen=True)
class PolicyParameters:
    """Where the policy runs: in this process, or on a serve endpoint (phyai_ros.serve; robot id = node name)."""

    backend: str = param("onboard", "onboard: the model runs in this node; remote: snapshots go to "
                                    "policy.endpoint (Ray Serve) over HTTP and chunks come back",
                         choices=("onboard", "remote"))
    endpoint: str = param("http://127.0.0.1:8000", "the serve endpoint (remote backend)")
    timeout: float = param(1.0, "a remote call not answered within this (s, the whole call) is an inference error",
                           range=(0.001, 60.0))
    token: str = param("", "bearer token the serve endpoint requires (its --token-file / PHYAI_SERVE_TOKEN); empty: "
                           "PHYAI_SERVE_TOKEN from the node's environment, else none. Never logged; other DDS "
                           "participants can read parameters, so prefer the environment variable there")


@dataclass(frozen=True)
class CamerasParameters:
    """Parallel arrays, one entry per policy camera slot, in slot order."""

    slots: Tuple[str, ...] = param(("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"),
                                   "policy camera slot names, in the model's slot order")
    topics: Tuple[str, ...] = param(("cameras/base/image", "cameras/left_wrist/image", "cameras/right_wrist/image"),
                                    "image topic per slot (remap these in the launch file)")
    compressed: Tuple[bool, ...] = param((False, False, False), "per slot: true subscribes "
                                         "sensor_msgs/CompressedImage, false sensor_msgs/Image")
    required: Tuple[bool, ...] = param((True, True, False),
                                       "per slot: a required camera that is missing or old makes the observation "
                                       "stale; an optional one is masked out instead (and its slot skipped: the "
                                       "start-up captures every camera count from the required ones up)")
    max_pixels: int = param(_loop("max_image_pixels"), "largest frame accepted (width x height, read from a "
                                                       "compressed image's header or a raw image's fields before "
                                                       "decoding); larger ones are bad_image",
                            range=(1, 2**31 - 1))


@dataclass(frozen=True)
class StateParameters:
    """The robot's joint state."""

    topic: str = param("joint_states", "sensor_msgs/JointState topic")
    joint_names: Tuple[str, ...] = param(("joint_0", "joint_1", "joint_2", "joint_3", "joint_4", "joint_5", "gripper"),
                                         "joint names in the policy's state order")
    max_age: float = param(0.25, "state older than this (s) makes the observation stale", range=(0.001, 10.0))


@dataclass(frozen=True)
class InstructionParameters:
    """The task the policy is given."""

    topic: str = param("instruction", "std_msgs/String topic (transient local)")
    default: str = param(_loop("default_instruction"), "instruction used until one arrives; empty waits for one")
    max_length: int = param(_loop("max_instruction_chars"), "longest instruction accepted (characters); a longer "
                                                            "one is refused (bad_input), the task kept",
                            range=(1, 10_000_000))


@dataclass(frozen=True)
class ControlParameters:
    """The action timer and the chunk it executes."""

    dt: float = param(0.02, "action period (s); the action timer runs at 1/dt", range=(0.001, 1.0))
    horizon: int = param(0, "actions per chunk (H); 0: the checkpoint's chunk size, which a given value must "
                            "match", range=(0, MAX_HORIZON))
    action_names: Tuple[str, ...] = param(("joint_0", "joint_1", "joint_2", "joint_3", "joint_4", "joint_5",
                                           "gripper"), "names of the D action values, in the policy's action order")
    deadline_policy: str = param(_loop("deadline_policy"), "what the timer does when the chunk runs out",
                                 choices=("hold_last", "stop", "extrapolate_tail"))
    compute_clock: str = param(_loop("compute_clock"), "clock of the compute segments (queue, inference, actuate): "
                                                       "monotonic, converted at the stamp clock's measured rate "
                                                       "(robot, real-time replay); stamp: ROS time itself (a stepped "
                                                       "replay holds /clock while the node computes, so they take no "
                                                       "simulated time)",
                               choices=COMPUTE_CLOCKS)


@dataclass(frozen=True)
class RtcParameters:
    """Real-time chunking."""

    mode: str = param(_loop("rtc_mode"), "real-time chunking mode (the model must support it: its adapter's "
                                         "rtc_modes)", choices=RTC_MODES)
    schedule: str = param(_loop("rtc_schedule"), "soft-mask schedule over the overlap", choices=("exp", "linear"))
    overlap: int = param(_loop("rtc_overlap"), "s: the next inference starts when this many actions of the current "
                                               "chunk remain beyond the expected delay d (below H)", range=(0, 1000))
    delay_quantile: float = param(_loop("delay_quantile"), "quantile of measured latency used as the expected "
                                                           "delay d", range=(0.5, 1.0))
    jacobian: str = param("identity", "guided RTC correction: 'identity' (LeRobot's form, captured in the CUDA "
                                      "graph) or 'vjp' (the paper's vector-Jacobian product: one backward pass "
                                      "per step, run eagerly)", choices=("identity", "vjp"))
    max_guidance: float = param(10.0, "largest guidance weight", range=(0.0, 100.0))


@dataclass(frozen=True)
class OutputParameters:
    """What the node publishes, and where."""

    command_topic: str = param("command", "per-tick command topic")
    command_type: str = param("joint_trajectory", "per-tick command message",
                              choices=("joint_trajectory", "float64_multi_array"))
    chunk_topic: str = param("action_chunk", "phyai_ros/ActionChunk topic")
    chunk_trajectory_topic: str = param("", "if set, every chunk is also published as a JointTrajectory "
                                            "(for ros2_control's joint_trajectory_controller)")
    margin_topic: str = param("control_margin", "phyai_ros/ControlMargin topic")


@dataclass(frozen=True)
class MarginParameters:
    """The margin monitor: its window, budget and status rules (docs/design.md §3)."""

    window: int = param(_loop("margin_window"), "chunks in the sliding statistics window", range=(1, 100000))
    eps: float = param(_loop("eps"), "budget: P(M_ctrl >= 0) >= 1 - eps", range=(0.0, 1.0))
    confidence: float = param(_loop("confidence"), "confidence of the lower bound on P(M_ctrl >= 0)",
                              range=(0.5, 0.9999))
    min_samples: int = param(_loop("min_samples"), "chunks needed in the window before the status can be OK",
                             range=(1, 100000))
    error_probability: float = param(_loop("error_p_threshold"), "ERROR when the estimated P(M_ctrl >= 0) falls "
                                                                 "below this; between this and an OK lower bound "
                                                                 "the status is WARN", range=(0.0, 1.0))
    error_consecutive_misses: int = param(_loop("error_consecutive_misses"), "ERROR when this many chunks in a row "
                                                                             "had M_ctrl < 0", range=(1, 1000))


@dataclass(frozen=True)
class LifecycleParameters:
    """How far the node brings itself."""

    autostart: str = param("active", "how far the node brings itself at start: active (configure, then act), "
                                     "configured (policy loaded and warmed up, waiting for activate) or "
                                     "unconfigured (a lifecycle manager drives every transition)",
                           choices=("active", "configured", "unconfigured"))


@dataclass(frozen=True)
class DiagnosticsParameters:
    """The node's /diagnostics."""

    period: float = param(1.0, "seconds between /diagnostics reports", range=(0.001, 60.0))


@dataclass(frozen=True, kw_only=True)
class Parameters:
    """The node's parameters, typed and checked: one section per dotted prefix and one attribute per parameter
    (``p.model.checkpoint``, ``p.max_observation_age``), in the table's order. Built with ``Parameters.of(values)``
    from dotted names."""

    model: ModelParameters
    policy: PolicyParameters
    cameras: CamerasParameters
    max_observation_age: float = param(_loop("max_observation_age"), "a required camera older than this (s) "
                                                                     "makes the observation stale",
                                       range=(0.001, 10.0))
    state: StateParameters
    instruction: InstructionParameters
    control: ControlParameters
    rtc: RtcParameters
    output: OutputParameters
    margin: MarginParameters
    lifecycle: LifecycleParameters
    diagnostics: DiagnosticsParameters

    @classmethod
    def of(cls, values: Optional[Mapping[str, Any]] = None) -> "Parameters":
        """From dotted names (missing ones take their defaults), each value type- and range-checked; unknown
        names are refused with the closest declared one as a hint."""
        values = dict(values or {})
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


def _element_kind(spec: Spec) -> type:
    return type(spec.default[0]) if spec.default else str


def declared_type(spec: Spec) -> Any:
    """The annotation a parameter's field must have: its default's type (bool, int, float, str), a tuple of the
    element type for a list parameter."""
    return Tuple[_element_kind(spec), ...] if spec.kind is list else spec.kind


def _shape(annotation: Any) -> tuple:
    """An annotation as (origin, arguments), so ``Tuple[str, ...]`` and ``tuple[str, ...]`` are one type."""
    return (typing.get_origin(annotation) or annotation, typing.get_args(annotation))


def _table(root: type) -> Tuple[Dict[str, Spec], Dict[str, list], Dict[str, type]]:
    """(dotted name -> Spec, section -> [(field, dotted name)], section -> its dataclass), read off ``root``'s
    fields and its sections'; TypeError for a field whose annotation is not its default's type."""
    specs: Dict[str, Spec] = {}
    sections: Dict[str, list] = {}
    classes: Dict[str, type] = {}
    top = typing.get_type_hints(root)
    for f in dataclasses.fields(root):
        if "spec" in f.metadata:   # a top-level parameter
            section, members = "", [(f.name, f.name, f.metadata["spec"], top[f.name])]
        else:
            section, classes[f.name] = f.name, top[f.name]
            hints = typing.get_type_hints(top[f.name])
            members = [(g.name, f"{f.name}.{g.name}", g.metadata["spec"], hints[g.name])
                       for g in dataclasses.fields(top[f.name])]
        for field, name, spec, annotation in members:
            if _shape(annotation) != _shape(declared_type(spec)):
                raise TypeError(f"parameter {name}: its field is typed {annotation!r}, its default "
                                f"{spec.default!r} is {declared_type(spec)!r}")
            specs[name] = spec
            sections.setdefault(section, []).append((field, name))
    return specs, sections, classes


# name -> spec, in the fields' order; dotted names are sections of Parameters and nested YAML keys under
# ros__parameters. _SECTIONS: section ('' for top-level names) -> [(field, dotted name)]; _SECTION_CLASSES:
# section -> its dataclass.
SPECS, _SECTIONS, _SECTION_CLASSES = _table(Parameters)


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


__all__ = ["Spec", "SPECS", "Parameters", "ParameterError", "param", "declared_type", "unknown_names_error"]
