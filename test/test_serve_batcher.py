"""The replica's batch queue: a lone request runs at once, requests arriving while the engine computes form the
next batch (at most max_batch_size), a failing batch fails only its own requests, and a caller that gave up is
skipped."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from phyai_ros.serve.batcher import BusyBatcher


class Engine:
    """Records each batch; a batch waits on ``gate`` (when set) before it returns, so tests hold it busy."""

    def __init__(self, fail_on=None):
        self.batches: list = []
        self.gate = None
        self.fail_on = fail_on
        self.started = threading.Event()

    def run(self, items):
        self.batches.append(list(items))
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.fail_on in items:
            raise RuntimeError("engine failed")
        return [f"chunk {i}" for i in items]


def test_a_lone_request_runs_at_once():
    engine = Engine()

    async def main():
        batcher = BusyBatcher(engine.run, max_batch_size=8)
        t = time.perf_counter()
        out = await batcher.submit(1)
        return out, time.perf_counter() - t
    out, took = asyncio.run(main())
    assert out == "chunk 1" and engine.batches == [[1]]
    assert took < 0.5


def test_requests_arriving_while_busy_form_the_next_batch_up_to_its_size():
    engine = Engine()
    engine.gate = threading.Event()

    async def main():
        batcher = BusyBatcher(engine.run, max_batch_size=4)
        first = asyncio.ensure_future(batcher.submit(0))
        await asyncio.to_thread(engine.started.wait, 5)       # the engine is busy with request 0
        rest = [asyncio.ensure_future(batcher.submit(i)) for i in range(1, 7)]
        await asyncio.sleep(0.05)
        engine.gate.set()
        return await first, await asyncio.gather(*rest)
    first, rest = asyncio.run(main())
    assert first == "chunk 0" and rest == [f"chunk {i}" for i in range(1, 7)]
    assert engine.batches == [[0], [1, 2, 3, 4], [5, 6]]


def test_a_wait_gathers_requests_that_arrive_within_it():
    engine = Engine()

    async def main():
        batcher = BusyBatcher(engine.run, max_batch_size=8, wait_s=0.2)
        first = asyncio.ensure_future(batcher.submit(0))
        await asyncio.sleep(0.02)
        second = asyncio.ensure_future(batcher.submit(1))
        return await asyncio.gather(first, second)
    assert asyncio.run(main()) == ["chunk 0", "chunk 1"]
    assert engine.batches == [[0, 1]]


def test_a_failing_batch_fails_its_own_requests_and_the_queue_goes_on():
    engine = Engine(fail_on=13)

    async def main():
        batcher = BusyBatcher(engine.run, max_batch_size=8)
        with pytest.raises(RuntimeError, match="engine failed"):
            await batcher.submit(13)
        return await batcher.submit(2)
    assert asyncio.run(main()) == "chunk 2"


def test_a_caller_that_gave_up_is_not_run():
    engine = Engine()
    engine.gate = threading.Event()

    async def main():
        batcher = BusyBatcher(engine.run, max_batch_size=8)
        first = asyncio.ensure_future(batcher.submit(0))
        await asyncio.to_thread(engine.started.wait, 5)
        gone = asyncio.ensure_future(batcher.submit(1))
        kept = asyncio.ensure_future(batcher.submit(2))
        await asyncio.sleep(0.01)
        gone.cancel()
        engine.gate.set()
        return await first, await kept
    assert asyncio.run(main()) == ("chunk 0", "chunk 2")
    assert engine.batches == [[0], [2]]


def test_a_wrong_number_of_results_fails_the_batch():
    async def main():
        batcher = BusyBatcher(lambda items: [], max_batch_size=2)
        with pytest.raises(RuntimeError, match="0 results for 1 requests"):
            await batcher.submit(1)
    asyncio.run(main())


def test_a_batch_size_below_one_is_refused():
    with pytest.raises(ValueError, match="max_batch_size"):
        BusyBatcher(lambda items: items, max_batch_size=0)
