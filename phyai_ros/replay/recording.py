"""What the policy node publishes during a replay, recorded: chunks, margins, commands and its
/diagnostics reports (parsed), thread-safe, in receipt order, each with the replay clock and bag time
at receipt; optionally written raw to the output bag.  The replay (``playback.Playback`` and its modes)
drives the clock and waits on this record; it owns no output state itself.

Only the judged node's reports are recorded (``diagnostics.NodeIdentity``: its name, and the process id
and host it reports: those of the process the replay started, else of the first report under its name);
reports of other nodes on the DDS domain, of any name, are counted in ``foreign`` and left out."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from phyai_ros import diagnostics
from phyai_ros.control.clock import stamp_to_ns
from phyai_ros.diagnostics import NodeIdentity
from phyai_ros.messages import msg_to_chunk, msg_to_margin
from phyai_ros.replay.bagtypes import ros_type
from phyai_ros.replay.scan import Event

# rclpy and the node's QoS profiles (which need it) are imported when recording starts: reading bags back
# (``parse_diagnostics``, the report) needs no ROS.


@dataclass
class Received:
    seq: int          # receipt order over all recorded topics
    sim_ns: int       # replay clock at receipt
    epoch: int        # replay-clock segment at receipt
    wall: float       # time.monotonic() at receipt
    msg: Any
    bag_ns: int = 0   # input-bag time at receipt (the output bag's timestamp)


def parse_diagnostics(msg, node_name: Optional[str] = None) -> Optional[dict]:
    """A policy node's /diagnostics report as a dict (``phyai_ros.diagnostics.parse``; ``node_name``: that
    node's only), or None."""
    return diagnostics.parse(msg, stamp_to_ns(msg.header.stamp), node_name)


class Recording:
    """``position()`` gives (replay clock, bag time, clock epoch) now, stamped on every receipt; ``node_pid``:
    the judged node's process id when the replay started it (else the first report under its name sets it)."""

    def __init__(self, info, out, position: Callable[[], Tuple[int, int, int]], events: Sequence[Event] = (),
                 node_pid: Optional[int] = None):
        self.info, self.out, self.position = info, out, position
        self.identity = NodeIdentity(info.name, node_pid)
        self.foreign: Dict[str, int] = {}   # NodeIdentity.describe() -> reports left out
        self.cond = threading.Condition()
        self.events: List[Event] = list(events)
        self.chunks: List[Received] = []
        self.margins: List[Received] = []
        self.commands: List[Received] = []
        self.diags: List[Received] = []
        self.diag_by_stamp: Dict[int, dict] = {}
        self._seq = 0
        self._subs: list = []

    def subscribe(self, node) -> None:
        """One raw subscription per output of the node (reliable, deep queue)."""
        from phyai_ros.node.qos import reliable_depth
        for topic, msgtype in self.info.output_types().items():
            cls = ros_type(msgtype)
            if self.out is not None:
                self.out.add(topic, msgtype)
            self._subs.append(node.create_subscription(cls, topic, self._recorder(topic, cls),
                                                       reliable_depth(200), raw=True))

    def unsubscribe(self, node) -> None:
        for sub in self._subs:
            node.destroy_subscription(sub)
        self._subs = []

    def _recorder(self, topic: str, cls):
        from rclpy.serialization import deserialize_message
        info = self.info

        def parse(raw: bytes):
            msg = deserialize_message(raw, cls)
            if topic == info.chunk_topic:
                return msg_to_chunk(msg)
            if topic == info.margin_topic:
                return msg_to_margin(msg)
            if topic == "/diagnostics":
                return self._judged(parse_diagnostics(msg))
            if topic == info.command_topic:
                if hasattr(msg, "points"):
                    return (stamp_to_ns(msg.header.stamp), np.asarray(msg.points[0].positions if msg.points else [],
                                                                      dtype=np.float64))
                return (None, np.asarray(msg.data, dtype=np.float64))
            return None

        def callback(raw: bytes) -> None:
            t, tb, epoch = self.position()
            try:
                value = parse(raw)
            except Exception as exc:  # noqa: BLE001 - a malformed output is an event, not a crash
                if self.out is not None:
                    self.out.write(topic, tb, raw)
                self.add_event(Event("bad_output", f"{topic}: {type(exc).__name__}: {exc}", topic=topic,
                                     sim_ns=t, source="replay"))
                return
            if self.out is not None and (value is not None or topic != "/diagnostics"):
                self.out.write(topic, tb, raw)   # another node's /diagnostics is not recorded
            if value is None:
                return
            with self.cond:
                rec = Received(self._seq, t, epoch, time.monotonic(), value, tb)
                self._seq += 1
                if topic == info.chunk_topic:
                    self.chunks.append(rec)
                elif topic == info.margin_topic:
                    self.margins.append(rec)
                elif topic == info.command_topic:
                    self.commands.append(rec)
                elif topic == "/diagnostics":
                    self.diags.append(rec)
                    self.diag_by_stamp[value["stamp_ns"]] = value
                self.cond.notify_all()

        return callback

    def _judged(self, report: Optional[dict]) -> Optional[dict]:
        """``report`` if it is the judged node's, else None (another node's is counted in ``foreign``)."""
        if report is None:
            return None
        with self.cond:
            if self.identity.pid is None and report.get("node") == self.identity.name:
                self.identity = self.identity.of(report)   # the first report under the node's name
            if self.identity.matches(report):
                return report
            other = NodeIdentity(report.get("node") or "?", report.get("pid"), report.get("host")).describe()
            self.foreign[other] = self.foreign.get(other, 0) + 1
        return None

    def add_event(self, e: Event) -> None:
        if e.log_ns is None:
            e.log_ns = self.position()[1] or None
        with self.cond:
            self.events.append(e)

    def wait(self, predicate: Callable[[], bool], timeout: float, every_half_second: Optional[Callable[[], None]] = None
             ) -> bool:
        """Wait (wall) until predicate() holds under the lock; ``every_half_second`` runs (outside the
        lock) while waiting, e.g. to re-send /clock."""
        deadline = time.monotonic() + timeout
        next_call = time.monotonic() + 0.5
        with self.cond:
            while not predicate():
                now = time.monotonic()
                if now >= deadline:
                    return False
                if every_half_second is not None and now >= next_call:
                    self.cond.release()
                    try:
                        every_half_second()
                    finally:
                        self.cond.acquire()
                    next_call = now + 0.5
                self.cond.wait(min(0.05, max(0.0, deadline - now)))
            return True

    def latest_diag(self) -> Optional[dict]:
        with self.cond:
            return self.diags[-1].msg if self.diags else None


__all__ = ["Received", "Recording", "parse_diagnostics"]
