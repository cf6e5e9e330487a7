"""Play a scanned bag into live topics, drive the replay clock, and record the node's outputs.

The node must run with ``use_sim_time:=true``: the player publishes ``/clock`` and the node's
stamps, timers and latency segments all follow it.

Modes: ``realtime`` (rate r) paces the messages at their recorded spacing divided by r, and its latencies
measure the node (at r = 1); ``stepped`` moves the clock one control period at a time and waits for the node,
so a run is deterministic and its latencies describe the logic, not the machine.  Each mode's module says how
(``realtime``, ``stepped``); what both share while playing is ``playback``.

This module is the entry: ``ReplayNode`` (the replay's own rclpy side) plays one bag from the node's first
report to a ``ReplayResult`` (``result``).  A replay tool never loses what it recorded: however playing ends
(the bag's end, the node lost, an interrupt), the result is collected and the output bag closed.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable, Optional

from phyai_ros import needs_ros
from phyai_ros.control.clock import NS_PER_S
from phyai_ros.diagnostics import NODE_NAME
from phyai_ros.replay.bagtypes import ros_type
from phyai_ros.replay.nodeinfo import NodeInfo, query_node
from phyai_ros.replay.options import MODES, ReplayOptions
from phyai_ros.replay.playback import NodeLost, Playback
from phyai_ros.replay.realtime import RealtimePlay
from phyai_ros.replay.recording import Received, parse_diagnostics
from phyai_ros.replay.result import ReplayResult, SessionBounds, collect_result, reconstruct_snapshots, write_result
from phyai_ros.replay.runbag import EVENTS_TOPIC, SUMMARY_TOPIC
from phyai_ros.replay.scan import Event, Session
from phyai_ros.replay.stepped import SteppedPlay

# rclpy is imported where playback starts: scans, reports and ``--help`` import this module without it.


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
        return _replay(self, Playback(self.node, session, out_path, options or ReplayOptions(), alive, node_pid), log)


def _replay(replay_node: ReplayNode, playback: Playback, log: Callable[[str], None]) -> ReplayResult:
    """Start the node's clock at the grid instant before the preroll, play the bag in the chosen mode and
    collect what the node did. Interrupted (KeyboardInterrupt: Ctrl-C, or the CLI's SIGTERM) while playing, the
    replay stops there and keeps what was recorded: the result and the output bag are finished as for a replay cut
    short (an ``interrupted`` event), then the interrupt goes on with the result attached (``.result``); earlier, the
    output bag is closed as it is. A replay tool never loses what it recorded."""
    try:
        return _replay_bag(replay_node, playback, log)
    except BaseException:
        if playback.output is not None:
            playback.output.close()   # metadata.yaml written, the mcap finished / the db committed
        raise


def _replay_bag(replay_node: ReplayNode, playback: Playback, log: Callable[[str], None]) -> ReplayResult:
    s, o = playback.session, playback.options
    playable = [it for it in s.items if it.role not in ("clock",)]
    if not playable:
        raise ValueError(f"{s.path}: nothing to play")
    replay_node.wait_for_node(o.startup_timeout, playback.alive)
    t0 = ((s.start_sim - int(o.preroll * NS_PER_S)) // playback.dt_ns) * playback.dt_ns
    w_start = time.monotonic()
    baseline = playback.sync_start(t0)
    domain = playback.shared_domain()   # again at the end: a node may join during the replay
    log(f"replay: node follows /clock; playing {len(s.items)} messages ({o.mode}"
        + (f" x{o.rate:g}" if o.mode == "realtime" else "") + ")")
    played, complete, interrupt = 0, False, None
    play = SteppedPlay(playback) if o.mode == "stepped" else RealtimePlay(playback)
    try:
        ran = play.run(t0)
        played = ran if o.mode == "stepped" else ran[0]
        complete = played == len(s.items)
    except NodeLost as exc:
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
    result = collect_result(playback, baseline, played, complete, wall, lags)
    if playback.output is not None:
        write_result(playback.output, result, playback.bag_ns)
    playback.recording.unsubscribe(playback.node)
    if interrupt is not None:
        interrupt.result = result
        raise interrupt
    return result


def _signal_name(exc: BaseException) -> str:
    signum = getattr(exc, "signum", signal.SIGINT)
    return signal.Signals(signum).name


# What other modules and users import from here (the options, the result and its parts live in their modules).
__all__ = ["require_ros", "ReplayNode", "ReplayOptions", "ReplayResult", "Received", "SessionBounds",
           "reconstruct_snapshots", "parse_diagnostics", "SUMMARY_TOPIC", "EVENTS_TOPIC", "MODES", "ros_type"]
