#!/usr/bin/env python3
"""Per-op table: each op of the denoising loops, its measured time against its own floor (no GPU needed).

Reads a profile's timings (``scripts/profile_ops.py`` on the device: every candidate of every (op, shape) in a
CUDA graph of back-to-back calls, weights out of L2) and prints, per loop (the pi0.5 expert's 50 rows, pi0's 51,
GR00T's DiT's 41; ``--rows`` for others), every op at batch ``--batch``: the fastest correct candidate's
microseconds, the op's floor (``phyai_ros.runtime.op_costs``: logical bytes at the measured copy ceiling or
FLOPs at the measured GEMM ceiling, whichever is larger), their ratio and what bounds the floor. The profile's
fastest op on the device is its per-kernel launch floor in a graph: an op within 10% of it is marked "launch",
where only fusing it away gains.

    python scripts/op_floors.py profiles/h200.json                      # the H200's measured ceilings
    python scripts/op_floors.py /tmp/h100.json --ceilings bench.json     # bench_runtime.py's record of the device

The activation operand stays in L2 in the profile's timing (the previous kernel just wrote it, as in the loop), so
an op whose bytes are mostly activations may come in under its byte floor (ratio < 1).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from phyai_ros.layers.selector import ProfileError, read_profile  # noqa: E402
from phyai_ros.runtime.op_costs import op_cost, parse_key  # noqa: E402
from phyai_ros.runtime.projection import H200_MEASURED  # noqa: E402

LOOPS = {50: "pi0.5 expert (50 rows)", 51: "pi0 expert (51 rows)", 41: "GR00T DiT (41 rows)"}
LAUNCH_MARGIN = 1.1


def rows_of(op: str, key: str) -> tuple[int, int]:
    """(batch, rows per item) of the op's first operand: attention [B, H, Lq, D] -> (B, Lq), others [B, T, W]."""
    x = parse_key(key)[0][0]
    if op in ("attention", "attention_with_prefix") and len(x) == 4:
        return x[0], x[2]
    return (x[0], x[1]) if len(x) == 3 else (1, x[0])


def best(entry: dict):
    timed = [(r["us"], name) for name, r in entry.items() if isinstance(r, dict) and r.get("ok")]
    return min(timed) if timed else None


def table(timings: dict, gemm_flops: float, copy_bandwidth: float, batch: int, loops: dict) -> str:
    everything = [b[0] for keys in timings.values() for entry in keys.values() if (b := best(entry))]
    launch = min(everything) if everything else 0.0
    out = [f"Launch floor (the fastest op of the profile): {launch:.2f} us. Ceilings: {gemm_flops / 1e12:.0f} TFLOP/s, "
           f"{copy_bandwidth / 1e12:.2f} TB/s.\n"]
    for rows, label in loops.items():
        lines = []
        for op in sorted(timings):
            for key in sorted(timings[op]):
                if rows_of(op, key) != (batch, rows) or (b := best(timings[op][key])) is None:
                    continue
                fields = key.split("|")   # shapes | dtype [| tag: a quantized scheme, the expert stack's form]
                shapes = fields[0] + (f" ({fields[2]})" if len(fields) > 2 else "")
                cost = op_cost(op, key)
                if cost is None:
                    lines.append(f"| `{op}` | {shapes} | `{b[1]}` | {b[0]:.2f} | — | — | — | — |")
                    continue
                floor, bound = cost.floor_us(gemm_flops, copy_bandwidth)
                mark = " (launch)" if b[0] <= LAUNCH_MARGIN * launch else ""
                lines.append(f"| `{op}` | {shapes} | `{b[1]}` | {b[0]:.2f}{mark} | {cost.bytes / 1e6:.2f} | "
                             f"{cost.flops / 1e9:.3f} | {floor:.2f} ({bound}) | {b[0] / floor:.1f}x |")
        if lines:
            out.append(f"{label}, batch {batch}:\n")
            out.append("| op | shapes | fastest | us | MB | GFLOP | floor us | x floor |")
            out.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
            out += lines + [""]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", type=Path)
    ap.add_argument("--signature", help="the device's table (default: the file's first)")
    ap.add_argument("--ceilings", type=Path, help="a bench_runtime.py record ('ceilings': gemm_tflops, copy_tbps)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rows", type=lambda t: [int(v) for v in t.split(",")], help="loops by rows per item")
    a = ap.parse_args()
    try:
        data = read_profile(a.profile)
    except ProfileError as exc:
        print(f"op_floors: {exc}", file=sys.stderr)
        return 2
    signature = a.signature or next(iter(data["timings"]), None)
    if signature not in data["timings"]:
        print(f"op_floors: {a.profile} has no timings for {signature}", file=sys.stderr)
        return 2
    if a.ceilings:
        c = json.loads(a.ceilings.read_text())
        c = c.get("result", {}).get("bench", c).get("ceilings", c.get("ceilings"))
        gemm, copy = c["gemm_tflops"] * 1e12, c["copy_tbps"] * 1e12
    elif "H200" in signature:
        gemm, copy = H200_MEASURED.peak["bf16"], H200_MEASURED.bandwidth
    else:
        print(f"op_floors: give --ceilings (a bench_runtime.py record made on {signature})", file=sys.stderr)
        return 2
    loops = {r: LOOPS.get(r, f"{r} rows") for r in a.rows} if a.rows else LOOPS
    print(f"{signature} ({a.profile}), batch {a.batch}\n")
    print(table(data["timings"][signature], gemm, copy, a.batch, loops))
    return 0


if __name__ == "__main__":
    sys.exit(main())
