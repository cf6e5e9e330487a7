"""MiniCPM-Robot's preprocessing: camera frames -> the vision tower's uint8 frames, instruction -> token ids.

Frames follow OpenBMB's ``vla_infer.py`` and MiniCPM-V 4.6's PIL image processor:
1. every view is resized to 448 x 448 (``PIL.Image.resize``, bicubic: PIL's default for RGB);
2. the processor's own resize (``find_best_resize``) leaves such a frame as it is at the released settings; a
   setting that would resize it again is followed, one that would slice it is refused (one frame = one image);
3. rescale and normalize: each uint8 level maps to one float32 value per channel (``level_table``: the
   processor's float64 rescale, float32 cast, float32 (x - mean) / std), so the device turns uint8 frames into
   pixel values with one gather inside the captured backbone.
On CUDA the resize can run on the GPU instead (``resize_mode`` "float": antialiased bicubic, rounded to uint8):
host time stays below a millisecond for three views, at the cost of +-1 level against PIL on resized views (a
view already 448 x 448 is not resized, so it is exact either way).

The prompt is the processor's: the chat template over [image] * cameras + [instruction] (add_generation_prompt),
each image placeholder expanded to ``<image_id>k</image_id><image>`` + tokens-per-frame image tokens +
``</image>`` (k: the camera's index in the item), tokenized with the checkpoint's byte-level BPE (special tokens
verbatim). Batched prompts of unequal length are left-padded (the processor's side) with the pad token.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from phyai_ros.models.bpe import ByteLevelBPE
from phyai_ros.models.chat_template import check_renders, compile_chat_template, read_chat_template
from phyai_ros.models.files import CheckpointError, Fields, inside, read_json
from phyai_ros.models.frames import FRAME

from .config import MiniCpmConfig
from .vision import tokens_per_frame

Tensor = torch.Tensor
PRE_RESIZE = 448          # vla_infer.py's fixed resize of every view
RESIZE_MODES = ("pil", "float", "auto")
TOKEN_FIELDS = ("image_token", "image_start_token", "image_end_token", "image_id_start_token",
                "image_id_end_token", "pad_token")


@dataclass(frozen=True)
class ImageSettings:
    """processor_config.json's image_processor section (the fields this path reads)."""
    mean: Tuple[float, float, float]
    std: Tuple[float, float, float]
    rescale: float
    patch_size: int
    scale_resolution: int
    slice_mode: bool
    max_slices: int
    use_image_id: bool
    resample: int
    downsample_mode: str


def image_settings(path: Path) -> ImageSettings:
    f = Fields(read_json(path), path).section("image_processor")
    mean = f.get("image_mean", list, default=[0.5, 0.5, 0.5])
    std = f.get("image_std", list, default=[0.5, 0.5, 0.5])
    for name, values in (("image_mean", mean), ("image_std", std)):
        if len(values) != 3 or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                                       and (name == "image_mean" or x > 0) for x in values):
            raise CheckpointError(f"{path}: image_processor.{name} must be 3 finite numbers (std > 0), got {values}")
    return ImageSettings(tuple(float(x) for x in mean), tuple(float(x) for x in std),
                         f.get("rescale_factor", float, 1e-6, 1.0, default=1 / 255),
                         f.get("patch_size", int, 1, 64, default=14),
                         f.get("scale_resolution", int, 14, 4096, default=448),
                         f.get("slice_mode", bool, default=True), f.get("max_slice_nums", int, 1, 64, default=9),
                         f.get("use_image_id", bool, default=True), f.get("resample", int, 0, 5, default=3),
                         f.get("downsample_mode", str, default="16x"))


def level_table(s: ImageSettings) -> Tensor:
    """[3, 256] float32: the pixel value of each uint8 level per channel, with the processor's roundings."""
    levels = (np.arange(256, dtype=np.float64) * s.rescale).astype(np.float32)
    mean, std = np.array(s.mean, dtype=np.float32), np.array(s.std, dtype=np.float32)
    return torch.from_numpy(((levels[None, :] - mean[:, None]) / std[:, None]).astype(np.float32))


def _ensure_divide(length: float, divisor: int) -> int:
    return max(round(length / divisor) * divisor, divisor)


def processor_size(s: ImageSettings, height: int, width: int) -> Tuple[int, int]:
    """The processor's (find_best_resize) size for a frame of height x width that is not sliced."""
    if s.slice_mode and min(math.ceil(height * width / s.scale_resolution ** 2), s.max_slices) > 1:
        raise ValueError(f"a {height}x{width} view would be sliced by this processor (scale_resolution "
                         f"{s.scale_resolution}); sliced views are not supported")
    aspect = width / height
    h = int(s.scale_resolution / math.sqrt(aspect))
    w = int(h * aspect)
    return _ensure_divide(h, s.patch_size * 4), _ensure_divide(w, s.patch_size * 4)


def pil_resize(frame: np.ndarray, size: Tuple[int, int], resample: int) -> np.ndarray:
    from PIL import Image
    if frame.shape[:2] == size:
        return frame
    return np.asarray(Image.fromarray(frame).resize((size[1], size[0]), resample=resample))


def frame_size(s: ImageSettings) -> Tuple[int, int]:
    """Every view's size after both resizes."""
    return processor_size(s, PRE_RESIZE, PRE_RESIZE)


