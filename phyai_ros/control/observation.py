"""Observation intake: newest frame per camera, newest state, current instruction.

Inputs are validated on arrival so bad data is rejected (and counted by the loop) at the
edge rather than surfacing as an exception inside inference.  A snapshot takes the newest
of each source; its stamp is the oldest sensor stamp it uses, and it is stale when a
required source is missing or older than ``max_observation_age`` (no inference on stale
data).  Arrays are stored as read-only views, so a snapshot is immutable without copying.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Optional, Sequence, Tuple, Union

import numpy as np


class ObservationError(ValueError):
    """Bad input; ``kind`` is the counter name the loop increments."""

    kind = "bad_input"


class BadImageError(ObservationError):
    kind = "bad_image"


class BadStateError(ObservationError):
    kind = "bad_state"


class MissingJointError(BadStateError):
    kind = "missing_joint"


class UnknownCameraError(ObservationError):
    kind = "unknown_camera"


class OutOfOrderStampError(ObservationError):
    kind = "out_of_order"


class FutureStampError(ObservationError):
    kind = "future_stamp"


def _readonly(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


# The intake limits: one home for the node's intake (its image converter and this buffer) and the served policy's
# (serve.wire and serve.engine), so a robot's input means the same on every path.
#
# Largest frame, in pixels (width x height): a DCI 4K frame fits; a 4000x4000 frame or a 6000x6000 PNG that
# compresses to 100 KB (108 MB decoded) does not. Checked on the size a compressed header, a raw message or a
# wire tensor declares before anything of that size is allocated, and again on the decoded frame.
MAX_IMAGE_PIXELS = 4096 * 2160
# Longest instruction, in characters: tokenising costs time in proportion (an 8 MB task once held the node's
# executor for 7 s); a task many times any prompt's token budget is a mistake or an attack, not a task.
MAX_INSTRUCTION_CHARS = 16384


@dataclass(frozen=True)
class FrameLimits:
    """What makes a camera frame usable, in one place: RGB ``uint8 [H, W, 3]``, not empty, at most ``max_pixels``
    (width x height), of ``expected_hw`` (H, W) when given, and, for a policy whose frames are resized with pad to
    a square ``input_size``, no more elongated than that resize keeps at least 1 px of (``max_aspect``).

    Every path holds a frame to these: the node's image converter and the serve wire check the layout a message
    or a tensor header declares before anything of its size is allocated (``check_layout``), the observation
    buffer and the serve engine the decoded array (``check``), each with the limits it knows."""

    max_pixels: int = MAX_IMAGE_PIXELS
    input_size: Optional[int] = None              # the policy's square image input; None: any aspect ratio
    expected_hw: Optional[Tuple[int, int]] = None  # (H, W) every frame must have; None: any size
    max_pixels_name: str = ""                     # the setting max_pixels comes from, named when a frame exceeds it

    @property
    def max_aspect(self) -> Optional[int]:
        """Longest-to-shortest side ratio a frame may have: resize-with-pad to ``input_size`` squared (the pi
        family's preprocessing) scales the long side to ``input_size`` and the short one to
        ``int(short * input_size / long)``, which is 0 px (the resize fails, every inference with it too) unless
        ``short * input_size >= long``. None without an ``input_size``."""
        return None if self.input_size is None else int(self.input_size)

    def check_layout(self, shape: Sequence[int], dtype: str = "uint8", camera: str = "") -> None:
        """A frame's shape and dtype (numpy's name) alone, as a header declares them or an array has them;
        BadImageError naming ``camera`` (when given) and what is wrong."""
        fault = self._fault(tuple(shape), dtype)
        if fault:
            raise self.error(fault, camera)

    @staticmethod
    def error(fault: str, camera: str = "") -> "BadImageError":
        """The error a refused frame raises, in the rule's words and naming the camera."""
        return BadImageError(f"camera '{camera}': {fault}" if camera else fault)

    def check(self, image, camera: str = "") -> np.ndarray:
        """A decoded frame (``check_layout`` on its array); returns it unchanged."""
        if not isinstance(image, np.ndarray):
            raise self.error(f"image must be a numpy array, got {type(image).__name__}", camera)
        self.check_layout(image.shape, image.dtype.name, camera)
        return image

    def _fault(self, shape: tuple, dtype: str) -> str:
        if dtype != "uint8":
            return f"image dtype must be uint8, got {dtype}"
        if len(shape) != 3 or shape[2] != 3:
            return f"image shape must be [H, W, 3], got {list(shape)}"
        h, w = int(shape[0]), int(shape[1])
        if h <= 0 or w <= 0:
            return f"empty image {w}x{h} (WxH)"
        if w * h > self.max_pixels:
            named = f" ({self.max_pixels_name})" if self.max_pixels_name else ""
            return f"image {w}x{h} (WxH) has {w * h:,} pixels, more than the limit of {self.max_pixels:,}{named}"
        if self.expected_hw is not None and (h, w) != tuple(self.expected_hw):
            return f"image size {[h, w]} != expected {list(self.expected_hw)}"
        if self.max_aspect is not None and min(h, w) * self.max_aspect < max(h, w):
            return (f"image {w}x{h} (WxH) is too elongated: aspect {max(h, w) / min(h, w):.0f}:1 exceeds "
                    f"{self.max_aspect}:1, the most the policy's resize-with-pad to {self.input_size}x"
                    f"{self.input_size} keeps at least 1 px of")
        return ""


