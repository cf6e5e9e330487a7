"""Deterministic fake-clock driving for tests and offline benchmarks (no threads).

``TickDriver`` plays the ROS timer: it moves a ``FakeClock`` from tick to tick, feeds
sensors, calls ``loop.tick()``, and runs a job left in a ``ManualExecutor`` right after the
tick that submitted it.  A ``ScriptedPolicy`` "takes" its latency by advancing the driver,
so the ticks that fall inside the inference run on the way, exactly as the executor thread
would run them while the worker computes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, List, Optional, Sequence

import numpy as np

from .clock import FakeClock
from .loop import ControlLoop
from .worker import ManualExecutor

LatencySpec = Optional[Callable[[int], int]]


def _const(v) -> LatencySpec:
    if v is None or callable(v):
        return v
    return lambda _i, v=int(v): v


class TickDriver:
    def __init__(self, loop: ControlLoop, clock: FakeClock, executor: ManualExecutor,
                 feed: Optional[Callable[[int], None]] = None, queue_ns=None, actuate_ns=None):
        """``queue_ns``/``actuate_ns``: int ns or f(job_index) -> ns, injected before the
        policy call and between policy return and hand-over."""
        self.loop, self.clock, self.executor, self.feed = loop, clock, executor, feed
        self.dt_ns = loop.dt_ns
        self.next_tick_ns = clock.now()
        self.queue_ns, self.actuate_ns = _const(queue_ns), _const(actuate_ns)
        self.jobs_run = 0
        self.ticks: List[tuple] = []  # (tick time, Emission or None)

    def tick_once(self):
        if self.next_tick_ns > self.clock.now():
            self.clock.set(self.next_tick_ns)
        now = self.clock.now()
        if self.feed is not None:
            self.feed(now)
        e = self.loop.tick()
        self.ticks.append((now, e))
        self.next_tick_ns = now + self.dt_ns
        return e

    def advance(self, ns: int) -> None:
        """Let ``ns`` of fake time pass, running every tick strictly before the end (a tick
        at exactly the end runs after whatever the caller does next, e.g. hand-over)."""
        target = self.clock.now() + int(ns)
        while self.next_tick_ns < target:
            self.tick_once()
        if target > self.clock.now():
            self.clock.set(target)

    def run_pending(self) -> bool:
        if not self.executor.pending:
            return False
        i = self.jobs_run
        self.jobs_run += 1
        q, a = self.queue_ns, self.actuate_ns
        return self.executor.run_pending(
            before=(lambda: self.advance(q(i))) if q else None,
            between=(lambda: self.advance(a(i))) if a else None)

    def run(self, n_ticks: int) -> None:
        """``n_ticks`` top-level ticks (plus those inside inferences)."""
        for _ in range(n_ticks):
            self.tick_once()
            self.run_pending()

    def jump_clock(self, t_ns: int) -> None:
        """Set the stamp clock (e.g. back, for a bag loop); the next tick happens at t_ns."""
        self.clock.set(t_ns)
        self.next_tick_ns = t_ns


class ScriptedPolicy:
    """Fake policy.  ``make(snapshot, rtc, call_index) -> [H, D]``; ``latency_ns`` (int or
    f(call_index)) is spent through ``driver.advance``; ``fail_on``: call indices that raise."""

    def __init__(self, make: Callable, latency_ns=0, fail_on: Iterable[int] = ()):
        self.make = make
        self.latency = _const(latency_ns)
        self.fail_on = set(fail_on)
        self.driver: Optional[TickDriver] = None
        self.calls: List[tuple] = []  # (snapshot, rtc)

    def __call__(self, snapshot, rtc):
        i = len(self.calls)
        self.calls.append((snapshot, rtc))
        lat = self.latency(i) if self.latency else 0
        if lat:
            if self.driver is None:
                raise RuntimeError("ScriptedPolicy with latency needs .driver")
            self.driver.advance(lat)
        if i in self.fail_on:
            raise RuntimeError(f"injected failure in call {i}")
        return self.make(snapshot, rtc, i)


def sensor_feeder(loop: ControlLoop, cameras: Sequence[str] = (), state_dim: Optional[int] = None,
                  observe_ns: int = 0, image_hw=(4, 4)) -> Callable[[int], None]:
    """Feed every camera and the state at each tick, stamped ``observe_ns`` before receipt."""
    img = np.zeros((image_hw[0], image_hw[1], 3), dtype=np.uint8)
    state = np.zeros(state_dim, dtype=np.float32) if state_dim else None

    def feed(now_ns: int) -> None:
        for cam in cameras:
            loop.on_image(cam, img, now_ns - observe_ns)
        if state is not None:
            loop.on_state(state, now_ns - observe_ns)
    return feed


def encode_call_index(snapshot, rtc, call: int, horizon: int, action_dim: int) -> np.ndarray:
    """Default fake chunk: action i = [call, i, 0, ...] (which call produced it, which index)."""
    a = np.zeros((horizon, action_dim), dtype=np.float32)
    a[:, 0] = call
    if action_dim > 1:
        a[:, 1] = np.arange(horizon)
    return a


@dataclass
class Sim:
    loop: ControlLoop
    clock: FakeClock
    executor: ManualExecutor
    driver: TickDriver
    policy: ScriptedPolicy
    chunks: list = field(default_factory=list)
    reports: list = field(default_factory=list)
    events: list = field(default_factory=list)

    def event_kinds(self) -> List[str]:
        return [k for k, _ in self.events]


def make_sim(config, make: Optional[Callable] = None, latency_ns=0, *, observe_ns: int = 0, queue_ns=None,
             actuate_ns=None, fail_on: Iterable[int] = (), feed: bool = True, start_ns: int = 1_000 * 10**9) -> Sim:
    """A loop on a FakeClock + ManualExecutor + TickDriver, recording chunks, margin
    reports and events; ``feed`` keeps every configured sensor fresh at each tick."""
    clock = FakeClock(start_ns)
    ex = ManualExecutor()
    if make is None:
        def make(snap, rtc, i):
            return encode_call_index(snap, rtc, i, config.horizon, config.action_dim)
    policy = ScriptedPolicy(make, latency_ns, fail_on)
    sim_chunks, sim_reports, sim_events = [], [], []
    loop = ControlLoop(config, policy, clock, ex, on_chunk=sim_chunks.append, on_margin=sim_reports.append,
                       on_event=lambda k, d: sim_events.append((k, d)))
    feeder = sensor_feeder(loop, tuple(config.cameras) + tuple(config.optional_cameras), config.state_dim,
                           observe_ns) if feed else None
    driver = TickDriver(loop, clock, ex, feeder, queue_ns, actuate_ns)
    policy.driver = driver
    return Sim(loop, clock, ex, driver, policy, sim_chunks, sim_reports, sim_events)


__all__ = ["TickDriver", "ScriptedPolicy", "sensor_feeder", "encode_call_index", "Sim", "make_sim"]
