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
import os
import socket
import time
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


MAX_REPLY_BYTES = 16 * 2**20   # a reply is one chunk and a JSON header: far less
TOKEN_ENV = "PHYAI_SERVE_TOKEN"   # the server's token (or --token-file), and the node's when policy.token is empty


class _DeadlineSocket(socket.socket):
    """A socket whose every send and receive is bounded by one deadline (time.monotonic) for the whole call, so a
    server that answers one byte at a time cannot stretch a call past it (a socket timeout bounds each read only)."""

    deadline = float("inf")

    def _remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("the call's deadline passed")
        self.settimeout(min(left, 1e6))
        return left

    def recv_into(self, *args, **kwargs):
        self._remaining()
        return super().recv_into(*args, **kwargs)

    def recv(self, *args, **kwargs):
        self._remaining()
        return super().recv(*args, **kwargs)

    def sendall(self, *args, **kwargs):
        self._remaining()
        return super().sendall(*args, **kwargs)


class _DeadlineConnection(http.client.HTTPConnection):
    """HTTPConnection on a _DeadlineSocket; ``deadline`` applies to the connect and to everything after it."""

    deadline = float("inf")

    def connect(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("the call's deadline passed")
        plain = socket.create_connection((self.host, self.port), left)
        self.sock = _DeadlineSocket(plain.family, plain.type, plain.proto, fileno=plain.detach())
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.deadline = self.deadline

    def start(self, timeout: float) -> None:
        """Bound the next request and its response by ``timeout`` seconds from now, in all."""
        self.deadline = time.monotonic() + timeout
        if self.sock is not None:
            self.sock.deadline = self.deadline


class HttpPolicyClient:
    """One keep-alive connection to the serve endpoint; every call bounded by ``timeout`` seconds in all (connect,
    send, the reply's headers and body). ``token``: sent as ``Authorization: Bearer``; empty: PHYAI_SERVE_TOKEN
    from the environment, else none."""

    def __init__(self, endpoint: str, timeout: float = 1.0, token: str = ""):
        url = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"policy.endpoint {endpoint!r}: expected http://HOST:PORT[/route]")
        self.endpoint, self.timeout = endpoint, float(timeout)
        self.host, self.port, self.route = url.hostname, url.port or 80, url.path.rstrip("/")
        token = token or os.environ.get(TOKEN_ENV, "").strip()
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._conn: Optional[_DeadlineConnection] = None

    def __repr__(self) -> str:   # never the token
        return f"HttpPolicyClient({self.endpoint!r}, timeout={self.timeout})"

    def _call(self, method: str, path: str, body: Optional[bytes] = None) -> tuple[int, bytes]:
        if self._conn is None:
            self._conn = _DeadlineConnection(self.host, self.port)
        self._conn.start(self.timeout)
        try:
            headers = {**self._auth, **({"Content-Type": "application/octet-stream"} if body else {})}
            self._conn.request(method, self.route + path, body=body, headers=headers)
            resp = self._conn.getresponse()
            length = resp.getheader("content-length")
            if length is not None and length.isdigit() and int(length) > MAX_REPLY_BYTES:
                raise http.client.HTTPException(f"reply of {length} bytes is larger than {MAX_REPLY_BYTES}")
            data = resp.read(MAX_REPLY_BYTES + 1)
            if len(data) > MAX_REPLY_BYTES:
                raise http.client.HTTPException(f"reply larger than {MAX_REPLY_BYTES} bytes")
            if not resp.isclosed():   # not read to its end: the connection cannot carry the next call
                self.close()
            return resp.status, data
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
        try:
            info = json.loads(body)
        except ValueError as exc:
            raise ServeError(f"policy endpoint {self.endpoint}/info: not JSON ({exc})", status) from None
        _check_info(info, self.endpoint)
        return info

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
        except BadRequest as exc:   # a field of the wrong type or range included
            raise ServeError(f"policy endpoint {self.endpoint}: undecodable reply: {exc}", status) from None
        if reply.robot_id != request.robot_id:
            raise ServeError(f"policy endpoint {self.endpoint} answered robot '{reply.robot_id}' to a request of "
                             f"robot '{request.robot_id}': chunk refused", status)
        return reply


# /info fields the node's checks read: name -> what they must be
_INFO_FIELDS = {"model_type": str, "camera_names": list, "horizon": int, "state_dim": int, "action_dim": int,
                "rtc_modes": list, "masks_cameras": bool, "token_budget": int}


def _check_info(info, endpoint: str) -> None:
    """A served model's description the node can rely on: each field it reads of the right type."""
    if not isinstance(info, dict):
        raise ServeError(f"policy endpoint {endpoint}/info: not a JSON object")
    for name, kind in _INFO_FIELDS.items():
        value = info.get(name)
        if not isinstance(value, kind) or kind is int and isinstance(value, bool):
            raise ServeError(f"policy endpoint {endpoint}/info: field '{name}' must be {kind.__name__}, got "
                             f"{value!r}"[:300])
    if not all(isinstance(c, str) for c in info["camera_names"] + info["rtc_modes"]):
        raise ServeError(f"policy endpoint {endpoint}/info: camera_names and rtc_modes must be strings")
    size = info.get("image_size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int)):
        raise ServeError(f"policy endpoint {endpoint}/info: field 'image_size' must be int or null, got {size!r}")


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

    def release(self) -> None:
        """Nothing on this side but the connection: closed (the next call opens one)."""
        self.client.close()
