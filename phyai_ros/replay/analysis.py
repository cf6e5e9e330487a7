"""The numbers of a report, from a bag of the node's outputs (``runbag.Run``): the session's margin
samples judged by the node's own rules, latency segments, the control-time roofline over the session,
command delivery, the node's health, chunk-boundary discontinuity and the counters.  Plain Python types
(``report.json`` writes them as they are); the verdict on them is ``verdict``'s, the plots ``figures``' and
the text ``render``'s.

The session is bag start to bag end: what the node did after the last message (the replay's tail) is
left out of every distribution (``session_mask``), as docs/design.md §5 says.  Each count is defined once
(design.md §4, §5) and computed here, so every text shows the same number: chunks and the counters are the
node's counter increases over the session, and the margin samples are the ControlMargins of the same span,
so the samples below zero are the deadline misses.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from phyai_ros.control.clock import NS_PER_S, ns_to_s
from phyai_ros.control.loop import COUNTERS, ControlConfig
from phyai_ros.control.margin import MarginReport, bound_label as margin_bound_label, margin_status
from phyai_ros.control.roofline import roofline_x, y_roof, y_sequential
from phyai_ros.diagnostics import NodeIdentity
from phyai_ros.replay.runbag import Run, match_chunks_and_margins

# (MarginReport field, segment name) of the five latency segments, in critical-path order
SEGMENTS = (("latency_observe", "observe"), ("latency_transfer", "transfer"), ("latency_queue", "queue"),
            ("latency_inference", "inference"), ("latency_actuate", "actuate"))
LEVEL_NAMES = {0: "OK", 1: "WARN", 2: "ERROR"}


def margin_rules(node: dict, target: float = math.nan) -> dict:
    """The node's margin-status parameters (``margin_status`` keywords) from the replay summary's node
    info; what it lacks (a bag recorded on a robot) takes the loop's defaults, eps the margins' target."""
    default = {f.name: f.default for f in dataclasses.fields(ControlConfig)}
    eps = node.get("eps", 1.0 - target if math.isfinite(target) else default["eps"])
    return {"eps": float(eps), "confidence": float(node.get("confidence", default["confidence"])),
            "min_samples": int(node.get("min_samples", default["min_samples"])),
            "error_p_threshold": float(node.get("error_probability", default["error_p_threshold"])),
            "error_consecutive_misses": int(node.get("error_consecutive_misses",
                                                     default["error_consecutive_misses"]))}


def _pct(a: np.ndarray, q) -> float:
    return float(np.percentile(a, q)) if a.size else math.nan


def margin_session(run: Run) -> Tuple[Dict[int, int], List[bool]]:
    """(chunk index -> its margin's index, per margin: is it the session's): how the numbers and the figures
    both split the margins (``session_mask``)."""
    pairs = match_chunks_and_margins(run.chunks, run.margins)
    return pairs, session_mask(run, pairs)


def analyze(run: Run, session: Optional[Tuple[Dict[int, int], List[bool]]] = None) -> dict:
    """All numbers the report shows (plain Python types); ``session``: ``margin_session(run)``, when the caller
    has it already (the report hands it to the figures too)."""
    s = run.summary or {}
    node = s.get("node", {})
    t0 = run.t0
    pairs, in_session = session if session is not None else margin_session(run)
    all_margins = [m for _, m in run.margins]
    margins = [m for m, keep in zip(all_margins, in_session) if keep]
    mt = np.array([(t - t0) / NS_PER_S for t, _ in run.margins])
    margin = margin_numbers(margins, node)
    counters = node_counters(run)
    # the counters when the node reported them, else (no /diagnostics recorded) what the session's outputs say
    counters.setdefault("chunks", session_chunks(run))
    counters.setdefault("deadline_misses", margin["n"] - margin["k"])
    counters.setdefault("expired_chunks", int(sum(m.expired for m in margins)))
    misses, expired = counters["deadline_misses"], counters["expired_chunks"]
    delivery = command_delivery(run)
    return {
        "bag": str(run.path), "input_bag": s.get("bag"), "mode": s.get("mode", "recorded"), "rate": s.get("rate"),
        "complete": s.get("complete"), "duration_s": float(mt[-1] - mt[0]) if mt.size > 1 else 0.0,
        # whose reports are judged (runbag: the summary's node, else the first policy node reporting in the bag)
        "node": run.node.describe() if run.node is not None else (
            NodeIdentity(node.get("name", "?")).describe() if node else None),
        "chunks": int(counters["chunks"]), "chunks_recorded": len(run.chunks),
        "chunks_after_bag_end": int((s.get("tail_counters") or {}).get("chunks", 0)),
        "margins": len(margins), "commands": delivery["n"],
        "margins_after_bag_end": int(len(all_margins) - len(margins)),
        "margin_sample_misses": margin["n"] - margin["k"],
        "model_id": run.chunks[-1][1].model_id if run.chunks else node.get("model_id", ""),
        "dt": ns_to_s(run.chunks[-1][1].dt_ns) if run.chunks else node.get("dt"),
        "horizon": run.chunks[-1][1].horizon if run.chunks else node.get("horizon"),
        "margin": margin,
        "latency_ms": latency_numbers(margins),
        "roofline": session_roofline(run, pairs, in_session, margins),
        "deadline_misses": int(misses), "expired_chunks": int(expired), "commands_delivery": delivery,
        "health": node_health(run), "counters": counters, "discontinuity": discontinuity(run, pairs),
        "accounting": s.get("accounting"), "events": run.events, "bad_output_messages": run.bad_messages,
        "foreign_reports": s.get("foreign_reports") or ({"other policy nodes": run.foreign_reports}
                                                        if run.foreign_reports else {}),
    }


def margin_numbers(margins: Sequence[MarginReport], node: dict) -> dict:
    """The session's control margin: P(M_ctrl >= 0) and its bound judged by the node's own rules
    (``margin_rules``), the margin and budget figures, and what the node itself said."""
    M = np.array([m.margin for m in margins], dtype=float)
    finite = np.isfinite(M)
    n, k = int(finite.sum()), int((M[finite] >= 0).sum())
    target = float(margins[-1].target) if margins and math.isfinite(margins[-1].target) else math.nan
    rules = margin_rules(node, target)
    confidence, target = rules["confidence"], 1.0 - rules["eps"]
    if n == 0:  # a whole session without one sample: the node's watchdog says ERROR too (design.md §3)
        p_hat = p_low = math.nan
        level, why = 2, "no margin samples: no chunk was adopted while another was executing, and none expired"
    else:  # the session's samples, judged by the node's own rules
        p_hat, p_low, level, why = margin_status(M[finite], **rules)
    budgets = np.array([m.budget for m in margins], float)
    node_level = (margins[-1].level, margins[-1].message) if margins else (None, "")
    return {"n": n, "k": k, "p_hat": p_hat, "p_lower": p_low, "target": target, "confidence": confidence,
            "bound_label": margin_bound_label(confidence), "negative_budgets": int(np.count_nonzero(budgets < 0)),
            "budget_min_ms": float(np.nanmin(budgets) * 1e3) if np.isfinite(budgets).any() else math.nan,
            "level": level, "level_name": LEVEL_NAMES[level], "why": why,
            "p50_ms": _pct(M[finite] * 1e3, 50), "p05_ms": _pct(M[finite] * 1e3, 5),
            "p01_ms": _pct(M[finite] * 1e3, 1), "min_ms": float(M[finite].min() * 1e3) if n else math.nan,
            "budget_p50_ms": _pct(budgets[finite] * 1e3, 50),
            "node_level": node_level[0], "node_message": node_level[1],
            "node_errors": sum(m.level == 2 for m in margins),
            "node_error_example": next((m.message for m in margins if m.level == 2), "")}


def latency_numbers(margins: Sequence[MarginReport]) -> Dict[str, dict]:
    """p50/p95/p99/max (ms) of each latency segment and of L_critical, their sum."""
    seg = {}
    for key, name in SEGMENTS:
        v = np.array([getattr(m, key) for m in margins], dtype=float) * 1e3
        v = v[np.isfinite(v)]
        seg[name] = {"p50": _pct(v, 50), "p95": _pct(v, 95), "p99": _pct(v, 99), "max": float(v.max()) if v.size else math.nan}
    crit = np.array([sum(getattr(m, key) for key, _ in SEGMENTS) for m in margins], dtype=float) * 1e3
    crit = crit[np.isfinite(crit)]
    seg["critical"] = {"p50": _pct(crit, 50), "p95": _pct(crit, 95), "p99": _pct(crit, 99),
                       "max": float(crit.max()) if crit.size else math.nan}
    return seg


def session_roofline(run: Run, pairs: Dict[int, int], in_session: List[bool],
                     margins: Sequence[MarginReport]) -> dict:
    """The control-time roofline over the whole session, from its chunk cycles (as the node does per window),
    with the node's own last window next to it."""
    # an expired chunk was never adopted: it starts no cycle
    adopted = sorted((run.margins[j][0], i, j) for i, j in pairs.items() if in_session[j]
                     and not run.margins[j][1].expired)
    env = ctl = inf = 0.0
    cycles = 0
    for (ta, ia, ja), (tb, ib, jb) in zip(adopted, adopted[1:]):
        prev = run.chunks[ia][1]
        a_prev = run.margins[ja][1].stamp_ns
        a_next = run.margins[jb][1].stamp_ns
        if a_next <= a_prev:
            continue  # a clock reset lies between them
        end_prev = prev.end_ns
        env += max(0, min(a_next, end_prev) - a_prev) / NS_PER_S
        ctl += (a_next - a_prev) / NS_PER_S
        inf += max(0.0, run.chunks[ib][1].inference_latency)
        cycles += 1
    X = roofline_x(env, inf)
    Y = env / ctl if ctl > 0 else math.nan
    last_window = next(((m.roofline_x, m.roofline_y, m.window_size) for m in reversed(margins)
                        if not math.isnan(m.roofline_x)), (math.nan, math.nan, 0))
    return {"X": X, "Y": Y, "Y_seq": y_sequential(X), "Y_roof": y_roof(X), "cycles": cycles,
            "bound": roofline_placement(X), "env_s": env, "control_s": ctl, "inference_s": inf,
            "node_window_X": last_window[0], "node_window_Y": last_window[1], "node_window_n": last_window[2]}


