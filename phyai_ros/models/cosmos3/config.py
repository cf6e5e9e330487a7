"""Cosmos3 sizes and settings: the transformer and VAE configs as diffusers 0.42.1 saves them, the policy's
settings, the full-size defaults and the parameter count.

Why checked here: config.json is read from outside, so every field the model uses is type- and range-checked
once, at load, naming the file; a feature this implementation does not have (sound generation is ignored, a
non-residual Wan 2.1 VAE, attention scales in the VAE) is refused there rather than computed wrongly later.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Tuple

from phyai_ros.layers.quantized import SCHEMES as QUANT_SCHEMES
from phyai_ros.models.files import CheckpointError, Fields

from .prompt import VIEWPOINTS


def _reader(cfg: dict, source: Optional[Path]):
    """g(key, kind[, default]): one typed field of a diffusers config.json (models.files.Fields names the file),
    within the range ``BOUNDS`` gives its key."""
    f = Fields(cfg, source or "config")

    def g(key, kind, *default):
        lo, hi = BOUNDS.get(key, (None, None))
        return f.get(key, kind, lo, hi, **({"default": default[0]} if default else {}))
    return g


# Every dimension and scale a config.json gives, bounded before anything is sized from it: generous around the
# released model (4096 wide, 36 layers, 24 fps, margin 15000, VAE base 160), far below what exhausts a machine
# (1e5 layers took seconds and most of a GB to refuse; a margin of 1e30 overflowed every predict).
BOUNDS = {
    "hidden_size": (1, 65536), "head_dim": (2, 1024), "num_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024), "intermediate_size": (1, 262144), "num_hidden_layers": (1, 1024),
    "latent_channel": (1, 1024), "latent_patch_size": (1, 16), "patch_latent_dim": (1, 262144),
    "action_dim": (1, 4096), "num_embodiment_domains": (1, 4096), "vocab_size": (1, 1 << 22),
    "base_fps": (1, 1000), "unified_3d_mrope_temporal_modality_margin": (0, 1 << 20),
    "rms_norm_eps": (0.0, 1.0), "rope_theta": (1.0, 1e9), "timestep_scale": (0.0, 10.0),
    # the VAE
    "base_dim": (1, 4096), "z_dim": (1, 1024), "num_res_blocks": (1, 16), "patch_size": (1, 16),
    "in_channels": (1, 3 * 16 ** 2), "scale_factor_spatial": (1, 1024), "scale_factor_temporal": (1, 1024),
}
MAX_VAE_LEVELS, MAX_DIM_MULT = 8, 64   # dim_mult: at most 8 levels, each at most 64 x base_dim


@dataclass(frozen=True)
class TransformerConfig:
    """Cosmos3OmniTransformer's architecture (diffusers' config.json names, shortened)."""

    hidden_size: int = 4096
    head_dim: int = 128
    num_heads: int = 32
    num_kv_heads: int = 8
    intermediate_size: int = 12288
    num_layers: int = 36
    hidden_act: str = "silu"                 # "silu" (gate/up/down) or "relu2" (up/down, squared ReLU)
    qk_norm_for_text: bool = True            # q/k RMSNorm per head on the text (understanding) pathway
    use_und_k_norm_for_gen: bool = False     # an extra norm of the text keys the generation tokens read
    rms_norm_eps: float = 1e-6
    rope_axes_dim: Tuple[int, int, int] = (24, 20, 20)
    rope_theta: float = 5e6
    latent_channel: int = 48
    latent_patch_size: int = 2
    action_dim: int = 32
    num_domains: int = 32
    vocab_size: int = 151936
    enable_fps_modulation: bool = True
    base_fps: int = 24
    modality_margin: int = 15000
    reset_spatial_ids: bool = True
    timestep_scale: float = 0.001
    attention_bias: bool = False
    time_channels: int = 256                 # sinusoidal timestep width (diffusers' Timesteps(256))

    def __post_init__(self):
        if self.hidden_act not in ("silu", "relu2"):
            raise ValueError(f"hidden_act {self.hidden_act!r}: Cosmos3 has 'silu' or 'relu2'")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_heads} heads are not a multiple of {self.num_kv_heads} KV heads")
        if self.head_dim % 2 or sum(self.rope_axes_dim) != self.head_dim // 2 \
                or 3 * max(self.rope_axes_dim[1:]) > self.head_dim // 2:
            raise ValueError(f"rope_axes_dim {self.rope_axes_dim} does not fit head_dim {self.head_dim} "
                             "(T+H+W = head_dim/2, the H and W frequencies interleaved every third)")
        for name in ("hidden_size", "head_dim", "num_heads", "num_kv_heads", "intermediate_size", "num_layers",
                     "latent_channel", "latent_patch_size", "action_dim", "num_domains", "vocab_size", "base_fps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def k_norm_for_gen(self) -> bool:
        """diffusers builds `k_norm_und_for_gen` only when the text pathway has no q/k norm of its own."""
        return self.use_und_k_norm_for_gen and not self.qk_norm_for_text

    @property
    def patch_dim(self) -> int:
        return self.latent_channel * self.latent_patch_size ** 2

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_json(cls, cfg: dict, source: Optional[Path] = None) -> "TransformerConfig":
        """diffusers' transformer/config.json -> config; checks the policy needs (action_gen, an action_dim)."""
        g = _reader(cfg, source)
        if cfg.get("_class_name", "Cosmos3OmniTransformer") != "Cosmos3OmniTransformer":
            raise CheckpointError(f"{source}: transformer class {cfg.get('_class_name')!r}, Cosmos3OmniTransformer "
                                  "expected")
        if not g("action_gen", bool, False):
            raise CheckpointError(f"{source}: action_gen is false: this transformer has no action head")
        axes = cfg.get("rope_axes_dim")
        if axes is None:
            scaling = cfg.get("rope_scaling") or {}
            axes = scaling.get("mrope_section", [24, 20, 20]) if isinstance(scaling, dict) else None
        if not (isinstance(axes, list) and len(axes) == 3 and all(isinstance(a, int) and a >= 0 for a in axes)):
            raise CheckpointError(f"{source}: rope_axes_dim must be three non-negative ints, got {axes!r}")
        patch = g("latent_patch_size", int, 2)
        latent = g("latent_channel", int, 48)
        if g("patch_latent_dim", int, latent * patch * patch) != latent * patch * patch:
            raise CheckpointError(f"{source}: patch_latent_dim != latent_channel * latent_patch_size^2")
        try:
            return cls(hidden_size=g("hidden_size", int, 4096), head_dim=g("head_dim", int, 128),
                       num_heads=g("num_attention_heads", int, 32), num_kv_heads=g("num_key_value_heads", int, 8),
                       intermediate_size=g("intermediate_size", int, 12288), num_layers=g("num_hidden_layers", int, 36),
                       hidden_act=g("hidden_act", str, "silu"), qk_norm_for_text=g("qk_norm_for_text", bool, True),
                       use_und_k_norm_for_gen=g("use_und_k_norm_for_gen", bool, False),
                       rms_norm_eps=g("rms_norm_eps", float, 1e-6), rope_axes_dim=tuple(axes),
                       rope_theta=g("rope_theta", float, 5e6), latent_channel=latent, latent_patch_size=patch,
                       action_dim=g("action_dim", int), num_domains=g("num_embodiment_domains", int, 32),
                       vocab_size=g("vocab_size", int, 151936),
                       enable_fps_modulation=g("enable_fps_modulation", bool, True), base_fps=g("base_fps", int, 24),
                       modality_margin=g("unified_3d_mrope_temporal_modality_margin", int, 15000),
                       reset_spatial_ids=g("unified_3d_mrope_reset_spatial_ids", bool, True),
                       timestep_scale=g("timestep_scale", float, 0.001), attention_bias=g("attention_bias", bool, False))
        except ValueError as exc:
            raise CheckpointError(f"{source}: {exc}") from None

    def to_json(self) -> dict:
        """The diffusers config.json of this architecture (what `write_random_checkpoint` saves)."""
        return {"_class_name": "Cosmos3OmniTransformer", "_diffusers_version": "0.42.1", "action_dim": self.action_dim,
                "action_gen": True, "attention_bias": self.attention_bias, "attention_dropout": 0.0,
                "base_fps": self.base_fps, "enable_fps_modulation": self.enable_fps_modulation,
                "head_dim": self.head_dim, "hidden_act": self.hidden_act, "hidden_size": self.hidden_size,
                "intermediate_size": self.intermediate_size, "latent_channel": self.latent_channel,
                "latent_patch_size": self.latent_patch_size, "num_attention_heads": self.num_heads,
                "num_embodiment_domains": self.num_domains, "num_hidden_layers": self.num_layers,
                "num_key_value_heads": self.num_kv_heads, "patch_latent_dim": self.patch_dim,
                "qk_norm_for_text": self.qk_norm_for_text, "rms_norm_eps": self.rms_norm_eps,
                "rope_axes_dim": list(self.rope_axes_dim), "rope_scaling": None, "rope_theta": self.rope_theta,
                "sound_dim": None, "sound_gen": False, "sound_latent_fps": 25.0, "timestep_scale": self.timestep_scale,
                "unified_3d_mrope_reset_spatial_ids": self.reset_spatial_ids,
                "unified_3d_mrope_temporal_modality_margin": self.modality_margin,
                "use_und_k_norm_for_gen": self.use_und_k_norm_for_gen, "vocab_size": self.vocab_size}


