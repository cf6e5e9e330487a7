"""One request and one reply of the served policy, and their compact binary encoding.

A message is ``u32 little-endian JSON length | JSON header | safetensors bytes``: the header carries the small
fields (robot id, task, seed, RTC scalars, timings), the safetensors part the arrays (images, state, the RTC
prefix Y, the chunk). Both the HTTP route and the in-process handle carry the same ``Request``/``Reply``, so a
robot's request means the same on every path. Decoding checks every field and raises ``BadRequest`` naming it;
the tensors' names, dtypes and shapes are checked from the safetensors header before any array is made (an
image tensor is held to the intake's frame rule, control.observation.FrameLimits, so one larger than the intake
limit is refused without being allocated).
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from phyai_ros.control.observation import MAX_IMAGE_PIXELS, BadImageError, FrameLimits
from phyai_ros.control.rtc import RtcRequest, check_action_magnitudes
from phyai_ros.parameters import MAX_HORIZON

_LEN = struct.Struct("<I")
_ST_LEN = struct.Struct("<Q")   # a safetensors buffer starts with its JSON header's length
_RTC_FIELDS = ("mode", "schedule", "d", "horizon", "t0_ns", "dt_ns")
MAX_CAMERAS = 16          # image tensors in one request
MAX_VECTOR = 4096         # state length, action / RTC prefix width
MAX_ROBOT_ID = 128        # characters of a robot id (error replies echo it)
# safetensors' dtype names -> numpy's, which the frame rule speaks (one it lacks, e.g. BF16, is shown as it is)
_NUMPY_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "U32": "uint32",
                 "I32": "int32", "U64": "uint64", "I64": "int64", "F16": "float16", "F32": "float32",
                 "F64": "float64"}


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


def _prefixed_json(data: bytes, prefix: struct.Struct, part: str, what: str) -> tuple[dict, int]:
    """The JSON object ``what`` that follows ``data``'s length ``prefix`` (the message's header, the tensor
    part's header) and the offset where it ends; BadRequest when it is cut short, undecodable or not an object."""
    if len(data) < prefix.size:
        raise BadRequest(f"{part} of {len(data)} bytes is shorter than its length prefix")
    (n,) = prefix.unpack_from(data)
    end = prefix.size + n
    if end > len(data):
        raise BadRequest(f"{what} length {n} runs past the {part}'s {len(data)} bytes")
    try:
        head = json.loads(data[prefix.size:end])
    except Exception as exc:  # noqa: BLE001 - any decoding failure is the sender's
        raise BadRequest(f"undecodable {what}: {type(exc).__name__}: {exc}") from None
    if not isinstance(head, dict):
        raise BadRequest(f"{what} is not a JSON object")
    return head, end


def _split(data: bytes) -> tuple[dict, bytes]:
    """(JSON header, safetensors part) of a message."""
    header, end = _prefixed_json(data, _LEN, "message", "header")
    return header, data[end:]


def tensor_specs(body: bytes) -> dict:
    """name -> (dtype, shape) from a safetensors buffer's header, read without making any array."""
    head, _ = _prefixed_json(body, _ST_LEN, "tensor part", "tensor header")
    specs = {}
    for name, info in head.items():
        if name == "__metadata__":
            continue
        shape = info.get("shape") if isinstance(info, dict) else None
        if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                for d in shape)):
            raise BadRequest(f"tensor '{name}': malformed header entry {str(info)[:80]}")
        specs[name] = (info.get("dtype"), tuple(shape))
    return specs


def _tensors(body: bytes, check: Callable[[dict], None]) -> dict:
    """The arrays of a message's tensor part, after ``check`` has passed their header (names, dtypes, shapes)."""
    if not body:
        return {}
    check(tensor_specs(body))
    try:
        return st_load(body)
    except Exception as exc:  # noqa: BLE001 - any decoding failure is the sender's
        raise BadRequest(f"undecodable tensors: {type(exc).__name__}: {exc}") from None


def _require(spec: tuple, name: str, dtype: str, rank: int, robot: str = "") -> tuple:
    got_dtype, shape = spec
    if got_dtype != dtype or len(shape) != rank:
        raise BadRequest(f"{robot + ': ' if robot else ''}tensor '{name}' must be {dtype} of rank {rank}, got "
                         f"{got_dtype} {list(shape)}")
    return shape


def _numpy_dtype(name) -> str:
    """A header's dtype in numpy's words (any JSON value a sender wrote there, shown as it is when numpy has none)."""
    return _NUMPY_DTYPES.get(name, name) if isinstance(name, str) else repr(name)[:40]


