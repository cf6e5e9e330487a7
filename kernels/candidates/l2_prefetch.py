"""Stream weights into L2 ahead of the kernels that read them, from a side branch of the CUDA graph.

Why: in the action expert's layer the attention over the prefix cache is latency-bound (~12 us for 1 MB of keys
and values on an H200) and leaves HBM idle, while the GEMMs after it (o-proj, gate_up, down: ~28 MB of weights at
pi0.5's size) each stream their weights from HBM behind a kernel ramp. A prefetch launched on a second stream
when the attention starts pulls those weights into L2 meanwhile, so the GEMMs read L2. The prefetch is a hint:
it changes no value anywhere, only where the following loads hit. Measured on the H200 (2026-12-02,
docs/benchmarks.md): at 50 rows those GEMMs are bound by their own latency, ~10% faster with every weight in L2,
and the loop gains nothing; the forms using it are profiled-only, for devices whose HBM is the bottleneck.

A plan is a segment table: one int64 row (address, bytes) per segment of at most ``segment_bytes`` of each tensor,
built once on the host (the weights do not move) and kept alive with the graph that reads it. The kernel walks
the table with ``programs`` programs:

* ``"lines"``: one ``prefetch.global.L2`` per 128-byte line (any CUDA GPU Triton runs on);
* ``"bulk"``: one ``cp.async.bulk.prefetch.L2`` per segment, issued by one thread (the copy engine of sm_90 and
  newer: Hopper, Blackwell / Thor), so a handful of programs covers tens of MB.

Neither runs under Triton's interpreter (inline PTX): the host side (tables, plans) is tested on the CPU, the
kernel on the GPU and compiled ahead of time for sm_90 and Thor by CI.
"""
from __future__ import annotations

import functools
from typing import Sequence

import torch

from ..common import HAVE_TRITON, interpret_mode, tl, triton

__all__ = ["LINE_BYTES", "MODES", "segment_rows", "segment_table", "l2_prefetch", "mode_supported"]

LINE_BYTES = 128            # an L2 line
MODES = ("lines", "bulk")
_BULK_ALIGN = 16            # cp.async.bulk sizes and addresses are multiples of 16 bytes
_LANES = 32                 # bulk: one segment per thread of a one-warp program


def segment_rows(spans: Sequence[tuple], segment_bytes: int) -> list:
    """(address, bytes) rows covering each (address, bytes) span in segments of at most ``segment_bytes``
    (a multiple of 128). A span's start is rounded down and its end up to 16 bytes (the bulk form's alignment;
    a prefetch of a neighbouring line is harmless). Empty spans give no row."""
    if segment_bytes <= 0 or segment_bytes % LINE_BYTES:
        raise ValueError(f"segment_bytes must be a positive multiple of {LINE_BYTES}, got {segment_bytes}")
    rows = []
    for addr, nbytes in spans:
        if nbytes <= 0:
            continue
        lo = addr - addr % _BULK_ALIGN
        hi = addr + nbytes
        hi += -hi % _BULK_ALIGN
        for start in range(lo, hi, segment_bytes):
            rows.append((start, min(segment_bytes, hi - start)))
    return rows


def segment_table(tensors: Sequence[torch.Tensor], segment_bytes: int = 64 * 1024) -> torch.Tensor:
    """The device table [n, 2] int64 (address, bytes) of the tensors' storage (each must be contiguous: the
    bytes read are the ones prefetched), on the first tensor's device."""
    if not tensors:
        raise ValueError("nothing to prefetch")
    spans = []
    for t in tensors:
        if not t.is_contiguous():
            raise ValueError(f"prefetch needs contiguous tensors, got strides {t.stride()} for {tuple(t.shape)}")
        if t.device != tensors[0].device:
            raise ValueError("all prefetched tensors must be on one device")
        spans.append((t.data_ptr(), t.numel() * t.element_size()))
    rows = segment_rows(spans, segment_bytes)
    return torch.tensor(rows, dtype=torch.int64).to(tensors[0].device)


def mode_supported(mode: str, device: torch.device) -> bool:
    """Whether ``mode`` runs on ``device``: Triton on a CUDA GPU (not its interpreter); bulk needs compute
    capability 9.0 or newer."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not HAVE_TRITON or device.type != "cuda" or interpret_mode():
        return False
    return mode == "lines" or _capability(device.index if device.index is not None else torch.cuda.current_device()
                                          ) >= (9, 0)


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple:
    return torch.cuda.get_device_capability(index)


if HAVE_TRITON:

    @triton.jit
    def _l2_prefetch_kernel(TABLE, n_rows, BULK: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        if BULK:   # one row per thread of a one-warp program (BLOCK = 32): rows pid * 32 + lane, then + 32 nprog
            lane = tl.arange(0, BLOCK)
            for base in range(pid * BLOCK, n_rows, nprog * BLOCK):
                r = base + lane
                live = r < n_rows
                addr = tl.load(TABLE + 2 * r, mask=live, other=0)
                size = tl.load(TABLE + 2 * r + 1, mask=live, other=0).to(tl.int32)
                tl.inline_asm_elementwise(
                    "{\n\t.reg .pred p;\n\tsetp.ne.u32 p, $2, 0;\n\t"
                    "@p cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;\n\t}",
                    "=r,l,r", [addr, size], dtype=tl.int32, is_pure=False, pack=1)
        else:      # one program per row at a time, one prefetch per line of it, BLOCK lines per step
            lines = tl.arange(0, BLOCK) * 128
            for r in range(pid, n_rows, nprog):
                addr = tl.load(TABLE + 2 * r)
                size = tl.load(TABLE + 2 * r + 1)
                for start in range(0, size, BLOCK * 128):
                    offs = start + lines
                    tl.inline_asm_elementwise(
                        "{\n\t.reg .pred p;\n\tsetp.ne.u32 p, $2, 0;\n\t@p prefetch.global.L2 [$1];\n\t"
                        "mov.u32 $0, 0;\n\t}",
                        "=r,l,r", [addr + offs, (offs < size).to(tl.int32)], dtype=tl.int32, is_pure=False,
                        pack=1)


def l2_prefetch(table: torch.Tensor, *, programs: int, mode: str = "bulk") -> None:
    """Prefetch every segment of ``table`` (``segment_table``) into L2 on the current stream: ``programs``
    programs of one warp (bulk) or four (lines: 512 lines per step)."""
    if table.dim() != 2 or table.shape[1] != 2 or table.dtype != torch.int64 or table.device.type != "cuda":
        raise ValueError("table must be a CUDA [n, 2] int64 segment table")
    if not mode_supported(mode, table.device):
        raise RuntimeError(f"L2 prefetch mode {mode!r} does not run on {table.device}")
    n = table.shape[0]
    if n == 0:
        return
    programs = max(1, min(int(programs), n if mode == "lines" else triton.cdiv(n, _LANES)))
    if mode == "bulk":
        _l2_prefetch_kernel[(programs,)](table, n, BULK=True, BLOCK=_LANES, num_warps=1)
    else:
        _l2_prefetch_kernel[(programs,)](table, n, BULK=False, BLOCK=_LINES_PER_STEP, num_warps=4)


_LINES_PER_STEP = 512       # lines mode: lines prefetched per program per step (4 per lane of four warps)
