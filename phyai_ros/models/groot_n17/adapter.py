"""GR00T N1.7 policy adapter (the registry's "groot_n17"): robot observation in, action chunk out, with LeRobot
0.6.1's semantics, and the family's side of the model contract (phyai_ros/models/contract.py).

    policy = GrootAdapter.from_files(checkpoint_dir, device="cpu", dtype=torch.float32)
    actions = policy.predict(images={"front": rgb_uint8_HxWx3, "wrist": ...}, state=np.float32[state_dim],
                             task="pick up the cup", noise=None,             # or [H, A] / [1, H, A] (x at t=0)
                             rtc=make_request(prev_robot_units, d, mode="native", horizon=H))  # control.rtc
    # -> np.float32 [chunk_size, action_dim] in robot units

Stage order (the runner drives it: runtime/stage_runner.py over modeling.py's GrootModel): `prepare`
(processor.py) -> `backbone` (qwen3vl.py) -> `context` (VL adapter, state token, cross-attention K/V: once per
observation) -> the 4-step Euler loop (action_head.py) -> `decode` (postprocess.py). Tensor-level batch path:
`prepare` / `sample_actions` / `decode`.

What differs from the pi family, and why:
- Files: the tokenizer, chat template and statistics live in the checkpoint's own folders (backbone, pipelines),
  so no tokenizer / statistics file is read besides the checkpoint (``needs_files`` is empty).
- Cameras: every camera the checkpoint's pack step uses is required (``masks_cameras`` False), uint8 RGB, all of
  one size; frames are squashed to a square, so any aspect ratio is usable (``image_size`` None).
- Embodiment: the checkpoint's tag (pack step) unless ``select_embodiment`` / per-item ids say otherwise.
- RTC is GR00T's native one: the loop's request (Y in robot units, d frozen, n = len(Y)) becomes GrootRtc
  (prev_left_over = Y normalized, inference delay d, execution horizon n): rows < d stay Y exactly, a ramp up to
  n, free beyond. Relative-action checkpoints have no inverse action normalization (LeRobot turns RTC off for
  them), so they do RTC "off" only. The tensor path takes GrootRtc in NORMALIZED model space.
- Served one request at a time (``serving`` "single"): the runner's buckets are per observation shape.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Mapping, Optional, Sequence, Union

import numpy as np
import torch
from safetensors.torch import save_file

from phyai_ros.models.cases import InputError, require_finite_tensor, require_range
from phyai_ros.models.contract import (NO_FILES, NO_OPTIONS, CaseInfer, ModelFiles, PolicyAdapter, PredictCase,
                                       QuantizeRequest,
                                       QuantizeResult)
from phyai_ros.layers.quantized import quantized_in
from phyai_ros.runtime.stage_runner import StageRunner
from phyai_ros.runtime.transfer import to_device

from . import action_head, qwen3vl
from .checkpoint import GrootCheckpoint, groot_key_shapes, load_groot_checkpoint
from .config import groot_config
from .keys import PACK_STEP, POLICY_TYPE, PREFIX, UNNORM_STEP
from .modeling import GrootModel
from .postprocess import make_decoder
from .processor import (IMAGE_PREFIX, TASK_TOKENS, GrootInputs, GrootProcessor, resolve_resize_mode,
                        to_image_batch)
from .quantization import quantization_summary, quantize_weights, write_quantized_groot

if TYPE_CHECKING:
    from phyai_ros.control.rtc import RtcRequest

Tensor = torch.Tensor
FLOAT_RESIZE_CASE = "float_resize"    # the fixtures' case run with the float (CUDA-like) image resize


@dataclass
class GrootRtc:
    """Native RTC request: prev_left_over [T, D] or [B, T, D] in normalized model space."""
    prev_left_over: Union[Tensor, np.ndarray]
    inference_delay: int
    execution_horizon: Optional[int] = None


class GrootAdapter(PolicyAdapter):
    family = "groot_n17"
    checkpoint_types = (POLICY_TYPE,)
    rtc_modes = ("native", "off")
    needs_files = ()
    masks_cameras = False
    serving = "single"
    embodiments = True
    token_budget = TASK_TOKENS   # the task's tokens (processor.fit_language): longer tasks are cut at a word

    def __init__(self, ckpt: GrootCheckpoint, device="cpu", dtype: torch.dtype = torch.float32,
                 resize_mode: str = "auto", embodiment_tag: Optional[str] = None):
        self.ckpt = ckpt
        self.config = ckpt.config
        self.weights = ckpt.weights
        qwen3vl.fuse_projections(self.weights, self.config.text)       # one GEMM where the math allows
        action_head.fuse_projections(self.weights, self.config.head)
        action_head.post_norm_sums(self.weights, self.config.head)
        self.device = torch.device(device)
        self.dtype = dtype
        self.resize_mode = resolve_resize_mode(resize_mode, self.device)   # "auto": the policy's device
        p = ckpt.pipelines
        self.processor = GrootProcessor(p.pack, p.pack_state, p.vlm, ckpt.backbone_dir, self.config.tokens.image,
                                        ckpt.camera_keys, self.config.head.max_state_dim)
        self.embodiment_tag = embodiment_tag or p.pack.get("embodiment_tag")
        self.default_embodiment_id = self.processor.embodiment_id(self.embodiment_tag)
        self.decoder = make_decoder(p.post_name, p.post, p.post_state)
        self.relative = p.post_name != UNNORM_STEP or bool(ckpt.lerobot_config.get("use_relative_actions"))
        if self.relative:
            self.rtc_modes = ("off",)
        self.model = GrootModel(self.weights, self.config, self.device, dtype)
        self.use_runner(use_graphs=False)

    @classmethod
    def from_files(cls, checkpoint_dir, device="cpu", dtype: torch.dtype = torch.float32,
                   base_model: Optional[str] = None, backbone: Optional[str] = None, resize_mode: str = "auto",
                   embodiment_tag: Optional[str] = None) -> "GrootAdapter":
        """Load a LeRobot GR00T N1.7 checkpoint folder (and the base-model / backbone folders it names)."""
        ckpt = load_groot_checkpoint(checkpoint_dir, device=device, dtype=dtype, base_model=base_model,
                                     backbone=backbone)
        return cls(ckpt, device, dtype, resize_mode, embodiment_tag)

    @classmethod
    def load(cls, checkpoint, files: ModelFiles = NO_FILES, camera_names: Optional[Sequence[str]] = None,
             device="cpu", dtype: torch.dtype = torch.float32,
             options: Mapping[str, str] = NO_OPTIONS) -> "GrootAdapter":
        """The tools' call: camera_names, when given, must be the checkpoint's cameras (any order)."""
        cls.check_options(options)
        cls.check_files(files)
        policy = cls.from_files(checkpoint, device=device, dtype=dtype)
        if camera_names is not None:
            wanted = [c[len(IMAGE_PREFIX):] if c.startswith(IMAGE_PREFIX) else c for c in camera_names]
            if sorted(wanted) != sorted(policy.camera_names):
                raise ValueError(f"camera slots {list(camera_names)} must be the checkpoint's cameras "
                                 f"{policy.camera_names} (GR00T N1.7 takes every one of them; no slot is masked)")
        return policy

    def select_embodiment(self, value: str) -> None:
        """Act as the embodiment ``value`` names: a tag of the checkpoint's mapping (pack step) or its numeric id;
        anything else is an error listing the valid ones."""
        mapping = {str(t): int(i) for t, i in (self.processor.pack.get("embodiment_mapping") or {}).items()}
        text = str(value).strip()
        tag = next((t for t, i in mapping.items() if text.isdigit() and i == int(text)), text)
        if tag not in mapping:
            valid = ", ".join(f"{t} (id {i})" for t, i in mapping.items()) or "none"
            raise ValueError(f"embodiment {value!r} is not one of the checkpoint's embodiments: {valid} "
                             "(give a tag or its id)")
        self.embodiment_tag, self.default_embodiment_id = tag, mapping[tag]

    # ---------------------------------------------------------------- interface facts
    @property
    def camera_names(self):
        return list(self.processor.cameras)

    @property
    def state_dim(self) -> int:
        return self.processor.state_dim

    @property
    def action_dim(self) -> int:
        env = self.decoder.env_dim
        return int(env) if env else self.config.head.max_action_dim

    @property
    def chunk_size(self) -> int:
        """Actions per chunk: min(action_horizon, the tag's delta_indices, chunk_size, n_action_steps)."""
        lr, h = self.ckpt.lerobot_config, self.config.head.action_horizon
        tags = ((self.ckpt.base_processor.get("processor_kwargs") or {}).get("modality_configs") or {})
        delta = ((tags.get(self.embodiment_tag) or {}).get("action") or {}).get("delta_indices")
        cands = [h] + [int(x) for x in (len(delta) if delta else None, lr.get("chunk_size"),
                                         lr.get("n_action_steps")) if x]
        return min(cands)

    # ---------------------------------------------------------------- stages
    def prepare(self, images: Mapping[str, object], state, tasks: Union[str, Sequence[str]],
                embodiment_id: Optional[Sequence[int]] = None) -> GrootInputs:
        """Raw batch (camera -> uint8 [B, H, W, 3], state [B, D] robot units, one task per item) -> inputs."""
        st = torch.as_tensor(np.asarray(state, dtype=np.float32))
        st = st[None] if st.dim() == 1 else st
        if not bool(torch.isfinite(st).all()):
            raise ValueError(f"state holds {int((~torch.isfinite(st)).sum())} NaN/Inf values")
        tasks = [tasks] * st.shape[0] if isinstance(tasks, str) else list(tasks)
        ids = embodiment_id if embodiment_id is not None else [self.default_embodiment_id] * st.shape[0]
        # Frames go to the policy's device before any resize (the float path runs there); the fixed-point uint8
        # kernel exists on the CPU only.
        frame_device = self.device if self.resize_mode == "float" else "cpu"
        return self.processor(to_image_batch(images, frame_device), st, tasks, ids, self.device, self.resize_mode)

    def backbone(self, inputs: GrootInputs, trace: Optional[Dict[str, Tensor]] = None) -> Tensor:
        c = self.config
        return qwen3vl.backbone_features(self.weights, c.vision, c.text, c.tokens.image, inputs.input_ids,
                                         inputs.attention_mask, inputs.pixel_values.to(self.dtype),
                                         inputs.image_grid_thw, trace)

    def context(self, inputs: GrootInputs, features: Tensor,
                trace: Optional[Dict[str, Tensor]] = None) -> action_head.HeadContext:
        return action_head.observation_context(self.weights, self.config.head, features, inputs.attention_mask,
                                               inputs.input_ids == self.config.tokens.image,
                                               inputs.state.to(self.dtype), inputs.embodiment_id, trace)

    def make_noise(self, batch: int, generator: Optional[torch.Generator] = None) -> Tensor:
        h = self.config.head
        return torch.randn(batch, h.action_horizon, h.max_action_dim, generator=generator)

    def _noise(self, noise, batch: int) -> Tensor:
        h = self.config.head
        if noise is None or isinstance(noise, torch.Generator):
            noise = self.make_noise(batch, generator=noise)
        noise = torch.as_tensor(noise, dtype=torch.float32)
        noise = noise[None].expand(batch, -1, -1) if noise.dim() == 2 else noise
        if tuple(noise.shape) != (batch, h.action_horizon, h.max_action_dim):
            raise ValueError(f"noise: expected [{batch}, {h.action_horizon}, {h.max_action_dim}], "
                             f"got {tuple(noise.shape)}")
        return to_device(noise, self.device, torch.float32)      # x stays float32 through the loop

    def native_rtc(self, rtc: Optional[GrootRtc], batch: int) -> Optional[action_head.NativeRtc]:
        """A checked RTC request (normalized model space) as the head's NativeRtc, or None."""
        if rtc is None:
            return None
        if self.relative:
            raise ValueError("RTC is not available for relative-action checkpoints (LeRobot disables it for them)")
        prev = torch.as_tensor(np.asarray(rtc.prev_left_over, dtype=np.float32)) \
            if not isinstance(rtc.prev_left_over, Tensor) else rtc.prev_left_over.float()
        if not bool(torch.isfinite(prev).all()):
            raise ValueError("RTC prev_left_over holds NaN/Inf values")
        if rtc.inference_delay < 0 or (rtc.execution_horizon is not None and rtc.execution_horizon < 0):
            raise ValueError(f"RTC inference_delay {rtc.inference_delay} / execution_horizon "
                             f"{rtc.execution_horizon} must be >= 0")
        return action_head.native_rtc(to_device(prev, self.device), rtc.inference_delay, rtc.execution_horizon,
                                      self.config.head, batch)

    @torch.no_grad()
    def sample_actions(self, inputs: GrootInputs, noise=None, rtc: Optional[GrootRtc] = None,
                       trace: Optional[Dict[str, object]] = None) -> Tensor:
        """-> x at t = 1: normalized actions [B, action_horizon, max_action_dim] (LeRobot's action_pred), through
        the runner (its output buffer under graphs: decode it before the next call). With ``trace`` (a dict: the
        backbone / head intermediates and per-step lists) the same stages run eagerly and record."""
        batch = inputs.input_ids.shape[0]
        x0 = self._noise(noise, batch)
        native = self.native_rtc(rtc, batch)
        if trace is None:
            return self.runner.run(self.model.observation(inputs), x0, native)
        feats = self.backbone(inputs, trace)
        ctx = self.context(inputs, feats, trace)
        return action_head.sample(self.weights, self.config.head, ctx, x0, native, trace).float()

    def policy_actions(self, actions_model: Tensor) -> Tensor:
        """[B, H, A] -> [B, chunk_size, action_dim] (LeRobot's predict_action_chunk, still normalized)."""
        return actions_model[:, :self.chunk_size, :self.action_dim]

    def decode(self, actions_model: Tensor, inputs: GrootInputs) -> Tensor:
        """Normalized model actions -> robot units [B, chunk_size, action_dim] (the postprocessor)."""
        return self.decoder(self.policy_actions(actions_model), inputs.raw_state)

    def normalize_actions(self, actions: Tensor) -> Tensor:
        """Robot units -> normalized model space (absolute-action checkpoints), for RTC's previous chunk."""
        if self.relative:
            raise ValueError("relative-action checkpoints have no inverse action normalization")
        lo, hi = self.decoder.lo.to(actions.device), self.decoder.hi.to(actions.device)
        span = torch.where(hi == lo, torch.ones_like(hi), hi - lo)
        return torch.where(hi == lo, torch.zeros_like(actions), 2 * (actions.float() - lo) / span - 1)

    # ---------------------------------------------------------------- the bridge's API (batch 1)
    @property
    def image_size(self) -> None:
        """None: frames are squashed to the model's square, so every aspect ratio is usable."""
        return None

    def fit_task(self, task: str, state=None):
        """(the text the model reads, whether it was cut to the task's token budget, TASK_TOKENS)."""
        return self.processor.fit_language(task)

    def quantization(self) -> str:
        return quantization_summary(self.weights)

    def quantized_weights(self) -> list:
        return quantized_in(self.weights)

    def use_runner(self, use_graphs: bool = False, token_bucket: int = 0) -> StageRunner:
        """The runner every sample goes through (graphs only on CUDA). token_bucket does not apply: the runner
        keeps a bucket per observation shape (batch, token length, image grid), at most MAX_BUCKETS of them, the
        least recently used evicted (prompts are not padded to fewer lengths: the action head's VL self-attention
        sees pad rows, so padding would change the chunk)."""
        self.runner = StageRunner(self.model, use_graphs=use_graphs)
        return self.runner

    def capture_buckets(self, images: Mapping[str, object], state, eager: bool = False,
                        min_cameras: Optional[int] = None) -> list:
        """Capture the warm-up observation's graphs at start-up (nothing to do without graphs, unless eager: the
        operator autotune records what the same observation calls). min_cameras: unused, every camera is
        required here."""
        if not self.runner.use_graphs and not eager:
            return []
        inputs = self.prepare(images, np.asarray(state, dtype=np.float32)[None], ["warm up"])
        self.runner.run(self.model.observation(inputs), self._noise(None, 1))
        return self.runner.buckets()

    def native_request(self, rtc: Optional["RtcRequest"]) -> Optional[GrootRtc]:
        """The loop's request (robot units) -> GrootRtc(Y normalized, delay d, execution horizon n), checked."""
        if rtc is None:
            return None
        return GrootRtc(self.normalize_actions(torch.from_numpy(self.checked_rtc_prefix(rtc))), int(rtc.d), rtc.n)

    def predict(self, images: Mapping[str, object], state: np.ndarray, task: str, noise=None,
                rtc: Optional["RtcRequest"] = None) -> np.ndarray:
        """One observation -> np.float32 [chunk_size, action_dim] in robot units; rtc: the control loop's
        RtcRequest (phyai_ros.control.rtc) or None."""
        if np.ndim(state) != 1:
            raise ValueError(f"state must be a vector of length {self.state_dim}, got shape {list(np.shape(state))}")
        if not isinstance(task, str) or not task.strip():
            raise ValueError(f"task must be a non-empty string, got {task!r}")
        guide = self.native_request(rtc)
        inputs = self.prepare(images, np.asarray(state, dtype=np.float32)[None], [task])
        actions = self.decode(self.sample_actions(inputs, noise, guide), inputs)
        return actions[0].float().cpu().numpy()

    # ---------------------------------------------------------------- offline cases (predict)
    def case_runner(self, case: PredictCase, noise: Tensor) -> CaseInfer:
        """The fixtures' case facts live in inputs.json's ``cases[NAME]``: embodiment ids (``embodiment_id_used``)
        and native RTC's inference delay / execution horizon; ``float_resize`` runs the float (CUDA-like) image
        resize. Without a case entry the ids are the inputs' ``embodiment_id``, else the checkpoint's. RTC:
        --inference-delay [--execution-horizon] (or the case's) with the previous chunk from the inputs."""
        facts = (((case.meta or {}).get("cases") or {}).get(case.case) or {}) if case.case else {}
        if case.case == FLOAT_RESIZE_CASE:
            self.resize_mode = "float"
        rtc = self._case_rtc(case, facts)
        ids = facts.get("embodiment_id_used")
        if ids is None and "embodiment_id" in case.inputs:
            ids = case.inputs["embodiment_id"].tolist()
        if ids is not None and len(ids) != case.batch:
            raise InputError(f"{len(ids)} embodiment ids for a batch of {case.batch}")

        def infer():
            prepared = self.prepare(case.images, case.state.numpy(), case.tasks, ids)
            actions_model = self.sample_actions(prepared, noise, rtc)
            return ({"actions": self.decode(actions_model, prepared), "actions.model": actions_model},
                    {"prompts": prepared.prompts, "slots": prepared.cameras})
        return infer

    def _case_rtc(self, case: PredictCase, facts: dict) -> Optional[GrootRtc]:
        delay = facts.get("inference_delay") if case.inference_delay is None else case.inference_delay
        horizon = facts.get("execution_horizon") if case.execution_horizon is None else case.execution_horizon
        if delay is None:
            if case.rtc or horizon is not None:
                raise InputError("GR00T's native RTC needs --inference-delay (or a --case that has one)")
            return None
        require_range("--inference-delay", delay, 0, self.config.head.action_horizon)
        require_range("--execution-horizon", horizon, 0, self.config.head.action_horizon)
        if case.prev_left_over not in case.inputs:
            raise InputError(f"RTC needs {case.prev_left_over!r} in --inputs")
        prev = require_finite_tensor(f"--inputs key {case.prev_left_over}",
                                     case.inputs[case.prev_left_over].to(torch.float32))
        if case.prev_left_over_space == "robot":
            prev = self.normalize_actions(prev)
        return GrootRtc(prev, int(delay), None if horizon is None else int(horizon))

    # ---------------------------------------------------------------- the quantizer's hook
    @classmethod
    def quantize(cls, request: QuantizeRequest) -> QuantizeResult:
        """The weight dict quantized in place (quantization.py: the same parts over the vision tower, LLM and
        action head), its folder written; static activation scales are not calibrated for GR00T yet."""
        cls.check_files(request.files)
        ckpt = load_groot_checkpoint(request.checkpoint, device=request.device, dtype=request.dtype)
        layers, skipped = quantize_weights(ckpt.weights, ckpt.config, request.scheme, request.parts)
        out = write_quantized_groot(ckpt, request.output, request.scheme, request.parts, layers, skipped)
        return QuantizeResult(out, layers, skipped)

    # ---------------------------------------------------------------- small checkpoints (tests, demos)
    @classmethod
    def make_small_checkpoint(cls, directory, *, fixtures: Optional[Path] = None, state_dim: int = 13,
                              action_dim: int = 12, horizon: int = 16, cameras: Sequence[str] = ("front", "wrist"),
                              seed: int = 0, tag: str = "new_embodiment", mapping: Optional[dict] = None) -> Path:
        """A random-weight GR00T N1.7 of the parity fixture's tiny sizes (LeRobot layout) in ``directory``:
        ``checkpoint/`` (the folder to load), ``base_model/`` and ``backbone/`` (their files copied from the
        fixture set ``fixtures``/groot_n17, which must exist). Returns the checkpoint folder. horizon <= 16."""
        if fixtures is None or not (Path(fixtures) / "groot_n17" / "checkpoint").is_dir():
            raise FileNotFoundError(f"a small GR00T N1.7 checkpoint is made from the fixture set's folders: none at "
                                    f"{fixtures}/groot_n17 (set PHYAI_PARITY_FIXTURES)")
        src, root = Path(fixtures) / "groot_n17", Path(directory)
        mapping = dict(mapping or {tag: 3, "second_robot": 5})
        for folder in ("backbone", "base_model"):
            (root / folder).mkdir(parents=True, exist_ok=True)
            for f in (src / folder).iterdir():
                if f.suffix != ".safetensors" and f.name != "embodiment_id.json":
                    shutil.copyfile(f, root / folder / f.name)
        (root / "base_model" / "embodiment_id.json").write_text(json.dumps(mapping))
        base = json.loads((src / "base_model" / "config.json").read_text())
        if not 1 <= horizon <= base["action_horizon"] or action_dim > base["max_action_dim"] \
                or state_dim > base["max_state_dim"] or max(mapping.values()) >= base["max_num_embodiments"]:
            raise ValueError(f"horizon <= {base['action_horizon']}, action_dim <= {base['max_action_dim']}, state_dim "
                             f"<= {base['max_state_dim']}, ids < {base['max_num_embodiments']} (the fixture's sizes)")
        ckpt = root / "checkpoint"
        ckpt.mkdir(parents=True, exist_ok=True)
        config = json.loads((src / "checkpoint" / "config.json").read_text())
        config["input_features"] = {**{f"observation.images.{c}": {"type": "VISUAL", "shape": [3, 120, 160]}
                                       for c in cameras},
                                    "observation.state": {"type": "STATE", "shape": [state_dim]}}
        config["output_features"] = {"action": {"type": "ACTION", "shape": [action_dim]}}
        config.update(chunk_size=horizon, n_action_steps=horizon, embodiment_tag=tag, base_model_path="./base_model")
        (ckpt / "config.json").write_text(json.dumps(config, indent=2))
        _small_pipelines(src / "checkpoint", ckpt, cameras, state_dim, action_dim, tag, mapping)
        cfg = groot_config(json.loads((root / "backbone" / "config.json").read_text()), base, "backbone",
                           "base_model")
        gen = torch.Generator().manual_seed(seed)
        weights = {PREFIX + k: _random_tensor(k, shape, gen) for k, shape in groot_key_shapes(cfg).items()}
        save_file(weights, str(ckpt / "model.safetensors"))
        return ckpt


def _random_tensor(name: str, shape, gen):
    """Norm scales 1, biases 0, everything else N(0, 0.05): finite, well-scaled actions from random weights."""
    if name.endswith(".bias"):
        return torch.zeros(shape)
    if name.endswith(".weight") and len(shape) == 1:
        return torch.ones(shape)
    return torch.randn(shape, generator=gen) * 0.05


def _small_pipelines(src: Path, dst: Path, cameras, state_dim: int, action_dim: int, tag: str, mapping) -> None:
    """The fixture checkpoint's processor pipelines with this checkpoint's cameras, dims and embodiments;
    statistics: state and actions within [-1, 1] per dim."""
    stats = {"observation.state.min": -torch.ones(state_dim), "observation.state.max": torch.ones(state_dim),
             "action.min": -torch.ones(action_dim), "action.max": torch.ones(action_dim)}
    for name in ("policy_preprocessor.json", "policy_postprocessor.json"):
        pipeline = json.loads((src / name).read_text())
        for step in pipeline["steps"]:
            cfg = step.get("config") or {}
            if step["registry_name"] == PACK_STEP:
                cfg.update(embodiment_tag=tag, embodiment_mapping=dict(mapping), video_modality_keys=list(cameras))
            if step["registry_name"] == UNNORM_STEP:
                cfg["env_action_dim"] = action_dim
            if step.get("state_file"):
                save_file(stats, str(dst / step["state_file"]))
        (dst / name).write_text(json.dumps(pipeline, indent=2))


__all__ = ["GrootAdapter", "GrootRtc", "GrootInputs", "FLOAT_RESIZE_CASE"]
