"""LeRobot key layout of the PaliGemma prefix (phyai_ros/models/pi/modeling/paligemma.py) and its loader, shared by the
pi0 and pi0.5 checkpoints, so each policy's checkpoint module only adds its own action-side keys."""
from __future__ import annotations

from typing import Dict, Mapping

import torch

from phyai_ros.models.pi.modeling.config import GemmaConfig, SiglipConfig
from phyai_ros.models.pi.modeling.paligemma import PaliGemmaPrefix

from .checkpoint_io import gemma_key_shapes, load_gemma_layers, load_siglip, siglip_key_shapes

Tensor = torch.Tensor

# LeRobot key layout (PI0Policy / PI05Policy state dicts).
PG = "model.paligemma_with_expert."
LM = PG + "paligemma.model.language_model."
VIS = PG + "paligemma.model.vision_tower.vision_model."
PROJ = PG + "paligemma.model.multi_modal_projector.linear."
EXP = PG + "gemma_expert.model."
# Unused at inference: both lm_heads, and the LM's final norm (the prefix pass only produces K/V).
UNUSED_KEYS = (PG + "paligemma.lm_head.weight", PG + "gemma_expert.lm_head.weight", LM + "norm.weight")


def paligemma_key_shapes(vlm: GemmaConfig, siglip: SiglipConfig, vocab_size: int) -> Dict[str, tuple]:
    s = {LM + "embed_tokens.weight": (vocab_size, vlm.width),
         PROJ + "weight": (vlm.width, siglip.width), PROJ + "bias": (vlm.width,)}
    s.update(gemma_key_shapes(LM, vlm))
    s.update(siglip_key_shapes(VIS, siglip))
    return s


def unused_key_shapes(cfg) -> Dict[str, tuple]:
    """Shapes of UNUSED_KEYS (written by random checkpoints for layout fidelity)."""
    return {UNUSED_KEYS[0]: (cfg.vocab_size, cfg.vlm.width), UNUSED_KEYS[1]: (cfg.vocab_size, cfg.expert.width),
            UNUSED_KEYS[2]: (cfg.vlm.width,)}


@torch.no_grad()
def load_paligemma(model: PaliGemmaPrefix, sd: Mapping[str, Tensor]) -> None:
    model.embed_tokens.copy_(sd[LM + "embed_tokens.weight"])
    model.proj_w.copy_(sd[PROJ + "weight"])
    model.proj_b.copy_(sd[PROJ + "bias"])
    load_gemma_layers(model.vlm_layers, sd, LM, adarms=False)
    load_siglip(model.vision, sd, VIS)
