"""Margin monitor: segments and M_ctrl exactly equal to injected latencies (fake clock),
window quantiles, P(M>=0) with its Wilson bound, status transitions, roofline X/Y."""
import math

import numpy as np
import pytest

from phyai_ros.control import (ERROR, OK, WARN, LatencyRecord, MarginMonitor, required_samples,
                               wilson_lower)
from phyai_ros.control.roofline import y_roof, y_sequential
from phyai_ros.control.testing import make_sim

from control_cases import DT, MS, cfg


def test_segments_and_margin_equal_injected_latencies():
    sim = make_sim(cfg(), latency_ns=25 * MS, observe_ns=3 * MS, queue_ns=1 * MS, actuate_ns=2 * MS)
    sim.driver.run(40)
    assert len(sim.reports) >= 5
    r0 = sim.reports[0]
    assert not r0.in_window and math.isnan(r0.budget) and math.isnan(r0.margin)  # startup chunk
    for c, r in zip(sim.chunks[1:], sim.reports[1:]):
        lat = c.latency
        # ns-exact instants
        assert lat.recv_ns - lat.stamp_ns == 3 * MS
        assert lat.snapshot_ns == lat.recv_ns
        assert lat.queue_ns == 1 * MS and lat.inference_ns == 25 * MS and lat.actuate_ns == 2 * MS
        assert lat.ready_ns - lat.snapshot_ns == 28 * MS
        # trigger after index 5 of the previous chunk: it covers 4 more slots + the current one
        assert lat.cover_end_ns - lat.snapshot_ns == 5 * DT
        assert r.chunk_seq == c.seq and r.in_window
        assert (r.latency_observe, r.latency_transfer, r.latency_queue, r.latency_inference,
                r.latency_actuate) == pytest.approx(
            (0.003, 0.0, 0.001, 0.025, 0.002), abs=1e-12)
        assert r.budget == pytest.approx(0.053, abs=1e-12)  # 50 ms cover + 3 ms observation age
        assert r.margin == pytest.approx(0.022, abs=1e-12)
        assert r.margin == pytest.approx(r.budget - (r.latency_inference + r.latency_observe + r.latency_transfer
                                                     + r.latency_queue + r.latency_actuate), abs=1e-12)
        assert r.consumed == 2
    last = sim.reports[-1]
    assert last.margin_p50 == last.margin_p95 == last.margin_p99 == pytest.approx(0.022)
    assert last.p_nonnegative == 1.0
    n = last.window_size
    assert last.p_nonnegative_lower == pytest.approx(n / (n + 1.2815515655446004 ** 2), abs=1e-9)


def test_transfer_segment_is_buffer_wait():
    sim = make_sim(cfg(), latency_ns=5 * MS, feed=False)
    loop, clk = sim.loop, sim.clock
    t = clk.now()
    loop.on_state(np.zeros(3, np.float32), t - 4 * MS)   # state: observe 4 ms
    clk.set(t + 2 * MS)
    loop.on_image("front", np.zeros((4, 4, 3), np.uint8), t - 1 * MS)  # image received later, newer stamp
    clk.set(t + 7 * MS)
    loop.tick()
    sim.driver.run_pending()
    lat = sim.chunks[0].latency
    # anchor = oldest stamp = the state: observe 4 ms, then it waited 7 ms for the trigger
    assert lat.stamp_ns == t - 4 * MS and lat.recv_ns == t
    assert lat.observe == pytest.approx(0.004) and lat.transfer == pytest.approx(0.007)
    assert lat.critical == pytest.approx(lat.observe + lat.transfer + lat.queue + lat.inference + lat.actuate)


