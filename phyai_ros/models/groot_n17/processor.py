"""GR00T N1.7 preprocessing: raw robot observation -> backbone tokens, image patches and normalized state.

The recipe of LeRobot's pipeline (pack step + VLM encode step), because the checkpoint was trained on it:
- cameras in the pack step's `video_modality_keys` order (others dropped), else sorted by name;
- language lower-cased, keeping only alphanumerics, whitespace and '_' (`formalize_language`);
- state min/max-normalized to [-1, 1] (0 where max == min), clamped, zero-padded to max_state_dim;
- each frame squashed to a square, centre-cropped (floor offsets), resized to the target, then Qwen's
  smart_resize + normalize + patchify; every resize is bicubic with antialias on uint8 and rounds;
- the Qwen3-VL chat template (one image entry per frame, then the text), each image pad expanded to its
  merged patch count, byte-level BPE, LEFT padding with the pad token (the action head's unmasked VL
  self-attention sees the pad rows, so the side and the token matter).

Resizes: torch's CPU uint8 bicubic kernel (what LeRobot runs on CPU) differs by +-1 grey level from the float
path that LeRobot takes on CUDA; `resize_mode` picks one ("auto": uint8 kernel for a policy on the CPU, float
elsewhere: the POLICY's device decides, since frames arrive on the CPU whatever device the model runs on).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from phyai_ros.models.frames import check_frames_layout
from phyai_ros.models.files import CheckpointError, Fields, fixed_file, read_json

from phyai_ros.models.bpe import ByteLevelBPE
from phyai_ros.models.chat_template import check_renders, compile_chat_template, read_chat_template
from phyai_ros.runtime.lru import LruCache
from phyai_ros.runtime.transfer import to_device

Tensor = torch.Tensor
IMAGE_PREFIX = "observation.images."
IMAGE_PAD = "<|image_pad|>"
DEFAULT_TASK = "Perform the task."
TASK_TOKENS = 200   # the task's token budget in the prompt (the adapter's token_budget)
PROMPT_CACHE = 32   # tokenized prompts kept (one per recent instruction and camera count)
RESIZE_MODES = ("auto", "uint8", "float")


# ------------------------------------------------------------------ language / state
def formalize_language(text: str) -> str:
    """lower(), then only alphanumerics, whitespace and '_' kept (punctuation dropped, spaces as they are)."""
    return "".join(c for c in text.lower() if c.isalnum() or c.isspace() or c == "_")


def min_max_normalize(x: Tensor, lo: Tensor, hi: Tensor, clip: bool) -> Tensor:
    """2 (x - lo) / (hi - lo) - 1, 0 where hi == lo, optionally clamped to [-1, 1]."""
    span = hi - lo
    same = span == 0
    y = torch.where(same, torch.zeros_like(x), 2 * (x - lo) / torch.where(same, torch.ones_like(span), span) - 1)
    return y.clamp(-1.0, 1.0) if clip else y


# ------------------------------------------------------------------ images
def resolve_resize_mode(mode: str, device) -> str:
    """'auto' -> what LeRobot's processor runs on ``device``: the uint8 kernel on the CPU, float on CUDA."""
    if mode not in RESIZE_MODES:
        raise ValueError(f"resize_mode {mode!r} not in {RESIZE_MODES}")
    if mode != "auto":
        return mode
    return "uint8" if torch.device(device).type == "cpu" else "float"


def resize_uint8(x: Tensor, h: int, w: int, mode: str) -> Tensor:
    """uint8 [N, C, H, W] -> [N, C, h, w], bicubic with antialias; unchanged when the size is. 'uint8': torch's
    fixed-point uint8 kernel (CPU only); 'float': float32 interpolate, clamp to [0, 255], round."""
    if tuple(x.shape[-2:]) == (h, w):
        return x
    mode = resolve_resize_mode(mode, x.device)
    if mode == "uint8":
        return F.interpolate(x.contiguous(), size=(h, w), mode="bicubic", align_corners=False, antialias=True)
    y = F.interpolate(x.float(), size=(h, w), mode="bicubic", align_corners=False, antialias=True)
    return y.clamp_(0, 255).round_().to(torch.uint8)


