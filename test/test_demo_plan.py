"""The demo's control plan from a measured compute-time distribution (phyai_ros/replay/demo.py): the RTC trigger
covers the tail (1.5 x p99) even with the node's smallest delay estimate, the chosen rate lets the node rest
between inferences, the session holds the chunk cycles the margin bound needs, and the overload run is one by
construction; the session bags are written once per generator and configuration.  No node runs here: the
distributions are synthetic, the rules are what is checked (scripts/demo.sh runs them on this machine)."""
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from phyai_ros.replay.demo import (CONTROL_RATES, MIN_CYCLES, MIN_OVERLAP, SESSION_MAX_S, SESSION_S, TAIL_SAFETY,
                                   build_parser, cached_demo_bag, compute_times, plan_control, stress_rate)
from phyai_ros.replay.demo_bag import DemoBagConfig

H = 50


def d_range(plan, compute) -> tuple:
    """The node's delay estimate (actions) from the fastest measured inference to the 95 % one."""
    c = np.asarray(compute) / plan.dt
    return int(np.floor(c.min())), int(np.quantile(np.ceil(c), 0.95, method="higher"))


def trigger_budget(plan, compute) -> float:
    """Seconds a chunk has when the node triggers with its smallest delay estimate (design.md §3: R = d_est +
    overlap actions left, (R + 1) dt to reach the timer)."""
    return (d_range(plan, compute)[0] + plan.overlap + 1) * plan.dt


def cycles(plan, compute) -> tuple:
    """The shortest (at the largest delay estimate) and the longest chunk cycle (s)."""
    d_min, d95 = d_range(plan, compute)
    return (H - d95 - plan.overlap) * plan.dt, (H - d_min - plan.overlap) * plan.dt


@pytest.mark.parametrize("p50, spread, rate", [(0.08, 0.01, 50.0), (0.2, 0.12, 20.0), (0.3, 0.15, 10.0)],
                         ids=["quiet", "shared", "loaded"])
def test_the_trigger_covers_the_tail_and_the_session_holds_the_cycles(p50, spread, rate):
    rng = np.random.default_rng(0)
    compute = p50 + spread * np.abs(rng.standard_normal(60))
    plan = plan_control(compute, H)
    p99 = float(np.percentile(compute, 99))
    assert plan.hz == rate, plan.why_rate
    assert trigger_budget(plan, compute) >= TAIL_SAFETY * p99 - 1e-9
    shortest, longest = cycles(plan, compute)
    assert shortest >= p99 - 1e-9                                             # the node rests between inferences
    assert SESSION_S <= plan.session_s <= SESSION_MAX_S and plan.session_s >= MIN_CYCLES * longest - 1e-9
    assert MIN_OVERLAP <= plan.overlap < H and "expect" not in plan.why_rate + plan.why_session
    assert f"{rate:g} Hz" in plan.why_rate and "p99" in plan.why_rate
    if rate != CONTROL_RATES[0]:   # a faster rate would not have fitted
        faster = CONTROL_RATES[CONTROL_RATES.index(rate) - 1]
        forced = plan_control(compute, H, rate_hz=faster)
        assert (trigger_budget(forced, compute) < TAIL_SAFETY * p99 or cycles(forced, compute)[0] < p99) \
            and "expect deadline misses" in forced.why_rate


def test_a_machine_too_slow_for_every_rate_is_told_so():
    plan = plan_control(np.full(20, 8.0), H)     # even 5 Hz: 10 s chunks, a 12 s budget needed
    assert plan.hz == CONTROL_RATES[-1] and "expect deadline misses" in plan.why_rate
    slow = plan_control(np.full(20, 1.8), H)     # fits at 5 Hz, but ~2 s cycles: too few in the longest session
    assert slow.hz == CONTROL_RATES[-1] and "expect" not in slow.why_rate
    assert slow.session_s == SESSION_MAX_S and "expect WARN" in slow.why_session


def test_a_given_duration_is_kept_and_a_short_one_is_flagged():
    compute = np.full(30, 0.08)
    assert plan_control(compute, H, duration=120.0).session_s == 120.0
    short = plan_control(compute, H, duration=5.0)
    assert short.session_s == 5.0 and "expect WARN" in short.why_session


def test_compute_times_are_the_compute_segments_of_each_margin():
    m = [SimpleNamespace(latency_queue=0.01, latency_inference=0.1, latency_actuate=0.002),
         SimpleNamespace(latency_queue=math.nan, latency_inference=0.1, latency_actuate=0.0)]
    assert compute_times(m).tolist() == pytest.approx([0.112])
    with pytest.raises(ValueError, match="no compute-time samples"):
        plan_control([], H)


def test_the_overload_run_is_an_overload_by_construction():
    compute = np.full(40, 0.1)
    plan = plan_control(compute, H)
    rate = stress_rate(compute, plan, H)
    assert rate >= 5 and rate * 0.1 >= 2 * H * plan.dt     # inference spans two chunks of the robot's time


def test_session_bags_are_written_once_per_configuration(tmp_path):
    cfg = DemoBagConfig(duration=0.5, state_rate_hz=20.0)
    bag, reused = cached_demo_bag(tmp_path, "session", cfg)
    assert not reused and (bag.path / "metadata.yaml").is_file() and bag.total == sum(bag.counts.values()) > 0
    again, reused = cached_demo_bag(tmp_path, "session", DemoBagConfig(duration=0.5, state_rate_hz=20.0))
    assert reused and again.path == bag.path and again.counts == bag.counts
    other, reused = cached_demo_bag(tmp_path, "session", DemoBagConfig(duration=0.5, state_rate_hz=20.0, seed=3))
    assert not reused and other.path != bag.path
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no half-written bag left behind


def test_demo_sh_names_every_option():
    header = [line for line in (Path(__file__).resolve().parents[1] / "scripts" / "demo.sh").read_text().splitlines()
              if line.startswith("#")]
    options = [o for action in build_parser()._actions for o in action.option_strings if o.startswith("--")]
    assert "--stress" in options and "--rate-hz" in options
    missing = [o for o in options if o != "--help" and not any(o in line for line in header)]
    assert not missing, f"scripts/demo.sh's header omits {missing}"
