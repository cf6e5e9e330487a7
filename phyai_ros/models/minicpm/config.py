"""MiniCPM-Robot architecture sizes, read from the files that define them.

Why two files: the backbone (MiniCPM-V 4.6: NaViT SigLIP, window merger, downsample merger, Qwen3.5 hybrid LM)
is sized by ``backbone_config.json`` (transformers' ``MiniCPMV4_6Config.to_dict()``, field names kept so a reader
can check them); the action head by ``config.json``'s ``head`` and ``sampler`` sections, where the weights cannot
say it (heads, steps). Every value is read typed and ranged (``Fields``) before anything is allocated: the upper
bounds are a few times the released model's sizes.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Tuple

from phyai_ros.models.files import CheckpointError, Fields

MAX_WIDTH = 8192
MAX_LAYERS = 128
MAX_HEADS = 256
MAX_VOCAB = 1 << 20
LAYER_TYPES = ("linear_attention", "full_attention")
DOWNSAMPLE_MODES = ("16x", "4x")


@dataclass(frozen=True)
class VisionConfig:
    """NaViT SigLIP tower: patch conv, bucketized position table, per-frame attention, the 2x2 window merger after
    layer ``insert_layer_id`` (16x mode), post LayerNorm."""
    width: int
    mlp_dim: int
    depth: int
    num_heads: int
    image_size: int          # the position table's side is image_size // patch_size
    patch_size: int
    ln_eps: float
    insert_layer_id: int     # -1: no window merger (4x mode)
    window: Tuple[int, int]

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    @property
    def table_side(self) -> int:
        return self.image_size // self.patch_size


@dataclass(frozen=True)
class TextConfig:
    """Qwen3.5 hybrid text model: Gated-DeltaNet (linear) and gated full-attention layers, partial RoPE."""
    vocab_size: int
    width: int
    mlp_dim: int
    layer_types: Tuple[str, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    rope_theta: float
    rotary_dim: int
    mrope_section: Tuple[int, ...]
    gdn_k_heads: int
    gdn_v_heads: int
    gdn_k_dim: int
    gdn_v_dim: int
    conv_kernel: int
    gdn_chunk: int = 64

    @property
    def depth(self) -> int:
        return len(self.layer_types)

    @property
    def key_dim(self) -> int:
        return self.gdn_k_heads * self.gdn_k_dim

    @property
    def value_dim(self) -> int:
        return self.gdn_v_heads * self.gdn_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True)
class HeadConfig:
    """GR00T-style DiT clean-action head: embodiment banks, [future | action] tokens, interleaved cross / self
    attention, a fixed number of clean-action steps."""
    width: int               # DiT inner width = heads x head_dim
    num_heads: int
    depth: int
    ffn_dim: int
    output_dim: int
    cross_dim: int           # K/V in-dim of the even blocks = the LM's width
    hidden: int              # action encoder width (= the DiT width in the released model)
    decoder_hidden: int
    action_dim: int
    state_dim: int
    horizon: int
    future_tokens: int
    max_seq_len: int         # position table rows
    num_embodiments: int
    timestep_channels: int
    num_steps: int = 4
    num_buckets: int = 1000

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    def buckets(self) -> Tuple[int, ...]:
        """The discrete timestep of each step: t = step / N for step N .. 1, bucket min(int(t * 1000), 999)."""
        n = self.num_steps
        return tuple(min(int(step / n * self.num_buckets), self.num_buckets - 1) for step in range(n, 0, -1))

    def times(self) -> Tuple[float, ...]:
        return tuple(step / self.num_steps for step in range(self.num_steps, 0, -1))


@dataclass(frozen=True)
class MiniCpmConfig:
    vision: VisionConfig
    text: TextConfig
    head: HeadConfig
    merge: Tuple[int, int]           # the downsample merger's kernel
    merger_times: int
    image_token_id: int


def vision_config(f: Fields, top: Fields) -> VisionConfig:
    width = f.get("hidden_size", int, 8, MAX_WIDTH)
    heads = f.get("num_attention_heads", int, 1, MAX_HEADS)
    if width % heads:
        raise CheckpointError(f"{f.source}: vision_config.hidden_size {width} is not a multiple of its "
                              f"{heads} heads")
    if f.get("hidden_act", str, default="gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise CheckpointError(f"{f.source}: vision_config.hidden_act must be gelu_pytorch_tanh")
    depth = f.get("num_hidden_layers", int, 1, MAX_LAYERS)
    mode = top.get("downsample_mode", str, default="16x")
    if mode not in DOWNSAMPLE_MODES:
        raise CheckpointError(f"{top.source}: downsample_mode {mode!r} must be one of {DOWNSAMPLE_MODES}")
    # MiniCPMV4_6Config writes its own insert_layer_id into the vision config: the top-level value wins
    insert = top.get("insert_layer_id", int, -1, depth - 1,
                     default=f.get("insert_layer_id", int, -1, depth - 1, default=6))
    patch = f.get("patch_size", int, 1, 64)
    image_size = f.get("image_size", int, patch, 16384)
    window = f.ints("window_kernel_size", 2, 2, length=2, default=(2, 2))
    return VisionConfig(width, f.get("intermediate_size", int, 1, 8 * MAX_WIDTH), depth, heads, image_size, patch,
                        f.get("layer_norm_eps", float, 0.0, 1.0, default=1e-6),
                        insert if mode == "16x" else -1, tuple(window))


def text_config(f: Fields) -> TextConfig:
    width = f.get("hidden_size", int, 8, MAX_WIDTH)
    depth = f.get("num_hidden_layers", int, 1, MAX_LAYERS)
    types = f.get("layer_types", list)
    if len(types) != depth or not all(t in LAYER_TYPES for t in types):
        raise CheckpointError(f"{f.source}: text_config.layer_types must be {depth} of {LAYER_TYPES}")
    if f.get("hidden_act", str, default="silu") != "silu":
        raise CheckpointError(f"{f.source}: text_config.hidden_act must be silu")
    if f.get("attention_bias", bool, default=False):
        raise CheckpointError(f"{f.source}: text_config.attention_bias true is not supported")
    heads = f.get("num_attention_heads", int, 1, MAX_HEADS)
    kv = f.get("num_key_value_heads", int, 1, heads)
    if heads % kv:
        raise CheckpointError(f"{f.source}: text_config: {heads} heads are not a multiple of {kv} KV heads")
    head_dim = f.get("head_dim", int, 2, 1024, default=width // heads)
    rope = f.section("rope_parameters", default={})
    if rope.get("rope_type", str, default="default") != "default":
        raise CheckpointError(f"{f.source}: rope_parameters.rope_type must be default")
    factor = rope.get("partial_rotary_factor", float, 0.0, 1.0,
                      default=f.get("partial_rotary_factor", float, 0.0, 1.0, default=1.0))
    rotary = int(head_dim * factor)
    if rotary < 2 or rotary % 2:
        raise CheckpointError(f"{f.source}: a rotary dimension of {rotary} (head_dim x partial_rotary_factor) must "
                              "be even and >= 2")
    section = rope.ints("mrope_section", 0, rotary, default=(rotary // 2,))
    if sum(section) != rotary // 2:
        raise CheckpointError(f"{f.source}: rope_parameters.mrope_section {list(section)} must sum to "
                              f"{rotary // 2} (half the rotary dimension)")
    k_heads = f.get("linear_num_key_heads", int, 1, MAX_HEADS)
    v_heads = f.get("linear_num_value_heads", int, 1, MAX_HEADS)
    if v_heads % k_heads:
        raise CheckpointError(f"{f.source}: linear_num_value_heads {v_heads} is not a multiple of "
                              f"linear_num_key_heads {k_heads}")
    return TextConfig(
        vocab_size=f.get("vocab_size", int, 1, MAX_VOCAB), width=width,
        mlp_dim=f.get("intermediate_size", int, 1, 8 * MAX_WIDTH), layer_types=tuple(types), num_heads=heads,
        num_kv_heads=kv, head_dim=head_dim, rms_eps=f.get("rms_norm_eps", float, 0.0, 1.0, default=1e-6),
        rope_theta=rope.get("rope_theta", float, 1.0, 1e12, default=1e7), rotary_dim=rotary,
        mrope_section=section, gdn_k_heads=k_heads, gdn_v_heads=v_heads,
        gdn_k_dim=f.get("linear_key_head_dim", int, 1, 1024), gdn_v_dim=f.get("linear_value_head_dim", int, 1, 1024),
        conv_kernel=f.get("linear_conv_kernel_dim", int, 1, 16, default=4))


def backbone_config(data: dict, source) -> Tuple[VisionConfig, TextConfig, Tuple[int, int], int, int]:
    """backbone_config.json -> (vision, text, merge kernel, merger_times, image_token_id)."""
    top = Fields(data, source)
    if top.get("model_type", str, default="minicpmv4_6") != "minicpmv4_6":
        raise CheckpointError(f"{source}: model_type {data.get('model_type')!r}, minicpmv4_6 expected")
    vision = vision_config(top.section("vision_config"), top)
    text = text_config(top.section("text_config"))
    merge = tuple(top.ints("merge_kernel_size", 2, 2, length=2, default=(2, 2)))
    times = top.get("merger_times", int, 1, 4, default=1)
    image_token = top.get("image_token_id", int, 0, text.vocab_size - 1)
    return vision, text, merge, times, image_token


def head_config(head: Fields, sampler: Fields, shapes: dict, text_width: int) -> HeadConfig:
    """Head sizes from the weights' shapes (``shapes``: canonical head key -> shape, banks 3-D) where they say
    them, the rest from config.json's ``head`` / ``sampler`` sections; the two must agree."""
    def shape(key):
        if key not in shapes:
            raise CheckpointError(f"{head.source}: head weight {key} is missing")
        return shapes[key]

    width = shape("model.transformer_blocks.0.attn1.to_q.weight")[0]
    depth = sum(1 for k in shapes if k.startswith("model.transformer_blocks.") and k.endswith(".attn1.to_q.weight"))
    heads = head.get("num_attention_heads", int, 1, MAX_HEADS, default=max(1, width // 64))
    if width % heads:
        raise CheckpointError(f"{head.source}: head width {width} is not a multiple of {heads} heads")
    e, enc_in, hidden = shape("action_encoder.W1.W")
    action_dim = shape("action_decoder.layer2.W")[2]
    state_dim = enc_in - action_dim
    cfg = HeadConfig(
        width=width, num_heads=heads, depth=depth, ffn_dim=shape("model.transformer_blocks.0.ff.net.0.proj.weight")[0],
        output_dim=shape("model.proj_out_2.weight")[0], cross_dim=shape("model.transformer_blocks.0.attn1.to_k.weight")[1],
        hidden=hidden, decoder_hidden=shape("action_decoder.layer1.W")[2], action_dim=action_dim, state_dim=state_dim,
        horizon=head.get("action_horizon", int, 1, 1024), future_tokens=shape("future_tokens.weight")[0],
        max_seq_len=shape("position_embedding.weight")[0], num_embodiments=e,
        timestep_channels=shape("model.timestep_encoder.timestep_embedder.linear_1.weight")[1],
        num_steps=sampler.get("num_steps", int, 1, 64, default=4))
    checks = {"num_layers": cfg.depth, "action_dim": cfg.action_dim, "state_dim": cfg.state_dim,
              "num_future_tokens": cfg.future_tokens, "num_embodiments": cfg.num_embodiments,
              "output_dim": cfg.output_dim, "decoder_hidden": cfg.decoder_hidden, "max_seq_len": cfg.max_seq_len}
    for key, value in checks.items():
        if key in head and head.get(key, int, 0, 1 << 20) != value:
            raise CheckpointError(f"{head.source}: head.{key} = {head.data[key]} but the weights say {value}")
    if state_dim < 0:
        raise CheckpointError(f"{head.source}: action encoder in-dim {enc_in} is less than the action dim {action_dim}")
    if cfg.horizon > cfg.max_seq_len:
        raise CheckpointError(f"{head.source}: action_horizon {cfg.horizon} exceeds the position table's "
                              f"{cfg.max_seq_len} rows")
    if cfg.cross_dim != text_width:
        raise CheckpointError(f"{head.source}: the cross-attention in-dim {cfg.cross_dim} is not the LM's width "
                              f"{text_width}")
    if cfg.timestep_channels % 2 or cfg.hidden % 2:
        raise CheckpointError(f"{head.source}: timestep / action encoder widths must be even")
    if cfg.output_dim != shape("action_decoder.layer1.W")[1]:
        raise CheckpointError(f"{head.source}: DiT output dim {cfg.output_dim} is not the decoder's in-dim")
    return cfg


def minicpm_config(backbone: dict, backbone_source: Path, config: dict, config_source: Path,
                   head_shapes: dict) -> MiniCpmConfig:
    vision, text, merge, times, image_token = backbone_config(backbone, backbone_source)
    top = Fields(config, config_source)
    head = head_config(top.section("head", default={}), top.section("sampler", default={}), head_shapes, text.width)
    return MiniCpmConfig(vision, text, head, merge, times, image_token)


def written_config(backbone: dict, backbone_source, head: dict, num_steps: int = 4) -> MiniCpmConfig:
    """The architecture of a checkpoint this package writes (small ones for tests, the benchmark's full size):
    backbone_config.json's dict and config.json's ``head`` section (the parity sets' field names), the head's
    hidden width the DiT's and its FFN 4x, as in the released model."""
    vision, text, merge, times, image_token = backbone_config(backbone, backbone_source)
    width = head["num_attention_heads"] * head["attention_head_dim"]
    h = HeadConfig(width=width, num_heads=head["num_attention_heads"], depth=head["num_layers"], ffn_dim=4 * width,
                   output_dim=head["output_dim"], cross_dim=text.width, hidden=width,
                   decoder_hidden=head["decoder_hidden"], action_dim=head["action_dim"], state_dim=head["state_dim"],
                   horizon=head["action_horizon"], future_tokens=head["num_future_tokens"],
                   max_seq_len=head["max_seq_len"], num_embodiments=head["num_embodiments"], timestep_channels=256,
                   num_steps=num_steps)
    return MiniCpmConfig(vision, text, h, merge, times, image_token)


__all__ = ["VisionConfig", "TextConfig", "HeadConfig", "MiniCpmConfig", "minicpm_config", "backbone_config",
           "written_config"]
