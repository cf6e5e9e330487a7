"""The runner interface: what every family's runner is to the rest of the house (design.md §1).

A family's runner owns *how* its stages run on one device: static buffers per shape bucket, the validity of the
per-observation state, and the CUDA graphs of its stages (captured once per bucket, replayed per call; eager on
the CPU or with graphs off, on the same buffers, so both paths compute the same thing). The stage order and the
buffers differ by family (the pi family's vision / prefix / loop, GR00T's and MiniCPM's backbone / context /
loop, Cosmos3's text / conditioning / loop); what they share is here once:

    run_stage(bucket_key, stage, fn, args, held)   capture ``fn`` for (stage, bucket) once, then replay it
    new_observation()                               a fresh id for the observation a bucket now holds
    buckets()                                       the shape buckets held (graphs and buffers each)
    warm_up(chunk, runs)                            run a chunk ``runs`` times (capture, autotune, first-call costs)
    release()                                       every graph and buffer dropped (its memory back to the pool)

and each runner adds its own ``set_observation(...) -> bucket`` and ``sample(bucket, noise, ...) -> actions``.
A new family builds its runner on this interface alone (design.md §1, "How a family is added").
"""
from __future__ import annotations

import abc
import itertools
import time
from typing import Callable, Optional

import torch

from phyai_ros.runtime.graphs import BucketCache, CapturedCall, GraphRegistry

MAX_BUCKETS = 8   # observation shapes a runner keeps by default (buffers and graphs each)


class Runner(abc.ABC):
    """Base of every family's runner: its device, whether it captures graphs, the graph registry and the
    bounded buckets (``stages``: the graphs each bucket holds, by name, freed with it when it is evicted)."""

    stages: tuple = ()

    def __init__(self, device, use_graphs: bool = True, max_buckets: int = MAX_BUCKETS):
        self.device = torch.device(device)
        self.use_graphs = bool(use_graphs) and self.device.type == "cuda"
        self.registry: Optional[GraphRegistry] = GraphRegistry() if self.use_graphs else None
        self._buckets = BucketCache(self.registry, self.stages, max_buckets)
        self._observation_ids = itertools.count(1)

    @property
    def max_buckets(self) -> int:
        return self._buckets.max_buckets

    def buckets(self) -> list:
        return self._buckets.keys()

    def new_observation(self) -> int:
        return next(self._observation_ids)

    def run_stage(self, bucket_key: tuple, stage: str, fn: Callable, args: tuple,
                  held: Optional[CapturedCall] = None) -> CapturedCall:
        """``fn(*args)`` for one bucket: under graphs ``held`` (the bucket's call of this stage) replayed, or captured
        first when there is none; eagerly otherwise. Returns the call, whose ``outputs`` hold the result."""
        if not self.use_graphs:
            return CapturedCall(graph=None, inputs=(), outputs=fn(*args))
        if held is None:
            held = self.registry.capture((stage,) + tuple(bucket_key), fn, args)
        held.replay()
        return held

    def warm_up(self, chunk: Callable[[], object], runs: int = 2) -> float:
        """``chunk()`` ``runs`` times, the device drained after each: the seconds of the last one (its steady
        cost, with the first call's capture and compile behind it)."""
        took = 0.0
        for _ in range(max(1, int(runs))):
            start = time.perf_counter()
            chunk()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            took = time.perf_counter() - start
        return took

    def release(self) -> None:
        """Drop every bucket and graph: their memory returns to the graphs' pool (the node's cleanup then empties
        the allocator's cache). The runner stays usable: the next call makes and captures again."""
        self._drop_buckets()
        if self.registry is not None:
            for key in self.registry.keys():
                self.registry.forget(key)

    def _drop_buckets(self) -> None:
        for key in self._buckets:
            self._buckets.evict(key)

    @abc.abstractmethod
    def set_observation(self, *inputs, **options):
        """A new observation into its bucket, its per-observation state computed: the bucket."""

    @abc.abstractmethod
    def sample(self, bucket, *noise, **options):
        """One chunk from the bucket's observation."""


__all__ = ["MAX_BUCKETS", "Runner"]
