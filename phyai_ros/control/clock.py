"""Clocks for the control loop.

All times are ``int`` nanoseconds.  ``now()`` is stamp time (ROS time in the node, so
``use_sim_time`` and bag replay work): sensor stamps, chunk ``t0`` and every latency
segment are measured on it, so they are commensurable with the action timer, which also
runs on ROS time.  ``monotonic()`` never goes back; compute durations are measured on it
and converted to stamp time by the rate ``ClockRate`` estimates (see control/margin.py).  ``FakeClock`` makes the loop testable
to the tick and can jump back to emulate a bag loop under sim time.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Protocol, runtime_checkable

NS_PER_S = 1_000_000_000


def s_to_ns(seconds: float) -> int:
    """Seconds (float) -> integer nanoseconds, rounded to nearest."""
    return int(round(seconds * NS_PER_S))


def ns_to_s(ns: int) -> float:
    return ns / NS_PER_S


@runtime_checkable
class Clock(Protocol):
    def now(self) -> int:
        """Stamp time (ROS time), int ns; may jump back (sim time, bag loop)."""

    def monotonic(self) -> int:
        """Monotonic time, int ns; never goes back."""


class ClockRate:
    """Rate of the stamp clock relative to the monotonic clock (1 in real time, the replay
    rate under sim time), from the (stamp, monotonic) pairs of the last ``window_ns`` of
    monotonic time.  1.0 until the pairs span ``min_span_ns``; reset on a clock jump."""

    def __init__(self, window_ns: int = 3 * NS_PER_S, min_span_ns: int = NS_PER_S // 10):
        self.window_ns, self.min_span_ns = int(window_ns), int(min_span_ns)
        self.reset()

    def reset(self) -> None:
        self._pairs: deque = deque()

    def add(self, stamp_ns: int, mono_ns: int) -> None:
        self._pairs.append((int(stamp_ns), int(mono_ns)))
        while len(self._pairs) > 2 and mono_ns - self._pairs[1][1] >= self.window_ns:
            self._pairs.popleft()

    def rate(self) -> float:
        if len(self._pairs) < 2:
            return 1.0
        (s0, m0), (s1, m1) = self._pairs[0], self._pairs[-1]
        if m1 - m0 < self.min_span_ns or s1 <= s0:
            return 1.0
        return (s1 - s0) / (m1 - m0)


class MonotonicClock:
    """Real clock: ``now`` = system time (what ROS time is without sim time)."""

    def now(self) -> int:
        return time.time_ns()

    def monotonic(self) -> int:
        return time.monotonic_ns()


class CallableClock:
    """Adapter for the node: ``CallableClock(lambda: node.get_clock().now().nanoseconds)``."""

    def __init__(self, now_ns: Callable[[], int], monotonic_ns: Callable[[], int] = time.monotonic_ns):
        self._now = now_ns
        self._mono = monotonic_ns

    def now(self) -> int:
        return int(self._now())

    def monotonic(self) -> int:
        return int(self._mono())


class FakeClock:
    """Hand-driven clock.  ``advance`` moves both times forward; ``set`` may move stamp
    time backwards (bag loop) while the monotonic time stays put.  Thread-safe."""

    def __init__(self, start_ns: int = 1_000 * NS_PER_S):
        self._now = int(start_ns)
        self._mono = 0
        self._lock = threading.Lock()

    def now(self) -> int:
        with self._lock:
            return self._now

    def monotonic(self) -> int:
        with self._lock:
            return self._mono

    def advance(self, ns: int) -> int:
        if ns < 0:
            raise ValueError("advance() only moves forward; use set() to jump back")
        with self._lock:
            self._now += int(ns)
            self._mono += int(ns)
            return self._now

    def set(self, t_ns: int) -> int:
        """Set stamp time; forward moves also advance monotonic, backward ones do not."""
        with self._lock:
            t_ns = int(t_ns)
            if t_ns > self._now:
                self._mono += t_ns - self._now
            self._now = t_ns
            return self._now


def stamp_to_ns(stamp) -> int:
    """A builtin_interfaces/Time (an rclpy message, a bag's rosbags message: anything with ``sec`` and
    ``nanosec``) -> int ns; the one stamp conversion of the package."""
    return int(stamp.sec) * NS_PER_S + int(stamp.nanosec)
