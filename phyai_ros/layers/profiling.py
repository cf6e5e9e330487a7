"""Timing core of the operator profile: which usable candidate is fastest, and correct, per (op, shape).

``record`` runs a model through a selector and keeps the arguments of the first call of every (op, shape key);
``profile_calls`` times each usable candidate on them and keeps the fastest whose output matches the op's
reference. On CUDA a candidate is timed inside a CUDA graph (what the runner replays), with its large operands
(weights, KV caches) in enough copies that every call streams them from memory, as in the model; on the CPU with
the host clock (the CPU mostly has one usable candidate per op: nothing to choose, nothing timed). Used by
``scripts/profile_ops.py`` (a full profile, many repeats) and by the node's ``model.op_autotune`` (the ops its
warm-up called, few repeats).
"""
from __future__ import annotations

import copy
import statistics
import time
from typing import Callable, Optional

import torch

from phyai_ros.layers.ops import MASK_VALUE
from phyai_ros.layers.quantized import QuantizedWeight
from phyai_ros.layers.selector import OperatorSelector, device_signature

COLD_BYTES = 256 * 1024  # operands at least this large (weights, KV caches) are timed out of L2
MAX_COPIES = 256
ATTENTION_OPS = ("attention", "attention_with_prefix", "rope_attention_with_prefix")
# Ops built from fused ops (their reference runs those, each as chosen): profiled after every other op.
# A whole expert stack (18 layers in bf16) is ~1e-2 (relative) from fp32, and two bf16 orders of rounding
# ~1.5e-2 from each other (CPU, random full-size weights): its error is held to 4e-2, not the per-op bound.
COMPOSITE_OPS = {"expert_stack": 4e-2}
FP32_TOLERANCE = 1e-4   # relative error a candidate may have at a float32 key, whatever the bf16 tolerance


