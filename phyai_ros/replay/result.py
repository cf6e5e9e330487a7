"""What a replay produced (``ReplayResult``): gathered from the recording when playing ends, however it ended
(the bag's end, the node lost, an interrupt), and written into the output bag as its events and summary (what
``runbag.load_run`` and the report read back).

The session's counters are the node's over the recorded session only (``SessionBounds``): the preroll and the
tail after the bag ends are not the session's doing (design.md §5)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from phyai_ros.control.clock import NS_PER_S
from phyai_ros.control.loop import COUNTERS
from phyai_ros.diagnostics import NodeIdentity
from phyai_ros.replay.accounting import Accounting, Snapshot, account
from phyai_ros.replay.bagtypes import typestore
from phyai_ros.replay.options import ReplayOptions
from phyai_ros.replay.outbag import OutputBag
from phyai_ros.replay.playback import Playback
from phyai_ros.replay.recording import Received
from phyai_ros.replay.runbag import EVENTS_TOPIC, SUMMARY_TOPIC, json_default, match_chunks_and_margins
from phyai_ros.replay.scan import Event, Session


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


def collect_result(playback: Playback, baseline: dict, played: int, complete: bool, wall: float,
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


def write_result(output: OutputBag, result: ReplayResult, bag_ns: int) -> None:
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


__all__ = ["ReplayResult", "SessionBounds", "collect_result", "reconstruct_snapshots", "write_result"]
