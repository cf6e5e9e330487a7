"""MiniCPM-V 4.6's vision side, stateless: NaViT SigLIP tower, 2x2 window-attention merger, downsample-MLP merger.

Frames arrive as one [F, 3, H, W] batch of one size (the processor resizes every view to the same square), so
"attention per frame" (the reference's cu_seqlens) is a batched attention over F, and the patch conv over the
packed [1, 3, p, F*h*w*p] layout is the same convolution per frame.

The window merger attends inside each 2x2 window of patches and then merges every window into one token. The
reference reorders the tokens window-major for the attention, restores the order, and reorders window-major again
to merge; the residual add commutes with the permutation, so here the stream stays window-major from the window
attention on (one gather instead of three), which is also the merged grid's row-major order.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from phyai_ros.layers import dispatch, ops

from .config import MiniCpmConfig, VisionConfig

Tensor = torch.Tensor
Weights = Dict[str, Tensor]
Trace = Optional[Dict[str, Tensor]]
TOWER = "model.vision_tower."
MERGER = "model.merger."
MERGER_EPS = 1e-6


def record(trace: Trace, key: str, value) -> None:
    if trace is not None:
        trace[key] = value.detach() if isinstance(value, Tensor) else value


@lru_cache(maxsize=64)
def position_ids(grid_h: int, grid_w: int, side: int) -> Tensor:
    """Row of the position table for every patch of an h x w grid: fractional coordinates bucketized into the
    table's side x side cells (float32 arithmetic, as the reference's)."""
    boundaries = torch.arange(1 / side, 1.0, 1 / side)
    rows = torch.bucketize(torch.arange(0, 1 - 1e-6, 1 / grid_h), boundaries, right=True)
    cols = torch.bucketize(torch.arange(0, 1 - 1e-6, 1 / grid_w), boundaries, right=True)
    return (rows[:, None] * side + cols).flatten()


@lru_cache(maxsize=64)
def window_order(grid_h: int, grid_w: int, wh: int, ww: int) -> Tensor:
    """Token permutation to window-major order: window (i, j) row-major, then its wh x ww patches row-major."""
    if grid_h % wh or grid_w % ww:
        raise ValueError(f"a {grid_h}x{grid_w} patch grid is not divisible by the {wh}x{ww} window")
    index = torch.arange(grid_h * grid_w).reshape(grid_h // wh, wh, grid_w // ww, ww)
    return index.permute(0, 2, 1, 3).reshape(-1)


@lru_cache(maxsize=64)
def on_device(make, args: tuple, device: torch.device) -> Tensor:
    """``make(*args)`` on ``device``, made once (the first, eager call: a graph capture then only reads it)."""
    return make(*args).to(device)


def _heads(x: Tensor, n: int) -> Tensor:
    b, t, _ = x.shape
    return x.view(b, t, n, -1).transpose(1, 2)


def self_attention(y: Tensor, w: Weights, p: str, n_heads: int) -> Tensor:
    """Unmasked multi-head attention of y [N, T, D] (q / k / v fused at load into ``qkv``) -> [N, T, D] before
    out_proj."""
    q, k, v = dispatch.linear(y, w[p + "qkv.weight"], w[p + "qkv.bias"]).chunk(3, dim=-1)
    a = dispatch.attention(_heads(q, n_heads), _heads(k, n_heads), _heads(v, n_heads))
    return ops.attn_tokens(a)


def mlp(y: Tensor, w: Weights, p: str) -> Tensor:
    return dispatch.linear_gelu_tanh(y, w[p + "mlp.fc1.weight"], w[p + "mlp.fc1.bias"])


def embed(w: Weights, v: VisionConfig, pixels: Tensor) -> Tensor:
    """[F, 3, H, W] normalized frames -> patch embeddings + position rows [F, h*w, D]."""
    grid_h, grid_w = pixels.shape[-2] // v.patch_size, pixels.shape[-1] // v.patch_size
    x = ops.patch_embed(pixels, w[TOWER + "embeddings.patch_embedding.weight"],
                        w[TOWER + "embeddings.patch_embedding.bias"])
    pos = on_device(position_ids, (grid_h, grid_w, v.table_side), x.device)
    return x + w[TOWER + "embeddings.position_embedding.weight"][pos]


def _norm_of(w: Weights, name: str) -> Tuple[Tensor, Tensor]:
    return w[name + ".weight"], w[name + ".bias"]


def window_merge(w: Weights, v: VisionConfig, x: Tensor, y: Tensor, grid: Tuple[int, int]) -> Tensor:
    """The window merger on the residual stream x [F, h*w, D] and its layer_norm1 output y -> [F, h*w/4, D]."""
    p = TOWER + "vit_merger."
    wh, ww = v.window
    n_frames, _, d = x.shape
    order = on_device(window_order, (grid[0], grid[1], wh, ww), x.device)     # window-major from here on
    windows = x[:, order].reshape(-1, wh * ww, d)
    a = self_attention(y[:, order].reshape(-1, wh * ww, d), w, p + "self_attn.", v.num_heads)
    x = windows + dispatch.linear(a, w[p + "self_attn.out_proj.weight"], w[p + "self_attn.out_proj.bias"])
    merged = x.reshape(n_frames, -1, wh * ww * d)
    residual = x.reshape(n_frames, -1, wh * ww, d).mean(dim=2)
    h = dispatch.layer_norm(merged, *_norm_of(w, p + "pre_norm"), v.ln_eps)
    h = dispatch.linear_gelu_tanh(h, w[p + "linear_1.weight"], w[p + "linear_1.bias"])
    return dispatch.linear(h, w[p + "linear_2.weight"], w[p + "linear_2.bias"]) + residual


def tower(w: Weights, v: VisionConfig, pixels: Tensor, trace: Trace = None) -> Tuple[Tensor, Tuple[int, int]]:
    """[F, 3, H, W] -> post_layernorm output [F, T, D] and its token grid (h, w): the encoder layers, the window
    merger after layer ``insert_layer_id`` (the later layers on the merged tokens). Each sublayer's output GEMM,
    residual add and the next LayerNorm are one selector op (linear_add_layer_norm)."""
    grid = (pixels.shape[-2] // v.patch_size, pixels.shape[-1] // v.patch_size)
    x = embed(w, v, pixels)
    record(trace, "vision.embeddings", x)
    y = dispatch.layer_norm(x, *_norm_of(w, TOWER + "encoder.layers.0.layer_norm1"), v.ln_eps)
    for i in range(v.depth):
        p = f"{TOWER}encoder.layers.{i}."
        a = self_attention(y, w, p + "self_attn.", v.num_heads)
        x, y = dispatch.linear_add_layer_norm(x, a, w[p + "self_attn.out_proj.weight"], w[p + "self_attn.out_proj.bias"],
                                              *_norm_of(w, p + "layer_norm2"), v.ln_eps)
        merge_here = i == v.insert_layer_id
        nxt = ("vit_merger.layer_norm1" if merge_here else "post_layernorm") if i + 1 == v.depth or merge_here \
            else f"encoder.layers.{i + 1}.layer_norm1"
        x, y = dispatch.linear_add_layer_norm(x, mlp(y, w, p), w[p + "mlp.fc2.weight"], w[p + "mlp.fc2.bias"],
                                              *_norm_of(w, TOWER + nxt), v.ln_eps)
        record(trace, f"vision.layer{i}", x)
        if merge_here:
            x = window_merge(w, v, x, y, grid)
            grid = (grid[0] // v.window[0], grid[1] // v.window[1])
            record(trace, "vision.vit_merger", x)
            last = i + 1 == v.depth
            y = dispatch.layer_norm(x, *_norm_of(w, TOWER + ("post_layernorm" if last else
                                                             f"encoder.layers.{i + 1}.layer_norm1")), v.ln_eps)
    record(trace, "vision.post_layernorm", y)
    return y, grid


def downsample_merger(w: Weights, c: MiniCpmConfig, x: Tensor, grid: Tuple[int, int]) -> Tensor:
    """Post-norm tokens [F, h*w, D] -> image features [F, h*w / 4**times, text width]: per round, 2x2 groups
    (order (dy, dx)), LayerNorm, Linear, exact GELU, Linear."""
    mh, mw = c.merge
    for r in range(c.merger_times):
        n_frames, _, d = x.shape
        gh, gw = grid
        if gh % mh or gw % mw:
            raise ValueError(f"a {gh}x{gw} token grid is not divisible by the {mh}x{mw} merge kernel")
        x = x.reshape(n_frames, gh // mh, mh, gw // mw, mw, d).permute(0, 1, 3, 2, 4, 5) \
            .reshape(n_frames, (gh // mh) * (gw // mw), mh * mw * d)
        p = f"{MERGER}mlp.{r}."
        h = dispatch.layer_norm(x, *_norm_of(w, p + "pre_norm"), MERGER_EPS)
        h = F.gelu(dispatch.linear(h, w[p + "linear_1.weight"], w[p + "linear_1.bias"]))
        x = dispatch.linear(h, w[p + "linear_2.weight"], w[p + "linear_2.bias"])
        grid = (gh // mh, gw // mw)
    return x


def image_features(w: Weights, c: MiniCpmConfig, pixels: Tensor, trace: Trace = None) -> Tensor:
    """[F, 3, H, W] normalized frames -> [F, tokens per frame, text width]."""
    x, grid = tower(w, c.vision, pixels, trace)
    feats = downsample_merger(w, c, x, grid)
    record(trace, "vision.merger_features", feats.reshape(-1, feats.shape[-1]))
    return feats


def tokens_per_frame(c: MiniCpmConfig, height: int, width: int) -> int:
    v = c.vision
    gh, gw = height // v.patch_size, width // v.patch_size
    if v.insert_layer_id >= 0:
        gh, gw = gh // v.window[0], gw // v.window[1]
    for _ in range(c.merger_times):
        gh, gw = gh // c.merge[0], gw // c.merge[1]
    return gh * gw


def fuse_projections(w: Weights, c: MiniCpmConfig) -> None:
    """In place: each vision attention's q / k / v as one GEMM (``self_attn.qkv``)."""
    blocks = [f"{TOWER}encoder.layers.{i}.self_attn." for i in range(c.vision.depth)] + [f"{TOWER}vit_merger.self_attn."]
    for p in blocks:
        for part in ("weight", "bias"):
            w[p + "qkv." + part] = torch.cat([w.pop(p + n + "_proj." + part) for n in "qkv"], dim=0)
