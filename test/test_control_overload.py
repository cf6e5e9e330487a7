"""The monitor under overload (issue 11, items 1-4): expired chunks are deadline misses and
margin samples, silence is ERROR, missed timer slots are counted, compute segments come from
the monotonic clock, and every chunk stamp stays on one dt grid."""
from __future__ import annotations

import math

import numpy as np
import pytest

from phyai_ros.control import ControlConfig, ControlLoop
from phyai_ros.control.clock import FakeClock
from phyai_ros.control.margin import ERROR, OK, WARN
from phyai_ros.control.testing import ScriptedPolicy, TickDriver, encode_call_index, make_sim, sensor_feeder
from phyai_ros.control.worker import ManualExecutor

MS = 1_000_000
DT = 10 * MS


def cfg(**kw) -> ControlConfig:
    base = dict(dt=DT / 1e9, horizon=10, action_dim=2, cameras=("cam",), state_dim=3, rtc_overlap=2,
                margin_window=50, min_samples=5, eps=0.2, confidence=0.9, cold_start_inferences=0,
                max_observation_age=10.0)
    base.update(kw)
    return ControlConfig(**base)


def test_every_chunk_expiring_is_a_deadline_miss_and_error():
    # inference takes 150 ms, longer than the 100 ms horizon: no chunk can ever be executed
    sim = make_sim(cfg(), latency_ns=150 * MS)
    sim.driver.run(12)
    c = sim.loop.counters()
    assert len(sim.chunks) >= 6
    assert c["expired_chunks"] == len(sim.reports) == c["deadline_misses"]
    assert all(r.expired and r.in_window and r.margin < 0 for r in sim.reports)
    # a startup chunk's deadline is its own end: it arrived 40-60 ms after it
    assert all(-0.06 - 1e-9 <= r.margin <= -0.04 + 1e-9 for r in sim.reports)
    assert sim.reports[-1].level == ERROR and "missed their deadline" in sim.reports[-1].message
    assert not any(e is not None for _, e in sim.driver.ticks)  # nothing was ever commanded
    level, message = sim.loop.health()
    assert level == ERROR
    assert "no chunk adopted since start" in message and "inputs fresh" in message
    assert "last command from a chunk never" in message


def test_silence_after_a_run_out_is_error_with_the_time_since_the_last_command():
    lat = {0: 5 * MS}  # the first inference is fast, then every one takes 300 ms
    sim = make_sim(cfg(), latency_ns=lambda i: lat.get(i, 300 * MS))
    sim.driver.run(3)
    level, _ = sim.loop.health()
    assert level != ERROR
    sim.driver.run(20)
    level, message = sim.loop.health()
    assert level == ERROR
    assert message.startswith("no chunk adopted for") and "last command from a chunk" in message
    secs = float(message.split("last command from a chunk ")[1].split(" s ago")[0])
    assert secs > 0.1  # more than the horizon since the robot got a planned action
    c = sim.loop.counters()
    assert c["run_outs"] >= 1 and c["deadline_policy_ticks"] > 10
    assert c["deadline_misses"] >= c["expired_chunks"] >= 1


def test_no_input_at_all_is_error_after_one_horizon():
    sim = make_sim(cfg(), feed=False)
    sim.driver.run(5)
    assert sim.loop.health()[0] != ERROR
    sim.driver.run(10)
    level, message = sim.loop.health()
    assert level == ERROR and "inputs not usable (cam: no data)" in message


def test_an_action_timer_that_never_runs_is_error_after_one_horizon_of_monotonic_time():
    """No tick at all (use_sim_time with nothing on /clock, a stalled executor): stamp time may stand still, so
    the wait is measured on the monotonic clock; WARN for one horizon, then ERROR; a tick ends it, and after a
    pause (deactivate) the count starts again."""
    sim = make_sim(cfg())
    level, message = sim.loop.health()
    assert level == WARN and message.startswith("the action timer has not run yet")
    sim.clock.advance(90 * MS)                      # within the 100 ms horizon
    assert sim.loop.health()[0] == WARN
    sim.clock.advance(20 * MS)
    level, message = sim.loop.health()
    assert level == ERROR and message.startswith("the action timer has not run for 0.11 s"), message
    sim.driver.run(3)
    level, message = sim.loop.health()
    assert level != ERROR and not message.startswith("the action timer"), message
    sim.loop.pause()
    assert sim.loop.health()[0] == WARN             # counted anew from this check
    sim.clock.advance(150 * MS)
    assert sim.loop.health()[0] == ERROR


def test_healthy_loop_is_not_silent():
    sim = make_sim(cfg(), latency_ns=20 * MS)
    sim.driver.run(200)
    assert sim.loop.health()[0] == OK
    c = sim.loop.counters()
    assert c["deadline_misses"] == c["expired_chunks"] == c["missed_slots"] == 0


