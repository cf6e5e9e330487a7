"""flashinfer as an optional operator backend: profiled-only candidates named "flashinfer" for the selector.

Offered (``candidates()``, inserted by registry.register before each op's reference): ``attention_with_prefix`` (the
action expert's queries over [prefix KV cache; suffix]), ``attention`` (the prefix self-attention, Qwen3-VL),
``rms_norm`` and ``geglu``. All are ``profiled_only``: only a device profile (scripts/profile_ops.py) that
measured them faster and correct picks them. Without the package, or with ``PHYAI_FLASHINFER=0``, the list is
empty and nothing changes; the package is imported on the first call of a candidate (about a second), not when
the layers are imported, and a failed import takes the candidates out for the rest of the process.

Attention: the additive mask as a custom mask
--------------------------------------------
The ops take additive masks [B|1, 1, Tq|1, Tk]: 0 = attend, MASK_VALUE = blocked (ops.attention). What they hold
here: the prefix is [camera slots of 256 tokens, language tokens] (models/pi/modeling/paligemma.py), so its padding is a
missing camera's 256 slots *in the middle* and the tokens after the prompt at the end, blocked for every query;
the suffix block (models/pi/modeling/suffix.py) is bidirectional among pi0.5's action tokens, while pi0's state token sees
only the prefix and itself; in the prefix self-attention the padding queries' rows are blocked entirely. Padding
is not a contiguous tail, and it changes per observation under a graph captured once, so per-request KV lengths
(host data fixed at plan time) cannot express it. flashinfer's custom mask can: one bit per (query, key) of each
request, row-major, little-endian, each request starting on a byte (``segment_packbits``' layout). ``pack_mask``
derives it on the device from the additive mask on every call (pure torch, no host read), so a replayed graph
always attends with the current observation's mask. Nothing about the mask is cached across calls: the prefix
graph rewrites it in place, under the same tensor, without anything Python can see.

A row with no allowed key: the reference adds the finite MASK_VALUE to every score, which swamps the scores, so
the row attends uniformly to all keys; flashinfer masks with -inf and would give NaN. ``pack_mask`` lets such a
row see every key, and the query copy that lays q out token-major zeroes that row's query: all its scores are 0
and the row is exactly the reference's uniform average. A key is allowed where its value equals its row's
maximum: for the contract's 0 / MASK_VALUE masks that is "== 0"; soft biases are outside the contract. Masks of
another form (bool, per head, not broadcastable) are declined by ``supports``. Per masked call this costs six
small kernels (row max, bits, shift, pack, keep, query copy) before the attention kernel; the expert op also
concatenates prefix and suffix K / V (ragged KV is one tensor), two more.

Plans and CUDA graphs
---------------------
``BatchPrefillWithRaggedKVCacheWrapper.run`` needs a ``plan`` first. plan reads host-side index arrays (the
requests' query / key lengths), picks the tile size and the KV split, writes its work lists into the wrapper's
int workspace (an async copy from pinned memory), and JIT-compiles or loads the kernel module (about a minute the
first time on a machine, then cached under ~/.cache/flashinfer): none of that may happen inside graph capture. A
plan depends on batch size, query and key lengths, q / kv heads, head dim, dtype, masked or not, and device, so
one is made per such key on the first eager call (the runner's warm-up before capture, the profiler's first
call), the stream synchronised, and kept for the life of the process (16 MiB each: flashinfer's int workspace
and its pinned host copy). A captured call records only the mask packing and ``run()``, whose kernels read the
plan's device arrays and mask buffer at fixed addresses. While a stream is capturing, a key without a plan is
declined (``supports`` False: the selector takes the next candidate); it is never planned there. A new shape
is a new key and a new plan (and, in the runner, a new graph bucket); nothing is re-planned in place, so a
captured graph stays valid. The norm / activation kernels are likewise offered during capture only after an
eager call has loaded them.

``use_cuda_graph=True`` (indptr and mask buffers that a re-plan rewrites under one captured graph) is for
lengths that vary under one graph; here they are fixed per key, and that mode would force the KV split with a
grid of two CTAs per SM plus a merge pass even where none is needed (the prefix at batch 32: a ~2 GB
workspace). So the wrapper runs in its own mode and each call writes the packed mask into the buffer the plan
keeps (the one it packed from ``custom_mask``); planning first checks, on a random test pattern, that flashinfer
packed the mask exactly as ``pack_mask`` does (bit order, per-request byte offsets).

The split-KV scratch (float workspace, 128 MiB, grown when a plan asks for more) is one per device, and each
plan has one mask buffer: calls must run one stream at a time (a runner's do); two threads calling the same
shapes from two streams at once would race on them.

Norms and activation: only flashinfer kernels with the reference's math. ``gemma_rmsnorm`` / ``rmsnorm``:
x * rsqrt(mean(x^2) + eps) * (1 + w) (or * w) in fp32, rounded once; the kernel reads the weight in x's dtype,
so fp32 weights (the pi models' norm vectors) are declined rather than rounded. ``gelu_tanh_and_mul``: gelu_tanh
(gate) * up in fp32, rounded once; its tanh is the hardware approximation (tanh.approx.f32, relative error <=
2^-10.987), up to ~2.5e-4 |gate| absolute in the GELU, most visible in the negative tail where our Triton kernel
is exact. Not offered: adaRMS (no such kernel), ``fused_add_rmsnorm`` (in place, and it normalises the unrounded
sum where the reference normalises the rounded residual), ``layernorm`` (fp32 affine parameters only), RoPE
(positions plus a cos / sin cache, not the per-token tables the ops take).
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import os
import threading
from dataclasses import dataclass
from typing import Optional

import torch

from phyai_ros.layers.ops import MASK_VALUE
from phyai_ros.layers.selector import Candidate

log = logging.getLogger(__name__)
Tensor = torch.Tensor

NAME = "flashinfer"
DTYPES = (torch.float16, torch.bfloat16)       # the prefill and norm kernels' input types
HEAD_DIMS = (64, 128, 256)
WORKSPACE_BYTES = 128 * 2 ** 20                # flashinfer's recommended float workspace
MAX_WORKSPACE_BYTES = 4 * 2 ** 30


# ----------------------------------------------------------------------------- the package
@functools.lru_cache(maxsize=None)
def installed() -> bool:
    """flashinfer is on the path and not switched off with PHYAI_FLASHINFER=0 (no import)."""
    if os.environ.get("PHYAI_FLASHINFER", "1") == "0":
        return False
    try:
        return importlib.util.find_spec("flashinfer") is not None
    except (ImportError, ValueError):
        return False


_IMPORT_FAILED = False


@functools.lru_cache(maxsize=None)
def _module():
    """The imported package (first call only: it takes about a second)."""
    global _IMPORT_FAILED
    try:
        import flashinfer
    except Exception as exc:  # installed but broken (CUDA / torch mismatch): the candidates go away
        _IMPORT_FAILED = True
        log.warning("flashinfer is installed but does not import (%s); its operator candidates are off", exc)
        raise
    return flashinfer


def available() -> bool:
    """The candidates' availability: installed, and no import has failed (cheap: called on every dispatch)."""
    return installed() and not _IMPORT_FAILED


