"""The node with ``policy.backend: remote`` over real DDS, against the policy served by Ray Serve on loopback:
chunks flow, the margin's queue and transfer segments carry the measured remote timings, and an endpoint that
stops answering (a slow replica past ``policy.timeout``, then a server that is gone) is counted as inference
errors while the node keeps running, its deadline policy acts and its watchdog reports ERROR."""
from __future__ import annotations

import secrets
import socket
import time

import pytest

ray = pytest.importorskip("ray")
from ray import serve  # noqa: E402

from node_harness import (FakeRobot, NodeProcess, diagnostics_status, make_small_checkpoint,  # noqa: E402
                          require_tokenizer)
from phyai_ros.serve.app import init_local_ray, run_local  # noqa: E402
from phyai_ros.serve.engine import ServeConfig  # noqa: E402
from ros_helpers import REPO  # noqa: E402

pytestmark = pytest.mark.ros
BATCH_WAIT_S = 0.12   # a lone robot's request waits this long on the server for company: a real queue time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _watchdog_error_since(robot: FakeRobot, since: float) -> bool:
    return any(r.t > since and (st := diagnostics_status(r.msg, "control margin")) is not None and st.level[0] == 2
               for r in robot.diagnostics)


def _start_local_ray() -> None:
    """This test's small local Ray instance (2 CPUs, an 80 MB object store), its workers able to import the repo."""
    init_local_ray(num_cpus=2, object_store_memory=80 * 2**20, log_to_driver=False,
                   runtime_env={"env_vars": {"PYTHONPATH": f"{REPO}:{REPO / 'test'}"}})


def test_remote_backend_over_serve(tmp_path):
    tokenizer = require_tokenizer()
    ckpt = make_small_checkpoint(tmp_path / "pi05")
    token = secrets.token_urlsafe(16)   # the endpoint requires it; the node sends its policy.token
    _start_local_ray()
    node = robot = None
    try:
        url = run_local(ServeConfig(str(ckpt), str(tokenizer), device="cpu", batch_wait_s=BATCH_WAIT_S,
                                    engine="serve_drills:DrillEngine"), port=_free_port(), num_replicas=1, num_cpus=0.5,
                        token=token)
        node = NodeProcess(ckpt, tokenizer, overrides={"policy.backend": "remote", "policy.endpoint": url,
                                                       "policy.token": token,
                                                       "policy.timeout": 1.0, "model.warmup_runs": 1,
                                                       "control.deadline_policy": "hold_last"})
        robot = FakeRobot(node.params)
        assert robot.wait_for_node(timeout=90), node.output()
        robot.set_instruction("pick up the cup")
        assert robot.spin_until(lambda: len(robot.margins) >= 4, timeout=90), node.output()

        for r in robot.margins:
            m = r.msg
            assert m.latency_queue >= 0.8 * BATCH_WAIT_S, m          # the server's batch queue, measured
            assert m.latency_transfer >= 0 and m.latency_inference > 0
            if m.budget == m.budget:   # not a startup chunk: the margin is the budget less the five segments
                total = (m.latency_observe + m.latency_transfer + m.latency_queue + m.latency_inference
                         + m.latency_actuate)
                assert m.margin == pytest.approx(m.budget - total, abs=2e-6)
        chunk = robot.chunks[-1].msg
        assert any(abs(chunk.inference_latency - r.msg.latency_inference) < 1e-6 for r in robot.margins)

        # A replica slower than policy.timeout: every call times out -> counted, deadline policy, watchdog.
        errors = robot.fresh_counters().get("inference_errors", 0)
        since = time.monotonic()
        robot.set_instruction("sleep 3.0")
        assert robot.wait_counter("inference_errors", errors, timeout=30), node.output()
        assert robot.spin_until(lambda: _watchdog_error_since(robot, since), timeout=30), node.output()
        counters = robot.fresh_counters()
        assert counters.get("run_outs", 0) >= 1 and counters.get("deadline_policy_ticks", 0) > 0, counters
        assert "did not answer within 1.000 s" in node.output(), node.output()

        # Back to a normal task: chunks flow again (bounded: the slow batches drain first).
        seq = robot.last_seq()
        robot.set_instruction("pick up the cup")
        assert robot.wait_chunks_after(seq, count=2, timeout=60), node.output()

        # The server gone: refused connections are counted too, and the node keeps running.
        serve.shutdown()
        errors = robot.fresh_counters().get("inference_errors", 0)
        assert robot.wait_counter("inference_errors", errors + 1, timeout=30), node.output()
        assert node.alive, node.output()
        assert token not in node.output()   # policy.token is never logged
    finally:
        if robot is not None:
            robot.close()
        if node is not None:
            node.stop()
        serve.shutdown()
        ray.shutdown()


def test_the_same_bag_onboard_and_remote(tmp_path):
    """One recorded session replayed through the node twice, onboard and remote: every input message is
    accounted for both times, and the margin monitor shows the difference where it is: the remote run's
    queue segment carries the server's batch wait, so its margins are smaller by about that much."""
    import numpy as np

    from phyai_ros.replay.demo_bag import DemoBagConfig, make_demo_bag
    from phyai_ros.testing import PolicyNode, replay
    tokenizer = require_tokenizer()
    ckpt = make_small_checkpoint(tmp_path / "pi05")
    bag = make_demo_bag(tmp_path / "bag", DemoBagConfig(duration=8.0, state_rate_hz=20.0, storage="mcap"))
    overrides = {"control.horizon": 20}
    results = {}
    _start_local_ray()
    try:
        url = run_local(ServeConfig(str(ckpt), str(tokenizer), device="cpu", batch_wait_s=BATCH_WAIT_S),
                        port=_free_port(), num_replicas=1, num_cpus=0.5)
        for backend, extra in (("onboard", {}), ("remote", {"policy.backend": "remote", "policy.endpoint": url})):
            with PolicyNode(checkpoint=ckpt, tokenizer=tokenizer, overrides={**overrides, **extra},
                            stepped=False) as node:
                results[backend] = replay(bag.path, node, mode="realtime")
    finally:
        serve.shutdown()
        ray.shutdown()
    queue = {}
    for backend, result in results.items():
        acc = result.accounting
        assert result.complete and acc.ok, (backend, acc.problems)
        assert {t: row["played"] for t, row in acc.per_topic.items()} == bag.counts
        margins = [m for m in result.margin_values if not m.expired]
        assert len(margins) >= 4, backend
        queue[backend] = float(np.median([m.latency_queue for m in margins]))
        for m in margins:
            total = m.latency_observe + m.latency_transfer + m.latency_queue + m.latency_inference + m.latency_actuate
            if m.budget == m.budget:
                assert m.margin == pytest.approx(m.budget - total, abs=2e-6)
    print(f"queue p50 onboard {queue['onboard'] * 1e3:.1f} ms, remote {queue['remote'] * 1e3:.1f} ms")
    assert queue["remote"] >= queue["onboard"] + 0.8 * BATCH_WAIT_S, queue
