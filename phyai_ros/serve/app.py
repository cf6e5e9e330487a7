"""The Ray Serve application: one replica of the policy per GPU (CPU replicas without CUDA), dynamic batching.

Routes of the HTTP ingress (loopback or the edge server's network):

    POST /       a ``wire`` request (robot id, images, state, task, seed, RTC state) -> a ``wire`` reply
                 (the chunk, the server's queue and inference times, the model id); 400 with a JSON message
                 for a malformed or refused request, 500 when inference failed
    GET  /info   the model (cameras, H, dims, RTC modes) and this replica's counters

In-process callers (RL rollouts from a Ray actor, no HTTP) call ``infer`` through the DeploymentHandle with a
``wire.Request``. Both paths go through one ``serve.batch`` queue (bounded wait ``batch_wait_s``, at most
``max_batch_size`` requests) into ``BatchEngine``, which runs in a worker thread so the replica keeps
answering health checks while it computes.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections import Counter

import torch
from ray import serve
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from .engine import ServeConfig, engine_for
from .wire import BadRequest, Failure, Request, decode_request, encode_reply

APP_NAME = "phyai_policy"
BINARY = "application/octet-stream"


def _error(status: int, message: str, robot_id: str = "") -> Response:
    return Response(json.dumps({"error": message, "robot_id": robot_id}), status_code=status,
                    media_type="application/json")


@serve.deployment(max_ongoing_requests=64)
class PolicyDeployment:
    def __init__(self, config: dict):
        self.cfg = ServeConfig(**config)
        self.engine = engine_for(self.cfg)
        self.counters: Counter = Counter()
        self._batched.set_max_batch_size(self.cfg.max_batch_size)
        self._batched.set_batch_wait_timeout_s(self.cfg.batch_wait_s)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def _batched(self, requests: list) -> list:
        self.counters["batches"] += 1
        out = await asyncio.to_thread(self.engine.run, requests)
        for r in out:
            self.counters["replies" if not isinstance(r, Failure) else f"failed_{r.status}"] += 1
        return out

    async def infer(self, request: Request):
        """One request (in-process path): a ``Reply``, or a ``Failure`` naming the robot."""
        request.arrived_ns = time.monotonic_ns()
        self.counters["requests"] += 1
        return await self._batched(request)

    def info(self) -> dict:
        return {**self.engine.info(), "counters": dict(self.counters)}

    async def __call__(self, http: HttpRequest) -> Response:
        if http.method == "GET" and http.url.path.rstrip("/").endswith("/info"):
            return Response(json.dumps(self.info()), media_type="application/json")
        arrived = time.monotonic_ns()
        try:
            request = decode_request(await http.body())
        except BadRequest as exc:
            self.counters["malformed"] += 1
            return _error(400, f"malformed request: {exc}")
        request.arrived_ns = arrived
        self.counters["requests"] += 1
        result = await self._batched(request)
        if isinstance(result, Failure):
            return _error(result.status, result.message, result.robot_id)
        return Response(encode_reply(result), media_type=BINARY)


def build_app(config: ServeConfig, num_replicas: int = 0, num_cpus: float = 1.0):
    """The application: ``num_replicas`` (0: one per visible GPU, else 1) replicas, each on one GPU when CUDA
    is there (``num_gpus=1``), else on ``num_cpus`` CPUs."""
    gpus = torch.cuda.device_count() if config.resolved_device == "cuda" else 0
    actor = {"num_gpus": 1} if gpus else {"num_cpus": num_cpus}
    replicas = num_replicas or max(gpus, 1)
    return PolicyDeployment.options(num_replicas=replicas, ray_actor_options=actor).bind(dataclasses.asdict(config))


def run_local(config: ServeConfig, port: int = 8000, host: str = "127.0.0.1", num_replicas: int = 0,
              num_cpus: float = 1.0, name: str = APP_NAME, route_prefix: str = "/", **ray_init) -> str:
    """Start (or join) Ray, start Serve's HTTP proxy on host:port and run the application under ``route_prefix``
    (several models on one proxy: one name and route each); returns the endpoint. ``ray_init``: ray.init's
    arguments when no Ray instance is up in this process yet."""
    import ray
    if not ray.is_initialized():
        ray.init(**ray_init)
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(config, num_replicas, num_cpus), name=name, route_prefix=route_prefix)
    return f"http://{host}:{port}{route_prefix.rstrip('/')}"
