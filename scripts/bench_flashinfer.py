#!/usr/bin/env python3
"""Per-call times of flashinfer's attention candidate against the project's Triton kernels, torch SDPA and the
reference, at the pi0.5 shapes, each timed inside a CUDA graph as scripts/profile_ops.py times candidates
(phyai_ros.layers.profiling.graph_time_us: KV caches in enough copies to be read from HBM).

    python scripts/bench_flashinfer.py [--batch 1 --batch 4] [--reps 20 --replays 7]

Why a script of its own: profile_ops times each op's candidates, and the expert attention op
(attention_with_prefix) has no SDPA candidate; here SDPA runs on the concatenated K / V (the concatenation
timed with it, as the op would need it). Rows: expert = 50 action queries (8 q heads, 1 kv head, head dim 256)
over 968 prefix + 50 suffix keys with the suffix mask (one camera missing for batch items > 0); prefix = the
968 x 968 self-attention with its padding mask. "flashinfer, no mask" is the kernel alone (mask None: not the
op, a lower bound showing what mapping the mask costs per call). err = relative error vs the fp32 reference over
the rows that may attend (as profile_ops checks). Without CUDA or flashinfer it says so and exits 0.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402


def inputs(kind: str, b: int, dev):
    from phyai_ros.layers import ops
    from phyai_ros.models.pi.modeling.suffix import suffix_context
    p, d = 3 * 256 + 200, 256
    pad = torch.zeros(b, p, dtype=torch.bool, device=dev)
    pad[:, :3 * 256] = True
    pad[1:, 256:512] = False
    pad[:, 3 * 256:3 * 256 + 40] = True
    r = lambda *s: torch.randn(*s, device=dev).to(torch.bfloat16)  # noqa: E731
    if kind == "prefix":
        return (r(b, 8, p, d), r(b, 1, p, d), r(b, 1, p, d),
                ops.bool_to_additive_mask(pad[:, :, None] & pad[:, None, :]))
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2, device=dev).float() / d)
    mask = suffix_context(pad, 50, 0, inv, torch.bfloat16).mask
    return r(b, 8, 50, d), r(b, 1, p, d), r(b, 1, p, d), r(b, 1, 50, d), r(b, 1, 50, d), mask


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, action="append", help="batch sizes (default 1 and 4)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--replays", type=int, default=7)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_flashinfer: no CUDA device here; nothing to time.")
        return 0
    from phyai_ros.layers import dispatch, ops
    from phyai_ros.layers import flashinfer_backend as fb
    from phyai_ros.layers.profiling import graph_time_us, rel_err, valid_query_rows
    if not fb.available():
        print("bench_flashinfer: flashinfer is not installed (or PHYAI_FLASHINFER=0); nothing to compare.")
        return 0
    dev = torch.device("cuda")
    sel = dispatch.SELECTOR
    print(f"{torch.cuda.get_device_name(dev)}; per call, CUDA graph of >= {args.reps} calls, median of "
          f"{args.replays} replays")
    for kind in ("expert", "prefix"):
        op = "attention_with_prefix" if kind == "expert" else "attention"
        for b in args.batch or [1, 4]:
            a = inputs(kind, b, dev)
            cat = (lambda q, kp, vp, ks, vs, m: (q, torch.cat([kp, ks], 2), torch.cat([vp, vs], 2), m)) \
                if kind == "expert" else (lambda *x: x)
            ref = ops.attention(*(t.float() if t.dtype == torch.bfloat16 else t for t in cat(*a)))
            rows = valid_query_rows(op, a)
            fns = {c.name: c.fn for c in sel.candidates[op]
                   if (c.supports is None or c.supports(*a)) and c.available() and c.name != "torch"}
            fns["sdpa"] = lambda *x: dispatch.sdpa(*cat(*x))
            fns["torch (reference op)"] = sel.candidates[op][-1].fn
            fi = fb.attention_with_prefix if kind == "expert" else fb.attention
            fns["flashinfer, no mask"] = lambda *x: fi(*x[:-1], None)
            print(f"\n{kind} attention, batch {b}: q {tuple(a[0].shape)}, keys {cat(*a)[1].shape[2]}")
            for name, fn in fns.items():
                try:
                    err = "-" if name.endswith("no mask") else f"{rel_err(fn(*a), ref, rows):.1e}"
                    us = graph_time_us(fn, a, reps=args.reps, replays=args.replays)
                except Exception as exc:  # a candidate that cannot run here: shown, not fatal
                    print(f"  {name:24} failed: {str(exc)[:120]}")
                    continue
                print(f"  {name:24} {us:8.1f} us   err {err}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
