"""The control loop's policy callable, built from node parameters.

``ControlPolicy`` is the bridge between the ROS-free control loop (snapshots, RTC requests in robot units)
and a model adapter, which samples through its runner (static buffers; CUDA graphs on a GPU). It holds no ROS,
no control logic and no model math: snapshot + request -> adapter.predict -> one [H, D] chunk in robot units,
with the policy's own operator selector active around the call.

``build_policy`` goes one way: parameters -> checkpoint reader (model type, statistics) -> adapter (from the
registry, phyai_ros.models) -> its runner -> the bridge.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from phyai_ros.control import ObservationSnapshot, RtcRequest
from phyai_ros.layers.selector import SELECTOR, OperatorSelector
from phyai_ros.models import adapter_class, check_rtc_mode, checkpoint_type

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ControlPolicy:
    """policy(snapshot, rtc) -> float32 [H, D] in robot units, for ``ControlLoop``."""

    def __init__(self, adapter, selector: Optional[OperatorSelector] = None, noise_seed: int = 0,
                 model_type: str = ""):
        self.adapter = adapter
        self.selector = selector if selector is not None else SELECTOR.derive()
        self.model_type = model_type
        self.generator = torch.Generator().manual_seed(int(noise_seed))

    @property
    def camera_slots(self) -> list[str]:
        return list(self.adapter.camera_names)

    @property
    def horizon(self) -> int:
        """Actions per chunk (H), the checkpoint's."""
        return self.adapter.chunk_size

    @property
    def image_input_size(self) -> int:
        return self.adapter.image_size

    def __call__(self, snapshot: ObservationSnapshot, rtc: Optional[RtcRequest] = None) -> np.ndarray:
        images = {slot: snapshot.images.get(slot) if snapshot.image_mask.get(slot, False) else None
                  for slot in self.camera_slots}
        return self.predict(images, snapshot.state, snapshot.instruction, rtc)

    def predict(self, images: dict, state: np.ndarray, task: str, rtc: Optional[RtcRequest] = None) -> np.ndarray:
        """One observation (camera -> uint8 HxWx3 or None) -> [H, D] robot units, noise from this policy's seed."""
        with self.selector.active():
            noise = self.adapter.make_noise(1, generator=self.generator)
            return self.adapter.predict(images, state, task, noise=noise, rtc=rtc)

    def warmup(self, runs: int, state_dim: int, source: str = "the policy") -> None:
        """Run the whole path on a synthetic observation (cold start, graph capture) before acting, and
        refuse a policy whose chunks are not finite: the loop would drop every one of them after 'ready'."""
        rng = np.random.default_rng(0)
        images = {slot: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for slot in self.camera_slots}
        state = np.zeros(state_dim, dtype=np.float32)
        with self.selector.active():
            self.adapter.capture_buckets(images, state)
        for _ in range(runs):
            chunk = self.predict(images, state, "warm up")
            bad = int(np.size(chunk) - np.isfinite(chunk).sum())
            if bad:
                raise ValueError(f"{source} produces non-finite actions: the warm-up chunk on a synthetic "
                                 f"observation holds {bad} NaN/Inf of {chunk.size} values")


def norm_stats_path(param: str, checkpoint: Path) -> Optional[Path]:
    """``model.norm_stats``, or when empty the checkpoint folder's own statistics: a LeRobot normalizer
    file (the loader finds it from the folder: None) or else a ``norm_stats.json`` in the folder."""
    if param:
        if not Path(param).is_file():
            raise FileNotFoundError(f"model.norm_stats: no statistics file at '{param}'")
        return Path(param)
    if any(checkpoint.glob("policy_preprocessor_step_*_normalizer_processor.safetensors")):
        return None
    if (checkpoint / "norm_stats.json").is_file():
        return checkpoint / "norm_stats.json"
    raise FileNotFoundError(f"model.norm_stats is empty and the checkpoint folder '{checkpoint}' holds no "
                            "statistics (a LeRobot normalizer .safetensors or norm_stats.json)")


def _checkpoint_folder(p: dict) -> Path:
    if not p["model.checkpoint"] or not Path(p["model.checkpoint"]).is_dir():
        raise FileNotFoundError(f"model.checkpoint: no checkpoint folder at '{p['model.checkpoint']}'")
    return Path(p["model.checkpoint"])


def _model_files(p: dict, checkpoint: Path, needs: Sequence[str]) -> tuple[Optional[str], Optional[Path]]:
    """The other files the parameters name, each checked: (tokenizer, statistics), None where the model does
    not read one (``needs``: its adapter's ``needs_files``); naming such a file is an error, not ignored."""
    for name in ("tokenizer", "norm_stats"):
        if name not in needs and p[f"model.{name}"]:
            raise ValueError(f"model.{name} is '{p[f'model.{name}']}', but this model type reads it from its "
                             "checkpoint folders: leave it empty")
    if "tokenizer" in needs and (not p["model.tokenizer"] or not Path(p["model.tokenizer"]).is_file()):
        raise FileNotFoundError(f"model.tokenizer: no tokenizer file at '{p['model.tokenizer']}'")
    if p["model.device"] == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("model.device is 'cuda' but no CUDA device is available (use a CPU config)")
    stats = norm_stats_path(p["model.norm_stats"], checkpoint) if "norm_stats" in needs else None
    return (p["model.tokenizer"] if "tokenizer" in needs else None), stats