@dataclass(frozen=True)
class VaeConfig:
    """The encoder half of diffusers' AutoencoderKLWan (Wan 2.2 layout: residual down blocks, patchified input)."""

    base_dim: int = 160
    z_dim: int = 48
    dim_mult: Tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temporal_downsample: Tuple[bool, ...] = (False, True, True)
    patch_size: int = 2
    in_channels: int = 12
    scale_factor_spatial: int = 16
    scale_factor_temporal: int = 4
    latents_mean: Tuple[float, ...] = field(default=(0.0,) * 48, repr=False)
    latents_std: Tuple[float, ...] = field(default=(1.0,) * 48, repr=False)

    def __post_init__(self):
        if len(self.temporal_downsample) != len(self.dim_mult) - 1:
            raise ValueError(f"temperal_downsample needs {len(self.dim_mult) - 1} entries, got "
                             f"{len(self.temporal_downsample)}")
        if len(self.latents_mean) != self.z_dim or len(self.latents_std) != self.z_dim:
            raise ValueError(f"latents_mean / latents_std need z_dim = {self.z_dim} values")
        if not all(s > 0 and math.isfinite(s) for s in self.latents_std):
            raise ValueError("latents_std must be positive and finite")
        if self.in_channels != 3 * self.patch_size ** 2:
            raise ValueError(f"in_channels {self.in_channels} != 3 * patch_size^2 (RGB patchified)")
        spatial = self.patch_size * 2 ** (len(self.dim_mult) - 1)
        temporal = 2 ** sum(self.temporal_downsample)
        if (spatial, temporal) != (self.scale_factor_spatial, self.scale_factor_temporal):
            raise ValueError(f"the blocks compress {spatial}x spatially and {temporal}x in time, the config says "
                             f"{self.scale_factor_spatial} / {self.scale_factor_temporal}")

    @property
    def dims(self) -> list:
        return [self.base_dim * m for m in (1, *self.dim_mult)]

    @classmethod
    def from_json(cls, cfg: dict, source: Optional[Path] = None) -> "VaeConfig":
        g = _reader(cfg, source)
        if cfg.get("_class_name", "AutoencoderKLWan") != "AutoencoderKLWan":
            raise CheckpointError(f"{source}: VAE class {cfg.get('_class_name')!r}, AutoencoderKLWan expected")
        if not g("is_residual", bool, False):
            raise CheckpointError(f"{source}: a non-residual (Wan 2.1) VAE is not supported; Cosmos3 uses Wan 2.2's")
        if g("attn_scales", list, []):
            raise CheckpointError(f"{source}: VAE attention scales are not supported")
        if cfg.get("patch_size") is None:
            raise CheckpointError(f"{source}: patch_size is required (Wan 2.2's VAE patchifies its input)")
        lists = {k: g(k, list) for k in ("dim_mult", "temperal_downsample", "latents_mean", "latents_std")}
        if not 1 <= len(lists["dim_mult"]) <= MAX_VAE_LEVELS \
                or not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_DIM_MULT
                           for v in lists["dim_mult"]) \
                or not all(isinstance(v, bool) for v in lists["temperal_downsample"]) \
                or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in
                           lists["latents_mean"] + lists["latents_std"]):
            raise CheckpointError(f"{source}: dim_mult (1 to {MAX_VAE_LEVELS} ints in [1, {MAX_DIM_MULT}]) / "
                                  "temperal_downsample / latents_mean / latents_std malformed")
        try:
            return cls(base_dim=g("base_dim", int, 96), z_dim=g("z_dim", int, 16), dim_mult=tuple(lists["dim_mult"]),
                       num_res_blocks=g("num_res_blocks", int, 2),
                       temporal_downsample=tuple(lists["temperal_downsample"]), patch_size=g("patch_size", int),
                       in_channels=g("in_channels", int, 3), scale_factor_spatial=g("scale_factor_spatial", int, 8),
                       scale_factor_temporal=g("scale_factor_temporal", int, 4),
                       latents_mean=tuple(float(v) for v in lists["latents_mean"]),
                       latents_std=tuple(float(v) for v in lists["latents_std"]))
        except ValueError as exc:
            raise CheckpointError(f"{source}: {exc}") from None

    def to_json(self) -> dict:
        return {"_class_name": "AutoencoderKLWan", "_diffusers_version": "0.42.1", "attn_scales": [],
                "base_dim": self.base_dim, "decoder_base_dim": None, "dim_mult": list(self.dim_mult), "dropout": 0.0,
                "in_channels": self.in_channels, "is_residual": True, "latents_mean": list(self.latents_mean),
                "latents_std": list(self.latents_std), "num_res_blocks": self.num_res_blocks,
                "out_channels": self.in_channels, "patch_size": self.patch_size,
                "scale_factor_spatial": self.scale_factor_spatial, "scale_factor_temporal": self.scale_factor_temporal,
                "temperal_downsample": list(self.temporal_downsample), "z_dim": self.z_dim}


