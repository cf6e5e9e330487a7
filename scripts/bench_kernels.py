#!/usr/bin/env python3
"""Time the fused Triton kernels (phyai_ros.kernels) against their torch eager
equivalents at the real pi0.5 shapes, and print a table.

    python scripts/bench_kernels.py [--dtype bf16|fp16|fp32] [--sweep] [--no-graph]

Columns: median time from ``triton.testing.do_bench`` (L2 flushed before each
call), and -- unless --no-graph -- the median per-call time replayed inside a
CUDA graph (``do_bench_cudagraph``: warm L2, no launch overhead, closest to the
runtime's graph-replayed expert step).  GB/s is the fused kernel's minimum
DRAM traffic over its do_bench time.  --sweep also times a grid of launch
configs for the attention kernel.  Without CUDA it prints a message and exits 0.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def rope_sweep(torch, do_bench_cudagraph) -> int:
    """qkv_rope at pi0.5's expert (50 tokens) and prefix (968), GR00T's vision tower (256 patches, fp32 tables)
    and LLM (103 tokens, q / k norm): every rows-per-program x warps, the launch plan's choice marked."""
    from phyai_ros.kernels import rope
    cases = [("pi05 expert", 50, 8, 1, 256, False, torch.bfloat16), ("pi05 prefix", 968, 8, 1, 256, False, torch.bfloat16),
             ("groot vision", 256, 16, 16, 64, False, torch.float32), ("groot llm", 103, 16, 8, 128, True, torch.bfloat16)]
    for name, t, hq, hkv, d, norm, tables in cases:
        qkv = torch.randn(1, t, (hq + 2 * hkv) * d, device="cuda").bfloat16()
        ang = torch.randn(1, t, d // 2, device="cuda")
        cos, sin = (f(torch.cat([ang, ang], -1)).to(tables) for f in (torch.cos, torch.sin))
        qn, kn = (torch.ones(d, device="cuda").bfloat16() if norm else None for _ in range(2))
        block = max(16, triton_next_pow2(d // 2))
        plan = rope.rope_plan(t * (hq + hkv), block)
        res = []
        rows = 1
        while rows * block <= 16 * rope._TILE:
            for warps in (1, 2, 4, 8):
                fn = lambda r=rows, w=warps: rope.qkv_rope(qkv, cos, sin, hq, hkv, d, qn, kn, rows=r, num_warps=w)  # noqa: E731
                fn()
                us = do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3
                res.append((us, rows, warps))
            rows *= 2
        best = min(res)
        planned = [u for u, r, w in res if (r, w) == plan]
        print(f"rope {name:13} rows {t * (hq + hkv):5d}: plan {plan} {planned[0]:.2f} us; best {best[1:]} "
              f"{best[0]:.2f} us; one row per program: "
              + " ".join(f"w{w}={u:.2f}" for u, r, w in res if r == 1), flush=True)
        print("   " + " ".join(f"{r}x{w}={u:.2f}" for u, r, w in res), flush=True)
    return 0


# (name, rows, K, N, bias + GELU-tanh epilogue): the few-row GEMMs of GR00T's DiT block and the pi0.5 expert
GEMM_SWEEP_SHAPES = (("groot gelu up", 41, 1536, 6144, True), ("groot down", 41, 6144, 1536, False),
                     ("groot o-proj", 41, 1536, 1536, False), ("pi05 down", 50, 4096, 1024, False),
                     ("pi05 gate_up", 50, 1024, 8192, False))


def gemm_sweep(torch, do_bench_cudagraph, out_path: str) -> int:
    """The skinny GEMM (kernels/skinny_linear.py) over a grid of launch shapes at the loops' few-row GEMMs, each
    timed on cold weights: a CUDA graph of calls over as many distinct weight copies as outrun the L2 (the
    loops read every weight once per step), us per call. The library GEMM and the tilings the profile offers are
    in the same grid."""
    import itertools
    import json

    import torch.nn.functional as F
    from phyai_ros.kernels.skinny_linear import skinny_linear
    grid = [dict(block_n=bn, block_k=bk, num_warps=w, num_stages=st, splits=sp)
            for bn, bk, (w, st), sp in itertools.product((16, 32, 64), (64, 128, 256), ((4, 3), (4, 5), (8, 4)),
                                                         (1, 2, None))]
    results = {}
    for name, m, k, n, act in GEMM_SWEEP_SHAPES:
        x = torch.randn(m, k, device="cuda").bfloat16()
        bias = torch.randn(n, device="cuda").bfloat16() if act else None
        copies = max(2, min(16, -(-160 * 2**20 // (n * k * 2))))
        ws = [torch.randn(n, k, device="cuda").bfloat16() * 0.02 for _ in range(copies)]
        want = F.linear(x.float(), ws[0].float(), None if bias is None else bias.float())
        if act:
            want = F.gelu(want, approximate="tanh")

        def timed(fn):
            fn(ws[0])
            return do_bench_cudagraph(lambda: [fn(w) for w in ws], rep=25, return_mode="median") * 1e3 / copies

        rows = [("torch", timed(lambda w: F.gelu(F.linear(x, w, bias), approximate="tanh") if act
                                else F.linear(x, w)), 0.0)]
        for cfg in grid:
            try:
                fn = lambda w, c=cfg: skinny_linear(x, w, bias, "gelu_tanh" if act else None, **c)  # noqa: E731
                err = ((fn(ws[0]).float() - want).norm() / want.norm()).item()
                rows.append((json.dumps(cfg, sort_keys=True), timed(fn), err))
            except Exception as exc:  # noqa: BLE001 - a launch shape that does not fit is a result too
                rows.append((json.dumps(cfg, sort_keys=True), float("inf"), str(exc)[:80]))
        rows.sort(key=lambda r: r[1])
        results[name] = rows
        print(f"gemm {name} [{m}x{k}] x [{n}x{k}]^T, {copies} cold copies: torch "
              f"{next(u for c, u, e in rows if c == 'torch'):.2f} us", flush=True)
        for cfg, us, err in rows[:8]:
            print(f"   {us:7.2f} us  err {err}  {cfg}", flush=True)
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)
    return 0


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--sweep", action="store_true", help="sweep attention launch configs")
    ap.add_argument("--rope-sweep", action="store_true",
                    help="only: qkv_rope's rows per program x warps at the models' shapes (CUDA graph, us)")
    ap.add_argument("--gemm-sweep", default=None, metavar="JSON",
                    help="only: the skinny GEMM's launch shapes at the loops' few-row GEMMs, cold weights (JSON out)")
    ap.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph column")
    ap.add_argument("--rep", type=int, default=200, help="do_bench rep (ms)")
    args = ap.parse_args(argv)

    import torch
    if not torch.cuda.is_available():
        print("bench_kernels: no CUDA device here; nothing to time (run it on the GPU machine).")
        return 0
    os.environ.pop("TRITON_INTERPRET", None)
    try:
        from triton.testing import do_bench, do_bench_cudagraph
    except ImportError as e:
        print(f"bench_kernels: triton is not importable ({e}); nothing to time.")
        return 0
    import torch.nn.functional as F

    from phyai_ros.kernels import ada_rms_norm as ada
    from phyai_ros.kernels import geglu as gg
    from phyai_ros.kernels import rms_norm as rn
    from phyai_ros.kernels import split_kv_attention as ska

    if args.rope_sweep:
        return rope_sweep(torch, do_bench_cudagraph)
    if args.gemm_sweep:
        return gemm_sweep(torch, do_bench_cudagraph, args.gemm_sweep)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    es = torch.tensor([], dtype=dt).element_size()
    dev = "cuda"
    torch.manual_seed(0)

    def r(*s, scale=1.0):
        return (torch.randn(*s, device=dev) * scale).to(dt)

    def t_bench(fn):
        return do_bench(fn, warmup=25, rep=args.rep, return_mode="median") * 1e3  # us

    def t_graph(fn):
        if args.no_graph:
            return float("nan")
        try:
            return do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3
        except Exception as e:  # noqa: BLE001
            print(f"  (cuda graph timing failed: {type(e).__name__}: {e})")
            return float("nan")

    def t_host(fn, n=200):
        """Host (CPU) time to enqueue one call: what eager launching costs per op."""
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) / n * 1e6

    rows = []

    def case(name, fused, eager, nbytes, extra_eager=()):
        fused()
        eager()
        torch.cuda.synchronize()
        tf, te = t_bench(fused), t_bench(eager)
        gf, ge = t_graph(fused), t_graph(eager)
        hf, he = t_host(fused), t_host(eager)
        rows.append((name, tf, te, gf, ge, hf, he, nbytes / (gf * 1e-6) / 1e9))
        for ename, efn in extra_eager:
            efn()
            rows.append((f"  vs {ename}", tf, t_bench(efn), gf, t_graph(efn), hf, t_host(efn), float("nan")))

    # ---- RMSNorm (prefix LM) and fused residual add
    for nrows, w in [(968, 2048), (50, 1024)]:
        x, res, wt = r(nrows, w, scale=3), r(nrows, w, scale=8), r(w)
        case(f"rms_norm [{nrows}x{w}]", lambda: rn.rms_norm(x, wt), lambda: rn.rms_norm_ref(x, wt),
             2 * nrows * w * es)
        case(f"add_rms_norm [{nrows}x{w}]", lambda: rn.add_rms_norm(x, res, wt),
             lambda: rn.add_rms_norm_ref(x, res, wt), 4 * nrows * w * es)

    # ---- AdaRMSNorm (action expert) and fused gated residual
    for B in (1, 32):
        T, W = 50, 1024
        x, ysub = r(B * T, W, scale=3), r(B * T, W)
        scale, shift, gate = r(B, 3 * W, scale=0.5).chunk(3, dim=-1)
        case(f"ada_rms_norm [B={B}: {B * T}x{W}]", lambda: ada.ada_rms_norm(x, scale, shift, T),
             lambda: ada.ada_rms_norm_ref(x, scale, shift, T), 2 * B * T * W * es)
        case(f"gated_res_ada_rms [B={B}]", lambda: ada.gated_residual_ada_rms_norm(x, ysub, gate, scale, shift, T),
             lambda: ada.gated_residual_ada_rms_norm_ref(x, ysub, gate, scale, shift, T), 4 * B * T * W * es)

    # ---- GeGLU
    for nrows, m, tag in [(968, 16384, "LM"), (50, 4096, "expert B=1"), (1600, 4096, "expert B=32")]:
        gu = r(nrows, 2 * m, scale=2)

        def eager_geglu(gu=gu, m=m):
            return F.gelu(gu[:, :m], approximate="tanh") * gu[:, m:]
        case(f"geglu {tag} [{nrows}x{m}]", lambda gu=gu: gg.geglu(gu), eager_geglu, 3 * nrows * m * es)

    # ---- split-KV attention (action expert vs prefix cache + suffix)
    Hq, Lq, P, S, D = 8, 50, 968, 50, 256
    for B in (1, 4):
        q = r(B, Hq, Lq, D)
        kp, vp, ks, vs = r(B, 1, P, D), r(B, 1, P, D), r(B, 1, S, D), r(B, 1, S, D)
        valid = torch.ones(B, P + S, dtype=torch.bool, device=dev)
        valid[:, P - 40:P] = False
        m4 = valid[:, None, None, :]
        kc, vc = torch.cat([kp, ks], 2), torch.cat([vp, vs], 2)
        kx, vx = kc.expand(B, Hq, P + S, D), vc.expand(B, Hq, P + S, D)

        def sdpa_gqa():
            return F.scaled_dot_product_attention(q, kc, vc, attn_mask=m4, enable_gqa=True)

        def sdpa_expand():
            return F.scaled_dot_product_attention(q, kx, vx, attn_mask=m4)

        def cat_sdpa():
            k, v = torch.cat([kp, ks], 2), torch.cat([vp, vs], 2)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m4, enable_gqa=True)

        nbytes = (2 * B * (P + S) * D + 2 * B * Hq * Lq * D) * es
        case(f"split_kv_attn [B={B}] vs sdpa(gqa)", lambda: ska.split_kv_attention(q, kp, vp, ks, vs, valid),
             sdpa_gqa, nbytes, extra_eager=[("sdpa(expand)", sdpa_expand), ("cat+sdpa(gqa)", cat_sdpa)])

        if args.sweep:
            print(f"\nattention sweep, B={B} ({args.dtype}): block_m block_n warps stages splits "
                  "-> us per call in a CUDA graph")
            best = None
            for bm in (32, 64):
                for bn in (32, 64):
                    for nw in (4, 8):
                        for st in (None, 2, 3):
                            for ns in (None, 8, 16, 32):
                                kw = dict(block_m=bm, block_n=bn, num_warps=nw, num_splits=ns, num_stages=st)
                                try:
                                    ska.split_kv_attention(q, kp, vp, ks, vs, valid, **kw)
                                    t = do_bench_cudagraph(
                                        lambda: ska.split_kv_attention(q, kp, vp, ks, vs, valid, **kw),
                                        rep=20, return_mode="median") * 1e3
                                except Exception as e:  # noqa: BLE001 (out of shared memory, ...)
                                    print(f"  {bm:4d} {bn:4d} {nw:3d} {st!s:>5} {ns!s:>5} -> {type(e).__name__}")
                                    break
                                print(f"  {bm:4d} {bn:4d} {nw:3d} {st!s:>5} {ns!s:>5} -> {t:7.2f}")
                                if best is None or t < best[0]:
                                    best = (t, kw)
            print(f"  best: {best}\n")

    name = torch.cuda.get_device_name()
    print(f"\n{name}, {args.dtype}; times in us (median). fused = phyai_ros.kernels, eager = torch")
    hdr = (f"{'case':40s} {'fused':>7s} {'eager':>7s} {'spd':>6s} | {'fusedG':>7s} {'eagerG':>7s} {'spdG':>6s}"
           f" | {'hostF':>6s} {'hostE':>6s} | {'GB/s':>5s}")
    print(hdr)
    print("-" * len(hdr))
    for n, tf, te, gf, ge, hf, he, bw in rows:
        print(f"{n:40s} {tf:7.2f} {te:7.2f} {te / tf:5.2f}x | {gf:7.2f} {ge:7.2f} {ge / gf:5.2f}x"
              f" | {hf:6.1f} {he:6.1f} | {bw:5.0f}")
    print("fused/eager: do_bench median, L2 flushed (includes host launch cost when it exceeds the flush).\n"
          "fusedG/eagerG: median per call replayed in a CUDA graph (warm L2, no launch cost).\n"
          "hostF/hostE: host time to enqueue one call.  GB/s: fused minimum bytes / fusedG.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
