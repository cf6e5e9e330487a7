"""The encoder half of Wan 2.2's VAE (diffusers' AutoencoderKLWan, residual down blocks, 2x2 patchified input)
as stateless functions over its weight dict: the conditioning clip -> the normalized latent mean.

Why one pass over the whole clip: diffusers encodes frame 0 alone, then chunks of 4 frames, carrying each
causal convolution's last frames from chunk to chunk. That equals one pass over the clip with (a) every
stride-1 causal convolution zero-padded by 2 frames in front, (b) each temporal downsampling keeping frame 0
as is and running its stride-2 time convolution over the whole sequence unpadded, (c) the averaging shortcut
padding one zero frame in front; all three hold because the chunk lengths (1, then 4, 2 after one halving, 1
after two) line up with those strides. One pass is one launch sequence instead of 1 + T/4, with the same
arithmetic per output; frames beyond 1 + 4 * floor((F - 1) / 4) are dropped, as diffusers drops them.
"""
from __future__ import annotations

from typing import Dict, Tuple

import torch
import torch.nn.functional as F

from .config import VaeConfig

Tensor = torch.Tensor
Weights = Dict[str, Tensor]
E = "encoder."


# ----------------------------------------------------------------------------- keys
def _block_layout(cfg: VaeConfig):
    """Per down block: (in dim, out dim, temporal downsample, spatial downsample)."""
    dims, last = cfg.dims, len(cfg.dim_mult) - 1
    return [(dims[i], dims[i + 1], cfg.temporal_downsample[i] if i != last else False, i != last)
            for i in range(len(cfg.dim_mult))]


def _resnet_shapes(s: dict, name: str, cin: int, cout: int) -> None:
    s[name + "norm1.gamma"], s[name + "norm2.gamma"] = (cin, 1, 1, 1), (cout, 1, 1, 1)
    s[name + "conv1.weight"], s[name + "conv1.bias"] = (cout, cin, 3, 3, 3), (cout,)
    s[name + "conv2.weight"], s[name + "conv2.bias"] = (cout, cout, 3, 3, 3), (cout,)
    if cin != cout:
        s[name + "conv_shortcut.weight"], s[name + "conv_shortcut.bias"] = (cout, cin, 1, 1, 1), (cout,)


def key_shapes(cfg: VaeConfig) -> Dict[str, Tuple[int, ...]]:
    """The encoder's and quant_conv's keys in diffusers' AutoencoderKLWan state dict (the decoder is not used)."""
    dims, s = cfg.dims, {}
    s[E + "conv_in.weight"], s[E + "conv_in.bias"] = (dims[0], cfg.in_channels, 3, 3, 3), (dims[0],)
    for i, (cin, cout, temporal, down) in enumerate(_block_layout(cfg)):
        for r in range(cfg.num_res_blocks):
            _resnet_shapes(s, f"{E}down_blocks.{i}.resnets.{r}.", cin if r == 0 else cout, cout)
        if down:
            d = f"{E}down_blocks.{i}.downsampler."
            s[d + "resample.1.weight"], s[d + "resample.1.bias"] = (cout, cout, 3, 3), (cout,)
            if temporal:
                s[d + "time_conv.weight"], s[d + "time_conv.bias"] = (cout, cout, 3, 1, 1), (cout,)
    d = dims[-1]
    for r in range(2):
        _resnet_shapes(s, f"{E}mid_block.resnets.{r}.", d, d)
    a = E + "mid_block.attentions.0."
    s.update({a + "norm.gamma": (d, 1, 1), a + "to_qkv.weight": (3 * d, d, 1, 1), a + "to_qkv.bias": (3 * d,),
              a + "proj.weight": (d, d, 1, 1), a + "proj.bias": (d,)})
    s[E + "norm_out.gamma"] = (d, 1, 1, 1)
    s[E + "conv_out.weight"], s[E + "conv_out.bias"] = (2 * cfg.z_dim, d, 3, 3, 3), (2 * cfg.z_dim,)
    s["quant_conv.weight"], s["quant_conv.bias"] = (2 * cfg.z_dim, 2 * cfg.z_dim, 1, 1, 1), (2 * cfg.z_dim,)
    return s


# ----------------------------------------------------------------------------- layers
def _causal_conv(x: Tensor, w: Weights, name: str) -> Tensor:
    """Causal 3x3x3 (or 1x1x1) convolution: zero padding of 2 frames in front, 1 pixel around."""
    weight = w[name + ".weight"]
    k = weight.shape[-1] // 2
    x = F.pad(x, (k, k, k, k, 2 * k, 0))
    return F.conv3d(x, weight, w[name + ".bias"])


def _rms(x: Tensor, gamma: Tensor) -> Tensor:
    """Wan's RMS norm over channels (dim 1): F.normalize * sqrt(C) * gamma (float32 for half inputs)."""
    half = x.dtype in (torch.float16, torch.bfloat16)
    y = F.normalize(x.float() if half else x, dim=1).to(x.dtype)
    return y * (x.shape[1] ** 0.5) * gamma