def test_negative_margin_iff_deadline_miss():
    lats = [20, 25, 25, 25, 65, 15, 25, 25, 45, 25, 25, 55, 35, 25, 25, 25, 75]
    sim = make_sim(cfg(delay_window=3, initial_delay_ticks=1), latency_ns=lambda i: lats[i % len(lats)] * MS,
                   queue_ns=1 * MS, actuate_ns=2 * MS)
    sim.driver.run(150)
    reps = [r for r in sim.reports if r.in_window]
    assert len(reps) >= 15
    neg = [r for r in reps if r.margin < 0]
    assert 0 < len(neg) < len(reps), "the scenario must contain both hits and misses"
    hist = sim.loop.history
    by_seq = {c.seq: c for c in sim.chunks}
    for r in reps:
        lat = by_seq[r.chunk_seq].latency
        # deadline-miss slots between the old chunk's end and this chunk's hand-over
        missed = [e for e in hist if e.is_miss and lat.cover_end_ns <= e.slot_ns < lat.ready_ns + DT
                  and e.t_ns >= lat.snapshot_ns]
        assert (r.margin < 0) == bool(missed), (r.chunk_seq, r.margin, len(missed))
    total_miss_slots = sim.loop.counters()["deadline_misses"]
    assert total_miss_slots >= len(neg)


def test_window_quantiles_and_probability():
    mon = MarginMonitor(window=100, eps=0.05, confidence=0.9, min_samples=5, error_p_threshold=0.5,
                        error_consecutive_misses=0)
    margins_ms = [30, -5, 12, 8, 40, 22, -1, 15, 9, 18, 27, 3]
    rep = None
    for i, m in enumerate(margins_ms):
        rec = LatencyRecord(stamp_ns=0, recv_ns=0, snapshot_ns=0, inference_ns=10 * MS, actuate_ns=10 * MS,
                            ready_ns=20 * MS, cover_end_ns=20 * MS + m * MS)
        rep = mon.add_chunk(rec, seq=i, consumed=1, now_ns=0)
        assert rep.margin == pytest.approx(m / 1e3)
    m = np.array(margins_ms) / 1e3
    assert rep.window_size == 12
    assert (rep.margin_p50, rep.margin_p95, rep.margin_p99) == pytest.approx(tuple(np.percentile(m, [50, 5, 1])))
    assert rep.margin_p95 < 0 < rep.margin_p50  # 'p95' = margin met by 95 % of chunks (low tail)
    assert rep.p_nonnegative == pytest.approx(10 / 12)
    assert rep.p_nonnegative_lower == pytest.approx(wilson_lower(10, 12, 0.9))


def test_wilson_bound_values():
    # hand-computed one-sided 95 % Wilson bound for 45/50: 0.80845
    assert wilson_lower(45, 50, 0.95) == pytest.approx(0.80845, abs=2e-4)
    z = 1.2815515655446004
    assert wilson_lower(40, 40, 0.9) == pytest.approx(40 / (40 + z * z))
    assert wilson_lower(0, 10, 0.9) == 0.0
    # never above the observed share (at k = 0 rounding left 3e-18 for n = 29, 55, ...: a report said lower > p)
    assert all(wilson_lower(k, n, 0.9) <= k / n for n in range(1, 200) for k in range(n + 1))
    assert math.isnan(wilson_lower(0, 0, 0.9))
    assert wilson_lower(90, 100, 0.9) > wilson_lower(9, 10, 0.9)
    assert required_samples(0.05, 0.9) == 32
    assert wilson_lower(32, 32, 0.9) >= 0.95 > wilson_lower(31, 31, 0.9)


def _rec(margin_ms):
    return LatencyRecord(stamp_ns=0, recv_ns=0, snapshot_ns=0, inference_ns=5 * MS, actuate_ns=5 * MS,
                         ready_ns=10 * MS, cover_end_ns=10 * MS + int(margin_ms * MS))


