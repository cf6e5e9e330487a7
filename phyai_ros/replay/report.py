"""``report``: turn a bag of the policy node's outputs into a report a person reads in a minute.

    report OUT_BAG [-o DIR] [--format html md]

Writes ``report.html`` (self-contained: plots embedded), ``report.md`` + the PNG plots and
``report.json`` (the numbers) into DIR (default ``OUT_BAG/report``) and prints where.  The
first screen is the verdict: inference-bound or environment-bound (control-time roofline
X), whether the control margin meets its budget (P(M_ctrl >= 0) with its lower confidence
bound against 1 - eps), deadline misses, and whether every input message was accounted for.
Then: latency segments over time and as histograms, the margin distribution, the roofline
with this run's point, chunk-boundary discontinuity, deadline misses and input problems
over time, the accounting table and every event.

Works on ``replay`` output bags and on bags recorded on a robot (``ros2 bag record`` of
action_chunk, control_margin, command, /diagnostics): then there is no accounting section.
"""
from __future__ import annotations

import argparse
import base64
import dataclasses
import html
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from phyai_ros.control.clock import NS_PER_S, ns_to_s
from phyai_ros.control.loop import ControlConfig
from phyai_ros.control.margin import bound_label as margin_bound_label, margin_status
from phyai_ros.replay.runbag import NotAnOutputBag, Run, load_run, match_chunks_and_margins, require_node_outputs

SEGMENTS = (("latency_observe", "observe"), ("latency_transfer", "transfer"), ("latency_queue", "queue"),
            ("latency_inference", "inference"), ("latency_actuate", "actuate"))
SEG_COLORS = ("#8fb3d9", "#b5d99c", "#f2d17c", "#e8845c", "#b48ec9")
LEVEL_NAMES = {0: "OK", 1: "WARN", 2: "ERROR"}
LEVEL_COLORS = {0: "#2e7d32", 1: "#ef8f00", 2: "#c62828"}
# Node counters shown as problems, named as in docs/design.md ("Vocabulary").
PROBLEM_COUNTERS = ("deadline_misses", "expired_chunks", "run_outs", "missed_slots", "stale_snapshots", "late_chunks",
                    "bad_image", "bad_state",
                    "missing_joint", "out_of_order", "future_stamp", "clock_jumps", "inference_errors", "bad_chunks",
                    "discarded_after_reset", "callback_errors", "worker_crashes")


@dataclass
class ReportResult:
    out_dir: Path
    index: Optional[Path]         # report.html (or report.md if only markdown)
    markdown: Optional[Path]
    figures: Dict[str, Path]
    numbers: dict
    verdict_line: str = ""


# ============================================================================ analysis
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


def analyze(run: Run) -> dict:
    """All numbers the report shows (plain Python types)."""
    s = run.summary or {}
    node = s.get("node", {})
    t0 = run.t0
    pairs = match_chunks_and_margins(run.chunks, run.margins)
    in_session = session_mask(run, pairs)
    all_margins = [m for _, m in run.margins]
    margins = [m for m, keep in zip(all_margins, in_session) if keep]
    mt = np.array([(t - t0) / NS_PER_S for t, _ in run.margins])
    M = np.array([m.margin for m in margins], dtype=float)
    finite = np.isfinite(M)
    n, k = int(finite.sum()), int((M[finite] >= 0).sum())
    target = float(margins[-1].target) if margins and math.isfinite(margins[-1].target) else math.nan
    rules = margin_rules(node, target)
    confidence, target = rules["confidence"], 1.0 - rules["eps"]
    bound_label = margin_bound_label(confidence)
    if n == 0:  # a whole session without one sample: the node's watchdog says ERROR too (design.md §3)
        p_hat = p_low = math.nan
        level, why = 2, "no margin samples: no chunk was adopted while another was executing, and none expired"
    else:  # the session's samples, judged by the node's own rules
        p_hat, p_low, level, why = margin_status(M[finite], **rules)

    seg = {}
    for key, name in SEGMENTS:
        v = np.array([getattr(m, key) for m in margins], dtype=float) * 1e3
        v = v[np.isfinite(v)]
        seg[name] = {"p50": _pct(v, 50), "p95": _pct(v, 95), "p99": _pct(v, 99), "max": float(v.max()) if v.size else math.nan}
    crit = np.array([sum(getattr(m, key) for key, _ in SEGMENTS) for m in margins], dtype=float) * 1e3
    crit = crit[np.isfinite(crit)]
    seg["critical"] = {"p50": _pct(crit, 50), "p95": _pct(crit, 95), "p99": _pct(crit, 99),
                       "max": float(crit.max()) if crit.size else math.nan}

    # roofline over the whole session, from chunk cycles (as the node does per window)
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
    X = env / inf if inf > 0 else (math.inf if env > 0 else math.nan)
    Y = env / ctl if ctl > 0 else math.nan
    last_window = next(((m.roofline_x, m.roofline_y, m.window_size) for m in reversed(margins)
                        if not math.isnan(m.roofline_x)), (math.nan, math.nan, 0))
    if math.isnan(X):
        bound = "undetermined"
    elif X > 1.1:
        bound = "environment-bound"
    elif X < 0.9:
        bound = "inference-bound"
    else:
        bound = "balanced"

    # node counters over the run
    counters: Dict[str, int] = {}
    if run.diagnostics:
        first, last = run.diagnostics[0][1]["counters"], run.diagnostics[-1][1]["counters"]
        counters = {k2: last.get(k2, 0) - first.get(k2, 0) for k2 in last}
    if s.get("node_counters"):
        counters = dict(s["node_counters"])
    misses = counters.get("deadline_misses", int((M[finite] < 0).sum()))
    expired = counters.get("expired_chunks", int(sum(m.expired for m in margins)))
    budgets = np.array([m.budget for m in margins], float)
    commands = command_delivery(run)
    health = node_health(run)

    disc = discontinuity(run, pairs)
    node_level = (margins[-1].level, margins[-1].message) if margins else (None, "")
    acc = s.get("accounting")
    mode = s.get("mode", "recorded")
    return {
        "bag": str(run.path), "input_bag": s.get("bag"), "mode": mode, "rate": s.get("rate"),
        "complete": s.get("complete"), "duration_s": float(mt[-1] - mt[0]) if mt.size > 1 else 0.0,
        "chunks": len(run.chunks), "margins": len(margins), "commands": len(run.commands),
        "margins_after_bag_end": int(len(all_margins) - len(margins)),
        "model_id": run.chunks[-1][1].model_id if run.chunks else node.get("model_id", ""),
        "dt": ns_to_s(run.chunks[-1][1].dt_ns) if run.chunks else node.get("dt"),
        "horizon": run.chunks[-1][1].horizon if run.chunks else node.get("horizon"),
        "margin": {"n": n, "k": k, "p_hat": p_hat, "p_lower": p_low, "target": target, "confidence": confidence,
                   "bound_label": bound_label, "negative_budgets": int(np.count_nonzero(budgets < 0)),
                   "budget_min_ms": float(np.nanmin(budgets) * 1e3) if np.isfinite(budgets).any() else math.nan,
                   "level": level, "level_name": LEVEL_NAMES[level], "why": why,
                   "p50_ms": _pct(M[finite] * 1e3, 50), "p05_ms": _pct(M[finite] * 1e3, 5),
                   "p01_ms": _pct(M[finite] * 1e3, 1), "min_ms": float(M[finite].min() * 1e3) if n else math.nan,
                   "budget_p50_ms": _pct(np.array([m.budget for m in margins], float)[finite] * 1e3, 50),
                   "node_level": node_level[0], "node_message": node_level[1],
                   "node_errors": sum(m.level == 2 for m in margins),
                   "node_error_example": next((m.message for m in margins if m.level == 2), "")},
        "latency_ms": seg,
        "roofline": {"X": X, "Y": Y, "Y_seq": X / (1 + X) if math.isfinite(X) else (1.0 if X == math.inf else math.nan),
                     "Y_roof": min(X, 1.0) if not math.isnan(X) else math.nan, "cycles": cycles, "bound": bound,
                     "env_s": env, "control_s": ctl, "inference_s": inf,
                     "node_window_X": last_window[0], "node_window_Y": last_window[1],
                     "node_window_n": last_window[2]},
        "deadline_misses": int(misses), "expired_chunks": int(expired), "commands_delivery": commands,
        "health": health, "counters": counters, "discontinuity": disc,
        "accounting": acc, "events": run.events, "bad_output_messages": run.bad_messages,
    }