def _check_request_tensors(robot: str, max_image_pixels: int) -> Callable[[dict], None]:
    frame = FrameLimits(max_pixels=max_image_pixels, max_pixels_name="the server's max_image_pixels")

    def check(specs: dict) -> None:
        images = [k for k in specs if k.startswith("image.")]
        unknown = sorted(set(specs) - set(images) - {"state", "rtc.prefix"})
        if unknown:
            raise BadRequest(f"{robot}: unknown tensors {unknown[:8]}")
        if len(images) > MAX_CAMERAS:
            raise BadRequest(f"{robot}: {len(images)} images, more than {MAX_CAMERAS}")
        for name in images:
            dtype, shape = specs[name]
            try:
                frame.check_layout(shape, _numpy_dtype(dtype), camera=name[len("image."):])
            except BadImageError as exc:
                raise BadRequest(f"{robot}: {exc}") from None
        if "state" in specs and _require(specs["state"], "state", "F32", 1, robot)[0] > MAX_VECTOR:
            raise BadRequest(f"{robot}: state of {specs['state'][1][0]} values, more than {MAX_VECTOR}")
        if "rtc.prefix" in specs:
            n, d = _require(specs["rtc.prefix"], "rtc.prefix", "F32", 2, robot)
            if n > MAX_HORIZON or d > MAX_VECTOR:
                raise BadRequest(f"{robot}: rtc.prefix {[n, d]} beyond [{MAX_HORIZON}, {MAX_VECTOR}]")
    return check


def _check_reply_tensors(specs: dict) -> None:
    if set(specs) != {"actions"}:
        raise BadRequest(f"reply must hold the tensor 'actions' alone, got {sorted(specs)[:8]}")
    h, d = _require(specs["actions"], "actions", "F32", 2)
    if h > MAX_HORIZON or d > MAX_VECTOR:
        raise BadRequest(f"reply actions {[h, d]} beyond [{MAX_HORIZON}, {MAX_VECTOR}]")


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
        raise BadRequest(f"{robot + ': ' if robot else ''}field '{name}' must be {kind.__name__}, got "
                         f"{_shown(value)}")
    return value


def _shown(value, limit: int = MAX_ROBOT_ID) -> str:
    """repr(value) cut to ``limit`` characters: what an error message may echo of a sender's field."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


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
    try:
        check_action_magnitudes(prefix, "rtc.prefix")
    except ValueError as exc:
        raise BadRequest(f"{robot}: {exc}") from None
    prefix.flags.writeable = False
    return RtcRequest(prefix=prefix, **vals)


def decode_request(data: bytes, max_image_pixels: int = MAX_IMAGE_PIXELS) -> Request:
    """A request from its bytes; an image larger than ``max_image_pixels`` is refused from the tensor header."""
    header, body = _split(data)
    robot = _field(header, "robot_id", str)
    if not robot:
        raise BadRequest("field 'robot_id' is empty")
    if len(robot) > MAX_ROBOT_ID:   # refused without echoing it: every later message names the robot
        raise BadRequest(f"field 'robot_id' of {len(robot)} characters is longer than {MAX_ROBOT_ID}")
    task, seed = _field(header, "task", str, robot), _field(header, "seed", int, robot)
    tensors = _tensors(body, _check_request_tensors(robot, max_image_pixels))
    if "state" not in tensors:
        raise BadRequest(f"{robot}: tensor 'state' is missing")
    images = {k[len("image."):]: v for k, v in tensors.items() if k.startswith("image.")}
    return Request(robot, images, tensors["state"], task, seed, _decode_rtc(header.get("rtc"), tensors, robot))


def encode_reply(r: Reply) -> bytes:
    header = {"robot_id": r.robot_id, "model_id": r.model_id, "queue_s": r.queue_s, "inference_s": r.inference_s,
              "batch_size": r.batch_size, **r.extra}
    return _pack(header, {"actions": np.ascontiguousarray(r.actions, dtype=np.float32)})


def _seconds(header: dict, name: str) -> float:
    value = header.get(name, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise BadRequest(f"reply field '{name}' must be a finite number of seconds >= 0, got {value!r}"[:200])
    return float(value)


def decode_reply(data: bytes) -> Reply:
    """A reply from its bytes; a field of the wrong type or range is a BadRequest naming it."""
    header, body = _split(data)
    tensors = _tensors(body, _check_reply_tensors)
    if "actions" not in tensors:
        raise BadRequest("reply holds no 'actions' tensor")
    robot, model = _field(header, "robot_id", str), header.get("model_id", "")
    batch = header.get("batch_size", 1)
    if not isinstance(model, str):
        raise BadRequest(f"reply field 'model_id' must be str, got {model!r}"[:200])
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise BadRequest(f"reply field 'batch_size' must be an int >= 1, got {batch!r}"[:200])
    known = {"robot_id", "model_id", "queue_s", "inference_s", "batch_size"}
    return Reply(robot, tensors["actions"], model, _seconds(header, "queue_s"), _seconds(header, "inference_s"),
                 batch, {k: v for k, v in header.items() if k not in known})
