"""A replica's batch queue: batches form from the requests that arrive while the engine computes.

Ray Serve's ``serve.batch`` forms a batch as soon as its wait has passed, whether or not the engine is free: with no
wait, eight robots at once became eight batches of one queued behind each other, and with a wait every lone
request paid it. Here one loop takes every request waiting when the engine is free (at most ``max_batch_size``)
and runs them as one batch; a request that finds the engine idle runs at once. ``wait_s`` > 0 still holds a
batch's first request that long for company (throughput bought with latency).
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable, Optional, Sequence


class BusyBatcher:
    """``await submit(item)`` -> ``run([... item ...])``'s result for it; ``run`` is called in a worker thread (the
    event loop keeps answering while it computes), one batch at a time, and returns one result per item, in order.
    If ``run`` raises, every request of that batch raises it; a caller that gave up is skipped."""

    def __init__(self, run: Callable[[Sequence], list], max_batch_size: int, wait_s: float = 0.0):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.run, self.max_batch_size, self.wait_s = run, int(max_batch_size), max(0.0, float(wait_s))
        self._queue: Optional[asyncio.Queue] = None
        self._loop_task: Optional[asyncio.Task] = None
        self.batches = 0   # batches run so far

    async def submit(self, item):
        if self._loop_task is None or self._loop_task.done():
            self._queue = self._queue or asyncio.Queue()
            self._loop_task = asyncio.get_running_loop().create_task(self._serve_forever())
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((item, future))
        return await future

    async def _next_batch(self) -> list:
        batch = [await self._queue.get()]
        deadline = time.monotonic() + self.wait_s
        while len(batch) < self.max_batch_size:
            if not self._queue.empty():
                batch.append(self._queue.get_nowait())
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), left))
            except asyncio.TimeoutError:
                break
        return [(item, future) for item, future in batch if not future.done()]

    async def _serve_forever(self) -> None:
        while True:
            batch = await self._next_batch()
            if not batch:
                continue
            self.batches += 1
            try:
                results = await asyncio.to_thread(self.run, [item for item, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"the engine returned {len(results)} results for {len(batch)} requests")
            except Exception as exc:  # noqa: BLE001 - every request of this batch gets it; the loop goes on
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, results):
                if not future.done():
                    future.set_result(result)
