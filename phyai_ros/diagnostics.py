"""The policy node's /diagnostics report: names, keys and parsing in one home.

The node writes it (``phyai_ros.node.main``) and the replay tools read it; both use this module,
so a renamed status or key cannot silently break the reader.  ROS-free: the writer turns the
(key, value) pairs into ``diagnostic_msgs`` itself; the parser takes any object shaped like a
``DiagnosticArray``.  Counter names and their meanings: docs/design.md §4.
"""
from __future__ import annotations

import functools
import math
import os
import socket
from dataclasses import dataclass
from typing import Iterable, List, Mapping, Optional, Tuple

NODE_NAME = "phyai_policy"          # the node's default name (launch files, replay, tests)
MARGIN_STATUS = "control margin"    # status: the watchdog's level and the margin statistics
LOOP_STATUS = "inputs and loop"     # status: the loop's counters (WARN when a problem counter grew)
IN_FLIGHT = "inference_in_flight"   # loop status flag: 'true' while an inference runs
DELAY_ESTIMATE = "delay_estimate_ticks"
PROCESS_ID, HOST = "pid", "host"    # loop status: the node's process and host, which tell two nodes of one name apart


@dataclass(frozen=True)
class NodeIdentity:
    """Which node a report is from: its name (the prefix of its statuses) and the process id and host it
    reports (None: not known, which matches any).  Two nodes of one name on one DDS domain differ in these."""

    name: str
    pid: Optional[int] = None
    host: Optional[str] = None

    def matches(self, report: dict) -> bool:
        """Whether ``report`` (a ``parse`` result) is this node's."""
        return (report.get("node") == self.name and self.pid in (None, report.get("pid"))
                and self.host in (None, report.get("host")))

    def of(self, report: dict) -> "NodeIdentity":
        """This identity completed by what ``report`` says (the first report of a node not started here)."""
        return NodeIdentity(self.name, report.get("pid"), report.get("host"))

    def describe(self) -> str:
        where = f"pid {self.pid}" if self.pid is not None else "pid unknown"
        return f"/{self.name.lstrip('/')} ({where}{' on ' + self.host if self.host else ''})"

    def to_dict(self) -> dict:
        return {"name": self.name, "pid": self.pid, "host": self.host}


@functools.lru_cache(maxsize=1)
def _host() -> str:
    return socket.gethostname()


def status_name(node_name: str, status: str) -> str:
    return f"{node_name}: {status}"


def margin_values(report, delivery: Mapping[str, float], clock_rate: float) -> List[Tuple[str, float]]:
    """Key/value pairs of the margin status: the last chunk's report (if any), the command
    delivery delay, the stamp clock's measured rate."""
    values = []
    if report is not None:
        values = [("margin_s", report.margin), ("margin_p50_s", report.margin_p50),
                  ("margin_p99_s", report.margin_p99), ("p_nonnegative", report.p_nonnegative),
                  ("p_nonnegative_lower", report.p_nonnegative_lower), ("confidence", report.confidence),
                  ("target", report.target), ("inference_s", report.latency_inference),
                  ("roofline_x", report.roofline_x), ("roofline_y", report.roofline_y)]
    return values + [("command_delay_p50_s", delivery["p50"]), ("command_delay_p99_s", delivery["p99"]),
                     ("command_delay_max_s", delivery["max"]), ("clock_rate", clock_rate)]


def loop_values(counters: Mapping[str, int], delay_estimate: int, in_flight: bool) -> List[Tuple[str, str]]:
    """Key/value pairs of the loop status: the counters, the delay estimate, the in-flight flag and the
    identity of the process that publishes them (the node's)."""
    return ([(k, str(v)) for k, v in counters.items()]
            + [(DELAY_ESTIMATE, str(delay_estimate)), (IN_FLIGHT, str(bool(in_flight)).lower()),
               (PROCESS_ID, str(os.getpid())), (HOST, _host())])


def _level(st) -> int:
    return int(st.level[0]) if isinstance(st.level, (bytes, bytearray)) else int(st.level)


def _number(v: str) -> float:
    try:
        return float(v)
    except ValueError:
        return math.nan


def parse(msg, stamp_ns: int, node_name: Optional[str] = None) -> Optional[dict]:
    """The policy node's report as a dict, or None for someone else's: ``stamp_ns``,
    ``counters`` (int), ``flags`` (other loop values), ``inputs_level``/``inputs_message``,
    ``margin_level``/``margin_message``/``margin_values`` (float), and who sent it: ``node`` (its
    name), ``pid`` and ``host`` (None if it does not say; ``NodeIdentity.matches``).  ``node_name``
    None: the first node in the message whose statuses carry this module's names."""
    out = {"stamp_ns": int(stamp_ns), "counters": {}, "flags": {}, "node": None, "pid": None, "host": None}
    mine = False
    for st in _statuses(msg):
        node, _, status = st.name.rpartition(": ")
        if (node_name is not None and node != node_name) or (out["node"] not in (None, node)):
            continue
        if status == LOOP_STATUS:
            mine = True
            out["node"] = node
            for kv in st.values:
                v = kv.value.strip()
                if kv.key == PROCESS_ID:
                    out["pid"] = int(v) if v.isdigit() else None
                elif kv.key == HOST:
                    out["host"] = v
                elif v.lstrip("-").isdigit():
                    out["counters"][kv.key] = int(v)
                else:
                    out["flags"][kv.key] = v
            out["inputs_level"], out["inputs_message"] = _level(st), st.message
        elif status == MARGIN_STATUS:
            out["node"] = node
            out["margin_level"], out["margin_message"] = _level(st), st.message
            out["margin_values"] = {kv.key: _number(kv.value) for kv in st.values}
    return out if mine else None


def _statuses(msg) -> Iterable:
    return getattr(msg, "status", ())


def in_flight(report: dict) -> bool:
    """Whether an inference was running at the report (from its flag, or else from the counters:
    started minus ended)."""
    flag = report["flags"].get(IN_FLIGHT)
    if flag is not None:
        return flag == "true"
    c = report["counters"]
    done = sum(c.get(k, 0) for k in ("chunks", "inference_errors", "bad_chunks", "discarded_after_reset",
                                     "worker_crashes"))
    return c.get("inferences_started", 0) > done


__all__ = ["NODE_NAME", "MARGIN_STATUS", "LOOP_STATUS", "IN_FLIGHT", "DELAY_ESTIMATE", "PROCESS_ID", "HOST",
           "NodeIdentity", "status_name",
           "margin_values", "loop_values", "parse", "in_flight"]