def validate_instruction(text, max_chars: int = MAX_INSTRUCTION_CHARS) -> str:
    """A task the policy can be given: a string of at most ``max_chars`` characters with some non-blank text (a
    blank one would fail every inference, as the policies refuse an empty task)."""
    if not isinstance(text, str):
        raise ObservationError(f"instruction must be str, got {type(text).__name__}")
    if len(text) > max_chars:
        raise ObservationError(f"instruction of {len(text):,} characters is longer than the limit of {max_chars:,}")
    if not text.strip():
        raise ObservationError(f"instruction {text!r} is empty or blank (no task to give the policy)")
    return text


# Largest joint position magnitude accepted, in whatever unit the robot reports (rad, m, mm, encoder
# ticks up to 2**20): anything larger is a corrupt or uninitialised reading, not a pose, and float32 (what
# the policy computes in) no longer resolves a unit above ~1.7e7 either.
MAX_ABS_STATE = 1e6


def _checked_float32(values: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """float64 values -> float32 copy, after rejecting NaN/inf and magnitudes above ``MAX_ABS_STATE``
    (checked before the cast, so 1e300 is called what it is rather than the inf float32 makes of it)."""
    bad = ~np.isfinite(values)
    if bad.any():
        raise BadStateError(f"non-finite joint positions: {_named(values, bad, names)}")
    huge = np.abs(values) > MAX_ABS_STATE
    if huge.any():
        raise BadStateError(f"joint positions beyond +-{MAX_ABS_STATE:g} (MAX_ABS_STATE, not a physical pose): "
                            f"{_named(values, huge, names)}")
    return values.astype(np.float32)


def _named(values: np.ndarray, mask: np.ndarray, names: Sequence[str]) -> dict:
    return {names[i]: float(values[i]) for i in np.flatnonzero(mask)}


def validate_state(state, dim: int) -> np.ndarray:
    """State vector in policy order: 1-D, length ``dim``, finite, within ``MAX_ABS_STATE`` -> float32 copy."""
    try:
        v = np.asarray(state, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise BadStateError(f"state not numeric: {e}") from None
    if v.ndim != 1 or v.shape[0] != dim:
        raise BadStateError(f"state length must be {dim}, got shape {list(v.shape)}")
    return _checked_float32(v, [f"state[{i}]" for i in range(dim)])


class JointStateMapper:
    """Maps (names, positions) as in sensor_msgs/JointState to the policy's state order.
    Missing joints are an error (the policy would read garbage), so is a name given twice (which of
    its positions is meant?); extra joints are ignored."""

    def __init__(self, policy_order: Sequence[str]):
        if len(set(policy_order)) != len(policy_order):
            raise ValueError("policy joint order has duplicates")
        self.order = tuple(policy_order)

    def map(self, names: Sequence[str], positions: Sequence[float]) -> np.ndarray:
        if len(names) != len(positions):
            raise BadStateError(f"{len(names)} joint names but {len(positions)} positions")
        index = {n: i for i, n in enumerate(names)}
        if len(index) != len(names):
            dup = sorted({n for i, n in enumerate(names) if index[n] != i})  # index holds the last
            raise BadStateError(f"duplicate joint names in JointState: {dup}")
        missing = [n for n in self.order if n not in index]
        if missing:
            raise MissingJointError(f"joints missing from state: {missing}")
        try:
            out = np.array([float(positions[index[n]]) for n in self.order], dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise BadStateError(f"joint position not numeric: {e}") from None
        return _checked_float32(out, self.order)


@dataclass(frozen=True)
class ObservationSnapshot:
    """What one inference sees.  All stamps int ns (stamp time).

    ``stamp_ns`` is the oldest sensor stamp used; ``anchor_recv_ns`` is the receive time
    of that same sensor (so observe/transfer segments telescope); ``taken_ns`` is when
    the snapshot was taken.  Optional cameras that are missing/stale have ``None`` image
    and ``image_mask[name] = False``."""

    images: Mapping[str, Optional[np.ndarray]]
    image_mask: Mapping[str, bool]
    image_stamps_ns: Mapping[str, Optional[int]]
    state: Optional[np.ndarray]
    state_stamp_ns: Optional[int]
    instruction: str
    stamp_ns: int
    anchor_recv_ns: int
    taken_ns: int


@dataclass(frozen=True)
class StaleObservation:
    """Why no snapshot: ``reason`` 'missing' | 'too_old'; ``source`` camera slot or 'state'."""

    reason: str
    source: str
    age_s: Optional[float] = None

    def __str__(self) -> str:
        if self.reason == "missing":
            return f"{self.source}: no data"
        return f"{self.source}: {self.age_s:.3f} s old"


@dataclass(frozen=True)
class _Item:
    value: np.ndarray
    stamp_ns: int
    recv_ns: int


def check_stamp(stamp_ns: int, now_ns: int, held_stamp_ns: Optional[int], future_tolerance_ns: int,
                what: str) -> None:
    """The buffer's rule for a new sensor stamp (the replay's scan predicts the node's verdicts with it):
    FutureStampError beyond ``future_tolerance_ns`` ahead of now, OutOfOrderStampError if older than the
    stamp held for the same input; neither is stored."""
    if stamp_ns > now_ns + future_tolerance_ns:
        raise FutureStampError(f"{what}: stamp {(stamp_ns - now_ns) / 1e9:.3f} s in the future")
    if held_stamp_ns is not None and stamp_ns < held_stamp_ns:
        raise OutOfOrderStampError(f"{what}: stamp {(held_stamp_ns - stamp_ns) / 1e9:.3f} s older than held")


class ObservationBuffer:
    """Newest message per source.  Thread-safe (callbacks may run on several threads)."""

    def __init__(self, cameras: Sequence[str], optional_cameras: Sequence[str] = (), *,
                 state_dim: Optional[int], max_age_ns: int, frame: FrameLimits = FrameLimits(),
                 future_tolerance_ns: int = 500_000_000, default_instruction: str = "",
                 max_state_age_ns: Optional[int] = None, require_instruction: bool = False,
                 max_instruction_chars: int = MAX_INSTRUCTION_CHARS):
        names = list(cameras) + list(optional_cameras)
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate camera slots: {names}")
        self.required = tuple(cameras)
        self.optional = tuple(optional_cameras)
        self.state_dim = state_dim  # None: the policy takes no state
        self.max_age_ns = int(max_age_ns)
        self.max_state_age_ns = int(max_age_ns if max_state_age_ns is None else max_state_age_ns)
        self.frame = frame   # what a camera frame must be (size, aspect for the policy's input)
        self.max_instruction_chars = int(max_instruction_chars)
        self.future_tolerance_ns = int(future_tolerance_ns)
        self.default_instruction = default_instruction
        self.require_instruction = bool(require_instruction)
        self._lock = threading.Lock()
        self._instruction = default_instruction
        self.reset()

    def reset(self) -> None:
        """Forget frames and state, keep the instruction (used after a clock jump back)."""
        with self._lock:
            self._images: dict = {}
            self._state: Optional[_Item] = None

    def _check_stamp(self, held: Optional[_Item], stamp_ns: int, now_ns: int, what: str) -> None:
        check_stamp(stamp_ns, now_ns, None if held is None else held.stamp_ns, self.future_tolerance_ns, what)

    def put_image(self, slot: str, image, stamp_ns: int, now_ns: int) -> None:
        if slot not in self.required and slot not in self.optional:
            raise UnknownCameraError(f"unknown camera slot {slot!r}")
        img = self.frame.check(image, camera=slot)
        with self._lock:
            self._check_stamp(self._images.get(slot), int(stamp_ns), now_ns, slot)
            self._images[slot] = _Item(_readonly(img), int(stamp_ns), int(now_ns))

    def put_state(self, state, stamp_ns: int, now_ns: int) -> None:
        if self.state_dim is None:
            raise BadStateError("this policy takes no state")
        v = validate_state(state, self.state_dim)
        with self._lock:
            self._check_stamp(self._state, int(stamp_ns), now_ns, "state")
            self._state = _Item(_readonly(v), int(stamp_ns), int(now_ns))

    def set_instruction(self, text: str) -> None:
        try:
            validate_instruction(text, self.max_instruction_chars)
        except ObservationError as e:
            kept = self._instruction if len(self._instruction) <= 80 else self._instruction[:80] + "..."
            raise ObservationError(f"{e}; keeping {kept!r}") from None
        with self._lock:
            self._instruction = text

    @property
    def instruction(self) -> str:
        return self._instruction

    @property
    def latest_state(self) -> Optional[np.ndarray]:
        """The newest accepted state (policy order, read-only) or None."""
        st = self._state
        return None if st is None else st.value

    def snapshot(self, now_ns: int) -> Union[ObservationSnapshot, StaleObservation]:
        with self._lock:
            images, mask, stamps = {}, {}, {}
            used = []  # (stamp, recv)
            for slot in self.required:
                it = self._images.get(slot)
                if it is None:
                    return StaleObservation("missing", slot)
                age = now_ns - it.stamp_ns
                if age > self.max_age_ns:
                    return StaleObservation("too_old", slot, age / 1e9)
                images[slot], mask[slot], stamps[slot] = it.value, True, it.stamp_ns
                used.append((it.stamp_ns, it.recv_ns))
            for slot in self.optional:
                it = self._images.get(slot)
                if it is None or now_ns - it.stamp_ns > self.max_age_ns:
                    images[slot], mask[slot], stamps[slot] = None, False, None
                else:
                    images[slot], mask[slot], stamps[slot] = it.value, True, it.stamp_ns
                    used.append((it.stamp_ns, it.recv_ns))
            state = state_stamp = None
            if self.state_dim is not None:
                st = self._state
                if st is None:
                    return StaleObservation("missing", "state")
                age = now_ns - st.stamp_ns
                if age > self.max_state_age_ns:
                    return StaleObservation("too_old", "state", age / 1e9)
                state, state_stamp = st.value, st.stamp_ns
                used.append((st.stamp_ns, st.recv_ns))
            if not used:
                return StaleObservation("missing", "any sensor")
            if self.require_instruction and not self._instruction:
                return StaleObservation("missing", "instruction")
            anchor = min(used)  # oldest stamp; ties -> earliest receive
            return ObservationSnapshot(
                images=MappingProxyType(images), image_mask=MappingProxyType(mask),
                image_stamps_ns=MappingProxyType(stamps), state=state, state_stamp_ns=state_stamp,
                instruction=self._instruction, stamp_ns=anchor[0], anchor_recv_ns=anchor[1],
                taken_ns=int(now_ns))


__all__ = [
    "ObservationError", "BadImageError", "BadStateError", "MissingJointError", "UnknownCameraError",
    "OutOfOrderStampError", "FutureStampError", "FrameLimits", "validate_state", "JointStateMapper",
    "MAX_ABS_STATE", "MAX_IMAGE_PIXELS", "MAX_INSTRUCTION_CHARS",
    "validate_instruction", "check_stamp",
    "ObservationSnapshot", "StaleObservation", "ObservationBuffer",
]
