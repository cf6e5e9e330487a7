"""Play a scanned bag into live topics, drive the replay clock, and record the node's outputs.

The node must run with ``use_sim_time:=true``: the player publishes ``/clock`` and the node's
stamps, timers and latency segments all follow it.

Modes
-----
``realtime`` (rate r): messages leave at their recorded spacing divided by r (paced on the
monotonic clock); ``/clock`` follows the bag's time source, published with every message, at
every control-grid instant (multiples of the node's dt) and at ``clock_hz`` in between, so
ticks fire on the grid and latencies are resolved to about 1/clock_hz.  Latencies are in
replay-clock time: at rate r a replay second lasts 1/r wall seconds, so at r < 1 the node
looks r times as fast as it is (a slower robot), at r > 1 slower; r = 1 measures it.

``stepped``: deterministic and as fast as the node allows.  The clock advances on the
control grid one dt at a time.  Before each step the messages recorded up to it are
published (the clock set to each one's time first), the player waits ``settle`` (wall) so
the node has taken them, then moves the clock to the grid instant; the node ticks and
reports on /diagnostics (needs ``diagnostics.period == control.dt``: one report per tick);
if that report says an inference is in flight, the clock is held until its chunk arrives.
So which messages each inference sees, and when its chunk is adopted, do not depend on CPU
speed: with a fixed noise seed two runs give identical chunks.  The price: an inference
takes zero replay-clock time, so latencies and margins of a stepped run describe the
logic, not the machine (the report says so).
"""
from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from phyai_ros.replay.accounting import Accounting, Snapshot, account
from phyai_ros import diagnostics, needs_ros
from phyai_ros.diagnostics import NODE_NAME, NodeIdentity
from phyai_ros.control.clock import NS_PER_S
from phyai_ros.control.loop import COUNTERS
from phyai_ros.replay.recording import Received, Recording, parse_diagnostics  # noqa: F401  (public here too)
from phyai_ros.replay.bagtypes import UnknownMessageType, ros_type, typestore
from phyai_ros.replay.nodeinfo import NodeInfo, query_node, shared_domain
from phyai_ros.replay.runbag import EVENTS_TOPIC, SUMMARY_TOPIC, json_default, match_chunks_and_margins
from phyai_ros.replay.scan import CLOCK_TOPIC, Event, Session, iter_bag

# rclpy, the ROS message types and the node's QoS profiles (which need rclpy), and rosbags' writer (the ``bags``
# extra) are imported where playback starts: scans, reports and ``--help`` import this module without them.

MODES = ("realtime", "stepped")


@dataclass
class ReplayOptions:
    mode: str = "realtime"          # 'realtime' | 'stepped'
    rate: float = 1.0               # realtime speed factor
    clock_hz: float = 200.0         # realtime: /clock rate between messages and grid instants
    preroll: float = 0.2            # replay-clock seconds before the first message
    tail: float = 1.0               # replay-clock seconds after the last message
    settle: float = 0.01            # stepped: wall seconds between publishing inputs and the tick
    step_timeout: float = 10.0      # stepped: wall seconds to wait for the node's report of a tick
    inference_timeout: float = 60.0 # stepped: wall seconds to wait for an in-flight chunk
    startup_timeout: float = 60.0   # wall seconds for the node to follow /clock
    race_window: Optional[float] = None  # accounting: publish->receive uncertainty (s); None: by mode
    out_storage: str = "mcap"
    record_inputs: bool = False     # also copy the played inputs into the output bag

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError("rate must be > 0")
        if self.out_storage not in ("mcap", "sqlite3"):
            raise ValueError("out_storage must be 'mcap' or 'sqlite3'")


