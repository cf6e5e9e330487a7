"""The report's text: Markdown and self-contained HTML (plots embedded) of the numbers
(``analysis``), the verdict (``verdict``) and the figures (``figures``), the one-line verdict the
commands print, and how a number is written in all of them (``fmt``). Bags are shared between
people: every value interpolated into the HTML is escaped (``_e``), and the text taken from the bag
(names, events, accounting) in the Markdown too (``_m``), so a crafted bag cannot put markup in a report."""
from __future__ import annotations

import base64
import html as html_text
import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from phyai_ros.control.clock import NS_PER_S
from phyai_ros.replay.accounting import CATEGORIES
from phyai_ros.replay.analysis import LEVEL_NAMES

LEVEL_COLORS = {0: "#2e7d32", 1: "#ef8f00", 2: "#c62828"}
Appendix = Sequence[Tuple[str, Sequence[str]]]   # extra sections after the verdict: (title, lines)


def _e(value) -> str:
    """Any value as HTML text."""
    return html_text.escape(str(value))


def _m(value, cell: bool = False) -> str:
    """Text as Markdown text: no raw HTML (a viewer would render it: '<' and '&' as entities); in a table
    ``cell``, no '|' either."""
    text = str(value).replace("&", "&amp;").replace("<", "&lt;")
    return text.replace("|", "/") if cell else text


