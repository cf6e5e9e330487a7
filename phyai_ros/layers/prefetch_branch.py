"""Weights prefetched into L2 on a side branch of the stream, so that a latency-bound kernel on the main stream
(the expert's attention) overlaps the HBM reads of the GEMMs after it (kernels/candidates/l2_prefetch.py says why).

``fork(owner, tensors, plan)`` makes the side stream wait for the work queued so far on the current stream, then
queues the prefetch there; ``join(device)`` makes the current stream wait for the side stream. Under CUDA-graph
capture the two become a branch of the graph (an edge into the prefetch, one out of it at the join), so every
replay prefetches again. A prefetch reads nothing a kernel writes and writes nothing at all: the values computed
are the same with or without it, only where the loads hit differs.

The segment table a fork launches with is kept on ``owner`` (the layer whose weights it covers): a captured graph
reads that table at every replay, so it must live as long as the weights, never in a cache that could drop it.
"""
from __future__ import annotations

import threading
from typing import NamedTuple, Sequence

import torch

from phyai_ros.kernels.candidates import l2_prefetch as kl2

_TABLES_ATTR = "_l2_prefetch_tables"
_local = threading.local()   # one side stream per thread and device: two threads capturing at once stay apart


class PrefetchPlan(NamedTuple):
    """How to prefetch: kernels/candidates/l2_prefetch.py's ``mode`` ("bulk" or "lines") with ``programs`` programs over
    segments of ``segment_bytes``."""
    mode: str = "bulk"
    programs: int = 8
    segment_bytes: int = 64 * 1024


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """This thread's side stream on ``device`` (made once)."""
    streams = getattr(_local, "streams", None)
    if streams is None:
        streams = _local.streams = {}
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in streams:
        streams[idx] = torch.cuda.Stream(device=idx)
    return streams[idx]


def table_for(owner, tensors: Sequence[torch.Tensor], segment_bytes: int) -> torch.Tensor:
    """The segment table of ``tensors``, made once and kept on ``owner`` (keyed by the tensors' addresses and
    sizes: a model moved to another device or reloaded gets a new table)."""
    key = (segment_bytes, tuple((t.data_ptr(), t.numel() * t.element_size()) for t in tensors))
    tables = owner.__dict__.setdefault(_TABLES_ATTR, {})
    table = tables.get(key)
    if table is None:
        if tensors[0].is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("an L2 prefetch table is made by an eager call (the warm-up), not inside a capture")
        table = tables[key] = kl2.segment_table(tensors, segment_bytes)
    return table


def usable(tensors: Sequence[torch.Tensor], plan: PrefetchPlan) -> bool:
    """Whether ``plan`` can prefetch ``tensors``: contiguous tensors on one CUDA device the mode runs on."""
    return (bool(tensors) and all(isinstance(t, torch.Tensor) and t.is_cuda and t.is_contiguous() for t in tensors)
            and len({t.device for t in tensors}) == 1 and kl2.mode_supported(plan.mode, tensors[0].device))


def fork(owner, tensors: Sequence[torch.Tensor], plan: PrefetchPlan) -> None:
    """Queue an L2 prefetch of ``tensors`` on the side stream, after everything queued so far on the current one."""
    device = tensors[0].device
    side = side_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    table = table_for(owner, tensors, plan.segment_bytes)
    with torch.cuda.stream(side):
        kl2.l2_prefetch(table, programs=plan.programs, mode=plan.mode)


def join(device: torch.device) -> None:
    """The current stream waits for every prefetch forked so far (a graph capture must end joined)."""
    torch.cuda.current_stream(device).wait_stream(side_stream(device))