def command_delivery(run: Run) -> dict:
    """Command delivery: the delay (tick time - slot time) p50/p99/max as the node measured
    it (/diagnostics), and from the recorded commands (stamp = the slot it is for, bag time =
    when it was received) the slots with no command between consecutive ones (missed slots
    and deadline-policy 'stop' slots alike) and the longest silence in the session."""
    cmds = [(t, slot) for t, slot, _ in run.commands if slot is not None]
    out = {"n": len(cmds), "delay_p50_ms": math.nan, "delay_p99_ms": math.nan, "delay_max_ms": math.nan,
           "gap_slots": 0, "longest_silence_s": math.nan}
    dt_ns = run.chunks[-1][1].dt_ns if run.chunks else None
    values = next((d["margin_values"] for _, d in reversed(run.diagnostics) if "command_delay_p50_s" in
                   d.get("margin_values", {})), None)
    if values:
        out.update({f"delay_{q}_ms": float(values[f"command_delay_{q}_s"]) * 1e3 for q in ("p50", "p99", "max")})
    if cmds:
        slots = np.array(sorted(slot for _, slot in cmds), np.int64)
        if dt_ns and len(slots) > 1:
            steps = np.round(np.diff(slots) / dt_ns).astype(int)
            out["gap_slots"] = int(np.clip(steps - 1, 0, None).sum())
    start = (run.summary or {}).get("session_start_bag_ns")
    times = ([start] if start is not None else []) + [t for t, _ in cmds]
    end = (run.summary or {}).get("session_end_bag_ns")
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
    """Per margin: was its chunk's snapshot taken before the bag ended?  (A replay's tail, after the
    last message, is not the session's doing.)  All True without a replay summary."""
    end = (run.summary or {}).get("session_end_bag_ns")
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


# ============================================================================ figures
@dataclass
class _Plot:
    """What every figure of the report draws from, and where it goes."""

    run: Run
    num: dict
    out: Path
    plt: object
    figs: Dict[str, Path]

    def __post_init__(self) -> None:
        run = self.run
        self.t0 = run.t0
        self.margins = [m for _, m in run.margins]
        self.mt = np.array([(t - self.t0) / NS_PER_S for t, _ in run.margins])
        self.s_end = (run.summary or {}).get("session_end_bag_ns")
        # per margin: in the session (distributions show the session's chunks only); M_ctrl in ms
        self.keep = np.array(session_mask(run, match_chunks_and_margins(run.chunks, run.margins)), bool)
        self.M = np.array([m.margin for m in self.margins], float) * 1e3
        self.fin = np.isfinite(self.M)

    def bag_end(self, ax) -> None:
        """Mark where the bag ends (after it: the replay's tail)."""
        if self.s_end is not None:
            x = (self.s_end - self.t0) / NS_PER_S
            ax.axvline(x, color="#555", ls="--", lw=1)
            ax.text(x, 0.98, " bag ends", transform=ax.get_xaxis_transform(), va="top", fontsize=8)

    def save(self, fig, name: str) -> None:
        path = self.out / f"{name}.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        self.plt.close(fig)
        self.figs[name] = path