def resize_pil(frame: np.ndarray, s: ImageSettings) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [h, w, 3]: vla_infer's 448 resize (bicubic), then the processor's."""
    from PIL import Image
    out = pil_resize(np.ascontiguousarray(frame), (PRE_RESIZE, PRE_RESIZE), Image.Resampling.BICUBIC)
    return pil_resize(out, frame_size(s), s.resample)


def resize_float(frames: Tensor, size: Tuple[int, int]) -> Tensor:
    """uint8 [N, H, W, 3] on any device -> uint8 [N, h, w, 3]: antialiased bicubic in float32, rounded."""
    if tuple(frames.shape[1:3]) == tuple(size):
        return frames
    x = frames.permute(0, 3, 1, 2).float()
    y = F.interpolate(x, size=size, mode="bicubic", antialias=True, align_corners=False)
    return y.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def pixels_from_levels(frames: Tensor, table: Tensor, dtype: torch.dtype) -> Tensor:
    """uint8 [F, h, w, 3] -> pixel values [F, 3, h, w] in ``dtype`` through the level table [3, 256]."""
    idx = frames.permute(0, 3, 1, 2).long()
    return torch.gather(table[None, :, None, :].expand(idx.shape[0], -1, idx.shape[2], -1).to(frames.device),
                        3, idx).to(dtype)


class PromptBuilder:
    """Instruction + camera count -> token ids, through the checkpoint's chat template and tokenizer; bounded cache
    per (instruction, cameras)."""

    def __init__(self, folder: Path, config: MiniCpmConfig, settings: ImageSettings):
        tok_config = read_json(inside(folder, "tokenizer_config.json", "tokenizer config", folder))
        fields = Fields(tok_config, folder / "tokenizer_config.json")
        self.tokens = {name: fields.get(name, str) for name in TOKEN_FIELDS}
        self.tokenizer = ByteLevelBPE(inside(folder, "tokenizer.json", "tokenizer", folder))
        self.template = compile_chat_template(read_chat_template(folder), str(folder))
        self.ids = {name: self.tokenizer.token_id(tok) for name, tok in self.tokens.items()}
        if self.ids["image_token"] != config.image_token_id:
            raise CheckpointError(f"{folder}: the tokenizer's image token {self.tokens['image_token']!r} is id "
                                  f"{self.ids['image_token']}, the backbone's image_token_id {config.image_token_id}")
        self.use_image_id = settings.use_image_id
        self.per_frame = tokens_per_frame(config, *frame_size(settings))
        self.encode = lru_cache(maxsize=64)(self._encode)
        # a template over its render budget is refused here, at load, naming its folder (models/chat_template.py)
        check_renders(self.template, messages=[{"role": "user", "content": [{"type": "image"},
                                                                            {"type": "text", "text": "warm up"}]}],
                      add_generation_prompt=True, **self.tokens)

    def text(self, instruction: str, cameras: int) -> str:
        content = [{"type": "image"} for _ in range(cameras)] + [{"type": "text", "text": instruction}]
        rendered = self.template.render(messages=[{"role": "user", "content": content}], add_generation_prompt=True,
                                        **{k: v for k, v in self.tokens.items()})
        image = self.tokens["image_token"]
        if rendered.count(image) != cameras:
            raise ValueError(f"the chat template rendered {rendered.count(image)} image placeholders for {cameras} "
                             "cameras (an instruction may not contain the image token)")
        parts = rendered.split(image)
        out = [parts[0]]
        for k, rest in enumerate(parts[1:]):
            prefix = f"{self.tokens['image_id_start_token']}{k}{self.tokens['image_id_end_token']}" \
                if self.use_image_id else ""
            out.append(prefix + self.tokens["image_start_token"] + image * self.per_frame
                       + self.tokens["image_end_token"] + rest)
        return "".join(out)

    def _encode(self, instruction: str, cameras: int) -> Tuple[str, Tuple[int, ...]]:
        text = self.text(instruction, cameras)
        return text, tuple(self.tokenizer.encode(text))

    def batch(self, instructions: Sequence[str], cameras: int) -> Tuple[List[str], Tensor, Tensor]:
        """-> (texts, input_ids [B, L] int64, attention_mask [B, L] int64), left-padded."""
        encoded = [self.encode(t, cameras) for t in instructions]
        length = max(len(ids) for _, ids in encoded)
        ids = torch.full((len(encoded), length), self.ids["pad_token"], dtype=torch.int64)
        mask = torch.zeros((len(encoded), length), dtype=torch.int64)
        for b, (_, row) in enumerate(encoded):
            ids[b, length - len(row):] = torch.tensor(row, dtype=torch.int64)
            mask[b, length - len(row):] = 1
        return [t for t, _ in encoded], ids, mask


@dataclass
class MiniCpmInputs:
    """One batch, prepared: frames (uint8 [B * cameras, h, w, 3], item-major), token ids and mask [B, L], the flat
    rows of the image tokens (in order), state [B, state_dim] float32, embodiment ids [B]."""
    frames: Tensor
    input_ids: Tensor
    attention_mask: Tensor
    image_rows: Tensor
    state: Tensor
    embodiment_id: Tensor
    prompts: List[str]
    padded: bool


def image_rows(input_ids: Tensor, image_token_id: int, expected: int) -> Tensor:
    rows = (input_ids.reshape(-1) == image_token_id).nonzero().squeeze(1)
    if rows.numel() != expected:
        raise ValueError(f"the prompt holds {rows.numel()} image tokens, the frames give {expected}")
    return rows


def check_frames(frames: Sequence[Optional[np.ndarray]], names: Sequence[str]) -> None:
    for name, f in zip(names, frames):
        if f is None:
            raise ValueError(f"camera {name!r}: no frame (MiniCPM-Robot needs every camera it was given)")
        FRAME.check(f, name)


__all__ = ["ImageSettings", "image_settings", "level_table", "PromptBuilder", "MiniCpmInputs", "resize_pil",
           "resize_float", "pixels_from_levels", "frame_size", "image_rows", "check_frames", "RESIZE_MODES",
           "PRE_RESIZE"]
