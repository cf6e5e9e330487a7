"""Rosbag replay tooling without a running node: the demo bag generator (both storage plugins),
the bag scan (time map, verdicts, events), the accounting rules, the report from an output bag,
the CLIs and the replay launch file (a structure check against a stand-in launch API)."""
from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from phyai_ros.replay.accounting import CATEGORIES, Snapshot, account
from phyai_ros.control.clock import NS_PER_S
from phyai_ros.replay.bagtypes import parse_remaps, typestore
from phyai_ros.replay.demo_bag import DemoBagConfig, faulty_config, make_demo_bag
from phyai_ros.replay.nodeinfo import NodeInfo
from phyai_ros.replay.scan import Item, Session, TimeMap, scan_bag

REPO = Path(__file__).resolve().parents[1]
CPU_CONFIG = REPO / "config" / "pi05_cpu_test.yaml"
START = 1_795_000_000 * NS_PER_S


@pytest.fixture(scope="module")
def node_info() -> NodeInfo:
    return NodeInfo.from_params_file(CPU_CONFIG)


@pytest.fixture(scope="module")
def faulty_bag(tmp_path_factory):
    path = tmp_path_factory.mktemp("bags") / "faulty"
    cfg = faulty_config(8.0)
    cfg.storage, cfg.state_rate_hz = "sqlite3", 20.0
    return make_demo_bag(path, cfg)


# ----------------------------------------------------------------------------- demo bag
@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_demo_bag_is_a_plausible_session(tmp_path, storage):
    from rosbags.highlevel import AnyReader
    bag = make_demo_bag(tmp_path / "s", DemoBagConfig(duration=2.0, storage=storage))
    for topic, expected in (("/cameras/base/image", 30), ("/cameras/left_wrist/image", 60),
                            ("/cameras/right_wrist/image", 30), ("/joint_states", 100), ("/instruction", 1)):
        assert expected - 2 <= bag.counts[topic] <= expected, (topic, bag.counts)
    seen, frames, latched = {}, {}, {}
    with AnyReader([bag.path], default_typestore=typestore()) as r:
        assert {c.topic: c.msgtype for c in r.connections}["/cameras/left_wrist/image"] == \
            "sensor_msgs/msg/CompressedImage"
        for c in r.connections:
            latched[c.topic] = c.ext.offered_qos_profiles[0].durability.name
        for c, t, raw in r.messages():
            m = r.deserialize(raw, c.msgtype)
            seen[c.topic] = seen.get(c.topic, 0) + 1
            if hasattr(m, "header"):
                stamp = m.header.stamp.sec * NS_PER_S + m.header.stamp.nanosec
                assert 0 < t - stamp < 0.05 * NS_PER_S  # recorded after capture, a few ms later
            if c.topic == "/cameras/base/image":
                frames.setdefault(c.topic, []).append(np.asarray(m.data, dtype=np.float32))
            if c.topic == "/joint_states":
                assert list(m.name)[-1] == "gripper" and len(m.position) == 8 and np.all(np.isfinite(m.position))
    assert seen == bag.counts
    assert latched["/instruction"] == "TRANSIENT_LOCAL" and latched["/joint_states"] == "VOLATILE"
    # moving content: consecutive frames differ well beyond sensor noise somewhere in the session
    diffs = [np.abs(a - b).mean() for a, b in zip(frames["/cameras/base/image"], frames["/cameras/base/image"][1:])]
    assert max(diffs) > 2.0


def test_scan_of_a_clean_bag_finds_nothing_wrong(tmp_path, node_info):
    bag = make_demo_bag(tmp_path / "s", DemoBagConfig(duration=2.0, state_rate_hz=20.0))
    s = scan_bag(bag.path, node_info)
    assert s.events == [] and s.clock_source == "bag timestamps" and s.storage == "mcap"
    assert all(i.verdict == "ok" and i.publish and i.sim_ns == i.log_ns for i in s.items)
    roles = {t: m["role"] for t, m in s.topics.items()}
    assert roles == {"/cameras/base/image": "camera", "/cameras/left_wrist/image": "camera",
                     "/cameras/right_wrist/image": "camera", "/joint_states": "state", "/instruction": "instruction"}
    assert s.topics["/instruction"]["latched"] is True
    assert abs(s.topics["/cameras/left_wrist/image"]["rate_hz"] - 30.0) < 1.0


