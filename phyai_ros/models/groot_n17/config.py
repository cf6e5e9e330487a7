"""GR00T N1.7 architecture sizes, read from the two config files that define them.

Why two files: LeRobot's checkpoint config.json carries no architecture; the backbone folder's config.json
(Qwen3VLConfig) sizes the vision tower and the LLM, the base model's config.json (GR00TN17Config) the action
head and where the LLM is cut (select_layer). Field names follow those files so a reader can check them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from phyai_ros.models.files import CheckpointError


@dataclass(frozen=True)
class VisionConfig:
    """Qwen3-VL vision tower (patchify as a linear map, 2-D RoPE, DeepStack mergers, 2x2 merger)."""
    depth: int
    width: int
    num_heads: int
    mlp_dim: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    out_width: int
    num_position_embeddings: int
    deepstack_indexes: Tuple[int, ...]
    ln_eps: float = 1e-6
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    @property
    def patch_dim(self) -> int:
        return 3 * self.temporal_patch_size * self.patch_size ** 2


@dataclass(frozen=True)
class TextConfig:
    """Qwen3 LLM, of which only `depth` (= select_layer) decoder layers exist and run."""
    vocab_size: int
    width: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    depth: int
    rms_eps: float
    rope_theta: float
    mrope_section: Tuple[int, int, int]


@dataclass(frozen=True)
class HeadConfig:
    """Flow-matching action head: VL adapter, embodiment-specific encoders / decoder, AlternateVLDiT."""
    backbone_dim: int
    hidden_size: int
    input_embedding_dim: int
    max_state_dim: int
    max_action_dim: int
    action_horizon: int
    max_num_embodiments: int
    max_seq_len: int
    num_steps: int
    num_timestep_buckets: int
    rtc_ramp_rate: float
    use_vlln: bool
    add_pos_embed: bool
    vlsa_layers: int
    vlsa_heads: int
    vlsa_head_dim: int
    dit_layers: int
    dit_heads: int
    dit_head_dim: int
    dit_output_dim: int
    attend_text_every_n_blocks: int

    @property
    def dit_width(self) -> int:
        return self.dit_heads * self.dit_head_dim

    @property
    def vlsa_width(self) -> int:
        return self.vlsa_heads * self.vlsa_head_dim


@dataclass(frozen=True)
class TokenIds:
    image: int
    vision_start: int
    vision_end: int


@dataclass(frozen=True)
class GrootConfig:
    vision: VisionConfig
    text: TextConfig
    head: HeadConfig
    tokens: TokenIds


def _get(d: dict, key: str, source: str):
    if key not in d:
        raise CheckpointError(f"{source}: missing field {key!r}")
    return d[key]


def groot_config(backbone: dict, base: dict, backbone_src: str, base_src: str) -> GrootConfig:
    """Sizes from the backbone's Qwen3VLConfig and the base model's GR00TN17Config (as dicts)."""
    v, t = _get(backbone, "vision_config", backbone_src), _get(backbone, "text_config", backbone_src)
    g = lambda d, k: _get(d, k, backbone_src)  # noqa: E731
    rope = t.get("rope_parameters") or t.get("rope_scaling") or {}
    if not rope.get("mrope_interleaved", False):
        raise CheckpointError(f"{backbone_src}: only interleaved mRoPE (Qwen3-VL) is supported")
    if not base.get("use_alternate_vl_dit", True):
        raise CheckpointError(f"{base_src}: only the AlternateVLDiT action head (use_alternate_vl_dit) is supported")
    select = int(_get(base, "select_layer", base_src))
    if not 0 < select <= int(g(t, "num_hidden_layers")):
        raise CheckpointError(f"{base_src}: select_layer {select} outside 1..{g(t, 'num_hidden_layers')}")
    vision = VisionConfig(depth=g(v, "depth"), width=g(v, "hidden_size"), num_heads=g(v, "num_heads"),
                          mlp_dim=g(v, "intermediate_size"), patch_size=g(v, "patch_size"),
                          temporal_patch_size=g(v, "temporal_patch_size"), merge_size=g(v, "spatial_merge_size"),
                          out_width=g(v, "out_hidden_size"), num_position_embeddings=g(v, "num_position_embeddings"),
                          deepstack_indexes=tuple(v.get("deepstack_visual_indexes") or ()))
    text = TextConfig(vocab_size=g(t, "vocab_size"), width=g(t, "hidden_size"), mlp_dim=g(t, "intermediate_size"),
                      num_heads=g(t, "num_attention_heads"), num_kv_heads=g(t, "num_key_value_heads"),
                      head_dim=t.get("head_dim") or g(t, "hidden_size") // g(t, "num_attention_heads"),
                      depth=select, rms_eps=float(t.get("rms_norm_eps", 1e-6)),
                      rope_theta=float(rope.get("rope_theta", t.get("rope_theta", 5000000.0))),
                      mrope_section=tuple(rope.get("mrope_section") or (24, 20, 20)))
    b = lambda k: _get(base, k, base_src)  # noqa: E731
    sa, dit = b("vl_self_attention_cfg"), b("diffusion_model_cfg")
    head = HeadConfig(backbone_dim=b("backbone_embedding_dim"), hidden_size=b("hidden_size"),
                      input_embedding_dim=b("input_embedding_dim"), max_state_dim=b("max_state_dim"),
                      max_action_dim=b("max_action_dim"), action_horizon=b("action_horizon"),
                      max_num_embodiments=b("max_num_embodiments"), max_seq_len=b("max_seq_len"),
                      num_steps=b("num_inference_timesteps"), num_timestep_buckets=b("num_timestep_buckets"),
                      rtc_ramp_rate=float(base.get("rtc_ramp_rate", 6.0)), use_vlln=bool(base.get("use_vlln", True)),
                      add_pos_embed=bool(base.get("add_pos_embed", True)), vlsa_layers=sa["num_layers"],
                      vlsa_heads=sa["num_attention_heads"], vlsa_head_dim=sa["attention_head_dim"],
                      dit_layers=dit["num_layers"], dit_heads=dit["num_attention_heads"],
                      dit_head_dim=dit["attention_head_dim"], dit_output_dim=dit["output_dim"],
                      attend_text_every_n_blocks=int(base.get("attend_text_every_n_blocks", 2)))
    tokens = TokenIds(image=g(backbone, "image_token_id"), vision_start=g(backbone, "vision_start_token_id"),
                      vision_end=g(backbone, "vision_end_token_id"))
    if head.backbone_dim != text.width:
        raise CheckpointError(f"{base_src}: backbone_embedding_dim {head.backbone_dim} != the LLM width "
                              f"{text.width} of {backbone_src}")
    return GrootConfig(vision, text, head, tokens)
