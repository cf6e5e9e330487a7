"""The served policy's batch path: many robots' requests -> one runner call per compatible group.

Every request first passes the node's intake checks (control.observation: the frame rule ``FrameLimits``,
state length and finiteness, task length), so a served robot's input is held to what an onboard node accepts.
How a family is served is its adapter's to say (``serving``, phyai_ros/models/contract.py): "batched" families
prepare each request alone (its own cameras, prompt, state; whatever a bad one raises, it fails alone: a 4xx
naming the robot for its own fault, a 5xx for the server's), then group the rows that can share one runner call and compute each group at once, every row keeping its own noise
(from its seed) and RTC state, so a batched row computes what the same request computes alone; "single" families
run their requests one by one through ``predict``. A deployment may run a subclass of the engine
(``ServeConfig.engine``, "module:Class"), e.g. the tests' fault drills.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from phyai_ros.control.observation import (MAX_IMAGE_PIXELS, MAX_INSTRUCTION_CHARS, FrameLimits, validate_instruction,
                                           validate_state)
from phyai_ros.control.rtc import check_action_magnitudes
from phyai_ros.layers.profiles import selector_for
from phyai_ros.models import family, family_for_checkpoint, import_target
from phyai_ros.models.contract import DTYPES, ModelFiles, parse_options
from phyai_ros.runtime.autotune import TuneSettings, prepare_profile

from .wire import Failure, Reply, Request

MAX_BODY_BYTES = 64 * 2**20   # a request body beyond this is refused (413) before it is read
BODY_TIMEOUT_S = 10.0         # a request body not received within this is refused (408): slow clients hold no slot
MAX_CLIENT_REQUESTS = 16      # HTTP requests in flight per client address and replica; more: 429


@dataclass
class ServeConfig:
    """What one replica loads and how it batches."""

    checkpoint: str
    tokenizer: str = ""
    norm_stats: str = ""
    model_type: str = ""           # empty: the checkpoint's
    model_id: str = ""             # empty: the model type
    device: str = "auto"           # auto: cuda when there is one
    dtype: str = "float32"
    cuda_graphs: bool = True
    token_bucket: int = 0
    op_autotune: str = "auto"      # the node's model.op_autotune: no profile for this GPU -> tune, cache per device
    op_autotune_budget: float = 30.0
    quant_plan: str = "measured"   # the node's model.quant_plan
    max_batch_size: int = 32
    batch_wait_s: float = 0.0      # how long a batch's first request waits for more (0: batches form while busy)
    options: str = ""              # the family's run settings, as model.options ("key=value;...")
    engine: str = ""               # "module:Class" of a BatchEngine subclass to run; empty: BatchEngine
    max_body_bytes: int = MAX_BODY_BYTES           # HTTP request bodies beyond this: 413, not read
    max_image_pixels: int = MAX_IMAGE_PIXELS       # larger frames: 400, refused from the wire header
    max_task_chars: int = MAX_INSTRUCTION_CHARS    # longer tasks: 400
    body_timeout_s: float = BODY_TIMEOUT_S         # the whole body within this, or 408
    max_client_requests: int = MAX_CLIENT_REQUESTS # in flight from one client address (per replica), or 429

    @property
    def resolved_device(self) -> str:
        return ("cuda" if torch.cuda.is_available() else "cpu") if self.device == "auto" else self.device


def load_adapter(cfg: ServeConfig):
    """The same adapter the node builds (registry -> load -> runner), with all the checkpoint's cameras."""
    cls = family(cfg.model_type) if cfg.model_type else family_for_checkpoint(cfg.checkpoint)
    adapter = cls.load(Path(cfg.checkpoint), ModelFiles.of(cfg.tokenizer, cfg.norm_stats), camera_names=None,
                       device=cfg.resolved_device, dtype=DTYPES[cfg.dtype], options=parse_options(cfg.options))
    if cfg.resolved_device == "cuda":
        adapter.use_runner(use_graphs=cfg.cuda_graphs, token_bucket=cfg.token_bucket)
    return adapter


def engine_for(cfg: ServeConfig) -> "BatchEngine":
    """The engine a replica runs: ``cfg.engine``'s class, else BatchEngine."""
    if not cfg.engine:
        return BatchEngine(cfg)
    cls = import_target(cfg.engine)
    if not (isinstance(cls, type) and issubclass(cls, BatchEngine)):
        raise TypeError(f"ServeConfig.engine {cfg.engine!r} is not a BatchEngine subclass")
    return cls(cfg)