def test_scan_reports_every_injected_fault(faulty_bag, node_info):
    s = scan_bag(faulty_bag.path, node_info)
    kinds = [e.kind for e in s.events]
    assert s.clock_source == "recorded /clock"
    assert kinds.count("missing_topic") == 1 and "right_wrist" in s.events[kinds.index("missing_topic")].detail
    bad = [e for e in s.events if e.kind == "bad_image"]
    assert len(bad) == 1 and bad[0].log_ns == faulty_bag.truth["corrupt_jpeg"][0]["bag_time_ns"]
    und = [e for e in s.events if e.kind == "undecodable"]
    assert len(und) == 1 and und[0].topic == "/joint_states" and "not published" in und[0].detail
    gaps = [e for e in s.events if e.kind == "time_gap"]
    assert [g.topic for g in gaps] == ["/cameras/base/image"] and "1.2" in gaps[0].detail
    jumps = [e for e in s.events if e.kind == "clock_jump"]
    assert len(jumps) == 1 and "back -2.000 s" in jumps[0].detail
    # the base frame captured before the jump and recorded after it is ahead of the replay clock
    assert [e.topic for e in s.events if e.kind == "future_stamp"] == ["/cameras/base/image"]
    # time map: after the jump the replay clock is 2 s behind the bag timestamps, in a new epoch
    jump_log = faulty_bag.truth["clock_jumps"][0]["bag_time_ns"]
    after = [i for i in s.items if i.log_ns > jump_log + NS_PER_S // 10]
    assert after and all(i.epoch == 1 and abs(i.sim_ns - (i.log_ns - 2 * NS_PER_S)) < NS_PER_S // 50 for i in after)
    assert not [i for i in s.items if i.role == "clock" and i.publish]


def test_time_map_follows_the_recorded_clock():
    assert TimeMap()(123) == 123 and TimeMap().identity
    ms = 1_000_000
    # a clock sampled every 10 ms that jumps back 2 s at 100 ms and forward 5 s at 200 ms
    samples = [(k * 10 * ms, START + k * 10 * ms) for k in range(10)]
    samples += [(k * 10 * ms, START - 2 * NS_PER_S + k * 10 * ms) for k in range(10, 20)]
    samples += [(k * 10 * ms, START + 3 * NS_PER_S + k * 10 * ms) for k in range(20, 25)]
    tm = TimeMap(samples, forward_jump=1.0)
    assert [(j[0], j[2] < j[1]) for j in tm.jumps] == [(100 * ms, True), (200 * ms, False)]
    assert tm(55 * ms) == START + 55 * ms                       # between samples: at the bag's rate
    assert tm(105 * ms) == START - 2 * NS_PER_S + 105 * ms
    assert tm.epoch(99 * ms) == 0 and tm.epoch(100 * ms) == 1 and tm.epoch(250 * ms) == 1
    # a clock running slower than the bag is never extrapolated past its next sample
    slow = TimeMap([(0, START), (10 * ms, START + 5 * ms)])
    assert slow(8 * ms) == START + 5 * ms


# ----------------------------------------------------------------------------- accounting
def _session(items, node) -> Session:
    return Session(path=Path("x"), storage="mcap", items=items, events=[], time_map=TimeMap(),
                   topics={}, node=node, clock_source="bag timestamps")


def _items(node: NodeInfo):
    """Base camera (10, 110, ... 910 ms; the one at 410 ms a bad image) and state (50, ... 950 ms) at
    10 Hz, the left wrist at 30, 130, 230, 330 ms and then silent, the instruction at the start;
    stamps 5 ms before publication."""
    items = []

    def add(topic, role, t_ms, verdict="ok", stamp=True):
        items.append(Item(index=len(items), topic=topic, out_topic=topic, msgtype="x", log_ns=START + t_ms * 1_000_000,
                          sim_ns=START + t_ms * 1_000_000,
                          stamp_ns=START + (t_ms - 5) * 1_000_000 if stamp else None, role=role, verdict=verdict))

    add("/instruction", "instruction", 1, stamp=False)
    for k in range(10):
        t = 10 + 100 * k
        add("/cameras/base/image", "camera", t, verdict="bad_image" if k == 4 else "ok")
        if t < 400:
            add("/cameras/left_wrist/image", "camera", t + 20)
        add("/joint_states", "state", t + 40)
    items.sort(key=lambda i: i.log_ns)
    for n, it in enumerate(items):
        it.index = n
    return items


def test_accounting_puts_every_message_in_exactly_one_category(node_info):
    items = _items(node_info)
    s = _session(items, node_info)
    # two snapshots: at 250 ms (newest: base 210, left 230, state 250 -> oldest stamp 205 ms) and at
    # 320 ms (base 310, left 230, state 250 -> 225 ms); the replay stops before the last message
    snaps = [Snapshot(START + 250 * 1_000_000, START + 205 * 1_000_000, 0),
             Snapshot(START + 320 * 1_000_000, START + 225 * 1_000_000, 1)]
    acc = account(s, snaps, played=len(items) - 1, end_sim_ns=START + 950 * 1_000_000,
                  node_counters={"bad_image": 1})
    assert acc.ok, acc.problems
    assert acc.verified == 2 and acc.snapshots == 2
    for topic, row in acc.per_topic.items():
        assert row["played"] == sum(row[c] for c in CATEGORIES)
    assert acc.per_topic == {
        "/instruction": {"played": 1, "used": 1, "superseded": 0, "stale": 0, "rejected": 0, "not_played": 0},
        "/cameras/base/image": {"played": 10, "used": 2, "superseded": 6, "stale": 1, "rejected": 1, "not_played": 0},
        "/cameras/left_wrist/image": {"played": 4, "used": 1, "superseded": 2, "stale": 1, "rejected": 0,
                                      "not_played": 0},
        "/joint_states": {"played": 10, "used": 1, "superseded": 7, "stale": 1, "rejected": 0, "not_played": 1}}
    assert acc.reasons["/cameras/left_wrist/image"] == {"stale: aged out": 1}
    assert acc.reasons["/cameras/base/image"] == {"stale: end of bag": 1, "rejected: bad_image": 1}
    assert acc.rejection_check["bad_image"] == {"predicted": 1, "node": 1}
    used = {v.reason for v in acc.verdicts.values() if v.category == "used"}
    assert used == {"chunk 0", "chunk 1"}


def test_accounting_resolves_a_delivery_race(node_info):
    """Real time: the left wrist frame published 2 ms before the snapshot had not reached the node;
    the published observation stamp (the previous frame's) says so."""
    items = _items(node_info)
    s = _session(items, node_info)
    snap = Snapshot(START + 232 * 1_000_000, START + 125 * 1_000_000, 0)
    acc = account(s, [snap], played=len(items), end_sim_ns=START + NS_PER_S, race_window_ns=5_000_000,
                  node_counters={"bad_image": 1})
    assert acc.ok and acc.verified == 1 and acc.races == 1
    left = [i for i in items if i.topic == "/cameras/left_wrist/image"]
    assert [acc.verdicts[i.index].category for i in left] == ["superseded", "used", "superseded", "stale"]
    # without the race window the same snapshot is unexplained
    assert not account(s, [snap], played=len(items), end_sim_ns=START + NS_PER_S, node_counters={"bad_image": 1}).ok


def test_accounting_flags_what_the_replay_cannot_explain(node_info):
    items = _items(node_info)
    s = _session(items, node_info)
    wrong = [Snapshot(START + 250 * 1_000_000, START + 1, 0)]
    acc = account(s, wrong, played=len(items), end_sim_ns=START + NS_PER_S, node_counters={"bad_image": 0})
    assert not acc.ok
    assert any("observation stamp" in p for p in acc.problems)
    assert any("node counted 0 bad_image" in p for p in acc.problems)


# ----------------------------------------------------------------------------- report
def _write_output_bag(path: Path, n_chunks: int = 30, inference_s: float = 0.06, horizon: int = 20,
                      dt: float = 0.05, miss_every: int = 0, with_summary: bool = True, summary_edit=None,
                      with_chunks: bool = True):
    """An output bag as the replay writes it, with a steady synthetic node (``summary_edit(summary)``: change the
    replay summary before it is written; ``with_chunks`` False: the margins without their chunks)."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    ts = typestore()
    T = ts.types
    Time = T["builtin_interfaces/msg/Time"]

    def tm(ns):
        return Time(sec=ns // NS_PER_S, nanosec=ns % NS_PER_S)

    dt_ns = int(dt * NS_PER_S)
    rng = np.random.default_rng(0)
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        conn = {t: w.add_connection(t, typ, typestore=ts) for t, typ in (
            ("/action_chunk", "phyai_ros/msg/ActionChunk"), ("/control_margin", "phyai_ros/msg/ControlMargin"),
            ("/command", "trajectory_msgs/msg/JointTrajectory"), ("/diagnostics", "diagnostic_msgs/msg/DiagnosticArray"),
            ("/replay/summary", "std_msgs/msg/String"))}
        msgs = []
        period = (horizon - 8) * dt_ns
        misses = 0
        for k in range(n_chunks):
            trig = START + k * period
            t0 = trig + dt_ns
            ready = trig + int(inference_s * NS_PER_S)
            actions = np.cumsum(rng.normal(0, 0.01, (horizon, 7)), 0).astype(np.float32)
            chunk = T["phyai_ros/msg/ActionChunk"](
                header=T["std_msgs/msg/Header"](stamp=tm(t0), frame_id=""), observation_stamp=tm(trig - 30_000_000),
                seq=k, dt=dt, horizon=horizon, action_dim=7, action_names=[f"j{i}" for i in range(7)],
                actions=actions.reshape(-1), frozen_prefix=2, model_id="synthetic", inference_latency=inference_s)
            if with_chunks:
                msgs.append((ready, "/action_chunk", chunk))
            cover_end = trig + 8 * dt_ns
            margin = (cover_end - ready) / NS_PER_S
            if miss_every and k % miss_every == miss_every - 1:
                margin = -0.01
                misses += 1
            adopt = ready + dt_ns
            vals = dict(stamp=tm(adopt), budget=(cover_end - trig + 30_000_000) / NS_PER_S, latency_observe=0.01,
                        latency_transfer=0.02, latency_queue=0.0, latency_inference=inference_s, latency_actuate=0.0,
                        margin=margin if k else math.nan, margin_p50=0.3, margin_p95=0.3, margin_p99=0.3,
                        window_size=k, p_nonnegative=1.0, p_nonnegative_lower=0.9, target=0.95, level=0,
                        message="ok", roofline_x=6.0, roofline_y=1.0, chunk_seq=k, expired=False, confidence=0.9)
            msgs.append((adopt, "/control_margin", T["phyai_ros/msg/ControlMargin"](**vals)))
            for i in range(horizon - 8):
                slot = t0 + i * dt_ns
                cmd = T["trajectory_msgs/msg/JointTrajectory"](
                    header=T["std_msgs/msg/Header"](stamp=tm(slot), frame_id=""), joint_names=[],
                    points=[T["trajectory_msgs/msg/JointTrajectoryPoint"](
                        positions=actions[i].astype(np.float64), velocities=np.zeros(0), accelerations=np.zeros(0),
                        effort=np.zeros(0), time_from_start=T["builtin_interfaces/msg/Duration"](sec=0, nanosec=0))])
                msgs.append((slot, "/command", cmd))
            KV = T["diagnostic_msgs/msg/KeyValue"]
            status = T["diagnostic_msgs/msg/DiagnosticStatus"](
                level=0, name="phyai_policy: inputs and loop", message="ok", hardware_id="x",
                values=[KV(key="ticks", value=str(k * 12)), KV(key="deadline_misses", value=str(misses)),
                        KV(key="chunks", value=str(k))])
            msgs.append((adopt + 1, "/diagnostics", T["diagnostic_msgs/msg/DiagnosticArray"](
                header=T["std_msgs/msg/Header"](stamp=tm(adopt + 1), frame_id=""), status=[status])))
        summary = {"bag": "synthetic_session", "mode": "realtime", "rate": 1.0, "complete": True,
                   "node": {"confidence": 0.9, "eps": 0.05, "min_samples": 20, "error_probability": 0.8,
                            "command_topic": "/command"},
                   "node_counters": {"deadline_misses": misses},
                   "accounting": {"per_topic": {"/cameras/base/image": {"played": 10, "used": 4, "superseded": 6,
                                                                         "stale": 0, "rejected": 0, "not_played": 0}},
                                  "reasons": {}, "snapshots": 4, "verified": 4, "races": 0, "ok": True,
                                  "problems": []},
                   "events": [{"kind": "time_gap", "detail": "no message for 1.2 s", "topic": "/cameras/base/image",
                               "sim_ns": START + NS_PER_S, "source": "bag"}]}
        if summary_edit is not None:
            summary_edit(summary)
        if with_summary:
            msgs.append((START + n_chunks * period + NS_PER_S, "/replay/summary",
                         T["std_msgs/msg/String"](data=json.dumps(summary))))
        for t, topic, m in sorted(msgs, key=lambda x: x[0]):
            typ = {"/action_chunk": "phyai_ros/msg/ActionChunk", "/control_margin": "phyai_ros/msg/ControlMargin",
                   "/command": "trajectory_msgs/msg/JointTrajectory", "/diagnostics":
                       "diagnostic_msgs/msg/DiagnosticArray", "/replay/summary": "std_msgs/msg/String"}[topic]
            w.write(conn[topic], t, bytes(ts.serialize_cdr(m, typ)))
    return path


def test_report_writes_a_self_contained_report_with_the_verdict_first(tmp_path, capsys):
    from phyai_ros.replay.report import main, make_report
    bag = _write_output_bag(tmp_path / "out", n_chunks=40)  # 39 margins: enough to show 0.95 at 90 %
    rep = make_report(bag)
    names = {p.name for p in rep.out_dir.iterdir()}
    assert {"report.html", "report.md", "report.json", "roofline.png", "margin.png", "latency_time.png",
            "latency_hist.png", "discontinuity.png", "problems.png", "accounting.png"} <= names
    num = rep.numbers
    assert num["roofline"]["bound"] == "environment-bound" and num["roofline"]["X"] > 1
    assert num["margin"]["n"] == 39 and num["margin"]["p_hat"] == 1.0 and num["margin"]["level"] == 0
    assert len(num["discontinuity"]["boundaries"]) == 39
    html = (rep.out_dir / "report.html").read_text()
    assert "data:image/png;base64," in html and "src=\"roofline.png\"" not in html  # self-contained
    import base64
    for name, png in rep.figures.items():    # every plot once
        assert html.count(base64.b64encode(png.read_bytes()).decode()) == 1, name
    head = html[: html.index("<h2>")]                                             # the first screen
    assert "Environment-bound" in head and "P(M_ctrl &gt;= 0) = 1.000" in head and "Deadline misses: 0" in head
    md = (rep.out_dir / "report.md").read_text()
    assert md.splitlines()[2].startswith("**OK**") and "![Control-time roofline](roofline.png)" in md
    assert "time_gap" in md
    assert main([str(bag), "-o", str(tmp_path / "again")]) == 0
    out = capsys.readouterr().out
    assert "OK: environment-bound" in out and str(tmp_path / "again" / "report.html") in out


HOSTILE = "<img src=x onerror=alert(1)>"
SCRIPT = "<script>alert(document.cookie)</script>"


def _no_markup(rep) -> tuple:
    html = (rep.out_dir / "report.html").read_text()
    md = (rep.out_dir / "report.md").read_text()
    for name, text in (("html", html), ("md", md)):
        assert "<script" not in text.lower() and "<img src=x" not in text, name
    return html, md


def test_markup_in_a_summary_s_text_is_shown_as_text(tmp_path):
    """Bags are shared: a /replay/summary whose names, events and accounting hold markup gives a report (HTML and
    Markdown) that shows that markup as text."""
    from phyai_ros.replay.report import make_report

    def edit(summary):
        summary.update(bag=f"/bags/{SCRIPT}", mode=HOSTILE)
        summary["node"]["model_id"] = SCRIPT
        acc = summary["accounting"]
        acc["per_topic"][SCRIPT] = {"played": 1, "used": 1, "superseded": 0, "stale": 0, "rejected": 0,
                                    "not_played": 0}
        acc.update(ok=False, problems=[SCRIPT], reasons={SCRIPT: {HOSTILE: 2}})
        summary["node_counters"][HOSTILE] = 3
        summary["events"].append({"kind": HOSTILE, "detail": SCRIPT, "topic": HOSTILE, "source": "bag"})
    html, md = _no_markup(make_report(_write_output_bag(tmp_path / "out", n_chunks=30, summary_edit=edit)))
    assert "&lt;script&gt;alert(document.cookie)&lt;/script&gt;" in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "&lt;script>alert(document.cookie)&lt;/script>" in md


def test_markup_in_place_of_a_summary_s_numbers_is_left_out(tmp_path):
    """A counter, a snapshot count or a played count that is markup (a string where a number belongs) is refused
    when the summary is read, and named; the report is made from the rest."""
    from phyai_ros.replay.report import make_report
    from phyai_ros.replay.runbag import load_run

    def edit(summary):
        summary["node_counters"] = {"deadline_misses": 0, "missed_slots": HOSTILE}
        acc = summary["accounting"]
        acc["per_topic"]["/x"] = {"played": SCRIPT, "used": 1, "superseded": 0, "stale": 0, "rejected": 0,
                                  "not_played": 0}
        acc["snapshots"] = SCRIPT
    bag = _write_output_bag(tmp_path / "out", n_chunks=30, summary_edit=edit)
    rep = make_report(bag)
    _no_markup(rep)
    counters = rep.numbers["counters"]
    assert counters["deadline_misses"] == 0 and "missed_slots" not in counters
    assert "/x" not in rep.numbers["accounting"]["per_topic"]
    refused = load_run(bag).refused
    assert {"summary.node_counters.missed_slots", "summary.accounting.snapshots",
            "summary.accounting.per_topic./x.played"} <= set(refused), refused


def test_summary_values_of_the_wrong_type_do_not_crash_the_report(tmp_path):
    """Without chunks the report takes dt and H from the summary: a string there (or for the rate) is left out."""
    from phyai_ros.replay.report import make_report

    def edit(summary):
        summary["node"].update(dt="0.05", horizon="20")
        summary.update(rate="fast", events="none", session_end_bag_ns=1.5e18)
    rep = make_report(_write_output_bag(tmp_path / "out", n_chunks=12, summary_edit=edit, with_chunks=False))
    assert rep.numbers["dt"] is None and rep.numbers["horizon"] is None and rep.numbers["rate"] is None
    from phyai_ros.replay.runbag import check_summary
    assert check_summary([1, 2]) is None and check_summary({"node": "x"}) == {}


def test_a_node_identity_without_a_valid_name_is_left_out(tmp_path):
    """A summary naming the judged node with a number (or nothing) for its name: the identity is refused and named,
    the report is made judging the first policy node that reports, as for a bag without a summary."""
    from phyai_ros.replay.report import make_report
    from phyai_ros.replay.runbag import load_run

    def edit(summary):
        summary["node_identity"] = {"name": 7, "pid": 12}
    bag = _write_output_bag(tmp_path / "out", n_chunks=12, summary_edit=edit)
    run = load_run(bag)
    assert "summary.node_identity.name" in run.refused and "summary.node_identity (without name)" in run.refused
    assert run.node is not None and run.node.name.endswith("phyai_policy")
    assert make_report(bag).numbers["chunks"] > 0


def test_report_flags_misses_and_an_inference_bound_loop(tmp_path):
    """Also: a bag recorded on a robot (no replay summary) is enough for a report."""
    from phyai_ros.replay.report import make_report
    bag = _write_output_bag(tmp_path / "out", n_chunks=25, inference_s=1.2, miss_every=4, with_summary=False)
    rep = make_report(bag)
    num = rep.numbers
    assert num["accounting"] is None and "accounting" not in rep.figures
    assert num["roofline"]["bound"] == "inference-bound"
    assert num["deadline_misses"] == 6 and num["margin"]["k"] < num["margin"]["n"]
    # inference (1.2 s) is longer than a chunk (50 x 20 ms): the headline says overload, not "the tail"
    v = num["verdict"]
    assert v["level"] == 2 and v["headline"].startswith("Overloaded") and "6 deadline misses" in v["headline"]
    assert any("inference-bound" in f for f in v["facts"])
    assert not any("not the average" in f for f in v["facts"])


def test_report_text_and_json_show_the_analysis_numbers(tmp_path):
    """The report's jobs meet at the numbers: the verdict, the Markdown, the HTML tiles, the printed line and
    report.json show what ``analysis`` computed, and none of them needs the figures."""
    from phyai_ros.control.roofline import y_roof, y_sequential
    from phyai_ros.replay import render
    from phyai_ros.replay.analysis import LEVEL_NAMES, analyze
    from phyai_ros.replay.report import make_report
    from phyai_ros.replay.runbag import load_run
    from phyai_ros.replay.verdict import verdict
    bag = _write_output_bag(tmp_path / "out", n_chunks=30, miss_every=5)
    run = load_run(bag)
    num = analyze(run)
    v = verdict(num)
    r, lat = num["roofline"], num["latency_ms"]
    assert num["deadline_misses"] == num["margin"]["n"] - num["margin"]["k"] == 6
    assert r["Y_seq"] == y_sequential(r["X"]) and r["Y_roof"] == y_roof(r["X"])
    assert f"inference p50 {render.fmt(lat['inference']['p50'], 1)} ms" in v["facts"][1]
    md = render.markdown(num, v, {}, run.t0)
    assert "![" not in md and f"**{LEVEL_NAMES[v['level']]}** - {v['headline']}" in md
    for name, st in lat.items():
        assert "| " + " | ".join([name] + [render.fmt(st[q], 1) for q in ("p50", "p95", "p99", "max")]) + " |" in md
    page = render.html(num, v, {}, run.t0)
    assert f'<div class="v">{render.fmt(r["X"])}</div><div class="s">{r["bound"]}</div>' in page
    assert f'<div class="v">{num["deadline_misses"]}</div>' in page and "<img" not in page
    line = render.verdict_line(num, v)
    assert f"X = {render.fmt(r['X'])}" in line and f"n = {num['margin']['n']}" in line
    assert f"deadline misses {num['deadline_misses']}" in line
    # the command composes the same pieces: its numbers are these, its verdict this one
    rep = make_report(bag, tmp_path / "rep", formats=["md"])
    assert rep.index == rep.markdown and not (tmp_path / "rep" / "report.html").exists()
    assert rep.verdict_line == line and (tmp_path / "rep" / "report.md").read_text().startswith(md.split("\n## ")[0])

    def canonical(d) -> str:  # NaN-safe comparison of what report.json holds
        return json.dumps(json.loads(json.dumps(d, default=lambda o: o.item() if hasattr(o, "item") else str(o))),
                          sort_keys=True)
    assert canonical(json.loads((tmp_path / "rep" / "report.json").read_text())) == canonical({**num, "verdict": v})


# ----------------------------------------------------------------------------- command line
def test_clis_answer_help_and_reject_a_missing_bag(tmp_path, capsys):
    from phyai_ros.replay.cli import main
    assert main([str(tmp_path / "nothing")]) == 1
    assert "not a rosbag2 folder" in capsys.readouterr().err
    assert parse_remaps(["/a:=/b", "c=d"]) == {"/a": "/b", "/c": "/d"}
    with pytest.raises(ValueError):
        parse_remaps(["nonsense"])
    for exe in ("replay", "report", "demo_bag"):
        r = subprocess.run([sys.executable, str(REPO / "bin" / exe), "--help"], capture_output=True, text=True,
                           env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=60)
        assert r.returncode == 0 and "usage:" in r.stdout, r.stderr


def test_demo_bag_cli_writes_the_faulty_session(tmp_path, capsys):
    from phyai_ros.replay.demo_bag import main
    assert main([str(tmp_path / "b"), "--duration", "1", "--faults", "--storage", "sqlite3"]) == 0
    out = capsys.readouterr().out
    assert "sqlite3" in out and "/clock" in out and "/cameras/right_wrist/image" not in out


# ----------------------------------------------------------------------------- launch (structure)
class _Rec:
    """A stand-in launch entity: remembers its arguments."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


def _stand_in_launch_api(monkeypatch):
    names = {"launch": ["LaunchDescription"],
             "launch.actions": ["DeclareLaunchArgument", "EmitEvent", "RegisterEventHandler"],
             "launch.conditions": ["IfCondition"], "launch.event_handlers": ["OnProcessExit"],
             "launch.events": ["Shutdown"],
             "launch.substitutions": ["LaunchConfiguration", "PathJoinSubstitution", "PythonExpression"],
             "launch_ros": [], "launch_ros.actions": ["Node"], "launch_ros.substitutions": ["FindPackageShare"]}
    for mod, classes in names.items():
        m = types.ModuleType(mod)
        for c in classes:
            setattr(m, c, type(c, (_Rec,), {}))
        monkeypatch.setitem(sys.modules, mod, m)


def test_replay_launch_file_structure(monkeypatch):
    """Structure check only: `launch` is not installable here; this evaluates the launch file
    against a stand-in API and checks what it would start."""
    _stand_in_launch_api(monkeypatch)
    spec = importlib.util.spec_from_file_location("replay_launch", REPO / "launch" / "replay.launch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ld = mod.generate_launch_description()
    entities = ld.args[0]
    declared = {e.args[0]: e.kwargs for e in entities if type(e).__name__ == "DeclareLaunchArgument"}
    assert {"bag", "params_file", "mode", "rate", "out", "remaps", "start_node", "report"} <= set(declared)
    assert "default_value" not in declared["bag"]  # required
    nodes = [e for e in entities if type(e).__name__ == "Node"]
    assert sorted(n.kwargs["executable"] for n in nodes) == ["onboard_node", "onboard_node", "replay"]
    for n in nodes:
        assert (REPO / "bin" / n.kwargs["executable"]).is_file()
        if n.kwargs["executable"] == "onboard_node":
            assert n.kwargs["parameters"][1]["use_sim_time"] is True and "condition" in n.kwargs
    replay = next(n for n in nodes if n.kwargs["executable"] == "replay")
    flags = [a for a in replay.kwargs["arguments"] if isinstance(a, str)]
    assert {"--mode", "--rate", "--out", "--remap", "--report", "--params-file"} <= set(flags)
    # every flag the launch file passes exists in the replay CLI
    from phyai_ros.replay.cli import build_parser
    known = {s for a in build_parser()._actions for s in a.option_strings}
    assert set(flags) <= known
    handler = next(e for e in entities if type(e).__name__ == "RegisterEventHandler").args[0]
    assert handler.kwargs["target_action"] is replay


# ----------------------------------------------------------------------------- bad bags (issue 11)
def _write_bag(path: Path, messages, extra_types: str = "", storage: str = "mcap") -> Path:
    """A rosbag2 with ``messages`` = [(topic, msgtype, bag time ns, message)]; ``extra_types``: the
    ``.msg`` text of a type the bag brings itself (registered under the first message's type)."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore, get_types_from_msg
    ts = get_typestore(Stores.ROS2_JAZZY)
    for topic, msgtype, _, _ in messages:
        if msgtype not in ts.types and extra_types:
            ts.register(get_types_from_msg(extra_types, msgtype))
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    with Writer(path, version=9, storage_plugin=plugin) as w:
        conns = {}
        for topic, msgtype, t, msg in messages:
            if topic not in conns:
                conns[topic] = w.add_connection(topic, msgtype, typestore=ts)
            w.write(conns[topic], t, bytes(ts.serialize_cdr(msg, msgtype)))
    return path


def _joint_state(t_ns: int):
    T = typestore().types
    return T["sensor_msgs/msg/JointState"](
        header=T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=t_ns // NS_PER_S, nanosec=t_ns % NS_PER_S),
                                        frame_id=""),
        name=list(NodeInfo.from_params_file(CPU_CONFIG).joint_names), position=np.zeros(8), velocity=np.zeros(0),
        effort=np.zeros(0))


def test_a_bag_cannot_make_the_replay_import_the_module_its_type_names(tmp_path, monkeypatch, node_info):
    """Security (issue 11, item 13): a bag whose topic type is ``evilpkg/msg/Widget`` next to an
    ``evilpkg/`` package in the working directory must not run that package's code: only registered
    interface packages (ament index) are imported; the topic is reported and not played."""
    from phyai_ros.replay.playback import Playback
    from phyai_ros.replay.player import ReplayNode, ReplayOptions, ros_type
    marker = tmp_path / "evil_code_ran"
    cwd = tmp_path / "cwd"
    (cwd / "evilpkg" / "msg").mkdir(parents=True)
    payload = f"open({str(marker)!r}, 'w').write('ran')\n"
    (cwd / "evilpkg" / "__init__.py").write_text(payload)
    (cwd / "evilpkg" / "msg" / "__init__.py").write_text(payload + "class Widget:\n    pass\n")
    T = typestore().types
    bag = _write_bag(tmp_path / "evil_bag", [
        ("/joint_states", "sensor_msgs/msg/JointState", START, _joint_state(START)),
        ("/widget", "evilpkg/msg/Widget", START + 10_000_000, T["std_msgs/msg/String"](data="x")),
        ("/widget", "evilpkg/msg/Widget", START + 20_000_000, T["std_msgs/msg/String"](data="y"))],
        extra_types="string data")
    monkeypatch.chdir(cwd)
    monkeypatch.syspath_prepend(str(cwd))
    try:
        session = scan_bag(bag, node_info)
        with pytest.raises(LookupError, match="unknown message type"):
            ros_type("evilpkg/msg/Widget")
        with ReplayNode(name="phyai_replay_security_test") as rn:
            Playback(rn.node, session, None, ReplayOptions(), None)
        assert not marker.exists(), "the bag's type name imported and ran evilpkg"
        assert "evilpkg" not in sys.modules
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "evilpkg"]:
            del sys.modules[name]
    widget = [i for i in session.items if i.topic == "/widget"]
    assert len(widget) == 2 and not any(i.publish for i in widget)
    events = [e for e in session.events if e.kind == "unknown_type"]
    assert len(events) == 1 and events[0].topic == "/widget" and "unknown message type" in events[0].detail
    assert "2 messages" in events[0].detail
    # registered packages still resolve (the standard ones and the project's own)
    assert ros_type("sensor_msgs/msg/JointState").__name__ == "JointState"
    assert ros_type("phyai_ros/msg/ActionChunk").__name__ == "ActionChunk"
    for bad in ("os/path/join", "sensor_msgs/msg/../Image", "sensor_msgs/msg/NoSuchType", "sensor_msgs/srv/Image"):
        with pytest.raises(LookupError, match="unknown message type"):
            ros_type(bad)


def test_a_wrong_type_on_a_camera_topic_is_one_summary_per_topic(tmp_path, node_info):
    T = typestore().types
    msgs = [("/joint_states", "sensor_msgs/msg/JointState", START, _joint_state(START))]
    msgs += [("/cameras/base/image", "std_msgs/msg/String", START + k * 33_000_000, T["std_msgs/msg/String"](data="f"))
             for k in range(1, 31)]
    s = scan_bag(_write_bag(tmp_path / "b", msgs), node_info)
    wrong = [e for e in s.events if e.kind == "type_mismatch"]
    assert len(wrong) == 1, [e.detail for e in wrong]
    e = wrong[0]
    assert e.topic == "/cameras/base/image" and e.log_ns == START + 33_000_000
    assert "30 messages" in e.detail and "sensor_msgs/msg/Image" in e.detail and "std_msgs/msg/String" in e.detail
    assert "first at" in e.detail and "last at" in e.detail and "t=0.990 s" in e.detail  # bag time of the last one
    # each message is still judged (and accounted) on its own
    assert sum(i.verdict == "type_mismatch" for i in s.items) == 30


def test_report_of_an_input_bag_says_it_holds_no_node_outputs(tmp_path, capsys):
    from phyai_ros.replay.report import main
    bag = make_demo_bag(tmp_path / "input", DemoBagConfig(duration=1.0, state_rate_hz=20.0))
    assert main([str(bag.path)]) == 1
    err = capsys.readouterr().err
    assert "AttributeError" not in err
    assert str(bag.path) in err and "none of the node's outputs" in err and "action_chunk" in err
    assert "/joint_states" in err  # what the bag does hold


def test_an_output_bag_whose_node_produced_nothing_is_reported_error():
    """The worst case of an overload replay: every snapshot stale, no inference, so the output bag has the node's
    output topics but no chunk and no margin. Its report is ERROR (it used to be refused as "not an output
    bag", and the demo's --stress run ended in a traceback); an input bag is still refused."""
    from phyai_ros.replay.analysis import analyze, margin_session
    from phyai_ros.replay.verdict import verdict
    from phyai_ros.replay.runbag import CHUNK_TYPE, MARGIN_TYPE, NotAnOutputBag, Run, require_node_outputs
    run = Run(path=Path("out"), topics={"/action_chunk": CHUNK_TYPE, "/control_margin": MARGIN_TYPE,
                                        "/diagnostics": "diagnostic_msgs/msg/DiagnosticArray"})
    assert require_node_outputs(run) is run
    num = analyze(run, margin_session(run))
    v = verdict(num)
    assert v["level"] == 2 and "ERROR" in v["facts"][0], v      # level 2: ERROR
    with pytest.raises(NotAnOutputBag, match="none of the node's outputs"):
        require_node_outputs(Run(path=Path("in"), topics={"/joint_states": "sensor_msgs/msg/JointState"}))


def _truncate(bag_dir: Path, fraction: float) -> Path:
    (mcap,) = sorted(bag_dir.glob("*.mcap"))
    data = mcap.read_bytes()
    mcap.write_bytes(data[: int(len(data) * fraction)])
    return mcap


def test_a_truncated_mcap_plays_what_can_be_read_with_a_warning(tmp_path, node_info):
    from phyai_ros.replay.scan import iter_bag
    bag = make_demo_bag(tmp_path / "s", DemoBagConfig(duration=2.0, state_rate_hz=20.0))  # ~1 MB chunks
    full = [(c.topic, t) for c, t, _, _ in iter_bag(bag.path)]
    mcap = _truncate(bag.path, 0.7)
    s = scan_bag(bag.path, node_info)
    got = [(i.topic, i.log_ns) for i in s.items]
    assert 0 < len(got) < len(full) and got == full[: len(got)]   # what was recovered, in order
    (ev,) = [e for e in s.events if e.kind == "truncated_bag"]
    assert mcap.name in ev.detail and "truncated" in ev.detail
    assert f"recovered {len(got)} of {len(full)} messages" in ev.detail
    # the play pass reads exactly what the scan read
    assert [(c.topic, t) for c, t, _, _ in iter_bag(bag.path)] == got


def test_a_bad_bag_fails_at_once_without_starting_a_node(tmp_path, capsys):
    """The bag is read and checked before ``--start-node`` starts anything."""
    import time
    from phyai_ros.replay.cli import main
    T = typestore().types
    bag = make_demo_bag(tmp_path / "garbage", DemoBagConfig(duration=1.0, state_rate_hz=20.0)).path
    (mcap,) = bag.glob("*.mcap")
    data = mcap.read_bytes()
    cut = _write_bag(tmp_path / "cut", [("/joint_states", "sensor_msgs/msg/JointState", START, _joint_state(START))])
    (cut_mcap,) = cut.glob("*.mcap")
    cut_mcap.write_bytes(cut_mcap.read_bytes()[:60])          # the header and a bit: no complete record
    no_inputs = _write_bag(tmp_path / "no_inputs", [("/chatter", "std_msgs/msg/String", START,
                                                     T["std_msgs/msg/String"](data="hi"))])
    mcap.write_bytes(b"definitely not an mcap file" + data[100:200])
    expected = {bag: [mcap.name, "magic"], cut: [cut_mcap.name, "truncated", "no message could be read"],
                no_inputs: ["none of its messages can reach the node", "/chatter", "/joint_states"]}
    for path, words in expected.items():
        t = time.monotonic()
        rc = main([str(path), "--start-node", "--params-file", str(CPU_CONFIG), "-p", "model.checkpoint:=/nonexistent"])
        out, err = capsys.readouterr()
        assert rc == 1 and time.monotonic() - t < 10, (path, out, err)
        assert "starting the policy node" not in out, (path, out)
        assert all(w in err for w in words), (path, err)


def test_report_judges_the_session_by_the_nodes_margin_rules(tmp_path):
    """The report's OK/WARN/ERROR is the node's rule applied to the session's samples: the last three
    chunks missing their deadline is ERROR for the node (MarginMonitor), so for the report too."""
    import dataclasses

    from phyai_ros.control.margin import ERROR, MarginReport
    from phyai_ros.replay.analysis import analyze
    from phyai_ros.replay.runbag import Run
    margins = [0.05] * 27 + [-0.01] * 3
    base = MarginReport(stamp_ns=0, chunk_seq=0, expired=False, budget=0.5, latency_observe=0.01,
                        latency_transfer=0.0, latency_queue=0.0, latency_inference=0.1, latency_actuate=0.0,
                        margin=0.0, margin_p50=0.0, margin_p95=0.0, margin_p99=0.0, window_size=1,
                        p_nonnegative=1.0, p_nonnegative_lower=0.5, confidence=0.9, target=0.95, level=1,
                        message="", roofline_x=math.nan, roofline_y=math.nan)
    run = Run(path=tmp_path, margins=[(START + i * NS_PER_S, dataclasses.replace(base, chunk_seq=i, margin=m,
                                                                                 stamp_ns=START + i * NS_PER_S))
                                      for i, m in enumerate(margins)])
    num = analyze(run)["margin"]
    assert (num["n"], num["k"]) == (30, 27)
    assert num["level"] == ERROR, num["why"]  # before: WARN (P-hat 0.9 above 0.8, bound below target)
    assert "last 3 chunks missed their deadline" in num["why"]


def test_replay_tools_do_not_import_the_users_test_helpers():
    """phyai_ros.testing wraps the replay tools for users' tests; the tools never import it back."""
    import ast
    replay_dir = Path(__file__).resolve().parents[1] / "phyai_ros" / "replay"
    users = []
    for path in sorted(replay_dir.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "phyai_ros.testing":
                users.append(path.name)
    assert not users, f"replay modules importing phyai_ros.testing: {users}"
