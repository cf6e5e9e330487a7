"""Where inference runs.  ``submit`` never blocks the caller (the tick thread).

* ``InferenceWorker``: one daemon thread, queue of size 1; the loop keeps at most one job
  in flight, so a full queue only means a caller bug and is reported as ``False``.
* ``ManualExecutor``: holds the job until the test (or an offline benchmark) calls
  ``run_pending``; with a ``FakeClock`` this gives exact control of when inference starts
  and ends (``before``/``between`` hooks inject queue and actuate latency).

A job has ``infer()`` (the policy call) and ``deliver()`` (hand the chunk to the timer);
``run()`` is both.  Jobs catch their own errors; the worker additionally survives anything.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable, Optional, Protocol


class Job(Protocol):
    def infer(self) -> None: ...

    def deliver(self) -> None: ...

    def run(self) -> None: ...


class Executor(Protocol):
    def submit(self, job: Job) -> bool: ...

    def close(self, timeout: float = 1.0) -> None: ...


_STOP = object()


class InferenceWorker:
    def __init__(self, name: str = "phyai-inference", on_crash: Optional[Callable[[BaseException], None]] = None):
        self._q: queue.Queue = queue.Queue(maxsize=1)
        self._on_crash = on_crash
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> bool:
        try:
            self._q.put_nowait(job)
            return True
        except queue.Full:
            return False

    def _main(self) -> None:
        while True:
            job = self._q.get()
            if job is _STOP:
                return
            try:
                job.run()
            except BaseException as e:  # noqa: BLE001 - the worker must outlive any job
                if self._on_crash is not None:
                    try:
                        self._on_crash(e)
                    except Exception:
                        pass

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout: float = 1.0) -> None:
        """Stop after the current job (which is not interrupted); waits at most ``timeout``."""
        try:
            self._q.put(_STOP, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)


class ManualExecutor:
    def __init__(self):
        self._job: Optional[Job] = None
        self.submitted = 0

    def submit(self, job: Job) -> bool:
        if self._job is not None:
            return False
        self._job = job
        self.submitted += 1
        return True

    @property
    def pending(self) -> bool:
        return self._job is not None

    def run_pending(self, before: Optional[Callable[[], None]] = None,
                    between: Optional[Callable[[], None]] = None) -> bool:
        """Run the held job on the calling thread: ``before()``, infer, ``between()``, deliver."""
        job, self._job = self._job, None
        if job is None:
            return False
        if before is not None:
            before()
        job.infer()
        if between is not None:
            between()
        job.deliver()
        return True

    def close(self, timeout: float = 1.0) -> None:
        self._job = None


__all__ = ["Job", "Executor", "InferenceWorker", "ManualExecutor"]
