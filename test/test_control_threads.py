"""Real worker thread + MonotonicClock: tick() never waits for a slow policy.
Loose bounds (shared CI cores): this is a blocking check, not a timing benchmark."""
import threading
import time

import numpy as np

from phyai_ros.control import ControlConfig, ControlLoop, MonotonicClock

H = 50
IMG = np.zeros((4, 4, 3), np.uint8)
POLICY_S = 0.2


def test_tick_does_not_block_on_slow_policy():
    started, finished = threading.Event(), threading.Event()
    calls = []

    def slow_policy(snap, rtc):
        calls.append(threading.current_thread().name)
        started.set()
        time.sleep(POLICY_S)
        if len(calls) == 2:
            raise RuntimeError("boom in the worker")
        finished.set()
        return np.zeros((H, 2), np.float32)

    cfg = ControlConfig(dt=0.01, horizon=H, action_dim=2, cameras=("front",), state_dim=3, rtc_overlap=5,
                        initial_delay_ticks=25, max_observation_age=0.5)
    clock = MonotonicClock()
    events = []
    loop = ControlLoop(cfg, slow_policy, clock, on_event=lambda k, d: events.append(k))
    try:
        durations, in_flight_ticks = [], 0
        t_end = time.monotonic() + 0.75
        while time.monotonic() < t_end:
            now = clock.now()
            loop.on_image("front", IMG, now)
            loop.on_state(np.zeros(3), now)
            t0 = time.perf_counter()
            loop.tick()
            durations.append(time.perf_counter() - t0)
            in_flight_ticks += loop.inference_in_flight
            time.sleep(0.005)
        assert started.is_set() and finished.is_set()
        assert calls[0] != threading.current_thread().name  # inference ran on the worker thread
        assert in_flight_ticks >= 10  # ticks happened while the policy slept
        assert max(durations) < 0.05, f"tick blocked for {max(durations):.3f} s"
        assert max(durations) < POLICY_S / 4
        c = loop.counters()
        assert c["chunks"] >= 1 and c["inferences_started"] >= 2
        # the second call raised inside the worker: counted, worker still alive
        deadline = time.monotonic() + 1.0
        while loop.counters()["inference_errors"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert loop.counters()["inference_errors"] == 1 and "inference_error" in events
        assert loop.executor.alive
    finally:
        loop.close(timeout=1.0)
