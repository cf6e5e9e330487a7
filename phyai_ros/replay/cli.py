"""``replay``: play a rosbag2 (sqlite3 or mcap) through the policy node and record what it does.

    replay BAG [--out OUT] [--mode realtime|stepped] [--rate R] [--remap FROM:=TO ...]
               [--node NAME | --start-node --params-file F -p NAME:=VALUE ...]

(``ros2 run phyai_ros replay ...`` on a ROS install; ``bin/replay`` / ``python -m
phyai_ros.replay`` here.)  The node must run with ``use_sim_time:=true`` (the replay owns
``/clock``); in stepped mode also with ``diagnostics.period`` equal to ``control.dt``.
``--start-node`` starts it with both set.  Prints a summary: what was played, what the node
produced, every event, and per input topic how many messages were used, superseded, stale or
rejected.  The output bag holds the node's outputs (ActionChunk, ControlMargin, commands,
chunk trajectories, /diagnostics) plus ``/replay/summary`` and ``/replay/events``; feed it to
``report``.

SIGINT (Ctrl-C) or SIGTERM stops the replay where it is: the node it started is stopped, the output bag is
closed with what was recorded until then (its summary says the replay was interrupted), the summary is printed
and, with ``--report``, the report written; the exit status is 128 + the signal's number.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Optional, Sequence

from phyai_ros.diagnostics import NODE_NAME
from phyai_ros.replay.accounting import CATEGORIES
from phyai_ros.control.clock import NS_PER_S
from phyai_ros.replay.bagtypes import parse_remaps
from phyai_ros.replay.nodeinfo import NodeInfo, reconcile_with_graph
from phyai_ros.replay.nodeproc import PolicyNodeProcess, node_info_for, parse_param_args, with_replay_mode
from phyai_ros.replay.player import MODES, ReplayNode, ReplayOptions, ReplayResult, require_ros
from phyai_ros.replay.report import make_report
from phyai_ros.replay.runbag import json_default
from phyai_ros.replay.scan import Event, check_playable, scan_bag


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM to the replay (``signum``): it stops and keeps what it recorded (player._replay)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop_on_signals() -> dict:
    """SIGINT and SIGTERM raise Interrupted in the main thread, once: later ones while the replay stops its node
    and closes its output bag are only noted (that work is what keeps the recording). Returns the handlers it
    replaced, for ``signal.signal`` to put back."""
    raised = []

    def handler(signum, frame):
        if raised:
            print(f"replay: {signal.Signals(signum).name} again: still stopping the node and closing the output bag",
                  file=sys.stderr, flush=True)
            return
        raised.append(signum)
        raise Interrupted(signum)
    return {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="replay", description=__doc__.split("\n\n")[0].replace("``", ""),
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("bag", help="input rosbag2 folder (sqlite3 or mcap)")
    ap.add_argument("--out", "-o", help="output bag folder to create (default: <bag>_replay_<time>)")
    ap.add_argument("--out-storage", choices=("mcap", "sqlite3"), default="mcap")
    ap.add_argument("--mode", choices=MODES, default="realtime",
                    help="realtime: recorded timing (scaled by --rate); stepped: deterministic, /clock advanced "
                         "one control period at a time, waiting for the node")
    ap.add_argument("--rate", type=float, default=1.0, help="realtime speed factor (default 1)")
    ap.add_argument("--remap", "-r", action="append", default=[], metavar="FROM:=TO",
                    help="publish bag topic FROM on TO (repeatable; one value may hold several, space-separated)")
    ap.add_argument("--topics", nargs="+", help="play only these bag topics")
    ap.add_argument("--exclude", nargs="+", default=[], help="do not play these bag topics")
    ap.add_argument("--clock-source", choices=("auto", "bag", "clock"), default="auto",
                    help="replay clock: a recorded /clock if the bag has one (auto), bag timestamps (bag), or the "
                         "recorded /clock (clock)")
    ap.add_argument("--node", default=NODE_NAME, help=f"name of the policy node (default {NODE_NAME})")
    ap.add_argument("--params-file", help="the node's params file (with --start-node, or when its parameter "
                                          "service cannot be reached)")
    ap.add_argument("-p", "--param", action="append", default=[], metavar="NAME:=VALUE",
                    help="node parameter override (with --start-node; repeatable)")
    ap.add_argument("--start-node", action="store_true",
                    help="start the policy node here (params file + -p overrides, use_sim_time on) and stop it "
                         "after the replay")
    ap.add_argument("--node-log", help="with --start-node: write the node's output to this file")
    ap.add_argument("--wait-node", type=float, default=60.0, help="seconds to wait for the node (default 60)")
    ap.add_argument("--preroll", type=float, default=0.2, help="replay-clock seconds before the first message")
    ap.add_argument("--tail", type=float, default=1.0, help="replay-clock seconds after the last message")
    ap.add_argument("--clock-hz", type=float, default=200.0, help="realtime /clock rate between messages")
    ap.add_argument("--settle", type=float, default=0.01, help="stepped: wall seconds for the node to take inputs "
                                                               "before a tick (default 0.01)")
    ap.add_argument("--publish-undecodable", action="store_true",
                    help="publish messages whose CDR cannot be decoded (default: reject them unpublished)")
    ap.add_argument("--record-inputs", action="store_true", help="copy the played inputs into the output bag")
    ap.add_argument("--json", help="also write the summary as JSON to this file")
    ap.add_argument("--report", nargs="?", const="true", default="false", choices=("true", "false"),
                    help="write the report (report OUT) after the replay")
    ap.add_argument("--strict", action="store_true",
                    help="exit 2 (with the reason) when the replay is incomplete, the node produced no chunk, or "
                         "the accounting found a problem")
    return ap


def format_summary(r: ReplayResult) -> str:
    s, acc = r.session, r.accounting
    lines = [f"replay: {s.path} ({s.storage}, {s.duration():.1f} s, {len(s.items)} messages, clock: {s.clock_source})"]
    mode = r.options.mode + (f" x{r.options.rate:g}" if r.options.mode == "realtime" else "")
    lag = (f", lag p99 {r.lag_ms['p99']:.1f} ms" if r.lag_ms else "")
    lines.append(f"  mode {mode}: {r.played}/{len(s.items)} played in {r.wall_s:.1f} s wall{lag}"
                 + ("" if r.complete else "  ** INCOMPLETE **"))
    who = r.node_identity.describe() if r.node_identity else s.node.name
    lines.append(f"  node {who}, {s.node.source}: recorded {len(r.chunks)} chunks, {len(r.margins)} margins, "
                 f"{len(r.commands)} commands, {len(r.diagnostics)} diagnostics")
    interesting = {k: v for k, v in r.node_counters.items() if v and k not in ("ticks", "inferences_started", "chunks")}
    lines.append(f"  node counters (the session): ticks {r.node_counters.get('ticks', 0)}, inferences "
                 f"{r.node_counters.get('inferences_started', 0)}, chunks {r.node_counters.get('chunks', 0)}"
                 + "".join(f", {k} {v}" for k, v in sorted(interesting.items())))
    lines.append("  accounting (node inputs; played = " + " + ".join(CATEGORIES) + "):")
    w = max([len(t) for t in acc.per_topic] + [5])
    lines.append(f"    {'topic':<{w}}  played " + " ".join(f"{c:>10}" for c in CATEGORIES))
    for topic, row in sorted(acc.per_topic.items()):
        lines.append(f"    {topic:<{w}}  {row['played']:>6} " + " ".join(f"{row[c]:>10}" for c in CATEGORIES))
        for reason, n in sorted(acc.reasons.get(topic, {}).items()):
            lines.append(f"    {'':<{w}}    {n} {reason}")
    others = {t: m["count"] for t, m in s.topics.items() if m.get("role") in ("other", "clock", "excluded")}
    for t, n in sorted(others.items()):
        role = s.topics[t].get("role")
        what = {"other": "played, not a node input", "clock": "time source (replayed as /clock)",
                "excluded": "excluded, not played"}[role]
        if s.topics[t].get("unknown_type") and role == "other":
            what = f"not played: unknown message type {s.topics[t]['msgtype']}"
        lines.append(f"    {t:<{w}}  {n:>6}  {what}")
    lines.append(f"  snapshots: {acc.snapshots} (one per recorded chunk), {acc.verified} observation stamps verified"
                 + (f" ({acc.races} after resolving a delivery race: messages published before the "
                    "snapshot had not reached the node, or it had not taken them yet)" if acc.races else ""))
    chk = ", ".join(f"{k} {v['predicted']}/{v['node'] if v['node'] is not None else '?'}"
                    for k, v in acc.rejection_check.items() if v["predicted"] or v["node"])
    if chk:
        lines.append(f"  rejections predicted/counted by the node: {chk}")
    if r.events:
        lines.append(f"  events ({len(r.events)}):")
        t0 = min((i.log_ns for i in s.items), default=0)
        for e in r.events[:40]:
            at = f"t={(e.log_ns - t0) / NS_PER_S:8.3f}s " if e.log_ns is not None else " " * 13
            lines.append(f"    {at}{e.kind:<22} {e.topic + ': ' if e.topic else ''}{e.detail}")
        if len(r.events) > 40:
            lines.append(f"    ... {len(r.events) - 40} more (see /replay/events in the output bag)")
    else:
        lines.append("  events: none")
    lines.append("  accounting check: " + ("OK (every input message accounted for)" if acc.ok
                                          else "PROBLEMS: " + "; ".join(acc.problems)))
    if r.out_path:
        lines.append(f"  output bag: {r.out_path}")
    return "\n".join(lines)


def prepare_session(bag, info, *, remaps=None, topics=None, exclude=(), clock_source: str = "auto",
                    publish_undecodable: bool = False, log=print):
    """Scan the bag against the node's inputs and check it is worth replaying (ValueError if not);
    a bag recovered from a cut-short file is announced here."""
    session = check_playable(scan_bag(bag, info, remaps=remaps, exclude=exclude, only=topics,
                                      clock_source=clock_source, publish_undecodable=publish_undecodable))
    for e in session.events:
        if e.kind == "truncated_bag":
            log(f"replay: WARNING: {e.detail}")
    return session


def _scan_inputs(info) -> tuple:
    """What a scan's verdicts depend on: a session scanned for one node fits another with the same."""
    return info.cameras, info.state_topic, info.joint_names, info.instruction_topic


