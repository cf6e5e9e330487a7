#!/usr/bin/env python3
"""The action expert's layer stack, every variant, on the GPU in one call: correctness, time per layer-step, the
denoising loop in the runner. One JSON with every figure goes to $OUT/bench_expert_layer.json (OUT defaults to
./out); a short table is printed last.

    python scripts/bench_expert_layer.py                      # all parts (about 6-7 minutes on an H200)
    python scripts/bench_expert_layer.py --parts check,time   # without the runner part
    python scripts/bench_expert_layer.py --variants kernels,step --batches 1,32
    python scripts/bench_expert_layer.py --smoke              # CPU, Triton's interpreter, toy sizes, fp32:
                                                              # the script's own flow, no figures

Variants: ``unfused`` (today's per-op path, with the device's operator profile) and every fused form the
selector offers for the ``expert_stack`` op (layers/expert_stack.py: the 5-kernel launch in several tilings,
one persistent kernel per layer, one per denoising step), plus ``step_nc`` (the step kernel without cooperative
launch). Each variant runs in its own try: a failure is recorded with its message and the others go on.

Parts:
  check   pi0.5's (50 tokens, adaRMS, 968 prefix keys) and pi0's (51 tokens, plain RMSNorm, 816 keys) real shapes,
          18 layers, batch 1, 2, 8, 32: fresh random inputs, the allocator poisoned with NaN before the eager call,
          then the call captured in a CUDA graph and replayed on new inputs with its output poisoned; against fp32
          with test_expert_layer_gpu.py's bound (1.25 x the error of the bf16-emulating reference + 2e-3).
  time    per variant, model and batch: a CUDA graph of 3 stack calls (18 layers of distinct weights, 623 MB:
          every layer's weights come from HBM, as in the model), median of 10 replays -> us per layer-step and
          ms per step; then a torch.profiler kernel list (names, durations) of one eager stack call of the
          fastest variant and of today's path at batch 1 ("timeline").
  runner  full-size random pi0.5 and pi0 (bench_runtime.py's checkpoints, written in the background during
          "check"), batch 1: chunk latency (inputs copied in, three graph replays) and the loop stage, with the
          expert stack forced to today's path and to the fused variants; the chunks' actions compared with today's.
--budget-s (default 450) stops starting new work past that many seconds (what was skipped is recorded).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
import types
from pathlib import Path

T0 = time.perf_counter()
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
SMOKE = "--smoke" in sys.argv
if SMOKE:   # before triton is first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from phyai_ros.kernels.candidates import expert_layer as el  # noqa: E402
from phyai_ros.layers import dispatch, ops  # noqa: E402,F401  (dispatch registers the ops' candidates)
from phyai_ros.layers import expert_stack as xs  # noqa: E402
from phyai_ros.layers.profiling import rel_err  # noqa: E402
from phyai_ros.layers.selector import SELECTOR  # noqa: E402
from phyai_ros.models.pi.modeling.suffix import SuffixContext  # noqa: E402

W, HQ, HKV, D, I, DEPTH = 1024, 8, 1, 256, 4096, 18
MODELS = {"pi05": dict(T=50, P=968, kind="ada"), "pi0": dict(T=51, P=816, kind="plain")}
DEVICE, DTYPE = "cuda", torch.bfloat16
if SMOKE:
    W, HQ, HKV, D, I, DEPTH = 64, 4, 1, 32, 96, 2
    MODELS = {"pi05": dict(T=5, P=23, kind="ada"), "pi0": dict(T=6, P=19, kind="plain")}
    DEVICE, DTYPE = "cpu", torch.float32
EPS = 1e-6


def elapsed() -> float:
    return time.perf_counter() - T0


# ----------------------------------------------------------------------------- variants
def variants(names=None) -> dict:
    """name -> fn(h, layers, kv, ctx, norms, eps): today's path and every fused form, without row limits."""
    out = {c.name: c.fn for c in xs.candidates()}
    out["step_nc"] = functools.partial(xs.fused, launch="step", tiling={"cooperative": False})
    order = ["unfused", "kernels", "step", "layer", "kernels_s1", "kernels_wide", "kernels_n16", "step_nc"]
    out = {k: out[k] for k in order + [k for k in out if k not in order]}   # most wanted first (the budget)
    return {k: v for k, v in out.items() if names is None or k in names}