def fmt(v, digits: int = 2) -> str:
    """A number as every text of the report writes it (NaN and None: n/a)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    if isinstance(v, float) and abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.{digits}f}"


def _events_rows(events: List[dict], t0: Optional[int]) -> List[List[str]]:
    """Event table rows; times on the bag timeline, seconds from ``t0``."""
    rows = []
    for e in events:
        t = ""
        if e.get("log_ns") is not None and t0 is not None:
            t = f"{(e['log_ns'] - t0) / NS_PER_S:+.3f}"
        rows.append([t, e.get("source", ""), e.get("kind", ""), e.get("topic", ""), e.get("detail", "")])
    return rows


def markdown(num: dict, v: dict, figs: Dict[str, Path], t0: int, appendix: Appendix = ()) -> str:
    """``report.md``: the verdict, the appendix, the plots (as files next to it) and the tables."""
    lines = [f"# Replay report: {_m(Path(str(num['input_bag'] or num['bag'])).name)}", "",
             f"**{LEVEL_NAMES[v['level']]}** - {_m(v['headline'])}", ""]
    lines += [f"- {_m(f)}" for f in v["facts"]]
    if v["caveat"]:
        lines += ["", f"> {_m(v['caveat'])}"]
    for title, body in appendix:
        lines += ["", f"## {_m(title)}", ""] + [f"- {_m(x)}" for x in body]
    lines += ["", f"Mode: {_m(num['mode'])}" + (f" x{num['rate']:g}" if num.get('rate') else "")
              + f"; judged node {_m(num.get('node') or 'unknown')}; model {_m(num['model_id'])}; dt {_m(num['dt'])} s, "
              f"H {_m(num['horizon'])}; {_m(session_counts(num))}; output bag `{_m(num['bag'])}`.", ""]
    for name, title in (("roofline", "Control-time roofline"), ("margin", "Margin distribution and budget"),
                        ("latency_time", "Latency segments over time"), ("latency_hist", "Latency histograms"),
                        ("discontinuity", "Chunk-boundary discontinuity"), ("problems", "Deadline misses"),
                        ("accounting", "Input accounting")):
        if name in figs:
            lines += [f"## {title}", "", f"![{title}]({figs[name].name})", ""]
    lines += ["## Latency segments (ms)", "", "| segment | p50 | p95 | p99 | max |", "|---|---|---|---|---|"]
    for name, st in num["latency_ms"].items():
        lines.append(f"| {name} | {fmt(st['p50'], 1)} | {fmt(st['p95'], 1)} | {fmt(st['p99'], 1)} | {fmt(st['max'], 1)} |")
    d = num["discontinuity"]
    lines += ["", f"Chunk boundaries: {len(d['boundaries'])}; command step at a switch max {fmt(d.get('max_jump'), 4)}"
              f" vs median step within a chunk {fmt(d['median_step'], 4)} (p99 {fmt(d['p99_step'], 4)}).", ""]
    acc = num.get("accounting")
    if acc:
        uses = acc.get("snapshot_uses", {})
        lines += ["## Accounting", "", "| topic | played | " + " | ".join(CATEGORIES) + " | taken by snapshots |",
                  "|---|---|" + "---|" * len(CATEGORIES) + "---|"]
        for t, row in sorted(acc["per_topic"].items()):
            lines.append(f"| {_m(t, True)} | {row.get('played', 0)} | " + " | ".join(str(row.get(c, 0)) for c in CATEGORIES)
                         + f" | {_m(uses.get(t, 'n/a'))} |")
        for t, reasons in sorted(acc.get("reasons", {}).items()):
            for reason, n in sorted(reasons.items()):
                lines.append(f"\n- {_m(t)}: {n} {_m(reason)}")
        lines += ["", f"{_m(snapshots_sentence(acc))} " + ("Accounting check OK." if acc.get("ok") else
                                                          "Problems: " + _m("; ".join(acc.get("problems", [])))), ""]
    if num["counters"]:
        lines += ["## Node counters (this replay)", "", ", ".join(f"{_m(k)} {v2}" for k, v2 in
                                                                 sorted(num["counters"].items()) if v2), ""]
    lines += ["## Events", ""]
    rows = _events_rows(num["events"], t0)
    if rows:
        lines += ["| t [s] | source | kind | topic | detail |", "|---|---|---|---|---|"]
        lines += ["| " + " | ".join(_m(c, True) for c in row) + " |" for row in rows]
    else:
        lines.append("None.")
    return "\n".join(lines) + "\n"


def html(num: dict, v: dict, figs: Dict[str, Path], t0: int, appendix: Appendix = ()) -> str:
    """``report.html``, self-contained: the verdict and its tiles on the first screen, the plots embedded."""
    def img(name, width="100%"):
        if name not in figs:
            return ""
        data = base64.b64encode(figs[name].read_bytes()).decode()
        return f'<img src="data:image/png;base64,{data}" style="width:{width};max-width:100%">'

    color = LEVEL_COLORS[v["level"]]
    e = _e
    mg, r = num["margin"], num["roofline"]
    big = [("X", fmt(r["X"]), r["bound"]), ("P(M&ge;0)", fmt(mg["p_hat"], 3),
                                             f"lower {fmt(mg['p_lower'], 3)} ({mg['bound_label']}) vs {mg['target']:.3f}"),
           ("deadline misses", str(num["deadline_misses"]), f"{num['expired_chunks']} expired of {num['chunks']} chunks"),
           ("missed slots", str(num["counters"].get("missed_slots", 0)),
            f"command delay p99 {fmt(num['commands_delivery']['delay_p99_ms'], 1)} ms, max "
            f"{fmt(num['commands_delivery']['delay_max_ms'], 1)} ms"),
           ("inference p99", f"{fmt(num['latency_ms']['inference']['p99'], 1)} ms",
            f"p50 {fmt(num['latency_ms']['inference']['p50'], 1)} ms"
            + (" (simulated time)" if num["mode"] == "stepped" else ""))]
    tiles = "".join(f'<div class="tile"><div class="k">{k}</div><div class="v">{e(val)}</div><div class="s">{e(sub)}</div></div>'
                    for k, val, sub in big)
    facts = "".join(f"<li>{e(f)}</li>" for f in v["facts"])
    caveat = f'<p class="caveat">{e(v["caveat"])}</p>' if v["caveat"] else ""
    acc = num.get("accounting")
    acc_html = ""
    if acc:
        uses = acc.get("snapshot_uses", {})
        head = "".join(f"<th>{c}</th>" for c in CATEGORIES) + "<th>taken by snapshots</th>"
        body = "".join(f"<tr><td>{e(t)}</td><td>{e(row.get('played', 0))}</td>"
                       + "".join(f"<td>{e(row.get(c, 0))}</td>" for c in CATEGORIES)
                       + f"<td>{e(uses.get(t, 'n/a'))}</td></tr>" for t, row in sorted(acc.get("per_topic", {}).items()))
        reasons = "".join(f"<li>{e(t)}: {e(n)} {e(reason)}</li>" for t, rs in sorted(acc.get("reasons", {}).items())
                          for reason, n in sorted(rs.items()))
        check = ("Accounting check OK: every input message is in exactly one category." if acc.get("ok")
                 else "Accounting problems: " + e("; ".join(acc.get("problems", []))))
        acc_html = (f"<h2>Input accounting</h2>{img('accounting')}<table><tr><th>topic</th><th>played</th>{head}</tr>"
                    f"{body}</table><ul>{reasons}</ul><p>{e(snapshots_sentence(acc))} {check}</p>")
    lat = "".join(f"<tr><td>{e(n)}</td>" + "".join(f"<td>{e(fmt(st[q], 1))}</td>" for q in ("p50", "p95", "p99", "max"))
                  + "</tr>" for n, st in num["latency_ms"].items())
    rows = _events_rows(num["events"], t0)
    ev = ("<table><tr><th>t [s]</th><th>source</th><th>kind</th><th>topic</th><th>detail</th></tr>"
          + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows) + "</table>"
          ) if rows else "<p>None.</p>"
    d = num["discontinuity"]
    counters = ", ".join(f"{k} {v2}" for k, v2 in sorted(num["counters"].items()) if v2)
    extra = "".join(f"<h2>{e(t)}</h2><ul>" + "".join(f"<li>{e(x)}</li>" for x in body) + "</ul>" for t, body in appendix)
    title = e(Path(str(num["input_bag"] or num["bag"])).name)
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
<div class="row"><div>{img('roofline')}</div><div>{img('problems')}</div></div>
<p class="meta">Input bag {e(num['input_bag'])} &middot; mode {e(num['mode'])}{e(' x' + format(num['rate'], 'g')) if num.get('rate') else ''}
&middot; judged node {e(num.get('node') or 'unknown')} &middot; model {e(num['model_id'])} &middot; dt {e(num['dt'])} s,
H {e(num['horizon'])} &middot; {e(session_counts(num))} &middot; output bag {e(num['bag'])}</p>
<h2>Margin</h2>{img('margin')}
<h2>Latency segments</h2>{img('latency_time')}{img('latency_hist')}
<table><tr><th>segment (ms)</th><th>p50</th><th>p95</th><th>p99</th><th>max</th></tr>{lat}</table>
<h2>Chunk boundaries</h2>{img('discontinuity')}
<p>{len(d['boundaries'])} boundaries; command step at a switch max {e(fmt(d.get('max_jump'), 4))} vs median step within a
chunk {e(fmt(d['median_step'], 4))} (p99 {e(fmt(d['p99_step'], 4))}).</p>
{acc_html}
<h2>Node counters (this replay)</h2><p>{e(counters) or 'all zero'}</p>
<h2>Events</h2>{ev}
</body></html>
"""