def cold_arg_sets(args: tuple) -> list:
    """Argument tuples for successive calls. Every tensor operand after the first (the activation, which the
    previous kernel just wrote) of at least COLD_BYTES comes in enough copies that a round through them spans
    twice the L2 cache: each call then reads its weights from HBM, as in the model, where a layer's weights
    are long evicted when the next denoising step reaches it. Timing one weight over and over would measure
    L2 and favour the launch shapes that hide HBM latency worst."""
    big = [i for i, a in enumerate(args) if i > 0 and _nbytes(a) >= COLD_BYTES and _device(a).type == "cuda"]
    if not big:
        return [args]
    l2 = getattr(torch.cuda.get_device_properties(_device(args[big[0]])), "L2_cache_size", 50 * 2 ** 20)
    size = sum(_nbytes(args[i]) for i in big)
    copies = min(MAX_COPIES, max(1, -(-2 * l2 // size)))
    sets = [args]
    for _ in range(copies - 1):
        sets.append(tuple(_copy(a) if i in big else a for i, a in enumerate(args)))
    return sets


def _nbytes(a) -> int:
    """Bytes of a tensor operand, or of a quantized weight's tensors (values and scales)."""
    if isinstance(a, torch.Tensor):
        return a.numel() * a.element_size()
    if isinstance(a, QuantizedWeight):   # its stored tensors: a dense copy is another candidate's operand
        return sum(t.numel() * t.element_size() for name, t in a.named_buffers() if name != "dense")
    return 0


def _device(a) -> torch.device:
    return a.device if isinstance(a, torch.Tensor) else a.q.device


def _copy(a):
    return a.clone() if isinstance(a, torch.Tensor) else copy.deepcopy(a)


def graph_time_us(fn, args: tuple = (), kwargs: Optional[dict] = None, reps: int = 20, replays: int = 7) -> float:
    """Median microseconds of one call fn(*args, **kwargs) replayed from a CUDA graph of at least `reps` calls
    (one per copy of its large operands, see cold_arg_sets), over `replays` replays."""
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
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(1e3 * a.elapsed_time(b) / reps)
    return statistics.median(times)


def host_time_us(fn, args: tuple = (), kwargs: Optional[dict] = None, reps: int = 20, replays: int = 7) -> float:
    """Median microseconds of one call on the host clock (CPU tensors): `replays` rounds of `reps` calls."""
    kwargs = kwargs or {}
    fn(*args, **kwargs)
    times = []
    for _ in range(replays):
        t = time.perf_counter()
        for _ in range(reps):
            fn(*args, **kwargs)
        times.append(1e6 * (time.perf_counter() - t) / reps)
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


def valid_query_rows(op: str, args: tuple):
    """[B, 1, Lq, 1] float mask of attention queries with at least one allowed key, or None."""
    mask = args[-1] if op in ATTENTION_OPS else None
    if mask is None or mask.dtype == torch.bool:
        return None if mask is None else mask.any(-1, keepdim=True).float()
    return (mask > MASK_VALUE / 2).any(-1, keepdim=True).float()


def reference(selector: OperatorSelector, op: str, args: tuple, kwargs: dict, candidate=None):
    """The op's reference candidate (its last: "torch", or "unfused" for a fused op), or ``candidate`` itself
    (one with ``own_reference``), with every sub-op on torch (the selector active and forced to torch)."""
    forced, selector.forced = selector.forced, "torch"
    try:
        with selector.active():
            return (candidate or selector.candidates[op][-1]).fn(*args, **kwargs)
    finally:
        selector.forced = forced


def record(selector: OperatorSelector, run: Callable[[], object], extra: tuple = ()) -> dict:
    """(op, key) -> (args, kwargs) of the first call of every op that ``run()`` dispatches through ``selector``
    (active for it): once as the selector chooses, then with every op on its reference, so the sub-ops of fused
    ops ("unfused": their GEMM and elementwise op one by one) are recorded and profiled too; then once forced to
    each name of ``extra`` (a candidate some ops have, e.g. quantized linears' "dense", whose sub-ops are to be
    profiled too)."""
    forced = selector.forced
    selector.recording = {}
    try:
        with selector.active():
            for f in (forced, "unfused", *extra):
                selector.forced = f
                run()
        return selector.recording
    finally:
        selector.forced, selector.recording = forced, None


def usable_for(selector: OperatorSelector, op: str, key: str, device: torch.device, args: tuple) -> list:
    """The candidates that can take this call here (usable on the device and accepting the arguments)."""
    return [c for c in selector.usable(op, key, device) if c.supports is None or c.supports(*args)]


def profile_calls(selector: OperatorSelector, calls: dict, device, tolerance: float = 2e-2, reps: int = 20,
                  replays: int = 7, time_single: bool = True, report: Optional[Callable] = None,
                  select: Optional[Callable] = None, deadline: Optional[float] = None,
                  priority: Optional[Callable] = None):
    """Time every usable candidate of every recorded call and keep the fastest whose output is within
    ``tolerance`` (relative) of the reference. Returns (table, timings): {op: {key: name}} and
    {op: {key: {name: {"us", "rel_err", "ok"} or "failed: ..."}}}. Each choice goes into the selector's profile
    for this device as soon as it is made: ops run in name order, so the sub-ops (linear, geglu, *_rms_norm)
    are chosen before the fused linear_* ops, whose "unfused" candidate is then timed with its sub-ops'
    choices, the quantized q* ops (whose "dense" candidate runs the bf16 ops) after those, and COMPOSITE_OPS (the
    expert stack, built from those) come last. time_single False: a call with one usable candidate is not timed
    (nothing to choose); it is listed in timings as {name: "only candidate"}. A candidate with ``own_reference``
    is checked against itself on torch sub-ops instead of the op's reference.
    report(op, key, timings of the key, chosen name or None): progress. select(op, key, usable candidates) ->
    the ones to time (a shortlist; default all). deadline (``time.perf_counter()`` seconds): calls not begun by
    then are left out of both tables (the defaults run for them). priority(op, key) -> a number: under a deadline,
    calls of higher priority first (COMPOSITE_OPS still last; a fused op tuned before its sub-ops times its
    "unfused" candidate on their defaults)."""
    device = torch.device(device)
    signature = device_signature(device)
    timer = graph_time_us if device.type == "cuda" else host_time_us
    table, timings = {}, {}
    with selector.active():
        order = sorted(calls.items(), key=lambda item: (item[0][0] in COMPOSITE_OPS, item[0]))
        if priority is not None:   # stable: name order among equals
            order.sort(key=lambda item: (item[0][0] in COMPOSITE_OPS, -priority(*item[0])))
        for (op, key), (a, kw) in order:
            if deadline is not None and time.perf_counter() > deadline:
                break
            cands = usable_for(selector, op, key, device, a)
            if select is not None and len(cands) > 1:
                cands = select(op, key, cands)
            entry = timings.setdefault(op, {}).setdefault(key, {})
            best = None
            if len(cands) == 1 and not time_single:
                entry[cands[0].name] = "only candidate"
            else:
                ref = reference(selector, op, a, kw)
                rows = valid_query_rows(op, a)
                # fp32 runs are parity runs (predict --dtype float32, the fp32 GPU tests): a candidate within
                # bf16's bound of the reference would break them; fp32 kernels sit ~1e-6 from torch's.
                bound = FP32_TOLERANCE if key.split("|")[1:2] == ["float32"] else \
                    max(tolerance, COMPOSITE_OPS.get(op, 0.0))
                for c in cands:
                    try:
                        own = reference(selector, op, a, kw, c) if c.own_reference else ref
                        err = rel_err(c.fn(*a, **kw), own, rows)
                        us = timer(c.fn, a, kw, reps=reps, replays=replays)
                    except Exception as exc:  # a candidate that cannot run here is simply not chosen
                        entry[c.name] = f"failed: {exc}"[:200]
                        continue
                    ok = err <= bound
                    entry[c.name] = {"us": round(us, 2), "rel_err": err, "ok": ok}
                    if ok and (best is None or us < best[1]):
                        best = (c.name, us)
            if best:
                table.setdefault(op, {})[key] = best[0]
                selector.profile.setdefault(signature, {}).setdefault(op, {})[key] = best[0]
            if report is not None:
                report(op, key, entry, best[0] if best else None)
    return table, timings
