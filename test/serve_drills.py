"""Fault drills for the served policy's tests: an engine that a request's task can make slow or kill.

A replica runs it through ``ServeConfig.engine = "serve_drills:DrillEngine"`` (the test folder is on the Ray
workers' PYTHONPATH). Task ``"sleep S"`` holds the whole batch S seconds before computing it (a slow replica);
task ``"exit now"`` ends the replica's process mid-batch (a dying replica); task ``"fail in prepare"`` makes the
adapter's preparation of that request raise a RuntimeError (a server fault that is one request's alone); task
``"non-finite chunk"`` has the model return NaN in that request's chunk (a model gone bad). Other tasks run
normally."""
from __future__ import annotations

import os
import time

import numpy as np

from phyai_ros.serve.engine import BatchEngine

SLOW = "sleep "
EXIT = "exit now"
SLOW_TASK = "sleep 2.0"
PREPARE_FAILS = "fail in prepare"
NON_FINITE = "non-finite chunk"


class DrillEngine(BatchEngine):
    def __init__(self, cfg):
        super().__init__(cfg)
        prepare, sample = self.adapter.serve_prepare, self.adapter.serve_sample
        poisoned = set()   # ids of the rows whose chunk the model spoils

        def drilled(images, state, task, seed, rtc):
            if task == PREPARE_FAILS:
                raise RuntimeError("drill: preparation failed")
            row = prepare(images, state, task, seed, rtc)
            if task == NON_FINITE:
                poisoned.add(id(row))
            return row

        def spoiled(rows):
            out = np.array(sample(rows), np.float32)
            for i, row in enumerate(rows):
                if id(row) in poisoned:
                    poisoned.discard(id(row))
                    out[i, 0, 0] = np.nan
            return out
        self.adapter.serve_prepare, self.adapter.serve_sample = drilled, spoiled

    def run(self, requests):
        for r in requests:
            if r.task == EXIT:
                os._exit(17)
        delays = [float(r.task[len(SLOW):]) for r in requests if r.task.startswith(SLOW)]
        if delays:
            time.sleep(max(delays))
        return super().run(requests)
