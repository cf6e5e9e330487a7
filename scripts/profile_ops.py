#!/usr/bin/env python3
"""Write the per-device operator profile that the runner's selector reads.

Runs the model once to record every (op, shape) the layers dispatch, then times
each usable candidate for each of them inside a CUDA graph (what the runner
replays), checks each of its outputs against the torch candidate, and keeps the
fastest correct one. Ops are timed whole on the recorded inputs: the SigLIP
residual + LayerNorm op includes its GEMM, so the fused candidate's bias-free
GEMM is weighed against the eager GEMM with its bias epilogue. Run it on the
target (Jetson Thor, or the H200 for benchmarks):

    python scripts/profile_ops.py --checkpoint DIR --tokenizer FILE --out profiles/thor.json
    PHYAI_OP_PROFILE=profiles/thor.json  (or node parameter model.op_profile)

Without --checkpoint a random full-size pi0.5 is built in memory; give --checkpoint once per model
(pi0.5 and pi0 differ in prompt length and suffix rows, hence in shapes) to profile both into one file.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from phyai_ros.layers.ops import MASK_VALUE  # noqa: E402
from phyai_ros.layers.selector import SELECTOR, device_signature  # noqa: E402


COLD_BYTES = 256 * 1024  # operands at least this large (weights, KV caches) are timed out of L2
MAX_COPIES = 256


def cold_arg_sets(args: tuple) -> list:
    """Argument tuples for successive calls. Every tensor operand after the first (the activation, which the
    previous kernel just wrote) of at least COLD_BYTES comes in enough copies that a round through them spans
    twice the L2 cache: each call then reads its weights from HBM, as in the model, where a layer's weights
    are long evicted when the next denoising step reaches it. Timing one weight over and over would measure
    L2 and favour the launch shapes that hide HBM latency worst."""
    big = [i for i, a in enumerate(args) if i > 0 and isinstance(a, torch.Tensor) and a.is_cuda
           and a.numel() * a.element_size() >= COLD_BYTES]
    if not big:
        return [args]
    l2 = getattr(torch.cuda.get_device_properties(args[big[0]].device), "L2_cache_size", 50 * 2 ** 20)
    size = sum(args[i].numel() * args[i].element_size() for i in big)
    copies = min(MAX_COPIES, max(1, -(-2 * l2 // size)))
    sets = [args]
    for _ in range(copies - 1):
        sets.append(tuple(a.clone() if i in big else a for i, a in enumerate(args)))
    return sets


def graph_time_us(fn, args: tuple = (), kwargs: dict | None = None, reps: int = 20) -> float:
    """Median microseconds of one call fn(*args, **kwargs) replayed from a CUDA graph of at least `reps` calls
    (one per copy of its large operands, see cold_arg_sets)."""
    kwargs = kwargs or {}
    sets = cold_arg_sets(tuple(args))
    reps = max(reps, len(sets))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(*args, **kwargs)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            fn(*sets[i % len(sets)], **kwargs)
    times = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(1e3 * a.elapsed_time(b) / reps)
    return statistics.median(times)


def rel_err(a, b, rows=None) -> float:
    """Relative error, the largest over an op's outputs; for attention only over query rows that may attend
    somewhere (rows of fully masked queries are padding whose values nothing reads, and candidates
    legitimately differ there)."""
    if isinstance(a, tuple):
        return max(rel_err(x, y, rows) for x, y in zip(a, b))
    a, b = a.float(), b.float()
    if rows is not None:
        a, b = a * rows, b * rows
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def reference(op: str, args: tuple, kwargs: dict):
    """The op's reference candidate (its last: "torch", or "unfused" for a fused op) with every sub-op on torch."""
    forced, SELECTOR.forced = SELECTOR.forced, "torch"
    try:
        return SELECTOR.candidates[op][-1].fn(*args, **kwargs)
    finally:
        SELECTOR.forced = forced


def valid_query_rows(op: str, args: tuple):
    """[B, 1, Lq, 1] float mask of attention queries with at least one allowed key, or None."""
    mask = args[-1] if op in ("attention", "attention_with_prefix", "rope_attention_with_prefix") else None
    if mask is None or mask.dtype == torch.bool:
        return None if mask is None else mask.any(-1, keepdim=True).float()
    return (mask > MASK_VALUE / 2).any(-1, keepdim=True).float()