# ----------------------------------------------------------------------------- operands
def model_weights(model: str):
    g = torch.Generator(device=DEVICE).manual_seed(1 if model == "pi0" else 0)
    r = lambda *s: (torch.randn(*s, generator=g, device=DEVICE) * 0.02).to(DTYPE)  # noqa: E731
    return [types.SimpleNamespace(qkv_w=r((HQ + 2 * HKV) * D, W), o_w=r(W, HQ * D), gate_up_w=r(2 * I, W),
                                  down_w=r(W, I)) for _ in range(DEPTH)]


def operands(model: str, batch: int, seed: int, layers):
    """(h, layers, kv, ctx, norms, eps) for one call: fresh activations, caches, mask / RoPE tables, norms."""
    spec = MODELS[model]
    t, p = spec["T"], spec["P"]
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    r = lambda *s, sc=1.0: torch.randn(*s, generator=g, device=DEVICE) * sc  # noqa: E731
    valid = p - p // 14 - (torch.arange(batch, device=DEVICE) * 7) % (p // 24 + 1)
    pad = torch.arange(p, device=DEVICE)[None] < valid[:, None]
    allowed = torch.cat([pad[:, None, :].expand(batch, t, p),
                         torch.ones(batch, t, t, dtype=torch.bool, device=DEVICE)], dim=2)
    if model == "pi0":
        allowed[:, 0, p + 1:] = False
    pos = valid[:, None] + torch.arange(t, device=DEVICE)[None]
    cos, sin = ops.rope_cos_sin(pos, 1.0 / (10000 ** (torch.arange(0, D, 2, device=DEVICE).float() / D)), DTYPE)
    kv = [(r(batch, HKV, p, D).to(DTYPE), r(batch, HKV, p, D).to(DTYPE)) for _ in range(DEPTH)]
    if spec["kind"] == "plain":
        norms = xs.ExpertNorms(weights=tuple(r(W, sc=0.3) for _ in range(2 * DEPTH + 1)))
    else:
        mod = r(1, 2 * DEPTH + 1, 3, 1, W, sc=0.3)
        mod[:, :, 2] += 1.0
        norms = xs.ExpertNorms(mod=mod)
    ctx = SuffixContext(ops.bool_to_additive_mask(allowed), cos, sin)
    return (r(batch, t, W).to(DTYPE), layers, kv, ctx, norms, EPS)


def refresh(static, fresh) -> None:
    """Copy a fresh call's inputs into a captured call's static tensors."""
    static[0].copy_(fresh[0])
    for (k, v), (k2, v2) in zip(static[2], fresh[2]):
        k.copy_(k2)
        v.copy_(v2)
    for dst, src in zip(static[4].rows(), fresh[4].rows()):
        for a, b in zip(dst or (), src or ()):
            a.copy_(b)


def stack_tensors(args, dtype=None):
    """expert_stack_ref's arguments from an op call's (fp32 copies with ``dtype``)."""
    h, layers, kv, ctx, norms, eps = args
    c = (lambda x: x.to(dtype)) if dtype else (lambda x: x)  # noqa: E731
    sc, sh, gt = norms.rows()
    return (c(h), [c(la.qkv_w) for la in layers], [c(la.o_w) for la in layers], [c(la.gate_up_w) for la in layers],
            [c(la.down_w) for la in layers], [c(k) for k, _ in kv], [c(v) for _, v in kv], ctx.mask, c(ctx.cos),
            c(ctx.sin), sc, sh, gt, eps)


