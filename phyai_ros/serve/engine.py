"""The served policy's batch path: many robots' requests -> one runner call per compatible group.

Each request is prepared alone (its own cameras, prompt, state; a bad one fails alone, as a 4xx naming the
robot), then the rows are stacked into one batch for the adapter's runner: every row keeps its own noise
(from its seed) and its own RTC state, since the runner's guided-RTC weights are per row (a zero row is RTC
off). So a batched row computes what the same request computes alone. RTC forms the captured loop does not
hold (training-time RTC, the VJP form) share a batch only with requests of the same frozen-prefix weights.
With CUDA graphs the batch is padded to the next of ``BATCH_BUCKETS`` (a bounded set of captured graphs).
An adapter without the batch API (GR00T N1.7's) runs its requests one by one.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from phyai_ros.layers.profiles import selector_for
from phyai_ros.models import adapter_class, checkpoint_type
from phyai_ros.modeling.solver import RtcTensors
from phyai_ros.policies import DTYPES, norm_stats_path

from .wire import BadRequest, Failure, Reply, Request

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)


@dataclass
class ServeConfig:
    """What one replica loads and how it batches. ``slow_s`` / ``slow_task`` / ``exit_on_task`` are fault drills
    (tests, chaos runs): a batch sleeps ``slow_s`` (only one holding a request of task ``slow_task`` when that is
    set); a batch holding a request of task ``exit_on_task`` kills the replica."""

    checkpoint: str
    tokenizer: str = ""
    norm_stats: str = ""
    model_type: str = ""           # empty: the checkpoint's
    model_id: str = ""             # empty: the model type
    device: str = "auto"           # auto: cuda when there is one
    dtype: str = "float32"
    cuda_graphs: bool = True
    token_bucket: int = 0
    max_batch_size: int = 32
    batch_wait_s: float = 0.005    # serve.batch's bounded wait for more requests
    slow_s: float = 0.0
    slow_task: str = ""
    exit_on_task: str = ""

    @property
    def resolved_device(self) -> str:
        return ("cuda" if torch.cuda.is_available() else "cpu") if self.device == "auto" else self.device


def load_adapter(cfg: ServeConfig):
    """The same adapter the node builds (registry -> from_files -> runner), with all the checkpoint's cameras."""
    model_type = cfg.model_type or checkpoint_type(cfg.checkpoint)
    cls = adapter_class(model_type)
    stats = norm_stats_path(cfg.norm_stats, Path(cfg.checkpoint)) \
        if "norm_stats" in cls.needs_files else None
    adapter = cls.from_files(cfg.checkpoint, cfg.tokenizer or None, stats, camera_names=None,
                             device=cfg.resolved_device, dtype=DTYPES[cfg.dtype])
    if cfg.resolved_device == "cuda":
        adapter.use_runner(use_graphs=cfg.cuda_graphs, token_bucket=cfg.token_bucket)
    return model_type, adapter


@dataclass
class _Row:
    index: int
    inputs: object
    noise: torch.Tensor
    guide: Optional[RtcTensors]


def _bucket(n: int) -> int:
    return next((b for b in BATCH_BUCKETS if b >= n), n)


