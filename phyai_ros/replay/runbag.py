"""Read a bag of the policy node's outputs back into Python objects.

Works on the replay's output bags (which add ``/replay/summary`` and ``/replay/events``) and on
any rosbag2 recorded on a robot with ``ros2 bag record`` of the node's topics: topics are found
by message type (the command topic by the summary, else the busiest single-point
JointTrajectory / Float64MultiArray topic).  /diagnostics reports are one node's: the one the replay
judged (its summary's ``node_identity``), else the first policy node reporting in the bag. Bags are shared
between people: the summary is data from outside, so each of its fields is type-checked when read
(``check_summary``); one of the wrong type is left out (listed in ``Run.refused``), never passed on to the report.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from phyai_ros.control.chunk import ActionChunk
from phyai_ros.control.clock import stamp_to_ns
from phyai_ros.control.margin import MarginReport
from phyai_ros.diagnostics import NodeIdentity
from phyai_ros.messages import MalformedMessageError, msg_to_chunk, msg_to_margin
from phyai_ros.replay.accounting import CATEGORIES
from phyai_ros.replay.bagtypes import open_bag
from phyai_ros.replay.recording import parse_diagnostics

SUMMARY_TOPIC = "/replay/summary"   # what the replay adds to an output bag (player writes them): its summary
EVENTS_TOPIC = "/replay/events"     # and its events, JSON in std_msgs/String
CHUNK_TYPE = "phyai_ros/msg/ActionChunk"
MARGIN_TYPE = "phyai_ros/msg/ControlMargin"
DIAG_TYPE = "diagnostic_msgs/msg/DiagnosticArray"


@dataclass
class Run:
    path: Path
    chunks: List[Tuple[int, ActionChunk]] = field(default_factory=list)     # (bag time ns, chunk)
    margins: List[Tuple[int, MarginReport]] = field(default_factory=list)  # (bag time ns, margin report)
    commands: List[Tuple[int, Optional[int], np.ndarray]] = field(default_factory=list)  # (bag t, slot stamp, action)
    diagnostics: List[Tuple[int, dict]] = field(default_factory=list)  # (bag t, parse_diagnostics dict)
    summary: Optional[dict] = None
    events: List[dict] = field(default_factory=list)
    topics: Dict[str, str] = field(default_factory=dict)
    bad_messages: int = 0
    refused: List[str] = field(default_factory=list)   # summary fields left out for their type
    node: Optional[NodeIdentity] = None        # whose /diagnostics reports these are
    foreign_reports: int = 0                   # reports of other policy nodes in the bag, left out

    @property
    def t0(self) -> int:
        times = [t for t, *_ in self.chunks] + [t for t, _ in self.margins] + [t for t, _ in self.diagnostics]
        return min(times) if times else 0


def load_run(path) -> Run:
    path = Path(path)
    run = Run(path=path)
    with open_bag(path) as reader:   # an output bag cut short (a killed replay) still gives its complete part
        run.topics = {c.topic: c.msgtype for c in reader.connections}
        # the summary first: it names the command topic
        sconns = [c for c in reader.connections
                  if c.topic in (SUMMARY_TOPIC, EVENTS_TOPIC) and c.msgtype == "std_msgs/msg/String"]
        for conn, t, raw in _messages(reader, sconns):
            data = reader.deserialize(raw, conn.msgtype).data
            try:
                value = json.loads(data)
            except ValueError:
                continue
            if conn.topic == SUMMARY_TOPIC:
                run.summary = check_summary(value, run.refused)
        if run.summary is not None:
            run.events = list(run.summary.get("events", []))
            who = run.summary.get("node_identity")
            if who:
                run.node = NodeIdentity(who["name"], who.get("pid"), who.get("host"))
        command_topic = _command_topic(reader, run.summary)
        wanted = [c for c in reader.connections
                  if c.msgtype in (CHUNK_TYPE, MARGIN_TYPE, DIAG_TYPE) or c.topic == command_topic]
        for conn, t, raw in _messages(reader, wanted):
            try:
                msg = reader.deserialize(raw, conn.msgtype)
                if conn.msgtype == CHUNK_TYPE:
                    run.chunks.append((t, msg_to_chunk(msg)))
                elif conn.msgtype == MARGIN_TYPE:
                    run.margins.append((t, msg_to_margin(msg)))
                elif conn.msgtype == DIAG_TYPE:
                    d = parse_diagnostics(msg, run.node.name if run.node else None)
                    if d is not None:
                        run.node = run.node or NodeIdentity(d["node"]).of(d)
                        if run.node.matches(d):
                            run.diagnostics.append((t, d))
                        else:
                            run.foreign_reports += 1
                elif hasattr(msg, "points"):
                    if msg.points:
                        run.commands.append((t, stamp_to_ns(msg.header.stamp),
                                             np.asarray(msg.points[0].positions, dtype=np.float64)))
                else:
                    run.commands.append((t, None, np.asarray(msg.data, dtype=np.float64)))
            except (MalformedMessageError, ValueError, KeyError, AttributeError):
                run.bad_messages += 1
    return run


NUMBER, INT, STR, BOOL = "number", "int", "str", "bool"
# The replay summary's fields (result.ReplayResult.summary) -> their kind; sections are nested tables of the same
# ("*": any other key; "!": keys without which the table is left out whole).
_COUNTS = {"*": INT}
_ROW = {"*": INT, "!": ("played",) + CATEGORIES}
_SUMMARY = {
    "bag": STR, "storage": STR, "clock_source": STR, "bag_duration_s": NUMBER, "messages": INT, "played": INT,
    "complete": BOOL, "mode": STR, "rate": NUMBER, "wall_s": NUMBER, "chunks": INT, "margins": INT, "commands": INT,
    "diagnostics": INT, "out": STR, "session_start_ns": INT, "session_end_ns": INT, "session_report_ns": INT,
    "session_start_bag_ns": INT, "session_end_bag_ns": INT, "session_chunk_seqs": [INT], "session_margin_seqs": [INT],
    "node_identity": {"name": STR, "pid": INT, "host": STR, "!": ("name",)}, "foreign_reports": _COUNTS,
    "lag_ms": {"*": NUMBER}, "topics": {"*": STR},
    "node_counters": _COUNTS, "tail_counters": _COUNTS,
    "node": {"name": STR, "source": STR, "state_topic": STR, "instruction_topic": STR, "max_observation_age": NUMBER,
             "max_state_age": NUMBER, "dt": NUMBER, "horizon": INT, "diagnostics_period": NUMBER,
             "command_topic": STR, "chunk_topic": STR, "margin_topic": STR, "chunk_trajectory_topic": STR,
             "eps": NUMBER, "confidence": NUMBER, "min_samples": INT, "error_probability": NUMBER,
             "error_consecutive_misses": INT, "model_id": STR, "use_sim_time": BOOL},
    "accounting": {"per_topic": {"*": _ROW}, "reasons": {"*": _COUNTS}, "snapshots": INT, "verified": INT,
                   "races": INT, "unexplained": INT, "ok": BOOL, "problems": [STR], "snapshot_uses": _COUNTS,
                   "rejection_check": {"*": _COUNTS}},
    "events": [{"kind": STR, "detail": STR, "topic": STR, "log_ns": INT, "sim_ns": INT, "index": INT, "source": STR}],
}


def _kind_ok(value: Any, kind: str) -> bool:
    if kind == BOOL:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind == INT:
        return isinstance(value, int)
    if kind == NUMBER:
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, str)


def _checked(value: Any, schema, where: str, refused: List[str]):
    """``value`` as ``schema`` says (a kind, a table {key or '*': schema}, or [item schema]); what does not fit is
    left out and its place named in ``refused``. None when ``value`` itself does not fit."""
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            refused.append(where)
            return None
        out = {}
        for key, item in value.items():
            sub = schema.get(key, schema.get("*")) if isinstance(key, str) and key != "!" else None
            if sub is None:
                continue   # a field the report never reads
            checked = _checked(item, sub, f"{where}.{key}", refused)
            if checked is not None:
                out[key] = checked
        missing = [key for key in schema.get("!", ()) if key not in out]
        if missing:
            refused.append(f"{where} (without {', '.join(missing)})")
            return None
        return out
    if isinstance(schema, list):
        if not isinstance(value, list):
            refused.append(where)
            return None
        items = [_checked(item, schema[0], f"{where}[{i}]", refused) for i, item in enumerate(value)]
        return [item for item in items if item is not None]
    if value is None:
        return None
    if not _kind_ok(value, schema):
        refused.append(where)
        return None
    return value


def check_summary(value: Any, refused: Optional[List[str]] = None) -> Optional[dict]:
    """The replay summary read from a bag, each field of the type the report reads (the others left out and
    named in ``refused``); None for a summary that is not a JSON object."""
    return _checked(value, _SUMMARY, "summary", refused if refused is not None else [])


def _messages(reader, connections):
    """The messages of ``connections`` only (rosbags reads every topic when given none)."""
    return reader.messages(connections=connections) if connections else iter(())


class NotAnOutputBag(ValueError):
    """The bag holds none of the policy node's outputs (an input bag, say)."""


