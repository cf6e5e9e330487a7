"""The control loop's policy callable, built from node parameters.

``ControlPolicy`` is the bridge between the ROS-free control loop (snapshots, RTC requests in robot units)
and a model adapter, which samples through its runner (static buffers; CUDA graphs on a GPU). It holds no ROS,
no control logic and no model math: snapshot + request -> adapter.predict -> one [H, D] chunk in robot units,
with the policy's own operator selector active around the call.

``build_policy`` goes one way: parameters (phyai_ros.parameters) -> the family (the registry, phyai_ros.models) ->
its adapter, loaded and checked against the robot -> its runner -> the bridge. With ``policy.backend: remote`` the
bridge is ``serve.client.RemotePolicy`` instead, checked against the robot the same way.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import numpy as np
import torch

from phyai_ros.control import ObservationSnapshot, RtcRequest
from phyai_ros.layers.profiles import ProfileChoice, selector_for
from phyai_ros.layers.selector import SELECTOR, OperatorSelector
from phyai_ros.models import family, family_for_checkpoint
from phyai_ros.models.contract import DTYPES, ModelFiles, parse_options
from phyai_ros.parameters import Parameters
from phyai_ros.runtime.autotune import (EXTENDED, TuneSettings, prepare_profile, profiled_keys, synthetic_observation,
                                       wanted)
from phyai_ros.serve.client import HttpPolicyClient, RemotePolicy

log = logging.getLogger(__name__)


class ControlPolicy:
    """policy(snapshot, rtc) -> float32 [H, D] in robot units, for ``ControlLoop``."""

    def __init__(self, adapter, selector: Optional[OperatorSelector] = None, noise_seed: int = 0,
                 op_profile: Optional[ProfileChoice] = None, min_cameras: int = 0,
                 robot_cameras: Optional[Sequence[str]] = None):
        self.adapter = adapter
        # The fewest cameras an observation that reaches inference can have (the required ones): the start-up
        # captures every camera count from it up to the robot's cameras, so a missing optional camera is
        # skipped, never captured, and a checkpoint camera the robot lacks is never computed.
        self.min_cameras = int(min_cameras)
        self.robot_cameras = list(robot_cameras) if robot_cameras else None
        self.selector = selector if selector is not None else SELECTOR.derive()
        self.op_profile = op_profile   # which profile file the selector uses for the policy's device (the log's)
        self.generator = torch.Generator().manual_seed(int(noise_seed))

    @property
    def model_type(self) -> str:
        """The family (``model.type``) of the checkpoint, its adapter's."""
        return self.adapter.family

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
            return self.adapter.predict(images, state, task, noise=self.generator, rtc=rtc)

    def warmup_observation(self, state_dim: int) -> tuple[dict, np.ndarray]:
        """The synthetic observation of the warm-up (and the autotune): random frames from every camera of the
        robot (every slot of the model where the robot's are not known), a zero state."""
        return synthetic_observation(self.camera_slots, state_dim, self.robot_cameras)

    def warmup(self, runs: int, state_dim: int, source: str = "the policy") -> None:
        """Run the whole path on a synthetic observation (cold start, graph capture) before acting, and
        refuse a policy whose chunks are not finite: the loop would drop every one of them after 'ready'."""
        images, state = self.warmup_observation(state_dim)
        with self.selector.active():
            self.adapter.capture_buckets(images, state, min_cameras=self.min_cameras or None)
        for _ in range(runs):
            chunk = self.predict(images, state, "warm up")
            bad = int(np.size(chunk) - np.isfinite(chunk).sum())
            if bad:
                raise ValueError(f"{source} produces non-finite actions: the warm-up chunk on a synthetic "
                                 f"observation holds {bad} NaN/Inf of {chunk.size} values")

    def release(self) -> None:
        """The runner's graphs and buffers dropped (the node's cleanup)."""
        self.adapter.release()