def test_missed_slots_are_counted_and_delivery_delay_reported():
    sim = make_sim(cfg(), latency_ns=5 * MS)
    sim.driver.run(20)
    assert sim.loop.counters()["missed_slots"] == 0
    # the timer callback is starved: the next tick runs 3.4 slots late
    sim.driver.next_tick_ns += 34 * MS
    sim.driver.run(1)
    c = sim.loop.counters()
    assert c["missed_slots"] == 3
    d = sim.loop.delivery.summary()
    assert d["max"] == pytest.approx(0.004)  # served slot +3 at 4 ms past its time
    assert abs(d["p50"]) < 1e-9
    assert "missed_slot" in sim.event_kinds()


def test_the_watchdog_names_missed_slots_among_the_causes():
    """An executor stall longer than a horizon: the ERROR says how many slots the timer missed (issue 22)."""
    sim = make_sim(cfg(), latency_ns=5 * MS)
    sim.driver.run(20)
    sim.driver.next_tick_ns += 300 * MS   # the timer callback starved for 30 slots
    sim.driver.run(1)
    level, message = sim.loop.health()
    assert level == ERROR and f"missed slots {sim.loop.counters()['missed_slots']}" in message, message


class _SimTimeClock:
    """A sim clock as a replay drives it: stamp time advances ``rate`` times faster than
    the monotonic clock and in steps of ``step_ns`` (the /clock period)."""

    def __init__(self, base: FakeClock, rate: float, step_ns: int):
        self.base, self.rate, self.step = base, rate, step_ns

    def now(self) -> int:
        t = self.base.now()
        return t - t % self.step

    def monotonic(self) -> int:
        return int(self.base.monotonic() / self.rate)


@pytest.mark.parametrize("rate", [1.0, 5.0])
def test_compute_segments_come_from_the_monotonic_clock(rate):
    fake = FakeClock()
    clock = _SimTimeClock(fake, rate, 5 * MS)
    config = cfg(horizon=40)
    ex = ManualExecutor()
    inference_sim_ns = [23 * MS + 1_300_000 * (i % 4) for i in range(40)]  # 23.0-26.9 ms of sim time
    policy = ScriptedPolicy(lambda s, r, i: encode_call_index(s, r, i, config.horizon, config.action_dim),
                            lambda i: inference_sim_ns[i])
    chunks = []
    loop = ControlLoop(config, policy, clock, ex, on_chunk=chunks.append)
    driver = TickDriver(loop, fake, ex, sensor_feeder(loop, ("cam",), 3))
    policy.driver = driver
    driver.run(150)
    assert len(chunks) >= 5
    steady = chunks[2:]  # the rate estimate needs 100 ms of monotonic time first
    inf = np.array([c.latency.inference_ns for c in steady])
    # not quantized to the 5 ms /clock period, and in the stamp clock's time base (sim time)
    assert np.count_nonzero(inf % (5 * MS) == 0) <= 1
    expected = np.array([inference_sim_ns[c.seq] for c in steady])
    assert np.all(np.abs(inf - expected) <= 0.05 * expected)
    for c in chunks:
        lat = c.latency
        assert lat.inference_wall_ns == pytest.approx(inference_sim_ns[c.seq] / rate, abs=2)
        # the five segments add up to ready - stamp within one /clock period ...
        total = lat.observe + lat.transfer + lat.queue + lat.inference + lat.actuate
        assert total == pytest.approx((lat.ready_ns - lat.stamp_ns) / 1e9, abs=0.005 * rate + 1e-3)
        # ... and the margin is the budget minus them, exactly
        if c.seq:
            assert lat.margin == pytest.approx(lat.B_ctrl - total, abs=1e-12)


def test_chunk_stamps_stay_on_one_grid_when_early_chunks_expire():
    lat = {0: 150 * MS, 1: 170 * MS, 2: 130 * MS}  # the first three expire, then the loop keeps up
    sim = make_sim(cfg(), latency_ns=lambda i: lat.get(i, 15 * MS))
    sim.driver.run(60)
    assert sim.loop.counters()["expired_chunks"] == 3
    t0 = [c.t0_ns for c in sim.chunks]
    assert len(t0) > 6
    assert all((t - t0[0]) % DT == 0 for t in t0)
    slots = [e.slot_ns for _, e in sim.driver.ticks if e is not None]
    assert slots and all((s - t0[0]) % DT == 0 for s in slots)


def test_negative_budget_when_the_observation_is_taken_after_the_run_out():
    lat = {0: 5 * MS}
    sim = make_sim(cfg(), latency_ns=lambda i: lat.get(i, 300 * MS))
    sim.driver.run(40)
    late = [r for r in sim.reports[1:] if not math.isnan(r.budget)]
    assert any(r.budget < 0 for r in late)  # observation newer than the executing chunk's end
