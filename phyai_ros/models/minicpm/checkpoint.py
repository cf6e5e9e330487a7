"""MiniCPM-Robot checkpoint folders: the files, the weight names and the embodiment banks.

A folder holds ``config.json`` (``type: minicpm_robot``, or a parity set's config without a type; its ``head`` /
``sampler`` sections size what the weights cannot say), ``backbone_config.json`` (transformers'
``MiniCPMV4_6Config``), ``processor/`` (tokenizer.json, tokenizer_config.json, chat template, processor_config.json)
and the weights: ``model.safetensors`` (or its shards) or ``weights.safetensors``.

Weight names, mapped onto one canonical set (transformers-native backbone names + the released head names):
- transformers 5.7.0's ``MiniCPMV4_6ForConditionalGeneration`` names (``model.vision_tower.*``, ``model.merger.*``,
  ``model.language_model.*``; the tied ``lm_head.weight`` is not read) -- verified against the parity fixtures;
- the hub remote code's style (``vlm.vpm.*``, ``vlm.resampler.*``, ``vlm.llm.model.*``) -- mapped by prefix only,
  **unverified** (no such checkpoint is reachable here);
- the head: the released ``action_head.*`` names with 3-D banks ``W [E, in, out]``, ``b [E, out]``; a
  single-embodiment checkpoint whose bank layers are PyTorch Linears (``weight [out, in]``, ``bias [out]``) is read
  as one bank.
Everything read is checked: shapes against the architecture the configs describe, no NaN/Inf, files inside the
folder.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Tuple

import torch

from phyai_ros.models.files import (CheckpointError, Fields, fixed_file, inside, read_json, read_safetensors,
                                    read_safetensors_file, require_finite, validate_keys)

from .config import MiniCpmConfig, minicpm_config
from .head import BANK_LAYERS, HEAD

Tensor = torch.Tensor
CHECKPOINT_TYPE = "minicpm_robot"
BACKBONE_CONFIG = "backbone_config.json"
PROCESSOR_DIR = "processor"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "weights.safetensors")
REMOTE_PREFIXES = (("vlm.vpm.", "model.vision_tower."), ("vlm.resampler.", "model.merger."),
                   ("vlm.llm.model.", "model.language_model."))   # unverified: prefix-for-prefix only
IGNORED = ("lm_head.weight", "vlm.llm.lm_head.weight")


@dataclass
class MiniCpmCheckpoint:
    folder: Path
    config: MiniCpmConfig
    weights: Dict[str, Tensor]
    processor_dir: Path
    default_embodiment: int


def is_minicpm_folder(folder: Path) -> bool:
    """config.json of type minicpm_robot, or an untyped one beside a MiniCPM-V 4.6 backbone_config.json (a parity
    set)."""
    config, backbone = fixed_file(folder, "config.json"), fixed_file(folder, BACKBONE_CONFIG)
    if not config.is_file():
        return False
    kind = read_json(config).get("type", "")
    if kind == CHECKPOINT_TYPE:
        return True
    return kind == "" and backbone.is_file() and read_json(backbone).get("model_type") == "minicpmv4_6"


def weight_file(folder: Path) -> Path:
    for name in WEIGHT_FILES:
        path = inside(folder, name, "weights file", folder)
        if path.is_file():
            return path
    raise FileNotFoundError(f"{folder}: no weights ({', '.join(WEIGHT_FILES)})")


def read_weights(folder: Path) -> Dict[str, Tensor]:
    path = weight_file(folder)
    return read_safetensors_file(path) if path.name == "weights.safetensors" else read_safetensors(folder)


def canonical(sd: Dict[str, Tensor], source) -> Dict[str, Tensor]:
    """Any supported naming -> the canonical names; single-embodiment Linears -> one bank each."""
    out: Dict[str, Tensor] = {}
    for key, value in sd.items():
        if key in IGNORED:
            continue
        for old, new in REMOTE_PREFIXES:
            if key.startswith(old):
                key = new + key[len(old):]
                break
        if key in out:
            raise CheckpointError(f"{source}: weight {key} appears under two names")
        out[key] = value
    for layer in BANK_LAYERS:
        w, b = HEAD + layer + ".weight", HEAD + layer + ".bias"
        if w in out:
            if HEAD + layer + ".W" in out:
                raise CheckpointError(f"{source}: {layer} is given both as banks and as a Linear")
            if out[w].dim() != 2 or b not in out or out[b].dim() != 1:
                raise CheckpointError(f"{source}: {layer} as a Linear needs weight [out, in] and bias [out]")
            out[HEAD + layer + ".W"] = out.pop(w).t().contiguous()[None]
            out[HEAD + layer + ".b"] = out.pop(b)[None]
    return out


def head_shapes(sd: Dict[str, Tensor]) -> Dict[str, Tuple[int, ...]]:
    return {k[len(HEAD):]: tuple(v.shape) for k, v in sd.items() if k.startswith(HEAD)}


def key_shapes(c: MiniCpmConfig) -> Dict[str, Tuple[int, ...]]:
    """Every canonical weight and its shape, from the architecture."""
    v, t, h = c.vision, c.text, c.head
    shapes: Dict[str, Tuple[int, ...]] = {}
    tower = "model.vision_tower."
    shapes[tower + "embeddings.patch_embedding.weight"] = (v.width, 3, v.patch_size, v.patch_size)
    shapes[tower + "embeddings.patch_embedding.bias"] = (v.width,)
    shapes[tower + "embeddings.position_embedding.weight"] = (v.table_side ** 2, v.width)

    def attention(p, width):
        for n in "qkv":
            shapes[p + f"{n}_proj.weight"], shapes[p + f"{n}_proj.bias"] = (width, width), (width,)
        shapes[p + "out_proj.weight"], shapes[p + "out_proj.bias"] = (width, width), (width,)

    def norm(p, width):
        shapes[p + ".weight"], shapes[p + ".bias"] = (width,), (width,)

    def linear(p, n_out, n_in):
        shapes[p + ".weight"], shapes[p + ".bias"] = (n_out, n_in), (n_out,)

    for i in range(v.depth):
        p = f"{tower}encoder.layers.{i}."
        attention(p + "self_attn.", v.width)
        norm(p + "layer_norm1", v.width)
        norm(p + "layer_norm2", v.width)
        linear(p + "mlp.fc1", v.mlp_dim, v.width)
        linear(p + "mlp.fc2", v.width, v.mlp_dim)
    norm(tower + "post_layernorm", v.width)
    win = v.window[0] * v.window[1] * v.width
    inner = v.window[0] * v.window[1] * v.mlp_dim     # MiniCPMV4_6VisionConfig.window_intermediate_size
    p = tower + "vit_merger."                         # present in 4x checkpoints too (built, not applied)
    attention(p + "self_attn.", v.width)
    norm(p + "layer_norm1", v.width)
    norm(p + "pre_norm", win)
    linear(p + "linear_1", inner, win)
    linear(p + "linear_2", v.width, inner)
    merged = c.merge[0] * c.merge[1] * v.width
    for r in range(c.merger_times):
        p = f"model.merger.mlp.{r}."
        out = t.width if r + 1 == c.merger_times else v.width
        norm(p + "pre_norm", merged)
        linear(p + "linear_1", merged, merged)
        linear(p + "linear_2", out, merged)
    lm = "model.language_model."
    shapes[lm + "embed_tokens.weight"] = (t.vocab_size, t.width)
    shapes[lm + "norm.weight"] = (t.width,)
    for i, kind in enumerate(t.layer_types):
        p = f"{lm}layers.{i}."
        shapes[p + "input_layernorm.weight"] = shapes[p + "post_attention_layernorm.weight"] = (t.width,)
        shapes[p + "mlp.gate_proj.weight"] = shapes[p + "mlp.up_proj.weight"] = (t.mlp_dim, t.width)
        shapes[p + "mlp.down_proj.weight"] = (t.width, t.mlp_dim)
        if kind == "linear_attention":
            a = p + "linear_attn."
            shapes.update({a + "A_log": (t.gdn_v_heads,), a + "dt_bias": (t.gdn_v_heads,),
                           a + "conv1d.weight": (t.conv_dim, 1, t.conv_kernel),
                           a + "in_proj_qkv.weight": (t.conv_dim, t.width), a + "in_proj_z.weight": (t.value_dim, t.width),
                           a + "in_proj_a.weight": (t.gdn_v_heads, t.width),
                           a + "in_proj_b.weight": (t.gdn_v_heads, t.width),
                           a + "norm.weight": (t.gdn_v_dim,), a + "out_proj.weight": (t.width, t.value_dim)})
        else:
            a = p + "self_attn."
            q, kv = t.num_heads * t.head_dim, t.num_kv_heads * t.head_dim
            shapes.update({a + "q_proj.weight": (2 * q, t.width), a + "k_proj.weight": (kv, t.width),
                           a + "v_proj.weight": (kv, t.width), a + "o_proj.weight": (t.width, q),
                           a + "q_norm.weight": (t.head_dim,), a + "k_norm.weight": (t.head_dim,)})
    e = h.num_embodiments
    bank = {"action_encoder.W1": (h.action_dim + h.state_dim, h.hidden), "action_encoder.W2": (2 * h.hidden, h.hidden),
            "action_encoder.W3": (h.hidden, h.width), "action_decoder.layer1": (h.output_dim, h.decoder_hidden),
            "action_decoder.layer2": (h.decoder_hidden, h.action_dim)}
    for name, (n_in, n_out) in bank.items():
        shapes[HEAD + name + ".W"], shapes[HEAD + name + ".b"] = (e, n_in, n_out), (e, n_out)
    shapes[HEAD + "future_tokens.weight"] = (h.future_tokens, h.width)
    shapes[HEAD + "position_embedding.weight"] = (h.max_seq_len, h.width)
    d = HEAD + "model."
    linear(d + "timestep_encoder.timestep_embedder.linear_1", h.width, h.timestep_channels)
    linear(d + "timestep_encoder.timestep_embedder.linear_2", h.width, h.width)
    linear(d + "proj_out_1", 2 * h.width, h.width)
    linear(d + "proj_out_2", h.output_dim, h.width)
    for i in range(h.depth):
        p = f"{d}transformer_blocks.{i}."
        kv_in = h.cross_dim if i % 2 == 0 else h.width
        linear(p + "attn1.to_q", h.width, h.width)
        linear(p + "attn1.to_k", h.width, kv_in)
        linear(p + "attn1.to_v", h.width, kv_in)
        linear(p + "attn1.to_out.0", h.width, h.width)
        linear(p + "ff.net.0.proj", h.ffn_dim, h.width)
        linear(p + "ff.net.2", h.width, h.ffn_dim)
        linear(p + "norm1.linear", 2 * h.width, h.width)
    return shapes


def load_checkpoint(folder, vlm_dtype: torch.dtype = torch.float32, head_dtype: torch.dtype = torch.float32,
                    device="cpu") -> MiniCpmCheckpoint:
    """Read, map, check and place a checkpoint folder's weights: the backbone in ``vlm_dtype``, the head in
    ``head_dtype``."""
    folder = Path(folder)
    if not is_minicpm_folder(folder):
        raise CheckpointError(f"{folder}: not a MiniCPM-Robot checkpoint (config.json type {CHECKPOINT_TYPE!r}, or "
                              f"a parity set with {BACKBONE_CONFIG})")
    config_path = fixed_file(folder, "config.json")
    backbone_path = fixed_file(folder, BACKBONE_CONFIG)
    config_data = read_json(config_path)
    source = weight_file(folder)
    sd = canonical(read_weights(folder), source)
    config = minicpm_config(read_json(backbone_path), backbone_path, config_data, config_path, head_shapes(sd))
    validate_keys(sd, key_shapes(config))
    require_finite(sd, sd.keys(), source)
    weights = {k: v.to(device=device, dtype=head_dtype if k.startswith(HEAD) else vlm_dtype) for k, v in sd.items()}
    processor = inside(folder, PROCESSOR_DIR, "processor folder", config_path)
    if not processor.is_dir():
        raise FileNotFoundError(f"{folder}: no {PROCESSOR_DIR}/ folder (tokenizer and processor configs)")
    head = Fields(config_data, config_path).section("head", default={})
    default = head.get("embodiment_id", int, 0, config.head.num_embodiments - 1, default=0)
    return MiniCpmCheckpoint(folder, config, weights, processor, default)


__all__ = ["MiniCpmCheckpoint", "load_checkpoint", "key_shapes", "canonical", "is_minicpm_folder", "CHECKPOINT_TYPE",
           "BACKBONE_CONFIG", "PROCESSOR_DIR"]