def _figures(run: Run, num: dict, out: Path) -> Dict[str, Path]:
    """Every figure of the report, one function each; name -> PNG path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
                         "axes.spines.right": False})
    p = _Plot(run, num, out, plt, {})
    for figure in (_figure_roofline, _figure_margin, _figure_latency_time, _figure_latency_hist,
                   _figure_discontinuity, _figure_problems, _figure_accounting):
        figure(p)
    return p.figs


def _figure_roofline(p: _Plot) -> None:
    """The control-time roofline: the run's (X, Y) against Y_seq and Y_roof, the node's window per chunk."""
    num, plt, margins = p.num, p.plt, p.margins
    r = num["roofline"]
    fig, ax = plt.subplots(figsize=(5.2, 3.9))
    xs = np.logspace(-2, 2.5, 300)
    ax.plot(xs, xs / (1 + xs), color="#555", lw=1.5, label="Y_seq = X/(1+X)  (no overlap)")
    ax.plot(xs, np.minimum(xs, 1), color="#1f77b4", lw=2, label="Y_roof = min(X, 1)  (perfect overlap)")
    ax.axvspan(1e-2, 1, color="#e8845c", alpha=0.08)
    ax.axvspan(1, 10 ** 2.5, color="#8fb3d9", alpha=0.10)
    ax.text(0.012, 1.07, "inference-bound", color="#b0502c", fontsize=8)
    ax.text(1.3, 1.07, "environment-bound", color="#2f5f8f", fontsize=8)
    wx = np.array([m.roofline_x for m in margins], float)
    wy = np.array([m.roofline_y for m in margins], float)
    ok = np.isfinite(wx) & np.isfinite(wy) & (wx > 0)
    if ok.any():
        ax.plot(np.clip(wx[ok], 1e-2, 10 ** 2.5), wy[ok], ".", color="#999", ms=3, alpha=0.6,
                label="node's sliding window, per chunk")
    X, Y = r["X"], r["Y"]
    if not math.isnan(X) and not math.isnan(Y):
        xp = min(max(X, 1e-2), 10 ** 2.4)
        ax.plot([xp], [Y], "o", color="#c62828", ms=10, label=f"this run: X = {_fmt(X)}, Y = {Y:.3f}")
        if X > 10 ** 2.4:
            ax.annotate("X off scale (inference takes ~0 replay time)", (xp, Y), (0.05, 0.55),
                        textcoords="axes fraction", fontsize=8, arrowprops=dict(arrowstyle="->", color="#c62828"))
    ax.set_xscale("log")
    ax.set_xlim(1e-2, 10 ** 2.5)
    ax.set_ylim(0, 1.15)
    ax.set_xlabel("X = L_env / L_inference")
    ax.set_ylabel("Y = L_env / L_control")
    ax.set_title("Control-time roofline")
    ax.legend(loc="lower right", fontsize=7)
    p.save(fig, "roofline")


def _figure_margin(p: _Plot) -> None:
    """Margin distribution and P(M >= 0) over time (distributions: the session's chunks only)."""
    num, plt, margins, mt, keep, M, fin = p.num, p.plt, p.margins, p.mt, p.keep, p.M, p.fin
    hfin = fin & keep
    mg = num["margin"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [1.1, 1]})
    if hfin.any():
        bins = min(40, max(8, int(hfin.sum() // 2)))
        a1.hist(M[hfin][M[hfin] >= 0], bins=bins, color="#2e7d32", alpha=0.8, label="M_ctrl >= 0")
        if (M[hfin] < 0).any():
            a1.hist(M[hfin][M[hfin] < 0], bins=max(4, bins // 3), color="#c62828", alpha=0.85,
                    label="M_ctrl < 0 (miss)")
        a1.axvline(0, color="k", lw=1)
        a1.legend(fontsize=8, loc="upper right")
    a1.set_xlabel("M_ctrl = B_ctrl - (L_inference + L_noninf)  [ms]")
    a1.set_ylabel("chunks")
    a1.set_title("Margin distribution (one sample per chunk)")
    a1.text(0.02, 0.97, f"P(M>=0) = {_fmt(mg['p_hat'], 3)} over {mg['n']} chunks\nlower bound {_fmt(mg['p_lower'], 3)} "
            f"({mg['bound_label']})\ntarget 1 - eps = {mg['target']:.3f}", transform=a1.transAxes,
            va="top", fontsize=8, bbox=dict(boxstyle="round", fc="white", ec="#bbb"))
    pn = np.array([m.p_nonnegative for m in margins], float)
    pl = np.array([m.p_nonnegative_lower for m in margins], float)
    a2.plot(mt, pn, color="#2e7d32", label="P-hat(M>=0), node window")
    a2.plot(mt, pl, color="#1b5e20", ls="--", label=f"lower bound ({mg['bound_label']})")
    a2.axhline(mg["target"], color="#c62828", lw=1, label=f"target 1 - eps = {mg['target']:.3f}")
    a2.set_ylim(-0.02, 1.05)
    a2.set_xlabel("bag time [s]")
    a2.set_title("P(M>=0) over time (node's sliding window)")
    p.bag_end(a2)
    a2.legend(fontsize=7, loc="lower right")
    p.save(fig, "margin")


def _figure_latency_time(p: _Plot) -> None:
    """Latency segments per chunk (stacked), with B_ctrl and M_ctrl below."""
    plt, margins, mt, M, fin = p.plt, p.margins, p.mt, p.M, p.fin
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 5.2), sharex=True, gridspec_kw={"height_ratios": [1.3, 1]})
    if margins:
        vals = np.array([[getattr(m, key) for key, _ in SEGMENTS] for m in margins], float) * 1e3
        vals = np.nan_to_num(vals, nan=0.0)
        a1.stackplot(mt, vals.T, labels=[n for _, n in SEGMENTS], colors=SEG_COLORS, alpha=0.9, step="mid")
        a1.legend(loc="upper left", fontsize=7, ncol=5)
        B = np.array([m.budget for m in margins], float) * 1e3
        a2.plot(mt, B, color="#555", lw=1, label="B_ctrl (budget)")
        a2.plot(mt[fin], M[fin], ".-", color="#2e7d32", lw=0.8, ms=3, label="M_ctrl")
        neg = fin & (M < 0)
        if neg.any():
            a2.plot(mt[neg], M[neg], "o", color="#c62828", ms=5, label="miss (M < 0)")
        a2.axhline(0, color="k", lw=0.8)
        a2.legend(loc="upper left", fontsize=7, ncol=3)
    a1.set_ylabel("latency [ms]")
    a1.set_title("Latency segments per chunk (stacked: L_critical)")
    p.bag_end(a1)
    p.bag_end(a2)
    a2.set_ylabel("[ms]")
    a2.set_xlabel("bag time [s]")
    p.save(fig, "latency_time")


def _figure_latency_hist(p: _Plot) -> None:
    """Latency segment histograms of the session's chunks."""
    num, plt, margins, keep = p.num, p.plt, p.margins, p.keep
    fig, axes = plt.subplots(1, 6, figsize=(12, 2.6))
    for ax, (key, name), color in zip(axes, list(SEGMENTS) + [("critical", "critical")], list(SEG_COLORS) + ["#777"]):
        if key == "critical":
            v = np.array([sum(getattr(m, k2) for k2, _ in SEGMENTS) for m in margins], float) * 1e3
        else:
            v = np.array([getattr(m, key) for m in margins], float) * 1e3
        v = v[keep]
        v = v[np.isfinite(v)]
        if v.size:
            ax.hist(v, bins=min(30, max(5, v.size // 2)), color=color)
            ax.axvline(np.percentile(v, 99), color="k", ls=":", lw=1)
        st = num["latency_ms"][name]
        ax.set_title(f"{name}\np50 {_fmt(st['p50'], 1)}  p99 {_fmt(st['p99'], 1)} ms", fontsize=8)
        ax.set_xlabel("ms", fontsize=8)
    axes[0].set_ylabel("chunks")
    fig.suptitle("Latency segment histograms (dotted: p99)", fontsize=9, y=1.08)
    p.save(fig, "latency_hist")


def _figure_discontinuity(p: _Plot) -> None:
    """Commands across chunk boundaries (zoomed), and every boundary's seam and step."""
    run, num, plt, t0 = p.run, p.num, p.plt, p.t0
    disc = num["discontinuity"]
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 5.8), gridspec_kw={"height_ratios": [1.3, 1]})
    fig.subplots_adjust(hspace=0.45)
    cmds = [(st, a) for _, st, a in run.commands if st is not None]
    bounds = disc["boundaries"]
    if cmds:
        ct = np.array([(st - t0) / NS_PER_S for st, _ in cmds])
        cv = np.array([a[0] for _, a in cmds])
        # zoom on three chunk boundaries in the middle of the run (all of them would be unreadable)
        if len(bounds) >= 4:
            mid = len(bounds) // 2
            lo, hi = bounds[mid - 1]["t"], bounds[mid + 1]["t"]
            pad = 0.25 * (hi - lo)
            lo, hi = lo - pad, hi + pad
        else:
            lo, hi = float(ct.min()), float(ct.max())
        sel = (ct >= lo) & (ct <= hi)
        for _, c in run.chunks:
            ts = (c.t0_ns - t0) / NS_PER_S + np.arange(c.horizon) * ns_to_s(c.dt_ns)
            if ts[-1] >= lo and ts[0] <= hi:
                a1.plot(ts, c.actions[:, 0], color="#1f77b4", lw=0.8, alpha=0.45)
        a1.plot(ct[sel], cv[sel], ".-", color="k", lw=1.2, ms=3, label="command sent")
        for b in bounds:
            if lo <= b["t"] <= hi:
                a1.axvline(b["t"], color="#e8845c", lw=1.2, alpha=0.8)
        a1.set_xlim(lo, hi)
        a1.plot([], [], color="#1f77b4", lw=0.8, label="chunk predictions")
        a1.plot([], [], color="#e8845c", lw=1.2, label="chunk switch")
        a1.legend(fontsize=7, loc="upper right")
    a1.set_title("Commands across chunk boundaries (first action dimension; zoom on three boundaries)")
    a1.set_xlabel("bag time [s]")
    a1.set_ylabel(run.chunks[0][1].action_names[0] if run.chunks and run.chunks[0][1].action_names else "action 0")
    if disc["boundaries"]:
        bt = np.array([b["t"] for b in disc["boundaries"]])
        a2.bar(bt, [b["seam"] for b in disc["boundaries"]], width=max(0.05, 0.4 * (num["dt"] or 0.05)) * 3,
               color="#e8845c", alpha=0.7, label="seam |new - old| at the switch slot")
        a2.plot(bt, [b["jump"] for b in disc["boundaries"]], "o", color="k", ms=4, label="command step at the switch")
        if not math.isnan(disc["median_step"]):
            a2.axhline(disc["median_step"], color="#2e7d32", lw=1, label="median step within a chunk")
            a2.axhline(disc["p99_step"], color="#2e7d32", lw=1, ls="--", label="p99 step within a chunk")
        a2.legend(fontsize=7, ncol=2)
    a2.set_ylabel("max |delta| over dims")
    a2.set_title("Every boundary: step at the switch vs steps within a chunk")
    a2.set_xlabel("bag time [s]")
    p.save(fig, "discontinuity")


def _figure_problems(p: _Plot) -> None:
    """Deadline misses and input problems over time."""
    run, num, plt, t0 = p.run, p.num, p.plt, p.t0
    fig, ax = plt.subplots(figsize=(10, 3.0))
    if run.diagnostics:
        s_start = (run.summary or {}).get("session_start_bag_ns")
        # counted from the session's start (the last report before the first message), as the text counts
        base = next((d for t, d in reversed(run.diagnostics) if s_start is not None and t <= s_start),
                    run.diagnostics[0][1])["counters"]
        shown = [(t, d) for t, d in run.diagnostics if s_start is None or t >= s_start]
        dtm = np.array([(t - t0) / NS_PER_S for t, _ in shown])
        if s_start is not None:
            ax.axvline((s_start - t0) / NS_PER_S, color="#555", ls=":", lw=1)
        p.bag_end(ax)
        drawn = False
        for key in PROBLEM_COUNTERS:
            v = np.array([d["counters"].get(key, 0) - base.get(key, 0) for _, d in shown])
            if v.size and v[-1] > 0:
                session = num["counters"].get(key, v[-1])  # the number the text gives: bag start to bag end
                ax.step(dtm, v, where="post", label=f"{key} ({session} in the session)",
                        lw=1.5 if key == "deadline_misses" else 1)
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "no deadline misses, no input problems", transform=ax.transAxes, ha="center",
                    color="#2e7d32", fontsize=11)
        else:
            ax.legend(fontsize=7, ncol=3, loc="upper left")
    ax.set_title("Deadline misses and input problems (node counters from the dotted session start; after the "
                 "dashed bag end: the replay's tail, not counted)", fontsize=10)
    ax.set_xlabel("bag time [s]")
    p.save(fig, "problems")


def _figure_accounting(p: _Plot) -> None:
    """What became of every input message, per topic (replays only)."""
    num, plt = p.num, p.plt
    acc = num.get("accounting")
    if acc and acc.get("per_topic"):
        from phyai_ros.replay.accounting import CATEGORIES
        rows = sorted(acc["per_topic"].items())
        colors = {"used": "#2e7d32", "superseded": "#9e9e9e", "stale": "#ef8f00", "rejected": "#c62828",
                  "not_played": "#5d4037"}
        fig, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * len(rows)))
        left = np.zeros(len(rows))
        for c in CATEGORIES:
            v = np.array([row[c] / max(row["played"], 1) for _, row in rows])
            if v.any():
                ax.barh([t for t, _ in rows], v, left=left, color=colors[c], label=c)
            left += v
        for i, (_, row) in enumerate(rows):
            ax.text(1.01, i, f"{row['played']} msgs, {row['used']} used", va="center", fontsize=8)
        ax.set_xlim(0, 1.25)
        ax.set_xlabel("fraction of played messages")
        ax.legend(fontsize=7, ncol=5, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
        ax.set_title("What became of every input message", pad=18)
        p.save(fig, "accounting")


def _fmt(v, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    if isinstance(v, float) and abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.{digits}f}"


# ============================================================================ text
def verdict(num: dict) -> dict:
    """Headline, level and the facts under it.  The text follows the data: misses and
    silence lead; the roofline is said as measured, with what contradicts it."""
    r, mg, acc = num["roofline"], num["margin"], num.get("accounting")
    lat, cmd, health = num["latency_ms"], num["commands_delivery"], num["health"]
    stepped = num["mode"] == "stepped"
    misses, expired = num["deadline_misses"], num["expired_chunks"]
    horizon_ms = (num["horizon"] or 0) * (num["dt"] or 0) * 1e3
    overloaded = bool(horizon_ms) and lat["inference"]["p50"] >= horizon_ms
    level = mg["level"]
    if misses and level == 0:
        level = 1
    if health["worst_level"] == 2:
        level = 2
    bound_text = {
        "environment-bound": f"environment-bound (X = {_fmt(r['X'])} > 1: inference is shorter than a chunk's "
                             "execution on average)",
        "inference-bound": f"inference-bound (X = {_fmt(r['X'])} < 1: the robot waits on the model)",
        "balanced": f"balanced (X = {_fmt(r['X'])} ~ 1)",
    }.get(r["bound"], "not placed on the roofline (fewer than two adopted chunks)")
    if stepped:
        head = (f"Stepped replay (logic check): {num['chunks']} chunks, {misses} deadline misses. "
                "Timing is not measured in this mode.")
    elif overloaded:
        head = (f"Overloaded: inference p50 {_fmt(lat['inference']['p50'], 0)} ms is longer than the "
                f"{horizon_ms:.0f} ms a chunk covers; {misses} deadline misses, {expired} chunks expired.")
    elif misses:
        head = (f"{misses} deadline misses in {mg['n']} chunks ({expired} expired); on average {bound_text}, "
                "but not every chunk arrived in time.")
    elif r["bound"] == "environment-bound":
        head = f"Environment-bound: X = {_fmt(r['X'])} > 1. Every chunk arrived in time; the loop waits on the robot."
    elif r["bound"] == "inference-bound":
        head = f"Inference-bound: X = {_fmt(r['X'])} < 1. The robot waits on the model; faster inference pays off."
    elif r["bound"] == "balanced":
        head = f"Balanced: X = {_fmt(r['X'])} ~ 1. Inference and execution take about equally long."
    else:
        head = "Not enough chunk cycles to place this run on the roofline."
    facts = [
        f"Control margin {LEVEL_NAMES[mg['level']]}: P(M_ctrl >= 0) = {_fmt(mg['p_hat'], 3)} over {mg['n']} chunks; "
        + (f"its lower bound {_fmt(mg['p_lower'], 3)} ({mg['bound_label']}) meets the target "
           f"{mg['target']:.3f}." if mg["level"] == 0 else f"{mg['why']}."),
        f"Margin p50 {_fmt(mg['p50_ms'], 0)} ms, worst {_fmt(mg['min_ms'], 0)} ms; inference p50 "
        f"{_fmt(lat['inference']['p50'], 1)} ms, p99 {_fmt(lat['inference']['p99'], 1)} ms;"
        f" L_critical p99 {_fmt(lat['critical']['p99'], 1)} ms.",
        f"Roofline: {bound_text}; Y = {_fmt(r['Y'], 3)} of the control time was spent acting (roof "
        f"{_fmt(r['Y_roof'], 3)}, sequential {_fmt(r['Y_seq'], 3)}), over {r['cycles']} chunk cycles.",
        f"Deadline misses: {misses} (chunks that reached the action timer after the executing chunk ran out), of "
        f"which {expired} expired (never executed); run-outs {num['counters'].get('run_outs', 0)}, "
        f"deadline-policy ticks {num['counters'].get('deadline_policy_ticks', 0)}.",
        f"Commands: {cmd['n']} published; missed slots {num['counters'].get('missed_slots', 0)} (timer ran late); "
        f"delivery delay p50 {_fmt(cmd['delay_p50_ms'], 2)} ms, p99 {_fmt(cmd['delay_p99_ms'], 2)} ms, max "
        f"{_fmt(cmd['delay_max_ms'], 2)} ms; longest silence {_fmt(cmd['longest_silence_s'], 2)} s.",
    ]
    if mg["node_errors"]:
        level = 2
        facts.append(f"The node's control-margin status was ERROR in {mg['node_errors']} of {num['margins']} "
                     f"ControlMargin reports, e.g. \"{mg['node_error_example']}\".")
    if health["errors"]:
        facts.append(f"The node's watchdog said ERROR in {health['errors']} of {health['reports']} /diagnostics "
                     f"reports, e.g. \"{health['worst_message']}\".")
    if mg["n"] and mg["min_ms"] < 0:
        if overloaded:
            cause = ("inference itself is longer than the horizon: every chunk is late by construction, whatever "
                     "the tail")
        elif lat["inference"]["p99"] > 1.5 * lat["inference"]["p50"]:
            cause = (f"the latency tail (inference p99 {_fmt(lat['inference']['p99'], 0)} ms vs p50 "
                     f"{_fmt(lat['inference']['p50'], 0)} ms), not the average, sets the margin")
        else:
            cause = (f"inference p50 {_fmt(lat['inference']['p50'], 0)} ms and p99 {_fmt(lat['inference']['p99'], 0)}"
                     " ms are close: the average itself is too long for the budget")
        facts.append(f"{mg['n'] - mg['k']} chunk(s) missed their deadline, the worst by {-mg['min_ms']:.0f} ms: "
                     f"{cause}.")
    if mg.get("negative_budgets"):
        facts.append(f"B_ctrl < 0 for {mg['negative_budgets']} chunk(s) (down to {_fmt(mg['budget_min_ms'] / 1e3, 2)} "
                     "s): their observation was taken after the executing chunk had already run out, so the budget "
                     "was spent before inference began (a run-out was in progress).")
    if acc:
        tot = {c: sum(row[c] for row in acc["per_topic"].values()) for c in
               ("played", "used", "superseded", "stale", "rejected", "not_played")}
        facts.append(f"Inputs: {tot['played']} messages played, all accounted for: {tot['used']} used, "
                     f"{tot['superseded']} superseded, {tot['stale']} stale messages (too old when a snapshot was "
                     f"taken), {tot['rejected']} rejected"
                     + (f", {tot['not_played']} not played" if tot["not_played"] else "")
                     + ("" if acc.get("ok", True) else " - with problems: " + "; ".join(acc.get("problems", []))) + ".")
        facts.append(f"Stale snapshots (triggers refused because an input was missing or too old): "
                     f"{num['counters'].get('stale_snapshots', 0)}.")
        end_of_bag = sum(n for rs in acc.get("reasons", {}).values() for r2, n in rs.items() if r2 == "stale: end of bag")
        if acc.get("ok") is False or tot["rejected"] or tot["stale"] - end_of_bag or tot["not_played"]:
            level = max(level, 1)
    n_events = len([e for e in num["events"] if e.get("source") != "node"])
    if n_events:
        facts.append(f"{n_events} events in the bag or the replay (listed below).")
    caveat = None
    if stepped:
        caveat = ("Stepped (deterministic) replay: the replay clock stands still while the node infers, so "
                  "inference takes no replay time. Latency, margin and X describe the control logic, not this "
                  "machine; replay in real time (--mode realtime) to measure.")
    elif num.get("rate") not in (None, 1, 1.0):
        caveat = (f"Replayed at {num['rate']:g}x real time: the robot's time runs {num['rate']:g}x faster than this "
                  "machine's, so latencies in robot time are scaled by that factor (measured on the monotonic "
                  "clock, converted at the node's measured clock rate).")
    return {"headline": head, "level": level, "facts": facts, "caveat": caveat}


def _events_rows(events: List[dict], t0: Optional[int]) -> List[List[str]]:
    """Event table rows; times on the bag timeline, seconds from ``t0``."""
    rows = []
    for e in events:
        t = ""
        if e.get("log_ns") is not None and t0 is not None:
            t = f"{(e['log_ns'] - t0) / NS_PER_S:+.3f}"
        rows.append([t, e.get("source", ""), e.get("kind", ""), e.get("topic", ""), e.get("detail", "")])
    return rows


def _markdown(num: dict, v: dict, figs: Dict[str, Path], t0: int, appendix=()) -> str:
    lines = [f"# Replay report: {Path(num['input_bag'] or num['bag']).name}", "",
             f"**{LEVEL_NAMES[v['level']]}** - {v['headline']}", ""]
    lines += [f"- {f}" for f in v["facts"]]
    if v["caveat"]:
        lines += ["", f"> {v['caveat']}"]
    for title, body in appendix:
        lines += ["", f"## {title}", ""] + [f"- {x}" for x in body]
    lines += ["", f"Mode: {num['mode']}" + (f" x{num['rate']:g}" if num.get('rate') else "")
              + f"; model {num['model_id']}; dt {num['dt']} s, H {num['horizon']}; {num['chunks']} chunks, "
              f"{num['commands']} commands; output bag `{num['bag']}`.", ""]
    for name, title in (("roofline", "Control-time roofline"), ("margin", "Margin distribution and budget"),
                        ("latency_time", "Latency segments over time"), ("latency_hist", "Latency histograms"),
                        ("discontinuity", "Chunk-boundary discontinuity"), ("problems", "Deadline misses"),
                        ("accounting", "Input accounting")):
        if name in figs:
            lines += [f"## {title}", "", f"![{title}]({figs[name].name})", ""]
    lines += ["## Latency segments (ms)", "", "| segment | p50 | p95 | p99 | max |", "|---|---|---|---|---|"]
    for name, st in num["latency_ms"].items():
        lines.append(f"| {name} | {_fmt(st['p50'], 1)} | {_fmt(st['p95'], 1)} | {_fmt(st['p99'], 1)} | {_fmt(st['max'], 1)} |")
    d = num["discontinuity"]
    lines += ["", f"Chunk boundaries: {len(d['boundaries'])}; command step at a switch max {_fmt(d.get('max_jump'), 4)}"
              f" vs median step within a chunk {_fmt(d['median_step'], 4)} (p99 {_fmt(d['p99_step'], 4)}).", ""]
    acc = num.get("accounting")
    if acc:
        from phyai_ros.replay.accounting import CATEGORIES
        lines += ["## Accounting", "", "| topic | played | " + " | ".join(CATEGORIES) + " |",
                  "|---|---|" + "---|" * len(CATEGORIES)]
        for t, row in sorted(acc["per_topic"].items()):
            lines.append(f"| {t} | {row['played']} | " + " | ".join(str(row[c]) for c in CATEGORIES) + " |")
        for t, reasons in sorted(acc.get("reasons", {}).items()):
            for reason, n in sorted(reasons.items()):
                lines.append(f"\n- {t}: {n} {reason}")
        lines += ["", f"Snapshots: {acc['snapshots']} chunks, {acc['verified']} observation stamps verified, "
                  f"{acc.get('races', 0)} after resolving a delivery race. " + ("Accounting check OK." if acc.get("ok") else
                                                        "Problems: " + "; ".join(acc.get("problems", []))), ""]
    if num["counters"]:
        lines += ["## Node counters (this replay)", "", ", ".join(f"{k} {v2}" for k, v2 in sorted(num["counters"].items())
                                                                 if v2), ""]
    lines += ["## Events", ""]
    rows = _events_rows(num["events"], t0)
    if rows:
        lines += ["| t [s] | source | kind | topic | detail |", "|---|---|---|---|---|"]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    else:
        lines.append("None.")
    return "\n".join(lines) + "\n"


def _html(num: dict, v: dict, figs: Dict[str, Path], md_body: str, t0: int, appendix=()) -> str:
    def img(name, width="100%"):
        if name not in figs:
            return ""
        data = base64.b64encode(figs[name].read_bytes()).decode()
        return f'<img src="data:image/png;base64,{data}" style="width:{width};max-width:100%">'

    color = LEVEL_COLORS[v["level"]]
    e = html.escape
    mg, r = num["margin"], num["roofline"]
    big = [("X", _fmt(r["X"]), r["bound"]), ("P(M&ge;0)", _fmt(mg["p_hat"], 3),
                                             f"lower {_fmt(mg['p_lower'], 3)} ({mg['bound_label']}) vs {mg['target']:.3f}"),
           ("deadline misses", str(num["deadline_misses"]), f"{num['expired_chunks']} expired of {num['chunks']} chunks"),
           ("missed slots", str(num["counters"].get("missed_slots", 0)),
            f"command delay p99 {_fmt(num['commands_delivery']['delay_p99_ms'], 1)} ms, max "
            f"{_fmt(num['commands_delivery']['delay_max_ms'], 1)} ms"),
           ("inference p99", f"{_fmt(num['latency_ms']['inference']['p99'], 1)} ms",
            f"p50 {_fmt(num['latency_ms']['inference']['p50'], 1)} ms")]
    tiles = "".join(f'<div class="tile"><div class="k">{k}</div><div class="v">{val}</div><div class="s">{e(sub)}</div></div>'
                    for k, val, sub in big)
    facts = "".join(f"<li>{e(f)}</li>" for f in v["facts"])
    caveat = f'<p class="caveat">{e(v["caveat"])}</p>' if v["caveat"] else ""
    from phyai_ros.replay.accounting import CATEGORIES
    acc = num.get("accounting")
    acc_html = ""
    if acc:
        head = "".join(f"<th>{c}</th>" for c in CATEGORIES)
        body = "".join(f"<tr><td>{e(t)}</td><td>{row['played']}</td>" + "".join(f"<td>{row[c]}</td>" for c in CATEGORIES)
                       + "</tr>" for t, row in sorted(acc["per_topic"].items()))
        reasons = "".join(f"<li>{e(t)}: {n} {e(reason)}</li>" for t, rs in sorted(acc.get("reasons", {}).items())
                          for reason, n in sorted(rs.items()))
        check = ("Accounting check OK: every input message is in exactly one category." if acc.get("ok")
                 else "Accounting problems: " + e("; ".join(acc.get("problems", []))))
        acc_html = (f"<h2>Input accounting</h2>{img('accounting')}<table><tr><th>topic</th><th>played</th>{head}</tr>"
                    f"{body}</table><ul>{reasons}</ul><p>Snapshots: {acc['snapshots']} chunks, {acc['verified']} "
                    f"observation stamps verified ({acc.get('races', 0)} after resolving a delivery race). "
                    f"{check}</p>")
    lat = "".join(f"<tr><td>{n}</td>" + "".join(f"<td>{_fmt(st[q], 1)}</td>" for q in ("p50", "p95", "p99", "max"))
                  + "</tr>" for n, st in num["latency_ms"].items())
    rows = _events_rows(num["events"], t0)
    ev = ("<table><tr><th>t [s]</th><th>source</th><th>kind</th><th>topic</th><th>detail</th></tr>"
          + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows) + "</table>"
          ) if rows else "<p>None.</p>"
    d = num["discontinuity"]
    counters = ", ".join(f"{k} {v2}" for k, v2 in sorted(num["counters"].items()) if v2)
    extra = "".join(f"<h2>{e(t)}</h2><ul>" + "".join(f"<li>{e(x)}</li>" for x in body) + "</ul>" for t, body in appendix)
    title = e(Path(num["input_bag"] or num["bag"]).name)
    return f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>Replay report: {title}</title>
