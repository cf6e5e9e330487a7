"""A synthetic but plausible robot session as a rosbag2, so demos and tests need no download.

The session: a tabletop arm repeatedly picks a red cube and puts it into a blue bowl
(one pick-and-place every ``episode_period`` seconds).  It is recorded the way a robot
records it:

* three cameras on the node's default topics: base ``sensor_msgs/Image`` rgb8, left wrist
  ``sensor_msgs/CompressedImage`` JPEG, right wrist ``sensor_msgs/Image`` rgb8, at 15-30 Hz,
  each with its own phase, capture jitter and capture->record latency (header stamp =
  capture time, bag timestamp = when the recorder got it);
* ``sensor_msgs/JointState`` at the control rate (7 arm joints + gripper, positions from
  the arm's motion, velocities, efforts);
* the task ``std_msgs/String`` on ``/instruction``, recorded with transient-local QoS.

Faults can be injected for robustness tests (a corrupt JPEG, a truncated message, a
missing topic, a gap in one topic, a jump of the session clock recorded on ``/clock``),
each at a known time, and ``DemoBag.truth`` says exactly what was injected.

CLI: ``python -m phyai_ros.replay.demo_bag OUT [--duration 40] [--storage mcap]``
(``ros2 run phyai_ros demo_bag`` on a ROS install).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from phyai_ros import needs_extra
from phyai_ros.control.clock import NS_PER_S
from phyai_ros.replay.bagtypes import typestore

DEFAULT_JOINTS = ("joint_0", "joint_1", "joint_2", "joint_3", "joint_4", "joint_5", "joint_6", "gripper")
DEFAULT_INSTRUCTION = "pick up the red cube and put it in the blue bowl"
DEFAULT_START_NS = 1_795_000_000 * NS_PER_S  # 2026-11-16, an arbitrary session start


@dataclass(frozen=True)
class CameraSpec:
    topic: str
    view: str              # 'base' | 'left_wrist' | 'right_wrist'
    rate_hz: float
    height: int
    width: int
    compressed: bool       # CompressedImage (JPEG) instead of Image rgb8
    latency_ms: float      # mean capture -> recorder latency


DEFAULT_CAMERAS = (
    CameraSpec("/cameras/base/image", "base", 15.0, 144, 192, False, 6.0),
    CameraSpec("/cameras/left_wrist/image", "left_wrist", 30.0, 144, 192, True, 14.0),
    CameraSpec("/cameras/right_wrist/image", "right_wrist", 15.0, 96, 128, False, 6.0),
)


@dataclass(frozen=True)
class Faults:
    """Injected problems; times are seconds from the session start (bag time)."""

    corrupt_jpeg: Sequence[float] = ()                      # compressed frames whose JPEG bytes are garbage
    truncated: Sequence[Tuple[str, float]] = ()             # (topic, t): the message's CDR cut in half
    drop_topics: Sequence[str] = ()                         # topics left out of the bag
    gaps: Sequence[Tuple[str, float, float]] = ()           # (topic or '*', start, duration): nothing recorded
    clock_jumps: Sequence[Tuple[float, float]] = ()         # (t, delta): the session clock jumps by delta


@dataclass
class DemoBagConfig:
    duration: float = 40.0
    storage: str = "mcap"                                   # 'mcap' | 'sqlite3'
    start_ns: int = DEFAULT_START_NS
    state_topic: str = "/joint_states"
    state_rate_hz: float = 50.0                             # the control rate of the demo config (dt 0.02)
    joint_names: Tuple[str, ...] = DEFAULT_JOINTS
    instruction_topic: str = "/instruction"
    instruction: str = DEFAULT_INSTRUCTION
    cameras: Tuple[CameraSpec, ...] = DEFAULT_CAMERAS
    episode_period: float = 12.0
    seed: int = 0
    faults: Faults = field(default_factory=Faults)
    record_clock: bool = False                              # also record the session clock on /clock
    clock_rate_hz: float = 100.0


@dataclass
class DemoBag:
    """What was written: counts per topic and the injected faults with their bag times (ns)."""

    path: Path
    storage: str
    duration: float
    counts: Dict[str, int]
    truth: Dict[str, list]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


# ----------------------------------------------------------------------------- the scene
_KEYS = (  # phase, end effector (x, y) on the table, height (m), gripper opening (0 closed .. 1 open)
    (0.00, (0.50, 0.30), 0.30, 1.0),
    (0.22, (0.30, 0.62), 0.12, 1.0),
    (0.30, (0.30, 0.62), 0.02, 1.0),
    (0.36, (0.30, 0.62), 0.02, 0.0),
    (0.44, (0.32, 0.58), 0.20, 0.0),
    (0.62, (0.72, 0.55), 0.20, 0.0),
    (0.70, (0.72, 0.55), 0.06, 0.0),
    (0.76, (0.72, 0.55), 0.06, 1.0),
    (0.86, (0.60, 0.40), 0.25, 1.0),
    (1.00, (0.50, 0.30), 0.30, 1.0),
)
_CUBE_START, _BOWL = np.array([0.30, 0.62]), np.array([0.72, 0.55])
_SHOULDER = np.array([0.50, 1.08])
_LINKS = (0.48, 0.46)


def _smooth(a: float) -> float:
    return 0.5 - 0.5 * math.cos(math.pi * min(max(a, 0.0), 1.0))


def scene_state(t: float, period: float) -> dict:
    """Arm and object state at session time t (s): end effector, height, gripper, cube."""
    phase = (t % period) / period
    for (p0, xy0, h0, g0), (p1, xy1, h1, g1) in zip(_KEYS, _KEYS[1:]):
        if p0 <= phase <= p1:
            a = _smooth((phase - p0) / (p1 - p0))
            break
    ee = (1 - a) * np.array(xy0) + a * np.array(xy1)
    height = (1 - a) * h0 + a * h1
    grip = (1 - a) * g0 + a * g1
    # small tremor so consecutive frames and states are never identical
    ee = ee + 0.004 * np.array([math.sin(7.1 * t), math.cos(5.3 * t)])
    if phase < 0.36:
        cube, cube_h = _CUBE_START.copy(), 0.0
    elif phase < 0.76:
        cube, cube_h = ee.copy(), max(height - 0.02, 0.0)
    else:
        cube, cube_h = _BOWL.copy(), 0.0
    return dict(ee=ee, height=height, grip=grip, cube=cube, cube_h=cube_h, phase=phase)


def arm_joints(t: float, s: dict) -> np.ndarray:
    """8 joint positions (rad; gripper in m) consistent with the scene: planar IK for
    joints 0-1, height for 2, smooth wrist motion for 3-6, gripper opening."""
    d = s["ee"] - _SHOULDER
    r = min(float(np.hypot(*d)), _LINKS[0] + _LINKS[1] - 1e-3)
    c2 = (r * r - _LINKS[0] ** 2 - _LINKS[1] ** 2) / (2 * _LINKS[0] * _LINKS[1])
    q1 = math.acos(max(-1.0, min(1.0, c2)))
    q0 = math.atan2(d[1], d[0]) - math.atan2(_LINKS[1] * math.sin(q1), _LINKS[0] + _LINKS[1] * math.cos(q1))
    return np.array([q0, q1, 1.2 - 2.5 * s["height"], 0.3 * math.sin(0.9 * t), 0.2 * math.cos(0.7 * t + 1.0),
                     0.5 * (s["ee"][0] - 0.5), 0.1 * math.sin(1.7 * t), 0.08 * s["grip"]])


def _opencv():
    """OpenCV (the ``bags`` extra), imported when frames are drawn: ``--help`` and the scene need none."""
    with needs_extra("bags", "drawing the demo session's camera frames"):
        import cv2
    return cv2


class Renderer:
    """Draws the table scene for the base camera (whole table) and the wrist cameras (zoomed on the
    gripper, fingers in view). Cheap: one affine warp of a texture plus a few primitives."""

    TEX = 512

    def __init__(self, seed: int):
        cv2 = _opencv()
        rng = np.random.default_rng(seed)
        low = cv2.resize(rng.normal(0, 1, (12, 12)).astype(np.float32), (self.TEX, self.TEX),
                         interpolation=cv2.INTER_CUBIC)
        grain = np.sin(np.linspace(0, 90, self.TEX))[None, :] * 0.5 + rng.normal(0, 0.35, (self.TEX, self.TEX))
        shade = 14 * low + 7 * grain
        base = np.array([168, 132, 96], np.float32)  # RGB wood
        self.texture = np.clip(base[None, None, :] + shade[..., None], 0, 255).astype(np.uint8)
        self.rng = np.random.default_rng(seed + 1)

    def _affine(self, view: str, h: int, w: int, s: dict):
        """(scale, offset) mapping table coords to pixel coords for a view."""
        if view == "base":
            return np.array([w * 0.92, h * 0.92]), np.array([w * 0.04, h * 0.02])
        zoom = 2.6 / (0.6 + 2.0 * s["height"])
        scale = np.array([w, w]) * zoom
        centre = s["ee"] + (np.array([0.03, 0.0]) if view == "left_wrist" else np.array([-0.03, 0.0]))
        return scale, np.array([w / 2, h * 0.45]) - centre * scale

    def render(self, view: str, h: int, w: int, t: float, s: dict) -> np.ndarray:
        cv2 = _opencv()
        scale, off = self._affine(view, h, w, s)
        m = np.array([[scale[0] / self.TEX, 0, off[0]], [0, scale[1] / self.TEX, off[1]]], np.float32)
        img = cv2.warpAffine(self.texture, m, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)

        def px(p):
            q = np.asarray(p) * scale + off
            return int(round(q[0])), int(round(q[1]))

        unit = float(scale[0])
        cv2.circle(img, px(_BOWL), max(2, int(0.085 * unit)), (40, 70, 190), -1, cv2.LINE_AA)
        cv2.circle(img, px(_BOWL), max(1, int(0.06 * unit)), (25, 45, 120), -1, cv2.LINE_AA)
        half = 0.03 * unit * (1 + 1.5 * s["cube_h"])
        c = np.array(px(s["cube"]), np.float32)
        shadow = c + 0.2 * unit * s["cube_h"]
        cv2.rectangle(img, tuple((shadow - half).astype(int)), tuple((shadow + half).astype(int)), (80, 60, 45), -1)
        cv2.rectangle(img, tuple((c - half).astype(int)), tuple((c + half).astype(int)), (205, 30, 30), -1)
        cv2.rectangle(img, tuple((c - half).astype(int)), tuple((c + 0.3 * half).astype(int)), (235, 60, 55), -1)
        if view == "base":
            d = s["ee"] - _SHOULDER
            r = min(float(np.hypot(*d)), _LINKS[0] + _LINKS[1] - 1e-3)
            a = math.acos(max(-1.0, min(1.0, (_LINKS[0] ** 2 + r * r - _LINKS[1] ** 2) / (2 * _LINKS[0] * r))))
            ang = math.atan2(d[1], d[0]) + a
            elbow = _SHOULDER + _LINKS[0] * np.array([math.cos(ang), math.sin(ang)])
            width = max(2, int(0.035 * unit))
            cv2.line(img, px(_SHOULDER), px(elbow), (90, 90, 98), width, cv2.LINE_AA)
            cv2.line(img, px(elbow), px(s["ee"]), (120, 120, 130), width, cv2.LINE_AA)
            g = 0.02 + 0.03 * s["grip"]
            for sign in (-1, 1):
                tip = s["ee"] + np.array([sign * g, 0.0])
                cv2.line(img, px(tip - [0, 0.04]), px(tip), (40, 40, 45), max(1, width // 2), cv2.LINE_AA)
        else:
            g = 0.10 + 0.18 * s["grip"]
            fw = int(0.07 * w)
            for sign in (-1, 1):
                x = int(w / 2 + sign * g * w)
                cv2.rectangle(img, (x - fw // 2, int(0.72 * h)), (x + fw // 2, h), (55, 55, 60), -1)
        light = 1.0 + 0.06 * math.sin(2 * math.pi * t / 7.0)
        noise = self.rng.normal(0.0, 2.5, img.shape)
        return np.clip(img.astype(np.float32) * light + noise, 0, 255).astype(np.uint8)


# ----------------------------------------------------------------------------- writing
def _session_clock(t: float, jumps: Sequence[Tuple[float, float]]) -> float:
    """Session-clock offset (s) at bag time t: the sum of the jumps that happened by then."""
    return sum(delta for at, delta in jumps if t >= at)


def _in_gap(topic: str, t: float, gaps) -> bool:
    return any((g == "*" or g == topic) and start <= t < start + dur for g, start, dur in gaps)


def make_demo_bag(path, config: Optional[DemoBagConfig] = None, **overrides) -> DemoBag:
    """Write the session to ``path`` (a rosbag2 folder that must not exist) and describe it."""
    # rosbags is the optional ``bags`` extra: imported when a bag is written, so this module imports without it
    with needs_extra("bags", "writing the demo session bag"):
        from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime
        from rosbags.rosbag2 import StoragePlugin, Writer

    cv2 = _opencv()
    cfg = config or DemoBagConfig()
    for k, v in overrides.items():
        setattr(cfg, k, v)
    if cfg.storage not in ("mcap", "sqlite3"):
        raise ValueError(f"storage must be 'mcap' or 'sqlite3', got {cfg.storage!r}")
    path = Path(path)
    ts = typestore()
    T = ts.types
    Time, Header = T["builtin_interfaces/msg/Time"], T["std_msgs/msg/Header"]
    f = cfg.faults
    rng = np.random.default_rng(cfg.seed)
    renderer = Renderer(cfg.seed)
    record_clock = cfg.record_clock or bool(f.clock_jumps)

    def tmsg(ns: int):
        sec, nsec = divmod(int(ns), NS_PER_S)
        return Time(sec=sec, nanosec=nsec)

    def to_ns(t: float) -> int:
        return cfg.start_ns + int(round(t * NS_PER_S))

    # Events: (log time s, order, topic, kind, capture time s)
    events: List[tuple] = []
    for i, cam in enumerate(cfg.cameras):
        if cam.topic in f.drop_topics:
            continue
        phase = rng.uniform(0, 1.0 / cam.rate_hz)
        n = int(cfg.duration * cam.rate_hz)
        for k in range(n):
            cap = 0.05 + phase + k / cam.rate_hz + rng.normal(0, 0.0005)
            log = cap + cam.latency_ms * 1e-3 + abs(rng.normal(0, cam.latency_ms * 2e-4))
            if log < cfg.duration and not _in_gap(cam.topic, cap, f.gaps):
                events.append((log, 1, cam.topic, ("camera", i), cap))
    if cfg.state_topic not in f.drop_topics:
        dt = 1.0 / cfg.state_rate_hz
        for k in range(int(cfg.duration * cfg.state_rate_hz)):
            cap = 0.05 + k * dt
            log = cap + 0.0008 + abs(rng.normal(0, 0.0002))
            if log < cfg.duration and not _in_gap(cfg.state_topic, cap, f.gaps):
                events.append((log, 2, cfg.state_topic, ("state",), cap))
    if cfg.instruction_topic not in f.drop_topics:
        events.append((0.01, 0, cfg.instruction_topic, ("instruction",), 0.01))
    if record_clock:
        for k in range(int(cfg.duration * cfg.clock_rate_hz) + 1):
            t = k / cfg.clock_rate_hz
            if not _in_gap("/clock", t, f.gaps):
                events.append((t, -1, "/clock", ("clock",), t))
    events.sort(key=lambda e: (e[0], e[1]))

    truth: Dict[str, list] = {"corrupt_jpeg": [], "truncated": [], "dropped_topics": list(f.drop_topics),
                              "gaps": [list(g) for g in f.gaps], "clock_jumps": []}
    corrupt_left = sorted(f.corrupt_jpeg)
    truncated_left = sorted(f.truncated, key=lambda x: x[1])
    jumps = sorted(f.clock_jumps)
    for at, delta in jumps:
        truth["clock_jumps"].append({"bag_time_ns": to_ns(at), "delta_s": delta})

    latched = Qos(QosHistory.KEEP_LAST, 1, QosReliability.RELIABLE, QosDurability.TRANSIENT_LOCAL,
                  QosTime(0, 0), QosTime(0, 0), QosLiveliness.AUTOMATIC, QosTime(0, 0), False)
    sensor = Qos(QosHistory.KEEP_LAST, 10, QosReliability.RELIABLE, QosDurability.VOLATILE,
                 QosTime(0, 0), QosTime(0, 0), QosLiveliness.AUTOMATIC, QosTime(0, 0), False)
    plugin = StoragePlugin.MCAP if cfg.storage == "mcap" else StoragePlugin.SQLITE3
    counts: Dict[str, int] = {}
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        conns = {}
        for cam in cfg.cameras:
            if cam.topic not in f.drop_topics:
                typ = "sensor_msgs/msg/CompressedImage" if cam.compressed else "sensor_msgs/msg/Image"
                conns[cam.topic] = (writer.add_connection(cam.topic, typ, typestore=ts,
                                                          offered_qos_profiles=[sensor]), typ)
        if cfg.state_topic not in f.drop_topics:
            conns[cfg.state_topic] = (writer.add_connection(cfg.state_topic, "sensor_msgs/msg/JointState",
                                                            typestore=ts, offered_qos_profiles=[sensor]),
                                      "sensor_msgs/msg/JointState")
        if cfg.instruction_topic not in f.drop_topics:
            conns[cfg.instruction_topic] = (writer.add_connection(cfg.instruction_topic, "std_msgs/msg/String",
                                                                  typestore=ts, offered_qos_profiles=[latched]),
                                            "std_msgs/msg/String")
        if record_clock:
            conns["/clock"] = (writer.add_connection("/clock", "rosgraph_msgs/msg/Clock", typestore=ts,
                                                     offered_qos_profiles=[sensor]), "rosgraph_msgs/msg/Clock")
        prev_q = None
        for log, _, topic, kind, cap in events:
            stamp = to_ns(cap + _session_clock(cap, jumps))
            header = Header(stamp=tmsg(stamp), frame_id="")
            conn, typ = conns[topic]
            if kind[0] == "camera":
                cam = cfg.cameras[kind[1]]
                s = scene_state(cap, cfg.episode_period)
                rgb = renderer.render(cam.view, cam.height, cam.width, cap, s)
                header = Header(stamp=tmsg(stamp), frame_id=f"{cam.view}_camera")
                if cam.compressed:
                    ok, buf = cv2.imencode(".jpg", rgb[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 85])
                    data = buf.reshape(-1)
                    if corrupt_left and cap >= corrupt_left[0]:
                        corrupt_left.pop(0)
                        data = rng.integers(0, 256, data.size, dtype=np.uint8)
                        truth["corrupt_jpeg"].append({"topic": topic, "bag_time_ns": to_ns(log),
                                                      "stamp_ns": stamp})
                    msg = T[typ](header=header, format="rgb8; jpeg compressed bgr8", data=data)
                else:
                    msg = T[typ](header=header, height=cam.height, width=cam.width, encoding="rgb8",
                                 is_bigendian=0, step=cam.width * 3, data=rgb.reshape(-1))
            elif kind[0] == "state":
                s = scene_state(cap, cfg.episode_period)
                q = arm_joints(cap, s)
                v = np.zeros_like(q) if prev_q is None else (q - prev_q) * cfg.state_rate_hz
                prev_q = q
                effort = 2.0 * np.sin(q) + rng.normal(0, 0.05, q.size)
                msg = T[typ](header=header, name=list(cfg.joint_names), position=q.astype(np.float64),
                             velocity=v.astype(np.float64), effort=effort.astype(np.float64))
            elif kind[0] == "instruction":
                msg = T[typ](data=cfg.instruction)
            else:  # clock
                msg = T[typ](clock=tmsg(stamp))
            raw = ts.serialize_cdr(msg, typ)
            if truncated_left and truncated_left[0][0] == topic and cap >= truncated_left[0][1]:
                truncated_left.pop(0)
                raw = raw[: max(8, len(raw) // 2)]
                truth["truncated"].append({"topic": topic, "bag_time_ns": to_ns(log), "stamp_ns": stamp})
            writer.write(conn, to_ns(log), bytes(raw))
            counts[topic] = counts.get(topic, 0) + 1
    return DemoBag(path=path, storage=cfg.storage, duration=cfg.duration, counts=counts, truth=truth)


def faulty_config(duration: float = 8.0, **kw) -> DemoBagConfig:
    """The robustness session: a corrupt JPEG at 1.5 s, a truncated joint state at 2.0 s, the right
    wrist camera missing, the base camera silent from 3.0 s for 1.2 s, and the session clock
    jumping back 2 s at 5.5 s (recorded on /clock, as a simulator reset would)."""
    faults = Faults(corrupt_jpeg=(1.5,), truncated=(("/joint_states", 2.0),),
                    drop_topics=("/cameras/right_wrist/image",), gaps=(("/cameras/base/image", 3.0, 1.2),),
                    clock_jumps=((5.5, -2.0),))
    return DemoBagConfig(duration=duration, faults=faults, **kw)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="demo_bag", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="rosbag2 folder to create (must not exist)")
    ap.add_argument("--duration", type=float, default=40.0, help="session length in seconds (default 40)")
    ap.add_argument("--storage", choices=("mcap", "sqlite3"), default="mcap")
    ap.add_argument("--state-rate", type=float, default=50.0, help="joint-state rate = control rate (Hz)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--faults", action="store_true",
                    help="inject the robustness faults (corrupt JPEG, truncated message, missing camera, "
                         "gap, clock jump back)")
    a = ap.parse_args(argv)
    cfg = faulty_config(a.duration) if a.faults else DemoBagConfig(duration=a.duration)
    cfg.storage, cfg.state_rate_hz, cfg.seed = a.storage, a.state_rate, a.seed
    t = time.monotonic()
    try:
        bag = make_demo_bag(a.out, cfg)
    except Exception as exc:  # noqa: BLE001 - one clear line for a CLI
        print(f"demo_bag: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"demo_bag: wrote {bag.path} ({bag.storage}, {bag.duration:.0f} s, {bag.total} messages: "
          + ", ".join(f"{k} {v}" for k, v in sorted(bag.counts.items())) + f") in {time.monotonic() - t:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
