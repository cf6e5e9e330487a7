"""The Ray Serve application: one replica of the policy per GPU (CPU replicas without CUDA), dynamic batching.

Routes of the HTTP ingress (loopback or the edge server's network):

    POST /       a ``wire`` request (robot id, images, state, task, seed, RTC state) -> a ``wire`` reply
                 (the chunk, the server's queue and inference times, the model id); 400 with a JSON message
                 for a malformed or refused request, 413 for a body over ``max_body_bytes`` (refused from its
                 Content-Length, never read), 408 for a body not received within ``body_timeout_s``, 429 when
                 ``max_client_requests`` requests of the client's address are in flight already, 500 when inference
                 failed or made a non-finite chunk
    GET  /info   the model (cameras, H, dims, RTC modes) and this replica's counters

With a token (``run_local(token=...)``; required to bind beyond loopback) both routes answer 401 unless the
request carries ``Authorization: Bearer TOKEN``; the replicas hold only its SHA-256.

In-process callers (RL rollouts from a Ray actor, no HTTP) call ``infer`` through the DeploymentHandle with a
``wire.Request``. Both paths go through one batch queue (``batcher.BusyBatcher``, at most ``max_batch_size``
requests) into ``BatchEngine``, which runs in a worker thread so the replica keeps answering health checks while
it computes. Batches form while the engine is busy: a request that finds it idle runs at once, and those that
arrive during a batch run together as the next one (``batch_wait_s`` > 0 holds each batch's first request that
long for company).

Slow clients: a request holds one of the replica's ``max_ongoing_requests`` slots from its headers on, while its
body streams in; 80 connections dripping a byte a second once held them all and locked every robot out. So the
body must arrive within ``body_timeout_s`` (408), and one client address may have ``max_client_requests`` requests
in flight (429 at once, before anything is read), which leaves the other robots their slots.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import ipaddress
import json
import os
import time
from collections import Counter, defaultdict
from typing import Optional

import torch
from ray import serve
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from .batcher import BusyBatcher
from .client import TOKEN_ENV
from .engine import ServeConfig, engine_for
from .wire import MAX_ROBOT_ID, BadRequest, Failure, Request, decode_request, encode_reply

APP_NAME = "phyai_policy"
BINARY = "application/octet-stream"


def _error(status: int, message: str, robot_id: str = "") -> Response:
    """A JSON error reply; the robot id it echoes is capped (MAX_ROBOT_ID), whichever path the request took."""
    return Response(json.dumps({"error": message, "robot_id": str(robot_id)[:MAX_ROBOT_ID]}), status_code=status,
                    media_type="application/json")


def token_digest(token: str) -> str:
    """What a replica holds of the token (its SHA-256, hex): the token itself stays out of Ray's configs."""
    return hashlib.sha256(token.encode()).hexdigest() if token else ""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:   # a host name: it may resolve to anything
        return False


class BodyTimeout(Exception):
    def __init__(self, timeout: float):
        super().__init__(f"the request body did not arrive within {timeout:g} s (--body-timeout-s)")


class BodyTooLarge(Exception):
    def __init__(self, size: int, limit: int, declared: bool):
        super().__init__(f"request body of {size:,} bytes{' (Content-Length)' if declared else ''} is larger than "
                         f"the server's limit of {limit:,} bytes (--max-body-mb)")


async def read_body(http: HttpRequest, limit: int) -> bytes:
    """The request body, at most ``limit`` bytes: a larger Content-Length is refused before anything is read,
    and a body without one (chunked) is refused as soon as it grows past the limit."""
    declared = http.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            size = -1
        if size > limit:
            raise BodyTooLarge(size, limit, True)
    chunks, total = [], 0
    async for chunk in http.stream():
        total += len(chunk)
        if total > limit:
            raise BodyTooLarge(total, limit, False)
        chunks.append(chunk)
    return b"".join(chunks)


async def _not_a_request(r) -> Failure:
    return Failure(str(getattr(r, "robot_id", "?"))[:64], 400, f"not a wire.Request: {type(r).__name__}")


