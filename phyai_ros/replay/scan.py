"""First pass over an input bag: what will be played, when (on the replay clock), and
what is wrong with it, before anything is published.

* **Order and time.**  Messages are played in bag-timestamp order (the order every rosbag2
  reader yields).  The replay clock (``/clock`` the node follows under ``use_sim_time``) is
  the bag timestamp, unless the bag recorded a ``/clock`` topic (a simulator session): then
  the recorded clock is the time source, continued between its samples at the bag's rate,
  and a jump in it is replayed as a jump (``TimeMap``).
* **Roles.**  Each message is a node input (camera / state / instruction, after remapping),
  the recorded clock, or another topic (played as is, not accounted against the node).
* **Verdicts.**  Each node input is judged with the node's own rules before it is played:
  ``ok``, or why the node will reject it (``undecodable`` CDR, ``bad_image``, ``bad_state``,
  ``missing_joint``, ``out_of_order``, ``future_stamp``, ``type_mismatch``).  Undecodable
  messages are not published by default (a subscriber's middleware drops them without the
  node ever seeing them, so nobody could count them); everything else is published.
* **Events.**  Missing input topics, per-topic gaps, clock jumps, sensor-stamp jumps and every
  rejected message, each with its bag time.
"""
from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import yaml

from phyai_ros.control.clock import NS_PER_S, stamp_to_ns
from phyai_ros.control.observation import (FutureStampError, JointStateMapper, ObservationError,
                                           OutOfOrderStampError, check_stamp)
from phyai_ros.node.images import ImageConverter, ImageDecodeError
from phyai_ros.replay.bagtypes import absolute_topic, open_bag, recovered_files, registered_msgtype
from phyai_ros.replay.nodeinfo import CLOCK_JUMP_TOLERANCE, FUTURE_STAMP_TOLERANCE, NodeInfo

CLOCK_TOPIC = "/clock"
REJECTIONS = ("undecodable", "type_mismatch", "bad_image", "bad_state", "missing_joint", "out_of_order",
              "future_stamp")
SUMMARIZED = ("type_mismatch",)   # rejections reported once per topic (every message of it has them)


@dataclass
class Item:
    """One bag message as the replay sees it (no payload; the play pass re-reads the bag)."""

    index: int                 # position in play order
    topic: str                 # bag topic
    out_topic: str             # topic it is published on (after remapping)
    msgtype: str
    log_ns: int                # bag timestamp
    sim_ns: int                # replay clock when it is published
    stamp_ns: Optional[int]    # header stamp (None: no header or undecodable)
    role: str                  # 'camera' | 'state' | 'instruction' | 'clock' | 'other'
    verdict: str = "ok"        # 'ok' or one of REJECTIONS
    detail: str = ""
    publish: bool = True
    epoch: int = 0             # replay-clock segment (increments at each backward clock jump)


@dataclass
class Event:
    kind: str                  # missing_topic | undecodable | bad_image | ... | time_gap | clock_jump | stamp_jump | ...
    detail: str
    topic: str = ""
    log_ns: Optional[int] = None
    sim_ns: Optional[int] = None
    index: Optional[int] = None
    source: str = "bag"        # 'bag' (found by the scan) | 'replay' (while playing) | 'node' (node counters)

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None and v != ""}


class TimeMap:
    """Bag timestamp -> replay clock.  Identity without a recorded /clock; otherwise the recorded
    clock, advancing at the bag's rate between samples (never past the next sample), with jumps
    where the recorded clock jumps (back by more than the node's tolerance, or forward by more than
    ``forward_jump``)."""

    def __init__(self, samples: Sequence[Tuple[int, int]] = (), forward_jump: float = 1.0):
        self.samples = sorted(samples)
        self._logs = [s[0] for s in self.samples]
        self.jumps: List[Tuple[int, int, int]] = []   # (log_ns, sim_before, sim_after)
        self._jump_logs: List[int] = []
        for (l0, c0), (l1, c1) in zip(self.samples, self.samples[1:]):
            expected = c0 + (l1 - l0)
            if c1 < c0 - CLOCK_JUMP_TOLERANCE * NS_PER_S or c1 > expected + forward_jump * NS_PER_S:
                self.jumps.append((l1, min(expected, max(c0, expected)), c1))
                self._jump_logs.append(l1)

    @property
    def identity(self) -> bool:
        return not self.samples

    def __call__(self, log_ns: int) -> int:
        if not self.samples:
            return int(log_ns)
        i = bisect.bisect_right(self._logs, log_ns) - 1
        if i < 0:
            l0, c0 = self.samples[0]
            return c0 - (l0 - log_ns)
        l0, c0 = self.samples[i]
        sim = c0 + (log_ns - l0)
        if i + 1 < len(self.samples):
            c1 = self.samples[i + 1][1]
            if c1 >= c0:  # same segment: the clock does not run past its next sample
                sim = min(sim, c1)
        return int(sim)

    def epoch(self, log_ns: int) -> int:
        """Number of backward jumps at or before ``log_ns``."""
        n = bisect.bisect_right(self._jump_logs, log_ns)
        return sum(1 for j in self.jumps[:n] if j[2] < j[1])


