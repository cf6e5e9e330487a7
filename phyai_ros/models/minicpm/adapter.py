"""MiniCPM-Robot (MiniCPM-RobotManip) policy adapter (the registry's "minicpm_robot"): robot observation in, action
chunk out, and the family's side of the model contract (phyai_ros/models/contract.py).

    policy = MiniCpmAdapter.load(checkpoint_dir, camera_names=["base", "wrist"], device="cuda", dtype=torch.bfloat16)
    actions = policy.predict({"base": rgb_uint8_HxWx3, "wrist": ...}, state=np.float32[state_dim],
                             task="put the red cube in the blue bowl")   # -> np.float32 [chunk_size, action_dim]

Stage order (the observation runner drives it over modeling.py's MiniCpmModel): ``prepare`` (processor.py: frames
resized, prompt built and tokenized) -> ``backbone`` (vision.py, language.py) -> ``context`` (head.py: cross K/V,
banks) -> the clean-action loop (head.py). The model's actions are execution-ready: no statistics are read, state
and actions are in robot units as the checkpoint was trained.

What differs from the other families, and why:
- Files: tokenizer, chat template and processor settings live in the checkpoint's ``processor/`` folder.
- Cameras: every camera given is required (``masks_cameras`` False); each view is resized to 448 x 448 whatever its
  size or aspect (``image_size`` None); a checkpoint config that names cameras fixes their set.
- The instruction is formatted by the option ``prompt_template`` ("{task}" by default; OpenBMB's robot prompt, if
  it has one, is not known here) and cut to ``token_budget`` tokens.
- Embodiment: a bank index in [0, E) (``model.embodiment``); the checkpoint's config may give a default.
- Dtypes: ``dtype`` is the VLM's; the head runs in float32 unless ``head_dtype=bfloat16`` (OpenBMB's choice: bf16 VLM,
  fp32 head).
- RTC "native": clean-action inpainting of the previous chunk's rows (head.py); no guidance gradient.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch
from safetensors.torch import save_file

from phyai_ros.models.cases import InputError
from phyai_ros.models.contract import (DTYPES, NO_FILES, NO_OPTIONS, CaseInfer, ModelFiles, PolicyAdapter,
                                       PredictCase)
from phyai_ros.models.files import CheckpointError, Fields, fixed_file, inside, read_json
from phyai_ros.runtime.stage_runner import StageRunner
from phyai_ros.runtime.transfer import stack_to_device, to_device

from . import head as head_mod
from . import language, vision
from .checkpoint import (BACKBONE_CONFIG, CHECKPOINT_TYPE, PROCESSOR_DIR, MiniCpmCheckpoint, is_minicpm_folder,
                         key_shapes, load_checkpoint)
from .config import written_config
from .modeling import MiniCpmModel
from .processor import (PRE_RESIZE, RESIZE_MODES, MiniCpmInputs, PromptBuilder, check_frames, frame_size, image_rows,
                        image_settings, level_table, resize_float, resize_pil)

if TYPE_CHECKING:
    from phyai_ros.control.rtc import RtcRequest

Tensor = torch.Tensor
TASK_TOKENS = 128             # the instruction's token budget: longer ones are cut at a piece boundary
MAX_FRAME_FILE_SIDE = 8192    # a case's PNG frames: larger headers are refused before decoding
OPTIONS = ("head_dtype", "resize", "prompt_template")


class MiniCpmAdapter(PolicyAdapter):
    family = "minicpm_robot"
    checkpoint_types = (CHECKPOINT_TYPE,)
    rtc_modes = ("native", "off")
    needs_files = ()
    masks_cameras = False
    serving = "single"
    embodiments = True
    token_budget = TASK_TOKENS
    expected_keys = {"actions": "actions", "vl_embs": "vl_embs", "proc.input_ids": "proc.input_ids"}
    prefixed_outputs = True

    def __init__(self, ckpt: MiniCpmCheckpoint, device="cpu", dtype: torch.dtype = torch.float32,
                 head_dtype: torch.dtype = torch.float32, resize_mode: str = "auto",
                 camera_names: Optional[Sequence[str]] = None, prompt_template: str = "{task}"):
        self.ckpt, self.config = ckpt, ckpt.config
        self.weights = ckpt.weights
        vision.fuse_projections(self.weights, self.config)
        language.fuse_projections(self.weights, self.config.text)
        head_mod.fuse_projections(self.weights, self.config.head)
        self.device = torch.device(device)
        self.dtype, self.head_dtype = dtype, head_dtype
        if resize_mode not in RESIZE_MODES:
            raise ValueError(f"resize {resize_mode!r} must be one of {RESIZE_MODES}")
        self.resize_mode = ("float" if self.device.type == "cuda" else "pil") if resize_mode == "auto" else resize_mode
        settings = image_settings(inside(ckpt.processor_dir, "processor_config.json", "processor config",
                                         ckpt.processor_dir))
        if (self.config.vision.insert_layer_id < 0) != (settings.downsample_mode == "4x"):
            raise CheckpointError(f"{ckpt.processor_dir}: downsample_mode {settings.downsample_mode} disagrees with "
                                  f"the backbone's")
        self.settings = settings
        self.frame_size = frame_size(settings)
        self.prompts = PromptBuilder(ckpt.processor_dir, self.config, settings)
        # an instruction is cut to the budget once, not on each chunk (the node sends the same one for minutes)
        self._fit = lru_cache(maxsize=64)(lambda text: self.prompts.tokenizer.cut_to(text, self.token_budget))
        self.prompt_template = _check_template(prompt_template)
        self.embodiment_id = ckpt.default_embodiment
        fixed = _config_cameras(ckpt.folder)
        names = list(camera_names) if camera_names else list(fixed)
        if fixed and sorted(names) != sorted(fixed):
            raise ValueError(f"camera slots {names} must be the checkpoint's cameras {list(fixed)}")
        self._cameras = names
        self.model = MiniCpmModel(self.weights, self.config, level_table(settings), self.device, dtype, head_dtype)
        self.token_bucket = 0
        self.use_runner(use_graphs=False)

    # ---------------------------------------------------------------- loading
    @classmethod
    def matches(cls, checkpoint: Path) -> bool:
        return is_minicpm_folder(Path(checkpoint))

    @classmethod
    def check_options(cls, options: Mapping[str, str]) -> None:
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ValueError(f"model type {cls.family} takes the options {', '.join(OPTIONS)}; got {', '.join(unknown)}")
        if options.get("head_dtype", "float32") not in DTYPES:
            raise ValueError(f"head_dtype {options['head_dtype']!r} must be one of {', '.join(DTYPES)}")
        if options.get("resize", "auto") not in RESIZE_MODES:
            raise ValueError(f"resize {options['resize']!r} must be one of {', '.join(RESIZE_MODES)}")
        _check_template(options.get("prompt_template", "{task}"))

    @classmethod
    def load(cls, checkpoint, files: ModelFiles = NO_FILES, camera_names: Optional[Sequence[str]] = None,
             device="cpu", dtype: torch.dtype = torch.float32,
             options: Mapping[str, str] = NO_OPTIONS) -> "MiniCpmAdapter":
        cls.check_options(options)
        cls.check_files(files)
        head_dtype = DTYPES[options.get("head_dtype", "float32")]
        ckpt = load_checkpoint(checkpoint, vlm_dtype=dtype, head_dtype=head_dtype, device=device)
        return cls(ckpt, device, dtype, head_dtype, options.get("resize", "auto"), camera_names,
                   options.get("prompt_template", "{task}"))

    def select_embodiment(self, value: str) -> None:
        text, count = str(value).strip(), self.config.head.num_embodiments
        if not text.isdigit() or int(text) >= count:
            raise ValueError(f"embodiment {value!r} must be a bank index in [0, {count - 1}] (this checkpoint has "
                             f"{count} embodiment banks)")
        self.embodiment_id = int(text)

    # ---------------------------------------------------------------- interface facts
    @property
    def camera_names(self) -> List[str]:
        return list(self._cameras)

    @property
    def state_dim(self) -> int:
        return self.config.head.state_dim

    @property
    def action_dim(self) -> int:
        return self.config.head.action_dim

    @property
    def chunk_size(self) -> int:
        return self.config.head.horizon

    def fit_task(self, task: str, state=None):
        return self._fit(task)

    # ---------------------------------------------------------------- stages
    def prepare_frames(self, frames: Sequence[np.ndarray]) -> Tensor:
        """Views (item-major) -> uint8 [F, h, w, 3] on the policy's device, resized as ``resize_mode`` says."""
        if self.resize_mode == "pil":
            return stack_to_device([resize_pil(f, self.settings) for f in frames], self.device)
        by_size: Dict[tuple, List[int]] = {}
        for i, f in enumerate(frames):
            by_size.setdefault(f.shape, []).append(i)
        if len(by_size) == 1:   # one size: one upload, one resize, no scatter
            return resize_float(resize_float(stack_to_device(list(frames), self.device), (PRE_RESIZE, PRE_RESIZE)),
                                self.frame_size)
        out = torch.empty((len(frames), *self.frame_size, 3), dtype=torch.uint8, device=self.device)
        for idx in by_size.values():   # same-size views go over in one copy and are resized as one batch
            resized = resize_float(resize_float(stack_to_device([frames[i] for i in idx], self.device),
                                                (PRE_RESIZE, PRE_RESIZE)), self.frame_size)
            out[torch.tensor(idx, device=self.device)] = resized
        return out

    def prepare(self, frames: Sequence[np.ndarray], state, tasks: Sequence[str], ids: Sequence[int],
                pad_to: int = 0) -> MiniCpmInputs:
        """One batch: its views (item-major, the same number per item), state [B, state_dim], one task and one
        embodiment id per item -> the runner's inputs. pad_to: left-pad the prompt to at least that length."""
        st = torch.as_tensor(np.asarray(state, dtype=np.float32))
        st = st[None] if st.dim() == 1 else st
        batch = st.shape[0]
        if st.dim() != 2 or st.shape[1] != self.state_dim:
            raise ValueError(f"state must be [{self.state_dim}] per item, got {list(st.shape)}")
        if not bool(torch.isfinite(st).all()):
            raise ValueError(f"state holds {int((~torch.isfinite(st)).sum())} NaN/Inf values")
        if len(tasks) != batch or len(ids) != batch or len(frames) % batch or not frames:
            raise ValueError(f"{len(tasks)} tasks, {len(ids)} embodiment ids and {len(frames)} views for a batch "
                             f"of {batch}")
        count = self.config.head.num_embodiments
        if not all(isinstance(i, int) and 0 <= i < count for i in ids):
            raise ValueError(f"embodiment ids {list(ids)} must be bank indices in [0, {count - 1}]")
        cameras = len(frames) // batch
        texts = [self.fit_task(self.prompt_template.format(task=t))[0] for t in tasks]
        prompts, input_ids, mask = self.prompts.batch(texts, cameras)
        if pad_to > input_ids.shape[1]:
            extra = pad_to - input_ids.shape[1]
            input_ids = torch.cat([torch.full((batch, extra), self.prompts.ids["pad_token"]), input_ids], 1)
            mask = torch.cat([torch.zeros(batch, extra, dtype=mask.dtype), mask], 1)
        per_frame = self.prompts.per_frame
        rows = image_rows(input_ids, self.config.image_token_id, len(frames) * per_frame)
        return MiniCpmInputs(self.prepare_frames(frames), to_device(input_ids, self.device),
                             to_device(mask, self.device), to_device(rows, self.device), to_device(st, self.device),
                             to_device(torch.tensor(list(ids), dtype=torch.int64), self.device), prompts,
                             bool((mask == 0).any()))

    def make_noise(self, batch: int, generator: Optional[torch.Generator] = None) -> Tensor:
        h = self.config.head
        return torch.randn(batch, h.horizon, h.action_dim, generator=generator)

    def _noise(self, noise, batch: int) -> Tensor:
        h = self.config.head
        if noise is None or isinstance(noise, torch.Generator):
            noise = self.make_noise(batch, noise)
        noise = torch.as_tensor(noise, dtype=torch.float32)
        noise = noise[None].expand(batch, -1, -1) if noise.dim() == 2 else noise
        if tuple(noise.shape) != (batch, h.horizon, h.action_dim):
            raise ValueError(f"noise: expected [{batch}, {h.horizon}, {h.action_dim}], got {list(noise.shape)}")
        if not bool(torch.isfinite(noise).all()):
            raise ValueError("noise holds NaN/Inf values")
        return to_device(noise, self.device, torch.float32)

    @torch.no_grad()
    def sample_actions(self, inputs: MiniCpmInputs, noise=None, rtc=None) -> Tensor:
        """-> actions [B, T, A] float32 (the runner's output buffer under graphs: copy it before the next call).
        rtc: (Y [n, A] robot units, frozen count d, ramp schedule) or None."""
        obs = self.model.observation(inputs)
        return self.runner.run(obs, self._noise(noise, inputs.input_ids.shape[0]), rtc)

    @torch.no_grad()
    def trace(self, inputs: MiniCpmInputs, noise) -> Dict[str, Tensor]:
        """Every intermediate the parity fixtures record, eagerly (debugging, tests)."""
        trace: Dict[str, Tensor] = {}
        obs = self.model.observation(inputs)
        vl = self.model.backbone(obs, trace)
        self._head_trace(obs, vl, self._noise(noise, inputs.input_ids.shape[0]), trace)
        trace["vl_embs"] = vl
        return trace

    def _head_trace(self, obs, vl, noise, trace) -> Tensor:
        ctx = self.model.context(obs, vl)
        prefix, weight, _ = self.model.solver_tensors(None, noise.shape[0])
        actions = head_mod.sample(self.weights, self.config.head, ctx, self.model.step_tables(), noise, prefix,
                                  weight, trace)
        trace["actions"] = actions
        return actions

    # ---------------------------------------------------------------- the bridge's API (batch 1)
    def use_runner(self, use_graphs: bool = False, token_bucket: int = 0) -> StageRunner:
        """The runner every sample goes through: backbone and context graphs per observation shape, the whole loop
        as one graph (graphs only on CUDA). token_bucket > 0: prompts are left-padded to a multiple of it (padded
        rows are zeroed before the GDN layers and masked as keys, and RoPE is relative, so a padded prompt computes
        the same chunk up to rounding), so a few graphs serve every instruction."""
        self.token_bucket = max(0, int(token_bucket))
        self.runner = StageRunner(self.model, use_graphs=use_graphs)
        return self.runner

    def _pad_to(self, length: int) -> int:
        b = self.token_bucket
        return -(-length // b) * b if b else 0

    def _frames(self, images: Mapping[str, Optional[np.ndarray]]) -> List[np.ndarray]:
        if not self._cameras:
            raise ValueError("no camera slots: give the robot's cameras (cameras.slots)")
        unknown = sorted(set(images) - set(self._cameras))
        if unknown:
            raise ValueError(f"unknown cameras {unknown} (slots: {self._cameras})")
        frames = [images.get(name) for name in self._cameras]
        check_frames(frames, self._cameras)
        return frames

    def _observation(self, images, state, task: str) -> MiniCpmInputs:
        if np.ndim(state) != 1:
            raise ValueError(f"state must be a vector of length {self.state_dim}, got shape {list(np.shape(state))}")
        if not isinstance(task, str) or not task.strip():
            raise ValueError(f"task must be a non-empty string, got {task!r}")
        frames = self._frames(images)
        text = self.fit_task(self.prompt_template.format(task=task))[0]
        length = len(self.prompts.encode(text, len(frames))[1])
        return self.prepare(frames, np.asarray(state, dtype=np.float32)[None], [task], [self.embodiment_id],
                            pad_to=self._pad_to(length))

    def capture_buckets(self, images, state, eager: bool = False, min_cameras: Optional[int] = None) -> list:
        """Capture (or, eager, run) every prompt bucket the robot's instructions can take: from the warm-up's
        length to the longest instruction the token budget allows (with token_bucket 0: the warm-up's only)."""
        if not self.runner.use_graphs and not eager:
            return []
        inputs = self._observation(images, state, "warm up")
        lengths = [inputs.input_ids.shape[1]]
        if self.token_bucket:
            longest = self._pad_to(lengths[0] + self.token_budget)
            lengths = list(range(lengths[0], longest + 1, self.token_bucket))
        for length in lengths:
            padded = self.prepare(self._frames(images), np.asarray(state, dtype=np.float32)[None], ["warm up"],
                                  [self.embodiment_id], pad_to=length)
            self.sample_actions(padded, None)
        return self.runner.buckets()

    def predict(self, images: Mapping[str, Optional[np.ndarray]], state: np.ndarray, task: str, noise=None,
                rtc: Optional["RtcRequest"] = None) -> np.ndarray:
        inputs = self._observation(images, state, task)
        request = None if rtc is None else (self.checked_rtc_prefix(rtc), int(rtc.d), rtc.schedule)
        actions = self.sample_actions(inputs, noise, request)
        return actions[0].float().cpu().numpy()

    # ---------------------------------------------------------------- offline cases (predict)
    def case_runner(self, case: PredictCase, noise) -> CaseInfer:
        """A parity set's case: its facts from config.json's ``cases`` (the camera files, relative to the set's
        folder, and their sha256; the instructions; the kind), its tensors under ``<case>.`` in the inputs (state,
        noise, embodiment ids; a head-only case's vl_embs)."""
        if not case.case:
            raise InputError("a MiniCPM-Robot set needs --case NAME (its cases are in --tasks-json)")
        facts = next((c for c in (case.meta or {}).get("cases") or [] if isinstance(c, dict)
                      and c.get("name") == case.case), None)
        if facts is None:
            raise InputError(f"--tasks-json has no case {case.case!r}")
        key = case.case + "."
        tensors = {k[len(key):]: v for k, v in case.inputs.items() if k.startswith(key)}
        for need in ("state", "embodiment_id"):
            if need not in tensors:
                raise InputError(f"--inputs has no {key}{need}")
        state = tensors["state"].float().reshape(tensors["state"].shape[0], -1)
        ids = [int(i) for i in tensors["embodiment_id"].reshape(-1)]
        if "noise" in tensors:
            noise = tensors["noise"].float()
        folder = Path(case.source).parent
        if facts.get("kind") == "head_only":
            if "vl_embs" not in tensors:
                raise InputError(f"head-only case {case.case}: --inputs has no {key}vl_embs")
            return self._head_only_case(tensors["vl_embs"], state, ids, noise)
        frames = _case_frames(folder, facts, state.shape[0])
        tasks = [str((item or {}).get("instruction", "")) for item in facts.get("items") or []]

        def infer():
            # the set's prompts are the instructions as given: no template, no budget cut
            # and the reference's PIL resize on every device (the GPU's is within a level or two, not bit-exact)
            keep = self.prompt_template, self.resize_mode
            self.prompt_template, self.resize_mode = "{task}", "pil"
            try:
                inputs = self.prepare(frames, state.numpy(), tasks, ids)
            finally:
                self.prompt_template, self.resize_mode = keep
            vl, actions = self.run_eager(inputs, noise)
            return ({"actions": actions, "actions.model": actions, "vl_embs": vl.float(),
                     "proc.input_ids": inputs.input_ids, "proc.attention_mask": inputs.attention_mask},
                    {"prompts": inputs.prompts})
        return infer

    @torch.no_grad()
    def run_eager(self, inputs: MiniCpmInputs, noise=None):
        """(vl_embs, actions) of a batch through the stages themselves (no runner): what predict's cases save."""
        obs = self.model.observation(inputs)
        vl = self.model.backbone(obs)
        return vl, self._head(obs, vl, self._noise(noise, inputs.input_ids.shape[0]))

    def _head(self, obs, vl, noise) -> Tensor:
        """The context and the loop, eagerly, RTC off."""
        ctx = self.model.context(obs, vl)
        return self.model.loop(ctx, self.model.step_tables(), noise, *self.model.solver_tensors(None, noise.shape[0]))

    def _head_only_case(self, vl_embs: Tensor, state: Tensor, ids: List[int], noise) -> CaseInfer:
        def infer():
            with torch.no_grad():
                obs = {"attention_mask": torch.ones(vl_embs.shape[:2], dtype=torch.int64, device=self.device),
                       "state": state.to(self.device, self.head_dtype),
                       "embodiment_id": torch.tensor(ids, dtype=torch.int64, device=self.device)}
                actions = self._head(obs, vl_embs.to(self.device, self.head_dtype), self._noise(noise, state.shape[0]))
            return {"actions": actions, "actions.model": actions}, {}
        return infer

    # ---------------------------------------------------------------- small checkpoints (tests, demos)
    @classmethod
    def make_small_checkpoint(cls, directory, *, fixtures: Optional[Path] = None, state_dim: int = 6,
                              action_dim: int = 6, horizon: int = 5, cameras: Sequence[str] = ("base", "wrist"),
                              embodiments: int = 3, seed: int = 0) -> Path:
        """A random-weight MiniCPM-Robot of the parity set's tiny sizes in ``directory``: its backbone config and
        processor files copied from the set beside ``fixtures`` (the lerobot_parity folder; ../minicpm_parity must
        exist), the head sized here."""
        src = Path(fixtures or "").parent / "minicpm_parity"    # beside the lerobot_parity folder
        if fixtures is None or not (src / BACKBONE_CONFIG).is_file():
            raise FileNotFoundError(f"a small MiniCPM-Robot checkpoint is made from the parity set: none at {src} "
                                    "(set PHYAI_PARITY_FIXTURES)")
        root = Path(directory)
        (root / PROCESSOR_DIR).mkdir(parents=True, exist_ok=True)
        for f in (src / PROCESSOR_DIR).iterdir():
            shutil.copyfile(f, root / PROCESSOR_DIR / f.name)
        shutil.copyfile(src / BACKBONE_CONFIG, root / BACKBONE_CONFIG)
        base = json.loads((src / "config.json").read_text())["head"]
        head_section = {**base, "action_dim": action_dim, "state_dim": state_dim, "action_horizon": horizon,
                        "num_embodiments": embodiments}
        config = {"type": CHECKPOINT_TYPE, "cameras": list(cameras), "head": head_section,
                  "sampler": {"num_steps": 4}}
        (root / "config.json").write_text(json.dumps(config, indent=2))
        cfg = written_config(json.loads((src / BACKBONE_CONFIG).read_text()), src / BACKBONE_CONFIG, head_section)
        gen = torch.Generator().manual_seed(seed)
        weights = {k: _random_tensor(k, s, gen) for k, s in key_shapes(cfg).items()}
        save_file(weights, str(root / "model.safetensors"))
        return root


def _random_tensor(name: str, shape, gen) -> Tensor:
    """Norm gains 1 (Qwen3.5's (1 + w) RMSNorms 0), biases 0, the rest N(0, 0.1); A_log / dt_bias as initialised."""
    if name.endswith(("A_log", "dt_bias")):
        return torch.zeros(shape)
    if name.endswith(".bias") or name.endswith(".b"):
        return torch.zeros(shape)
    if len(shape) == 1:
        qwen_norm = name.startswith("model.language_model.") and "linear_attn.norm" not in name
        return torch.zeros(shape) if qwen_norm else torch.ones(shape)
    return torch.randn(shape, generator=gen) * 0.1


def _config_cameras(folder: Path) -> tuple:
    data = read_json(fixed_file(folder, "config.json"))
    cams = data.get("cameras")
    if cams is None:
        return ()
    if not (isinstance(cams, list) and all(isinstance(c, str) and c for c in cams) and len(set(cams)) == len(cams)):
        raise CheckpointError(f"{folder}/config.json: cameras must be a list of distinct names")
    return tuple(cams)


def _check_template(template: str) -> str:
    if not isinstance(template, str) or template.count("{task}") != 1 or \
            template.replace("{task}", "").count("{") or template.replace("{task}", "").count("}"):
        raise ValueError(f"prompt_template {template!r} must hold '{{task}}' once and no other braces")
    return template


def _case_frames(folder: Path, facts: dict, batch: int) -> List[np.ndarray]:
    """The case's raw views (item-major, camera order), each file inside the set's folder, its size checked from
    the PNG header before decoding and its sha256 checked where the set records one."""
    from PIL import Image
    cams = facts.get("cams") or []
    if not cams:
        raise InputError("the case lists no camera files")
    fields = [Fields(c, "--tasks-json case cams") for c in cams]
    order = sorted(range(len(cams)), key=lambda i: (fields[i].get("item", int, 0, batch - 1),
                                                    fields[i].get("cam", int, 0, 64)))
    frames = []
    for i in order:
        path = inside(folder, fields[i].get("file", str), "camera file", "--tasks-json")
        data = path.read_bytes()
        want = fields[i].get("sha256", str, default=None)
        if want is not None and hashlib.sha256(data).hexdigest() != want:
            raise InputError(f"{path}: sha256 differs from the set's")
        with Image.open(path) as im:
            if max(im.size) > MAX_FRAME_FILE_SIDE:
                raise InputError(f"{path}: {im.size[0]}x{im.size[1]} is larger than {MAX_FRAME_FILE_SIDE} px a side")
            frames.append(np.asarray(im.convert("RGB")))
    return frames


__all__ = ["MiniCpmAdapter", "TASK_TOKENS"]