@dataclass(frozen=True)
class FrameGeometry:
    """The VLM step's square-resize / centre-crop / resize-to-target recipe."""
    target_hw: Tuple[int, int] = (256, 256)
    crop_hw: Optional[Tuple[int, int]] = (230, 230)
    shortest_edge: Optional[int] = None
    crop_fraction: Optional[float] = None

    @classmethod
    def from_step(cls, cfg: Mapping, source="the VLM step config") -> "FrameGeometry":
        f = Fields(cfg, source)
        return cls(f.ints("image_target_size", 1, 4096, length=2, default=(256, 256)),
                   f.ints("image_crop_size", 1, 4096, length=2, default=None),
                   f.get("shortest_image_edge", int, 1, 4096, default=None),
                   f.get("crop_fraction", float, 0, 1, default=None))

    def apply(self, x: Tensor, mode: str) -> Tensor:
        """uint8 [N, C, H, W] -> [N, C, target_h, target_w]."""
        e = self.shortest_edge or self.target_hw[0]
        x = resize_uint8(x, e, e, mode)   # squashes: the aspect ratio is not kept
        f = self.crop_fraction or (self.crop_hw[0] / self.target_hw[0] if self.crop_hw else None)
        if f is not None and 0 < f < 1:
            ch, cw = int(round(e * f)), int(round(e * f))
            top, left = (e - ch) // 2, (e - cw) // 2
            x = x[..., top:top + ch, left:left + cw]
        return resize_uint8(x, self.target_hw[0], self.target_hw[1], mode)


