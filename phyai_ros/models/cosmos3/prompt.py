"""The policy request's text and embodiment: the structured JSON caption Cosmos3 was trained on, the chat
template, the token ids of the conditional and unconditional passes, and the embodiment domain tables.

Why exact: the transformer reads raw token ids, so the caption must be byte-identical to diffusers 0.42.1's
(`json.dumps` default separators and ASCII escapes, the framing sentence of the view point, `int(frames / fps)`
seconds and `round(frames / fps)` for the action's end time, the canvas size, not the image's); the
unconditional pass reads the raw negative prompt ("" when None) with no caption. Both go through the
checkpoint's own chat template (rendered with jinja2 as transformers does) and tokenizer.json, then get the
end-of-turn and <|vision_start|> tokens appended.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from phyai_ros.models.files import CheckpointError, fixed_file, read_json
from phyai_ros.models.bpe import ByteLevelBPE
from phyai_ros.models.chat_template import check_renders, compile_chat_template, read_chat_template

SYSTEM_PROMPT_VIDEO = "You are a helpful assistant who will generate videos from a give prompt."   # sic

# View point -> framing sentence of the caption (the model was trained with these exact sentences).
VIEWPOINTS = {
    "ego_view": "This video is captured from a first-person perspective looking at the scene.",
    "third_person_view": "This video is captured from a third-person perspective looking towards the agent from the "
                         "front.",
    "wrist_view": "This video is captured from a wrist-mounted camera.",
    "concat_view": "This video contains concatenated views from multiple camera perspectives.",
}

# Embodiment domain name -> the action projection's domain id, and -> its raw (unpadded) action width.
DOMAIN_IDS = {"no_action": 0, "av": 1, "camera_pose": 2, "hand_pose": 3, "pusht": 4, "libero": 5, "umi": 6,
              "bridge_orig_lerobot": 7, "droid_lerobot": 8, "robomind-franka": 8, "galbot": 9,
              "robomind-franka-dual": 12, "robomind-ur": 13, "agibotworld": 15, "agibot_gear_gripper": 15,
              "agibot_gear_gripper_ext": 15, "fractal": 20}
RAW_ACTION_DIMS = {"av": 9, "camera_pose": 9, "pusht": 2, "umi": 10, "bridge_orig_lerobot": 10, "droid_lerobot": 10,
                   "robomind-franka": 10, "robomind-franka-dual": 20, "robomind-ur": 10, "galbot": 30,
                   "agibotworld": 29, "agibot_gear_gripper": 29, "agibot_gear_gripper_ext": 29, "fractal": 10,
                   "hand_pose": 57}
ASPECT_RATIOS = ("1,1", "4,3", "3,4", "16,9", "9,16")


@dataclass(frozen=True)
class Domain:
    name: str
    id: int
    raw_dim: int


def domain(name: str, action_dim: int, num_domains: int) -> Domain:
    """The embodiment `name` of a model with `action_dim` action channels and `num_domains` domain slots."""
    if name not in DOMAIN_IDS:
        raise ValueError(f"unknown embodiment domain {name!r}; known: {', '.join(sorted(DOMAIN_IDS))}")
    if name not in RAW_ACTION_DIMS:
        raise ValueError(f"domain {name!r} has no fixed action width (diffusers 0.42.1 supports "
                         f"{', '.join(sorted(RAW_ACTION_DIMS))})")
    d = Domain(name, DOMAIN_IDS[name], RAW_ACTION_DIMS[name])
    if d.raw_dim > action_dim or d.id >= num_domains:
        raise ValueError(f"domain {name!r} (id {d.id}, {d.raw_dim} actions) does not fit this model "
                         f"({num_domains} domains, action_dim {action_dim})")
    return d


def action_caption(instruction: str, view_point: Optional[str], num_frames: int, fps: float, height: int,
                   width: int) -> str:
    """diffusers' _build_action_json_prompt: the instruction as the structured JSON caption."""
    seconds = num_frames / fps if fps > 0 else 0.0
    duration = int(seconds) if seconds >= 0 and math.isfinite(seconds) else 0
    end = round(seconds) if seconds >= 0 and math.isfinite(seconds) else 0
    minutes, secs = divmod(end, 60)
    desc = instruction.strip()
    if desc and not desc.endswith((".", "!", "?")):
        desc = f"{desc}."
    caption = {}
    framing = VIEWPOINTS.get(view_point) if view_point is not None else None
    if framing:
        caption["cinematography"] = {"framing": framing}
    ratio = width / height if height > 0 else 1.0
    aspect = min(ASPECT_RATIOS, key=lambda r: abs(int(r.split(",")[0]) / int(r.split(",")[1]) - ratio))
    caption["actions"] = [{"time": f"0:00-{minutes}:{secs:02d}", "description": desc}]
    caption["duration"] = f"{duration}s"
    caption["fps"] = float(fps)
    caption["resolution"] = {"H": int(height), "W": int(width)}
    caption["aspect_ratio"] = aspect
    return json.dumps(caption)