@dataclass(frozen=True)
class Cosmos3Settings:
    """How the policy is run (never read from the checkpoint). Defaults: PhyAI's published policy setting
    (4 UniPC steps, guidance 3.0, a 32-action chunk, 480 resolution tier); the pipeline's own defaults are
    35 steps and guidance 6.0, other sources use chunk 16 or guidance 1.0 / 6.0: pass what you run.

    guidance 1.0 runs no unconditional pass (diffusers skips it too). fps is the action / video rate written
    into the caption and the mRoPE time axis."""

    num_steps: int = 4
    guidance: float = 3.0
    chunk_size: int = 32
    fps: float = 24.0
    resolution_tier: int = 480
    view_point: Optional[str] = "ego_view"      # None: no framing sentence in the caption
    domain: str = "droid_lerobot"
    negative_prompt: Optional[str] = None
    max_prompt_tokens: int = 2048
    # The generation pathway's projections quantized when the policy is loaded (quantization.SCHEMES' names, e.g.
    # "w8a8": fp8 weights and per-token fp8 activations on the tensor cores); None keeps the loaded dtype.
    quantization: Optional[str] = None

    def __post_init__(self):
        if not (isinstance(self.num_steps, int) and 1 <= self.num_steps <= 1000):
            raise ValueError(f"num_steps must be an int in [1, 1000], got {self.num_steps!r}")
        if not (isinstance(self.guidance, (int, float)) and math.isfinite(self.guidance) and 0 <= self.guidance <= 100):
            raise ValueError(f"guidance must be a finite number in [0, 100], got {self.guidance!r}")
        if not (isinstance(self.chunk_size, int) and 1 <= self.chunk_size <= 1024):
            raise ValueError(f"chunk_size must be an int in [1, 1024], got {self.chunk_size!r}")
        if not (isinstance(self.fps, (int, float)) and math.isfinite(self.fps) and 0 < self.fps <= 1000):
            raise ValueError(f"fps must be a finite number in (0, 1000], got {self.fps!r}")
        if self.view_point is not None and self.view_point not in VIEWPOINTS:
            raise ValueError(f"view point {self.view_point!r}: one of {', '.join(VIEWPOINTS)} (or None)")
        if self.negative_prompt is not None and not isinstance(self.negative_prompt, str):
            raise ValueError("negative_prompt must be text or None")
        if not (isinstance(self.max_prompt_tokens, int) and self.max_prompt_tokens >= 16):
            raise ValueError(f"max_prompt_tokens must be an int >= 16, got {self.max_prompt_tokens!r}")
        if self.quantization is not None and self.quantization not in QUANT_SCHEMES:
            raise ValueError(f"quantization must be one of {', '.join(QUANT_SCHEMES)} (or None), "
                             f"got {self.quantization!r}")

    @property
    def cfg(self) -> bool:
        """Whether the unconditional pass runs (diffusers: guidance_scale != 1)."""
        return self.guidance != 1.0


