"""Conversion between the package's types and its ROS messages: the one mapping.

``control.chunk.ActionChunk`` <-> ``phyai_ros/ActionChunk`` and ``control.margin.MarginReport`` <->
``phyai_ros/ControlMargin``.  The node and the replay tools use these helpers alone to build and read
the messages, so a malformed message is rejected in one place with one clear error, whoever sent it.
"""
from __future__ import annotations

import dataclasses
import functools
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np

from phyai_ros import needs_ros
from phyai_ros.control.chunk import ActionChunk
from phyai_ros.control.clock import NS_PER_S, stamp_to_ns
from phyai_ros.control.margin import MarginReport

if TYPE_CHECKING:
    from builtin_interfaces.msg import Time
    from phyai_ros.msg import ActionChunk as ActionChunkMsg, ControlMargin


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


def chunk_to_msg(chunk: ActionChunk) -> ActionChunkMsg:
    """The message of a chunk (``d`` is sent as ``frozen_prefix``, ``dt_ns`` as ``dt`` in seconds)."""
    actions = np.asarray(chunk.actions, dtype=np.float32)
    if actions.ndim != 2:
        raise ValueError(f"actions must be [H, D], got shape {actions.shape}")
    if chunk.action_names and len(chunk.action_names) != actions.shape[1]:
        raise ValueError(
            f"{len(chunk.action_names)} action names for action dimension {actions.shape[1]}")
    msg = _ros_types().ActionChunk()
    msg.header.stamp = ns_to_time(chunk.t0_ns)
    msg.header.frame_id = chunk.frame_id
    msg.observation_stamp = ns_to_time(chunk.observation_stamp_ns)
    msg.seq = int(chunk.seq)
    msg.dt = chunk.dt_ns / NS_PER_S
    msg.horizon, msg.action_dim = (int(n) for n in actions.shape)
    msg.action_names = list(chunk.action_names)
    msg.actions = actions.reshape(-1)  # rosidl accepts a float32 array as-is (no copy per element)
    msg.frozen_prefix = int(chunk.d)
    msg.model_id = chunk.model_id
    msg.inference_latency = float(chunk.inference_latency)
    return msg


def msg_to_chunk(msg: ActionChunkMsg) -> ActionChunk:
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
    if not (np.isfinite(msg.dt) and round(msg.dt * NS_PER_S) > 0):
        raise MalformedMessageError(f"ActionChunk seq {msg.seq}: dt must be positive, got {msg.dt}")
    if msg.frozen_prefix > h:
        raise MalformedMessageError(
            f"ActionChunk seq {msg.seq}: frozen_prefix {msg.frozen_prefix} exceeds horizon {h}")
    return ActionChunk(
        seq=int(msg.seq),
        t0_ns=stamp_to_ns(msg.header.stamp),
        dt_ns=int(round(msg.dt * NS_PER_S)),
        actions=actions.reshape(h, d),
        d=int(msg.frozen_prefix),
        observation_stamp_ns=stamp_to_ns(msg.observation_stamp),
        model_id=msg.model_id,
        action_names=tuple(msg.action_names),
        frame_id=msg.header.frame_id,
        inference_latency=float(msg.inference_latency),
    )


# The ControlMargin fields MarginReport carries by the same name (all but the stamp).
_MARGIN_FIELDS = ("chunk_seq", "expired", "budget", "latency_observe", "latency_transfer", "latency_queue",
                  "latency_inference", "latency_actuate", "margin", "margin_p50", "margin_p95", "margin_p99",
                  "window_size", "p_nonnegative", "p_nonnegative_lower", "confidence", "target", "level",
                  "message", "roofline_x", "roofline_y")
_CASTS = {"int": int, "float": float, "bool": bool, "str": str}
_MARGIN_CASTS = {f.name: _CASTS[getattr(f.type, "__name__", f.type)] for f in dataclasses.fields(MarginReport)
                 if f.name in _MARGIN_FIELDS}


def margin_to_msg(report: MarginReport) -> ControlMargin:
    """The message of a margin report, field by field (the stamp clamped at 0).  Non-finite floats
    (e.g. an empty window's quantiles) are sent as NaN, which the message carries faithfully;
    ``level`` must be one of OK/WARN/ERROR."""
    ControlMargin = _ros_types().ControlMargin
    if int(report.level) not in (ControlMargin.OK, ControlMargin.WARN, ControlMargin.ERROR):
        raise ValueError(f"margin level must be OK(0), WARN(1) or ERROR(2), got {report.level}")
    msg = ControlMargin()
    msg.stamp = ns_to_time(max(0, report.stamp_ns))
    for name in _MARGIN_FIELDS:
        setattr(msg, name, _MARGIN_CASTS[name](getattr(report, name)))
    return msg


def msg_to_margin(msg: ControlMargin) -> MarginReport:
    """The margin report of a ``ControlMargin`` (stamp in ns; the fields not on the wire at their defaults)."""
    return MarginReport(stamp_ns=stamp_to_ns(msg.stamp),
                        **{name: _MARGIN_CASTS[name](getattr(msg, name)) for name in _MARGIN_FIELDS})