@dataclass(frozen=True)
class SessionBounds:
    """Where the recorded session lies in a replay: the replay clock at its first and last played
    message and at the node's first report after the last one, and the input-bag times of those
    messages (the output bag's timeline).  None where no message was played.

    The session's counters run from the node's last report before the first message to its first
    report after the last one; ``chunk_seqs`` and ``margin_seqs`` are what those two reports enclose,
    so every count of the report is one number (design.md §5): the chunks delivered in between (seq in
    [lo, hi), the ``chunks`` counter's increase) and the ControlMargins published in between (chunk_seq
    in [lo, hi], the ones the ``deadline_misses`` / ``expired_chunks`` counters counted; None: none)."""

    start_ns: Optional[int] = None
    end_ns: Optional[int] = None
    report_ns: Optional[int] = None
    start_bag_ns: Optional[int] = None
    end_bag_ns: Optional[int] = None
    chunk_seqs: Optional[Tuple[int, int]] = None
    margin_seqs: Optional[Tuple[int, int]] = None

    def to_dict(self) -> dict:
        """The replay summary's keys (what ``report`` reads back)."""
        return {"session_start_ns": self.start_ns, "session_end_ns": self.end_ns, "session_report_ns": self.report_ns,
                "session_start_bag_ns": self.start_bag_ns, "session_end_bag_ns": self.end_bag_ns,
                "session_chunk_seqs": list(self.chunk_seqs) if self.chunk_seqs else None,
                "session_margin_seqs": list(self.margin_seqs) if self.margin_seqs else None}


@dataclass
class ReplayResult:
    """Everything a replay produced, as Python objects (also written to the output bag)."""

    session: Session
    options: ReplayOptions
    out_path: Optional[Path]
    chunks: List[Received]            # msg: phyai_ros.control.ActionChunk
    margins: List[Received]           # msg: phyai_ros.control.MarginReport
    commands: List[Received]          # msg: (slot stamp ns or None, np.ndarray action)
    diagnostics: List[Received]       # msg: dict(stamp_ns, counters, margin_level, margin_message, inputs_level)
    events: List[Event]
    accounting: Accounting
    node_counters: Dict[str, int]     # the node's counter increments during the replay
    played: int
    complete: bool
    wall_s: float
    lag_ms: Dict[str, float] = field(default_factory=dict)
    snapshots: List[Snapshot] = field(default_factory=list)
    session_bounds: SessionBounds = field(default_factory=SessionBounds)
    tail_counters: Dict[str, int] = field(default_factory=dict)  # last node report; counters after the bag ended
    node_identity: Optional[NodeIdentity] = None   # the judged node (its reports' name, pid, host)
    foreign_reports: Dict[str, int] = field(default_factory=dict)  # other nodes' /diagnostics left out

    @property
    def chunk_data(self):
        return [r.msg for r in self.chunks]

    @property
    def margin_values(self):
        return [r.msg for r in self.margins]

    def summary(self) -> dict:
        s = self.session
        return {
            "bag": str(s.path), "storage": s.storage, "clock_source": s.clock_source,
            "bag_duration_s": s.duration(), "messages": len(s.items), "played": self.played,
            "complete": self.complete, "mode": self.options.mode, "rate": self.options.rate,
            "wall_s": self.wall_s, "lag_ms": self.lag_ms, "node": s.node.to_dict(),
            "topics": s.topics, "chunks": len(self.chunks), "margins": len(self.margins),
            "commands": len(self.commands), "diagnostics": len(self.diagnostics),
            "node_counters": self.node_counters, "tail_counters": self.tail_counters,
            "node_identity": self.node_identity.to_dict() if self.node_identity else None,
            "foreign_reports": self.foreign_reports,
            **self.session_bounds.to_dict(), "accounting": self.accounting.to_dict(s.items),
            "events": [e.to_dict() for e in self.events], "out": str(self.out_path) if self.out_path else None,
        }


class _Output:
    """Thread-safe output bag (rosbags Writer) keyed by topic."""

    def __init__(self, path: Path, storage: str):
        from rosbags.rosbag2 import StoragePlugin, Writer
        self.path = Path(path)
        self._writer = Writer(self.path, version=9,
                              storage_plugin=StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3)
        self._writer.open()
        self._conns: Dict[str, Any] = {}
        self._lock = threading.Lock()
        self.closed = False

    def add(self, topic: str, msgtype: str) -> None:
        with self._lock:
            if topic not in self._conns:
                self._conns[topic] = self._writer.add_connection(topic, msgtype, typestore=typestore())

    def write(self, topic: str, t_ns: int, raw: bytes) -> None:
        with self._lock:
            if not self.closed:
                self._writer.write(self._conns[topic], int(t_ns), raw)

    def close(self) -> None:
        with self._lock:
            if not self.closed:
                self.closed = True
                self._writer.close()


def require_ros() -> None:
    """A replay plays into a ROS node: RosUnavailableError (saying what to install) unless rclpy and this
    package's generated messages import here.  The CLI asks first, before it reads any bag or file."""
    with needs_ros(__name__):
        import rclpy  # noqa: F401
        import phyai_ros.msg  # noqa: F401