class BatchEngine:
    """Requests in, one ``Reply`` or ``Failure`` per request out, in order."""

    def __init__(self, cfg: ServeConfig):
        self.cfg = cfg
        # The device's operator profile (cached or shipped, found by device name), as the node's policy has.
        self.selector, self.op_profile = selector_for(cfg.resolved_device)
        with self.selector.active():
            self.model_type, self.adapter = load_adapter(cfg)
        self.model_id = cfg.model_id or self.model_type
        self.batched = hasattr(self.adapter, "prepare") and hasattr(self.adapter, "sample_actions")

    def info(self) -> dict:
        """What a client needs to check its robot against the model (the node's checks, remote)."""
        a = self.adapter
        config = getattr(a, "config", None)
        return {"model_id": self.model_id, "model_type": self.model_type, "camera_names": list(a.camera_names),
                "horizon": a.chunk_size, "image_size": a.image_size, "state_dim": a.state_dim,
                "action_dim": a.action_dim, "rtc_modes": list(a.rtc_modes), "masks_cameras": a.masks_cameras,
                "token_budget": getattr(config, "token_budget", 0), "device": self.cfg.resolved_device,
                "dtype": self.cfg.dtype, "max_batch_size": self.cfg.max_batch_size}

    def run(self, requests: Sequence[Request]) -> list:
        with self.selector.active():
            return self._run(requests)

    def _run(self, requests: Sequence[Request]) -> list:
        start = time.monotonic_ns()
        self._drill(requests)
        out: list = [None] * len(requests)
        if self.batched:
            rows = self._prepare_all(requests, out)
            for group in self._groups(rows):
                self._run_group(requests, group, out)
        else:
            for i, r in enumerate(requests):
                out[i] = self._run_one(r)
        end = time.monotonic_ns()
        for i, r in enumerate(requests):
            if isinstance(out[i], Reply):
                out[i].queue_s = max(0, start - r.arrived_ns) / 1e9 if r.arrived_ns else 0.0
                out[i].inference_s = (end - start) / 1e9
                out[i].batch_size = len(requests)
        return out

    # ------------------------------------------------------------------ steps
    def _drill(self, requests: Sequence[Request]) -> None:
        if self.cfg.slow_s and (not self.cfg.slow_task or any(r.task == self.cfg.slow_task for r in requests)):
            time.sleep(self.cfg.slow_s)
        if self.cfg.exit_on_task and any(r.task == self.cfg.exit_on_task for r in requests):
            os._exit(17)   # the replica dies mid-batch (fault drill)

    def _prepare(self, index: int, r: Request) -> _Row:
        for name, img in r.images.items():
            if np.ndim(img) != 3:
                raise BadRequest(f"camera '{name}': expected one HxWx3 image, got shape {list(np.shape(img))}")
        if np.ndim(r.state) != 1:
            raise BadRequest(f"state must be a vector of length {self.adapter.state_dim}, got shape "
                             f"{list(np.shape(r.state))}")
        inputs = self.adapter.prepare(r.images, r.state, [r.task])
        noise = self.adapter.make_noise(1, generator=torch.Generator().manual_seed(int(r.seed)))
        guide = self.adapter.request_tensors(r.rtc) if r.rtc is not None else None
        return _Row(index, inputs, noise, guide)

    def _prepare_all(self, requests: Sequence[Request], out: list) -> list:
        rows = []
        for i, r in enumerate(requests):
            try:
                rows.append(self._prepare(i, r))
            except ValueError as exc:   # BadRequest included: the request's fault, named by its robot
                out[i] = Failure(r.robot_id, 400, f"robot '{r.robot_id}': {exc}")
        return rows

    @staticmethod
    def _groups(rows: list) -> list:
        """Rows that can share one runner call: per-row guided RTC (or none) together; other RTC forms by
        their weights."""
        groups: dict = {}
        for row in rows:
            g = row.guide
            key = "rows" if g is None or g.graphable else (g.mode, g.jacobian, g.weights.cpu().numpy().tobytes())
            groups.setdefault(key, []).append(row)
        return [groups[k] for k in groups]

    def _run_group(self, requests: Sequence[Request], group: list, out: list) -> None:
        try:
            actions = self._sample(group)
        except Exception as exc:  # noqa: BLE001 - the whole group failed on the server's side
            for row in group:
                out[row.index] = Failure(requests[row.index].robot_id, 500, f"inference failed: "
                                         f"{type(exc).__name__}: {exc}")
            return
        for row, a in zip(group, actions):
            out[row.index] = Reply(requests[row.index].robot_id, a, self.model_id)

    def _sample(self, group: list) -> np.ndarray:
        n = len(group)
        pad = _bucket(n) - n if self.adapter.runner.use_graphs else 0
        rows = group + [group[0]] * pad
        inputs = _cat_inputs([r.inputs for r in rows])
        noise = torch.cat([r.noise for r in rows])
        x = self.adapter.sample_actions(inputs, noise, self._guide(rows))
        return self.adapter.unnormalize_actions(x)[:n].detach().to("cpu", torch.float32).numpy()

    def _guide(self, rows: list) -> Optional[RtcTensors]:
        given = [r.guide for r in rows if r.guide is not None]
        if not given:
            return None
        first = given[0]
        y = torch.cat([r.guide.y if r.guide is not None else torch.zeros_like(first.y) for r in rows])
        if not first.graphable:   # one group shares its weights (see _groups)
            return RtcTensors(y, first.weights, first.guidance, first.jacobian, first.mode)
        w = torch.stack([r.guide.weights if r.guide is not None else torch.zeros_like(first.weights) for r in rows])
        return RtcTensors(y, w, first.guidance, first.jacobian, first.mode)

    def _run_one(self, r: Request):
        """Adapters without the batch API: their own predict, request by request."""
        try:
            noise = self.adapter.make_noise(1, generator=torch.Generator().manual_seed(int(r.seed)))
            actions = self.adapter.predict(r.images, r.state, r.task, noise=noise, rtc=r.rtc)
        except ValueError as exc:
            return Failure(r.robot_id, 400, f"robot '{r.robot_id}': {exc}")
        except Exception as exc:  # noqa: BLE001
            return Failure(r.robot_id, 500, f"inference failed: {type(exc).__name__}: {exc}")
        return Reply(r.robot_id, np.asarray(actions, np.float32), self.model_id)


def _cat_inputs(parts: list):
    """Stack one-row PolicyInputs (prompts are padded to the same token budget) into one batch."""
    first = parts[0]
    return type(first)(torch.cat([p.images for p in parts]), torch.cat([p.image_masks for p in parts]),
                       torch.cat([p.tokens for p in parts]), torch.cat([p.token_masks for p in parts]),
                       torch.cat([p.state_normalized for p in parts]), sum((p.prompts for p in parts), []),
                       first.slot_names, sum((p.truncated for p in parts), []))
