"""Shared adapter machinery of the pi-family policies (see pi05/adapter.py for the node-facing API): the family's
side of the model contract (phyai_ros/models/contract.py).

Why a base class: pi0 and pi0.5 handle cameras, state validation, tokenization, noise, RTC, action conversion,
serving, offline cases and quantization identically, and both sample through the runtime's FlowRunner (its stage
order, eager here or CUDA graphs on a GPU: one path); they differ in the prompt (pi0.5 writes the discretized
state into it), the normalization (quantiles vs mean/std) and the model's stages, which subclasses provide
through `prompt_parts`, their loader and the model object.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import (TYPE_CHECKING, ClassVar, Dict, Hashable, List, Mapping, NamedTuple, Optional, Sequence,
                    Tuple, Union)

import numpy as np
import torch

from phyai_ros.models.pi.modeling import solver
from phyai_ros.models.pi.modeling.config import GemmaConfig, SiglipConfig
from phyai_ros.models.files import fixed_file
from phyai_ros.models.cases import InputError, require_finite_tensor, require_range
from phyai_ros.models.contract import (NO_FILES, NO_OPTIONS, CaseInfer, ModelFiles, PolicyAdapter, PredictCase,
                                       QuantizeRequest,
                                       QuantizeResult)
from phyai_ros.models.pi.runner import BATCH_BUCKETS, FlowRunner
from phyai_ros.layers.quantized import quantized_in
from phyai_ros.runtime.transfer import stack_to_device, to_device
from phyai_ros.models.frames import check_frames_layout

from .image import preprocess_uint8_images
from .lerobot_checkpoint import strip_image_prefix
from .quantization import calibrate, quantization_summary, quantize_model, write_quantized_checkpoint
from .tokenizer import PromptTokenizer

if TYPE_CHECKING:
    from phyai_ros.control.rtc import RtcRequest

Tensor = torch.Tensor
ImageLike = Union[np.ndarray, Tensor, None]


class PromptTruncatedWarning(UserWarning):
    """The prompt did not fit the token budget: its task was cut (never the rest of the prompt)."""


@dataclass
class PolicyInputs:
    """Preprocessed model inputs (on the policy's device) plus host-side bookkeeping."""
    images: Tensor            # [B, S, 3, 224, 224] float32 in [-1, 1]
    image_masks: Tensor       # [B, S] bool
    tokens: Tensor            # [B, L] int64
    token_masks: Tensor       # [B, L] bool
    state_normalized: Tensor  # [B, state_dim] float32 (CPU)
    prompts: List[str] = field(default_factory=list)
    slot_names: List[str] = field(default_factory=list)
    truncated: List[bool] = field(default_factory=list)
    # (image_masks, token_masks) as host arrays: the runner picks the bucket from them without a device read.
    host_masks: Optional[Tuple[np.ndarray, np.ndarray]] = None


class CameraFrames(NamedTuple):
    """The image half of PolicyInputs, ready before the prompt is: the runner starts the vision stage on it."""
    images: Tensor            # [B, S, 3, 224, 224] float32 in [-1, 1] on the device
    image_masks: Tensor       # [B, S] bool on the device
    host_masks: np.ndarray    # the same masks on the host
    slot_names: List[str]


def resolve_cameras(checkpoint_cams: Sequence[str], camera_names: Optional[Sequence[str]]) -> List[str]:
    """Slot names (checkpoint order). camera_names must be a non-empty subset of the checkpoint's cameras."""
    slots = list(checkpoint_cams)
    wanted = [strip_image_prefix(c) for c in camera_names] if camera_names is not None else list(slots)
    if not slots:
        slots = wanted
    if not wanted or any(c not in slots for c in wanted):
        raise ValueError(f"camera_names {list(camera_names or [])} must be a non-empty subset of the "
                         f"checkpoint's cameras {slots}")
    return slots


def check_dims(ckpt_state_dim, ckpt_action_dim, state_norm, action_norm, action_dim=None) -> None:
    if ckpt_state_dim is not None and ckpt_state_dim != state_norm.dim:
        raise ValueError(f"state dim: config.json says {ckpt_state_dim}, stats have {state_norm.dim}")
    adim = action_dim if action_dim is not None else (ckpt_action_dim or action_norm.dim)
    if adim != action_norm.dim:
        raise ValueError(f"action dim {adim} does not match the action stats ({action_norm.dim} dims)")


def norm_stats_file(given: Optional[Path], checkpoint: Path) -> Optional[Path]:
    """The statistics a pi checkpoint is normalized with: ``given`` (model.norm_stats / --norm-stats), else the
    folder's own: a LeRobot normalizer file (the loader finds it from the folder: None) or a norm_stats.json."""
    if given is not None:
        if not Path(given).is_file():
            raise FileNotFoundError(f"no statistics file at '{given}'")
        return Path(given)
    if any(checkpoint.glob("policy_preprocessor_step_*_normalizer_processor.safetensors")):
        return None
    if fixed_file(checkpoint, "norm_stats.json").is_file():
        return checkpoint / "norm_stats.json"
    raise FileNotFoundError(f"no statistics file given and the checkpoint folder '{checkpoint}' holds none "
                            "(a LeRobot normalizer .safetensors or norm_stats.json)")


@dataclass
class ServeRow:
    """One served request, prepared alone: its inputs, noise (from its seed) and guided-RTC tensors."""
    inputs: "PolicyInputs"
    noise: torch.Tensor
    guide: Optional[solver.RtcTensors]


class FlowAdapter(PolicyAdapter):
    """Base adapter. Subclasses set `family`, `checkpoint_types`, `prompt_parts` and their loader (`from_files`,
    `checkpoint_loader`, `config_class`)."""

    rtc_modes = ("guided", "trained", "off")   # of control.rtc.RTC_MODES: what this family's solver does
    rtc_max_guidance = 10.0                    # guided RTC: largest guidance weight
    rtc_jacobian = "identity"                  # "identity" (LeRobot's form, graphable) or "vjp" (the paper's)
    needs_files = ("tokenizer", "norm_stats")  # node file parameters it reads besides the checkpoint
    masks_cameras = True                       # a camera without a frame is a masked slot
    serving = "batched"                        # per-row noise and RTC state: a batched row is the row alone
    config_class: ClassVar[type]               # the family's PiConfig subclass

    def __init__(self, model, tokenizer: PromptTokenizer, state_norm, action_norm, camera_names: Sequence[str],
                 device="cpu", dtype: torch.dtype = torch.float32):
        self.model = model
        self.config = model.cfg
        self.tokenizer = tokenizer
        self.state_norm = state_norm
        self.action_norm = action_norm.to(device)
        self.camera_names = list(camera_names)
        self.device = torch.device(device)
        self.dtype = dtype
        if tokenizer.max_length != self.config.token_budget:
            raise ValueError(f"tokenizer max_length {tokenizer.max_length} != token budget {self.config.token_budget}")
        if tokenizer.vocab_size > self.config.vocab_size:
            raise ValueError(f"tokenizer has {tokenizer.vocab_size} pieces but the model embeds only "
                             f"{self.config.vocab_size}")
        if self.action_dim > self.config.max_action_dim:
            raise ValueError(f"action_dim {self.action_dim} > model max_action_dim {self.config.max_action_dim}")
        self.use_runner(use_graphs=False)

    def use_runner(self, use_graphs: bool = False, token_bucket: int = 0) -> FlowRunner:
        """The runner every sample goes through: eager buffers by default; CUDA graphs and prompt-length
        buckets where the deployment asks for them (graphs only take effect on a CUDA device)."""
        cfg = self.config
        self.runner = FlowRunner(self.model, cfg.num_steps, cfg.chunk_size, cfg.max_action_dim, use_graphs=use_graphs,
                                 token_bucket=token_bucket, state_dim=cfg.max_state_dim)
        return self.runner

    # ---------------------------------------------------------------- the contract's loading and facts
    @classmethod
    def load(cls, checkpoint, files: ModelFiles = NO_FILES, camera_names: Optional[Sequence[str]] = None,
             device="cpu", dtype: torch.dtype = torch.float32,
             options: Mapping[str, str] = NO_OPTIONS) -> "FlowAdapter":
        """The tokenizer file is required; the statistics default to the checkpoint folder's own."""
        cls.check_options(options)
        if files.tokenizer is None or not files.tokenizer.is_file():
            raise FileNotFoundError(f"{cls.family} needs a tokenizer file (model.tokenizer / --tokenizer): "
                                    f"none at '{files.tokenizer or ''}'")
        stats = norm_stats_file(files.norm_stats, Path(checkpoint))
        return cls.from_files(checkpoint, files.tokenizer, stats, camera_names=camera_names, device=device,
                              dtype=dtype)

    def configure_rtc(self, max_guidance: float, jacobian: str) -> None:
        self.rtc_max_guidance, self.rtc_jacobian = float(max_guidance), jacobian

    @property
    def token_budget(self) -> int:
        return self.config.token_budget

    def quantization(self) -> str:
        return quantization_summary(self.model)

    def quantized_weights(self) -> list:
        return quantized_in(self.model)

    # ---------------------------------------------------------------- to override
    def prompt_parts(self, tasks: List[str], state_normalized: np.ndarray) -> List[Tuple[str, str, str]]:
        """(head, task, tail) per row: the prompt is their concatenation, and only the task may be cut."""
        raise NotImplementedError

    def build_prompts(self, tasks: List[str], state_normalized: np.ndarray) -> List[str]:
        """The prompts before any cut to the token budget."""
        return ["".join(p) for p in self.prompt_parts(tasks, state_normalized)]

    def fit_tasks(self, tasks: List[str], state_normalized: np.ndarray) -> Tuple[List[str], List[bool]]:
        """Prompts that fit the token budget (a task too long is cut, see PromptTokenizer.fit), and which
        rows were cut."""
        prompts, cut = [], []
        for head, task, tail in self.prompt_parts(tasks, state_normalized):
            kept, truncated = self.tokenizer.fit(head, task, tail)
            prompts.append(head + kept + tail)
            cut.append(truncated)
        return prompts, cut

    def fit_task(self, task: str, state=None) -> Tuple[str, bool]:
        """The prompt one task gives with a raw ``state`` (None: zeros) and whether its task had to be cut:
        lets an intake report a too-long instruction once rather than at every inference."""
        s = self._state_array(np.zeros(self.state_dim, np.float32) if state is None else state, 1)
        prompts, cut = self.fit_tasks([task], self.state_norm.normalize(torch.from_numpy(s)).numpy())
        return prompts[0], cut[0]

    def sample_actions(self, inputs: PolicyInputs, noise=None, rtc: Optional[solver.RtcTensors] = None,
                       trace: Optional[Dict[str, list]] = None) -> Tensor:
        """Through the runner: prefix embed -> prefix state (KV, suffix context, pi0's state token) -> step
        tables -> Euler loop (optional RTC). Returns x at t=0: normalized actions padded to max_action_dim,
        [B, H, A] float32 (under CUDA graphs the runner's static output: the next call overwrites it)."""
        bucket = self.runner.set_observation(inputs.images, inputs.image_masks, inputs.tokens, inputs.token_masks,
                                             self.state_padded(inputs), host_masks=inputs.host_masks)
        return self._sample(bucket, noise, rtc, trace)

    def _sample(self, bucket, noise, rtc: Optional[solver.RtcTensors], trace=None) -> Tensor:
        """The runner's loop on a bucket whose prefix state is set: noise checked (or drawn), RTC on the device."""
        x0 = self._noise(noise, bucket.tokens.shape[0])
        return self.runner.sample(bucket, x0, rtc.to(self.device) if rtc is not None else None, trace)

    def capture_buckets(self, images: Mapping[str, ImageLike], state, eager: bool = False,
                        min_cameras: Optional[int] = None) -> list:
        """Capture every graph bucket up front (start-up), so no prompt length pays a capture during control;
        with ``min_cameras`` every count of cameras present from it up too (``images`` holds them all).
        eager: run every bucket's shapes without graphs too (the operator autotune records what they call)."""
        if not self.runner.use_graphs and not eager:
            return []
        x = self.prepare(images, state, "warm up")
        return self.runner.capture_all_buckets(x.images, x.image_masks, x.tokens, x.token_masks, self.make_noise(1),
                                               min_slots=min_cameras)

    # ---------------------------------------------------------------- dims
    @property
    def state_dim(self) -> int:
        return self.state_norm.dim

    @property
    def action_dim(self) -> int:
        return self.action_norm.dim

    @property
    def chunk_size(self) -> int:
        return self.config.chunk_size

    @property
    def image_size(self) -> int:
        """The square image input the model takes (frames are resized with pad to it)."""
        return self.config.siglip.image_size

    # ---------------------------------------------------------------- preprocessing
    def _state_array(self, state, batch: Optional[int]) -> np.ndarray:
        s = np.asarray(state.detach().cpu().numpy() if isinstance(state, Tensor) else state)
        if s.dtype.kind not in "fiu":
            raise ValueError(f"state must be numeric, got dtype {s.dtype}")
        s = s.astype(np.float32)
        if s.ndim == 1:
            s = s[None]
        if s.ndim != 2 or s.shape[1] != self.state_dim or (batch is not None and s.shape[0] != batch):
            want = f"[{self.state_dim}] (or [B, {self.state_dim}])" if batch is None else \
                f"[{batch}, {self.state_dim}]" + (f" or [{self.state_dim}]" if batch == 1 else " (B from the images)")
            raise ValueError(f"state must have shape {want}, got {list(np.shape(state))}")
        if not np.isfinite(s).all():
            raise ValueError("state contains NaN or inf")
        return s

    def prepare(self, images: Mapping[str, ImageLike], state, tasks: Union[str, Sequence[str]]) -> PolicyInputs:
        """Raw observation -> model inputs. images: name -> uint8 [B, H, W, 3] or [H, W, 3] (or None);
        state [B, D] or [D] raw; tasks one string or B strings."""
        imgs, state_np, tasks = self._checked(images, state, tasks)
        return self._with_prompts(self._frames(imgs, len(tasks)), state_np, tasks)

    def _checked(self, images: Mapping[str, ImageLike], state, tasks) -> Tuple[Dict[str, np.ndarray], np.ndarray,
                                                                               List[str]]:
        """Every input checked before any is used: (present frames by camera, raw state [B, D], B tasks)."""
        unknown = [k for k in images if strip_image_prefix(k) not in self.camera_names]
        if unknown:
            raise ValueError(f"unknown camera(s) {unknown}; this policy's cameras are {self.camera_names}")
        imgs = {strip_image_prefix(k): v for k, v in images.items() if v is not None}
        if not imgs:
            raise ValueError("at least one camera image is required")
        batch = None
        for name, img in imgs.items():
            b = check_frames_layout(img, name, batched=True)
            if batch is not None and b != batch:
                raise ValueError(f"camera '{name}': expected [H, W, 3] or [B, H, W, 3] with one batch size for "
                                 f"all cameras, got shape {tuple(img.shape)}")
            batch = b
        if isinstance(tasks, str):
            tasks = [tasks] * batch
        tasks = list(tasks)
        if len(tasks) != batch:
            raise ValueError(f"got {len(tasks)} tasks for a batch of {batch}")
        for t in tasks:
            if not isinstance(t, str) or not t.strip():
                raise ValueError(f"task must be a non-empty string, got {t!r}")
        return imgs, self._state_array(state, batch), tasks

    def _frames(self, imgs: Dict[str, np.ndarray], batch: int) -> "CameraFrames":
        """Checked frames -> the image half of the model inputs, on the device."""
        # Slots: present cameras in checkpoint order, then the absent ones (all -1, masked), as LeRobot.
        size = self.config.siglip.image_size
        present = [c for c in self.camera_names if c in imgs]
        absent = [c for c in self.camera_names if c not in imgs]
        # Cameras of one frame size go over in one upload and are resized as one batch (few launches: the host
        # time before the graphs run is latency the robot waits for); absent slots stay all -1.
        by_shape: Dict[tuple, List[int]] = {}
        batched = [imgs[name] if imgs[name].ndim == 4 else imgs[name][None] for name in present]
        for i, frames in enumerate(batched):
            by_shape.setdefault(tuple(frames.shape), []).append(i)
        resized = {}
        for shape, slots in by_shape.items():
            frames = stack_to_device([batched[i] for i in slots], self.device)   # [n, B, H, W, 3]
            x = preprocess_uint8_images(frames.flatten(0, 1), size)
            resized[shape] = x.view(len(slots), batch, 3, size, size).transpose(0, 1)
        if len(resized) == 1 and not absent:   # every camera of one size: the resized batch (no copy at batch 1)
            images_t = next(iter(resized.values())).contiguous()
        else:
            images_t = torch.full((batch, len(present) + len(absent), 3, size, size), -1.0, device=self.device)
            for shape, slots in by_shape.items():
                images_t[:, slots] = resized[shape]
        host_masks = np.array([[True] * len(present) + [False] * len(absent)] * batch)
        return CameraFrames(images_t, to_device(host_masks, self.device), host_masks, present + absent)

    def _with_prompts(self, x: "CameraFrames", state_np: np.ndarray, tasks: List[str]) -> PolicyInputs:
        """The image half and the checked state and tasks -> the whole model inputs (prompts tokenised)."""
        state_n = self.state_norm.normalize(torch.from_numpy(state_np))
        prompts, truncated = self.fit_tasks(tasks, state_n.numpy())
        if any(truncated):
            warnings.warn(f"prompt longer than the {self.config.token_budget}-token budget; the task was cut to "
                          "fit (the rest of the prompt, pi0.5's state included, is kept)", PromptTruncatedWarning,
                          stacklevel=3)
        tokens, tmasks = self.tokenizer.batch(prompts)
        return PolicyInputs(x.images, x.image_masks, to_device(tokens, self.device), to_device(tmasks, self.device),
                            state_n, prompts, x.slot_names, truncated, host_masks=(x.host_masks, tmasks))

    # ---------------------------------------------------------------- inference helpers
    def state_padded(self, inputs: PolicyInputs) -> Tensor:
        """Normalized state zero-padded to the model's max_state_dim, on the device (pi0's state token)."""
        s = to_device(inputs.state_normalized, self.device, torch.float32)
        return torch.nn.functional.pad(s, (0, self.config.max_state_dim - s.shape[-1]))

    def make_noise(self, batch: int, generator: Optional[torch.Generator] = None) -> Tensor:
        cfg = self.config
        return to_device(torch.randn(batch, cfg.chunk_size, cfg.max_action_dim, generator=generator,
                                     dtype=torch.float32), self.device)

    def _noise(self, noise, batch: int) -> Tensor:
        if noise is None or isinstance(noise, torch.Generator):
            return self.make_noise(batch, generator=noise)
        n = torch.as_tensor(noise, dtype=torch.float32, device=self.device)
        if n.dim() == 2:
            n = n[None]
        want = (batch, self.config.chunk_size, self.config.max_action_dim)
        if tuple(n.shape) != want:
            raise ValueError(f"noise must have shape {list(want)}, got {list(n.shape)}")
        return n

    def rtc_tensors(self, prev_left_over, inference_delay: int, execution_horizon: int, schedule: str = "linear",
                    max_guidance: Optional[float] = None, jacobian: Optional[str] = None,
                    mode: str = "guided") -> solver.RtcTensors:
        """The solver's RTC tensors from the previous chunk's left-over in NORMALIZED action space ([n, D] or
        [B, n, D]); max_guidance / jacobian default to this adapter's settings."""
        prev = torch.as_tensor(prev_left_over, dtype=torch.float32, device=self.device)
        if prev.dim() == 2:
            prev = prev[None]
        if prev.dim() != 3 or prev.shape[2] > self.config.max_action_dim:
            raise ValueError(f"RTC prev_left_over must be [n, D] or [B, n, D], got {list(prev.shape)}")
        cfg = self.config
        return solver.build_rtc_tensors(
            prev, inference_delay, execution_horizon, cfg.chunk_size, cfg.max_action_dim, cfg.num_steps, schedule,
            self.rtc_max_guidance if max_guidance is None else max_guidance,
            self.rtc_jacobian if jacobian is None else jacobian, mode)

    def request_tensors(self, rtc: "RtcRequest") -> solver.RtcTensors:
        """The loop's request (Y in robot units) -> the solver's tensors: Y normalized, its first d actions
        frozen, free beyond len(Y)."""
        prev_n = self.normalize_actions(torch.from_numpy(self.checked_rtc_prefix(rtc)).to(self.device))
        return self.rtc_tensors(prev_n, rtc.d, rtc.n, rtc.schedule, mode=rtc.mode)

    def unnormalize_actions(self, actions_model: Tensor) -> Tensor:
        """[B, H, A] normalized padded -> [B, H, action_dim] robot units."""
        return self.action_norm.unnormalize(actions_model[..., : self.action_dim])

    def normalize_actions(self, actions: Tensor) -> Tensor:
        return self.action_norm.normalize(actions)

    # ---------------------------------------------------------------- public prediction
    def predict_batch(self, images: Mapping[str, ImageLike], state, tasks, noise=None,
                      rtc: Optional[solver.RtcTensors] = None, rtc_request: Optional["RtcRequest"] = None) -> Tensor:
        """Batched raw -> unnormalized actions [B, H, action_dim] float32 (rtc in normalized space, or the loop's
        request in robot units). The vision stage is started as soon as the frames are on the device; the
        prompt, the state and the RTC tensors are made on the host while it runs (design.md §1)."""
        imgs, state_np, tasks = self._checked(images, state, tasks)
        x = self._frames(imgs, len(tasks))
        frames = self.runner.set_images(x.images, x.image_masks, host_image_masks=x.host_masks)
        x = self._with_prompts(x, state_np, tasks)
        if rtc_request is not None:
            rtc = self.request_tensors(rtc_request)
        bucket = self.runner.set_language(frames, x.tokens, x.token_masks, self.state_padded(x),
                                          host_token_masks=x.host_masks[1])
        return self.unnormalize_actions(self._sample(bucket, noise, rtc))

    def predict(self, images: Mapping[str, ImageLike], state: np.ndarray, task: str, noise=None,
                rtc: Optional["RtcRequest"] = None) -> np.ndarray:
        """One observation -> np.float32 [H, action_dim] in robot units (see pi05/adapter.py docstring); rtc is
        the control loop's request (phyai_ros.control.rtc.RtcRequest, robot units)."""
        for name, img in images.items():
            if img is not None:
                check_frames_layout(img, name)
        if np.ndim(state) != 1:
            raise ValueError(f"state must be a vector of length {self.state_dim}, got shape {list(np.shape(state))}")
        if not isinstance(task, str):
            raise ValueError(f"task must be a non-empty string, got {task!r}")
        out = self.predict_batch(images, state, [task], noise, rtc_request=rtc)
        return out[0].detach().to("cpu", torch.float32).numpy()

    # ---------------------------------------------------------------- serving (a batch of robots)
    def serve_prepare(self, images, state, task: str, seed: int, rtc: Optional["RtcRequest"]) -> ServeRow:
        """One row: the engine has held the request to the intake checks (one [H, W, 3] frame per camera, a state
        vector: serve/engine.py check_intake)."""
        inputs = self.prepare(images, state, [task])
        noise = self.make_noise(1, generator=torch.Generator().manual_seed(int(seed)))
        return ServeRow(inputs, noise, self.request_tensors(rtc) if rtc is not None else None)

    def serve_group(self, row: ServeRow) -> Hashable:
        """Per-row guided RTC (or none) shares one runner call (its weights are per row); other RTC forms (the
        trained one, the VJP form) only with rows of the same frozen-prefix weights."""
        g = row.guide
        return "rows" if g is None or g.graphable else (g.mode, g.jacobian, g.weights.cpu().numpy().tobytes())

    def serve_sample(self, rows: Sequence[ServeRow]) -> np.ndarray:
        """Under CUDA graphs the batch is padded to the next of the runner's BATCH_BUCKETS (a bounded set of
        captured graphs; the pad rows repeat the first)."""
        n = len(rows)
        pad = next((b for b in BATCH_BUCKETS if b >= n), n) - n if self.runner.use_graphs else 0
        rows = list(rows) + [rows[0]] * pad
        inputs = stack_inputs([r.inputs for r in rows])
        x = self.sample_actions(inputs, torch.cat([r.noise for r in rows]), _stack_guides(rows))
        return self.unnormalize_actions(x)[:n].detach().to("cpu", torch.float32).numpy()

    # ---------------------------------------------------------------- offline cases (predict)
    def case_runner(self, case: PredictCase, noise: torch.Tensor) -> CaseInfer:
        """RTC from --rtc flags, or from --case's entry in inputs.json's ``rtc`` list (the fixtures' guided RTC
        cases: schedule, inference delay, execution horizon, max guidance)."""
        rtc = self._case_rtc(case)
        images = {k: v.numpy() for k, v in case.images.items()}
        state = case.state.numpy()

        def infer():
            prepared = self.prepare(images, state, case.tasks)
            actions_model = self.sample_actions(prepared, noise, rtc)
            return ({"actions": self.unnormalize_actions(actions_model), "actions.model": actions_model},
                    {"prompts": prepared.prompts, "slots": prepared.slot_names})
        return infer

    def _case_rtc(self, case: PredictCase) -> Optional[solver.RtcTensors]:
        sched, delay, horizon, max_g = case.rtc, case.inference_delay, case.execution_horizon, case.max_guidance
        if case.case and case.case != "plain":
            cases = {c["name"]: c for c in (case.meta or {}).get("rtc", []) if isinstance(c, dict) and "name" in c}
            if case.case not in cases:
                raise InputError(f"--case {case.case!r} not in --tasks-json's rtc list ({sorted(cases)})")
            c = cases[case.case]
            sched = sched or str(c.get("schedule", "")).lower() or None
            delay = c.get("inference_delay") if delay is None else delay
            horizon = c.get("execution_horizon") if horizon is None else horizon
            max_g = c.get("max_guidance_weight", 10.0) if max_g is None else max_g
        if sched is None:
            return None
        if delay is None or horizon is None:
            raise InputError("--rtc needs --inference-delay and --execution-horizon")
        h = self.chunk_size
        require_range("--inference-delay", delay, 0, h)
        require_range("--execution-horizon", horizon, 1, h)
        require_range("--max-guidance", max_g, *MAX_GUIDANCE)
        if case.prev_left_over not in case.inputs:
            raise InputError(f"RTC needs {case.prev_left_over!r} in --inputs")
        prev = require_finite_tensor(f"--inputs key {case.prev_left_over}",
                                     case.inputs[case.prev_left_over].to(torch.float32))
        if case.prev_left_over_space == "robot":
            prev = self.normalize_actions(prev.to(self.device))
        return self.rtc_tensors(prev, delay, horizon, sched, 10.0 if max_g is None else max_g, case.rtc_jacobian)

    # ---------------------------------------------------------------- the quantizer's hook
    @classmethod
    def quantize(cls, request: QuantizeRequest) -> QuantizeResult:
        """The model's linear weights of ``request.parts`` quantized in place, static activation scales calibrated
        on ``request.calibration``'s observations (W8A8 static), the folder written in the model's own layout."""
        scheme = request.scheme
        static = scheme.activations == "static"
        if static:
            if request.calibration is None:
                raise ValueError("static activation scales need calibration inputs (--calibration-inputs) and a "
                                 "tokenizer (--tokenizer)")
            policy = cls.load(request.checkpoint, request.files, device=request.device, dtype=request.dtype)
            model = policy.model
        else:
            model = cls.checkpoint_loader(request.checkpoint, device=request.device, dtype=request.dtype).model
        layers, skipped = quantize_model(model, scheme, request.parts)
        calibration = calibrate(policy, request.calibration) if static else None
        out = write_quantized_checkpoint(request.checkpoint, request.output, model, cls.family, scheme,
                                         request.parts, layers, skipped, calibration)
        return QuantizeResult(out, layers, skipped, calibrated=static)

    # ---------------------------------------------------------------- small checkpoints (tests, demos)
    @classmethod
    def small_config(cls, horizon: int = 50, image_size: int = 224, token_budget: int = 64):
        """Parity-fixture sizes (VLM 128x2, expert 64x2, SigLIP 64x2 at 224 px, vocab 1024, 64-token prompt): one
        CPU inference takes ~50-100 ms on 2 cores."""
        return cls.config_class(
            vlm=GemmaConfig(width=128, depth=2, mlp_dim=256, num_heads=8, num_kv_heads=1, head_dim=16),
            expert=GemmaConfig(width=64, depth=2, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16),
            siglip=SiglipConfig(width=64, depth=2, num_heads=4, mlp_dim=128, patch_size=14, image_size=image_size),
            vocab_size=1024, chunk_size=horizon, num_steps=10, token_budget=token_budget)

    @classmethod
    def make_small_checkpoint(cls, directory, *, fixtures: Optional[Path] = None, horizon: int = 50,
                              state_dim: int = 8, action_dim: int = 7,
                              seed: int = 0, cameras: Sequence[str] = ("base_0_rgb", "left_wrist_0_rgb",
                                                                       "right_wrist_0_rgb"),
                              image_size: int = 224, token_budget: int = 64) -> Path:
        """A random-weight small checkpoint (LeRobot layout) in ``directory``; its chunk size must equal the node's
        ``control.horizon``, state/action dims its joint/action name counts (``fixtures``: not needed)."""
        directory = Path(directory)
        cls.random_checkpoint_writer(directory, cls.small_config(horizon, image_size, token_budget), seed=seed,
                                     dtype=torch.float32, std=0.1, camera_names=tuple(cameras), state_dim=state_dim,
                                     action_dim=action_dim)
        return directory


MAX_GUIDANCE = (0.0, 100.0)  # the range the node accepts for rtc.max_guidance


def stack_inputs(parts: Sequence[PolicyInputs]) -> PolicyInputs:
    """One-row PolicyInputs (prompts padded to the same token budget) stacked into one batch."""
    first = parts[0]
    return PolicyInputs(torch.cat([p.images for p in parts]), torch.cat([p.image_masks for p in parts]),
                        torch.cat([p.tokens for p in parts]), torch.cat([p.token_masks for p in parts]),
                        torch.cat([p.state_normalized for p in parts]), sum((p.prompts for p in parts), []),
                        first.slot_names, sum((p.truncated for p in parts), []),
                        host_masks=None if any(p.host_masks is None for p in parts) else
                        tuple(np.concatenate([p.host_masks[i] for p in parts]) for i in range(2)))


def _stack_guides(rows: Sequence[ServeRow]) -> Optional[solver.RtcTensors]:
    """The rows' RTC tensors as one batch: per-row Y and weights (zero rows: RTC off) for the graphable form; one
    group's shared weights otherwise (FlowAdapter.serve_group)."""
    given = [r.guide for r in rows if r.guide is not None]
    if not given:
        return None
    first = given[0]
    y = torch.cat([r.guide.y if r.guide is not None else torch.zeros_like(first.y) for r in rows])
    if not first.graphable:
        return solver.RtcTensors(y, first.weights, first.guidance, first.jacobian, first.mode)
    w = torch.stack([r.guide.weights if r.guide is not None else torch.zeros_like(first.weights) for r in rows])
    return solver.RtcTensors(y, w, first.guidance, first.jacobian, first.mode)