def record_model_calls(args) -> dict:
    """Every (op, shape) the models dispatch over one observation and one chunk: each --checkpoint (pi0.5
    or pi0, by its config.json) or, without one, a random full-size pi0.5 built in memory."""
    rec = {}
    for ckpt in args.checkpoint or [None]:
        model, cfg = load_model(ckpt, args.tokenizer)
        rec.update(record_calls(model, cfg, args.batch, args.cameras))
        del model
        torch.cuda.empty_cache()
    return rec


def load_model(ckpt, tokenizer):
    from phyai_ros.models import pi0, pi05
    from phyai_ros.models.pi05.checkpoint import make_random_model
    if ckpt is None:
        cfg = pi05.Pi05Config()
        return make_random_model(cfg, seed=0, std=0.02, dtype=torch.bfloat16, device="cuda"), cfg
    policy_cls = pi0.Pi0Policy if json.loads((ckpt / "config.json").read_text()).get("type") == "pi0" \
        else pi05.Pi05Policy
    stats = ckpt / "norm_stats.json"
    policy = policy_cls.from_files(ckpt, tokenizer, stats if stats.is_file() else None, device="cuda",
                                   dtype=torch.bfloat16)
    return policy.model, policy.config


def record_calls(model, cfg, b: int, s: int) -> dict:
    from phyai_ros.runtime.runner import FlowRunner
    runner = FlowRunner(model, cfg.num_steps, cfg.chunk_size, cfg.max_action_dim, use_graphs=False,
                        state_dim=cfg.max_state_dim)
    images = torch.rand(b, s, 3, 224, 224, device="cuda") * 2 - 1
    masks = torch.ones(b, s, dtype=torch.bool, device="cuda")
    tokens = torch.randint(0, 1000, (b, cfg.token_budget), device="cuda")
    tmask = torch.arange(cfg.token_budget, device="cuda")[None].expand(b, -1) < min(40, cfg.token_budget)
    state = torch.randn(b, cfg.max_state_dim, device="cuda")
    noise = torch.randn(b, cfg.chunk_size, cfg.max_action_dim, device="cuda")
    SELECTOR.recording = {}
    # Twice: as chosen by default, then with every op on its reference, so the sub-ops of fused ops
    # ("unfused": their GEMM and elementwise op one by one) are recorded and profiled too.
    for forced in (None, "unfused"):
        SELECTOR.forced = forced
        runner.sample(runner.set_observation(images, masks, tokens, tmask, state), noise)
    SELECTOR.forced = None
    torch.cuda.synchronize()
    rec, SELECTOR.recording = SELECTOR.recording, None
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, action="append",
                    help="a pi0.5 or pi0 checkpoint folder; repeat to profile both models into one file")
    ap.add_argument("--tokenizer", type=Path)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--cameras", type=int, default=3)
    ap.add_argument("--tolerance", type=float, default=2e-2, help="largest relative error vs torch (bf16)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_ops: needs a CUDA device")
    device = torch.device("cuda")
    signature = device_signature(device)
    calls = record_model_calls(args)
    table, timings = {}, {}
    for (op, key), (a, kw) in sorted(calls.items()):
        ref = reference(op, a, kw)
        best = None
        for c in SELECTOR.usable(op, key, device):
            if c.supports is not None and not c.supports(*a):
                continue  # e.g. the skinny GEMMs at the prefix's 816 rows
            try:
                out = c.fn(*a, **kw)
                err = rel_err(out, ref, valid_query_rows(op, a))
                us = graph_time_us(c.fn, a, kw)
            except Exception as exc:  # a candidate that cannot run here is simply not chosen
                timings.setdefault(op, {}).setdefault(key, {})[c.name] = f"failed: {exc}"[:200]
                continue
            ok = err <= args.tolerance
            timings.setdefault(op, {}).setdefault(key, {})[c.name] = {"us": round(us, 2), "rel_err": err, "ok": ok}
            if ok and (best is None or us < best[1]):
                best = (c.name, us)
        if best:
            table.setdefault(op, {})[key] = best[0]
            # Ops run in name order, sub-ops (linear, geglu, *_rms_norm) before the fused linear_* ops,
            # whose "unfused" candidate is then timed with its sub-ops' choices.
            SELECTOR.profile.setdefault(signature, {}).setdefault(op, {})[key] = best[0]
        print(f"{op:22} {key:45} " + "  ".join(
            f"{n}={v['us']:.1f}us" if isinstance(v, dict) else f"{n}=x" for n, v in timings[op][key].items())
            + f"  -> {best[0] if best else '-'}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"devices": {signature: table}, "timings": {signature: timings}}, indent=1))
    print(f"profile for {signature} written to {args.out}")


if __name__ == "__main__":
    main()