def _checkpoint_folder(p: Parameters) -> Path:
    if not p.model.checkpoint or not Path(p.model.checkpoint).is_dir():
        raise FileNotFoundError(f"model.checkpoint: no checkpoint folder at '{p.model.checkpoint}'")
    return Path(p.model.checkpoint)


def check_robot(p: Parameters, model, where: str) -> None:
    """The robot's names, chunk size, RTC mode and cameras against the model's (an adapter, or a served model's
    description): each fact checked once, here, whichever backend runs the model. control.horizon 0: the
    checkpoint's."""
    names = p.control.action_names
    if len(names) != model.action_dim:
        raise ValueError(f"control.action_names has {len(names)} names; the policy acts in {model.action_dim} dims")
    if model.state_dim and len(p.state.joint_names) != model.state_dim:   # 0: the model reads no robot state
        raise ValueError(f"state.joint_names has {len(p.state.joint_names)} names; the policy's state has "
                         f"{model.state_dim} dims")
    if p.control.horizon and p.control.horizon != model.chunk_size:
        raise ValueError(f"control.horizon {p.control.horizon} != the model's chunk size {model.chunk_size} "
                         "(0 takes the checkpoint's)")
    if p.rtc.mode not in model.rtc_modes:   # an instance may narrow its family's modes
        raise ValueError(f"rtc.mode {p.rtc.mode!r} is not supported by {where} (it supports "
                         f"{', '.join(model.rtc_modes)})")
    if not model.masks_cameras and not all(p.cameras.required):
        raise ValueError(f"cameras.required {list(p.cameras.required)}: this model has no masked camera slots, "
                         "so every slot must be required")


def build_remote_policy(p: Parameters, robot_id: str) -> RemotePolicy:
    """``policy.backend: remote``: the serve endpoint's model, checked against the parameters like a local one."""
    client = HttpPolicyClient(p.policy.endpoint, p.policy.timeout, p.policy.token)   # the token is never logged
    policy = RemotePolicy(client, robot_id, p.model.noise_seed)
    if p.model.type and p.model.type != policy.model_type:
        raise ValueError(f"model.type {p.model.type!r}, but {p.policy.endpoint} serves {policy.model_type!r}")
    check_robot(p, policy.adapter, f"the model {p.policy.endpoint} serves")
    if p.model.warmup_runs:
        policy.warmup(p.model.warmup_runs, policy.adapter.state_dim, f"the endpoint {p.policy.endpoint}")
    return policy


def load_adapter(p: Parameters):
    """Parameters -> the family (model.type, else the checkpoint's config.json type) -> its adapter, loaded for the
    robot's cameras, with the robot's embodiment and RTC settings, checked against the robot."""
    checkpoint = _checkpoint_folder(p)
    cls = family(p.model.type) if p.model.type else family_for_checkpoint(checkpoint)
    files = ModelFiles.of(p.model.tokenizer, p.model.norm_stats)
    try:
        cls.check_files(files)
    except ValueError as exc:
        raise ValueError(f"model.tokenizer / model.norm_stats: {exc}") from None
    if p.model.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("model.device is 'cuda' but no CUDA device is available (use a CPU config)")
    try:
        options = parse_options(p.model.options)
        cls.check_options(options)
    except ValueError as exc:
        raise ValueError(f"model.options: {exc}") from None
    adapter = cls.load(checkpoint, files, camera_names=list(p.cameras.slots), device=p.model.device,
                       dtype=DTYPES[p.model.dtype], options=options)
    if p.model.embodiment:
        if not cls.embodiments:
            raise ValueError(f"model.embodiment is {p.model.embodiment!r}, but model type {cls.family} has no "
                             "embodiments: leave it empty")
        try:
            adapter.select_embodiment(p.model.embodiment)
        except ValueError as exc:
            raise ValueError(f"model.embodiment: {exc}") from None
    check_robot(p, adapter, f"the checkpoint '{checkpoint}'")
    adapter.configure_rtc(p.rtc.max_guidance, p.rtc.jacobian)
    return adapter