def run_replay(bag, *, out=None, options: Optional[ReplayOptions] = None, remaps=None, topics=None,
               exclude=(), clock_source: str = "auto", node_name: str = NODE_NAME, node_info=None,
               node_process=None, wait_node: float = 60.0, publish_undecodable: bool = False,
               log=print, session=None) -> ReplayResult:
    """Connect to the policy node, scan the bag against its parameters, replay, return the result.

    ``node_info``: the node's NodeInfo if known (asked from the live node unless it is ``node_process``'s);
    ``node_process``: a PolicyNodeProcess to watch (its death ends the replay; its reports are the judged ones); ``session``: the bag already scanned
    (``prepare_session``), rescanned only if the live node's inputs differ from the scan's."""
    options = options or ReplayOptions()
    alive = (lambda: node_process.alive) if node_process is not None else None
    with ReplayNode(node_name=node_name) as rn:
        if not rn.wait_for_node(wait_node, alive):
            why = "exited" if node_process is not None and not node_process.alive else f"not found within {wait_node:g} s"
            detail = ("\n" + node_process.output(last=30)) if node_process is not None else ""
            raise RuntimeError(f"policy node /{node_name} {why}{detail}")
        info = node_info
        # A node started here runs the parameters it was given; another one is asked (a launch file may have
        # set others), which another node of its name on the DDS domain could answer instead.
        queried = rn.node_info(timeout=10.0) if node_process is None or node_info is None else None
        if queried is not None:
            info = queried
        if info is None:
            raise RuntimeError(f"cannot read the parameters of /{node_name}; pass --params-file")
        if info.use_sim_time is False:
            raise RuntimeError(f"/{node_name} runs on the system clock: start it with -p use_sim_time:=true")
        if alive is None:
            alive = rn.node_present
        for _ in range(30):  # the graph may still be filling in
            checked, warnings = reconcile_with_graph(info, rn.node)
            if not warnings:
                break
            time.sleep(0.1)
        info = checked
        if session is None or _scan_inputs(session.node) != _scan_inputs(info):
            session = prepare_session(bag, info, remaps=remaps, topics=topics, exclude=exclude,
                                      clock_source=clock_source, publish_undecodable=publish_undecodable, log=log)
        session.node = info
        session.events[:0] = [Event("node_topics", w, source="replay") for w in warnings]
        if out is None:
            out = Path(str(Path(bag).resolve()) + "_replay_" + datetime.now().strftime("%Y%m%d_%H%M%S"))
        pid = getattr(getattr(node_process, "proc", None), "pid", None)
        return rn.play(session, out, options, alive=alive, log=log, node_pid=pid)