@dataclass
class Session:
    """The scan's result: what the replay will do with every message of the bag."""

    path: Path
    storage: str
    items: List[Item]
    events: List[Event]
    time_map: TimeMap
    topics: Dict[str, dict]                   # bag topic -> {msgtype, count, role, out_topic, rate_hz}
    node: NodeInfo
    clock_source: str                         # 'bag timestamps' | 'recorded /clock'
    publish_undecodable: bool = False

    @property
    def start_sim(self) -> int:
        return min((i.sim_ns for i in self.items if i.role != "clock"), default=0)

    @property
    def end_sim(self) -> int:
        return max((i.sim_ns for i in self.items if i.role != "clock"), default=0)

    def inputs(self) -> List[Item]:
        return [i for i in self.items if i.role in ("camera", "state", "instruction")]

    def duration(self) -> float:
        logs = [i.log_ns for i in self.items]
        return (max(logs) - min(logs)) / NS_PER_S if logs else 0.0


def bag_metadata(path) -> dict:
    """The ``rosbag2_bagfile_information`` of a rosbag2 folder's metadata.yaml."""
    meta = Path(path) / "metadata.yaml"
    if not meta.is_file():
        raise FileNotFoundError(f"{path} is not a rosbag2 folder (no metadata.yaml)")
    return yaml.safe_load(meta.read_text()).get("rosbag2_bagfile_information", {}) or {}


def bag_storage(path) -> str:
    return str(bag_metadata(path).get("storage_identifier", "?"))


def iter_bag(path, topics: Optional[Sequence[str]] = None, recovered: Optional[list] = None) -> Iterator[tuple]:
    """(connection, log_ns, raw bytes, reader) in bag-timestamp order; the same order on every call.
    A cut-short mcap file yields its complete records; ``recovered`` (a list) receives what was read
    of each such file (``bagtypes.recovered_files``)."""
    with open_bag(path) as reader:
        if recovered is not None:
            recovered.extend(recovered_files(reader))
        conns = [c for c in reader.connections if topics is None or c.topic in topics]
        for conn, log_ns, raw in reader.messages(connections=conns):
            yield conn, log_ns, raw, reader


# ----------------------------------------------------------------------------- judging inputs
class _Judge:
    """The node's input checks, applied to deserialized bag messages (rosbags objects have the
    same field names as rclpy messages, so the node's own converters are reused)."""

    def __init__(self, node: NodeInfo):
        self.node = node
        self.images = ImageConverter()
        self.mapper = JointStateMapper(node.joint_names)

    def __call__(self, item: Item, msg) -> Tuple[str, str]:
        node = self.node
        if item.role == "camera":
            cam = node.camera(item.out_topic)
            if item.msgtype != cam.msgtype:
                return "type_mismatch", f"node subscribes {cam.msgtype}, bag has {item.msgtype}"
            decode = self.images.from_compressed if cam.compressed else self.images.from_image
            try:
                decode(msg)
            except ImageDecodeError as exc:   # the decoded frame is held to the intake's frame rule too
                return "bad_image", _first_line(exc)
        elif item.role == "state":
            if item.msgtype != "sensor_msgs/msg/JointState":
                return "type_mismatch", f"node subscribes sensor_msgs/msg/JointState, bag has {item.msgtype}"
            if len(msg.position) != len(msg.name):
                return "bad_state", f"JointState has {len(msg.name)} names and {len(msg.position)} positions"
            try:
                self.mapper.map(list(msg.name), np.asarray(msg.position, dtype=np.float64))
            except ObservationError as exc:
                return exc.kind, _first_line(exc)
        elif item.role == "instruction":
            if item.msgtype != "std_msgs/msg/String":
                return "type_mismatch", f"node subscribes std_msgs/msg/String, bag has {item.msgtype}"
        return "ok", ""