@serve.deployment(max_ongoing_requests=64)
class PolicyDeployment:
    def __init__(self, config: dict, token_sha256: str = ""):
        self.cfg = ServeConfig(**config)
        self.token_sha256 = token_sha256
        self.engine = engine_for(self.cfg)
        self.counters: Counter = Counter()
        self._in_flight: defaultdict = defaultdict(int)   # client address -> HTTP requests in flight
        self.batcher = BusyBatcher(self._run_batch, self.cfg.max_batch_size, self.cfg.batch_wait_s)

    def _run_batch(self, requests: list) -> list:
        """One batch in the batcher's worker thread."""
        self.counters["batches"] += 1
        out = self.engine.run(requests)
        for r in out:
            self.counters["replies" if not isinstance(r, Failure) else f"failed_{r.status}"] += 1
        return out

    async def _batched(self, request: Request):
        return await self.batcher.submit(request)

    async def infer(self, request: Request):
        """One request (in-process path): a ``Reply``, or a ``Failure`` naming the robot."""
        request.arrived_ns = time.monotonic_ns()
        self.counters["requests"] += 1
        return await self._batched(request)

    async def infer_many(self, requests: list) -> list:
        """B requests in one call (the rollout path): they join the batch queue in one event-loop turn, so
        up to the batch size they run as one batch (sent as B calls, they arrive spread out and may split). A reply or a Failure per request, in order; one that is not a
        Request fails alone."""
        def one(r):
            if isinstance(r, Request):
                return self.infer(r)
            self.counters["requests"] += 1
            return _not_a_request(r)
        return list(await asyncio.gather(*(one(r) for r in requests)))

    def info(self) -> dict:
        return {**self.engine.info(), "counters": dict(self.counters)}

    def _authorized(self, http: HttpRequest) -> bool:
        if not self.token_sha256:
            return True
        scheme, _, token = http.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token_digest(token.strip()), self.token_sha256)

    async def __call__(self, http: HttpRequest) -> Response:
        if not self._authorized(http):
            self.counters["unauthorized"] += 1
            return _error(401, "unauthorized: this server needs 'Authorization: Bearer TOKEN' (policy.token)")
        if http.method == "GET" and http.url.path.rstrip("/").endswith("/info"):
            return Response(json.dumps(self.info()), media_type="application/json")
        client = http.client.host if http.client is not None else "?"
        if self._in_flight[client] >= self.cfg.max_client_requests:
            self.counters["too_many_requests"] += 1
            return _error(429, f"{self.cfg.max_client_requests} requests from {client} are in flight already "
                               "(--max-client-requests); send the next when one is answered")
        self._in_flight[client] += 1
        try:
            return await self._serve(http)
        finally:
            self._in_flight[client] -= 1
            if not self._in_flight[client]:
                del self._in_flight[client]

    async def _serve(self, http: HttpRequest) -> Response:
        arrived = time.monotonic_ns()
        try:
            body = await asyncio.wait_for(read_body(http, self.cfg.max_body_bytes), self.cfg.body_timeout_s)
            request = decode_request(body, self.cfg.max_image_pixels)
        except asyncio.TimeoutError:
            self.counters["body_timeout"] += 1
            return _error(408, str(BodyTimeout(self.cfg.body_timeout_s)))
        except BodyTooLarge as exc:
            self.counters["too_large"] += 1
            return _error(413, str(exc))
        except BadRequest as exc:
            self.counters["malformed"] += 1
            return _error(400, f"malformed request: {exc}")
        request.arrived_ns = arrived
        self.counters["requests"] += 1
        result = await self._batched(request)
        if isinstance(result, Failure):
            return _error(result.status, result.message, result.robot_id)
        return Response(encode_reply(result), media_type=BINARY)