def session_counts(num: dict) -> str:
    """The session's chunks and commands, with what the node did after the bag ended (the tail) apart."""
    tail = num.get("chunks_after_bag_end", 0)
    return (f"{num['chunks']} chunks, {num['commands']} commands in the session"
            + (f" (+{tail} chunk{'s' if tail != 1 else ''} in the replay's tail)" if tail else ""))


def snapshots_sentence(acc: dict) -> str:
    """What the accounting's snapshot count is, and why a topic's used messages can be fewer."""
    return (f"Snapshots: {acc.get('snapshots', 0)} (one per recorded chunk, the replay's tail included), "
            f"{acc.get('verified', 0)} "
            f"observation stamps verified ({acc.get('races', 0)} after resolving a delivery race). A message that "
            "stayed the newest of its topic over several snapshots is one used message taken by each: 'taken by "
            "snapshots' counts the snapshots.")


def verdict_line(num: dict, v: dict) -> str:
    """The verdict in one line, as the commands print it."""
    bound = "stepped, simulated time" if num["mode"] == "stepped" else num["roofline"]["bound"]
    return f"{LEVEL_NAMES[v['level']]}: {bound} (X = {fmt(num['roofline']['X'])}), " \
           f"P(M_ctrl >= 0) = {fmt(num['margin']['p_hat'], 3)} (lower {fmt(num['margin']['p_lower'], 3)}, " \
           f"{num['margin']['bound_label']}, vs target {num['margin']['target']:.3f}, n = {num['margin']['n']}), " \
           f"deadline misses {num['deadline_misses']} (expired {num['expired_chunks']}), missed slots " \
           f"{num['counters'].get('missed_slots', 0)}, longest command silence " \
           f"{fmt(num['commands_delivery']['longest_silence_s'], 2)} s"


__all__ = ["fmt", "markdown", "html", "verdict_line", "session_counts", "snapshots_sentence", "LEVEL_COLORS",
           "Appendix"]