# ----------------------------------------------------------------------------- the mask
def mask_supported(mask: Optional[Tensor], batch: int, q_len: int, kv_len: int) -> bool:
    """None, or an additive float mask [B|1, 1, Tq|1, Tk] (the same for every head)."""
    return mask is None or (mask.is_floating_point() and mask.dim() == 4 and mask.shape[1] == 1
                            and mask.shape[0] in (1, batch) and mask.shape[2] in (1, q_len)
                            and mask.shape[3] == kv_len)


def packed_bytes(q_len: int, kv_len: int) -> int:
    """Bytes of one request's packed mask (its q_len * kv_len bits, padded to a byte)."""
    return -(-q_len * kv_len // 8)


def pack_mask(mask: Tensor, batch: int, q_len: int, kv_len: int, bits: Optional[Tensor] = None,
              out: Optional[Tensor] = None, shifts: Optional[Tensor] = None):
    """Additive mask [B|1, 1, Tq|1, Tk] -> (packed uint8 [B, packed_bytes], keep bool [B|1, Tq|1, 1]).

    packed[b] holds request b's bits: bit i of byte j is (query, key) = divmod(8 j + i, Tk), set where the
    key is allowed (its value equals its row's maximum, i.e. 0 where the row allows any key; every key of a row
    that allows none). keep is False for those rows (row maximum < 0): their query must be zeroed so that the
    row attends uniformly, as the reference does. bits ([B, 8 * packed_bytes] bool, the bits after Tq * Tk
    False), out and shifts (arange(8) uint8) may be given (a plan's buffers); else they are allocated. No host
    reads: capture-safe.
    """
    m = mask[:, 0]
    rowmax = m.amax(-1, keepdim=True)
    nbytes = packed_bytes(q_len, kv_len)
    dev = mask.device
    if bits is None:
        bits = torch.zeros(batch, 8 * nbytes, dtype=torch.bool, device=dev)
    if shifts is None:
        shifts = torch.arange(8, dtype=torch.uint8, device=dev)
    if out is None:
        out = torch.empty(batch, nbytes, dtype=torch.uint8, device=dev)
    torch.ge(m.expand(batch, q_len, kv_len), rowmax.expand(batch, q_len, 1),
             out=bits[:, :q_len * kv_len].view(batch, q_len, kv_len))
    torch.sum(bits.view(torch.uint8).view(batch, nbytes, 8) << shifts, dim=-1, dtype=torch.uint8, out=out)
    return out, rowmax >= 0


# ----------------------------------------------------------------------------- plans
@dataclass
class _Plan:
    """A planned wrapper for one shape key, and the buffers its masked calls write."""
    wrapper: object
    kv_len: int
    bits: Optional[Tensor] = None      # [B, 8 * nbytes] bool scratch, padding bits 0
    mask: Optional[Tensor] = None      # [B, nbytes] uint8: the packed mask the plan's kernels read
    shifts: Optional[Tensor] = None


_PLANS: dict = {}
_WORKSPACES: dict = {}                 # device -> float workspace
_WARM: set = set()                     # (kernel, device, dtype, variant) that ran eagerly once
_LOCK = threading.Lock()


def _key(q: Tensor, kv_len: int, hkv: int, masked: bool) -> tuple:
    b, hq, tq, d = q.shape
    return (q.device, b, tq, kv_len, hq, hkv, d, q.dtype, masked)


def _ready(device: torch.device, key: tuple, have) -> bool:
    """Usable now: outside capture always (the first eager call prepares); while capturing only if prepared."""
    if device.type != "cuda" or key in have:
        return True
    return not torch.cuda.is_current_stream_capturing()


def _workspace(device: torch.device, at_least: int = 0) -> Tensor:
    ws = _WORKSPACES.get(device)
    if ws is None or ws.numel() < at_least:
        ws = _WORKSPACES[device] = torch.empty(max(WORKSPACE_BYTES, at_least), dtype=torch.uint8, device=device)
    return ws


def _test_pattern(b: int, tq: int, tk: int, device) -> Tensor:
    """Random bool [B, Tq, Tk] with a True in every row (so its additive form's row maxima are 0)."""
    g = torch.Generator().manual_seed(tq * 1_000_003 + tk)
    pattern = torch.randint(0, 2, (b, tq, tk), generator=g, dtype=torch.uint8).bool()
    pattern[..., 0] = True
    return pattern.to(device)


def _make_plan(key: tuple) -> _Plan:
    device, b, tq, tk, hq, hkv, d, dtype, masked = key
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("flashinfer: no plan for this shape (plans are made on an eager call, before capture)")
    fi = _module()
    # On the device: plan copies them to the host itself, and packs custom_mask with them on the device.
    qo_indptr = torch.arange(b + 1, dtype=torch.int32, device=device) * tq
    kv_indptr = torch.arange(b + 1, dtype=torch.int32, device=device) * tk
    pattern = _test_pattern(b, tq, tk, device) if masked else None
    with torch.cuda.device(device):
        size = 0
        while True:
            wrapper = fi.BatchPrefillWithRaggedKVCacheWrapper(_workspace(device, size), "NHD", backend="fa2")
            try:
                wrapper.plan(qo_indptr, kv_indptr, hq, hkv, d,
                             custom_mask=None if pattern is None else pattern.reshape(-1), causal=False,
                             q_data_type=dtype, kv_data_type=dtype, o_data_type=dtype)
                break
            except Exception as exc:  # the KV split's scratch did not fit: retry with a workspace twice as large
                size = 2 * _workspace(device).numel()
                if "workspace" not in str(exc).lower() or size > MAX_WORKSPACE_BYTES:
                    raise
        plan = _Plan(wrapper, tk)
        if masked:
            plan.shifts = torch.arange(8, dtype=torch.uint8, device=device)
            plan.bits = torch.zeros(b, 8 * packed_bytes(tq, tk), dtype=torch.bool, device=device)
            additive = torch.where(pattern, 0.0, MASK_VALUE)[:, None]
            expect, _ = pack_mask(additive, b, tq, tk, plan.bits, shifts=plan.shifts)
            buf = getattr(wrapper, "_custom_mask_buf", None)
            if not (torch.is_tensor(buf) and buf.dtype == torch.uint8 and buf.is_contiguous()
                    and buf.numel() == expect.numel() and torch.equal(buf.view_as(expect), expect)):
                raise RuntimeError("flashinfer packs custom masks differently from pack_mask: not used")
            plan.mask = buf.view_as(expect)
        torch.cuda.current_stream(device).synchronize()
    log.info("flashinfer: planned attention B=%d Tq=%d Tk=%d Hq=%d Hkv=%d D=%d %s%s", b, tq, tk, hq, hkv, d,
             dtype, " masked" if masked else "")
    return plan


def _plan(key: tuple) -> _Plan:
    plan = _PLANS.get(key)
    if plan is None:
        with _LOCK:
            plan = _PLANS.get(key)
            if plan is None:
                plan = _PLANS[key] = _make_plan(key)
    return plan


# ----------------------------------------------------------------------------- attention
def _ragged(x: Tensor) -> Tensor:
    """[B, H, T, D] -> [B*T, H, D] for the ragged kernel: a view where the strides allow, else a copy; rows
    16-byte aligned (the kernel's vector loads)."""
    b, h, t, d = x.shape
    y = x.transpose(1, 2).reshape(b * t, h, d)
    if y.stride(-1) != 1 or y.stride(0) % 8 or (h > 1 and y.stride(1) % 8) or y.data_ptr() % 16:
        y = y.contiguous()
    return y


def _run(plan: _Plan, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor]) -> Tensor:
    """q [B, Hq, Tq, D], k / v ragged [B*Tk, Hkv, D] -> [B, Hq, Tq, D], a view of a token-major buffer (the
    output projection reads it without a transpose copy)."""
    b, hq, tq, d = q.shape
    if mask is None:
        q2 = _ragged(q)
    else:
        _, keep = pack_mask(mask, b, tq, plan.kv_len, plan.bits, plan.mask, plan.shifts)
        qt = torch.empty(b, tq, hq, d, dtype=q.dtype, device=q.device)
        torch.mul(q.transpose(1, 2), keep.unsqueeze(-1), out=qt)
        q2 = qt.view(b * tq, hq, d)
    out = torch.empty(b, tq, hq, d, dtype=q.dtype, device=q.device)
    plan.wrapper.run(q2, k, v, out=out.view(b * tq, hq, d))
    return out.transpose(1, 2)