class ChatTokenizer:
    """The checkpoint's text_tokenizer/ folder: tokenizer.json (byte-level BPE), tokenizer_config.json (eos /
    pad tokens) and the chat template (chat_template.jinja, else tokenizer_config's `chat_template`)."""

    def __init__(self, folder):
        folder = Path(folder)
        self.bpe = ByteLevelBPE(fixed_file(folder, "tokenizer.json"))
        cfg = read_json(fixed_file(folder, "tokenizer_config.json"))
        self.tokens = {k: cfg[k] for k in ("eos_token", "pad_token", "bos_token", "unk_token")
                       if isinstance(cfg.get(k), str)}
        if "eos_token" not in self.tokens:
            raise CheckpointError(f"{folder / 'tokenizer_config.json'}: no eos_token")
        self.eos_id = self.bpe.token_id(self.tokens["eos_token"])
        self.vision_start_id = self.bpe.token_id("<|vision_start|>")
        self.pad_id = self.bpe.token_id(self.tokens["pad_token"]) if "pad_token" in self.tokens else self.eos_id
        self.vocab_size = self.bpe.vocab_size
        self.template = compile_chat_template(read_chat_template(folder), f"{folder}'s chat template")
        # rendered once here under its budget: a template that would hang or exhaust memory is refused at load
        check_renders(self.template, **self._context("pick up the red cup", SYSTEM_PROMPT_VIDEO))

    def _context(self, text: str, system: Optional[str]) -> dict:
        messages = ([{"role": "system", "content": system}] if system is not None else []) + \
            [{"role": "user", "content": text}]
        return {"messages": messages, "add_generation_prompt": True, "add_vision_id": False, **self.tokens}

    def chat_ids(self, text: str, system: Optional[str]) -> List[int]:
        """[system,] user turn with the generation prompt, tokenized, + end-of-turn + <|vision_start|>."""
        rendered = self.template.render(**self._context(text, system))
        return self.bpe.encode(rendered) + [self.eos_id, self.vision_start_id]


def prompt_ids(tok: ChatTokenizer, instruction: str, negative: Optional[str], view_point: str, num_frames: int,
               fps: float, canvas_hw: Tuple[int, int], use_system_prompt: bool, max_tokens: int
               ) -> Tuple[List[int], List[int], str]:
    """(cond ids, uncond ids, cond caption) of one request; a prompt over max_tokens is an error."""
    if not isinstance(instruction, str):
        raise ValueError(f"the instruction must be text, got {type(instruction).__name__}")
    caption = action_caption(instruction, view_point, num_frames, fps, *canvas_hw)
    system = SYSTEM_PROMPT_VIDEO if use_system_prompt else None
    cond, uncond = tok.chat_ids(caption, system), tok.chat_ids("" if negative is None else negative, system)
    for name, ids in (("instruction", cond), ("negative prompt", uncond)):
        if len(ids) > max_tokens:
            raise ValueError(f"the {name} makes a {len(ids)}-token prompt; at most {max_tokens} are allowed "
                             "(max_prompt_tokens)")
    return cond, uncond, caption


__all__ = ["ChatTokenizer", "Domain", "domain", "action_caption", "prompt_ids", "DOMAIN_IDS", "RAW_ACTION_DIMS",
           "VIEWPOINTS", "SYSTEM_PROMPT_VIDEO"]
