"""The rollout API for RL: batches of observations in, chunks out, in-process through a DeploymentHandle.

An RL actor (any Ray actor or driver in the cluster) holds a ``RolloutClient`` on the deployment's handle and
submits B observations at once; they join the replicas' batch queues like HTTP requests (same
``wire.Request``, same batch path) without HTTP or serialization beyond Ray's. Each call reports, for its
batch, ``Q(B) = B / T_sync(B)`` (chunks per second) and ``T_amort(B) = T_sync(B) / B``, where ``T_sync(B)``
is the wall time from submitting the B requests to holding all B chunks (design.md's definitions).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from .wire import Failure, Reply, Request

DEPLOYMENT = "PolicyDeployment"


@dataclass
class RolloutResult:
    """One synchronous batch: a Reply or a Failure per request (in order) and its throughput figures."""

    results: list
    t_sync_s: float

    @property
    def batch(self) -> int:
        return len(self.results)

    @property
    def q(self) -> float:
        """Q(B) = B / T_sync(B), chunks per second."""
        return self.batch / self.t_sync_s if self.t_sync_s > 0 else float("inf")

    @property
    def t_amort_s(self) -> float:
        """T_amort(B) = T_sync(B) / B."""
        return self.t_sync_s / self.batch if self.batch else float("nan")

    @property
    def failures(self) -> list:
        return [r for r in self.results if isinstance(r, Failure)]


class RolloutClient:
    """Submits batches of ``wire.Request`` to the served policy through its DeploymentHandle."""

    def __init__(self, handle=None, app_name: str = "phyai_policy", timeout_s: float = 60.0):
        if handle is None:
            from ray import serve
            handle = serve.get_deployment_handle(DEPLOYMENT, app_name=app_name)
        self.handle, self.timeout_s = handle, timeout_s

    def submit(self, requests: Sequence[Request]) -> RolloutResult:
        """All requests in one call (so a replica runs them as one batch, up to its batch size), then every
        result: a chunk for its own robot, or a Failure saying why (an error of the call fails each request of
        it, naming the robot: none is dropped)."""
        requests = list(requests)
        start = time.perf_counter()
        try:
            out = self.handle.infer_many.remote(requests).result(timeout_s=self.timeout_s)
            if not isinstance(out, list) or len(out) != len(requests):
                raise RuntimeError(f"{len(requests)} requests got {len(out) if isinstance(out, list) else out!r}"[:200])
        except Exception as exc:  # noqa: BLE001 - a dead replica or a timeout is each request's failure
            out = [Failure(r.robot_id, 503, f"robot '{r.robot_id}': {type(exc).__name__}: {exc}") for r in requests]
        return RolloutResult([self._checked(r, o) for r, o in zip(requests, out)], time.perf_counter() - start)

    @staticmethod
    def _checked(request: Request, out):
        if isinstance(out, Reply) and out.robot_id != request.robot_id:
            return Failure(request.robot_id, 500, f"answered robot '{out.robot_id}' to robot '{request.robot_id}'")
        if not isinstance(out, (Reply, Failure)):
            return Failure(request.robot_id, 500, f"robot '{request.robot_id}': got {type(out).__name__}")
        return out
