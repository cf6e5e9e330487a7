#!/usr/bin/env python3
"""Load generator for the served policy: N robots (threads, one keep-alive HTTP connection each) send
observations back to back for a fixed number of requests; prints throughput, latency percentiles, the server's
queue / inference times and every failure by kind (none is dropped: each request is a chunk for its own robot
or a counted failure).

    .venv/bin/python scripts/serve_load.py --endpoint http://127.0.0.1:8000 --robots 8 --requests 20
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from phyai_ros.serve.client import HttpPolicyClient, ServeError  # noqa: E402
from phyai_ros.serve.wire import Request  # noqa: E402


def robot_loop(endpoint: str, info: dict, robot: str, n: int, timeout: float, out: list, failures: Counter) -> None:
    rng = np.random.default_rng(abs(hash(robot)) % 2**32)
    client = HttpPolicyClient(endpoint, timeout)
    size = info["image_size"] or 224
    for i in range(n):
        images = {c: rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for c in info["camera_names"]}
        req = Request(robot, images, rng.normal(size=info["state_dim"]).astype(np.float32), "pick up the cup", i)
        t = time.perf_counter()
        try:
            reply = client.infer(req)
        except ServeError as exc:
            failures[f"status {exc.status}" if exc.status else "no answer"] += 1
            continue
        out.append((time.perf_counter() - t, reply.queue_s, reply.inference_s, reply.batch_size))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", default="http://127.0.0.1:8000")
    ap.add_argument("--robots", type=int, default=8)
    ap.add_argument("--requests", type=int, default=20, help="per robot")
    ap.add_argument("--timeout", type=float, default=30.0)
    a = ap.parse_args()
    info = HttpPolicyClient(a.endpoint, a.timeout).info()
    out: list = []
    failures: Counter = Counter()
    threads = [threading.Thread(target=robot_loop, args=(a.endpoint, info, f"robot_{i}", a.requests, a.timeout,
                                                         out, failures)) for i in range(a.robots)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    sent = a.robots * a.requests
    print(f"{info['model_id']} ({info['model_type']}, {info['device']}): {len(out)}/{sent} chunks in {wall:.2f} s "
          f"= {len(out) / wall:.1f} chunks/s; failures {dict(failures) or 'none'}")
    if out:
        lat, queue, inf, size = (sorted(col) for col in zip(*out))
        pct = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3   # noqa: E731
        print(f"latency p50 {pct(lat, 0.5):.1f} ms p99 {pct(lat, 0.99):.1f} ms; server queue p50 "
              f"{pct(queue, 0.5):.1f} ms, inference p50 {pct(inf, 0.5):.1f} ms; mean batch "
              f"{statistics.mean(size):.1f}")
    assert len(out) + sum(failures.values()) == sent, "a request neither answered nor counted"


if __name__ == "__main__":
    main()