def _resnet(x: Tensor, w: Weights, name: str) -> Tensor:
    h = _causal_conv(x, w, name + "conv_shortcut") if name + "conv_shortcut.weight" in w else x
    x = _causal_conv(F.silu(_rms(x, w[name + "norm1.gamma"])), w, name + "conv1")
    x = _causal_conv(F.silu(_rms(x, w[name + "norm2.gamma"])), w, name + "conv2")
    return x + h


def _per_frame(x: Tensor, fn) -> Tensor:
    b, c, t, h, wd = x.shape
    y = fn(x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, wd))
    return y.view(b, t, *y.shape[1:]).permute(0, 2, 1, 3, 4)


def _downsample(x: Tensor, w: Weights, name: str, temporal: bool) -> Tensor:
    """Zero pad right / bottom, 3x3 stride-2 convolution per frame; temporal: frame 0 kept, then a stride-2
    (3, 1, 1) time convolution over the whole sequence."""
    x = _per_frame(x, lambda f: F.conv2d(F.pad(f, (0, 1, 0, 1)), w[name + "resample.1.weight"],
                                          w[name + "resample.1.bias"], stride=2))
    if not temporal or x.shape[2] == 1:
        return x
    return torch.cat([x[:, :, :1], F.conv3d(x, w[name + "time_conv.weight"], w[name + "time_conv.bias"],
                                            stride=(2, 1, 1))], dim=2)


def _avg_down(x: Tensor, cout: int, ft: int, fs: int) -> Tensor:
    """The residual shortcut: space/time-to-channel with one zero frame in front when T is odd, then the mean
    over channel groups."""
    pad_t = (ft - x.shape[2] % ft) % ft
    x = F.pad(x, (0, 0, 0, 0, pad_t, 0))
    b, c, t, h, wd = x.shape
    x = x.view(b, c, t // ft, ft, h // fs, fs, wd // fs, fs).permute(0, 1, 3, 5, 7, 2, 4, 6).contiguous()
    factor = ft * fs * fs
    return x.view(b, cout, c * factor // cout, t // ft, h // fs, wd // fs).mean(dim=2)


def _attention(x: Tensor, w: Weights, name: str) -> Tensor:
    """Single-head spatial self-attention per frame."""
    def frame(f):
        bt, c, h, wd = f.shape
        qkv = F.conv2d(_rms(f, w[name + "norm.gamma"]), w[name + "to_qkv.weight"], w[name + "to_qkv.bias"])
        q, k, v = qkv.reshape(bt, 1, 3 * c, h * wd).permute(0, 1, 3, 2).contiguous().chunk(3, dim=-1)
        a = F.scaled_dot_product_attention(q, k, v).squeeze(1).permute(0, 2, 1).reshape(bt, c, h, wd)
        return F.conv2d(a, w[name + "proj.weight"], w[name + "proj.bias"]) + f
    return _per_frame(x, frame)


def patchify(x: Tensor, p: int) -> Tensor:
    """[B, 3, T, H, W] -> [B, 3 p p, T, H / p, W / p] in Wan's channel order (c, column offset, row offset)."""
    b, c, t, h, wd = x.shape
    x = x.view(b, c, t, h // p, p, wd // p, p).permute(0, 1, 6, 4, 2, 3, 5).contiguous()
    return x.view(b, c * p * p, t, h // p, wd // p)


def encode(w: Weights, cfg: VaeConfig, video: Tensor) -> Tensor:
    """video [B, 3, F, H, W] in [-1, 1] (H, W multiples of scale_factor_spatial) -> latent mean
    [B, z, 1 + (F - 1) // tf, H / s, W / s] (unnormalized)."""
    frames = 1 + (video.shape[2] - 1) // cfg.scale_factor_temporal * cfg.scale_factor_temporal
    x = patchify(video[:, :, :frames], cfg.patch_size)
    x = _causal_conv(x, w, E + "conv_in")
    for i, (_, cout, temporal, down) in enumerate(_block_layout(cfg)):
        shortcut = _avg_down(x, cout, 2 if temporal else 1, 2 if down else 1)
        for r in range(cfg.num_res_blocks):
            x = _resnet(x, w, f"{E}down_blocks.{i}.resnets.{r}.")
        if down:
            x = _downsample(x, w, f"{E}down_blocks.{i}.downsampler.", temporal)
        x = x + shortcut
    x = _resnet(x, w, E + "mid_block.resnets.0.")
    x = _attention(x, w, E + "mid_block.attentions.0.")
    x = _resnet(x, w, E + "mid_block.resnets.1.")
    x = _causal_conv(F.silu(_rms(x, w[E + "norm_out.gamma"])), w, E + "conv_out")
    x = F.conv3d(x, w["quant_conv.weight"], w["quant_conv.bias"])
    return x[:, :cfg.z_dim]


def normalized_latent(w: Weights, cfg: VaeConfig, video: Tensor) -> Tensor:
    """encode, then (mu - mean) * (1 / std) per channel (the pipeline's normalization), float32."""
    mu = encode(w, cfg, video).float()
    mean = torch.tensor(cfg.latents_mean, dtype=torch.float32, device=mu.device).view(1, -1, 1, 1, 1)
    inv_std = (1.0 / torch.tensor(cfg.latents_std, dtype=torch.float32, device=mu.device)).view(1, -1, 1, 1, 1)
    return (mu - mean) * inv_std


__all__ = ["key_shapes", "encode", "normalized_latent", "patchify"]