def poison_allocator(nbytes: int) -> None:
    """Fill free cached memory with NaN, so that an output a kernel forgets to write shows."""
    if DEVICE == "cuda":
        x = torch.full((nbytes // 4,), float("nan"), device=DEVICE)
        del x


# ----------------------------------------------------------------------------- part 1: correctness
def references(args) -> tuple:
    """(fp32 result, bound): the fp32 reference and 1.25 x the bf16-emulating reference's error + 2e-3."""
    want = el.expert_stack_ref(*stack_tensors(args, torch.float32), HQ)
    return want, 1.25 * rel_err(el.expert_stack_ref(*stack_tensors(args), HQ), want) + 2e-3


def check(fn, args, fresh_args, refs) -> dict:
    """Eager on ``args`` (allocator poisoned), then captured and replayed on ``fresh_args`` copied in (output
    poisoned); refs: references() of both."""
    (want, bound), (want2, bound2) = refs
    poison_allocator(2 << 30)
    eager = fn(*args)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    res = {"eager_rel": rel_err(eager, want), "bound": bound, "finite": bool(torch.isfinite(eager).all())}
    if DEVICE != "cuda":   # the smoke run: the fresh inputs eagerly
        refresh(args, fresh_args)
        out = fn(*args)
        res.update(graph_rel=rel_err(out, want2), graph_bound=bound2, graph_finite=bool(torch.isfinite(out).all()))
        res["ok"] = bool(res["finite"] and res["graph_finite"] and res["eager_rel"] <= bound
                         and res["graph_rel"] <= bound2)
        return res
    # captured on the call's own tensors, replayed on fresh inputs copied in, the output poisoned first
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn(*args)
    refresh(args, fresh_args)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    res.update(graph_rel=rel_err(out, want2), graph_bound=bound2, graph_finite=bool(torch.isfinite(out).all()))
    res["ok"] = bool(res["finite"] and res["graph_finite"] and res["eager_rel"] <= bound
                     and res["graph_rel"] <= bound2)
    del g
    return res


# ----------------------------------------------------------------------------- part 2: timing
def graph_ms(fn, args, reps: int = 3, replays: int = 10) -> float:
    """Median ms of one call from a CUDA graph of ``reps`` calls on warm operands, the layer's steady state in
    the denoising loop (layers.profiling.graph_time_us times cold copies instead); the host clock in the smoke run."""
    if DEVICE != "cuda":
        fn(*args)
        t = time.perf_counter()
        for _ in range(reps):
            fn(*args)
        return 1e3 * (time.perf_counter() - t) / reps
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn(*args)
    g.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / reps)
    del g
    return statistics.median(times)


def timeline(fn, args) -> dict:
    """Kernels of one eager stack call (torch.profiler): per-kernel names and durations, and their sums per
    layer-step by name (durations are the GPU's; an eager call's gaps are the host's, so they are not kept)."""
    from torch.profiler import ProfilerActivity, profile
    fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    kernels = [(e.name, e.device_time) for e in prof.events() if e.device_type.name == "CUDA"
               and "memset" not in e.name.lower() and "memcpy" not in e.name.lower()]
    if len(kernels) == el.kernels_per_step("kernels", DEPTH):   # one kernel source: name them by phase
        phases = ["rows"] + ["qkv", "attention", "o_proj", "gate_up", "down"] * DEPTH + ["final"]
        kernels = [(f"{n} [{p}]", u) for (n, u), p in zip(kernels, phases)]
    per_name: dict = {}
    for name, us in kernels:
        per_name[name] = per_name.get(name, 0.0) + us / DEPTH
    return {"kernels_per_step": len(kernels), "kernel_us_sum_per_layer_step": sum(u for _, u in kernels) / DEPTH,
            "per_layer_step_by_name_us": dict(sorted(per_name.items(), key=lambda kv: -kv[1])),
            "kernels": [{"name": n[:120], "us": round(u, 2)} for n, u in kernels[:60]]}


# ----------------------------------------------------------------------------- part 3: the runner
def forced_selector(name: str):
    """The device's selector (its profile) with expert_stack's candidate ``name`` the default (any rows)."""
    sel = SELECTOR.derive()
    sel.candidates = dict(sel.candidates)
    if name == "unfused":
        sel.candidates["expert_stack"] = [c for c in sel.candidates["expert_stack"] if c.name == "unfused"]
    else:
        fn = variants([name])[name]
        chosen = dataclasses.replace(sel.candidates["expert_stack"][0], name=name, fn=fn, supports=xs.fits,
                                     profiled_only=False)
        sel.candidates["expert_stack"] = [chosen, sel.candidates["expert_stack"][-1]]
    return sel


def runner_part(model: str, ckpt: Path, names, res: dict, budget: float, iters: int) -> None:
    from call_timing import call_ms, flow_runner_inputs
    from phyai_ros.models.pi.pi0.checkpoint import load_pi0_checkpoint
    from phyai_ros.models.pi.pi05.checkpoint import load_pi05_checkpoint
    from phyai_ros.models.pi.runner import FlowRunner
    loader = load_pi0_checkpoint if model == "pi0" else load_pi05_checkpoint
    ck = loader(ckpt, device="cuda", dtype=torch.bfloat16)
    m, cfg = ck.model, ck.config
    images, masks, tokens, tmask, state, noise = flow_runner_inputs(cfg, 1, 3)
    base = None
    for name in names:
        if elapsed() > budget:
            res[name] = {"skipped": "time budget"}
            continue
        try:
            sel = forced_selector(name)
            with sel.active():
                runner = FlowRunner(m, cfg.num_steps, cfg.chunk_size, cfg.max_action_dim, use_graphs=True,
                                    state_dim=cfg.max_state_dim)
                t = time.perf_counter()
                bucket = runner.set_observation(images, masks, tokens, tmask, state)
                actions = runner.sample(bucket, noise).clone()
                capture_s = time.perf_counter() - t

                def chunk(r=runner):
                    return r.sample(r.set_observation(images, masks, tokens, tmask, state), noise)

                lat = call_ms(chunk, iters, warmup=5)
                loop = call_ms(bucket.loop.replay, 50, warmup=3)
            lat_sorted = sorted(lat)
            entry = {"chunk_median_ms": statistics.median(lat), "chunk_p99_ms": lat_sorted[int(0.99 * (len(lat) - 1))],
                     "loop_ms": statistics.median(loop), "warmup_capture_s": capture_s,
                     "disabled": sorted(str(d) for d in sel.disabled)}
            if base is None:
                base = actions
            else:
                entry["actions_rel_to_first"] = rel_err(actions, base.float())
            res[name] = entry
            print(f"runner {model} {name}: {entry}", flush=True)
            del runner, bucket
        except Exception as exc:  # noqa: BLE001 - record and go on
            res[name] = {"error": f"{type(exc).__name__}: {exc}"[:500], "trace": traceback.format_exc()[-1500:]}
        torch.cuda.empty_cache()
    del m
    torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="check,time,runner")
    ap.add_argument("--variants", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--models", default="pi05,pi0")
    ap.add_argument("--batches", default="1,32,2,8")
    ap.add_argument("--budget-s", type=float, default=450.0)
    ap.add_argument("--runner-reserve-s", type=float, default=110.0,
                    help="seconds of the budget kept for the runner part")
    ap.add_argument("--runner-iters", type=int, default=100)
    ap.add_argument("--ckpt-dir", type=Path, default=Path("/tmp"))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")) / "bench_expert_layer.json")
    ap.add_argument("--smoke", action="store_true", help="CPU, interpreter, toy sizes: the flow, no figures")
    args = ap.parse_args()
    if SMOKE:
        args.parts = ",".join(p for p in args.parts.split(",") if p != "runner")
        args.batches = "1,2"
    elif not torch.cuda.is_available():
        raise SystemExit("bench_expert_layer: needs a CUDA device")
    import triton
    from phyai_ros.layers.profiles import load_device_profile
    parts = set(args.parts.split(","))
    models = args.models.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    var = variants(args.variants.split(",") if args.variants else None)
    profile = load_device_profile(DEVICE)
    res = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (smoke)",
           "sms": torch.cuda.get_device_properties(0).multi_processor_count if DEVICE == "cuda" else 0,
           "torch": torch.__version__, "triton": triton.__version__, "date": time.strftime("%Y-%m-%d"),
           "profile": profile.describe(), "variants": list(var), "kernels_per_step": {
               k: el.kernels_per_step(k, DEPTH) for k in el.LAUNCHES},
           "check": {}, "time": {}, "timeline": {}, "runner": {}, "skipped": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        res["elapsed_s"] = elapsed()
        args.out.write_text(json.dumps(res, indent=1))

    writers = {}
    if "runner" in parts:   # full-size checkpoints, written while the checks run (they use the GPU briefly)
        for model in models:
            ck = args.ckpt_dir / f"bench_expert_{model}"
            if not (ck / "model.safetensors").is_file():
                writers[model] = subprocess.Popen(
                    [sys.executable, str(REPO / "scripts" / "bench_runtime.py"), "--model", model, "--checkpoint",
                     str(ck), "--checkpoint-only"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    # batch-major (1 and 32 first), checks before timings within a batch (the first checks compile the kernels
    # while the checkpoint writers still use the GPU; no writer runs while anything is timed). Past the
    # budget minus what the runner part needs, nothing new starts here.
    stop = args.budget_s - (args.runner_reserve_s if "runner" in parts else 0.0)
    layers = {model: model_weights(model) for model in models}
    for batch in batches:
        for part in ("check", "time"):
            if part not in parts:
                continue
            if part == "time":
                for w in writers.values():
                    w.wait()
            for model in models:
                a = operands(model, batch, seed=batch, layers=layers[model])
                fresh = operands(model, batch, seed=1000 + batch, layers=layers[model]) if part == "check" else None
                refs = (references(a), references(fresh)) if part == "check" else None
                for name, fn in var.items():
                    key = f"{model} b{batch} {name}"
                    if elapsed() > stop:
                        res["skipped"].append(f"{part} {key}")
                        continue
                    slot = res[part].setdefault(model, {}).setdefault(str(batch), {})
                    try:
                        if part == "check":
                            slot[name] = check(fn, a, fresh, refs)
                            a = operands(model, batch, seed=batch, layers=layers[model])   # check() changed them
                        else:
                            ms = graph_ms(fn, a)
                            slot[name] = {"ms_per_step": ms, "us_per_layer_step": 1e3 * ms / DEPTH}
                    except Exception as exc:  # noqa: BLE001 - record and go on
                        slot[name] = {"error": f"{type(exc).__name__}: {exc}"[:500],
                                      "trace": traceback.format_exc()[-1500:]}
                    print(f"{part} {key}: {slot[name]}", flush=True)
                    if DEVICE == "cuda":
                        torch.cuda.empty_cache()
                del a, fresh, refs
                save()
                if part == "time" and batch == 1 and elapsed() < stop and DEVICE == "cuda":
                    b1 = res["time"].get(model, {}).get("1", {})
                    timed = {n: v["ms_per_step"] for n, v in b1.items() if "ms_per_step" in v and n != "unfused"}
                    for name in ([min(timed, key=timed.get)] if timed else []) + ["unfused"]:
                        try:
                            res["timeline"].setdefault(model, {})[name] = timeline(
                                var[name], operands(model, 1, 5, layers[model]))
                        except Exception as exc:  # noqa: BLE001
                            res["timeline"].setdefault(model, {})[name] = {
                                "error": f"{type(exc).__name__}: {exc}"[:500]}
    del layers
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    save()

    if "runner" in parts:
        for model in models:
            if model in writers:
                out, _ = writers[model].communicate()
                res["runner"].setdefault(model, {})["checkpoint_log"] = out[-500:]
            if elapsed() > args.budget_s:
                res["skipped"].append(f"runner {model}")
                continue
            b1 = res["time"].get(model, {}).get("1", {})
            timed = sorted((v["ms_per_step"], n) for n, v in b1.items() if "ms_per_step" in v and n != "unfused")
            names = ["unfused"] + [n for _, n in timed[:3]] + (["kernels"] if "kernels" in var and
                                                               "kernels" not in [n for _, n in timed[:3]] else [])
            try:
                runner_part(model, args.ckpt_dir / f"bench_expert_{model}", names,
                            res["runner"].setdefault(model, {}), args.budget_s, args.runner_iters)
            except Exception as exc:  # noqa: BLE001
                res["runner"].setdefault(model, {})["error"] = f"{type(exc).__name__}: {exc}"[:500]
            save()
    save()

    # ------------------------------------------------------------------ the table
    print(f"\nexpert stack on {res['device']} ({res['sms']} SMs), {DEPTH} layers; {res['profile']}")
    print(f"{'model':5} {'B':>3} {'variant':13} {'check':>6} {'rel err':>8} {'bound':>7} {'us/layer-step':>14} "
          f"{'ms/step':>8}")
    for model in models:
        for batch in batches:
            for name in var:
                c = res["check"].get(model, {}).get(str(batch), {}).get(name, {})
                t = res["time"].get(model, {}).get(str(batch), {}).get(name, {})
                ok = "ok" if c.get("ok") else ("ERR" if "error" in c else ("FAIL" if c else "-"))
                err = f"{c['graph_rel']:.2e}" if "graph_rel" in c else "-"
                bnd = f"{c['graph_bound']:.1e}" if "graph_bound" in c else "-"
                us = f"{t['us_per_layer_step']:.1f}" if "us_per_layer_step" in t else ("ERR" if "error" in t else "-")
                ms = f"{t['ms_per_step']:.3f}" if "ms_per_step" in t else "-"
                print(f"{model:5} {batch:>3} {name:13} {ok:>6} {err:>8} {bnd:>7} {us:>14} {ms:>8}")
    for model, entries in res["runner"].items():
        for name, e in entries.items():
            if isinstance(e, dict) and "chunk_median_ms" in e:
                print(f"runner {model:5} {name:13} chunk {e['chunk_median_ms']:.2f} ms (p99 {e['chunk_p99_ms']:.2f})"
                      f"  loop {e['loop_ms']:.2f} ms")
    print(f"skipped: {res['skipped'] or 'nothing'}; {elapsed():.0f} s; JSON: {args.out}")


if __name__ == "__main__":
    main()