def build_policy(p: Union[Parameters, Mapping], robot_id: str = ""):
    """Parameters (or dotted names: ``Parameters.of``) -> family -> adapter -> runner -> bridge (warmed up when
    model.warmup_runs > 0).
    ``policy.backend: remote``: the bridge to a serve endpoint instead (robot_id: the node's name).
    The policy's selector holds this device's operator profile (``layers.profiles``: model.op_profile, the cache,
    the shipped ones; ``policy.op_profile`` says which), tuned at start-up where none matched and
    ``model.op_autotune`` allows (runtime.autotune)."""
    p = p if isinstance(p, Parameters) else Parameters.of(p)
    if p.policy.backend == "remote":
        return build_remote_policy(p, robot_id)
    # The device's operator profile: model.op_profile, else the per-user cache, else a shipped one (layers.profiles).
    selector, choice = selector_for(p.model.device, p.model.op_profile or None)
    adapter = load_adapter(p)
    masks = adapter.masks_cameras
    policy = ControlPolicy(adapter, selector, p.model.noise_seed, op_profile=choice,
                           min_cameras=max(1, sum(map(bool, p.cameras.required))) if masks else 0,
                           robot_cameras=p.cameras.slots if masks else None)
    # Before any graph is captured with default choices: the start-up autotune where no profile matched, and a
    # quantized checkpoint's measured plan (runtime.autotune).
    policy.op_profile = _prepare_profile(policy, p)
    source = f"the checkpoint '{p.model.checkpoint}'"
    _start_runner(p, policy)
    if p.model.warmup_runs:
        # A cached or shipped profile may lack shapes this model calls (made for other models on this device):
        # the warm-up's calls say which; the missing ones are profiled into the cache and the graphs captured again.
        recheck = wanted(p.model.op_autotune, p.model.device, selector) and policy.op_profile.origin in EXTENDED
        seen = _warmup(policy, p.model.warmup_runs, source, record=recheck)
        if recheck and set(seen) - profiled_keys(policy.op_profile):
            policy.op_profile = _prepare_profile(policy, p, retune=True)
            _start_runner(p, policy)
            policy.warmup(p.model.warmup_runs, adapter.state_dim, source)
    return policy


def _prepare_profile(policy: ControlPolicy, p: Parameters, retune: bool = False) -> ProfileChoice:
    settings = TuneSettings(budget_s=p.model.op_autotune_budget, token_bucket=p.model.token_bucket,
                            min_cameras=policy.min_cameras or None)
    return prepare_profile(policy.selector, policy.op_profile, policy.adapter, p.model.device, DTYPES[p.model.dtype],
                           policy.warmup_observation(policy.adapter.state_dim), settings, p.model.op_autotune,
                           p.model.quant_plan, retune)


def _start_runner(p: Parameters, policy: ControlPolicy) -> None:
    """The runner the node samples through: graphs and prompt buckets on CUDA (the CPU keeps its eager one)."""
    if p.model.device == "cuda":
        with policy.selector.active():
            policy.adapter.use_runner(use_graphs=p.model.cuda_graphs, token_bucket=p.model.token_bucket)


def _warmup(policy: ControlPolicy, runs: int, source: str, record: bool) -> dict:
    """policy.warmup; record: the (op, shape) calls it made (their arguments), else {}."""
    if not record:
        policy.warmup(runs, policy.adapter.state_dim, source)
        return {}
    policy.selector.recording = {}
    try:
        policy.warmup(runs, policy.adapter.state_dim, source)
        return policy.selector.recording
    finally:
        policy.selector.recording = None


def resolved_parameters(p: Union[Parameters, Mapping], policy) -> Parameters:
    """The parameters with what came from the checkpoint filled in: model.type and control.horizon."""
    p = p if isinstance(p, Parameters) else Parameters.of(p)
    return p.replace(**{"model.type": policy.model_type, "control.horizon": policy.horizon})