def main(argv: Optional[Sequence[str]] = None) -> int:
    previous = _stop_on_signals()
    try:
        return _main(argv)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _main(argv: Optional[Sequence[str]]) -> int:
    a = build_parser().parse_args(argv)
    a.remap = [r for item in a.remap for r in item.replace(",", " ").split()]
    a.out = a.out or None
    proc = None
    try:
        require_ros()
    except ImportError as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 1
    if not (Path(a.bag) / "metadata.yaml").is_file():
        print(f"replay: {a.bag} is not a rosbag2 folder (no metadata.yaml)", file=sys.stderr)
        return 1
    try:
        options = ReplayOptions(mode=a.mode, rate=a.rate, clock_hz=a.clock_hz, preroll=a.preroll, tail=a.tail,
                                settle=a.settle, out_storage=a.out_storage, record_inputs=a.record_inputs,
                                startup_timeout=a.wait_node)
        overrides = parse_param_args(a.param)
        remaps = parse_remaps(a.remap)
        info = session = None
        if a.start_node:
            overrides = with_replay_mode(a.params_file, overrides, a.mode == "stepped")
            info = node_info_for(a.params_file, overrides)
        elif a.params_file:
            info = NodeInfo.from_params_file(a.params_file, name=a.node, overrides=overrides)
        scan_args = dict(remaps=remaps, topics=a.topics, exclude=a.exclude, clock_source=a.clock_source,
                         publish_undecodable=a.publish_undecodable)
        log = lambda m: print(m, flush=True)  # noqa: E731
        if info is not None:  # the bag first: a bad one fails before any node starts
            session = prepare_session(a.bag, info, log=log, **scan_args)
        if a.start_node:
            print("replay: starting the policy node" + (f" (log: {a.node_log})" if a.node_log else ""), flush=True)
            proc = PolicyNodeProcess(a.params_file, overrides=overrides, log_path=a.node_log)
        result = run_replay(a.bag, out=a.out, options=options, node_name=a.node, node_info=info, node_process=proc,
                            wait_node=a.wait_node, log=log, session=session, **scan_args)
    except KeyboardInterrupt as exc:
        interrupted = 128 + getattr(exc, "signum", signal.SIGINT)
        result = getattr(exc, "result", None)   # set when the replay was playing: its output bag is finished
        print(f"replay: interrupted ({exc or 'SIGINT'})" + ("; the output bag keeps what was recorded"
                                                          if result is not None else ""), file=sys.stderr, flush=True)
        if result is None:
            return interrupted
    except Exception as exc:  # noqa: BLE001 - a CLI reports one clear line
        print(f"replay: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    else:
        interrupted = 0
    finally:
        if proc is not None:
            proc.stop()
    print(format_summary(result), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(result.summary(), indent=2, default=json_default))
    if a.report == "true" and result.out_path is not None:
        rep = make_report(result.out_path)
        print(f"report: {rep.index} — {rep.verdict_line}")
    if interrupted:
        return interrupted
    failures = strict_failures(result) if a.strict else []
    if failures:
        print("replay: --strict: " + "; ".join(failures), file=sys.stderr)
        return 2
    return 0


def strict_failures(r: ReplayResult) -> list:
    """Why a replay does not pass ``--strict`` (empty: it passes)."""
    out = []
    if not r.complete:
        out.append(f"incomplete: {r.played} of {len(r.session.items)} messages played")
    if not r.chunks:
        out.append("the node produced no action chunk")
    if not r.accounting.ok:
        out.append("accounting check failed: " + "; ".join(r.accounting.problems))
    return out


if __name__ == "__main__":
    sys.exit(main())
