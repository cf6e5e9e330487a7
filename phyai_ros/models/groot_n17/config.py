"""GR00T N1.7 architecture sizes, read from the two config files that define them.

Why two files: LeRobot's checkpoint config.json carries no architecture; the backbone folder's config.json
(Qwen3VLConfig) sizes the vision tower and the LLM, the base model's config.json (GR00TN17Config) the action
head and where the LLM is cut (select_layer). Field names follow those files so a reader can check them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from phyai_ros.models.files import CheckpointError, Fields


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


# Ranges of the sizes (generous: a full GR00T N1.7 is far inside; a value beyond one is a corrupt or hostile file,
# which would otherwise size an allocation).
_WIDTH, _DEPTH, _HEADS, _TOKENS = 65536, 1024, 1024, 1 << 22


def groot_config(backbone: dict, base: dict, backbone_src: str, base_src: str) -> GrootConfig:
    """Sizes from the backbone's Qwen3VLConfig and the base model's GR00TN17Config (as dicts), each value type- and
    range-checked (files.Fields: a wrong one names its file and key)."""
    bb, b = Fields(backbone, backbone_src), Fields(base, base_src)
    v, t = bb.section("vision_config"), bb.section("text_config")
    rope = t.section("rope_parameters") if "rope_parameters" in t else t.section("rope_scaling", default={})
    if not rope.get("mrope_interleaved", bool, default=False):
        raise CheckpointError(f"{backbone_src}: only interleaved mRoPE (Qwen3-VL) is supported")
    if not b.get("use_alternate_vl_dit", bool, default=True):
        raise CheckpointError(f"{base_src}: only the AlternateVLDiT action head (use_alternate_vl_dit) is supported")
    layers = t.get("num_hidden_layers", int, 1, _DEPTH)
    select = b.get("select_layer", int, 1, _DEPTH)
    if select > layers:
        raise CheckpointError(f"{base_src}: select_layer {select} outside 1..{layers}")
    width = lambda f, k: f.get(k, int, 1, _WIDTH)  # noqa: E731
    vision = VisionConfig(depth=v.get("depth", int, 1, _DEPTH), width=width(v, "hidden_size"),
                          num_heads=v.get("num_heads", int, 1, _HEADS), mlp_dim=width(v, "intermediate_size"),
                          patch_size=v.get("patch_size", int, 1, 1024),
                          temporal_patch_size=v.get("temporal_patch_size", int, 1, 64),
                          merge_size=v.get("spatial_merge_size", int, 1, 64), out_width=width(v, "out_hidden_size"),
                          num_position_embeddings=v.get("num_position_embeddings", int, 1, _TOKENS),
                          deepstack_indexes=v.ints("deepstack_visual_indexes", 0, _DEPTH, default=()))
    heads = t.get("num_attention_heads", int, 1, _HEADS)
    text = TextConfig(vocab_size=t.get("vocab_size", int, 1, _TOKENS), width=width(t, "hidden_size"),
                      mlp_dim=width(t, "intermediate_size"), num_heads=heads,
                      num_kv_heads=t.get("num_key_value_heads", int, 1, _HEADS),
                      head_dim=t.get("head_dim", int, 1, _WIDTH, default=None) or width(t, "hidden_size") // heads,
                      depth=select, rms_eps=t.get("rms_norm_eps", float, 0, 1, default=1e-6),
                      rope_theta=rope.get("rope_theta", float, 1e-6, 1e12,
                                          default=t.get("rope_theta", float, 1e-6, 1e12, default=5000000.0)),
                      mrope_section=rope.ints("mrope_section", 0, _WIDTH, length=3, default=(24, 20, 20)))
    sa, dit = b.section("vl_self_attention_cfg"), b.section("diffusion_model_cfg")
    head = HeadConfig(backbone_dim=width(b, "backbone_embedding_dim"), hidden_size=width(b, "hidden_size"),
                      input_embedding_dim=width(b, "input_embedding_dim"), max_state_dim=b.get("max_state_dim", int, 1, 4096),
                      max_action_dim=b.get("max_action_dim", int, 1, 4096),
                      action_horizon=b.get("action_horizon", int, 1, 1000),
                      max_num_embodiments=b.get("max_num_embodiments", int, 1, 1024),
                      max_seq_len=b.get("max_seq_len", int, 1, _TOKENS),
                      num_steps=b.get("num_inference_timesteps", int, 1, 1000),
                      num_timestep_buckets=b.get("num_timestep_buckets", int, 1, 1 << 20),
                      rtc_ramp_rate=b.get("rtc_ramp_rate", float, 0, 1e6, default=6.0),
                      use_vlln=b.get("use_vlln", bool, default=True),
                      add_pos_embed=b.get("add_pos_embed", bool, default=True),
                      vlsa_layers=sa.get("num_layers", int, 0, _DEPTH),
                      vlsa_heads=sa.get("num_attention_heads", int, 1, _HEADS),
                      vlsa_head_dim=sa.get("attention_head_dim", int, 1, _WIDTH),
                      dit_layers=dit.get("num_layers", int, 1, _DEPTH),
                      dit_heads=dit.get("num_attention_heads", int, 1, _HEADS),
                      dit_head_dim=dit.get("attention_head_dim", int, 1, _WIDTH),
                      dit_output_dim=width(dit, "output_dim"),
                      attend_text_every_n_blocks=b.get("attend_text_every_n_blocks", int, 1, _DEPTH, default=2))
    tokens = TokenIds(image=bb.get("image_token_id", int, 0, _TOKENS),
                      vision_start=bb.get("vision_start_token_id", int, 0, _TOKENS),
                      vision_end=bb.get("vision_end_token_id", int, 0, _TOKENS))
    if head.backbone_dim != text.width:
        raise CheckpointError(f"{base_src}: backbone_embedding_dim {head.backbone_dim} != the LLM width "
                              f"{text.width} of {backbone_src}")
    return GrootConfig(vision, text, head, tokens)
