"""The control loop's policy callable, built from node parameters.

``ControlPolicy`` is the bridge between the ROS-free control loop (snapshots, RTC
requests in robot units) and a model adapter (preprocessing, normalization, the
solver's RTC tensors), optionally executed by the runtime's runner (static buffers,
CUDA graphs). It holds no ROS and no control logic: one observation in, one
unnormalized [H, D] chunk out.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch

from phyai_ros.control import ObservationSnapshot
from phyai_ros.control import RtcRequest as LoopRtcRequest
from phyai_ros.layers.selector import SELECTOR
from phyai_ros.models.common.policy import FlowPolicy, RtcParams
from phyai_ros.models.pi0 import Pi0Policy
from phyai_ros.models.pi05 import Pi05Policy
from phyai_ros.runtime.runner import FlowRunner

ADAPTERS = {"pi05": Pi05Policy, "pi0": Pi0Policy}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ControlPolicy:
    """policy(snapshot, rtc) -> float32 [H, D] in robot units, for ``ControlLoop``."""

    def __init__(self, adapter: FlowPolicy, runner: Optional[FlowRunner] = None, noise_seed: int = 0,
                 max_guidance: float = 10.0, jacobian: str = "identity"):
        self.adapter = adapter
        self.runner = runner
        self.max_guidance = float(max_guidance)
        self.jacobian = jacobian  # "vjp": the paper's form, one backward pass per step, run eagerly
        self.generator = torch.Generator().manual_seed(int(noise_seed))

    @property
    def camera_slots(self) -> list[str]:
        return list(self.adapter.camera_names)

    def _rtc(self, rtc: Optional[LoopRtcRequest]) -> Optional[RtcParams]:
        if rtc is None or rtc.mode == "off":
            return None

        prev = torch.from_numpy(np.array(rtc.prefix, dtype=np.float32)).to(self.adapter.device)  # writable copy
        # The loop's Y starts at the new chunk's action 0, so LeRobot's execution horizon
        # (where the soft mask reaches 0) is the length of Y: H - s in the paper's terms.
        return RtcParams(self.adapter.normalize_actions(prev), rtc.d, rtc.n, rtc.schedule, self.max_guidance,
                         self.jacobian, rtc.mode)

    def __call__(self, snapshot: ObservationSnapshot, rtc: Optional[LoopRtcRequest] = None) -> np.ndarray:
        images = {slot: snapshot.images.get(slot) if snapshot.image_mask.get(slot, False) else None
                  for slot in self.camera_slots}
        return self.predict(images, snapshot.state, snapshot.instruction, rtc)

    def predict(self, images: dict, state: np.ndarray, task: str, rtc: Optional[LoopRtcRequest] = None
                ) -> np.ndarray:
        a = self.adapter
        inputs = a.prepare(images, state, task)
        noise = a.make_noise(1, generator=self.generator)
        params = self._rtc(rtc)
        if self.runner is None or (params is not None and (params.jacobian != "identity"
                                                           or params.mode != "guided")):
            x = a.sample_actions(inputs, noise, params)
        else:
            guide = a.rtc_guide(params, 1) if params is not None else None
            bucket = self.runner.set_observation(inputs.images, inputs.image_masks, inputs.tokens,
                                                 inputs.token_masks, a.state_padded(inputs))
            x = self.runner.sample(bucket, noise, guide)
        return a.unnormalize_actions(x)[0].to("cpu", torch.float32).numpy()

    def warmup(self, runs: int, state_dim: int, source: str = "the policy") -> None:
        """Run the whole path on a synthetic observation (cold start, graph capture) before acting, and
        refuse a policy whose chunks are not finite: the loop would drop every one of them after 'ready'."""
        rng = np.random.default_rng(0)
        images = {slot: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for slot in self.camera_slots}
        if self.runner is not None and self.runner.token_bucket:
            x = self.adapter.prepare(images, np.zeros(state_dim, dtype=np.float32), "warm up")
            self.runner.capture_all_buckets(x.images, x.image_masks, x.tokens, x.token_masks,
                                            self.adapter.make_noise(1))
        for _ in range(runs):
            chunk = self.predict(images, np.zeros(state_dim, dtype=np.float32), "warm up")
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


def build_policy(p: dict) -> ControlPolicy:
    """Load the adapter named by ``model.type`` and wrap it (with a runner on CUDA)."""
    adapter_cls = ADAPTERS.get(p["model.type"])
    if adapter_cls is None:
        raise ValueError(f"model.type {p['model.type']!r} is not available (choices: {', '.join(ADAPTERS)})")
    checkpoint = Path(p["model.checkpoint"])
    if not p["model.checkpoint"] or not checkpoint.is_dir():
        raise FileNotFoundError(f"model.checkpoint: no checkpoint folder at '{p['model.checkpoint']}'")
    if not p["model.tokenizer"] or not Path(p["model.tokenizer"]).is_file():
        raise FileNotFoundError(f"model.tokenizer: no tokenizer file at '{p['model.tokenizer']}'")
    device = p["model.device"]
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("model.device is 'cuda' but no CUDA device is available (use a CPU config)")
    stats = norm_stats_path(p["model.norm_stats"], checkpoint)
    if p["model.op_profile"]:
        SELECTOR.load_profile(p["model.op_profile"])
    adapter = adapter_cls.from_files(checkpoint, p["model.tokenizer"], stats,
                                    camera_names=list(p["cameras.slots"]), device=device,
                                    dtype=DTYPES[p["model.dtype"]])
    names = p["control.action_names"]
    if len(names) != adapter.action_dim:
        raise ValueError(f"control.action_names has {len(names)} names; the policy acts in {adapter.action_dim} dims")
    if len(p["state.joint_names"]) != adapter.state_dim:
        raise ValueError(f"state.joint_names has {len(p['state.joint_names'])} names; the policy's state has "
                         f"{adapter.state_dim} dims")
    if p["control.horizon"] != adapter.chunk_size:
        raise ValueError(f"control.horizon {p['control.horizon']} != the model's chunk size {adapter.chunk_size}")
    cfg = adapter.config
    runner = FlowRunner(adapter.model, cfg.num_steps, cfg.chunk_size, cfg.max_action_dim,
                        use_graphs=p["model.cuda_graphs"], token_bucket=p["model.token_bucket"],
                        state_dim=cfg.max_state_dim) if device == "cuda" else None
    policy = ControlPolicy(adapter, runner, p["model.noise_seed"], p["rtc.max_guidance"], p["rtc.jacobian"])
    if p["model.warmup_runs"]:
        policy.warmup(p["model.warmup_runs"], adapter.state_dim,
                      f"the checkpoint '{checkpoint}' (normalization stats '{stats or checkpoint}')")
    return policy
