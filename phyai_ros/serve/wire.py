"""One request and one reply of the served policy, and their compact binary encoding.

A message is ``u32 little-endian JSON length | JSON header | safetensors bytes``: the header carries the small
fields (robot id, task, seed, RTC scalars, timings), the safetensors part the arrays (images, state, the RTC
prefix Y, the chunk). Both the HTTP route and the in-process handle carry the same ``Request``/``Reply``, so a
robot's request means the same on every path. Decoding checks every field and raises ``BadRequest`` naming it.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from phyai_ros.control.rtc import RtcRequest

_LEN = struct.Struct("<I")
_RTC_FIELDS = ("mode", "schedule", "d", "horizon", "t0_ns", "dt_ns")


class BadRequest(ValueError):
    """A request the server cannot run (malformed bytes, a bad field, an input the model refuses): a 4xx."""


@dataclass
class Request:
    """One robot's observation with its own RTC state and noise seed (images: camera slot -> uint8 HxWx3)."""

    robot_id: str
    images: dict
    state: np.ndarray
    task: str
    seed: int = 0
    rtc: Optional[RtcRequest] = None
    arrived_ns: int = 0   # server monotonic clock, set on arrival (queue time starts here)


@dataclass
class Reply:
    """The chunk [H, D] in robot units for ``robot_id``, with the server's timings (s) and model id."""

    robot_id: str
    actions: np.ndarray
    model_id: str
    queue_s: float = 0.0
    inference_s: float = 0.0
    batch_size: int = 1
    extra: dict = field(default_factory=dict)


@dataclass
class Failure:
    """A request that got no chunk, with the HTTP status it maps to (4xx: the request's fault, 5xx: the server's)."""

    robot_id: str
    status: int
    message: str


def _pack(header: dict, tensors: dict) -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    return _LEN.pack(len(head)) + head + (st_save(tensors) if tensors else b"")


def _unpack(data: bytes) -> tuple[dict, dict]:
    if len(data) < _LEN.size:
        raise BadRequest(f"message of {len(data)} bytes is shorter than its length prefix")
    (n,) = _LEN.unpack_from(data)
    if _LEN.size + n > len(data):
        raise BadRequest(f"header length {n} runs past the message's {len(data)} bytes")
    try:
        header = json.loads(data[_LEN.size:_LEN.size + n])
        body = data[_LEN.size + n:]
        tensors = st_load(body) if body else {}
    except Exception as exc:  # noqa: BLE001 - any decoding failure is the sender's
        raise BadRequest(f"undecodable message: {type(exc).__name__}: {exc}") from None
    if not isinstance(header, dict):
        raise BadRequest("header is not a JSON object")
    return header, tensors


def encode_request(r: Request) -> bytes:
    tensors = {f"image.{k}": np.ascontiguousarray(v) for k, v in r.images.items() if v is not None}
    tensors["state"] = np.ascontiguousarray(r.state, dtype=np.float32)
    header = {"robot_id": r.robot_id, "task": r.task, "seed": int(r.seed), "rtc": None}
    if r.rtc is not None:
        header["rtc"] = {k: getattr(r.rtc, k) for k in _RTC_FIELDS}
        tensors["rtc.prefix"] = np.ascontiguousarray(r.rtc.prefix, dtype=np.float32)
    return _pack(header, tensors)


def _field(header: dict, name: str, kind, robot: str = ""):
    value = header.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise BadRequest(f"{robot + ': ' if robot else ''}field '{name}' must be {kind.__name__}, got {value!r}")
    return value


def _decode_rtc(spec, tensors: dict, robot: str) -> Optional[RtcRequest]:
    if spec is None:
        return None
    if not isinstance(spec, dict) or "rtc.prefix" not in tensors:
        raise BadRequest(f"{robot}: field 'rtc' needs {', '.join(_RTC_FIELDS)} and the tensor 'rtc.prefix'")
    vals = {k: _field(spec, k, str if k in ("mode", "schedule") else int, robot) for k in _RTC_FIELDS}
    prefix = tensors["rtc.prefix"].astype(np.float32)
    if prefix.ndim != 2 or not 0 <= vals["d"] <= prefix.shape[0]:
        raise BadRequest(f"{robot}: rtc.prefix must be [n, D] with 0 <= d <= n, got {list(prefix.shape)} "
                         f"and d = {vals['d']}")
    prefix.flags.writeable = False
    return RtcRequest(prefix=prefix, **vals)


def decode_request(data: bytes) -> Request:
    header, tensors = _unpack(data)
    robot = _field(header, "robot_id", str)
    if not robot:
        raise BadRequest("field 'robot_id' is empty")
    task, seed = _field(header, "task", str, robot), _field(header, "seed", int, robot)
    if "state" not in tensors:
        raise BadRequest(f"{robot}: tensor 'state' is missing")
    images = {k[len("image."):]: v for k, v in tensors.items() if k.startswith("image.")}
    return Request(robot, images, tensors["state"], task, seed, _decode_rtc(header.get("rtc"), tensors, robot))


def encode_reply(r: Reply) -> bytes:
    header = {"robot_id": r.robot_id, "model_id": r.model_id, "queue_s": r.queue_s, "inference_s": r.inference_s,
              "batch_size": r.batch_size, **r.extra}
    return _pack(header, {"actions": np.ascontiguousarray(r.actions, dtype=np.float32)})


def decode_reply(data: bytes) -> Reply:
    header, tensors = _unpack(data)
    if "actions" not in tensors:
        raise BadRequest("reply holds no 'actions' tensor")
    known = {"robot_id", "model_id", "queue_s", "inference_s", "batch_size"}
    return Reply(header.get("robot_id", ""), tensors["actions"], header.get("model_id", ""),
                 float(header.get("queue_s", 0.0)), float(header.get("inference_s", 0.0)),
                 int(header.get("batch_size", 1)), {k: v for k, v in header.items() if k not in known})