@dataclass(frozen=True)
class QwenImageProcessor:
    """Qwen2-VL image processor: smart_resize, normalize, duplicate in time, patchify in merge-block order."""
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int
    mean: Tuple[float, ...]
    std: Tuple[float, ...]
    rescale: float

    @classmethod
    def from_file(cls, path: Path) -> "QwenImageProcessor":
        c = Fields(read_json(path), path)
        size = c.section("size", default={})
        pixels = lambda key, size_key, default: (c.get(key, int, 1, 1 << 26, default=None)  # noqa: E731
                                                 or size.get(size_key, int, 1, 1 << 26, default=default))

        def triple(key):
            values = c.get(key, list, default=[0.5, 0.5, 0.5])
            if len(values) != 3 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and
                                           math.isfinite(v) for v in values):
                raise CheckpointError(f"{path}: {key} must be 3 finite numbers, got {values!r}"[:300])
            return tuple(float(v) for v in values)
        return cls(c.get("patch_size", int, 1, 1024, default=14), c.get("merge_size", int, 1, 64, default=2),
                   c.get("temporal_patch_size", int, 1, 64, default=2),
                   pixels("min_pixels", "shortest_edge", 56 * 56), pixels("max_pixels", "longest_edge", 28 * 28 * 1280),
                   triple("image_mean"), triple("image_std"), c.get("rescale_factor", float, 0, 1, default=1 / 255))

    def smart_size(self, h: int, w: int) -> Tuple[int, int]:
        """Nearest multiple of patch*merge per side (Python round: half to even), kept within the pixel budget."""
        f = self.patch_size * self.merge_size
        hb, wb = max(f, round(h / f) * f), max(f, round(w / f) * f)
        if hb * wb > self.max_pixels:
            beta = math.sqrt(h * w / self.max_pixels)
            hb, wb = max(f, math.floor(h / beta / f) * f), max(f, math.floor(w / beta / f) * f)
        elif hb * wb < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (h * w))
            hb, wb = math.ceil(h * beta / f) * f, math.ceil(w * beta / f) * f
        return hb, wb

    def __call__(self, frames: Tensor, mode: str) -> Tuple[Tensor, Tensor]:
        """uint8 [N, C, H, W] (one size) -> pixel rows [N * gh * gw, C * tp * p * p] float32 on the frames' device,
        grid [N, 3] int64 on the host (the prompt's image-pad counts come from it: no device read)."""
        n, c, h, w = frames.shape
        hb, wb = self.smart_size(h, w)
        x = resize_uint8(frames, hb, wb, mode).float()
        mean, std = self._mean_std(str(x.device), c)
        x = (x - mean) / std
        p, m, tp = self.patch_size, self.merge_size, self.temporal_patch_size
        gh, gw = hb // p, wb // p
        x = x[:, None].expand(n, tp, c, hb, wb)
        x = x.reshape(n, tp, c, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
        rows = x.reshape(n * gh * gw, c * tp * p * p)
        grid = torch.tensor([[1, gh, gw]] * n, dtype=torch.int64)
        return rows, grid

    @functools.lru_cache(maxsize=4)
    def _mean_std(self, device: str, c: int) -> Tuple[Tensor, Tensor]:
        """The rescale folded into mean / std in float64, as the reference does: (x - mean/r) / (std/r); made once
        per device (a per-call host tensor would be a stream-synchronising upload)."""
        mean = torch.tensor([m / self.rescale for m in self.mean]).view(1, c, 1, 1)
        std = torch.tensor([s / self.rescale for s in self.std]).view(1, c, 1, 1)
        return mean.to(device), std.to(device)


# ------------------------------------------------------------------ prompt
def _chat_context(n_images: int, text: str) -> dict:
    content = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": text}]
    return {"messages": [{"role": "user", "content": content}], "add_generation_prompt": False}


def render_chat_template(template: str, n_images: int, text: str, source: str = "the backbone's chat template") -> str:
    """The backbone's chat template for one user message: n_images image entries, then the text (under the
    render budget of models/chat_template.py; ``source`` names the template in its errors)."""
    return compile_chat_template(template, source).render(**_chat_context(n_images, text))


# ------------------------------------------------------------------ the whole step
@dataclass
class GrootInputs:
    """Model inputs of one batch (on the policy's device) plus what decoding and checks need."""
    input_ids: Tensor        # [B, L] int64, left-padded
    attention_mask: Tensor   # [B, L] int64, 0 on the left pads
    pixel_values: Tensor     # [N_img, C*tp*p*p] float32, item-major then camera
    image_grid_thw: Tensor   # [N_img, 3] int64
    state: Tensor            # [B, 1, max_state_dim] normalized
    embodiment_id: Tensor    # [B] int64
    raw_state: Tensor        # [B, state_dim] float32, robot units (relative actions add it back)
    vlm_images: Tensor       # [B, V, 3, h, w] uint8, the frames given to the image processor
    prompts: List[str] = field(default_factory=list)
    cameras: List[str] = field(default_factory=list)
    # (input_ids, attention_mask, image_grid_thw) on the host: the backbone's plan reads the token layout from
    # these rather than from the device (a read there would wait for the queued image work).
    host_layout: Optional[Tuple[Tensor, Tensor, Tensor]] = None


class GrootProcessor:
    """Pack + VLM-encode steps of a LeRobot GR00T N1.7 checkpoint (see module docstring)."""

    def __init__(self, pack: Mapping, pack_state: Mapping[str, Tensor], vlm: Mapping, backbone_dir: Path,
                 image_token_id: int, camera_keys: Sequence[str], max_state_dim: int):
        self.pack = dict(pack)
        self.tokenizer = ByteLevelBPE(fixed_file(backbone_dir, "tokenizer.json"))
        self.template = read_chat_template(backbone_dir)
        self.template_source = f"{backbone_dir}'s chat template"
        # rendered once here under its budget: a template that would hang or exhaust memory is refused at load
        check_renders(compile_chat_template(self.template, self.template_source),
                      **_chat_context(len(camera_keys) or 1, "pick up the red cup and put it in the bowl"))
        self.images = QwenImageProcessor.from_file(fixed_file(backbone_dir, "preprocessor_config.json"))
        self._prompt_cache = LruCache(PROMPT_CACHE)   # (task, per-view pad counts) -> (prompt, token ids)
        self.geometry = FrameGeometry.from_step(vlm, "policy_preprocessor.json's VLM step config")
        pad = read_json(fixed_file(backbone_dir, "tokenizer_config.json")).get("pad_token") or "<|endoftext|>"
        self.pad_id = self.tokenizer.token_id(pad if isinstance(pad, str) else pad["content"])
        self.image_token_id = image_token_id
        if self.tokenizer.token_id(IMAGE_PAD) != image_token_id:
            raise CheckpointError(f"{backbone_dir}: tokenizer's {IMAGE_PAD} id {self.tokenizer.token_id(IMAGE_PAD)} "
                                  f"!= image_token_id {image_token_id} of config.json")
        self.cameras = self._camera_order(camera_keys)
        self.max_state_dim = max_state_dim
        for k in ("observation.state.min", "observation.state.max"):
            if k not in pack_state:
                raise CheckpointError(f"pack step state file: no {k} (needed for the state normalization)")
        self.state_lo = pack_state["observation.state.min"].float()
        self.state_hi = pack_state["observation.state.max"].float()
        if self.state_dim > max_state_dim:
            raise CheckpointError(f"state has {self.state_dim} dims > max_state_dim {max_state_dim}")

    @property
    def state_dim(self) -> int:
        return int(self.state_lo.numel())

    def _camera_order(self, camera_keys: Sequence[str]) -> List[str]:
        listed = self.pack.get("video_modality_keys")
        names = [k[len(IMAGE_PREFIX):] if k.startswith(IMAGE_PREFIX) else k for k in camera_keys]
        return list(listed) if listed else sorted(names)

    def embodiment_id(self, tag: Optional[str] = None) -> int:
        tag = tag or self.pack.get("embodiment_tag")
        mapping = self.pack.get("embodiment_mapping") or {}
        if tag not in mapping:
            raise ValueError(f"embodiment tag {tag!r} is not in the checkpoint's mapping {mapping}")
        return int(mapping[tag])

    def fit_language(self, task: str) -> Tuple[str, bool]:
        """(the task as the model reads it, whether it was cut): formalized, then cut at a word to TASK_TOKENS tokens
        (a bound on the prompt and its tokenising; LeRobot's processor has none, and no real task comes near it)."""
        if not isinstance(task, str):
            raise ValueError(f"task must be a string, got {type(task).__name__}")
        return self._fit_language(task)

    @functools.lru_cache(maxsize=PROMPT_CACHE)
    def _fit_language(self, task: str) -> Tuple[str, bool]:
        """fit_language of a string; kept per recent instruction (the cut tokenises the task)."""
        text = task if task.strip() else DEFAULT_TASK
        text = formalize_language(text) if self.pack.get("formalize_language", True) else text
        return self.tokenizer.cut_to(text, TASK_TOKENS)

    def language(self, task: str) -> str:
        return self.fit_language(task)[0]

    def normalize_state(self, raw: Tensor) -> Tensor:
        """[B, state_dim] robot units -> [B, 1, max_state_dim]."""
        y = min_max_normalize(raw.float(), self.state_lo.to(raw.device), self.state_hi.to(raw.device),
                              bool(self.pack.get("clip_outliers", True)))
        return F.pad(y, (0, self.max_state_dim - y.shape[-1]))[:, None]

    def frames(self, images: Mapping[str, Tensor], batch: int, mode: str) -> Tensor:
        """camera -> uint8 [B, H, W, 3] -> [B, V, 3, h, w] uint8 in camera order, after the frame geometry."""
        out = []
        for cam in self.cameras:
            x = images.get(cam)
            if x is None:
                x = images.get(IMAGE_PREFIX + cam)
            if x is None:
                raise ValueError(f"camera '{cam}': no image (the checkpoint needs {self.cameras})")
            if x.shape[0] != batch:
                raise ValueError(f"camera '{cam}': {x.shape[0]} images for a batch of {batch}")
            out.append(self.geometry.apply(x.permute(0, 3, 1, 2), mode))
        sizes = {tuple(f.shape[-2:]) for f in out}
        if len(sizes) != 1:
            raise ValueError(f"cameras {self.cameras}: frames of different sizes {sorted(sizes)}")
        return torch.stack(out, 1)

    def tokens(self, languages: Sequence[str], grid: Tensor, n_views: int) -> Tuple[Tensor, Tensor, List[str]]:
        """Prompts, expanded and tokenized, left-padded -> input_ids, attention_mask [B, L] (host), prompts.
        grid: the host grid [B * n_views, 3]."""
        merge = self.images.merge_size ** 2
        counts = [int(t * h * w) // merge for t, h, w in grid.tolist()]
        prompts, ids = [], []
        for i, text in enumerate(languages):
            prompt, row = self._prompt_ids(text, tuple(counts[i * n_views:(i + 1) * n_views]))
            prompts.append(prompt)
            ids.append(row)
        length = max(len(x) for x in ids)
        input_ids = torch.tensor([[self.pad_id] * (length - len(x)) + list(x) for x in ids], dtype=torch.int64)
        mask = torch.tensor([[0] * (length - len(x)) + [1] * len(x) for x in ids], dtype=torch.int64)
        return input_ids, mask, prompts

    def _prompt_ids(self, text: str, counts: Tuple[int, ...]) -> Tuple[str, Tuple[int, ...]]:
        """(the chat prompt, its expanded token ids) for one task and per-view image-pad counts. Rendering and
        byte-level BPE cost about a millisecond and change only with the instruction, so the last PROMPT_CACHE
        are kept (bounded: every new instruction adds one)."""
        return self._prompt_cache.get_or_make((text, counts), lambda: self._render_ids(text, counts))

    def _render_ids(self, text: str, counts: Tuple[int, ...]) -> Tuple[str, Tuple[int, ...]]:
        prompt = render_chat_template(self.template, len(counts), text, self.template_source)
        pieces = prompt.split(IMAGE_PAD)
        if len(pieces) != len(counts) + 1:
            raise ValueError(f"chat template gave {len(pieces) - 1} image pads for {len(counts)} views")
        expanded = pieces[0] + "".join(IMAGE_PAD * c + p for c, p in zip(counts, pieces[1:]))
        return prompt, tuple(self.tokenizer.encode(expanded))

    def __call__(self, images: Mapping[str, Tensor], state: Tensor, tasks: Sequence[str],
                 embodiment_id: Optional[Sequence[int]] = None, device="cpu", resize_mode: str = "auto"
                 ) -> GrootInputs:
        """images: camera -> uint8 [B, H, W, 3] tensors; state [B, state_dim]; one task per item."""
        if resize_mode not in RESIZE_MODES:
            raise ValueError(f"resize_mode {resize_mode!r} not in {RESIZE_MODES}")
        batch = state.shape[0]
        if len(tasks) != batch:
            raise ValueError(f"{len(tasks)} tasks for a batch of {batch}")
        if state.shape[-1] != self.state_dim:
            raise ValueError(f"state has {state.shape[-1]} dims, the checkpoint's stats {self.state_dim}")
        frames = self.frames(images, batch, resize_mode)
        v = frames.shape[1]
        rows, grid = self.images(frames.flatten(0, 1), resize_mode)
        input_ids, mask, prompts = self.tokens([self.language(t) for t in tasks], grid, v)
        ids = [self.embodiment_id()] * batch if embodiment_id is None else [int(i) for i in embodiment_id]
        if len(ids) != batch:
            raise ValueError(f"{len(ids)} embodiment ids for a batch of {batch}")
        return GrootInputs(to_device(input_ids, device), to_device(mask, device), to_device(rows, device),
                           to_device(grid, device), to_device(self.normalize_state(state), device),
                           to_device(torch.tensor(ids, dtype=torch.int64), device), to_device(state.float(), device),
                           to_device(frames, device), prompts, list(self.cameras),
                           host_layout=(input_ids, mask, grid))


def as_uint8_batch(image, name: str, device="cpu") -> Tensor:
    """numpy / tensor uint8 [H, W, 3] or [B, H, W, 3] -> tensor [B, H, W, 3] on ``device`` (checked before the
    copy); bad input names the camera."""
    a = image if isinstance(image, Tensor) else np.asanyarray(image)   # a PinnedArray stays one (in-place upload)
    check_frames_layout(a, name, batched=True)
    return to_device(a[None] if a.ndim == 3 else a, device)


def to_image_batch(images: Mapping[str, object], device="cpu") -> Dict[str, Tensor]:
    return {k: as_uint8_batch(v, k, device) for k, v in images.items() if v is not None}
