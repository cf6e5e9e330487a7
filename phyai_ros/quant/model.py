"""Which linear weights of a pi-family model are quantized, and replacing them.

Parts: ``vision`` (SigLIP's qkv / out / fc1 / fc2), ``prefix`` (the PaliGemma LM layers' qkv / o / gate_up /
down), ``expert`` (the action expert's layers, same four). Kept in their float dtype whatever the parts:
embeddings, norms and adaRMS modulation layers, the multimodal projector, the action / state / time
projections (small, read once per step or once per observation, and where the action scale is set). Defaults:
weight-only schemes quantize the expert (the bandwidth-bound loop; the prefix and vision are compute-bound,
where dequantizing costs instead of saves), W8A8 everything (fp8 tensor cores for the compute-bound stages).
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Sequence, Tuple

import torch
from torch import nn

from phyai_ros.layers.quantized import QuantizedWeight, QuantScheme

PARTS = ("vision", "prefix", "expert")
DEFAULT_PARTS = {"w8a16": ("expert",), "w8a8": PARTS, "w4a16": ("expert",)}
_GEMMA = ("qkv_w", "o_w", "gate_up_w", "down_w")
_SIGLIP = ("qkv_w", "o_w", "fc1_w", "fc2_w")


def linear_weights(model: nn.Module) -> Dict[str, List[Tuple[str, nn.Module, str]]]:
    """part -> [(qualified name, owning module, attribute)] of the quantizable weights, in model order."""
    found: Dict[str, List[Tuple[str, nn.Module, str]]] = {p: [] for p in PARTS}
    groups = (("vision", "vision.layers", model.vision.layers, _SIGLIP),
              ("prefix", "vlm_layers", model.vlm_layers, _GEMMA),
              ("expert", "expert_layers", model.expert_layers, _GEMMA))
    for part, path, layers, attrs in groups:
        for i, layer in enumerate(layers):
            found[part] += [(f"{path}.{i}.{a}", layer, a) for a in attrs]
    return found


def check_parts(parts: Iterable[str]) -> Tuple[str, ...]:
    parts = tuple(dict.fromkeys(parts))
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise ValueError(f"quantized parts must be a non-empty subset of {PARTS}, got {list(parts)}")
    return parts


@torch.no_grad()
def quantize_model(model: nn.Module, scheme: QuantScheme, parts: Sequence[str] = (), names: Sequence[str] = (),
                   fill: bool = True) -> Tuple[List[str], List[str]]:
    """Replace the weights of ``parts`` (or exactly ``names``) by QuantizedWeight modules, quantized from the
    current values (``fill``) or left empty for a state dict to be loaded into. Returns (quantized names,
    skipped names: weights whose K the scheme cannot store, e.g. int4 groups that do not tile K)."""
    table = linear_weights(model)
    wanted = set(names)
    chosen = [e for p in (check_parts(parts) if parts else PARTS) for e in table[p] if not wanted or e[0] in wanted]
    if wanted - {e[0] for e in chosen}:
        raise ValueError(f"not quantizable weights of this model: {sorted(wanted - {e[0] for e in chosen})[:5]}")
    done, skipped = [], []
    for name, owner, attr in chosen:
        w = getattr(owner, attr)
        if isinstance(w, QuantizedWeight):
            raise ValueError(f"{name} is already quantized ({w.scheme.tag})")
        if not scheme.fits(w.shape[1]):
            skipped.append(name)
            continue
        q = QuantizedWeight(scheme, w.shape[0], w.shape[1], w.device)
        if fill:
            q.quantize_(w)
        del owner._buffers[attr]
        owner.add_module(attr, q)
        done.append(name)
    return done, skipped


def quantized_weights(model: nn.Module) -> Dict[str, QuantizedWeight]:
    return {name: m for name, m in model.named_modules() if isinstance(m, QuantizedWeight)}


_PART_OF = {"vision": "vision", "vlm_layers": "prefix", "expert_layers": "expert",          # pi-family modules
            "backbone.model.model.visual": "vision", "backbone.model.model.language_model": "prefix",   # GR00T keys
            "action_head": "expert"}


def describe(model) -> str:
    """One log line: which scheme a model runs and which parts, e.g. 'quantization w8a16-int8: 72 weights
    (expert)', or 'quantization none'. ``model``: a pi-family module or a GR00T weight dict."""
    if isinstance(model, nn.Module):
        found = quantized_weights(model)
    elif isinstance(model, dict):
        found = {k: w for k, w in model.items() if isinstance(w, QuantizedWeight)}
    else:
        found = {}
    if not found:
        return "quantization none"
    tags = sorted({w.scheme.tag for w in found.values()})
    parts = [p for p in PARTS if any(_PART_OF.get(prefix) == p for n in found for prefix in _PART_OF
                                     if n.startswith(prefix + "."))]
    return f"quantization {', '.join(tags)}: {len(found)} weights ({', '.join(parts)})"