class ReplayNode:
    """The replay's rclpy side: its own Context, a node, an executor spinning in a thread.

    Use as a context manager.  ``wait_for_node`` / ``node_info`` find the policy node;
    ``play(session, out, options)`` replays and returns a ``ReplayResult``."""

    def __init__(self, name: Optional[str] = None, node_name: str = NODE_NAME):
        name = name or f"phyai_replay_{os.getpid()}"   # its own name: another replay on the domain is not it
        with needs_ros(__name__):
            import rclpy
            from rclpy.executors import SingleThreadedExecutor
        self.node_name = node_name.lstrip("/")
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node(name, context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._thread = threading.Thread(target=self._spin, name="replay-executor", daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except Exception:  # noqa: BLE001 - shutdown races end the spin thread quietly
            pass

    def __enter__(self) -> "ReplayNode":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        import rclpy
        try:
            self.executor.shutdown(timeout_sec=2.0)
        except Exception:  # noqa: BLE001
            pass
        self._thread.join(3.0)
        try:
            self.node.destroy_node()
        finally:
            rclpy.try_shutdown(context=self.context)

    # -- the policy node
    def node_present(self) -> bool:
        return any(n == self.node_name for n, _ in self.node.get_node_names_and_namespaces())

    def wait_for_node(self, timeout: float = 60.0, alive: Optional[Callable[[], bool]] = None) -> bool:
        """Until the policy node is on the graph with its /diagnostics publisher."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if alive is not None and not alive():
                return False
            if self.node_present() and self.node.count_publishers("/diagnostics") > 0:
                return True
            time.sleep(0.05)
        return False

    def node_info(self, timeout: float = 10.0) -> Optional[NodeInfo]:
        return query_node(self.node, self.node_name, timeout)

    # -- replay
    def play(self, session: Session, out_path, options: Optional[ReplayOptions] = None,
             alive: Optional[Callable[[], bool]] = None, log: Callable[[str], None] = lambda s: None,
             node_pid: Optional[int] = None) -> ReplayResult:
        """``node_pid``: the policy node's process id when this side started it (its reports are the judged
        ones; else the first under its name)."""
        return _replay(_Playback(self, session, out_path, options or ReplayOptions(), alive, node_pid), log)


class _Playback:
    """What both modes share while a bag plays: the /clock and input publishers, the replay clock (where it
    stands on the replay and the input-bag timelines, and its segment), the replay clock and report count at
    the first and the last played message, and the recording of the node's outputs (into the output bag
    when there is one).  The modes (``_SteppedPlay``, ``_RealtimePlay``) decide when to move the clock."""

    def __init__(self, replay_node: ReplayNode, session: Session, out_path, options: ReplayOptions,
                 alive: Optional[Callable[[], bool]], node_pid: Optional[int] = None):
        from rosgraph_msgs.msg import Clock

        from phyai_ros.node.qos import LATCHED, RELIABLE, reliable_depth
        self.replay_node, self.session, self.options = replay_node, session, options
        self.alive = alive or (lambda: True)
        self.info = session.node
        self.dt_ns = int(round(self.info.dt * NS_PER_S))
        self.clock_ns = 0          # replay clock (what /clock says)
        self.bag_ns = 0            # position on the input bag's timeline (monotonic): the output bag's time
        self._offset = 0           # bag time - replay clock in the current clock segment
        self.epoch = 0             # replay-clock segment (one more at each backward jump)
        self.output = _Output(Path(out_path), options.out_storage) if out_path is not None else None
        self.recording = Recording(self.info, self.output, lambda: (self.clock_ns, self.bag_ns, self.epoch),
                                   events=session.events, node_pid=node_pid)
        # (reports received, replay clock, bag time) at the first and at the last played message
        self.first_pub: Optional[Tuple[int, int, int]] = None
        self.last_pub: Optional[Tuple[int, int, int]] = None
        self._clock_type = Clock
        node = replay_node.node
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
        return shared_domain(self.info, self.replay_node.node, inputs)

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


def _replay(playback: _Playback, log: Callable[[str], None]) -> ReplayResult:
    """Start the node's clock at the grid instant before the preroll, play the bag in the chosen mode and
    collect what the node did. Interrupted (KeyboardInterrupt: Ctrl-C, or the CLI's SIGTERM) while playing, the
    replay stops there and keeps what was recorded: the result and the output bag are finished as for a replay cut
    short (an ``interrupted`` event), then the interrupt goes on with the result attached (``.result``); earlier, the
    output bag is closed as it is. A replay tool never loses what it recorded."""
    try:
        return _replay_bag(playback, log)
    except BaseException:
        if playback.output is not None:
            playback.output.close()   # metadata.yaml written, the mcap finished / the db committed
        raise


def _replay_bag(playback: _Playback, log: Callable[[str], None]) -> ReplayResult:
    s, o = playback.session, playback.options
    playable = [it for it in s.items if it.role not in ("clock",)]
    if not playable:
        raise ValueError(f"{s.path}: nothing to play")
    playback.replay_node.wait_for_node(o.startup_timeout, playback.alive)
    t0 = ((s.start_sim - int(o.preroll * NS_PER_S)) // playback.dt_ns) * playback.dt_ns
    w_start = time.monotonic()
    baseline = playback.sync_start(t0)
    domain = playback.shared_domain()   # again at the end: a node may join during the replay
    log(f"replay: node follows /clock; playing {len(s.items)} messages ({o.mode}"
        + (f" x{o.rate:g}" if o.mode == "realtime" else "") + ")")
    played, complete, interrupt = 0, False, None
    play = _SteppedPlay(playback) if o.mode == "stepped" else _RealtimePlay(playback)
    try:
        ran = play.run(t0)
        played = ran if o.mode == "stepped" else ran[0]
        complete = played == len(s.items)
    except _NodeLost as exc:
        played = exc.played
        playback.recording.add_event(Event("node_lost", "the policy node exited during the replay",
                                           sim_ns=playback.clock_ns, source="replay"))
    except KeyboardInterrupt as exc:
        interrupt = exc
        played = play.counts.played if o.mode == "stepped" else play.played
        playback.recording.add_event(Event("interrupted", f"the replay was interrupted ({_signal_name(exc)}) after "
                                           f"{played} of {len(s.items)} messages; what was recorded until then is "
                                           "kept", sim_ns=playback.clock_ns, source="replay"))
    lags = play.lags
    wall = time.monotonic() - w_start
    time.sleep(0.2)  # outputs still in flight
    for warning in dict.fromkeys(domain + playback.shared_domain()):
        playback.recording.add_event(Event("shared_domain", warning + " (isolate the replay: ROS_DOMAIN_ID, README)",
                                           source="replay"))
    result = _collect(playback, baseline, played, complete, wall, lags)
    if playback.output is not None:
        _write_result(playback.output, result, playback.bag_ns)
    playback.recording.unsubscribe(playback.replay_node.node)
    if interrupt is not None:
        interrupt.result = result
        raise interrupt
    return result


def _signal_name(exc: BaseException) -> str:
    signum = getattr(exc, "signum", signal.SIGINT)
    return signal.Signals(signum).name


@dataclass
class _StepCounts:
    """What stepping counted: the messages played, the ticks the node did not report in time, the steps that
    did not advance its tick counter by one, and that counter at the last step (None: unknown)."""

    played: int = 0
    missed_reports: int = 0
    tick_mismatch: int = 0
    ticks: Optional[int] = None
    baseline_chunks: int = 0       # the node's chunk counter when the replay started


class _SteppedPlay:
    """Stepped mode (module doc): the clock moves one control period at a time, each move waits for the node's
    report of that tick and for any inference it started.  Owns the step counts and the pending inputs."""

    def __init__(self, playback: _Playback):
        self.playback = playback
        self.counts = _StepCounts()
        self.lags: List[float] = []   # none in stepped mode (no pace to be late against)
        self.pending = False        # inputs published since the last tick (the node gets ``settle`` to take them)

    def run(self, t0: int) -> int:
        """Play every message; the number played."""
        pb = self.playback
        s, dt, info = pb.session, pb.dt_ns, pb.info
        if abs(info.diagnostics_period - info.dt) > 1e-9:
            raise RuntimeError(f"stepped mode needs one node report per tick: start the node with "
                               f"-p diagnostics.period:={info.dt:g} (it has {info.diagnostics_period:g})")
        if info.compute_clock != "stamp":
            raise RuntimeError("stepped mode holds /clock while the node infers, so its latencies are measured in "
                               "simulated time: start the node with -p control.compute_clock:=stamp (it has "
                               f"{info.compute_clock})")
        self.counts.baseline_chunks = pb.recording.latest_diag()["counters"].get("chunks", 0)
        cur = t0
        jumps = list(s.time_map.jumps)  # (bag time, clock before, clock after), in bag order
        n = len(s.items)
        for item, (conn, log_ns, raw, _) in zip(s.items, iter_bag(s.path)):
            assert item.log_ns == log_ns and item.topic == conn.topic, "bag changed between scan and play"
            while jumps and jumps[0][0] <= item.log_ns:
                _, before, after = jumps.pop(0)
                cur = self._jump(item, cur, before, after)
            while item.role != "clock" and cur + dt <= item.sim_ns:
                cur += dt
                self._tick(cur)
            if item.publish and item.role not in ("clock", "excluded"):
                if item.sim_ns > pb.clock_ns:
                    pb.set_clock(item.sim_ns, item.log_ns)
                pb.publish(item, raw)
                self.pending = True
            self.counts.played += 1
        end = s.end_sim + int(pb.options.tail * NS_PER_S)
        while cur + dt <= end:
            cur += dt
            self._tick(cur)
        if self.counts.tick_mismatch:
            pb.recording.add_event(Event("tick_mismatch", f"{self.counts.tick_mismatch} steps did not advance the "
                                         "node's tick counter by exactly one (timer phase off the grid?)",
                                         source="replay"))
        return n if self.counts.played == n else self.counts.played

    def _jump(self, item, cur: int, before: int, after: int) -> int:
        """Play a recorded clock jump at ``item``; the grid instant the clock stands at afterwards."""
        pb = self.playback
        dt, o = pb.dt_ns, pb.options
        target = (after // dt) * dt
        pb.recording.add_event(Event("clock_jump_played", f"replay clock jumped {(target - cur) / NS_PER_S:+.3f} s",
                                     sim_ns=target, log_ns=item.log_ns, source="replay"))
        if after >= before:
            self._tick(target)  # a jump forward fires the timers once
            return target
        # The node resets its timers on a jump back to (new time + period).  Land the jump on the grid point
        # before the target and publish nothing but grid points until the node reports a tick again, so its
        # timer phase stays on the grid.
        pb.jump_back(forget_reports=True)
        if self.pending and o.settle > 0:
            time.sleep(o.settle)
        self.pending = False
        pb.set_clock(target - dt, item.log_ns - (item.sim_ns - (target - dt)))
        time.sleep(max(o.settle, 0.02))
        return self._resync(target)

    def _tick(self, t: int) -> None:
        """Move the clock to grid instant t and wait until the node has ticked and finished any inference."""
        pb, o, counts = self.playback, self.playback.options, self.counts
        if self.pending and o.settle > 0:
            time.sleep(o.settle)
        self.pending = False
        if not pb.alive():
            raise _NodeLost(counts.played)
        pb.set_clock(t)
        if not pb.wait(lambda: pb.reported_at(t), o.step_timeout, republish=t):
            counts.missed_reports += 1
            if counts.missed_reports <= 3:
                pb.recording.add_event(Event("step_timeout", f"no node report for the tick at {t} within "
                                             f"{o.step_timeout:g} s; stepping on (results may depend on timing)",
                                             sim_ns=t, source="replay"))
            return
        d = pb.recording.diag_by_stamp[t]
        ticks = d["counters"].get("ticks")
        if counts.ticks is not None and ticks is not None and ticks != counts.ticks + 1:
            counts.tick_mismatch += 1
        counts.ticks = ticks
        if diagnostics.in_flight(d):
            want = d["counters"].get("chunks", 0) - counts.baseline_chunks + 1
            if not pb.wait(lambda: len(pb.recording.chunks) >= want, o.inference_timeout):
                pb.recording.add_event(Event("inference_timeout", f"an inference started by the tick at {t} "
                                             f"delivered no chunk within {o.inference_timeout:g} s", sim_ns=t,
                                             source="replay"))

    def _resync(self, t: int, attempts: int = 5) -> int:
        """Step on grid points from t until the node reports a tick; returns the grid point reached."""
        pb = self.playback
        for _ in range(attempts):
            pb.set_clock(t)
            if pb.wait(lambda: pb.reported_at(t), 1.0, republish=t):
                self.counts.ticks = None
                self._tick(t)  # consumes the report (in-flight inference, tick count)
                return t
            t += pb.dt_ns
        pb.recording.add_event(Event("step_timeout", "the node did not report a tick after the clock jump; "
                                     "stepping on", sim_ns=t, source="replay"))
        return t


class _RealtimePlay:
    """Real-time mode (module doc): messages and /clock leave at the bag's spacing divided by the rate, paced
    on the monotonic clock.  Owns the pacing (the bag time and wall time the replay started at), the clock
    plan and the recorded clock jumps still ahead."""

    def __init__(self, playback: _Playback):
        self.playback = playback
        self.log0 = 0            # the bag time whose replay clock is the start instant
        self.wall0 = 0.0         # time.monotonic() at log0
        self.jumps: List[Tuple[int, int, int]] = []   # (bag time, clock before, clock after) still to come
        self.played = 0          # messages played so far (what an interrupted replay got through)
        self.lags: List[float] = []

    def run(self, t0: int) -> Tuple[int, list]:
        """Play every message; the number played and each message's lateness (s) against its pace."""
        pb = self.playback
        s, o, tm = pb.session, pb.options, pb.session.time_map
        first_log = min(it.log_ns for it in s.items)
        # the bag time whose replay clock is t0 (identity map: t0 itself)
        self.log0 = first_log - (tm(first_log) - t0)
        log_end = max(it.log_ns for it in s.items) + int(o.tail * NS_PER_S)
        plan = self._clock_plan(self.log0, log_end)
        self.wall0 = time.monotonic()
        self.jumps = list(tm.jumps)
        lags = self.lags
        k = 0
        n_plan = len(plan)
        last_alive_check = time.monotonic()
        for item, (conn, log_ns, raw, _) in zip(s.items, iter_bag(s.path)):
            assert item.log_ns == log_ns and item.topic == conn.topic, "bag changed between scan and play"
            while k < n_plan and plan[k] < item.log_ns:
                self._wait_until(int(plan[k]))
                self._pass_jumps(int(plan[k]))
                pb.set_clock(tm(int(plan[k])), int(plan[k]))
                k += 1
            lag = self._wait_until(item.log_ns)
            self._pass_jumps(item.log_ns)
            if item.publish and item.role not in ("clock", "excluded"):
                if item.sim_ns != pb.clock_ns:
                    pb.set_clock(item.sim_ns, item.log_ns)
                pb.publish(item, raw)
                lags.append(lag)
            self.played += 1
            if time.monotonic() - last_alive_check > 0.5:
                last_alive_check = time.monotonic()
                if not pb.alive():
                    raise _NodeLost(self.played)
        while k < n_plan:
            self._wait_until(int(plan[k]))
            pb.set_clock(tm(int(plan[k])), int(plan[k]))
            k += 1
        self._run_on(log_end)
        return self.played, lags

    def _clock_plan(self, log_start: int, log_end: int) -> np.ndarray:
        """Bag times (ns) at which /clock is published besides the messages: every 1/clock_hz and
        where the replay clock crosses a control-grid instant."""
        tm, dt = self.playback.session.time_map, self.playback.dt_ns
        step = int(NS_PER_S / self.playback.options.clock_hz)
        uniform = np.arange(log_start, log_end + 1, step, dtype=np.int64)
        if tm.identity:
            grid = np.arange(((log_start // dt) + 1) * dt, log_end + 1, dt, dtype=np.int64)
        else:
            pts = []
            samples = tm.samples
            bounds = [log_start] + [l for l, _ in samples if log_start < l < log_end] + [log_end]
            for a, b in zip(bounds, bounds[1:]):
                sa, sb = tm(a), tm(max(a, b - 1))
                g = ((sa // dt) + 1) * dt
                while g <= sb:
                    pts.append(a + (g - sa))
                    g += dt
            grid = np.array(pts, dtype=np.int64)
        return np.unique(np.concatenate([uniform, grid]))

    def _wait_until(self, log_ns: int) -> float:
        """Sleep until bag time ``log_ns`` is due; how late it is (s) when the sleep ends."""
        target = self.wall0 + (log_ns - self.log0) / NS_PER_S / self.playback.options.rate
        delay = target - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        return time.monotonic() - target

    def _pass_jumps(self, log_ns: int) -> None:
        """Play the recorded clock jumps at or before bag time ``log_ns``."""
        pb = self.playback
        while self.jumps and self.jumps[0][0] <= log_ns:
            jl, before, after = self.jumps.pop(0)
            pb.recording.add_event(Event("clock_jump_played", f"replay clock jumped {(after - before) / NS_PER_S:+.3f} s",
                                         sim_ns=after, log_ns=jl, source="replay"))
            if after < before:
                pb.jump_back()
                # land on the control grid so the node's reset timer keeps ticking on it
                g = (after // pb.dt_ns) * pb.dt_ns
                pb.set_clock(g, jl - (after - g))

    def _run_on(self, log_end: int) -> None:
        """Run the clock on after the last message until the node reports once more, so the counters cover
        the whole replay."""
        pb = self.playback
        o, tm = pb.options, pb.session.time_map
        end_clock = pb.clock_ns
        step = int(NS_PER_S / o.clock_hz)
        deadline = time.monotonic() + 2.0 + 2 * pb.info.diagnostics_period / o.rate
        log_now = log_end
        while time.monotonic() < deadline:
            with pb.recording.cond:
                if any(d.msg["stamp_ns"] >= end_clock for d in pb.recording.diags[-3:]):
                    break
            log_now += step
            self._wait_until(log_now)
            pb.set_clock(tm(log_now), log_now)


# ---------------------------------------------------------------------- results
def _collect(playback: _Playback, baseline: dict, played: int, complete: bool, wall: float,
             lags: list) -> ReplayResult:
    """What the replay produced: the node's outputs, its counters over the session (and the tail apart),
    the input accounting and every event."""
    pb, s, o = playback, playback.session, playback.options
    rec = pb.recording
    with rec.cond:
        chunks, margins = list(rec.chunks), list(rec.margins)
        commands, diags = list(rec.commands), list(rec.diags)
    last = diags[-1].msg if diags else baseline
    # The session: from the last report before the first message to the first report after the last
    # one.  Preroll ticks (no data yet) and the tail (inputs age out after the bag ends, so the node
    # reports stale snapshots and misses) are not the recorded session's doing.
    start = diags[pb.first_pub[0] - 1] if pb.first_pub and pb.first_pub[0] > 0 else None
    end = diags[pb.last_pub[0]] if pb.last_pub and len(diags) > pb.last_pub[0] else (diags[-1] if diags else None)
    start_msg, end_msg = (start.msg if start else baseline), (end.msg if end else last)

    def delta(a: dict, b: dict) -> Dict[str, int]:
        return {k: v - a["counters"].get(k, 0) for k, v in b["counters"].items() if k in COUNTERS}

    counters = delta(start_msg, end_msg)
    tail = {k: v for k, v in delta(end_msg, last).items() if v > 0 and k not in ("ticks", "ticks_without_chunk")}
    first, last_pub = pb.first_pub or (None, None, None), pb.last_pub or (None, None, None)
    # what the two reports enclose, on the node's clock (epoch, stamp): a margin at a report's own tick was
    # published before it (the action timer's callback runs before the diagnostics one)
    lo_key = (start.epoch, start.msg["stamp_ns"]) if start else (0, baseline["stamp_ns"])
    hi_key = (end.epoch, end.msg["stamp_ns"]) if end else None
    inside = [r.msg.chunk_seq for r in margins
              if lo_key < (r.epoch, r.msg.stamp_ns) and (hi_key is None or (r.epoch, r.msg.stamp_ns) <= hi_key)]
    c0, c1 = start_msg["counters"].get("chunks"), end_msg["counters"].get("chunks")
    bounds = SessionBounds(start_ns=first[1], end_ns=last_pub[1], report_ns=end_msg["stamp_ns"],
                           start_bag_ns=first[2], end_bag_ns=last_pub[2],
                           chunk_seqs=(c0, c1) if c0 is not None and c1 is not None else None,
                           margin_seqs=(min(inside), max(inside)) if inside else None)
    snapshots = reconstruct_snapshots(chunks, margins, pb.dt_ns)
    race = o.race_window if o.race_window is not None else (0.0 if o.mode == "stepped" else 0.02 * o.rate)
    end_epoch = max((it.epoch for it in s.items[:played]), default=0)
    acc = account(s, snapshots, played=played, end_sim_ns=pb.last_pub[1] if pb.last_pub else pb.clock_ns,
                  end_epoch=end_epoch,
                  node_counters=counters, race_window_ns=int(race * NS_PER_S))
    events = list(rec.events)
    for kind in ("stale_snapshots", "deadline_misses", "clock_jumps", "inference_errors", "bad_chunks",
                 "expired_chunks", "late_chunks", "discarded_after_reset", "callback_errors", "worker_crashes"):
        if counters.get(kind, 0) > 0:
            events.append(Event(f"node_{kind}", f"the node counted {counters[kind]} {kind.replace('_', ' ')}",
                                source="node"))
    for who, n in sorted(rec.foreign.items()):
        events.append(Event("foreign_diagnostics", f"{n} /diagnostics reports of {who} left out: not the judged "
                            f"node {rec.identity.describe()} (another node on this DDS domain)", source="replay"))
    if tail:
        events.append(Event("after_bag_end", "in the replay's tail after the last message the node counted "
                            + ", ".join(f"{k} {v}" for k, v in sorted(tail.items()))
                            + " (not counted as the session's)", sim_ns=end_msg["stamp_ns"],
                            log_ns=pb.last_pub[2] if pb.last_pub else None, source="node"))
    lag_ms = {}
    if lags:
        arr = np.array(lags) * 1e3
        lag_ms = {"p50": float(np.percentile(arr, 50)), "p99": float(np.percentile(arr, 99)),
                  "max": float(arr.max())}
        if lag_ms["p99"] > 20.0:
            events.append(Event("replay_lag", f"messages left up to {lag_ms['max']:.0f} ms late (p99 "
                                f"{lag_ms['p99']:.1f} ms): this machine could not keep the recorded timing",
                                source="replay"))
    events.sort(key=lambda e: (0 if e.log_ns is None and e.source != "node" else 1 if e.log_ns is not None else 2,
                               e.log_ns or 0))
    return ReplayResult(session=s, options=o, out_path=pb.output.path if pb.output else None, chunks=chunks,
                        margins=margins, commands=commands, diagnostics=diags, events=events, accounting=acc,
                        node_counters=counters, played=played, complete=complete, wall_s=wall, lag_ms=lag_ms,
                        snapshots=snapshots, session_bounds=bounds, tail_counters=tail,
                        node_identity=rec.identity, foreign_reports=dict(rec.foreign))


def _write_result(output: _Output, result: ReplayResult, bag_ns: int) -> None:
    """The events and the summary into the output bag (what ``runbag.load_run`` reads back), then close it."""
    ts = typestore()
    String = ts.types["std_msgs/msg/String"]
    output.add(SUMMARY_TOPIC, "std_msgs/msg/String")
    output.add(EVENTS_TOPIC, "std_msgs/msg/String")
    for e in result.events:
        t = e.log_ns if e.log_ns is not None else bag_ns
        output.write(EVENTS_TOPIC, max(0, t), bytes(ts.serialize_cdr(String(data=json.dumps(e.to_dict())),
                                                                     "std_msgs/msg/String")))
    summary = json.dumps(result.summary(), default=json_default)
    output.write(SUMMARY_TOPIC, bag_ns, bytes(ts.serialize_cdr(String(data=summary), "std_msgs/msg/String")))
    output.close()


class _NodeLost(Exception):
    def __init__(self, played: int):
        super().__init__("node lost")
        self.played = played


def _recorded_latched(session: Session, topic: str) -> bool:
    return session.topics.get(topic, {}).get("latched", False)


def reconstruct_snapshots(chunks: List[Received], margins: List[Received], dt_ns: int) -> List[Snapshot]:
    """One snapshot per published chunk.  Its ControlMargin (``chunk_seq``; published on the tick that
    adopts or expires it) makes the snapshot time exact: observation stamp + L_observe + L_transfer.
    A chunk without a margin (dropped by a clock reset before adoption) gets t0 - dt, the tick that
    triggered it."""
    pairs = match_chunks_and_margins([(r.seq, r.msg) for r in chunks], [(r.seq, r.msg) for r in margins])
    out = []
    for i, r in enumerate(chunks):
        c = r.msg
        m = margins[pairs[i]].msg if i in pairs else None
        if m is not None and math.isfinite(m.latency_observe) and math.isfinite(m.latency_transfer):
            taken = c.observation_stamp_ns + int(round((m.latency_observe + m.latency_transfer) * NS_PER_S))
            out.append(Snapshot(taken, c.observation_stamp_ns, c.seq, r.epoch, True))
        else:
            out.append(Snapshot(c.t0_ns - dt_ns, c.observation_stamp_ns, c.seq, r.epoch, False))
    return out


__all__ = ["require_ros", "ReplayNode", "ReplayOptions", "ReplayResult", "Received", "SessionBounds", "reconstruct_snapshots", "parse_diagnostics",
           "SUMMARY_TOPIC", "EVENTS_TOPIC", "MODES", "ros_type"]
