#!/usr/bin/env python3
"""The op -> candidate kernels -> chosen-where table of docs/design.md, generated from the operator selector's
registry and the shipped device profiles (profiles/*.json), so the document cannot drift from the code:

    .venv/bin/python scripts/op_table.py            # print the table
    .venv/bin/python scripts/op_table.py --write    # put it into docs/design.md between its markers
    .venv/bin/python scripts/op_table.py --check    # exit 1 when docs/design.md's copy differs (a test runs this)

Per op: its candidates in the selector's preference order (the first usable one runs where no profile has an
entry; ``profiled_only`` ones, marked *, only where a profile names them), and per shipped profile how many of the
op's profiled shapes each candidate won. A second table says, per op, which candidates a Jetson Thor can run
(``backend``) and what each op falls back to.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from phyai_ros import layers  # noqa: E402,F401 - importing the layers registers every op's candidates
from phyai_ros.layers.selector import SELECTOR  # noqa: E402

DESIGN = REPO / "docs" / "design.md"
BEGIN, END = "<!-- op table: begin (scripts/op_table.py --write) -->", "<!-- op table: end -->"
THOR_BEGIN, THOR_END = "<!-- thor table: begin (scripts/op_table.py --write) -->", "<!-- thor table: end -->"


def shipped_profiles() -> dict:
    """device name -> {op: {shape key: candidate}} of every profile file shipped in profiles/."""
    out = {}
    for path in sorted((REPO / "profiles").glob("*.json")):
        for signature, table in json.loads(path.read_text())["devices"].items():
            out[f"{signature.rsplit(':', 1)[-1]} ({path.name})"] = table
    return out


def table() -> str:
    profiles = shipped_profiles()
    head = ["op", "candidates (preference order; * profiled only)"] + [f"chosen on {d}: shapes won" for d in profiles]
    rows = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    for op in sorted(SELECTOR.candidates):
        names = ", ".join(f"`{c.name}`" + ("*" if c.profiled_only else "") for c in SELECTOR.candidates[op])
        chosen = []
        for prof in profiles.values():
            won = Counter(prof.get(op, {}).values())
            chosen.append(", ".join(f"`{name}` {n}" for name, n in won.most_common()) or "—")
        rows.append("| " + " | ".join([f"`{op}`", names] + chosen) + " |")
    return "\n".join(rows)


def backend(c) -> str:
    """What a candidate runs on: "triton" (a kernel of phyai_ros.kernels: compiled ahead of time for the Thor in
    CI, scripts/compile_kernels.py), "library" (torch's CUDA build: SDPA, cuBLASLt, cuBLAS fp8), "flashinfer" (an
    optional package, not built for the Thor), or "portable" (torch on any device: the references, "unfused",
    the quantized ops' "dense")."""
    if c.name.startswith("flashinfer"):
        return "flashinfer"
    if tuple(c.devices) != ("cuda",):
        return "portable"
    return "triton" if getattr(c.available, "__name__", "") == "triton_ok" else "library"


def thor_table() -> str:
    """Per op: the candidates a Jetson Thor (sm_110) can run, by backend, and what it falls back to."""
    head = ["op", "Triton candidates (kernels AOT-compiled for sm_101 = sm_110 in CI)", "library (torch CUDA)",
            "not on Thor", "fallback"]
    rows = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    bare = []
    for op in sorted(SELECTOR.candidates):
        cands = SELECTOR.candidates[op]
        kinds = {k: [c.name for c in cands if backend(c) == k] for k in ("triton", "library", "flashinfer")}
        if not kinds["triton"] and not kinds["library"]:
            bare.append(op)
        rows.append("| " + " | ".join([f"`{op}`", str(len(kinds["triton"])) if kinds["triton"] else "—",
                                        ", ".join(f"`{n}`" for n in kinds["library"]) or "—",
                                        ", ".join(f"`{n}`" for n in kinds["flashinfer"]) or "—",
                                        f"`{cands[-1].name}`"]) + " |")
    rows.append("")
    rows.append("Ops with no fused kernel the Thor can run: " + (", ".join(f"`{op}`" for op in bare) or "none") +
                ". Every op falls back to its reference (torch on any device) where a kernel does not build.")
    return "\n".join(rows)


def with_table(doc: str, body: str, begin: str = BEGIN, end: str = END) -> str:
    if begin not in doc or end not in doc:
        raise SystemExit(f"{DESIGN}: the markers {begin!r} / {end!r} are missing")
    before, rest = doc.split(begin, 1)
    return before + begin + "\n" + body + "\n" + end + rest.split(end, 1)[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    a = ap.parse_args()
    body, thor = table(), thor_table()
    if not (a.write or a.check):
        print(body + "\n\n" + thor)
        return 0
    doc = DESIGN.read_text()
    new = with_table(with_table(doc, body), thor, THOR_BEGIN, THOR_END)
    if a.write:
        DESIGN.write_text(new)
        return 0
    if new != doc:
        print(f"{DESIGN}'s op table is stale: run scripts/op_table.py --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