# ----------------------------------------------------------------------------- full size and parameter count
# diffusers 0.42.1's Cosmos3OmniTransformer defaults (a Qwen3-VL-8B-shaped text model, doubled into the
# understanding and generation pathways); action_dim is not a default there (None): 32 here, the widest raw
# action table entry (57, hand_pose) aside.
FULL_TRANSFORMER = TransformerConfig()
# Wan 2.2 TI2V-5B's VAE as diffusers converts it (the encoder half; the decoder is not loaded).
FULL_VAE = VaeConfig()


def transformer_parameter_count(c: TransformerConfig, lm_head: bool = True) -> int:
    """Parameters of Cosmos3OmniTransformer as diffusers builds it (lm_head and the text-pathway final norm
    included unless lm_head=False: the policy never reads them)."""
    bias = 1 if c.attention_bias else 0
    attn = 2 * (c.hidden_size * (c.q_dim + 2 * c.kv_dim) + c.q_dim * c.hidden_size
                + bias * (c.q_dim + 2 * c.kv_dim + c.hidden_size))
    attn += 2 * c.head_dim + (2 * c.head_dim if c.qk_norm_for_text else 0) + (c.head_dim if c.k_norm_for_gen else 0)
    mlp = 2 * (3 if c.hidden_act == "silu" else 2) * c.hidden_size * c.intermediate_size
    layer = attn + mlp + 4 * c.hidden_size
    total = c.num_layers * layer + c.vocab_size * c.hidden_size + c.hidden_size   # embed + gen final norm
    total += (c.patch_dim + 1) * c.hidden_size + (c.hidden_size + 1) * c.patch_dim             # proj_in / out
    total += (c.time_channels + 1) * c.hidden_size + (c.hidden_size + 1) * c.hidden_size       # time embedder
    total += 2 * c.num_domains * (c.action_dim * c.hidden_size) + c.num_domains * (c.hidden_size + c.action_dim)
    total += c.hidden_size                                                                      # modality embed
    if lm_head:
        total += c.vocab_size * c.hidden_size + c.hidden_size
    return total


