"""The report's seven figures (PNG, matplotlib), one function each, from the bag of the node's outputs
(``runbag.Run``) and the numbers of ``analysis.analyze``: the roofline, the margin, latency over time
and as histograms, chunk-boundary discontinuity, problems over time and the input accounting.

matplotlib is an optional dependency (the ``bags`` extra): it is imported when the figures are drawn,
so the rest of the replay tools import without it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Sequence

import numpy as np

from phyai_ros import needs_extra
from phyai_ros.control.clock import NS_PER_S, ns_to_s
from phyai_ros.control.roofline import y_roof, y_sequential
from phyai_ros.replay.accounting import CATEGORIES
from phyai_ros.replay.analysis import SEGMENTS
from phyai_ros.replay.render import fmt
from phyai_ros.replay.runbag import Run

SEG_COLORS = ("#8fb3d9", "#b5d99c", "#f2d17c", "#e8845c", "#b48ec9")   # per segment of analysis.SEGMENTS
# Node counters shown as problems, named as in docs/design.md ("Vocabulary").
PROBLEM_COUNTERS = ("deadline_misses", "expired_chunks", "run_outs", "missed_slots", "stale_snapshots", "late_chunks",
                    "bad_image", "bad_state",
                    "missing_joint", "out_of_order", "future_stamp", "clock_jumps", "inference_errors", "bad_chunks",
                    "discarded_after_reset", "callback_errors", "worker_crashes")


@dataclass
class _Plot:
    """What every figure of the report draws from, and where it goes."""

    run: Run
    num: dict
    in_session: Sequence[bool]
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
        self.keep = np.array(self.in_session, bool)
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


def make_figures(run: Run, num: dict, in_session: Sequence[bool], out: Path) -> Dict[str, Path]:
    """Every figure of the report, one function each, written into ``out``; name -> PNG path. ``in_session``:
    per margin, whether it is the session's (``analysis.margin_session``, as the numbers split them)."""
    with needs_extra("bags", "the report's figures"):   # optional (module doc)
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
                         "axes.spines.right": False})
    p = _Plot(run, num, in_session, out, plt, {})
    for figure in (_figure_roofline, _figure_margin, _figure_latency_time, _figure_latency_hist,
                   _figure_discontinuity, _figure_problems, _figure_accounting):
        figure(p)
    return p.figs


def _hist(ax, values: np.ndarray, bins: int, **kw) -> None:
    """``ax.hist`` that also draws values all (nearly) equal, as a stepped replay's simulated-time margins are:
    their range is widened to 1 ms around them (numpy cannot split a range within rounding into bins)."""
    lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    wide = hi - lo > 1e-6 * max(1.0, abs(lo), abs(hi))
    ax.hist(values, bins=bins, range=None if wide else (lo - 0.5, hi + 0.5), **kw)


def _figure_roofline(p: _Plot) -> None:
    """The control-time roofline: the run's (X, Y) against Y_seq and Y_roof, the node's window per chunk."""
    num, plt, margins = p.num, p.plt, p.margins
    r = num["roofline"]
    fig, ax = plt.subplots(figsize=(5.2, 3.9))
    xs = np.logspace(-2, 2.5, 300)
    ax.plot(xs, [y_sequential(x) for x in xs], color="#555", lw=1.5, label="Y_seq = X/(1+X)  (no overlap)")
    ax.plot(xs, [y_roof(x) for x in xs], color="#1f77b4", lw=2, label="Y_roof = min(X, 1)  (perfect overlap)")
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
        ax.plot([xp], [Y], "o", color="#c62828", ms=10, label=f"this run: X = {fmt(X)}, Y = {Y:.3f}")
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
        hits, misses = M[hfin][M[hfin] >= 0], M[hfin][M[hfin] < 0]
        if hits.size:
            _hist(a1, hits, bins, color="#2e7d32", alpha=0.8, label="M_ctrl >= 0")
        if misses.size:
            _hist(a1, misses, max(4, bins // 3), color="#c62828", alpha=0.85, label="M_ctrl < 0 (miss)")
        a1.axvline(0, color="k", lw=1)
        a1.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    a1.set_xlabel("M_ctrl = B_ctrl - (L_inference + L_noninf)  [ms]")
    a1.set_ylabel("chunks")
    a1.set_title("Margin distribution (one sample per chunk)")
    a1.text(0.02, 0.97, f"P(M>=0) = {fmt(mg['p_hat'], 3)}, n = {mg['n']} margin samples\nlower bound "
            f"{fmt(mg['p_lower'], 3)} ({mg['bound_label']})\ntarget 1 - eps = {mg['target']:.3f}", transform=a1.transAxes,
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
    # below the axes: inside, it would hide a line at 0 or at 1 (an overload, a clean run)
    a2.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
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
            _hist(ax, v, min(30, max(5, v.size // 2)), color=color)
            ax.axvline(np.percentile(v, 99), color="k", ls=":", lw=1)
        st = num["latency_ms"][name]
        ax.set_title(f"{name}\np50 {fmt(st['p50'], 1)}  p99 {fmt(st['p99'], 1)} ms", fontsize=8)
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

__all__ = ["make_figures", "SEG_COLORS", "PROBLEM_COUNTERS"]