def _truncation_event(path: Path, cut: dict, read: int) -> Event:
    """The warning for an mcap file cut short: which file, how much of it and of the bag was read."""
    meta = bag_metadata(path)
    total = meta.get("message_count")
    duration = (meta.get("duration") or {}).get("nanoseconds")
    start = (meta.get("starting_time") or {}).get("nanoseconds_since_epoch")
    span = ""
    if cut["end_ns"] is not None and duration and start is not None:
        span = f", the first {(cut['end_ns'] - start) / NS_PER_S:.3f} s of {duration / NS_PER_S:.3f} s"
    return Event("truncated_bag", f"{cut['file']} is truncated (no index or footer; {cut['size'] - cut['read']} of "
                 f"{cut['size']} bytes at its end are an incomplete record): recovered {read} of "
                 f"{total if total is not None else '?'} messages{span}, read from its complete records as "
                 "rosbag2 reindexing would; the rest is lost", log_ns=cut["end_ns"])


def _topic_summary(kind: str, its: List[Item], what: str, t_first: int) -> Event:
    """One event for a fault every message of a topic shares (a wrong or unknown type), instead of one
    per message: how many, what, and the bag times of the first and the last."""
    first, last = its[0], its[-1]
    n = f"{len(its)} message" + ("" if len(its) == 1 else "s")
    return Event(kind, f"{n}: {what} (first at t={(first.log_ns - t_first) / NS_PER_S:.3f} s, last at "
                 f"t={(last.log_ns - t_first) / NS_PER_S:.3f} s of the bag)", topic=first.topic, log_ns=first.log_ns,
                 sim_ns=first.sim_ns, index=first.index)


def _first_line(exc, limit: int = 200) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:limit]


def _header_stamp(msg) -> Optional[int]:
    header = getattr(msg, "header", None)
    if header is None or not hasattr(header, "stamp"):
        return None
    return stamp_to_ns(header.stamp)


def scan_bag(path, node: NodeInfo, *, remaps: Optional[Dict[str, str]] = None,
             exclude: Sequence[str] = (), only: Optional[Sequence[str]] = None,
             clock_source: str = "auto", forward_jump: float = 1.0, gap_factor: float = 4.0,
             min_gap: float = 0.25, publish_undecodable: bool = False) -> Session:
    """Read the bag once (decoding and judging every message) and plan the replay.

    ``clock_source``: 'auto' (recorded /clock if the bag has one, else bag timestamps),
    'bag' (bag timestamps) or 'clock' (recorded /clock, required)."""
    path = Path(path)
    read = _read_bag(path, node, remaps=dict(remaps or {}), exclude={absolute_topic(t) for t in exclude},
                     only={absolute_topic(t) for t in only} if only else None, clock_source=clock_source,
                     publish_undecodable=publish_undecodable)
    if clock_source == "clock" and not read.clock_samples:
        raise ValueError(f"clock source 'clock' asked for, but {path} has no decodable {CLOCK_TOPIC} topic")
    tmap = _place_on_replay_clock(read, forward_jump)
    _judge_stamp_order(read.items)
    events = _bag_events(path, node, read, tmap)
    events += _timing_events(read, gap_factor, min_gap)
    events.sort(key=lambda e: (e.log_ns if e.log_ns is not None else -1))
    return Session(path=path, storage=bag_storage(path), items=read.items, events=events, time_map=tmap,
                   topics=read.topics, node=node,
                   clock_source="recorded /clock" if read.clock_samples else "bag timestamps",
                   publish_undecodable=publish_undecodable)


@dataclass
class _BagRead:
    """The first phase's result: every message as an ``Item`` (replay clock = bag time until the time map is
    known), the topics, the recorded /clock samples, the node's verdicts on its inputs (applied once the
    items are complete) and the mcap files found cut short."""

    items: List[Item] = field(default_factory=list)
    topics: Dict[str, dict] = field(default_factory=dict)
    clock_samples: List[Tuple[int, int]] = field(default_factory=list)   # (bag time, recorded clock)
    verdicts: Dict[int, Tuple[str, str]] = field(default_factory=dict)   # item index -> (verdict, detail)
    cut_files: List[dict] = field(default_factory=list)


