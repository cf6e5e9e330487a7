"""Reading one case of a Cosmos3 fixture set (inputs.json + inputs.safetensors, the README's layout): its
settings, camera image and recorded noise, for the adapter's case runner (`python -m phyai_ros.predict --case`)
and the parity tests.

A case names its settings (steps, guidance, chunk, fps, tier, view point, domain, negative prompt), the
camera image and the noise the pipeline drew (vision noise over the full latent shape, action noise); the
result is compared with `<case>.final_action` and the intermediates in expected.safetensors.
"""
from __future__ import annotations

from typing import Dict, Tuple

import torch


from .config import Cosmos3Settings

Tensor = torch.Tensor


def case_entry(meta: dict, name: str) -> dict:
    cases = {c.get("name"): c for c in meta.get("cases") or [] if isinstance(c, dict)}
    if name not in cases:
        raise ValueError(f"case {name!r} not in the fixture's inputs.json (cases: {', '.join(map(str, cases))})")
    return cases[name]


def case_settings(case: dict) -> Cosmos3Settings:
    """The case's pipeline call as policy settings."""
    return Cosmos3Settings(num_steps=case["num_inference_steps"], guidance=float(case["guidance_scale"]),
                           chunk_size=case["chunk_size"], fps=float(case["fps"]),
                           resolution_tier=case["resolution_tier"], view_point=case["view_point"],
                           domain=case["domain_name"], negative_prompt=case["negative_prompt"])


def case_inputs(inputs: Dict[str, Tensor], name: str) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
    """(image uint8 [H, W, 3], (vision noise [1, C, T, h, w], action noise [1, chunk, D])) of a case."""
    keys = [f"{name}.{k}" for k in ("image_uint8", "vision_noise", "action_noise")]
    missing = [k for k in keys if k not in inputs]
    if missing:
        raise ValueError(f"inputs lack {missing}")
    image, vision, action = (inputs[k] for k in keys)
    return image, (vision.float(), action.float()[None] if action.dim() == 2 else action.float())


__all__ = ["case_entry", "case_settings", "case_inputs"]