def test_status_transitions_ok_warn_error():
    mon = MarginMonitor(window=100, eps=0.05, confidence=0.9, min_samples=20, error_p_threshold=0.8,
                        error_consecutive_misses=3)
    levels = []
    for i in range(10):
        levels.append(mon.add_chunk(_rec(5), seq=i, consumed=0, now_ns=0).level)
    assert set(levels) == {WARN}  # fewer than min_samples
    for i in range(30):
        r = mon.add_chunk(_rec(5), seq=i, consumed=0, now_ns=0)
    assert r.level == OK and r.window_size == 40 and r.p_nonnegative_lower >= 0.95, r.message
    r = mon.add_chunk(_rec(-1), seq=41, consumed=0, now_ns=0)  # one miss: bound drops below target
    assert r.level == WARN and r.p_nonnegative_lower < 0.95 and r.p_nonnegative > 0.95, r.message
    r = mon.add_chunk(_rec(-1), seq=42, consumed=0, now_ns=0)
    assert r.level == WARN
    r = mon.add_chunk(_rec(-1), seq=43, consumed=0, now_ns=0)  # 3 consecutive misses
    assert r.level == ERROR and "last 3" in r.message
    r = mon.add_chunk(_rec(5), seq=44, consumed=0, now_ns=0)
    assert r.level == WARN
    # misses interleaved (never 3 in a row) until P-hat < 0.8 -> ERROR by rate
    seq = 45
    while True:
        for m in (-1, -1, 5):
            r = mon.add_chunk(_rec(m), seq=seq, consumed=0, now_ns=0)
            seq += 1
        if r.p_nonnegative < 0.8:
            break
        assert r.level == WARN
    assert r.level == ERROR and "error threshold" in r.message
    # recovery: a full window of hits -> OK again
    for i in range(100):
        r = mon.add_chunk(_rec(5), seq=seq + i, consumed=0, now_ns=0)
    assert r.level == OK


def test_config_rejects_window_that_cannot_reach_target():
    with pytest.raises(ValueError, match="margin_window"):
        cfg(eps=0.01, confidence=0.95, margin_window=100)
    cfg(eps=0.01, confidence=0.95, margin_window=300)


def test_roofline_environment_bound_and_inference_bound():
    # environment-bound: 25 ms inference hidden behind 60 ms of execution per cycle
    sim = make_sim(cfg(), latency_ns=25 * MS, queue_ns=1 * MS, actuate_ns=2 * MS)
    sim.driver.run(40)
    r = sim.reports[-1]
    assert r.cycle_env == pytest.approx(0.060) and r.cycle_control == pytest.approx(0.060)
    assert r.roofline_x == pytest.approx(60 / 25) and r.roofline_y == pytest.approx(1.0)
    assert r.roofline_y_seq == pytest.approx(r.roofline_x / (1 + r.roofline_x)) and r.roofline_y_roof == 1.0
    # inference-bound: 85 ms inference, a chunk is adopted with 1-2 actions left -> the
    # robot waits (hold_last) most of every cycle
    sim = make_sim(cfg(deadline_policy="hold_last", rtc_overlap=0), latency_ns=85 * MS)
    sim.driver.run(15)  # each top-level tick here runs a whole inference (8 more ticks)
    hist = sim.loop.history
    by_seq = {c.seq: c for c in sim.chunks}
    env = ctl = inf = 0
    adopted = {x.chunk_seq for x in sim.reports}
    for c in [c for c in sim.chunks if c.seq + 1 in adopted]:  # completed cycles (all in the window)
        served = [e for e in hist if e.chunk_seq == c.seq]
        env += sum(e.kind == "chunk" for e in served) * DT
        ctl += len(served) * DT
        inf += by_seq[c.seq + 1].latency.inference_ns
    r = sim.reports[-1]
    assert sim.loop.counters()["expired_chunks"] == 0 and len(sim.chunks) >= 8
    assert r.roofline_x == pytest.approx(env / inf) and r.roofline_y == pytest.approx(env / ctl)
    assert r.roofline_x < 1 and r.roofline_y < 1
    assert r.roofline_y_roof == pytest.approx(r.roofline_x)
    assert r.roofline_y_seq <= r.roofline_y <= r.roofline_y_roof + 1e-9


def test_roofline_bounds_order_and_limits():
    """``control.roofline``, shared by this monitor and the replay report: no overlap never beats perfect
    overlap; they meet where inference is free (X = inf, a stepped replay) or acting is (X = 0); an undefined
    X leaves both undefined."""
    for x in (1e-3, 0.5, 0.9, 1.0, 2.4, 1e3):
        assert 0 < y_sequential(x) < y_roof(x) <= 1
    assert y_sequential(0.0) == y_roof(0.0) == 0.0
    assert y_sequential(1.0) == 0.5 and y_roof(1.0) == 1.0   # balanced: half the time acting without overlap
    assert y_sequential(math.inf) == y_roof(math.inf) == 1.0
    assert math.isnan(y_sequential(math.nan)) and math.isnan(y_roof(math.nan))
