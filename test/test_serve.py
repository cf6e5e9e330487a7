"""The policy served on Ray Serve: batched == unbatched per request, HTTP and in-process (rollout) paths, and
faults (malformed request, slow replica, silent endpoint, replica dying mid-batch) on loopback.

One local Ray instance for the module (num_cpus=2, a small object store), shut down at the end; every loop is
bounded. The small fixture pi0.5 (fp32, CPU) is served."""
from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")
from ray import serve  # noqa: E402

from phyai_ros.control.margin import LatencyRecord  # noqa: E402
from phyai_ros.control.rtc import RtcRequest  # noqa: E402
from phyai_ros.fixtures import make_small_checkpoint, require_tokenizer  # noqa: E402
from phyai_ros.serve.app import APP_NAME, run_local  # noqa: E402
from phyai_ros.serve.client import HttpPolicyClient, RemotePolicy, ServeError  # noqa: E402
from phyai_ros.serve.engine import BatchEngine, ServeConfig  # noqa: E402
from phyai_ros.serve.rollout import RolloutClient  # noqa: E402
from phyai_ros.serve.wire import BadRequest, Failure, Reply, Request, decode_request, encode_request  # noqa: E402
from ros_helpers import REPO  # noqa: E402

H = 20
BATCH_WAIT_S = 0.25   # long enough on 2 busy cores that concurrent requests share one batch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> ServeConfig:
    ckpt = make_small_checkpoint(tmp_path_factory.mktemp("serve") / "pi05", horizon=H)
    return ServeConfig(str(ckpt), str(require_tokenizer()), device="cpu", batch_wait_s=BATCH_WAIT_S,
                       max_batch_size=8, engine="serve_drills:DrillEngine")


@pytest.fixture(scope="module")
def engine(config) -> BatchEngine:
    return BatchEngine(config)


