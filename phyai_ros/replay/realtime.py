"""Real-time mode (rate r): messages leave at their recorded spacing divided by r, paced on the monotonic clock.

``/clock`` follows the bag's time source, published with every message, at every control-grid instant
(multiples of the node's dt) and at ``clock_hz`` in between, so ticks fire on the grid and latencies are
resolved to about 1/clock_hz.  Latencies are in replay-clock time: at rate r a replay second lasts 1/r wall
seconds, so at r < 1 the node looks r times as fast as it is (a slower robot), at r > 1 slower; r = 1
measures it.  Each message's lateness against its pace is kept (``lags``; a p99 over 20 ms is a
``replay_lag`` event)."""
from __future__ import annotations

import time
from typing import List, Tuple

import numpy as np

from phyai_ros.control.clock import NS_PER_S
from phyai_ros.replay.playback import NodeLost, Playback
from phyai_ros.replay.scan import Event, iter_bag


class RealtimePlay:
    """Real-time mode (module doc): messages and /clock leave at the bag's spacing divided by the rate, paced
    on the monotonic clock.  Owns the pacing (the bag time and wall time the replay started at), the clock
    plan and the recorded clock jumps still ahead."""

    def __init__(self, playback: Playback):
        self.playback = playback
        self.log0 = 0            # the bag time whose replay clock is the start instant
        self.wall0 = 0.0         # time.monotonic() at log0
        self.jumps: List[Tuple[int, int, int]] = []   # (bag time, clock before, clock after) still to come
        self.played = 0          # messages played so far (what an interrupted replay got through)
        self.lags: List[float] = []

    def run(self, t0: int) -> Tuple[int, list]:
        """Play every message; the number played and each message's lateness (s) against its pace."""
        pb = self.playback
        s, o, tm = pb.session, pb.options, pb.session.time_map
        first_log = min(it.log_ns for it in s.items)
        # the bag time whose replay clock is t0 (identity map: t0 itself)
        self.log0 = first_log - (tm(first_log) - t0)
        log_end = max(it.log_ns for it in s.items) + int(o.tail * NS_PER_S)
        plan = self._clock_plan(self.log0, log_end)
        self.wall0 = time.monotonic()
        self.jumps = list(tm.jumps)
        lags = self.lags
        k = 0
        n_plan = len(plan)
        last_alive_check = time.monotonic()
        for item, (conn, log_ns, raw, _) in zip(s.items, iter_bag(s.path)):
            assert item.log_ns == log_ns and item.topic == conn.topic, "bag changed between scan and play"
            while k < n_plan and plan[k] < item.log_ns:
                self._wait_until(int(plan[k]))
                self._pass_jumps(int(plan[k]))
                pb.set_clock(tm(int(plan[k])), int(plan[k]))
                k += 1
            lag = self._wait_until(item.log_ns)
            self._pass_jumps(item.log_ns)
            if item.publish and item.role not in ("clock", "excluded"):
                if item.sim_ns != pb.clock_ns:
                    pb.set_clock(item.sim_ns, item.log_ns)
                pb.publish(item, raw)
                lags.append(lag)
            self.played += 1
            if time.monotonic() - last_alive_check > 0.5:
                last_alive_check = time.monotonic()
                if not pb.alive():
                    raise NodeLost(self.played)
        while k < n_plan:
            self._wait_until(int(plan[k]))
            pb.set_clock(tm(int(plan[k])), int(plan[k]))
            k += 1
        self._run_on(log_end)
        return self.played, lags

    def _clock_plan(self, log_start: int, log_end: int) -> np.ndarray:
        """Bag times (ns) at which /clock is published besides the messages: every 1/clock_hz and
        where the replay clock crosses a control-grid instant."""
        tm, dt = self.playback.session.time_map, self.playback.dt_ns
        step = int(NS_PER_S / self.playback.options.clock_hz)
        uniform = np.arange(log_start, log_end + 1, step, dtype=np.int64)
        if tm.identity:
            grid = np.arange(((log_start // dt) + 1) * dt, log_end + 1, dt, dtype=np.int64)
        else:
            pts = []
            samples = tm.samples
            bounds = [log_start] + [l for l, _ in samples if log_start < l < log_end] + [log_end]
            for a, b in zip(bounds, bounds[1:]):
                sa, sb = tm(a), tm(max(a, b - 1))
                g = ((sa // dt) + 1) * dt
                while g <= sb:
                    pts.append(a + (g - sa))
                    g += dt
            grid = np.array(pts, dtype=np.int64)
        return np.unique(np.concatenate([uniform, grid]))

    def _wait_until(self, log_ns: int) -> float:
        """Sleep until bag time ``log_ns`` is due; how late it is (s) when the sleep ends."""
        target = self.wall0 + (log_ns - self.log0) / NS_PER_S / self.playback.options.rate
        delay = target - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        return time.monotonic() - target

    def _pass_jumps(self, log_ns: int) -> None:
        """Play the recorded clock jumps at or before bag time ``log_ns``."""
        pb = self.playback
        while self.jumps and self.jumps[0][0] <= log_ns:
            jl, before, after = self.jumps.pop(0)
            pb.recording.add_event(Event("clock_jump_played", f"replay clock jumped {(after - before) / NS_PER_S:+.3f} s",
                                         sim_ns=after, log_ns=jl, source="replay"))
            if after < before:
                pb.jump_back()
                # land on the control grid so the node's reset timer keeps ticking on it
                g = (after // pb.dt_ns) * pb.dt_ns
                pb.set_clock(g, jl - (after - g))

    def _run_on(self, log_end: int) -> None:
        """Run the clock on after the last message until the node reports once more, so the counters cover
        the whole replay."""
        pb = self.playback
        o, tm = pb.options, pb.session.time_map
        end_clock = pb.clock_ns
        step = int(NS_PER_S / o.clock_hz)
        deadline = time.monotonic() + 2.0 + 2 * pb.info.diagnostics_period / o.rate
        log_now = log_end
        while time.monotonic() < deadline:
            with pb.recording.cond:
                if any(d.msg["stamp_ns"] >= end_clock for d in pb.recording.diags[-3:]):
                    break
            log_now += step
            self._wait_until(log_now)
            pb.set_clock(tm(log_now), log_now)


__all__ = ["RealtimePlay"]
