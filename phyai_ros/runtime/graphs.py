"""CUDA-graph capture and a registry of graphs keyed by shape bucket.

A captured graph replays a fixed sequence of kernels on fixed addresses, so the
runner owns static input and output buffers: new inputs are copied in, the graph
is replayed, and outputs are read from static storage that the replay refreshes.
One memory pool is shared by all graphs of a runner: buckets never run at the
same time, so they can reuse each other's intermediate memory.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable, Optional

import torch

from phyai_ros.runtime.lru import LruCache


@dataclass
class CapturedCall:
    """One function captured on static inputs; ``replay`` recomputes ``outputs`` in place."""

    graph: "torch.cuda.CUDAGraph"
    inputs: tuple
    outputs: object

    def replay(self) -> object:
        self.graph.replay()
        return self.outputs


def capture(fn: Callable, static_inputs: tuple, warmup: int = 2,
            pool=None, stream: "torch.cuda.Stream | None" = None) -> CapturedCall:
    """Warm ``fn`` up on a side stream (lazy inits, autotuning), then capture one call.

    ``fn`` must be capture-safe: no host syncs, no allocation-dependent control flow,
    no CPU tensors created per call.
    """
    stream = stream or torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn(*static_inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        outputs = fn(*static_inputs)
    torch.cuda.synchronize()
    return CapturedCall(graph=graph, inputs=static_inputs, outputs=outputs)


@dataclass
class GraphRegistry:
    """Captured calls by key (e.g. ``("prefix", batch, prefix_len)``), sharing one memory pool."""

    calls: dict = field(default_factory=dict)
    pool: object = None

    def __post_init__(self):
        if self.pool is None and torch.cuda.is_available():
            self.pool = torch.cuda.graph_pool_handle()

    def get(self, key: Hashable) -> CapturedCall | None:
        return self.calls.get(key)

    def capture(self, key: Hashable, fn: Callable, static_inputs: tuple, warmup: int = 2) -> CapturedCall:
        call = capture(fn, static_inputs, warmup=warmup, pool=self.pool)
        self.calls[key] = call
        return call

    def keys(self) -> list:
        return list(self.calls)

    def forget(self, key: Hashable) -> None:
        """Drop a captured call (a bucket evicted): its graph and outputs are freed into the shared pool."""
        call = self.calls.pop(key, None)
        if call is not None and call.graph is not None:
            call.graph.reset()


class BucketCache(LruCache):
    """A runner's shape buckets, bounded: at most ``max_buckets``, the least recently used evicted with its
    graphs (their memory returns to the registry's pool; a bucket made again is captured again). Shapes that
    follow the input (a prompt's length, a camera's canvas) are otherwise a way to grow a runner without end."""

    def __init__(self, registry: Optional[GraphRegistry], stages: tuple, max_buckets: int):
        super().__init__(max_buckets, self._forget)
        self.registry, self.stages = registry, tuple(stages)

    @property
    def max_buckets(self) -> int:
        return self.max_items

    add = LruCache.put

    def _forget(self, key: Hashable, _bucket) -> None:
        if self.registry is not None:
            for stage in self.stages:
                self.registry.forget((stage,) + tuple(key))
