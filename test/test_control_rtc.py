"""RTC scheduling: trigger point, delay estimate (cold start excluded, consumed actions),
Y alignment to the new chunk's time, frozen-prefix splice, modes, and the guidance weights they give."""
import math

import numpy as np
import pytest
import torch

from phyai_ros.control import DelayEstimator
from phyai_ros.control.testing import make_sim
from phyai_ros.models.pi.modeling.solver import pad_prev_chunk
from phyai_ros.models.rtc_weights import rtc_prefix_weights

from control_cases import DT, MS, H, cfg  # noqa: F401


def traj(t_ns):
    """A smooth 'true' trajectory the fake policy tracks (2-D, per-slot time)."""
    t = t_ns / 1e9
    return np.stack([np.sin(3.0 * t), np.cos(2.0 * t)], axis=-1).astype(np.float32)


@pytest.mark.parametrize("initial_d,overlap", [(2, 2), (3, 1), (1, 4)])
def test_trigger_fires_at_remaining_d_plus_s(initial_d, overlap):
    # sub-tick latency: every warm delay sample is 0, so d_est = initial_d for the first
    # warm trigger (cold call excluded) and 0 afterwards
    sim = make_sim(cfg(initial_delay_ticks=initial_d, rtc_overlap=overlap), latency_ns=4 * MS)
    sim.driver.run(50)
    assert len(sim.chunks) >= 5
    assert sim.chunks[1].latency.remaining_at_trigger == initial_d + overlap
    assert sim.policy.calls[1][1].d == initial_d
    assert set(sim.loop.delay.samples) == {0} and sim.loop.delay_estimate() == 0
    for (snap, rtc), c in zip(sim.policy.calls[2:], sim.chunks[2:]):
        assert c.latency.remaining_at_trigger == overlap == rtc.n
        assert rtc.d == 0
    # never more than one inference in flight, one chunk per trigger
    assert sim.loop.counters()["inferences_started"] == len(sim.chunks)


def test_trigger_point_with_multi_tick_latency():
    sim = make_sim(cfg(initial_delay_ticks=2, rtc_overlap=2), latency_ns=25 * MS, queue_ns=1 * MS, actuate_ns=2 * MS)
    sim.driver.run(60)
    # consumed = 2 every time -> d_est = 2 -> trigger when 4 remain, i.e. right after index 5 was emitted
    assert sim.loop.delay.samples and set(sim.loop.delay.samples) == {2}
    for c in sim.chunks[1:]:
        assert c.latency.remaining_at_trigger == 4
        trig = [e for t, e in sim.driver.ticks if t == c.latency.snapshot_ns][0]
        assert trig.index == H - 1 - 4
    # and not one tick earlier: the tick before each trigger left 5 remaining and started nothing
    starts = [c.latency.snapshot_ns for c in sim.chunks[1:]]
    for t in starts:
        prev = [e for tt, e in sim.driver.ticks if tt == t - DT][0]
        assert prev.index == H - 1 - 5


def test_delay_estimator_quantile_cold_and_clamp():
    est = DelayEstimator(quantile=0.95, window=5, initial=3, max_ticks=10)
    assert est.estimate() == 3
    assert est.add(40, cold=True) is False and est.estimate() == 3  # cold start excluded
    for v in [1, 2, 2, 1]:
        est.add(v)
    assert est.estimate() == 2
    est.add(99)  # clamped to the horizon
    assert est.samples[-1] == 10 and est.estimate() == 10
    for v in [1, 1, 1, 1, 1]:
        est.add(v)  # window of 5 forgets the outlier
    assert est.estimate() == 1
    est2 = DelayEstimator(quantile=0.5, window=10, initial=0)
    for v in [0, 1, 2, 3, 4]:
        est2.add(v)
    assert est2.estimate() == 2