def _heads_ok(q: Tensor, k: Tensor) -> bool:
    """q [B, Hq, Tq, D] and k [B, Hkv, Tk, D] of one float16 / bfloat16 dtype, grouped heads, a supported D."""
    return (q.dim() == 4 and k.dim() == 4 and q.dtype in DTYPES and k.dtype == q.dtype
            and k.shape[0] == q.shape[0] and k.shape[3] == q.shape[3] and q.shape[3] in HEAD_DIMS
            and q.shape[1] % k.shape[1] == 0)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """ops.attention on flashinfer's FA2 ragged prefill: q [B, Hq, T, D], k / v [B, Hkv, Tk, D]."""
    plan = _plan(_key(q, k.shape[2], k.shape[1], mask is not None))
    return _run(plan, q, _ragged(k), _ragged(v), mask)


def supports_attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None) -> bool:
    return (_heads_ok(q, k) and v.shape == k.shape and v.dtype == q.dtype
            and mask_supported(mask, q.shape[0], q.shape[2], k.shape[2])
            and _ready(q.device, _key(q, k.shape[2], k.shape[1], mask is not None), _PLANS))


def attention_with_prefix(q: Tensor, k_prefix: Tensor, v_prefix: Tensor, k_suffix: Tensor, v_suffix: Tensor,
                          mask: Optional[Tensor]) -> Tensor:
    """Attention over [prefix cache; suffix] keys: the two are concatenated token-major (ragged KV is one
    tensor), then as ``attention``."""
    b, hkv, p, d = k_prefix.shape
    tk = p + k_suffix.shape[2]
    plan = _plan(_key(q, tk, hkv, mask is not None))
    k = torch.cat([k_prefix.transpose(1, 2), k_suffix.transpose(1, 2)], dim=1).view(b * tk, hkv, d)
    v = torch.cat([v_prefix.transpose(1, 2), v_suffix.transpose(1, 2)], dim=1).view(b * tk, hkv, d)
    return _run(plan, q, k, v, mask)