def vae_encoder_parameter_count(c: VaeConfig) -> int:
    """Parameters of the VAE's encoder and quant_conv (what the policy loads)."""
    conv3 = lambda i, o, k=3: o * i * k ** 3 + o  # noqa: E731
    dims = c.dims
    n = conv3(c.in_channels, dims[0])
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        for r in range(c.num_res_blocks):
            cin = a if r == 0 else b
            n += cin + b                                            # norm1 (cin) + norm2 (b) gammas
            n += conv3(cin, b) + conv3(b, b) + (conv3(cin, b, 1) if cin != b else 0)
        if i != len(c.dim_mult) - 1:
            n += b * b * 9 + b                                      # spatial 3x3 stride 2
            if c.temporal_downsample[i]:
                n += b * b * 3 + b                                  # time conv (3, 1, 1)
    d = dims[-1]
    n += 2 * (2 * d + 2 * conv3(d, d))                              # mid resnets
    n += d + 3 * d * d + 3 * d + d * d + d                          # mid attention
    n += d + conv3(d, 2 * c.z_dim) + (2 * c.z_dim) ** 2 + 2 * c.z_dim
    return n


def latent_frames_of_chunk(chunk: int, vae: VaeConfig) -> int:
    """Latent frames of a chunk: the conditioning clip has chunk + 1 frames and the encoder keeps
    1 + tf * floor(chunk / tf) of them (diffusers drops the rest); returns latent T."""
    return chunk // vae.scale_factor_temporal + 1


def head_shards(c: TransformerConfig, tp: int) -> Tuple[int, int]:
    """(q heads, kv heads) per tensor-parallel rank; both must divide."""
    if tp < 1 or c.num_heads % tp or c.num_kv_heads % tp or c.intermediate_size % tp:
        raise ValueError(f"tensor-parallel degree {tp} must divide the {c.num_heads} heads, {c.num_kv_heads} KV heads "
                         f"and intermediate size {c.intermediate_size}")
    return c.num_heads // tp, c.num_kv_heads // tp


__all__ = ["TransformerConfig", "VaeConfig", "Cosmos3Settings", "FULL_TRANSFORMER", "FULL_VAE",
           "transformer_parameter_count", "vae_encoder_parameter_count", "latent_frames_of_chunk", "head_shards"]