def test_loop_delay_samples_are_consumed_actions_cold_excluded():
    # cold call 45 ms, then 12 ms (+1 queue, +2 actuate): ready 15 ms after the trigger tick
    # -> adopted at the next-but-one tick -> exactly 1 action of the new chunk consumed
    sim = make_sim(cfg(initial_delay_ticks=4), latency_ns=lambda i: 45 * MS if i == 0 else 12 * MS,
                   queue_ns=1 * MS, actuate_ns=2 * MS)
    sim.driver.run(40)
    assert sim.chunks[0].latency.cold and not sim.chunks[1].latency.cold
    assert set(sim.loop.delay.samples) == {1}  # cold startup sample (4) not recorded
    rtcs = [r for _, r in sim.policy.calls[1:]]
    assert rtcs[0].d == 4  # initial estimate before any warm sample
    assert all(r.d == 1 for r in rtcs[1:])
    assert sim.loop.counters()["late_chunks"] == 0


def _remainder_checks(sim):
    by_seq = {c.seq: c for c in sim.chunks}
    hist = sim.loop.history
    n_checked = 0
    for k, (snap, rtc) in enumerate(sim.policy.calls[1:], start=1):
        prev = by_seq[k - 1]
        # new action 0 is the slot right after the trigger tick
        assert rtc.t0_ns == snap.taken_ns + DT
        j0 = (rtc.t0_ns - prev.t0_ns) // DT
        assert (rtc.t0_ns - prev.t0_ns) % DT == 0
        np.testing.assert_array_equal(rtc.prefix, prev.actions[j0:])
        assert rtc.n == H - j0 and rtc.d == min(rtc.d, rtc.n)
        # the last slot emitted before the trigger was prev's index j0 - 1
        trig = [e for e in hist if e.t_ns == snap.taken_ns and e.kind == "chunk"][0]
        assert trig.chunk_seq == prev.seq and trig.index == j0 - 1
        n_checked += 1
    return n_checked


def test_prefix_is_previous_remainder_aligned_to_new_time():
    sim = make_sim(cfg(), latency_ns=25 * MS, queue_ns=1 * MS, actuate_ns=2 * MS)
    sim.driver.run(60)
    assert _remainder_checks(sim) >= 6


def _tracking_policy(noise_per_call=0.05, freeze=True):
    """Follows traj(t) with a per-call offset in its free part; with ``freeze`` it copies the
    first d actions from Y (what the guided solver does for W_i = 1)."""
    def make(snap, rtc, call):
        t0 = rtc.t0_ns if rtc is not None else snap.taken_ns + DT
        a = traj(t0 + DT * np.arange(H)) + noise_per_call * call
        if rtc is not None and freeze:
            a[: rtc.d] = rtc.prefix[: rtc.d]
        return a
    return make


# call 1 consumes 3 actions, later ones 2: d_est (p95) = 3 > consumed, so most chunks are
# adopted while some of their frozen actions are still ahead
_LAT = dict(latency_ns=lambda i: 35 * MS if i == 1 else 25 * MS, queue_ns=1 * MS, actuate_ns=2 * MS)


def _switches(sim):
    em = [e for e in sim.loop.history if e.kind == "chunk"]
    return [(a, b) for a, b in zip(em, em[1:]) if b.chunk_seq != a.chunk_seq and b.chunk_seq >= 1]


def test_frozen_prefix_gives_seamless_splice():
    # the switch tick must emit exactly what the old chunk had committed for that slot
    sim = make_sim(cfg(initial_delay_ticks=3, enforce_frozen_prefix=False), make=_tracking_policy(), **_LAT)
    sim.driver.run(80)
    assert _remainder_checks(sim) >= 5
    by_seq = {c.seq: c for c in sim.chunks}
    switches = [(a, b) for a, b in _switches(sim) if b.index < by_seq[b.chunk_seq].d]
    assert len(switches) >= 5
    for a, b in switches:
        new, old = by_seq[b.chunk_seq], by_seq[a.chunk_seq]
        assert b.slot_ns == a.slot_ns + DT
        old_idx = (b.slot_ns - old.t0_ns) // DT
        np.testing.assert_allclose(b.action, old.actions[old_idx], atol=1e-6)  # no seam
        assert new.prefix_error == pytest.approx(0.0, abs=1e-6)