def supports_attention_with_prefix(q: Tensor, k_prefix: Tensor, v_prefix: Tensor, k_suffix: Tensor,
                                   v_suffix: Tensor, mask: Optional[Tensor]) -> bool:
    if not (_heads_ok(q, k_prefix) and _heads_ok(q, k_suffix) and v_prefix.shape == k_prefix.shape
            and v_suffix.shape == k_suffix.shape and k_suffix.shape[1] == k_prefix.shape[1]
            and v_prefix.dtype == q.dtype and v_suffix.dtype == q.dtype):
        return False
    tk = k_prefix.shape[2] + k_suffix.shape[2]
    return mask_supported(mask, q.shape[0], q.shape[2], tk) and _ready(
        q.device, _key(q, tk, k_prefix.shape[1], mask is not None), _PLANS)


# ----------------------------------------------------------------------------- norm and activation
def _rows(x: Tensor) -> Tensor:
    """[..., W] -> [rows, W] with unit last stride and 16-byte aligned rows (a view where possible)."""
    y = x.reshape(-1, x.shape[-1])
    if y.stride(-1) != 1 or y.stride(0) % 8 or y.data_ptr() % 16:
        y = y.contiguous()
    return y


def rms_norm(x: Tensor, weight: Tensor, eps: float, weight_offset: float = 1.0) -> Tensor:
    """ops.rms_norm: Gemma's (times 1 + weight) by gemma_rmsnorm, weight_offset 0 (times weight) by rmsnorm."""
    fi = _module()
    x2 = _rows(x)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    (fi.gemma_rmsnorm if weight_offset == 1.0 else fi.rmsnorm)(x2, weight, eps, out=out)
    _WARM.add(("rms_norm", x.device, x.dtype, weight_offset))
    return out.view(x.shape)