def roofline_placement(x: float) -> str:
    """Where X places the run (within 10 % of 1: balanced)."""
    if math.isnan(x):
        return "undetermined"
    if x > 1.1:
        return "environment-bound"
    if x < 0.9:
        return "inference-bound"
    return "balanced"


def node_counters(run: Run) -> Dict[str, int]:
    """The node's counter increments over the session: the replay summary's, else (a robot recording) the
    difference between its first and last /diagnostics report."""
    counters: Dict[str, int] = {}
    if run.diagnostics:
        first, last = run.diagnostics[0][1]["counters"], run.diagnostics[-1][1]["counters"]
        counters = {k2: last.get(k2, 0) - first.get(k2, 0) for k2 in last if k2 in COUNTERS}
    replayed = (run.summary or {}).get("node_counters")
    if replayed:
        counters = dict(replayed)
    return counters


def session_chunks(run: Run) -> int:
    """The chunks the node delivered in the session, from its outputs: the replay summary's seq span, else all."""
    span = (run.summary or {}).get("session_chunk_seqs")
    if span is None:
        return len(run.chunks)
    return sum(span[0] <= c.seq < span[1] for _, c in run.chunks)


def _session_commands(run: Run) -> tuple:
    """([(command, t)] of the commands the node published in the session (bag start to bag end), session start,
    session end), t on the timeline commands are judged on: when they were received (the output bag's time) in
    real time; in a stepped replay the slot they are for, in simulated time (when the replay received them
    depends on this machine)."""
    s = run.summary or {}
    if s.get("mode") == "stepped":
        times, start, end = [slot for _, slot, _ in run.commands], s.get("session_start_ns"), s.get("session_end_ns")
    else:
        times, start, end = [t for t, _, _ in run.commands], s.get("session_start_bag_ns"), s.get("session_end_bag_ns")
    inside = [(c, t) for c, t in zip(run.commands, times) if t is None or ((start is None or t >= start)
                                                                          and (end is None or t <= end))]
    return inside, start, end