<style>
body{{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:18px auto;max-width:1180px;color:#222}}
.verdict{{border-left:10px solid {color};background:#fafafa;padding:10px 16px;margin-bottom:10px}}
.verdict h1{{margin:0 0 4px 0;font-size:21px}} .badge{{background:{color};color:#fff;padding:2px 10px;border-radius:4px;margin-right:8px}}
.tiles{{display:flex;gap:10px;margin:8px 0}} .tile{{flex:1;background:#fff;border:1px solid #ddd;border-radius:6px;padding:6px 10px}}
.tile .k{{font-size:12px;color:#666}} .tile .v{{font-size:24px;font-weight:600}} .tile .s{{font-size:11px;color:#666}}
.row{{display:flex;gap:12px;align-items:flex-start}} .row>div{{flex:1}}
.caveat{{background:#fff4e0;border:1px solid #f0c070;padding:6px 10px}}
table{{border-collapse:collapse;font-size:12px;margin:6px 0}} td,th{{border:1px solid #ddd;padding:3px 7px;text-align:left}}
ul{{margin:4px 0}} li{{margin:2px 0}} .meta{{color:#666;font-size:12px}}
</style></head><body>
<div class="verdict"><h1><span class="badge">{LEVEL_NAMES[v['level']]}</span>{e(v['headline'])}</h1>
<div class="tiles">{tiles}</div><ul>{facts}</ul>{caveat}</div>
{extra}
<div class="row"><div>{img('roofline')}</div><div>{img('problems')}{img('accounting') if acc else ''}</div></div>
<p class="meta">Input bag {e(str(num['input_bag']))} &middot; mode {e(str(num['mode']))}{(' x' + format(num['rate'], 'g')) if num.get('rate') else ''}
&middot; model {e(str(num['model_id']))} &middot; dt {num['dt']} s, H {num['horizon']} &middot; {num['chunks']} chunks,
{num['commands']} commands &middot; output bag {e(num['bag'])}</p>
<h2>Margin</h2>{img('margin')}
<h2>Latency segments</h2>{img('latency_time')}{img('latency_hist')}
<table><tr><th>segment (ms)</th><th>p50</th><th>p95</th><th>p99</th><th>max</th></tr>{lat}</table>
<h2>Chunk boundaries</h2>{img('discontinuity')}
<p>{len(d['boundaries'])} boundaries; command step at a switch max {_fmt(d.get('max_jump'), 4)} vs median step within a
chunk {_fmt(d['median_step'], 4)} (p99 {_fmt(d['p99_step'], 4)}).</p>
{acc_html}
<h2>Node counters (this replay)</h2><p>{e(counters) or 'all zero'}</p>
<h2>Events</h2>{ev}
</body></html>
"""


# ============================================================================ entry points
def make_report(bag, out_dir=None, formats: Sequence[str] = ("html", "md"),
                appendix: Sequence[Tuple[str, Sequence[str]]] = ()) -> ReportResult:
    """``appendix``: extra sections (title, lines) put after the verdict, e.g. the demo's overload run."""
    run = require_node_outputs(load_run(bag))
    out = Path(out_dir) if out_dir else Path(bag) / "report"
    out.mkdir(parents=True, exist_ok=True)
    num = analyze(run)
    figs = _figures(run, num, out)
    v = verdict(num)
    num["verdict"] = v
    t0 = run.t0
    md = _markdown(num, v, figs, t0, appendix)
    md_path = html_path = None
    if "md" in formats:
        md_path = out / "report.md"
        md_path.write_text(md)
    if "html" in formats:
        html_path = out / "report.html"
        html_path.write_text(_html(num, v, figs, md, t0, appendix))
    (out / "report.json").write_text(json.dumps(num, indent=2, default=_json_safe, allow_nan=True))
    bound = "stepped: timing not measured" if num["mode"] == "stepped" else num["roofline"]["bound"]
    line = f"{LEVEL_NAMES[v['level']]}: {bound} (X = {_fmt(num['roofline']['X'])}), " \
           f"P(M_ctrl >= 0) = {_fmt(num['margin']['p_hat'], 3)} (lower {_fmt(num['margin']['p_lower'], 3)}, " \
           f"{num['margin']['bound_label']}, vs target {num['margin']['target']:.3f}, n = {num['margin']['n']}), " \
           f"deadline misses {num['deadline_misses']} (expired {num['expired_chunks']}), missed slots " \
           f"{num['counters'].get('missed_slots', 0)}, longest command silence " \
           f"{_fmt(num['commands_delivery']['longest_silence_s'], 2)} s"
    return ReportResult(out_dir=out, index=html_path or md_path, markdown=md_path, figures=figs, numbers=num,
                        verdict_line=line)


def _json_safe(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    return str(o)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="report", description="Write an HTML/Markdown report with plots from a bag of "
                                 "the policy node's outputs (a replay output bag or a robot recording).")
    ap.add_argument("bag", help="output bag of `replay` (or any bag with action_chunk / control_margin)")
    ap.add_argument("-o", "--out", help="report folder (default: BAG/report)")
    ap.add_argument("--format", nargs="+", choices=("html", "md"), default=["html", "md"])
    a = ap.parse_args(argv)
    try:
        rep = make_report(a.bag, a.out, a.format)
    except NotAnOutputBag as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - a CLI reports one clear line
        print(f"report: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"report: {rep.verdict_line}")
    for p in (rep.index, rep.markdown):
        if p is not None and p != rep.index or p == rep.index:
            pass
    print(f"report: {rep.index}" + (f" (also {rep.markdown.name}, {len(rep.figures)} PNG plots, report.json)"
                                     if rep.markdown and rep.markdown != rep.index else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
