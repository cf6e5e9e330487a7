"""Each op's floor from its profile key: the bytes it must move and the FLOPs it must do, whichever takes longer.

A profile's timings (``layers.profiling``: each candidate in a CUDA graph of back-to-back calls with its weights
out of L2) are per-op measurements of the loops; held against the op's own floor they say which op is far from
it and whether bytes or FLOPs bound it, before any fusion is tried. "Logical" as in ``runtime/roofline.py``: every
operand read once and every output written once in the key's dtype (norm weights and biases included, masks
and RoPE tables not: a kernel may compute them), 2 FLOPs per multiply-add, attention over every (query, key)
pair the shapes carry. The floor is max(bytes / copy bandwidth, FLOPs / GEMM rate) at a device's *measured*
ceilings (``scripts/bench_runtime.py``'s: a 4 GiB copy, an 8192^3 bf16 GEMM), so an op at its floor is as fast as
the device moves memory or multiplies at all.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class OpCost:
    bytes: float
    flops: float

    def floor_us(self, gemm_flops: float, copy_bandwidth: float) -> tuple[float, str]:
        """(microseconds, "bytes" or "FLOPs": which bound)."""
        t_bytes, t_flops = self.bytes / copy_bandwidth, self.flops / gemm_flops
        return 1e6 * max(t_bytes, t_flops), "bytes" if t_bytes >= t_flops else "FLOPs"


def parse_key(key: str) -> tuple[list, int]:
    """'1x50x1024,2560x1024|bfloat16[|tag]' -> ([(1, 50, 1024), (2560, 1024)], 2 bytes per element)."""
    dims, dtype = key.split("|")[:2]
    return [tuple(int(d) for d in part.split("x")) for part in dims.split(",")], ELEMENT_BYTES[dtype]


def _rows(shape: tuple) -> int:
    n = 1
    for d in shape[:-1]:
        n *= d
    return n


def op_cost(op: str, key: str) -> Optional[OpCost]:
    """The op's logical bytes and FLOPs at the key's shapes, or None for an op this model does not cover (composite
    ops, quantized ones: their bytes depend on the scheme)."""
    try:
        shapes, e = parse_key(key)
    except (KeyError, ValueError):
        return None
    x = shapes[0]
    m, k = _rows(x), x[-1]
    if op in ("linear", "linear_gelu_tanh", "linear_geglu", "linear_add_rms_norm", "linear_gated_ada_rms_norm",
              "linear_add_layer_norm"):
        n = shapes[1][0]
        out = m * n // 2 if op == "linear_geglu" else m * n
        extra = {"linear": 0, "linear_gelu_tanh": n,                       # bias
                 "linear_geglu": 0,
                 "linear_add_rms_norm": 2 * m * n + n,                     # residual in, residual out, norm weight
                 "linear_gated_ada_rms_norm": 2 * m * n + 3 * n * x[0],   # h in, h out; gate / scale / shift per item
                 "linear_add_layer_norm": 2 * m * n + 3 * n}[op]          # h in, h out; bias, LN weight and bias
        return OpCost(e * (m * k + n * k + out + extra), 2.0 * m * n * k)
    w = k
    elementwise = {"rms_norm": 2 * m * w + w, "add_rms_norm": 4 * m * w + w, "layer_norm": 2 * m * w + 2 * w,
                   "ada_rms_norm": 2 * m * w + 2 * w * x[0], "gated_ada_rms_norm": 4 * m * w + 3 * w * x[0],
                   "geglu": m * w + m * w // 2, "swiglu": m * w + m * w // 2,
                   "qkv_rope": 2 * m * w, "qkv_norm_rope": 2 * m * w}
    if op in elementwise:
        return OpCost(e * elementwise[op], 0.0)
    if op in ("attention", "attention_with_prefix"):
        (b, h, lq, d), (_, hkv, lk, _) = shapes[0], shapes[1]
        keys = lk + (lq if op == "attention_with_prefix" else 0)            # the suffix's own keys too
        kv = 2 * b * hkv * keys * d
        return OpCost(e * (2 * b * h * lq * d + kv), 4.0 * b * h * lq * keys * d)
    if op == "rope_attention_with_prefix":
        (b, t, c), (_, hkv, lk, d) = shapes[0], shapes[1]
        h = c // d - 2 * hkv
        return OpCost(e * (b * t * c + 2 * b * hkv * lk * d + b * h * t * d), 4.0 * b * h * t * (lk + t) * d)
    return None
