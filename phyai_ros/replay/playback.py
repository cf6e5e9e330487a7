"""What both replay modes share while a bag plays (``Playback``): the /clock and input publishers, the replay
clock on its two timelines, and the recording of the node's outputs.

The replay clock (what /clock says) may jump back where the recorded one did; the input bag's time only runs
forward, and is the output bag's timeline.  Each backward jump opens a new clock segment (``epoch``), so
outputs stamped alike in two segments stay apart.  The modes (``stepped``, ``realtime``) decide when the clock
moves; this module moves it, publishes the inputs and tells whether the node has reported at an instant."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

from phyai_ros.control.clock import NS_PER_S
from phyai_ros.replay.bagtypes import UnknownMessageType, ros_type
from phyai_ros.replay.nodeinfo import shared_domain
from phyai_ros.replay.options import ReplayOptions
from phyai_ros.replay.outbag import OutputBag
from phyai_ros.replay.recording import Recording
from phyai_ros.replay.scan import CLOCK_TOPIC, Event, Session

# rclpy's Clock message and the node's QoS profiles (which need rclpy) are imported when a playback starts.


class NodeLost(Exception):
    """The policy node exited while a mode was playing; ``played``: the messages played until then."""

    def __init__(self, played: int):
        super().__init__("node lost")
        self.played = played


class Playback:
    """What both modes share while a bag plays: the /clock and input publishers, the replay clock (where it
    stands on the replay and the input-bag timelines, and its segment), the replay clock and report count at
    the first and the last played message, and the recording of the node's outputs (into the output bag
    when there is one).  The modes (``SteppedPlay``, ``RealtimePlay``) decide when to move the clock.

    ``node``: the rclpy node the publishers and the recording's subscriptions are made on (the replay's own,
    ``ReplayNode.node``)."""

    def __init__(self, node, session: Session, out_path, options: ReplayOptions,
                 alive: Optional[Callable[[], bool]], node_pid: Optional[int] = None):
        from rosgraph_msgs.msg import Clock

        from phyai_ros.node.qos import LATCHED, RELIABLE, reliable_depth
        self.node, self.session, self.options = node, session, options
        self.alive = alive or (lambda: True)
        self.info = session.node
        self.dt_ns = int(round(self.info.dt * NS_PER_S))
        self.clock_ns = 0          # replay clock (what /clock says)
        self.bag_ns = 0            # position on the input bag's timeline (monotonic): the output bag's time
        self._offset = 0           # bag time - replay clock in the current clock segment
        self.epoch = 0             # replay-clock segment (one more at each backward jump)
        self.output = OutputBag(Path(out_path), options.out_storage) if out_path is not None else None
        self.recording = Recording(self.info, self.output, lambda: (self.clock_ns, self.bag_ns, self.epoch),
                                   events=session.events, node_pid=node_pid)
        # (reports received, replay clock, bag time) at the first and at the last played message
        self.first_pub: Optional[Tuple[int, int, int]] = None
        self.last_pub: Optional[Tuple[int, int, int]] = None
        self._clock_type = Clock
        self.clock_pub = node.create_publisher(Clock, CLOCK_TOPIC, reliable_depth(1))
        self.input_pubs: Dict[str, Any] = {}   # output topic -> publisher
        unavailable = set()
        for topic, meta in session.topics.items():
            out_topic = meta["out_topic"]
            if meta.get("role") in ("clock", "excluded") or meta.get("unknown_type") or out_topic in self.input_pubs:
                continue  # an unknown type was reported by the scan, its messages are not published
            try:
                cls = ros_type(meta["msgtype"])
            except (ImportError, AttributeError, ValueError, UnknownMessageType):
                unavailable.add(topic)
                continue
            qos = LATCHED if (out_topic == self.info.instruction_topic or _recorded_latched(session, topic)) \
                else RELIABLE
            self.input_pubs[out_topic] = node.create_publisher(cls, out_topic, qos)
        for it in session.items:
            if it.topic in unavailable and it.publish:
                it.publish = False
                it.detail = "message type not available to rclpy here"
        for topic in sorted(unavailable):
            self.recording.add_event(Event("type_unavailable", f"{session.topics[topic]['msgtype']} cannot be "
                                           "published (no rclpy type installed); not played", topic=topic,
                                           source="replay"))

        self.recording.subscribe(node)
        if self.output is not None and options.record_inputs:
            for topic, meta in session.topics.items():
                if meta.get("role") not in ("excluded", "clock") and meta["out_topic"] in self.input_pubs:
                    self.output.add(meta["out_topic"], meta["msgtype"])

    # ------------------------------------------------------------------ clock and publishing
    def set_clock(self, t_ns: int, bag_ns: Optional[int] = None) -> None:
        """Publish /clock = t_ns.  ``bag_ns``: the input-bag time it corresponds to (else the current
        segment's offset applies); outputs are recorded on that (monotonic) timeline."""
        if bag_ns is not None:
            self._offset = int(bag_ns) - int(t_ns)
        self.bag_ns = max(self.bag_ns, int(t_ns) + self._offset)
        self.clock_ns = int(t_ns)
        msg = self._clock_type()
        msg.clock.sec, msg.clock.nanosec = divmod(int(t_ns), NS_PER_S)
        self.clock_pub.publish(msg)

    def jump_back(self, forget_reports: bool = False) -> None:
        """The replay clock is about to jump back: a new segment begins.  ``forget_reports``: the node's reports
        by stamp are dropped too (the stamps of the new segment repeat the old ones)."""
        with self.recording.cond:
            self.epoch += 1
            if forget_reports:
                self.recording.diag_by_stamp.clear()

    def publish(self, item, raw: bytes) -> None:
        with self.recording.cond:
            if self.first_pub is None:
                self.first_pub = (len(self.recording.diags), self.clock_ns, self.bag_ns)
            self.last_pub = (len(self.recording.diags), self.clock_ns, self.bag_ns)
        pub = self.input_pubs.get(item.out_topic)
        if pub is not None:
            pub.publish(bytes(raw))
        if self.output is not None and self.options.record_inputs:
            self.output.write(item.out_topic, self.bag_ns, bytes(raw))

    def wait(self, predicate: Callable[[], bool], timeout: float, republish: Optional[int] = None) -> bool:
        """``Recording.wait``, re-sending /clock = ``republish`` every 0.5 s (best-effort on the node's side)."""
        return self.recording.wait(predicate, timeout,
                                   None if republish is None else (lambda: self.set_clock(republish)))

    def reported_at(self, t_ns: int) -> bool:
        """Has the node reported on /diagnostics with its clock at ``t_ns``?"""
        return t_ns in self.recording.diag_by_stamp

    def shared_domain(self) -> list:
        """``nodeinfo.shared_domain`` for this replay: what else on the DDS domain could mix in."""
        inputs = [CLOCK_TOPIC] + sorted(self.input_pubs)
        return shared_domain(self.info, self.node, inputs)

    # ------------------------------------------------------------------ startup
    def sync_start(self, t0: int) -> dict:
        """Hold the replay clock at t0 until the node reports at exactly t0 (it follows /clock)."""
        o = self.options
        deadline = time.monotonic() + o.startup_timeout
        t = t0
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError("the policy node exited before the replay started")
            self.set_clock(t)
            if self.wait(lambda: self.reported_at(t), 2.0, republish=t):
                return self.recording.diag_by_stamp[t]
            with self.recording.cond:
                foreign = [d.msg["stamp_ns"] for d in self.recording.diags
                           if abs(d.msg["stamp_ns"] - t) > 60 * NS_PER_S]
            if len(foreign) >= 2:
                raise RuntimeError("the policy node does not follow /clock (its reports carry another time): "
                                   "start it with -p use_sim_time:=true")
            # a node whose clock was ahead (an earlier replay) resets its timers on the jump back:
            # move on by one control period so they fire (a node that has not reported yet is still starting:
            # the clock waits for it)
            if self.recording.latest_diag() is not None:
                t += self.dt_ns
        raise RuntimeError(f"the policy node did not report on /diagnostics within {o.startup_timeout:.0f} s "
                           "of receiving /clock (is it running with use_sim_time:=true?)")



def _recorded_latched(session: Session, topic: str) -> bool:
    return session.topics.get(topic, {}).get("latched", False)


__all__ = ["NodeLost", "Playback"]
