"""Clients of the served policy over HTTP, and the node's remote policy bridge (``policy.backend: remote``).

No Ray here: a robot needs only the stdlib HTTP client, numpy and safetensors. ``RemotePolicy`` is what
``build_policy`` returns for the remote backend: the same callable as ``ControlPolicy`` (snapshot + RTC request
-> [H, D] robot units), so the loop's RTC bookkeeping, timer, deadline policy and margin are unchanged; its
chunks carry the server's timings (``server_timing``), which the loop's latency record splits into inference
and queue (the server's batch queue plus the call's wire time).
"""
from __future__ import annotations

import http.client
import json
import socket
from types import SimpleNamespace
from typing import Optional
from urllib.parse import urlsplit

import numpy as np

from phyai_ros.control import ObservationSnapshot, RtcRequest
from phyai_ros.control.margin import ServerTiming

from .wire import BadRequest, Reply, Request, decode_reply, encode_request


class ServeError(RuntimeError):
    """A request that got no chunk: the server refused it (status 4xx), failed (5xx), did not answer in time
    (status 0), or answered for another robot."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


class HttpPolicyClient:
    """One keep-alive connection to the serve endpoint; every call bounded by ``timeout`` seconds."""

    def __init__(self, endpoint: str, timeout: float = 1.0):
        url = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"policy.endpoint {endpoint!r}: expected http://HOST:PORT[/route]")
        self.endpoint, self.timeout = endpoint, float(timeout)
        self.host, self.port, self.route = url.hostname, url.port or 80, url.path.rstrip("/")
        self._conn: Optional[http.client.HTTPConnection] = None

    def _call(self, method: str, path: str, body: Optional[bytes] = None) -> tuple[int, bytes]:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            self._conn.request(method, self.route + path, body=body,
                               headers={"Content-Type": "application/octet-stream"} if body else {})
            resp = self._conn.getresponse()
            return resp.status, resp.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()   # a timed-out connection may still deliver the old reply: never reuse it
            kind = "did not answer within" if isinstance(exc, socket.timeout) else "failed within"
            raise ServeError(f"policy endpoint {self.endpoint} {kind} {self.timeout:.3f} s: "
                             f"{type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def info(self) -> dict:
        status, body = self._call("GET", "/info")
        if status != 200:
            raise ServeError(f"policy endpoint {self.endpoint}/info answered {status}: {body[:200]!r}", status)
        return json.loads(body)

    def infer(self, request: Request) -> Reply:
        """The chunk for ``request``'s robot, or ServeError (never another robot's chunk)."""
        status, body = self._call("POST", "/", encode_request(request))
        if status != 200:
            try:
                message = json.loads(body).get("error", "")
            except ValueError:
                message = body[:200].decode(errors="replace")
            raise ServeError(f"policy endpoint {self.endpoint} answered {status}: {message}", status)
        try:
            reply = decode_reply(body)
        except BadRequest as exc:
            raise ServeError(f"policy endpoint {self.endpoint}: undecodable reply: {exc}", status) from None
        if reply.robot_id != request.robot_id:
            raise ServeError(f"policy endpoint {self.endpoint} answered robot '{reply.robot_id}' to a request of "
                             f"robot '{request.robot_id}': chunk refused", status)
        return reply


class RemoteChunk(np.ndarray):
    """A chunk (float32 [H, D]) with the server's timings of the call that produced it."""

    server_timing: Optional[ServerTiming] = None


def _remote_model(info: dict) -> SimpleNamespace:
    """The served model's description in the attribute names the node's checks read off an adapter."""
    def fit_task(task, state=None):   # the server cuts a too-long task itself; not reported here
        return task, False
    return SimpleNamespace(camera_names=info["camera_names"], chunk_size=info["horizon"],
                           image_size=info["image_size"], state_dim=info["state_dim"],
                           action_dim=info["action_dim"], rtc_modes=tuple(info["rtc_modes"]),
                           masks_cameras=info["masks_cameras"], fit_task=fit_task,
                           token_budget=info["token_budget"] or None)


class RemotePolicy:
    """policy(snapshot, rtc) -> [H, D] robot units, computed by the serve endpoint (robot id: the node's)."""

    def __init__(self, client: HttpPolicyClient, robot_id: str, noise_seed: int = 0):
        self.client, self.robot_id = client, robot_id
        self.info = client.info()
        self.adapter = _remote_model(self.info)
        self.model_type = self.info["model_type"]
        self._seed, self._calls = int(noise_seed), 0

    @property
    def camera_slots(self) -> list[str]:
        return list(self.adapter.camera_names)

    @property
    def horizon(self) -> int:
        return self.adapter.chunk_size

    @property
    def image_input_size(self) -> int:
        return self.adapter.image_size

    def __call__(self, snapshot: ObservationSnapshot, rtc: Optional[RtcRequest] = None) -> RemoteChunk:
        images = {slot: img for slot, img in snapshot.images.items()
                  if img is not None and snapshot.image_mask.get(slot, False)}
        self._calls += 1   # a fresh, reproducible noise seed per request
        request = Request(self.robot_id, images, np.asarray(snapshot.state, np.float32), snapshot.instruction,
                          (self._seed + self._calls) % 2**31, rtc)
        reply = self.client.infer(request)
        chunk = np.asarray(reply.actions, np.float32).view(RemoteChunk)
        chunk.server_timing = ServerTiming(int(reply.queue_s * 1e9), int(reply.inference_s * 1e9))
        return chunk

    def warmup(self, runs: int, state_dim: int, source: str = "the policy") -> None:
        """Calls the endpoint like the onboard warm-up (a dead or wrong endpoint stops the start)."""
        rng = np.random.default_rng(0)
        images = {s: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for s in self.camera_slots}
        for _ in range(runs):
            chunk = self.client.infer(Request(self.robot_id, images, np.zeros(state_dim, np.float32), "warm up"))
            if not np.isfinite(chunk.actions).all():
                raise ValueError(f"{source} produces non-finite actions on a synthetic observation")
