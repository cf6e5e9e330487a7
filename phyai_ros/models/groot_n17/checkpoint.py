"""GR00T N1.7 checkpoint loading: LeRobot's `checkpoint/` folder plus the two folders it points to.

A LeRobot GR00T checkpoint is config.json (type "groot", `base_model_path`) + model.safetensors (every weight,
keys `_groot_model.*`) + the pre/post-processor pipelines (JSON + step state .safetensors). The architecture
lives elsewhere: `base_model_path` (GR00TN17Config, processor_config.json, embodiment_id.json) and the
backbone folder named by the VLM step (`model_name`: Qwen3VLConfig, tokenizer.json, chat template, image
processor config). Relative paths are resolved against the checkpoint's parent folder, the checkpoint folder
and the working directory (LeRobot uses the working directory); hub names are not fetched.

Every weight key and shape is checked against the architecture at once; a mismatch raises one
CheckpointError naming the file and listing missing / unexpected / mis-shaped keys.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

from phyai_ros.layers.quantized import QuantizedWeight
from phyai_ros.models.files import (CheckpointError, Shapes, fixed_file, inside, read_json, read_safetensors,
                                    read_safetensors_file, require_finite, validate_keys)
from phyai_ros.models.quantized_checkpoint import read_manifest


from .config import GrootConfig, HeadConfig, TextConfig, VisionConfig, groot_config
from .quantization import quantized_state
from .keys import (DECODE_STEP, DIT, EMBED, HEAD, LLM, PACK_STEP, POLICY_TYPE, PREFIX, UNNORM_STEP, UNUSED, VIS,
                   VLM_STEP, VLSA)


__all__ = ["GrootCheckpoint", "load_groot_checkpoint", "groot_key_shapes", "CheckpointError"]


# ------------------------------------------------------------------ key schema
def _linear(s: Shapes, name: str, out: int, inp: int, bias: bool = True) -> None:
    s[name + ".weight"] = (out, inp)
    if bias:
        s[name + ".bias"] = (out,)


def _norm(s: Shapes, name: str, dim: int) -> None:
    s[name + ".weight"], s[name + ".bias"] = (dim,), (dim,)


def vision_key_shapes(v: VisionConfig) -> Shapes:
    w, m = v.width, v.mlp_dim
    s: Shapes = {VIS + "patch_embed.proj.weight": (w, 3, v.temporal_patch_size, v.patch_size, v.patch_size),
                 VIS + "patch_embed.proj.bias": (w,), VIS + "pos_embed.weight": (v.num_position_embeddings, w)}
    for i in range(v.depth):
        b = f"{VIS}blocks.{i}."
        _norm(s, b + "norm1", w)
        _norm(s, b + "norm2", w)
        _linear(s, b + "attn.qkv", 3 * w, w)
        _linear(s, b + "attn.proj", w, w)
        _linear(s, b + "mlp.linear_fc1", m, w)
        _linear(s, b + "mlp.linear_fc2", w, m)
    merged = w * v.merge_size ** 2
    for name, norm_dim in [("merger", w)] + [(f"deepstack_merger_list.{j}", merged)
                                             for j in range(len(v.deepstack_indexes))]:
        _norm(s, VIS + name + ".norm", norm_dim)
        _linear(s, VIS + name + ".linear_fc1", merged, merged)
        _linear(s, VIS + name + ".linear_fc2", v.out_width, merged)
    return s


def text_key_shapes(t: TextConfig) -> Shapes:
    w, q, kv = t.width, t.num_heads * t.head_dim, t.num_kv_heads * t.head_dim
    s: Shapes = {EMBED: (t.vocab_size, w)}
    for i in range(t.depth):
        b = f"{LLM}layers.{i}."
        s[b + "input_layernorm.weight"] = s[b + "post_attention_layernorm.weight"] = (w,)
        s[b + "self_attn.q_norm.weight"] = s[b + "self_attn.k_norm.weight"] = (t.head_dim,)
        for name, out, inp in (("q_proj", q, w), ("k_proj", kv, w), ("v_proj", kv, w), ("o_proj", w, q)):
            _linear(s, b + "self_attn." + name, out, inp, bias=False)
        for name, out, inp in (("gate_proj", t.mlp_dim, w), ("up_proj", t.mlp_dim, w), ("down_proj", w, t.mlp_dim)):
            _linear(s, b + "mlp." + name, out, inp, bias=False)
    return s


def _attention_block(s: Shapes, b: str, width: int, inner: int, kv_in: int) -> None:
    _linear(s, b + "attn1.to_q", inner, width)
    _linear(s, b + "attn1.to_k", inner, kv_in)
    _linear(s, b + "attn1.to_v", inner, kv_in)
    _linear(s, b + "attn1.to_out.0", width, inner)
    _linear(s, b + "ff.net.0.proj", 4 * width, width)
    _linear(s, b + "ff.net.2", width, 4 * width)


def _category_mlp(s: Shapes, name: str, n: int, dims: Tuple[int, ...], layer_names: Tuple[str, ...]) -> None:
    for layer, (inp, out) in zip(layer_names, zip(dims, dims[1:])):
        s[f"{name}.{layer}.W"], s[f"{name}.{layer}.b"] = (n, inp, out), (n, out)


def head_key_shapes(h: HeadConfig) -> Shapes:
    d, c, e, n = h.backbone_dim, h.dit_width, h.input_embedding_dim, h.max_num_embodiments
    s: Shapes = {HEAD + "position_embedding.weight": (h.max_seq_len, e)}
    if h.use_vlln:
        _norm(s, HEAD + "vlln", d)
    for i in range(h.vlsa_layers):
        _norm(s, f"{VLSA}{i}.norm1", d)
        _norm(s, f"{VLSA}{i}.norm3", d)
        _attention_block(s, f"{VLSA}{i}.", d, h.vlsa_width, d)
    _linear(s, DIT + "timestep_encoder.timestep_embedder.linear_1", c, 256)
    _linear(s, DIT + "timestep_encoder.timestep_embedder.linear_2", c, c)
    for i in range(h.dit_layers):
        b = f"{DIT}transformer_blocks.{i}."
        _linear(s, b + "norm1.linear", 2 * c, c)
        _attention_block(s, b, c, c, d if i % 2 == 0 else c)
    _linear(s, DIT + "proj_out_1", 2 * c, c)
    _linear(s, DIT + "proj_out_2", h.dit_output_dim, c)
    _category_mlp(s, HEAD + "state_encoder", n, (h.max_state_dim, h.hidden_size, e), ("layer1", "layer2"))
    _category_mlp(s, HEAD + "action_encoder", n, (h.max_action_dim, e), ("W1",))
    _category_mlp(s, HEAD + "action_encoder", n, (2 * e, e, e), ("W2", "W3"))
    _category_mlp(s, HEAD + "action_decoder", n, (h.dit_output_dim, h.hidden_size, h.max_action_dim),
                  ("layer1", "layer2"))
    return s


def groot_key_shapes(cfg: GrootConfig) -> Shapes:
    """Every weight inference reads, with its shape (keys without LeRobot's `_groot_model.` prefix)."""
    return {**vision_key_shapes(cfg.vision), **text_key_shapes(cfg.text), **head_key_shapes(cfg.head)}


# ------------------------------------------------------------------ folders and pipelines
def resolve_folder(name, ckpt_dir: Path, what: str) -> Path:
    """A folder named in the checkpoint's JSON, relative paths tried against the checkpoint's parent, the
    checkpoint and the working directory. An empty name is refused (it would be the checkpoint's parent folder)."""
    if not isinstance(name, str) or not name.strip():
        raise CheckpointError(f"checkpoint {ckpt_dir}: {what} must name a folder, got {name!r}")
    p = Path(name)
    cands = [p] if p.is_absolute() else [ckpt_dir.parent / p, ckpt_dir / p, Path.cwd() / p]
    for c in cands:
        if c.is_dir():
            return c.resolve()
    raise FileNotFoundError(f"checkpoint {ckpt_dir}: {what} {name!r} is not a local folder (tried "
                            f"{', '.join(str(c) for c in cands)}; hub names are not downloaded: pass the folder)")


def _steps(path: Path) -> Dict[str, dict]:
    """registry_name -> step (config + state_file) of a LeRobot pipeline JSON."""
    steps = read_json(path).get("steps")
    if not isinstance(steps, list):
        raise CheckpointError(f"{path}: no 'steps' list")
    return {s.get("registry_name"): s for s in steps if isinstance(s, dict)}


def _step(steps: Dict[str, dict], names: Tuple[str, ...], path: Path) -> Tuple[str, dict]:
    for n in names:
        if n in steps:
            return n, steps[n]
    raise CheckpointError(f"{path}: none of the steps {list(names)} (found {sorted(k for k in steps if k)})")


def _state_file(step: dict, ckpt_dir: Path, source: Path) -> Dict[str, torch.Tensor]:
    """The step's state tensors (none without a state_file): the file must lie inside the checkpoint folder."""
    if step.get("state_file") is None:
        return {}
    what = f"step {step.get('registry_name')!r} state_file"
    return read_safetensors_file(inside(ckpt_dir, step["state_file"], what, source))


@dataclass
class Pipelines:
    """What the pre/post-processor pipelines of the checkpoint say (configs and their state tensors)."""
    pack: dict                                  # groot_n1_7_pack_inputs_v1 config
    pack_state: Dict[str, torch.Tensor]         # its state file (flat observation.state.* / action.* stats)
    vlm: dict                                   # groot_n1_7_vlm_encode_v1 config (geometry, model_name)
    post_name: str                              # UNNORM_STEP or DECODE_STEP
    post: dict
    post_state: Dict[str, torch.Tensor]


def read_pipelines(ckpt_dir: Path) -> Pipelines:
    pre_path, post_path = fixed_file(ckpt_dir, "policy_preprocessor.json"), fixed_file(ckpt_dir, "policy_postprocessor.json")
    pre, post = _steps(pre_path), _steps(post_path)
    _, pack = _step(pre, (PACK_STEP,), pre_path)
    _, vlm = _step(pre, (VLM_STEP,), pre_path)
    post_name, post_step = _step(post, (UNNORM_STEP, DECODE_STEP), post_path)
    configs = []
    for step, path in ((pack, pre_path), (vlm, pre_path), (post_step, post_path)):
        config = step.get("config") or {}
        if not isinstance(config, dict):
            raise CheckpointError(f"{path}: step {step.get('registry_name')!r} config must be an object")
        configs.append(config)
    return Pipelines(configs[0], _state_file(pack, ckpt_dir, pre_path), configs[1], post_name, configs[2],
                     _state_file(post_step, ckpt_dir, post_path))


# ------------------------------------------------------------------ loading
@dataclass
class GrootCheckpoint:
    weights: Dict[str, torch.Tensor]            # groot_key_shapes' keys, on the device, in the dtype
    config: GrootConfig
    pipelines: Pipelines
    ckpt_dir: Path
    base_dir: Path
    backbone_dir: Path
    lerobot_config: dict
    base_processor: dict = field(default_factory=dict)
    embodiment_ids: Dict[str, int] = field(default_factory=dict)

    @property
    def camera_keys(self) -> List[str]:
        feats = self.lerobot_config.get("input_features") or {}
        return [k for k, f in feats.items() if (f or {}).get("type") == "VISUAL"]


def _canonical_keys(sd: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """LeRobot's `_groot_model.` prefix dropped; the raw GR00T layout's `embed_tokens` renamed to the tied
    `lm_head` name LeRobot stores."""
    out = {}
    for k, v in sd.items():
        k = k[len(PREFIX):] if k.startswith(PREFIX) else k
        if k == LLM + "embed_tokens.weight":
            k = EMBED
        out[k] = v
    return out


def _drop_cut_layers(sd: Dict[str, torch.Tensor], depth: int) -> Dict[str, torch.Tensor]:
    """A raw base checkpoint holds every LLM layer; the ones at and after select_layer never run."""
    def kept(k: str) -> bool:
        if not k.startswith(LLM + "layers."):
            return True
        return int(k[len(LLM + "layers."):].split(".", 1)[0]) < depth
    return {k: v for k, v in sd.items() if kept(k)}


def load_groot_checkpoint(ckpt_dir, device="cpu", dtype: torch.dtype = torch.float32,
                          base_model: Optional[str] = None, backbone: Optional[str] = None) -> GrootCheckpoint:
    """Load a LeRobot GR00T N1.7 checkpoint folder (see module docstring). base_model / backbone override the
    folders named in its JSON files."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        raise FileNotFoundError(f"checkpoint folder not found: {ckpt_dir}")
    lr = read_json(fixed_file(ckpt_dir, "config.json"))
    if lr.get("type") != POLICY_TYPE:
        raise CheckpointError(f"checkpoint {ckpt_dir}: config.json says type {lr.get('type')!r}, not {POLICY_TYPE!r}")
    pipes = read_pipelines(ckpt_dir)
    manifest = read_manifest(ckpt_dir)   # a quantized folder (quantization.py) names its source's folders
    if manifest is not None:
        base_model, backbone = base_model or manifest.get("base_model"), backbone or manifest.get("backbone")
    base_dir = resolve_folder(base_model or lr.get("base_model_path"), ckpt_dir, "base_model_path")
    bb_dir = resolve_folder(backbone or pipes.vlm.get("model_name"), ckpt_dir, "backbone (VLM step model_name)")
    cfg = groot_config(read_json(fixed_file(bb_dir, "config.json")), read_json(fixed_file(base_dir, "config.json")),
                       str(bb_dir / "config.json"), str(base_dir / "config.json"))
    weights_file = ckpt_dir / "model.safetensors"
    sd = _drop_cut_layers(_canonical_keys(read_safetensors(ckpt_dir)), cfg.text.depth)
    if manifest is not None:
        sd = quantized_state(sd, manifest, weights_file)
    expected = groot_key_shapes(cfg)
    try:
        validate_keys(sd, expected, ignored=UNUSED)
    except CheckpointError as exc:
        raise CheckpointError(f"{weights_file}: {exc}") from None
    floats = [k for k in expected if not isinstance(sd[k], QuantizedWeight)]
    require_finite(sd, floats, weights_file)
    weights = {k: sd[k].to(device=device, dtype=dtype) if k in floats else sd[k].to(device) for k in expected}
    proc = fixed_file(base_dir, "processor_config.json")
    ids = fixed_file(base_dir, "embodiment_id.json")
    return GrootCheckpoint(weights, cfg, pipes, ckpt_dir, base_dir, bb_dir, lr,
                           read_json(proc) if proc.is_file() else {},
                           {k: int(v) for k, v in read_json(ids).items()} if ids.is_file() else {})