def _select_embodiment(p: dict, adapter, model_type: str) -> None:
    """``model.embodiment`` (empty: the checkpoint's) for a model that has embodiments; refused for others."""
    if not p["model.embodiment"]:
        return
    if not hasattr(adapter, "select_embodiment"):
        raise ValueError(f"model.embodiment is {p['model.embodiment']!r}, but model type {model_type} has no "
                         "embodiments: leave it empty")
    try:
        adapter.select_embodiment(p["model.embodiment"])
    except ValueError as exc:
        raise ValueError(f"model.embodiment: {exc}") from None


def _check_against_parameters(p: dict, adapter) -> None:
    """The robot's names and the chunk size must be the model's (control.horizon 0: the checkpoint's)."""
    names = p["control.action_names"]
    if len(names) != adapter.action_dim:
        raise ValueError(f"control.action_names has {len(names)} names; the policy acts in {adapter.action_dim} dims")
    if len(p["state.joint_names"]) != adapter.state_dim:
        raise ValueError(f"state.joint_names has {len(p['state.joint_names'])} names; the policy's state has "
                         f"{adapter.state_dim} dims")
    if p["control.horizon"] and p["control.horizon"] != adapter.chunk_size:
        raise ValueError(f"control.horizon {p['control.horizon']} != the model's chunk size {adapter.chunk_size} "
                         "(0 takes the checkpoint's)")
    if p["rtc.overlap"] >= adapter.chunk_size:
        raise ValueError(f"rtc.overlap ({p['rtc.overlap']}) must be below the chunk size H = {adapter.chunk_size}")
    if p["rtc.mode"] not in adapter.rtc_modes:   # an instance may narrow its class's modes
        raise ValueError(f"rtc.mode {p['rtc.mode']!r} is not supported by the checkpoint '{p['model.checkpoint']}' "
                         f"(it supports {', '.join(adapter.rtc_modes)})")
    if not adapter.masks_cameras and not all(p["cameras.required"]):
        raise ValueError(f"cameras.required {list(p['cameras.required'])}: this model has no masked camera slots, "
                         "so every slot must be required")


def build_remote_policy(p: dict, robot_id: str):
    """``policy.backend: remote``: the serve endpoint's model, checked against the parameters like a local one."""
    from phyai_ros.serve.client import HttpPolicyClient, RemotePolicy
    policy = RemotePolicy(HttpPolicyClient(p["policy.endpoint"], p["policy.timeout"]), robot_id, p["model.noise_seed"])
    if p["model.type"] and p["model.type"] != policy.model_type:
        raise ValueError(f"model.type {p['model.type']!r}, but {p['policy.endpoint']} serves {policy.model_type!r}")
    check_rtc_mode(policy.model_type, p["rtc.mode"])
    _check_against_parameters(p, policy.adapter)
    if p["model.warmup_runs"]:
        policy.warmup(p["model.warmup_runs"], policy.adapter.state_dim, f"the endpoint {p['policy.endpoint']}")
    return policy


def build_policy(p: dict, robot_id: str = "") -> ControlPolicy:
    """Parameters -> checkpoint reader -> adapter -> runner -> bridge (warmed up when model.warmup_runs > 0).
    ``model.type`` empty: the checkpoint's config.json type; given: the loader checks it against the
    checkpoint. ``policy.backend: remote``: the bridge to a serve endpoint instead (robot_id: the node's name)."""
    if p.get("policy.backend", "onboard") == "remote":
        return build_remote_policy(p, robot_id)
    checkpoint = _checkpoint_folder(p)
    model_type = p["model.type"] or checkpoint_type(checkpoint)
    check_rtc_mode(model_type, p["rtc.mode"])
    cls = adapter_class(model_type)
    tokenizer, stats = _model_files(p, checkpoint, cls.needs_files)
    selector = SELECTOR.derive(p["model.op_profile"] or None)
    adapter = cls.from_files(checkpoint, tokenizer, stats, camera_names=list(p["cameras.slots"]),
                             device=p["model.device"], dtype=DTYPES[p["model.dtype"]])
    _select_embodiment(p, adapter, model_type)
    _check_against_parameters(p, adapter)
    adapter.rtc_max_guidance, adapter.rtc_jacobian = p["rtc.max_guidance"], p["rtc.jacobian"]
    if p["model.device"] == "cuda":
        with selector.active():
            adapter.use_runner(use_graphs=p["model.cuda_graphs"], token_bucket=p["model.token_bucket"])
    policy = ControlPolicy(adapter, selector, p["model.noise_seed"], model_type)
    if p["model.warmup_runs"]:
        policy.warmup(p["model.warmup_runs"], adapter.state_dim,
                      f"the checkpoint '{checkpoint}' (normalization stats '{stats or checkpoint}')")
    return policy


def resolved_parameters(p: dict, policy: ControlPolicy) -> dict:
    """The parameters with what came from the checkpoint filled in: model.type and control.horizon."""
    return {**p, "model.type": policy.model_type, "control.horizon": policy.horizon}
