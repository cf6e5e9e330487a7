"""Flow-matching training pieces for pi0.5, on the same stateless stages the runtime executes.

Why here: a small trained policy (scripts/train_tiny_policy.py) must learn through exactly the modeling code
that inference runs, and its weights must go back into the LeRobot layout the real loaders read. Three
pieces:

* ``flow_matching_loss``: LeRobot's objective (x_t = t * noise + (1 - t) * actions, target u = noise -
  actions, t ~ 0.999 * Beta(1.5, 1) + 0.001), optionally with training-time RTC: for each sample the first
  ``prefix_len[b]`` actions are given clean (x = actions, flow time 0 through per-token adaRMS conditioning,
  exactly what ``rtc.mode: trained`` feeds at inference) and left out of the loss.
* ``train_parameters``: marks the weight buffers of the chosen parts as trainable (the model keeps its
  weights as buffers, fused as the runtime wants them).
* ``lerobot_state_dict``: the inverse of ``checkpoint.load_state_dict`` (un-fuses q/k/v and gate/up), so
  ``load_pi05_checkpoint(save(lerobot_state_dict(model)))`` gives back the same model.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch

from phyai_ros.models.pi.modeling.gemma import GemmaLayer
from phyai_ros.models.pi.modeling.paligemma import PrefixKV
from phyai_ros.models.pi.paligemma_keys import EXP, LM, PROJ, VIS
from phyai_ros.models.pi.modeling.siglip import SiglipEncoder

from .modeling import Pi05Model

Tensor = torch.Tensor
__all__ = ["sample_flow_time", "flow_matching_loss", "train_parameters", "lerobot_state_dict", "TRAINABLE_PARTS"]

# Model attribute prefixes per part: the action expert side (what the trained tiny policy learns) and the
# prefix side (frozen there: its K/V cache is computed once per cached observation).
TRAINABLE_PARTS = {
    "expert": ("expert_layers.", "final_norm_dense_", "action_in_", "action_out_", "time_in_", "time_out_"),
    "vlm": ("vlm_layers.", "embed_tokens"),
    "vision": ("vision.", "proj_"),
}


def sample_flow_time(batch: int, generator: Optional[torch.Generator] = None) -> Tensor:
    """t [batch] float32 = 0.999 * Beta(1.5, 1) + 0.001 (LeRobot / openpi), drawn from ``generator``."""
    # Beta(a, 1) by inversion: u^(1/a).
    u = torch.rand(batch, generator=generator, dtype=torch.float64)
    return (u.pow(1.0 / 1.5) * 0.999 + 0.001).to(torch.float32)


def per_token_modulation(model: Pi05Model, t_tokens: Tensor) -> Tensor:
    """t [B, H] -> adaRMS modulation per token [B, 2*depth+1, 3, H, We] (the 5-d form denoise_velocity takes)."""
    b, h = t_tokens.shape
    mod = model.time_modulation(t_tokens.reshape(-1))          # [B*H, L, 3, W]
    return mod.view(b, h, *mod.shape[1:]).permute(0, 2, 3, 1, 4)


def flow_matching_loss(model: Pi05Model, kv: PrefixKV, prefix_pad: Tensor, actions: Tensor, noise: Tensor,
                       t: Tensor, action_dim: int, prefix_len: Optional[Tensor] = None) -> Tensor:
    """Mean squared velocity error over the real action dims (and, with prefix_len, the free tokens only).

    actions / noise [B, H, A] normalized and zero-padded to max_action_dim; t [B]; prefix_len [B] int (0: no
    clean prefix for that sample)."""
    b, h, _ = actions.shape
    t3 = t[:, None, None]
    x_t = t3 * noise + (1 - t3) * actions
    target = noise - actions
    keep = torch.ones(b, h, dtype=torch.bool, device=actions.device)
    if prefix_len is None:
        v = model.denoise_velocity(x_t, kv, prefix_pad, t=t)
    else:
        frozen = torch.arange(h, device=actions.device)[None, :] < prefix_len[:, None]
        x_t = torch.where(frozen[:, :, None], actions, x_t)
        t_tok = torch.where(frozen, torch.zeros_like(t[:, None]).expand(b, h), t[:, None].expand(b, h))
        v = model.denoise_velocity(x_t, kv, prefix_pad, modulation=per_token_modulation(model, t_tok))
        keep = ~frozen
    err = (v - target)[..., :action_dim].square().mean(-1)
    return (err * keep).sum() / keep.sum().clamp(min=1)


def train_parameters(model: Pi05Model, parts: Sequence[str] = ("expert",)) -> List[Tensor]:
    """Mark the floating-point weight buffers of ``parts`` (keys of TRAINABLE_PARTS) trainable; return them.
    RoPE tables (``*_inv_freq``) are constants and never trained."""
    unknown = [p for p in parts if p not in TRAINABLE_PARTS]
    if unknown:
        raise ValueError(f"unknown parts {unknown}; expected some of {sorted(TRAINABLE_PARTS)}")
    prefixes = tuple(p for part in parts for p in TRAINABLE_PARTS[part])
    out = []
    for name, buf in model.named_buffers():
        train = name.startswith(prefixes) and buf.is_floating_point() and not name.endswith("inv_freq")
        buf.requires_grad_(train)
        if train:
            out.append(buf)
    return out


# ----------------------------------------------------------------------------- back to the LeRobot layout
def _gemma_to_lerobot(layers: Sequence[GemmaLayer], prefix: str, q_dim: int, kv_dim: int, adarms: bool
                      ) -> Dict[str, Tensor]:
    sd = {}
    for i, layer in enumerate(layers):
        L = f"{prefix}layers.{i}."
        q, k, v = layer.qkv_w.split([q_dim, kv_dim, kv_dim])
        gate, up = layer.gate_up_w.chunk(2)
        sd.update({L + "self_attn.q_proj.weight": q, L + "self_attn.k_proj.weight": k,
                   L + "self_attn.v_proj.weight": v, L + "self_attn.o_proj.weight": layer.o_w,
                   L + "mlp.gate_proj.weight": gate, L + "mlp.up_proj.weight": up,
                   L + "mlp.down_proj.weight": layer.down_w})
        if adarms:
            sd.update({L + "input_layernorm.dense.weight": layer.in_norm_dense_w,
                       L + "input_layernorm.dense.bias": layer.in_norm_dense_b,
                       L + "post_attention_layernorm.dense.weight": layer.post_norm_dense_w,
                       L + "post_attention_layernorm.dense.bias": layer.post_norm_dense_b})
        else:
            sd.update({L + "input_layernorm.weight": layer.in_norm_w,
                       L + "post_attention_layernorm.weight": layer.post_norm_w})
    return sd


def _siglip_to_lerobot(enc: SiglipEncoder, prefix: str) -> Dict[str, Tensor]:
    sd = {prefix + "embeddings.patch_embedding.weight": enc.patch_w,
          prefix + "embeddings.patch_embedding.bias": enc.patch_b,
          prefix + "embeddings.position_embedding.weight": enc.pos_emb,
          prefix + "post_layernorm.weight": enc.post_ln_w, prefix + "post_layernorm.bias": enc.post_ln_b}
    for i, layer in enumerate(enc.layers):
        L = f"{prefix}encoder.layers.{i}."
        for n, w, b in zip("qkv", layer.qkv_w.chunk(3), layer.qkv_b.chunk(3)):
            sd[f"{L}self_attn.{n}_proj.weight"], sd[f"{L}self_attn.{n}_proj.bias"] = w, b
        sd.update({L + "layer_norm1.weight": layer.ln1_w, L + "layer_norm1.bias": layer.ln1_b,
                   L + "layer_norm2.weight": layer.ln2_w, L + "layer_norm2.bias": layer.ln2_b,
                   L + "self_attn.out_proj.weight": layer.o_w, L + "self_attn.out_proj.bias": layer.o_b,
                   L + "mlp.fc1.weight": layer.fc1_w, L + "mlp.fc1.bias": layer.fc1_b,
                   L + "mlp.fc2.weight": layer.fc2_w, L + "mlp.fc2.bias": layer.fc2_b})
    return sd


def lerobot_state_dict(model: Pi05Model) -> Dict[str, Tensor]:
    """Every key ``load_pi05_checkpoint`` needs, un-fused, as contiguous detached CPU tensors."""
    cfg = model.cfg
    sd = {"model.action_in_proj.weight": model.action_in_w, "model.action_in_proj.bias": model.action_in_b,
          "model.action_out_proj.weight": model.action_out_w, "model.action_out_proj.bias": model.action_out_b,
          "model.time_mlp_in.weight": model.time_in_w, "model.time_mlp_in.bias": model.time_in_b,
          "model.time_mlp_out.weight": model.time_out_w, "model.time_mlp_out.bias": model.time_out_b,
          EXP + "norm.dense.weight": model.final_norm_dense_w, EXP + "norm.dense.bias": model.final_norm_dense_b,
          LM + "embed_tokens.weight": model.embed_tokens, PROJ + "weight": model.proj_w, PROJ + "bias": model.proj_b}
    sd.update(_gemma_to_lerobot(model.vlm_layers, LM, cfg.vlm.q_dim, cfg.vlm.kv_dim, adarms=False))
    sd.update(_gemma_to_lerobot(model.expert_layers, EXP, cfg.expert.q_dim, cfg.expert.kv_dim, adarms=True))
    sd.update(_siglip_to_lerobot(model.vision, VIS))
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in sd.items()}