def test_without_freezing_the_seam_shows_and_enforcement_fixes_it():
    kw = dict(make=_tracking_policy(noise_per_call=0.5, freeze=False), **_LAT)
    jumps = {}
    for enforce in (False, True):
        sim = make_sim(cfg(initial_delay_ticks=3, enforce_frozen_prefix=enforce), **kw)
        sim.driver.run(40)
        by_seq = {c.seq: c for c in sim.chunks}
        seam = [np.max(np.abs(b.action - by_seq[a.chunk_seq].actions[(b.slot_ns - by_seq[a.chunk_seq].t0_ns) // DT]))
                for a, b in _switches(sim) if b.index < by_seq[b.chunk_seq].d]
        assert len(seam) >= 3
        jumps[enforce] = max(seam)
        warm = [c for c in sim.chunks if c.d > 0]
        assert all(c.prefix_error == pytest.approx(0.5, abs=1e-5) for c in warm)
        if enforce:
            for c, (_, rtc) in zip(sim.chunks[1:], sim.policy.calls[1:]):
                np.testing.assert_array_equal(c.actions[: c.d], rtc.prefix[: c.d])
    assert jumps[False] == pytest.approx(0.5, abs=1e-5)
    assert jumps[True] < 1e-6


def test_trained_mode_passes_frozen_prefix_and_off_mode_none():
    sim = make_sim(cfg(rtc_mode="trained", initial_delay_ticks=3), latency_ns=25 * MS)
    sim.driver.run(40)
    rtcs = [r for _, r in sim.policy.calls[1:]]
    assert rtcs and all(r is not None and r.mode == "trained" for r in rtcs)
    assert all(r.frozen.shape == (r.d, 2) and np.array_equal(r.frozen, r.prefix[: r.d]) for r in rtcs)
    assert all(r.d > 0 for r in rtcs)

    sim = make_sim(cfg(rtc_mode="off"), latency_ns=25 * MS)
    sim.driver.run(40)
    assert len(sim.policy.calls) >= 4 and all(r is None for _, r in sim.policy.calls)
    assert all(c.d == 0 and c.n_prefix == 0 and c.rtc_mode == "off" for c in sim.chunks)


def test_no_prefix_when_previous_chunk_exhausted():
    # second call hangs past the end of chunk 0: the third request has nothing left to freeze
    sim = make_sim(cfg(), latency_ns=lambda i: 150 * MS if i == 1 else 5 * MS)
    sim.driver.run(40)
    assert sim.loop.counters()["expired_chunks"] == 1
    assert sim.policy.calls[2][1] is None


def test_guidance_weights_schedules():
    """The soft mask that runs (the solver's): 1 over the frozen d, a ramp to len(Y), 0 beyond Y."""
    H_, d, n = 10, 2, 6
    lin = rtc_prefix_weights(d, n, H_, "linear").numpy()
    np.testing.assert_allclose(lin, [1, 1, 0.8, 0.6, 0.4, 0.2, 0, 0, 0, 0], atol=1e-6)
    ex = rtc_prefix_weights(d, n, H_, "exp").numpy()
    c = np.array([0.8, 0.6, 0.4, 0.2])
    np.testing.assert_allclose(ex[2:6], c * (np.exp(c) - 1) / (math.e - 1), atol=1e-6)
    assert np.all(ex[:2] == 1) and np.all(ex[6:] == 0)
    assert np.all(np.diff(ex[2:6]) < 0)
    # the loop's request (d, n = len(Y)) makes the mask zero exactly where Y ends
    sim = make_sim(cfg(), latency_ns=25 * MS)
    sim.driver.run(30)
    rtc = sim.policy.calls[1][1]
    w = rtc_prefix_weights(rtc.d, rtc.n, rtc.horizon, rtc.schedule).numpy()
    assert np.all(w[: rtc.d] == 1) and np.all(w[rtc.n:] == 0) and np.all(w[rtc.d: rtc.n] > 0)
    pp = pad_prev_chunk(torch.from_numpy(rtc.prefix.copy()), H, 2)[0].numpy()
    assert pp.shape == (H, 2) and np.array_equal(pp[: rtc.n], rtc.prefix) and not pp[rtc.n:].any()