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

The jobs live apart: ``analysis`` (the numbers), ``verdict`` (the judgement, as data), ``figures``
(the plots) and ``render`` (Markdown and HTML); this module composes them and is the command.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Sequence

from phyai_ros.replay import render
from phyai_ros.replay.analysis import analyze, margin_session
from phyai_ros.replay.figures import make_figures
from phyai_ros.replay.runbag import NotAnOutputBag, json_default, load_run, require_node_outputs
from phyai_ros.replay.verdict import verdict


@dataclass
class ReportResult:
    """Where a report was written, and its numbers (``report.json``) with the verdict among them."""

    out_dir: Path
    index: Optional[Path]         # report.html (or report.md if only markdown)
    markdown: Optional[Path]
    figures: Dict[str, Path]
    numbers: dict
    verdict_line: str = ""


def make_report(bag, out_dir=None, formats: Sequence[str] = ("html", "md"),
                appendix: render.Appendix = ()) -> ReportResult:
    """``appendix``: extra sections (title, lines) put after the verdict, e.g. the demo's overload run."""
    run = require_node_outputs(load_run(bag))
    out = Path(out_dir) if out_dir else Path(bag) / "report"
    out.mkdir(parents=True, exist_ok=True)
    session = margin_session(run)
    num = analyze(run, session)
    figs = make_figures(run, num, session[1], out)
    v = verdict(num)
    num["verdict"] = v
    md_path = html_path = None
    if "md" in formats:
        md_path = out / "report.md"
        md_path.write_text(render.markdown(num, v, figs, run.t0, appendix))
    if "html" in formats:
        html_path = out / "report.html"
        html_path.write_text(render.html(num, v, figs, run.t0, appendix))
    (out / "report.json").write_text(json.dumps(num, indent=2, default=json_default, allow_nan=True))
    return ReportResult(out_dir=out, index=html_path or md_path, markdown=md_path, figures=figs, numbers=num,
                        verdict_line=render.verdict_line(num, v))


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
    print(f"report: {rep.index}" + (f" (also {rep.markdown.name}, {len(rep.figures)} PNG plots, report.json)"
                                     if rep.markdown and rep.markdown != rep.index else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
