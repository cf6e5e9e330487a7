"""Chunk timeline and action timer: sequence numbers, t0 stamps, time order, no replay,
deadline-miss policies.  Fake clock throughout (exact, no sleeps)."""
import numpy as np
import pytest

from phyai_ros.control.testing import make_sim

from control_cases import DT, MS, H, cfg  # noqa: F401


def emissions(sim):
    return [e for _, e in sim.driver.ticks if e is not None]


def test_sequence_numbers_and_t0_stamps():
    sim = make_sim(cfg(), latency_ns=25 * MS, observe_ns=3 * MS, queue_ns=1 * MS, actuate_ns=2 * MS)
    t_start = sim.clock.now()
    sim.driver.run(60)
    assert len(sim.chunks) >= 8
    assert [c.seq for c in sim.chunks] == list(range(len(sim.chunks)))
    # startup chunk: action 0 is the slot after the trigger tick (the first tick)
    assert sim.chunks[0].t0_ns == t_start + DT
    for prev, c in zip(sim.chunks, sim.chunks[1:]):
        # triggered on a tick on the grid: t0 = the next slot, on the same grid as before
        assert c.t0_ns == c.latency.snapshot_ns + DT
        assert (c.t0_ns - prev.t0_ns) % DT == 0 and c.t0_ns > prev.t0_ns
        # observation stamp = oldest sensor stamp (all sensors stamped 3 ms before receipt)
        assert c.observation_stamp_ns == c.latency.snapshot_ns - 3 * MS
        assert c.actions.dtype == np.float32 and c.actions.shape == (H, 2)
        assert not c.actions.flags.writeable


def test_emitted_in_time_order_and_action_matches_its_time():
    sim = make_sim(cfg(), latency_ns=25 * MS)
    sim.driver.run(80)
    em = emissions(sim)
    assert len(em) > 60
    by_seq = {c.seq: c for c in sim.chunks}
    slots = [e.slot_ns for e in em]
    assert all(b - a == DT for a, b in zip(slots, slots[1:])), "one slot per tick, no gaps, no repeats"
    for e in em:
        c = by_seq[e.chunk_seq]
        assert e.kind == "chunk"
        assert e.slot_ns == c.t0_ns + e.index * DT
        assert abs(e.t_ns - e.slot_ns) <= DT // 2
        np.testing.assert_array_equal(e.action, c.actions[e.index])
    # the fake policy encodes [call index, action index]
    assert all(e.action[1] == e.index for e in em)


def test_late_chunk_skips_past_actions_never_replays():
    # call 0 cold, call 1 on time, call 2 takes 55 ms: arrives after the old chunk ran out
    lat = {0: 25 * MS, 1: 25 * MS, 2: 55 * MS}
    sim = make_sim(cfg(), latency_ns=lambda i: lat.get(i, 25 * MS), queue_ns=1 * MS, actuate_ns=2 * MS)
    sim.driver.run(40)
    c2 = sim.chunks[2]
    em = emissions(sim)
    used2 = [e for e in em if e.chunk_seq == 2]
    first = used2[0]
    # trigger tick T: t0 = T+10, ready at T+58 -> adopted at the T+60 tick -> index 5
    assert first.index == 5 and first.slot_ns == c2.t0_ns + 5 * DT
    assert [e.index for e in used2] == list(range(5, 5 + len(used2)))
    assert sim.loop.counters()["late_chunks"] == 1
    assert sim.loop.counters()["deadline_misses"] == 1  # the T+50 tick: old chunk ran out
    assert sim.event_kinds().count("deadline_miss") == 1
    # no slot is ever served twice, none goes backwards
    slots = [e.slot_ns for e in em]
    assert slots == sorted(set(slots))


def _slope_chunks(snap, rtc, call):
    a = np.zeros((H, 2), dtype=np.float32)
    a[:, 0] = 100 * call + np.arange(H)
    a[:, 1] = -2.0 * np.arange(H)
    return a


@pytest.mark.parametrize("policy", ["hold_last", "stop", "extrapolate_tail"])
def test_deadline_miss_policies(policy):
    # call 1 takes 95 ms: chunk 0 runs out at +110 ms, chunk 1 is ready at +155 ms
    lat = {0: 5 * MS, 1: 95 * MS}
    sim = make_sim(cfg(deadline_policy=policy, extrapolate_max_ticks=3, rtc_mode="off"), make=_slope_chunks,
                   latency_ns=lambda i: lat.get(i, 5 * MS))
    sim.driver.run(30)
    c0 = sim.chunks[0]
    miss_ticks = [(t, e) for t, e in sim.driver.ticks if t >= c0.end_ns and t < sim.chunks[1].latency.ready_ns]
    assert len(miss_ticks) == 5
    counters = sim.loop.counters()
    # one deadline miss (chunk 1 was late) and one run-out, served for 5 ticks by the policy
    assert counters["deadline_misses"] == 1 and counters["run_outs"] == 1
    n_miss = counters["deadline_policy_ticks"]
    assert n_miss == len(miss_ticks)
    hist = [e for e in sim.loop.history if e.is_miss]
    assert len(hist) == n_miss and all(e.kind == policy and e.chunk_seq == 0 for e in hist)
    last, prev = c0.actions[-1], c0.actions[-2]
    for j, (t, e) in enumerate(miss_ticks, start=1):
        if policy == "stop":
            assert e is None
        elif policy == "hold_last":
            np.testing.assert_array_equal(e.action, last)
        else:
            jj = min(j, 3)
            np.testing.assert_allclose(e.action, last + jj * (last - prev))
            assert e.index == H - 1 + j
    # recovery: the late chunk's actions resume at the current slot, time order preserved
    em = emissions(sim)
    assert em[-1].chunk_seq >= 1 and em[-1].kind == "chunk"
    assert sim.event_kinds().count("deadline_miss") == 1


def test_duplicate_tick_repeats_and_does_not_advance():
    sim = make_sim(cfg(), latency_ns=5 * MS)
    sim.driver.run(5)
    e1 = sim.loop.tick()  # same time as the last tick: slot already served
    assert e1.kind == "duplicate"
    last = sim.driver.ticks[-1][1]
    assert e1.slot_ns == last.slot_ns and e1.index == last.index
    np.testing.assert_array_equal(e1.action, last.action)
    sim.clock.set(sim.clock.now() - 3 * MS)  # small step back, inside the jump tolerance
    assert sim.loop.tick().kind == "duplicate"
    assert sim.loop.counters()["duplicate_ticks"] == 2
    assert sim.loop.counters()["clock_jumps"] == 0
    sim.driver.run(3)
    assert sim.driver.ticks[-1][1].slot_ns == last.slot_ns + 3 * DT


def test_jittered_ticks_map_to_nearest_slot():
    sim = make_sim(cfg(), latency_ns=5 * MS)
    sim.driver.run(3)
    base = sim.driver.ticks[-1][1]
    for k, jitter in enumerate([4 * MS, -4 * MS, 3 * MS], start=1):
        sim.clock.set(base.slot_ns + k * DT + jitter)
        sim.driver.feed(sim.clock.now())
        e = sim.loop.tick()
        assert e.slot_ns == base.slot_ns + k * DT and e.kind == "chunk"