def build_app(config: ServeConfig, num_replicas: int = 0, num_cpus: float = 1.0, token: str = ""):
    """The application: ``num_replicas`` (0: one per visible GPU, else 1) replicas, each on one GPU when CUDA
    is there (``num_gpus=1``), else on ``num_cpus`` CPUs; with ``token``, every HTTP request must carry it."""
    gpus = torch.cuda.device_count() if config.resolved_device == "cuda" else 0
    actor = {"num_gpus": 1} if gpus else {"num_cpus": num_cpus}
    replicas = num_replicas or max(gpus, 1)
    return PolicyDeployment.options(num_replicas=replicas, ray_actor_options=actor).bind(
        dataclasses.asdict(config), token_digest(token))


# Ray passes a call's arguments inline in the call up to this size, larger ones through its object store (a put by
# the caller, a fetch by the replica): with Ray's default of 100 KiB, three 224x224 frames (450 KB) took the object
# store's way and cost ~2.4 ms more per call on a 2-core machine. Requests stay far below this (the frames a model
# takes); an operator's RAY_max_direct_call_object_size is kept, and a cluster joined by address keeps its own.
DIRECT_CALL_BYTES = 8 * 2**20
DIRECT_CALL_ENV = "RAY_max_direct_call_object_size"

# Serve's controller kills an HTTP proxy that has not answered its ready check within Ray's 5 s (longer after each
# restart) and ``serve.start`` then fails at once. On a busy CPU machine (a model warming up beside it) a proxy took
# longer than that to import and bind. The environment variable is Ray's own; an operator's value is kept.
PROXY_READY_ENV = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"
PROXY_READY_S = 30.0


def init_local_ray(**ray_init) -> None:
    """``ray.init`` of a local instance (no dashboard unless asked) whose Serve proxies get ``PROXY_READY_S`` to
    start (the instance's processes take this process's environment when it starts) and whose calls carry
    requests inline (``DIRECT_CALL_BYTES``)."""
    import ray
    os.environ.setdefault(PROXY_READY_ENV, str(PROXY_READY_S))
    os.environ.setdefault(DIRECT_CALL_ENV, str(DIRECT_CALL_BYTES))
    ray_init.setdefault("include_dashboard", False)
    ray.init(**ray_init)


def run_local(config: ServeConfig, port: int = 8000, host: str = "127.0.0.1", num_replicas: int = 0,
              num_cpus: float = 1.0, name: str = APP_NAME, route_prefix: str = "/", token: str = "",
              ray_init: Optional[dict] = None) -> str:
    """Start (or join) Ray, start Serve's HTTP proxy on host:port and run the application under ``route_prefix``
    (several models on one proxy: one name and route each); returns the endpoint. ``token``: every HTTP request
    must carry it; required when ``host`` is not loopback (refused before anything starts), as is Ray's own token
    authentication (RAY_AUTH_MODE=token, Ray's default for a local instance). ``ray_init``: ray.init's arguments
    when no Ray instance is up in this process yet; a local instance started here runs no dashboard unless asked."""
    import ray
    ray_init = dict(ray_init or {})
    if not is_loopback(host) and not token:
        raise ValueError(f"serving on {host} (beyond loopback) needs a token: --token-file FILE or {TOKEN_ENV}")
    if not ray.is_initialized():
        if ray_init.get("address"):
            ray.init(**ray_init)
        else:
            init_local_ray(**ray_init)
    # Ray binds its own ports on every interface (it resolves a loopback node IP to a routable one), and whoever
    # reaches them runs code on the cluster: Ray's token authentication (on by default for local instances since
    # Ray 2.59; RAY_AUTH_MODE=token) is what keeps them closed.
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token" and not is_loopback(host):
        raise ValueError(f"serving on {host}, but Ray's token authentication is off (RAY_AUTH_MODE="
                         f"{os.environ.get('RAY_AUTH_MODE', 'unset')}): anyone who reaches its ports can run code on "
                         "the cluster; start Ray with RAY_AUTH_MODE=token")
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(config, num_replicas, num_cpus, token), name=name, route_prefix=route_prefix)
    return f"http://{host}:{port}{route_prefix.rstrip('/')}"