class BatchEngine:
    """Requests in, one ``Reply`` or ``Failure`` per request out, in order."""

    def __init__(self, cfg: ServeConfig):
        self.cfg = cfg
        # The device's operator profile (cached or shipped, found by device name), as the node's policy has.
        self.selector, self.op_profile = selector_for(cfg.resolved_device)
        with self.selector.active():
            self.adapter = load_adapter(cfg)
            # Where no profile matched: tuned before the first batch captures graphs, as the node does.
            self.op_profile = prepare_profile(
                self.selector, self.op_profile, self.adapter, cfg.resolved_device, DTYPES[cfg.dtype],
                settings=TuneSettings(budget_s=cfg.op_autotune_budget, token_bucket=cfg.token_bucket),
                autotune=cfg.op_autotune, quant_plan=cfg.quant_plan)
        self.model_type = self.adapter.family
        self.model_id = cfg.model_id or self.model_type
        # The frame rule of the node's intake, with the model's square input (aspect) and this server's size limit.
        self.frame_limits = FrameLimits(max_pixels=cfg.max_image_pixels, input_size=self.adapter.image_size,
                                        max_pixels_name="the server's max_image_pixels")

    def info(self) -> dict:
        """What a client needs to check its robot against the model (the node's checks, remote)."""
        a = self.adapter
        return {"model_id": self.model_id, "model_type": self.model_type, "camera_names": list(a.camera_names),
                "horizon": a.chunk_size, "image_size": a.image_size, "state_dim": a.state_dim,
                "action_dim": a.action_dim, "rtc_modes": list(a.rtc_modes), "masks_cameras": a.masks_cameras,
                "token_budget": a.token_budget or 0, "serving": a.serving, "device": self.cfg.resolved_device,
                "dtype": self.cfg.dtype, "max_batch_size": self.cfg.max_batch_size}

    def run(self, requests: Sequence[Request]) -> list:
        with self.selector.active():
            return self._run(requests)

    def _run(self, requests: Sequence[Request]) -> list:
        start = time.monotonic_ns()
        out: list = [None] * len(requests)
        if self.adapter.serving == "batched":
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
    def check_intake(self, r: Request) -> np.ndarray:
        """The node's intake checks on one request (ObservationError, a ValueError, naming what is wrong);
        returns its state as the checked float32 copy."""
        for slot, image in r.images.items():
            self.frame_limits.check(image, camera=slot)
        validate_instruction(r.task, self.cfg.max_task_chars)
        if r.rtc is not None:   # the in-process path too (the wire checks it on decoding)
            check_action_magnitudes(r.rtc.prefix, "rtc.prefix")
        return validate_state(r.state, self.adapter.state_dim)

    def _prepare_all(self, requests: Sequence[Request], out: list) -> list:
        """(index, row, group key) of every request that prepares; the others get their Failure now, each alone
        whatever it raised."""
        rows = []
        for i, r in enumerate(requests):
            try:
                row = self.adapter.serve_prepare(r.images, self.check_intake(r), r.task, r.seed, r.rtc)
                rows.append((i, row, self.adapter.serve_group(row)))
            except ValueError as exc:   # BadRequest and the intake checks included: the request's fault
                out[i] = Failure(r.robot_id, 400, f"robot '{r.robot_id}': {exc}")
            except Exception as exc:  # noqa: BLE001 - the server's fault, but this request's alone
                out[i] = Failure(r.robot_id, 500, f"robot '{r.robot_id}': preparing the request failed: "
                                                  f"{type(exc).__name__}: {exc}")
        return rows

    def _groups(self, rows: list) -> list:
        groups: dict = {}
        for index, row, key in rows:
            groups.setdefault(key, []).append((index, row))
        return list(groups.values())

    def _run_group(self, requests: Sequence[Request], group: list, out: list) -> None:
        try:
            actions = list(self.adapter.serve_sample([row for _, row in group]))
            if len(actions) != len(group):
                raise RuntimeError(f"{len(actions)} chunks for a group of {len(group)} requests")
        except Exception as exc:  # noqa: BLE001 - this group failed on the server's side; the others run
            for index, _ in group:
                out[index] = Failure(requests[index].robot_id, 500, f"inference failed: {type(exc).__name__}: {exc}")
            return
        for (index, _), a in zip(group, actions):
            out[index] = self._reply(requests[index], a)

    def _run_one(self, r: Request):
        """Families served one by one: their own predict, request by request."""
        try:
            state = self.check_intake(r)
            noise = torch.Generator().manual_seed(int(r.seed))   # the family draws its noise from the seed
            actions = self.adapter.predict(r.images, state, r.task, noise=noise, rtc=r.rtc)
        except ValueError as exc:
            return Failure(r.robot_id, 400, f"robot '{r.robot_id}': {exc}")
        except Exception as exc:  # noqa: BLE001
            return Failure(r.robot_id, 500, f"inference failed: {type(exc).__name__}: {exc}")
        return self._reply(r, actions)

    def _reply(self, r: Request, actions):
        """The chunk's Reply, or a 500 Failure when it is not finite: a robot never gets NaN/inf to act on."""
        actions = np.asarray(actions, np.float32)
        bad = int(actions.size - np.isfinite(actions).sum())
        if bad:
            return Failure(r.robot_id, 500, f"robot '{r.robot_id}': inference produced {bad} non-finite values of "
                                            f"{actions.size}; no chunk is returned")
        return Reply(r.robot_id, actions, self.model_id)