def require_node_outputs(run: Run) -> Run:
    """``run`` if it holds the node's chunks or margins, or their topics without a message (a node that produced
    nothing, e.g. every snapshot stale under overload: the worst case, which its report judges ERROR), else a
    NotAnOutputBag that says what the bag holds."""
    if run.chunks or run.margins or {CHUNK_TYPE, MARGIN_TYPE} & set(run.topics.values()):
        return run
    held = ", ".join(f"{t} ({m})" for t, m in sorted(run.topics.items())[:8]) or "no topics"
    more = f" and {len(run.topics) - 8} more" if len(run.topics) > 8 else ""
    raise NotAnOutputBag(f"{run.path} holds none of the node's outputs (action_chunk / control_margin: no "
                         f"{CHUNK_TYPE} or {MARGIN_TYPE} messages); it holds {held}{more}. An input bag? "
                         "Replay it through the node first: python -m phyai_ros.replay.cli BAG --start-node ... "
                         "--report")


def _command_topic(reader, summary: Optional[dict]) -> Optional[str]:
    if summary is not None and summary.get("node", {}).get("command_topic"):
        return summary["node"]["command_topic"]
    best, count = None, -1
    for c in reader.connections:
        if c.msgtype in ("trajectory_msgs/msg/JointTrajectory", "std_msgs/msg/Float64MultiArray") and \
                "chunk" not in c.topic and c.msgcount > count:
            best, count = c.topic, c.msgcount
    return best


def json_default(o):
    """``json.dumps``'s ``default`` for what the replay writes (its summary, the report's numbers): numpy scalars as
    numbers, anything else (a path) as text. Floats never reach it: json writes them itself, NaN as ``NaN``."""
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    return str(o)


def match_chunks_and_margins(chunks: List[Tuple[int, ActionChunk]],
                             margins: List[Tuple[int, MarginReport]]) -> Dict[int, int]:
    """chunk list index -> margin list index: a ControlMargin names its chunk (``chunk_seq``)."""
    by_seq = {c.seq: i for i, (_, c) in enumerate(chunks)}
    return {by_seq[m.chunk_seq]: j for j, (_, m) in enumerate(margins) if m.chunk_seq in by_seq}


__all__ = ["Run", "load_run", "check_summary", "json_default", "match_chunks_and_margins", "require_node_outputs",
           "NotAnOutputBag", "SUMMARY_TOPIC", "EVENTS_TOPIC"]
