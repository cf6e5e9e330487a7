"""Stepped mode: deterministic, and as fast as the node allows.

The clock advances on the control grid one dt at a time.  Before each step the messages recorded up to it are
published (the clock set to each one's time first), the player waits ``settle`` (wall) so the node has taken
them, then moves the clock to the grid instant; the node ticks and reports on /diagnostics (needs
``diagnostics.period == control.dt``: one report per tick); if that report says an inference is in flight, the
clock is held until its chunk arrives.  So which messages each inference sees, and when its chunk is adopted,
do not depend on CPU speed: with a fixed noise seed two runs give identical chunks.  The price: an inference
takes zero replay-clock time, so latencies and margins of a stepped run describe the logic, not the machine
(the report says so)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import List, Optional

from phyai_ros import diagnostics
from phyai_ros.control.clock import NS_PER_S
from phyai_ros.replay.playback import NodeLost, Playback
from phyai_ros.replay.scan import Event, iter_bag


@dataclass
class StepCounts:
    """What stepping counted: the messages played, the ticks the node did not report in time, the steps that
    did not advance its tick counter by one, and that counter at the last step (None: unknown)."""

    played: int = 0
    missed_reports: int = 0
    tick_mismatch: int = 0
    ticks: Optional[int] = None
    baseline_chunks: int = 0       # the node's chunk counter when the replay started


class SteppedPlay:
    """Stepped mode (module doc): the clock moves one control period at a time, each move waits for the node's
    report of that tick and for any inference it started.  Owns the step counts and the pending inputs."""

    def __init__(self, playback: Playback):
        self.playback = playback
        self.counts = StepCounts()
        self.lags: List[float] = []   # none in stepped mode (no pace to be late against)
        self.pending = False        # inputs published since the last tick (the node gets ``settle`` to take them)

    def run(self, t0: int) -> int:
        """Play every message; the number played."""
        pb = self.playback
        s, dt, info = pb.session, pb.dt_ns, pb.info
        if abs(info.diagnostics_period - info.dt) > 1e-9:
            raise RuntimeError(f"stepped mode needs one node report per tick: start the node with "
                               f"-p diagnostics.period:={info.dt:g} (it has {info.diagnostics_period:g})")
        if info.compute_clock != "stamp":
            raise RuntimeError("stepped mode holds /clock while the node infers, so its latencies are measured in "
                               "simulated time: start the node with -p control.compute_clock:=stamp (it has "
                               f"{info.compute_clock})")
        self.counts.baseline_chunks = pb.recording.latest_diag()["counters"].get("chunks", 0)
        cur = t0
        jumps = list(s.time_map.jumps)  # (bag time, clock before, clock after), in bag order
        n = len(s.items)
        for item, (conn, log_ns, raw, _) in zip(s.items, iter_bag(s.path)):
            assert item.log_ns == log_ns and item.topic == conn.topic, "bag changed between scan and play"
            while jumps and jumps[0][0] <= item.log_ns:
                _, before, after = jumps.pop(0)
                cur = self._jump(item, cur, before, after)
            while item.role != "clock" and cur + dt <= item.sim_ns:
                cur += dt
                self._tick(cur)
            if item.publish and item.role not in ("clock", "excluded"):
                if item.sim_ns > pb.clock_ns:
                    pb.set_clock(item.sim_ns, item.log_ns)
                pb.publish(item, raw)
                self.pending = True
            self.counts.played += 1
        end = s.end_sim + int(pb.options.tail * NS_PER_S)
        while cur + dt <= end:
            cur += dt
            self._tick(cur)
        if self.counts.tick_mismatch:
            pb.recording.add_event(Event("tick_mismatch", f"{self.counts.tick_mismatch} steps did not advance the "
                                         "node's tick counter by exactly one (timer phase off the grid?)",
                                         source="replay"))
        return n if self.counts.played == n else self.counts.played

    def _jump(self, item, cur: int, before: int, after: int) -> int:
        """Play a recorded clock jump at ``item``; the grid instant the clock stands at afterwards."""
        pb = self.playback
        dt, o = pb.dt_ns, pb.options
        target = (after // dt) * dt
        pb.recording.add_event(Event("clock_jump_played", f"replay clock jumped {(target - cur) / NS_PER_S:+.3f} s",
                                     sim_ns=target, log_ns=item.log_ns, source="replay"))
        if after >= before:
            self._tick(target)  # a jump forward fires the timers once
            return target
        # The node resets its timers on a jump back to (new time + period).  Land the jump on the grid point
        # before the target and publish nothing but grid points until the node reports a tick again, so its
        # timer phase stays on the grid.
        pb.jump_back(forget_reports=True)
        if self.pending and o.settle > 0:
            time.sleep(o.settle)
        self.pending = False
        pb.set_clock(target - dt, item.log_ns - (item.sim_ns - (target - dt)))
        time.sleep(max(o.settle, 0.02))
        return self._resync(target)

    def _tick(self, t: int) -> None:
        """Move the clock to grid instant t and wait until the node has ticked and finished any inference."""
        pb, o, counts = self.playback, self.playback.options, self.counts
        if self.pending and o.settle > 0:
            time.sleep(o.settle)
        self.pending = False
        if not pb.alive():
            raise NodeLost(counts.played)
        pb.set_clock(t)
        if not pb.wait(lambda: pb.reported_at(t), o.step_timeout, republish=t):
            counts.missed_reports += 1
            if counts.missed_reports <= 3:
                pb.recording.add_event(Event("step_timeout", f"no node report for the tick at {t} within "
                                             f"{o.step_timeout:g} s; stepping on (results may depend on timing)",
                                             sim_ns=t, source="replay"))
            return
        d = pb.recording.diag_by_stamp[t]
        ticks = d["counters"].get("ticks")
        if counts.ticks is not None and ticks is not None and ticks != counts.ticks + 1:
            counts.tick_mismatch += 1
        counts.ticks = ticks
        if diagnostics.in_flight(d):
            want = d["counters"].get("chunks", 0) - counts.baseline_chunks + 1
            if not pb.wait(lambda: len(pb.recording.chunks) >= want, o.inference_timeout):
                pb.recording.add_event(Event("inference_timeout", f"an inference started by the tick at {t} "
                                             f"delivered no chunk within {o.inference_timeout:g} s", sim_ns=t,
                                             source="replay"))

    def _resync(self, t: int, attempts: int = 5) -> int:
        """Step on grid points from t until the node reports a tick; returns the grid point reached."""
        pb = self.playback
        for _ in range(attempts):
            pb.set_clock(t)
            if pb.wait(lambda: pb.reported_at(t), 1.0, republish=t):
                self.counts.ticks = None
                self._tick(t)  # consumes the report (in-flight inference, tick count)
                return t
            t += pb.dt_ns
        pb.recording.add_event(Event("step_timeout", "the node did not report a tick after the clock jump; "
                                     "stepping on", sim_ns=t, source="replay"))
        return t


__all__ = ["StepCounts", "SteppedPlay"]