def _read_bag(path: Path, node: NodeInfo, *, remaps: Dict[str, str], exclude: set, only: Optional[set],
              clock_source: str, publish_undecodable: bool) -> _BagRead:
    """Phase 1: read and decode every message, give it its role and judge the node's inputs."""
    judge = _Judge(node)
    roles = node.input_topics
    read = _BagRead()
    items, topics = read.items, read.topics
    for conn, log_ns, raw, reader in iter_bag(path, recovered=read.cut_files):
        topic = conn.topic
        out = remaps.get(topic, topic)
        info = topics.get(topic)
        if info is None:
            qos = getattr(conn.ext, "offered_qos_profiles", None) or []
            latched = any(getattr(q, "durability", None) is not None and q.durability.name == "TRANSIENT_LOCAL"
                          for q in qos if not isinstance(q, str))
            info = topics[topic] = {"msgtype": conn.msgtype, "count": 0, "out_topic": out, "latched": latched,
                                    "unknown_type": not registered_msgtype(conn.msgtype)}
        info["count"] += 1
        if topic == CLOCK_TOPIC and clock_source != "bag" and out == CLOCK_TOPIC:
            role = "clock"
        elif out in roles:
            role = roles[out]
        else:
            role = "other"
        info["role"] = role
        item = Item(index=len(items), topic=topic, out_topic=out, msgtype=conn.msgtype, log_ns=int(log_ns),
                    sim_ns=int(log_ns), stamp_ns=None, role=role)
        excluded = topic in exclude or (only is not None and topic not in only and role != "clock")
        try:
            msg = reader.deserialize(raw, conn.msgtype)
        except Exception as exc:  # noqa: BLE001 - any decoding failure is the same verdict
            item.verdict, item.detail = "undecodable", f"{type(exc).__name__}: {_first_line(exc)}"
            item.publish = publish_undecodable and role != "clock"
            msg = None
        if msg is not None:
            item.stamp_ns = _header_stamp(msg)
            if role == "clock":
                read.clock_samples.append((int(log_ns), stamp_to_ns(msg.clock)))
                item.stamp_ns = stamp_to_ns(msg.clock)
                item.publish = False
            elif role in ("camera", "state", "instruction"):
                read.verdicts[item.index] = judge(item, msg)
        if info["unknown_type"] and role != "clock":
            item.publish = False
            item.detail = item.detail or "unknown message type (not published)"
        if excluded:
            item.role, item.publish, item.detail = "excluded", False, "excluded by --exclude/--topics"
        items.append(item)
    return read


def _place_on_replay_clock(read: _BagRead, forward_jump: float) -> TimeMap:
    """Phase 2: the time map from the recorded clock (if any); every message's replay clock and clock segment,
    and the inputs' verdicts."""
    tmap = TimeMap(read.clock_samples if read.clock_samples else (), forward_jump=forward_jump)
    for it in read.items:
        it.sim_ns = tmap(it.log_ns)
        it.epoch = tmap.epoch(it.log_ns)
        v = read.verdicts.get(it.index)
        if v is not None and it.verdict == "ok":
            it.verdict, it.detail = v
    return tmap


def _judge_stamp_order(items: List[Item]) -> None:
    """Phase 3: stamp order and future stamps, as the node's buffer judges them (reset at backward jumps)."""
    held: Dict[str, Tuple[int, int]] = {}  # out_topic -> (epoch, stamp)
    for it in items:
        if it.role not in ("camera", "state") or it.verdict != "ok" or it.stamp_ns is None:
            continue
        prev = held.get(it.out_topic)
        try:
            check_stamp(it.stamp_ns, it.sim_ns, prev[1] if prev is not None and prev[0] == it.epoch else None,
                        int(FUTURE_STAMP_TOLERANCE * NS_PER_S), it.out_topic)
        except (FutureStampError, OutOfOrderStampError) as exc:
            it.verdict = "future_stamp" if isinstance(exc, FutureStampError) else "out_of_order"
            it.detail = str(exc)
            continue
        held[it.out_topic] = (it.epoch, it.stamp_ns)


