"""Stateless Qwen3-VL backbone of GR00T N1.7: vision tower (2-D RoPE, DeepStack, 2x2 merger) and the LLM cut
at select_layer (interleaved mRoPE, q/k RMSNorm, GQA). Weights are a flat dict with the LeRobot key names
(checkpoint.py); every function is plain torch, so the runner can capture or replace any stage.

Why the details matter (each moves the features past fp32 noise): the merger normalizes BEFORE the 2x2
merge and the DeepStack mergers AFTER it; after an image the mRoPE position advances by the merged grid's
longer side, not by its token count; left-pad query rows have an all-masked attention row whose output is
exactly 0 (their MLP still runs); the features are the last kept layer's output, before the final norm.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from phyai_ros.layers.quantized import QuantizedWeight
from phyai_ros.layers import dispatch, ops
from phyai_ros.runtime.lru import LruCache

from .keys import EMBED, LLM, VIS
from .config import TextConfig, VisionConfig

PLAN_CACHE = 34   # backbone plans kept: the image grid's vision tables and the last token layouts

Tensor = torch.Tensor
Weights = Dict[str, Tensor]
Trace = Optional[Dict[str, Tensor]]


# ------------------------------------------------------------------ shared pieces
def linear(x: Tensor, w: Weights, name: str) -> Tensor:
    """Through the selector: few rows (the DiT's 41 tokens) stream the weights in a skinny kernel, bias in its
    epilogue; many rows run the library GEMM."""
    return dispatch.linear(x, w[name + ".weight"], w.get(name + ".bias"))


def layer_norm(x: Tensor, w: Optional[Weights], name: Optional[str], eps: float) -> Tensor:
    """LayerNorm over the last dim (statistics in float32), through the operator selector; affine from
    w[name.weight / name.bias] when name is given."""
    weight, bias = (w[name + ".weight"], w[name + ".bias"]) if name else ops.unit_affine(x.shape[-1], x)
    return dispatch.layer_norm(x, weight, bias, eps)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Qwen RMSNorm: normalized in float32, times weight (not 1 + weight), through the selector (one kernel)."""
    return dispatch.rms_norm(x, weight, eps, weight_offset=0.0)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """[B, H, Tq, d] x [B, Hkv, Tk, d] -> [B, Tq, H*d] through the selector's attention op (grouped kv heads;
    mask additive, broadcastable to [B, 1, Tq, Tk]: see additive_mask)."""
    a = dispatch.attention(q, k, v, mask)
    b, h, t, d = a.shape
    return a.transpose(1, 2).reshape(b, t, h * d)


def additive_mask(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """bool [B, Tq, Tk] (True = attend) -> additive [B, 1, Tq, Tk], made once per forward, not per layer."""
    return ops.bool_to_additive_mask(allowed, dtype)


# ------------------------------------------------------------------ vision
def merge_order(grid: Tensor, merge: int) -> List[Tuple[Tensor, Tensor]]:
    """Per image, the (row, col) patch coordinates in merge-block order (each 2x2 block contiguous)."""
    out = []
    for t, h, w in grid.tolist():
        rows = torch.arange(h).view(h // merge, merge, 1, 1).expand(h // merge, merge, w // merge, merge)
        cols = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, w // merge, merge)
        rows, cols = rows.permute(0, 2, 1, 3).reshape(-1), cols.permute(0, 2, 1, 3).reshape(-1)
        out.append((rows.repeat(t), cols.repeat(t)))
    return out


def position_embedding(w: Weights, v: VisionConfig, grid: Tensor) -> Tensor:
    """The learned side x side table bilinearly interpolated to each image's patch grid, merge-block order."""
    table = w[VIS + "pos_embed.weight"]
    side = int(round(v.num_position_embeddings ** 0.5))
    out = []
    for (t, h, wd), (rows, cols) in zip(grid.tolist(), merge_order(grid, v.merge_size)):
        hi, wi = torch.linspace(0, side - 1, h), torch.linspace(0, side - 1, wd)
        h0, w0 = hi.int(), wi.int()
        h1, w1 = (h0 + 1).clamp(max=side - 1), (w0 + 1).clamp(max=side - 1)
        dh, dw = hi - h0, wi - w0
        corners = ((h0, w0, (1 - dh)[:, None] * (1 - dw)[None]), (h0, w1, (1 - dh)[:, None] * dw[None]),
                   (h1, w0, dh[:, None] * (1 - dw)[None]), (h1, w1, dh[:, None] * dw[None]))
        emb = 0
        for hh, ww, wt in corners:
            idx = (hh[:, None] * side + ww[None]).flatten().to(table.device)
            emb = emb + table[idx] * wt.flatten().to(table)[:, None]
        flat = (rows * wd + cols).to(table.device)
        out.append(emb[flat])
    return torch.cat(out)


def vision_rope(v: VisionConfig, grid: Tensor, device) -> Tuple[Tensor, Tensor]:
    """cos / sin [N_patches, head_dim]: half the rotary dims from the patch row, half from the column."""
    dim = v.head_dim // 2
    inv = 1.0 / (v.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))
    rows, cols = (torch.cat(x).to(device) for x in zip(*merge_order(grid, v.merge_size)))
    freqs = torch.cat([rows[:, None].float() * inv, cols[:, None].float() * inv], dim=-1)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def vision_attention(x: Tensor, w: Weights, name: str, v: VisionConfig, cos: Tensor, sin: Tensor,
                     n_images: int) -> Tensor:
    """Self-attention within each image, before its output projection ([N, width]): all images have one size
    (the processor makes them so), so they run as one batch of n_images."""
    n, per = x.shape[0], x.shape[0] // n_images
    qkv = linear(x, w, name + ".qkv").view(n_images, per, -1)
    q, k, val = dispatch.qkv_norm_rope(qkv, cos.view(n_images, per, -1), sin.view(n_images, per, -1),
                                       v.num_heads, v.num_heads, v.head_dim)
    return attention(q, k, val).reshape(n, v.width)


def vision_block(x: Tensor, normed: Tensor, w: Weights, i: int, v: VisionConfig, cos: Tensor, sin: Tensor,
                 n_images: int) -> Tuple[Tensor, Optional[Tensor]]:
    """(x, norm1(x)) -> (x after the block, the next block's norm1 of it; None after the last block). Each
    residual add runs with the LayerNorm after it (and the projection's bias) as one selector op,
    linear_add_layer_norm, as the DiT's do: no separate add kernel."""
    b = f"{VIS}blocks.{i}."
    a = vision_attention(normed, w, b + "attn", v, cos, sin, n_images)
    x, y = dispatch.linear_add_layer_norm(x, a, w[b + "attn.proj.weight"], w[b + "attn.proj.bias"],
                                          w[b + "norm2.weight"], w[b + "norm2.bias"], v.ln_eps)
    h = dispatch.linear_gelu_tanh(y, w[b + "mlp.linear_fc1.weight"], w[b + "mlp.linear_fc1.bias"])
    if i + 1 == v.depth:
        return x + linear(h, w, b + "mlp.linear_fc2"), None
    nb = f"{VIS}blocks.{i + 1}."
    return dispatch.linear_add_layer_norm(x, h, w[b + "mlp.linear_fc2.weight"], w[b + "mlp.linear_fc2.bias"],
                                          w[nb + "norm1.weight"], w[nb + "norm1.bias"], v.ln_eps)


def patch_merger(x: Tensor, w: Weights, name: str, v: VisionConfig, norm_after_merge: bool) -> Tensor:
    """2x2 merge + MLP: the main merger normalizes each patch first, the DeepStack ones the merged rows."""
    merged = v.width * v.merge_size ** 2
    if norm_after_merge:
        x = layer_norm(x.reshape(-1, merged), w, VIS + name + ".norm", v.ln_eps)
    else:
        x = layer_norm(x, w, VIS + name + ".norm", v.ln_eps).reshape(-1, merged)
    return linear(F.gelu(linear(x, w, VIS + name + ".linear_fc1")), w, VIS + name + ".linear_fc2")


def vision_tower(w: Weights, v: VisionConfig, pixels: Tensor, pos: Tensor, cos: Tensor, sin: Tensor,
                 n_images: int, trace: Trace = None) -> Tuple[Tensor, List[Tensor]]:
    """Pixel rows [N, C*tp*p*p] -> merged image embeddings [N/4, out] and the DeepStack features (pos, cos,
    sin: backbone_plan's tables of the image grid)."""
    proj = w[VIS + "patch_embed.proj.weight"]
    x = F.linear(pixels.to(proj.dtype), proj.reshape(proj.shape[0], -1), w[VIS + "patch_embed.proj.bias"])
    record(trace, "visual_patch_embed", x)
    record(trace, "visual_pos_embeds", pos)
    x = x + pos
    deepstack = []
    normed = layer_norm(x, w, VIS + "blocks.0.norm1", v.ln_eps)
    for i in range(v.depth):
        x, normed = vision_block(x, normed, w, i, v, cos, sin, n_images)
        record(trace, f"visual_block_out.{i}", x)
        if i in v.deepstack_indexes:
            j = v.deepstack_indexes.index(i)
            deepstack.append(patch_merger(x, w, f"deepstack_merger_list.{j}", v, norm_after_merge=True))
            record(trace, f"visual_deepstack.{j}", deepstack[-1])
    merged = patch_merger(x, w, "merger", v, norm_after_merge=False)
    record(trace, "visual_merged", merged)
    return merged, deepstack


# ------------------------------------------------------------------ text
def mrope_positions(input_ids: Tensor, attention_mask: Tensor, grid: Tensor, image_token: int, merge: int
                    ) -> Tensor:
    """[3, B, L] (temporal, height, width) positions over each item's valid tokens; pads 0. Text runs count
    up on all rows; an image at running index s gets (s, s + merged row, s + merged col), and the running
    index then moves on by max(merged rows, merged cols)."""
    b, length = input_ids.shape
    pos = torch.zeros(3, b, length, dtype=torch.int64)
    images = iter(grid.tolist())
    ids_all, mask_all = input_ids.tolist(), attention_mask.tolist()
    for item in range(b):
        ids, mask = ids_all[item], mask_all[item]
        i, running = 0, 0
        while i < length:
            if not mask[i]:
                i += 1
                continue
            if ids[i] != image_token:
                pos[:, item, i] = running
                running, i = running + 1, i + 1
                continue
            t, h, w = next(images)
            gh, gw = h // merge, w // merge
            n = t * gh * gw
            r = torch.arange(gh).repeat_interleave(gw).repeat(t)
            c = torch.arange(gw).repeat(gh).repeat(t)
            pos[0, item, i:i + n] = running + torch.arange(t).repeat_interleave(gh * gw)
            pos[1, item, i:i + n] = running + r
            pos[2, item, i:i + n] = running + c
            running, i = running + max(t, gh, gw), i + n
    return pos


def mrope_cos_sin(t: TextConfig, positions: Tensor) -> Tuple[Tensor, Tensor]:
    """Interleaved mRoPE tables [B, L, head_dim]: frequency j uses the height row when j % 3 == 1 and
    j < 3*section[1], the width row when j % 3 == 2 and j < 3*section[2], else the temporal row."""
    inv = 1.0 / (t.rope_theta ** (torch.arange(0, t.head_dim, 2, dtype=torch.int64, device=positions.device)
                                  .float() / t.head_dim))
    freqs = positions.float()[..., None] * inv          # [3, B, L, hd/2]
    out = freqs[0].clone()
    for row in (1, 2):
        sl = slice(row, 3 * t.mrope_section[row], 3)
        out[..., sl] = freqs[row][..., sl]
    emb = torch.cat([out, out], dim=-1)
    return emb.cos(), emb.sin()


def text_attention(x: Tensor, w: Weights, b: str, t: TextConfig, cos: Tensor, sin: Tensor, mask: Tensor) -> Tensor:
    """mask additive [B, 1, L, L]; q, k, v from one GEMM (fuse_projections' qkv_proj)."""
    q, k, v = dispatch.qkv_norm_rope(linear(x, w, b + "qkv_proj"), cos, sin, t.num_heads, t.num_kv_heads,
                                     t.head_dim, w[b + "q_norm.weight"], w[b + "k_norm.weight"], t.rms_eps)
    return linear(attention(q, k, v, mask), w, b + "o_proj")


def decoder_layer(x: Tensor, normed: Tensor, w: Weights, i: int, t: TextConfig, cos: Tensor, sin: Tensor,
                  mask: Tensor, query_valid: Tensor, norm_next: bool) -> Tuple[Tensor, Optional[Tensor]]:
    """(x, input_layernorm(x)) -> (x after the layer, the next layer's input_layernorm of it where norm_next,
    else None). Each residual add runs with the RMSNorm after it as one selector op (add_rms_norm, Qwen's
    plain weight): no separate add kernel."""
    b = f"{LLM}layers.{i}."
    a = text_attention(normed, w, b + "self_attn.", t, cos, sin, mask)
    # a pad row attends to nothing: its attention output is 0
    h, x = dispatch.add_rms_norm(a * query_valid, x, w[b + "post_attention_layernorm.weight"], t.rms_eps, 0.0)
    down = linear(dispatch.swiglu(linear(h, w, b + "mlp.gate_up_proj")), w, b + "mlp.down_proj")
    if not norm_next:
        return x + down, None
    normed, x = dispatch.add_rms_norm(down, x, w[f"{LLM}layers.{i + 1}.input_layernorm.weight"], t.rms_eps, 0.0)
    return x, normed


def causal_padding_mask(attention_mask: Tensor) -> Tensor:
    """[B, 1, L, L] bool: causal and key valid; all-masked (pad) query rows get their own key so the softmax
    stays finite (their output is zeroed by the caller)."""
    length = attention_mask.shape[1]
    valid = attention_mask.bool()
    causal = torch.ones(length, length, dtype=torch.bool, device=valid.device).tril()
    mask = causal[None] & valid[:, None, :]
    eye = torch.eye(length, dtype=torch.bool, device=valid.device)[None]
    return (mask | (eye & ~valid[:, :, None]))[:, None]


def language_model(w: Weights, t: TextConfig, embeds: Tensor, cos: Tensor, sin: Tensor, attention_mask: Tensor,
                   image_index: Tensor, deepstack: List[Tensor], trace: Trace = None) -> Tensor:
    """The kept decoder layers; DeepStack features added at the image rows (flat indices into B*L) after the
    first layers (never after the last kept one: the features are taken before it). Returns [B, L, W]."""
    mask = additive_mask(causal_padding_mask(attention_mask)[:, 0], embeds.dtype)
    query_valid = attention_mask.bool()[..., None].to(embeds.dtype)
    x = embeds
    normed = None
    for i in range(t.depth):
        if normed is None:
            normed = rms_norm(x, w[f"{LLM}layers.{i}.input_layernorm.weight"], t.rms_eps)
        merge = i < len(deepstack) and i < t.depth - 1
        # the next layer's norm rides on the residual add, unless a DeepStack merge comes between them
        x, normed = decoder_layer(x, normed, w, i, t, cos, sin, mask, query_valid, i + 1 < t.depth and not merge)
        record(trace, f"layer_out.{i}", x)
        if merge:
            x = x.reshape(-1, x.shape[-1]).index_add(0, image_index, deepstack[i].to(x.dtype)).view_as(x)
    return x


def backbone_plan(w: Weights, v: VisionConfig, t: TextConfig, image_token: int, input_ids: Tensor,
                  attention_mask: Tensor, pixels: Tensor, grid: Tensor, trace: Trace = None,
                  cache: Optional[LruCache] = None, host: Optional[Tuple[Tensor, Tensor, Tensor]] = None
                  ) -> Dict[str, Tensor]:
    """The host part of the backbone: everything that depends on the token layout and the image grid (mRoPE
    positions and tables, the vision position embedding and RoPE, where the image rows go), checked and
    turned into device tensors whose shapes are fixed per (batch, token length, grid). backbone_compute then
    runs on them without a host read (capture-safe).
    host: (input_ids, attention_mask, grid) already on the host (no device read); cache (optional, PLAN_CACHE
    entries): the grid's vision tables and each token layout's tables, which change only with the instruction."""
    dev, dtype = input_ids.device, w[EMBED].dtype
    ids, valid, grid_c = host if host is not None else (input_ids.cpu(), attention_mask.cpu(), grid.cpu())
    grid_key = tuple(map(tuple, grid_c.tolist()))
    patches = {int(a * b * c) for a, b, c in grid_key}
    if len(patches) != 1:
        raise ValueError(f"images of different patch counts {sorted(patches)}: all cameras must share one size")
    vis = _made(cache, ("vision", grid_key, dev, dtype),
                  lambda: (position_embedding(w, v, grid_c).to(dtype), *vision_rope(v, grid_c, dev)))
    layout_key = ("layout", ids.numpy().tobytes(), tuple(ids.shape), valid.numpy().tobytes(), grid_key, dev, dtype)

    def layout():
        image_index = (ids == image_token).flatten().nonzero().flatten()
        n_merged = int(grid_c.prod(-1).sum()) // v.merge_size ** 2
        if image_index.numel() != n_merged:
            raise ValueError(f"{image_index.numel()} image tokens but {n_merged} merged image embeddings")
        positions = mrope_positions(ids, valid, grid_c, image_token, v.merge_size)
        cos, sin = mrope_cos_sin(t, positions.to(dev))
        return positions, cos.to(dtype), sin.to(dtype), image_index.to(dev)
    positions, cos, sin, image_index = layout() if trace is not None else _made(cache, layout_key, layout)
    record(trace, "position_ids", positions)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "pixels": pixels.to(dtype),
            "image_grid": grid.to(dev), "vision_pos": vis[0], "vision_cos": vis[1], "vision_sin": vis[2],
            "text_cos": cos, "text_sin": sin, "image_index": image_index}


def _made(cache: Optional[LruCache], key, make):
    return make() if cache is None else cache.get_or_make(key, make)


def backbone_compute(w: Weights, v: VisionConfig, t: TextConfig, p: Dict[str, Tensor], trace: Trace = None) -> Tensor:
    """backbone_plan's tensors -> backbone features [B, L, W] (output of decoder layer select_layer - 1).
    No host reads, no data-dependent shapes: a CUDA graph per (batch, token length, grid) can capture it."""
    merged, deepstack = vision_tower(w, v, p["pixels"], p["vision_pos"], p["vision_cos"], p["vision_sin"],
                                     p["image_grid"].shape[0], trace)
    embeds = F.embedding(p["input_ids"], w[EMBED])
    flat = embeds.reshape(-1, embeds.shape[-1]).index_copy(0, p["image_index"], merged.to(embeds.dtype))
    embeds = flat.view_as(embeds)
    record(trace, "inputs_embeds", embeds)
    feats = language_model(w, t, embeds, p["text_cos"], p["text_sin"], p["attention_mask"], p["image_index"],
                           deepstack, trace)
    record(trace, "features", feats)
    return feats


def backbone_features(w: Weights, v: VisionConfig, t: TextConfig, image_token: int, input_ids: Tensor,
                      attention_mask: Tensor, pixels: Tensor, grid: Tensor, trace: Trace = None) -> Tensor:
    """Tokens + images -> backbone features [B, L, W]: backbone_plan, then backbone_compute."""
    plan = backbone_plan(w, v, t, image_token, input_ids, attention_mask, pixels, grid, trace)
    return backbone_compute(w, v, t, plan, trace)


def fuse_projections(w: Weights, t: TextConfig) -> None:
    """In place: each LLM layer's q/k/v and gate/up weights as one matrix (one GEMM instead of three / two);
    the original keys stay, as views into it, so the weights take no extra memory."""
    for i in range(t.depth):
        b = f"{LLM}layers.{i}."
        fuse(w, [b + f"self_attn.{n}_proj" for n in "qkv"], b + "self_attn.qkv_proj")
        fuse(w, [b + "mlp.gate_proj", b + "mlp.up_proj"], b + "mlp.gate_up_proj")


def fuse(w: Weights, names: List[str], fused: str) -> None:
    """w[fused.weight / .bias] = the row-wise concatenation of names'; names' entries become views of it (quantized
    weights, phyai_ros.quant: concatenated as such, and names' entries dropped, since nothing reads them)."""
    for suffix in (".weight", ".bias"):
        if names[0] + suffix not in w:
            continue
        parts = [w[n + suffix] for n in names]
        quantized = [isinstance(p, QuantizedWeight) for p in parts]
        if any(quantized) and not all(quantized):
            raise ValueError(f"{fused}{suffix}: cannot fuse quantized and float weights ({names})")
        if all(quantized):
            w[fused + suffix] = QuantizedWeight.cat(parts)
            for n in names:
                del w[n + suffix]
            continue
        whole = torch.cat(parts)
        w[fused + suffix] = whole
        start = 0
        for n, part in zip(names, parts):
            w[n + suffix] = whole[start:start + part.shape[0]]
            start += part.shape[0]


def record(trace: Trace, key: str, x: Tensor) -> None:
    if trace is not None:
        trace[key] = x.detach()
