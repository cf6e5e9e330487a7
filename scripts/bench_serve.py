#!/usr/bin/env python3
"""In-process runner vs the same runner served on Ray Serve: Q(B) = B / T_sync(B) and T_amort(B) = T_sync(B) / B at
B = 1..32 (served through the rollout client's DeploymentHandle), the serving path's added latency at batch 1
(p50 of HTTP and of the handle, minus the in-process p50), and N robots at once (--robots): each its own client
in its own thread, one request after another (closed loop), their chunk times (p50 / p99) and the chunks per
second of all of them against the in-process batch of N.

    .venv/bin/python scripts/bench_serve.py --batches 1,8     # CPU: the small fixture pi0.5 (fp32)
    python3 scripts/bench_serve.py --checkpoint DIR --tokenizer FILE --dtype bfloat16   # GPU: pi0.5 (a random
        # full-size one: scripts/bench_runtime.py --checkpoint DIR --checkpoint-only)
    python3 scripts/bench_serve.py --checkpoint ROOT/checkpoint_1view --dtype bfloat16   # GPU: GR00T N1.7
        # (scripts/bench_groot.py --root ROOT writes one)

On the GPU machine Ray and its serve extras come as wheels on PYTHONPATH (../shared/device-wheels/README.md): the
replicas get the same PYTHONPATH, so they import what the driver imports. The figures are printed and written
as JSON (--out, default $OUT/bench_serve.json where $OUT is set).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import ray  # noqa: E402
from ray import serve  # noqa: E402

from phyai_ros.serve.app import run_local  # noqa: E402
from phyai_ros.serve.client import HttpPolicyClient  # noqa: E402
from phyai_ros.serve.engine import BatchEngine, ServeConfig  # noqa: E402
from phyai_ros.serve.rollout import RolloutClient  # noqa: E402
from phyai_ros.serve.wire import Request  # noqa: E402


def requests(engine: BatchEngine, n: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    size = engine.adapter.image_size or 224
    return [Request(f"robot_{i}", {c: rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                                   for c in engine.adapter.camera_names},
                    rng.normal(size=engine.adapter.state_dim).astype(np.float32), "pick up the cup", i)
            for i in range(n)]


def p50(fn, runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def robots_at_once(calls: list, per_robot: int) -> dict:
    """Each of ``calls`` (one robot's request, as a function) in its own thread, ``per_robot`` times in a row after
    one warm-up call, all starting together: every call's time (ms, p50 / p99) and all robots' chunks per second."""
    times: list = []
    failed: list = []
    batch_sizes: list = []
    start = threading.Barrier(len(calls) + 1)

    def robot(call) -> None:
        call()
        start.wait()
        for _ in range(per_robot):
            t = time.perf_counter()
            try:
                batch_sizes.append(call().batch_size)
            except Exception as exc:  # noqa: BLE001 - counted, and the robot goes on
                failed.append(repr(exc)[:200])
            times.append(time.perf_counter() - t)

    threads = [threading.Thread(target=robot, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    start.wait()
    wall = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - wall
    ms = sorted(1e3 * t for t in times)
    return {"robots": len(calls), "per_robot": per_robot, "p50_ms": statistics.median(ms),
            "p99_ms": ms[min(len(ms) - 1, int(0.99 * len(ms)))], "chunks_per_s": len(ms) / wall,
            "failed": len(failed), "first_failure": failed[0] if failed else "",
            "batch_size_p50": statistics.median(batch_sizes) if batch_sizes else 0}


def one_reply(result):
    """The rollout result's one reply; its Failure raised."""
    (reply,) = result.results
    if not hasattr(reply, "batch_size"):
        raise RuntimeError(f"{reply.status}: {reply.message}")
    return reply


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="")
    ap.add_argument("--tokenizer", default="")
    ap.add_argument("--device", default="auto", help="auto: cuda when there is one")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--batch-wait-ms", type=float, default=0.0)
    ap.add_argument("--robots", type=int, default=8, help="robots at once, each its own client (0: none)")
    ap.add_argument("--per-robot", type=int, default=30, help="requests each of them sends, one after another")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--object-store-mb", type=int, default=2048, help="Ray's object store (a small /dev/shm suffices)")
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) / "bench_serve.json" if os.environ.get("OUT")
                    else None, help="write the figures as JSON here")
    a = ap.parse_args()
    if not a.checkpoint:
        from phyai_ros.fixtures import make_small_checkpoint, require_tokenizer
        a.checkpoint = str(make_small_checkpoint(Path(tempfile.mkdtemp()) / "pi05"))
        a.tokenizer = str(require_tokenizer())
    batches = [int(b) for b in a.batches.split(",")]
    cfg = ServeConfig(a.checkpoint, a.tokenizer, device=a.device, dtype=a.dtype,
                      max_batch_size=max(batches + [a.robots]), batch_wait_s=a.batch_wait_ms / 1e3)
    engine = BatchEngine(cfg)
    print(f"model {engine.model_type} on {cfg.resolved_device} ({a.dtype}); {a.runs} runs per point, p50")
    inputs = {b: requests(engine, b) for b in batches}   # made once: only the policy path is timed
    if a.robots:
        inputs.setdefault(a.robots, requests(engine, a.robots))
    local = {b: p50(lambda b=b: engine.run(inputs[b]), a.runs) for b in inputs}

    # The replicas import what this process imports: the repository, and the wheels' folder on the GPU machine.
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))
    try:
        url = run_local(cfg, port=a.port, num_replicas=a.replicas,
                        ray_init=dict(log_to_driver=False, object_store_memory=a.object_store_mb * 2**20,
                                      runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}))
        rollout, http = RolloutClient(), HttpPolicyClient(url, timeout=120)
        served, replica = {}, {}
        for b in batches:
            seen = []
            served[b] = p50(lambda b=b: seen.append(rollout.submit(inputs[b])), a.runs)   # noqa: B023
            replies = [r for res in seen[1:] for r in res.results if hasattr(r, "inference_s")]
            replica[b] = {"inference_ms": 1e3 * statistics.median(r.inference_s for r in replies),
                          "queue_ms": 1e3 * statistics.median(r.queue_s for r in replies),
                          "batch_sizes": sorted({r.batch_size for r in replies}),
                          "failed": sum(len(res.failures) for res in seen)}
        one = requests(engine, 1)[0]
        http_1 = p50(lambda: http.infer(one), a.runs * 4)
        handle_1 = p50(lambda: rollout.submit([one]), a.runs * 4)
        fleet = {}
        if a.robots:
            fleet_http = [HttpPolicyClient(url, timeout=120) for _ in range(a.robots)]
            fleet["http"] = robots_at_once([lambda c=c, r=r: c.infer(r)
                                            for c, r in zip(fleet_http, inputs[a.robots])], a.per_robot)
            fleet["handle"] = robots_at_once([lambda r=r: one_reply(rollout.submit([r])) for r in inputs[a.robots]],
                                             a.per_robot)
    finally:
        serve.shutdown()
        ray.shutdown()
    print(f"{'B':>4} {'Q in-process /s':>16} {'Q served /s':>12} {'served/in-process':>18} {'T_amort served ms':>18}"
          f" {'replica run ms':>15} {'queue ms':>9} {'batches':>8}")
    for b in batches:
        print(f"{b:>4} {b / local[b]:>16.2f} {b / served[b]:>12.2f} {local[b] / served[b]:>18.3f} "
              f"{served[b] / b * 1e3:>18.2f} {replica[b]['inference_ms']:>15.2f} {replica[b]['queue_ms']:>9.2f} "
              f"{','.join(map(str, replica[b]['batch_sizes'])):>8}")
    base = local.get(1) or p50(lambda: engine.run([one]), a.runs)   # noqa: B023
    print(f"batch 1 latency p50: in-process {base * 1e3:.2f} ms, handle {handle_1 * 1e3:.2f} ms "
          f"(+{(handle_1 - base) * 1e3:.2f} ms), HTTP {http_1 * 1e3:.2f} ms (+{(http_1 - base) * 1e3:.2f} ms); "
          f"batch wait {a.batch_wait_ms:g} ms")
    for path, f in fleet.items():
        print(f"{f['robots']} robots at once over {path}: chunk p50 {f['p50_ms']:.2f} ms, p99 {f['p99_ms']:.2f} ms, "
              f"{f['chunks_per_s']:.1f} chunks/s in all, batches of {f['batch_size_p50']:g} (in-process batch of {a.robots}: "
              f"{a.robots / local[a.robots]:.1f} chunks/s, {local[a.robots] * 1e3:.2f} ms); {f['failed']} failed")
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({
            "model": engine.model_type, "device": cfg.resolved_device, "dtype": a.dtype, "runs": a.runs,
            "batch_wait_ms": a.batch_wait_ms, "batch1_ms": {"in_process": base * 1e3, "handle": handle_1 * 1e3,
                                                            "http": http_1 * 1e3},
            "robots_at_once": {**fleet, "in_process_batch_ms": local[a.robots] * 1e3 if a.robots else None},
            "per_batch": {b: {"t_sync_in_process_ms": local[b] * 1e3, "t_sync_served_ms": served[b] * 1e3,
                              "q_in_process": b / local[b], "q_served": b / served[b],
                              "t_amort_served_ms": served[b] / b * 1e3, "replica": replica[b]} for b in batches}},
            indent=1))
        print(f"figures written to {a.out}")


if __name__ == "__main__":
    main()
