"""Conversion between the package's plain data and its ROS messages.

The node and the replay tools use these helpers alone to build and read
``ActionChunk`` / ``ControlMargin``, so a malformed message is rejected in one
place with one clear error, whoever sent it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Sequence

import numpy as np

from phyai_ros import needs_ros

if TYPE_CHECKING:
    from builtin_interfaces.msg import Time
    from phyai_ros.msg import ActionChunk, ControlMargin

NS_PER_S = 1_000_000_000


class MalformedMessageError(ValueError):
    """A received message contradicts itself (sizes, values) and cannot be used."""


@functools.cache
def _ros_types() -> SimpleNamespace:
    """The ROS message classes, imported when the first message is made: reading a message (a bag's, through
    rosbags) needs no ROS, so the replay reports and offline tools import this module without it."""
    with needs_ros(__name__):
        from builtin_interfaces.msg import Time
        from phyai_ros.msg import ActionChunk, ControlMargin
    return SimpleNamespace(Time=Time, ActionChunk=ActionChunk, ControlMargin=ControlMargin)


def ns_to_time(ns: int) -> Time:
    """ROS Time from integer nanoseconds (non-negative)."""
    if ns < 0:
        raise ValueError(f"cannot express negative time {ns} ns as builtin_interfaces/Time")
    sec, nanosec = divmod(int(ns), NS_PER_S)
    return _ros_types().Time(sec=sec, nanosec=nanosec)


def time_to_ns(stamp: Time) -> int:
    """Integer nanoseconds from a ROS Time (or anything with sec/nanosec)."""
    return int(stamp.sec) * NS_PER_S + int(stamp.nanosec)


@dataclass(frozen=True)
class ChunkData:
    """An action chunk as plain data: what the control loop produces and consumes."""

    seq: int
    t0_ns: int                 # intended time of action 0
    observation_ns: int        # oldest sensor stamp used
    dt: float                  # seconds between actions
    actions: np.ndarray        # float32 [H, D]
    frozen_prefix: int = 0
    action_names: tuple[str, ...] = ()
    model_id: str = ""
    inference_latency: float = 0.0
    frame_id: str = ""

    @property
    def horizon(self) -> int:
        return int(self.actions.shape[0])

    @property
    def action_dim(self) -> int:
        return int(self.actions.shape[1])


def chunk_to_msg(chunk: ChunkData) -> ActionChunk:
    actions = np.asarray(chunk.actions, dtype=np.float32)
    if actions.ndim != 2:
        raise ValueError(f"actions must be [H, D], got shape {actions.shape}")
    if chunk.action_names and len(chunk.action_names) != actions.shape[1]:
        raise ValueError(
            f"{len(chunk.action_names)} action names for action dimension {actions.shape[1]}")
    msg = _ros_types().ActionChunk()
    msg.header.stamp = ns_to_time(chunk.t0_ns)
    msg.header.frame_id = chunk.frame_id
    msg.observation_stamp = ns_to_time(chunk.observation_ns)
    msg.seq = int(chunk.seq)
    msg.dt = float(chunk.dt)
    msg.horizon, msg.action_dim = (int(n) for n in actions.shape)
    msg.action_names = list(chunk.action_names)
    msg.actions = actions.reshape(-1)  # rosidl accepts a float32 array as-is (no copy per element)
    msg.frozen_prefix = int(chunk.frozen_prefix)
    msg.model_id = chunk.model_id
    msg.inference_latency = float(chunk.inference_latency)
    return msg


def msg_to_chunk(msg: ActionChunk) -> ChunkData:
    """Validate and unpack an ``ActionChunk``; raise ``MalformedMessageError`` if inconsistent."""
    h, d = int(msg.horizon), int(msg.action_dim)
    actions = np.asarray(msg.actions, dtype=np.float32)
    if h <= 0 or d <= 0:
        raise MalformedMessageError(f"ActionChunk seq {msg.seq}: horizon {h} and action_dim {d} must be positive")
    if actions.size != h * d:
        raise MalformedMessageError(
            f"ActionChunk seq {msg.seq}: {actions.size} values in actions, expected horizon*action_dim = {h}*{d} = {h * d}")
    if msg.action_names and len(msg.action_names) != d:
        raise MalformedMessageError(
            f"ActionChunk seq {msg.seq}: {len(msg.action_names)} action_names for action_dim {d}")
    if not np.all(np.isfinite(actions)):
        raise MalformedMessageError(f"ActionChunk seq {msg.seq}: actions contain NaN or inf")
    if not (msg.dt > 0 and np.isfinite(msg.dt)):
        raise MalformedMessageError(f"ActionChunk seq {msg.seq}: dt must be positive, got {msg.dt}")
    if msg.frozen_prefix > h:
        raise MalformedMessageError(
            f"ActionChunk seq {msg.seq}: frozen_prefix {msg.frozen_prefix} exceeds horizon {h}")
    return ChunkData(
        seq=int(msg.seq),
        t0_ns=time_to_ns(msg.header.stamp),
        observation_ns=time_to_ns(msg.observation_stamp),
        dt=float(msg.dt),
        actions=actions.reshape(h, d),
        frozen_prefix=int(msg.frozen_prefix),
        action_names=tuple(msg.action_names),
        model_id=msg.model_id,
        inference_latency=float(msg.inference_latency),
        frame_id=msg.header.frame_id,
    )


# ControlMargin float fields, filled from a dict with the message's field names.
_MARGIN_FLOAT_FIELDS: Sequence[str] = (
    "budget", "latency_observe", "latency_transfer", "latency_queue", "latency_inference",
    "latency_actuate", "margin", "margin_p50", "margin_p95", "margin_p99", "p_nonnegative",
    "p_nonnegative_lower", "confidence", "target", "roofline_x", "roofline_y",
)


def margin_to_msg(stamp_ns: int, values: dict) -> ControlMargin:
    """Build a ``ControlMargin`` from a dict with the message's field names.

    Non-finite floats (e.g. an empty window's quantiles) are sent as NaN, which the
    message carries faithfully; ``level`` must be one of OK/WARN/ERROR.
    """
    ControlMargin = _ros_types().ControlMargin
    msg = ControlMargin()
    msg.stamp = ns_to_time(stamp_ns)
    for name in _MARGIN_FLOAT_FIELDS:
        setattr(msg, name, float(values[name]))
    msg.window_size = int(values.get("window_size", 0))
    msg.chunk_seq = int(values.get("chunk_seq", 0))
    msg.expired = bool(values.get("expired", False))
    level = int(values["level"])
    if level not in (ControlMargin.OK, ControlMargin.WARN, ControlMargin.ERROR):
        raise ValueError(f"margin level must be OK(0), WARN(1) or ERROR(2), got {level}")
    msg.level = level
    msg.message = str(values.get("message", ""))
    return msg


def msg_to_margin(msg: ControlMargin) -> dict:
    """Unpack a ``ControlMargin`` into a dict keyed by field name (stamp in ns)."""
    out = {name: float(getattr(msg, name)) for name in _MARGIN_FLOAT_FIELDS}
    out.update(stamp_ns=time_to_ns(msg.stamp), window_size=int(msg.window_size), chunk_seq=int(msg.chunk_seq),
               expired=bool(msg.expired), level=int(msg.level), message=msg.message)
    return out