def command_delivery(run: Run) -> dict:
    """Command delivery: the session's commands (``n``), the delay (tick time - slot time) p50/p99/max as the
    node measured it (/diagnostics), and from the recorded commands (stamp = the slot it is for, bag time =
    when it was received) the slots with no command between consecutive ones (missed slots
    and deadline-policy 'stop' slots alike) and the longest silence in the session (``_session_commands``)."""
    session, start, end = _session_commands(run)
    out = {"n": len(session), "delay_p50_ms": math.nan, "delay_p99_ms": math.nan, "delay_max_ms": math.nan,
           "gap_slots": 0, "longest_silence_s": math.nan}
    dt_ns = run.chunks[-1][1].dt_ns if run.chunks else None
    values = next((d["margin_values"] for _, d in reversed(run.diagnostics) if "command_delay_p50_s" in
                   d.get("margin_values", {})), None)
    if values:
        out.update({f"delay_{q}_ms": float(values[f"command_delay_{q}_s"]) * 1e3 for q in ("p50", "p99", "max")})
    slots = np.array(sorted(slot for (_, slot, _), _ in session if slot is not None), np.int64)
    if dt_ns and len(slots) > 1:
        steps = np.round(np.diff(slots) / dt_ns).astype(int)
        out["gap_slots"] = int(np.clip(steps - 1, 0, None).sum())
    times = ([start] if start is not None else []) + sorted(t for _, t in session if t is not None)
    if end is not None and times and end > times[-1]:
        times.append(end)
    if len(times) > 1:
        out["longest_silence_s"] = float(np.diff(np.array(sorted(times), float)).max() / NS_PER_S)
    return out