def supports_rms_norm(x: Tensor, weight: Tensor, eps: float, weight_offset: float = 1.0) -> bool:
    return (x.dtype in DTYPES and weight.dtype == x.dtype and weight.dim() == 1 and weight.is_contiguous()
            and x.shape[-1] == weight.shape[0] and x.shape[-1] % 8 == 0 and weight_offset in (0.0, 1.0)
            and _ready(x.device, ("rms_norm", x.device, x.dtype, weight_offset), _WARM))


def geglu(gate_up: Tensor) -> Tensor:
    """gelu_tanh(gate) * up for gate_up = [gate | up] along the last dim, by gelu_tanh_and_mul."""
    out = _module().gelu_tanh_and_mul(gate_up)
    _WARM.add(("geglu", gate_up.device, gate_up.dtype))
    return out


def supports_geglu(gate_up: Tensor) -> bool:
    """Contiguous rows (the kernel indexes rows by 2 * M), 16-byte aligned halves."""
    return (gate_up.dtype in DTYPES and gate_up.is_contiguous() and gate_up.shape[-1] % 16 == 0
            and _ready(gate_up.device, ("geglu", gate_up.device, gate_up.dtype), _WARM))


# ----------------------------------------------------------------------------- registration
def candidates() -> list:
    """(op, Candidate) pairs for the operator selector; empty where flashinfer is not installed (or
    PHYAI_FLASHINFER=0)."""
    if not installed():
        return []
    common = dict(devices=("cuda",), available=available, profiled_only=True)
    return [("attention_with_prefix", Candidate(NAME, attention_with_prefix,
                                                supports=supports_attention_with_prefix, **common)),
            ("attention", Candidate(NAME, attention, supports=supports_attention, **common)),
            ("rms_norm", Candidate(NAME, rms_norm, supports=supports_rms_norm, **common)),
            ("geglu", Candidate(NAME, geglu, supports=supports_geglu, **common))]
