"""The LeRobot (HF transformers) key schemas of the pi family's SigLIP tower and Gemma stacks, with their
load-time fusion (q/k/v -> one matrix, gate/up -> one matrix). The file readers and key validation every
family uses are in phyai_ros/models/files.py.
"""
from __future__ import annotations

from typing import Dict, Iterable, Mapping, Optional

import torch

from phyai_ros.models.pi.modeling.config import GemmaConfig, SiglipConfig
from phyai_ros.models.pi.modeling.gemma import GemmaLayer
from phyai_ros.models.pi.modeling.siglip import SiglipEncoder
from phyai_ros.models.files import Shapes


def normalize_key_aliases(sd: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Map the older transformers PaliGemma layout (paligemma.language_model.model.*, paligemma.vision_tower.*)
    to the current one (paligemma.model.language_model.*, ...)."""
    repl = (("paligemma.language_model.model.", "paligemma.model.language_model."),
            ("paligemma.language_model.lm_head.", "paligemma.lm_head."),
            ("paligemma.vision_tower.", "paligemma.model.vision_tower."),
            ("paligemma.multi_modal_projector.", "paligemma.model.multi_modal_projector."))
    out = {}
    for k, v in sd.items():
        for old, new in repl:
            if old in k:
                k = k.replace(old, new)
                break
        out[k] = v
    return out


# ---------------------------------------------------------------- SigLIP
def siglip_key_shapes(prefix: str, cfg: SiglipConfig) -> Shapes:
    w, m, p = cfg.width, cfg.mlp_dim, cfg.patch_size
    s: Shapes = {f"{prefix}embeddings.patch_embedding.weight": (w, 3, p, p),
                 f"{prefix}embeddings.patch_embedding.bias": (w,),
                 f"{prefix}embeddings.position_embedding.weight": (cfg.num_patches, w),
                 f"{prefix}post_layernorm.weight": (w,), f"{prefix}post_layernorm.bias": (w,)}
    for i in range(cfg.depth):
        L = f"{prefix}encoder.layers.{i}."
        for n in ("layer_norm1", "layer_norm2"):
            s[f"{L}{n}.weight"] = (w,)
            s[f"{L}{n}.bias"] = (w,)
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            s[f"{L}self_attn.{n}.weight"] = (w, w)
            s[f"{L}self_attn.{n}.bias"] = (w,)
        s[f"{L}mlp.fc1.weight"], s[f"{L}mlp.fc1.bias"] = (m, w), (m,)
        s[f"{L}mlp.fc2.weight"], s[f"{L}mlp.fc2.bias"] = (w, m), (w,)
    return s


@torch.no_grad()
def load_siglip(enc: SiglipEncoder, sd: Mapping[str, torch.Tensor], prefix: str) -> None:
    g = lambda k: sd[prefix + k]  # noqa: E731
    enc.patch_w.copy_(g("embeddings.patch_embedding.weight"))
    enc.patch_b.copy_(g("embeddings.patch_embedding.bias"))
    enc.pos_emb.copy_(g("embeddings.position_embedding.weight"))
    enc.post_ln_w.copy_(g("post_layernorm.weight"))
    enc.post_ln_b.copy_(g("post_layernorm.bias"))
    for i, layer in enumerate(enc.layers):
        L = f"encoder.layers.{i}."
        layer.ln1_w.copy_(g(L + "layer_norm1.weight"))
        layer.ln1_b.copy_(g(L + "layer_norm1.bias"))
        layer.ln2_w.copy_(g(L + "layer_norm2.weight"))
        layer.ln2_b.copy_(g(L + "layer_norm2.bias"))
        layer.qkv_w.copy_(torch.cat([g(f"{L}self_attn.{n}_proj.weight") for n in "qkv"]))
        layer.qkv_b.copy_(torch.cat([g(f"{L}self_attn.{n}_proj.bias") for n in "qkv"]))
        layer.o_w.copy_(g(L + "self_attn.out_proj.weight"))
        layer.o_b.copy_(g(L + "self_attn.out_proj.bias"))
        layer.fc1_w.copy_(g(L + "mlp.fc1.weight"))
        layer.fc1_b.copy_(g(L + "mlp.fc1.bias"))
        layer.fc2_w.copy_(g(L + "mlp.fc2.weight"))
        layer.fc2_b.copy_(g(L + "mlp.fc2.bias"))


# ---------------------------------------------------------------- Gemma
def gemma_key_shapes(prefix: str, cfg: GemmaConfig, cond_dim: Optional[int] = None) -> Shapes:
    """Keys of `prefix`layers.* (HF Gemma layout). cond_dim set: adaRMS norms (`*.dense.weight/bias`)."""
    w, m = cfg.width, cfg.mlp_dim
    s: Shapes = {}
    for i in range(cfg.depth):
        L = f"{prefix}layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm"):
            if cond_dim is None:
                s[f"{L}{n}.weight"] = (w,)
            else:
                s[f"{L}{n}.dense.weight"] = (3 * w, cond_dim)
                s[f"{L}{n}.dense.bias"] = (3 * w,)
        s[f"{L}self_attn.q_proj.weight"] = (cfg.q_dim, w)
        s[f"{L}self_attn.k_proj.weight"] = (cfg.kv_dim, w)
        s[f"{L}self_attn.v_proj.weight"] = (cfg.kv_dim, w)
        s[f"{L}self_attn.o_proj.weight"] = (w, cfg.q_dim)
        s[f"{L}mlp.gate_proj.weight"] = (m, w)
        s[f"{L}mlp.up_proj.weight"] = (m, w)
        s[f"{L}mlp.down_proj.weight"] = (w, m)
    return s


@torch.no_grad()
def load_gemma_layers(layers: Iterable[GemmaLayer], sd: Mapping[str, torch.Tensor], prefix: str,
                      adarms: bool) -> None:
    for i, layer in enumerate(layers):
        g = lambda k: sd[f"{prefix}layers.{i}.{k}"]  # noqa: E731
        layer.qkv_w.copy_(torch.cat([g(f"self_attn.{n}_proj.weight") for n in "qkv"]))
        layer.o_w.copy_(g("self_attn.o_proj.weight"))
        layer.gate_up_w.copy_(torch.cat([g("mlp.gate_proj.weight"), g("mlp.up_proj.weight")]))
        layer.down_w.copy_(g("mlp.down_proj.weight"))
        if adarms:
            layer.in_norm_dense_w.copy_(g("input_layernorm.dense.weight"))
            layer.in_norm_dense_b.copy_(g("input_layernorm.dense.bias"))
            layer.post_norm_dense_w.copy_(g("post_attention_layernorm.dense.weight"))
            layer.post_norm_dense_b.copy_(g("post_attention_layernorm.dense.bias"))
        else:
            layer.in_norm_w.copy_(g("input_layernorm.weight"))
            layer.post_norm_w.copy_(g("post_attention_layernorm.weight"))


def count_layers(sd: Mapping[str, torch.Tensor], prefix: str) -> int:
    """Number of distinct `prefix`{i}. indices present."""
    idx = set()
    for k in sd:
        if k.startswith(prefix):
            head = k[len(prefix):].split(".", 1)[0]
            if head.isdigit():
                idx.add(int(head))
    return max(idx) + 1 if idx else 0