def _bag_events(path: Path, node: NodeInfo, read: _BagRead, tmap: TimeMap) -> List[Event]:
    """Phase 4: what is wrong with the bag: the node's inputs it lacks, every rejected message (one summary
    per topic for the faults its every message shares), files cut short and recorded clock jumps."""
    items, topics = read.items, read.topics
    events: List[Event] = []
    present = {info["out_topic"] for info in topics.values() if info["count"]}
    for cam in node.cameras:
        if cam.topic not in present:
            kind = "required" if cam.required else "optional"
            events.append(Event("missing_topic", f"{kind} camera {cam.slot} ({cam.topic}) is not in the bag"
                                + ("" if cam.required else "; the node masks it out"), topic=cam.topic))
    if node.state_topic not in present:
        events.append(Event("missing_topic", f"joint states ({node.state_topic}) are not in the bag",
                            topic=node.state_topic))
    if node.instruction_topic not in present:
        events.append(Event("missing_topic", f"no instruction on {node.instruction_topic}: the node waits for one "
                            "unless instruction.default is set", topic=node.instruction_topic))
    t_first = min((it.log_ns for it in items), default=0)
    per_topic: Dict[Tuple[str, str], List[Item]] = defaultdict(list)
    for it in items:
        if it.verdict in SUMMARIZED:
            per_topic[(it.verdict, it.topic)].append(it)
        elif it.verdict != "ok":
            note = "" if it.publish else " (not published)"
            events.append(Event(it.verdict, it.detail + note, topic=it.topic, log_ns=it.log_ns, sim_ns=it.sim_ns,
                                index=it.index))
    for topic, info in topics.items():
        if info["unknown_type"] and info.get("role") not in ("clock", "excluded"):
            per_topic[("unknown_type", topic)] = [it for it in items if it.topic == topic]
    for (kind, _), its in per_topic.items():
        what = (f"{its[0].msgtype}: unknown message type (no registered interface package provides it), not played"
                if kind == "unknown_type" else its[0].detail + ("" if its[0].publish else " (not published)"))
        events.append(_topic_summary(kind, its, what, t_first))
    events.extend(_truncation_event(path, f, len(items)) for f in read.cut_files)
    for log_ns, before, after in tmap.jumps:
        direction = "back" if after < before else "forward"
        events.append(Event("clock_jump", f"recorded clock jumps {direction} {(after - before) / NS_PER_S:+.3f} s",
                            topic=CLOCK_TOPIC, log_ns=log_ns, sim_ns=after))
    return events


def _timing_events(read: _BagRead, gap_factor: float, min_gap: float) -> List[Event]:
    """Phase 5: per played topic, its rate and delivery age (into ``read.topics``), and the gaps and the
    header-stamp jumps in it."""
    topics = read.topics
    events: List[Event] = []
    by_topic: Dict[str, List[Item]] = defaultdict(list)
    for it in read.items:
        if it.role not in ("clock", "excluded"):
            by_topic[it.topic].append(it)
    for topic, its in by_topic.items():
        logs = np.array([i.log_ns for i in its], dtype=np.int64)
        if len(logs) >= 2:
            d = np.diff(logs)
            med = float(np.median(d))
            topics[topic]["rate_hz"] = NS_PER_S / med if med > 0 else float("inf")
            limit = max(gap_factor * med, min_gap * NS_PER_S)
            for k in np.flatnonzero(d > limit):
                events.append(Event("time_gap", f"no message for {d[k] / NS_PER_S:.3f} s (median period {med / 1e6:.1f} ms)",
                                    topic=topic, log_ns=int(logs[k]), sim_ns=its[k].sim_ns, index=its[k].index))
        ages = [(i.sim_ns - i.stamp_ns, i) for i in its if i.stamp_ns is not None and i.verdict == "ok"]
        if len(ages) >= 2:
            vals = np.array([a for a, _ in ages], dtype=np.int64)
            topics[topic]["delivery_age_ms_p50"] = float(np.median(vals)) / 1e6
            for (a0, i0), (a1, i1) in zip(ages, ages[1:]):
                if abs(a1 - a0) > 0.5 * NS_PER_S and i0.epoch == i1.epoch:
                    events.append(Event("stamp_jump", f"header stamps jump {(a0 - a1) / NS_PER_S:+.3f} s relative to the "
                                        "replay clock", topic=topic, log_ns=i1.log_ns, sim_ns=i1.sim_ns,
                                        index=i1.index))
    return events


def check_playable(session: Session) -> Session:
    """``session`` if replaying it can show the node anything, else a ValueError saying why (checked
    before a node is started: a bad bag fails at once)."""
    cut = [e.detail for e in session.events if e.kind == "truncated_bag"]
    if not session.items:
        raise ValueError(f"{session.path}: no message could be read" + (f" ({'; '.join(cut)})" if cut else ""))
    if not any(it.publish for it in session.inputs()):
        held = ", ".join(sorted(session.topics))
        wanted = ", ".join(sorted(session.node.input_topics))
        raise ValueError(f"{session.path}: none of its messages can reach the node: it holds {held}, the node takes "
                         f"{wanted} (remap with --remap BAG_TOPIC:=NODE_TOPIC)")
    return session


__all__ = ["Item", "Event", "Session", "TimeMap", "scan_bag", "check_playable", "iter_bag", "bag_storage", "bag_metadata",
           "REJECTIONS", "CLOCK_TOPIC"]