def node_health(run: Run) -> dict:
    """The node's own margin status on /diagnostics (its watchdog: ERROR on silence) during the
    session: the replay's preroll (no input yet) and tail (inputs aged out) are not its doing."""
    start = (run.summary or {}).get("session_start_bag_ns")
    end = (run.summary or {}).get("session_end_bag_ns")
    diags = [d for t, d in run.diagnostics if "margin_level" in d and (start is None or t >= start)
             and (end is None or t <= end)]
    worst = max(reversed(diags), key=lambda d: d["margin_level"], default=None)  # the latest of the worst
    return {"worst_level": worst["margin_level"] if worst else None, "worst_message": worst["margin_message"] if worst
            else "", "errors": sum(d["margin_level"] == 2 for d in diags), "reports": len(diags)}


def session_mask(run: Run, pairs: Dict[int, int]) -> List[bool]:
    """Per margin: is it the session's?  A replay's summary says which ControlMargins the session's counters
    span (``session_margin_seqs``: chunk_seq from..to); a robot recording's counters run from its first to its
    last /diagnostics report, and so do its margins (by stamp); an older replay summary without the span:
    the margins whose chunk's snapshot came before the bag ended.  (A replay's tail, after the last
    message, is not the session's doing.)"""
    summary = run.summary or {}
    if "session_margin_seqs" in summary:
        span = summary["session_margin_seqs"]
        return [span is not None and span[0] <= m.chunk_seq <= span[1] for _, m in run.margins]
    if run.summary is None:
        if len(run.diagnostics) < 2:
            return [True] * len(run.margins)
        lo, hi = run.diagnostics[0][1]["stamp_ns"], run.diagnostics[-1][1]["stamp_ns"]
        return [lo < m.stamp_ns <= hi for _, m in run.margins]
    end = summary.get("session_end_bag_ns")
    keep = [True] * len(run.margins)
    if end is None:
        return keep
    for i, j in pairs.items():
        t_chunk, m = run.chunks[i][0], run.margins[j][1]
        # the chunk was recorded (bag timeline) when it arrived; its snapshot came queue + inference +
        # actuate earlier
        back = m.latency_queue + m.latency_inference + m.latency_actuate
        taken = t_chunk - (back * NS_PER_S if math.isfinite(back) else 0)
        if taken > end:
            keep[j] = False
    return keep


def discontinuity(run: Run, pairs: Dict[int, int]) -> dict:
    """Per chunk boundary: the command step at the switch and the seam |new - old| at that slot,
    against the typical step between consecutive commands."""
    cmds = {st: a for _, st, a in run.commands if st is not None}
    if not cmds or len(run.chunks) < 2:
        return {"boundaries": [], "median_step": math.nan, "p99_step": math.nan}
    slots = sorted(cmds)
    dt_ns = run.chunks[0][1].dt_ns
    steps = {b: float(np.max(np.abs(cmds[b] - cmds[a]))) for a, b in zip(slots, slots[1:])
             if b - a == dt_ns and cmds[a].shape == cmds[b].shape}
    out = []
    adopted = sorted((run.margins[j][0], i, j) for i, j in pairs.items() if not run.margins[j][1].expired)
    switch_slots = set()
    for (_, ia, ja), (_, ib, jb) in zip(adopted, adopted[1:]):
        old, new = run.chunks[ia][1], run.chunks[ib][1]
        a = run.margins[jb][1].stamp_ns
        dt = new.dt_ns
        i = int(round((a - new.t0_ns) / dt))
        if i < 0 or i >= new.horizon:
            continue
        slot = new.t0_ns + i * dt
        j = min(int(round((slot - old.t0_ns) / dt)), old.horizon - 1)
        seam = float(np.max(np.abs(new.actions[i] - old.actions[j]))) if j >= 0 else math.nan
        jump = steps.get(slot, math.nan)
        switch_slots.add(slot)
        out.append({"t": (a - run.t0) / NS_PER_S, "seq": new.seq, "index": i, "frozen_prefix": new.d,
                    "jump": jump, "seam": seam})
    normal = np.array([v for k, v in steps.items() if k not in switch_slots])
    return {"boundaries": out, "median_step": _pct(normal, 50), "p99_step": _pct(normal, 99),
            "max_jump": float(np.nanmax([b["jump"] for b in out])) if out and not all(
                math.isnan(b["jump"]) for b in out) else math.nan}


__all__ = ["SEGMENTS", "LEVEL_NAMES", "analyze", "margin_rules", "margin_numbers", "latency_numbers",
           "session_roofline", "roofline_placement", "node_counters", "session_chunks",
           "command_delivery", "node_health", "margin_session", "session_mask",
           "discontinuity"]