@pytest.fixture(scope="module")
def endpoint(config):
    ray.init(num_cpus=2, object_store_memory=80 * 2**20, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": f"{REPO}:{REPO / 'test'}"}})
    try:
        url = run_local(config, port=_free_port(), num_replicas=1, num_cpus=0.5)
        yield url
    finally:
        serve.shutdown()
        ray.shutdown()


def _rtc(rng, d: int, n: int, mode: str = "guided") -> RtcRequest:
    prefix = rng.normal(size=(n, 7)).astype(np.float32)
    return RtcRequest(mode, "linear", prefix, d, H, 0, 20_000_000)


def _request(rng, robot: str, task: str, seed: int, rtc=None, cameras=("base_0_rgb", "left_wrist_0_rgb")) -> Request:
    images = {c: rng.integers(0, 256, (96, 128, 3), dtype=np.uint8) for c in cameras}
    return Request(robot, images, rng.normal(size=8).astype(np.float32), task, seed, rtc)


def _alone(engine: BatchEngine, r: Request) -> np.ndarray:
    """The same request through the adapter alone (the node's onboard path)."""
    noise = engine.adapter.make_noise(1, generator=torch.Generator().manual_seed(r.seed))
    return engine.adapter.predict(r.images, r.state, r.task, noise=noise, rtc=r.rtc)


# ------------------------------------------------------------------------------------------- no Ray
def test_batched_equals_unbatched_per_request(engine):
    rng = np.random.default_rng(1)
    reqs = [_request(rng, "a", "pick up the cup", 1),
            _request(rng, "b", "open the drawer slowly", 2, _rtc(rng, 3, 12)),
            _request(rng, "c", "stack the blocks", 3, _rtc(rng, 6, 18), cameras=("right_wrist_0_rgb",)),
            _request(rng, "d", "pick up the cup", 4, _rtc(rng, 2, 9, mode="trained"))]
    out = engine.run(reqs)
    for r, o in zip(reqs, out):
        assert isinstance(o, Reply) and o.robot_id == r.robot_id and o.batch_size == 4
        assert np.abs(o.actions - _alone(engine, r)).max() <= 1e-5, r.robot_id
    # the per-row RTC state matters: without it, b's chunk is another one
    plain = Request("b", reqs[1].images, reqs[1].state, reqs[1].task, 2)
    assert np.abs(_alone(engine, plain) - out[1].actions).max() > 1e-3


def test_bad_request_fails_alone_named(engine):
    rng = np.random.default_rng(2)
    good, bad = _request(rng, "good", "pick", 1), _request(rng, "bad", "pick", 2)
    bad.state = np.zeros(5, np.float32)
    ok, failed = engine.run([good, bad])
    assert isinstance(ok, Reply) and ok.robot_id == "good"
    assert isinstance(failed, Failure) and failed.status == 400 and "bad" in failed.message
    assert "state" in failed.message


def test_wire_round_trip_and_malformed_bytes():
    rng = np.random.default_rng(3)
    r = _request(rng, "arm/1", "pick", 7, _rtc(rng, 2, 5))
    back = decode_request(encode_request(r))
    assert (back.robot_id, back.task, back.seed, back.rtc.d, back.rtc.n) == ("arm/1", "pick", 7, 2, 5)
    assert np.array_equal(back.images["base_0_rgb"], r.images["base_0_rgb"])
    for junk in (b"", b"\x05\x00\x00\x00{}", b"\x02\x00\x00\x00[]" + b"x"):
        with pytest.raises(BadRequest):
            decode_request(junk)


# ------------------------------------------------------------------------------------------- Ray Serve
def _post_all(client_requests) -> list:
    """Each (client, request) from its own thread at once; the result or the exception, in order."""
    out = [None] * len(client_requests)

    def run(i, client, request):
        try:
            out[i] = client.infer(request)
        except Exception as exc:  # noqa: BLE001
            out[i] = exc
    threads = [threading.Thread(target=run, args=(i, c, r)) for i, (c, r) in enumerate(client_requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return out


def test_http_two_robots_in_one_batch_get_their_own_chunks(endpoint, engine):
    rng = np.random.default_rng(4)
    reqs = [_request(rng, "robot_a", "pick up the cup", 11, _rtc(rng, 4, 10)),
            _request(rng, "robot_b", "open the drawer", 12)]
    replies = _post_all([(HttpPolicyClient(endpoint, timeout=30), r) for r in reqs])
    for r, rep in zip(reqs, replies):
        assert isinstance(rep, Reply), rep
        assert rep.robot_id == r.robot_id and rep.model_id == "pi05" and rep.batch_size == 2
        assert np.abs(rep.actions - _alone(engine, r)).max() <= 1e-5
        assert rep.inference_s > 0 and 0 < rep.queue_s < 5


def test_remote_policy_timings_split_the_call(endpoint):
    """The bridge's chunk carries the server's queue and inference; the latency record adds the rest of the
    call (serialization + network) to the queue, and the five segments still sum to the measured total."""
    policy = RemotePolicy(HttpPolicyClient(endpoint, timeout=30), "robot_t")
    assert policy.horizon == H and policy.adapter.action_dim == 7
    rng = np.random.default_rng(5)
    r = _request(rng, "robot_t", "pick", 1)
    from phyai_ros.control import ObservationSnapshot
    snap = ObservationSnapshot(r.images, {c: True for c in r.images}, {c: 0 for c in r.images}, r.state, 0,
                               "pick", 0, 0, 0)
    t0 = time.monotonic_ns()
    chunk = policy(snap, None)
    t1 = time.monotonic_ns()
    s = chunk.server_timing
    assert chunk.shape == (H, 7) and s.queue_ns >= 0.5 * BATCH_WAIT_S * 1e9 and s.inference_ns > 0
    rec = LatencyRecord.measured(stamp_ns=0, recv_ns=0, snapshot_ns=0, ready_ns=t1 - t0, cover_end_ns=None,
                                 mono_ns=(t0, t0, t1, t1), server=s)
    assert rec.queue_ns == s.queue_ns + rec.wire_ns and rec.inference_ns == s.inference_ns and rec.wire_ns > 0
    assert rec.transfer == 0   # the wire is after the snapshot: queue, not transfer
    assert rec.critical == pytest.approx((t1 - t0) / 1e9, abs=1e-9)


def test_malformed_and_refused_requests_are_4xx_and_counted(endpoint):
    import http.client
    import json
    client = HttpPolicyClient(endpoint, timeout=30)
    conn = http.client.HTTPConnection("127.0.0.1", client.port, timeout=30)
    conn.request("POST", "/", body=b"\x10\x00\x00\x00not json at all!")
    resp = conn.getresponse()
    body = json.loads(resp.read())
    assert resp.status == 400 and "malformed request" in body["error"]
    bad = _request(np.random.default_rng(6), "robot_bad", "pick", 1, cameras=("no_such_camera",))
    with pytest.raises(ServeError, match="robot_bad.*no_such_camera") as err:
        client.infer(bad)
    assert err.value.status == 400
    counters = client.info()["counters"]
    assert counters["malformed"] >= 1 and counters["failed_400"] >= 1


def test_rollout_client_from_a_ray_actor(endpoint):
    """The RL path: an actor holds the DeploymentHandle (no HTTP) and gets a chunk per robot, with Q(B)."""
    @ray.remote(num_cpus=0)
    class Rollouts:
        def run(self, n):
            rng = np.random.default_rng(7)
            reqs = [_request(rng, f"env_{i}", "pick up the cup", i) for i in range(n)]
            res = RolloutClient().submit(reqs)
            return [getattr(r, "robot_id", None) for r in res.results], res.q, res.t_amort_s, res.t_sync_s, \
                [getattr(r, "batch_size", 0) for r in res.results]
    ids, q, t_amort, t_sync, sizes = ray.get(Rollouts.remote().run.remote(4), timeout=120)
    assert ids == [f"env_{i}" for i in range(4)]
    assert q == pytest.approx(4 / t_sync) and t_amort == pytest.approx(t_sync / 4)
    assert max(sizes) > 1   # submitted at once, batched


def test_slow_replica_and_silent_endpoint_time_out_clearly(endpoint):
    rng = np.random.default_rng(8)
    with pytest.raises(ServeError, match="did not answer within 0.500 s"):
        HttpPolicyClient(endpoint, timeout=0.5).infer(_request(rng, "robot_s", "sleep 2.0", 1))
    with socket.socket() as silent:   # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        t = time.monotonic()
        with pytest.raises(ServeError, match="did not answer"):
            HttpPolicyClient(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.3).info()
        assert time.monotonic() - t < 2


def test_replica_dying_mid_batch_fails_every_request_clearly_then_recovers(endpoint, engine):
    rng = np.random.default_rng(9)
    victim = _request(rng, "robot_v", "pick up the cup", 3)
    results = _post_all([(HttpPolicyClient(endpoint, timeout=30), _request(rng, "robot_x", "exit now", 1)),
                         (HttpPolicyClient(endpoint, timeout=30), victim)])
    for robot, res in zip(("robot_x", "robot_v"), results):
        # never silent, never another robot's chunk: an error, or (if it ran on the restarted replica) its own
        assert isinstance(res, ServeError) or (isinstance(res, Reply) and res.robot_id == robot), res
    assert isinstance(results[0], ServeError) and results[0].status >= 500
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:   # Serve replaces the dead replica
        try:
            rep = HttpPolicyClient(endpoint, timeout=30).infer(victim)
            break
        except ServeError:
            time.sleep(1.0)
    else:
        pytest.fail("the replica was not replaced within 60 s")
    assert rep.robot_id == "robot_v" and np.abs(rep.actions - _alone(engine, victim)).max() <= 1e-5
    assert serve.status().applications[APP_NAME].status == "RUNNING"


# ------------------------------------------------------------------------------------------- GR00T N1.7
def test_groot_served_over_http_gets_predicts_chunk(endpoint, tmp_path):
    """A family served one request at a time (GR00T N1.7: ``serving`` "single") on the same proxy under its own
    route: its fixture checkpoint over real HTTP answers what ``python -m phyai_ros.predict`` computes for the
    same observation and noise, and a request it cannot take fails alone as a 400."""
    from safetensors.torch import save_file

    from phyai_ros.fixtures import load_groot_fixture, require_groot_fixture
    from phyai_ros.predict import main as predict
    folder = require_groot_fixture()
    fx = load_groot_fixture(folder)
    url = run_local(ServeConfig(str(folder / "checkpoint"), device="cpu", batch_wait_s=0.01), port=_port(endpoint),
                    num_replicas=1, num_cpus=0.5, name="groot", route_prefix="/groot")
    client = HttpPolicyClient(url, timeout=60)
    info = client.info()
    assert (info["model_type"], info["serving"], info["masks_cameras"]) == ("groot_n17", "single", False)
    images = {k: v[0].numpy() for k, v in fx["images"].items()}
    state, task, seed = fx["inp"]["raw.observation.state"][0].numpy(), fx["meta"]["tasks"][0], 5
    reply = client.infer(Request("arm", images, state, task, seed))
    # predict on the same observation (batch 1) with the noise the server draws from the seed
    noise = torch.randn(1, 16, 14, generator=torch.Generator().manual_seed(seed))   # [1, action_horizon, max_action_dim]
    save_file({**{f"raw.observation.images.{k}": torch.from_numpy(v[None].copy()) for k, v in images.items()},
               "raw.observation.state": torch.from_numpy(state[None].copy()), "noise": noise},
              str(tmp_path / "inputs.safetensors"))
    assert predict(["--checkpoint", str(folder / "checkpoint"), "--inputs", str(tmp_path / "inputs.safetensors"),
                    "--task", task, "--output", str(tmp_path / "out.safetensors")]) == 0
    from safetensors.torch import load_file
    expected = load_file(str(tmp_path / "out.safetensors"))["actions"][0].numpy()
    assert reply.robot_id == "arm" and reply.actions.shape == expected.shape == (16, 12)
    assert np.abs(reply.actions - expected).max() <= 1e-5
    with pytest.raises(ServeError, match="400.*camera 'wrist'"):   # a required camera missing: its own fault
        client.infer(Request("arm", {"front": images["front"]}, state, task, seed))


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])
