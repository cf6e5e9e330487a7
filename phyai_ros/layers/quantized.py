"""Quantized linear weights: the scheme (what is stored and how activations are treated) and the weight type
the models hold in place of a bf16 matrix.

Why a module type (not a tensor): a quantized weight is several tensors (values, scales, a static activation
scale) that must move, save and load together; as an ``nn.Module`` it rides along ``.to()``, ``state_dict()`` and
``load_state_dict()`` of the model, and the layer ops (``dispatch``) recognise it and run the quantized kernels.
The storage layouts are owned by ``phyai_ros.kernels.quant_linear`` (its module docstring); quantization here is
offline round-to-nearest (symmetric, per output channel or per group of K), as the PhyAI design specifies.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from typing import Dict, Optional

import torch
from torch import nn

from phyai_ros.kernels.quant_linear import FP8_MAX, dequantize, pack_int4
from phyai_ros.layers.selector import shape_key

Tensor = torch.Tensor

SCHEMES = ("w8a16", "w8a8", "w4a16")
WEIGHT_FORMATS = {"w8a16": ("int8", "fp8"), "w8a8": ("fp8",), "w4a16": ("int4",)}
ACTIVATIONS = ("dynamic", "static")


@dataclass(frozen=True)
class QuantScheme:
    """name: w8a16 (8-bit weights, activations in the model dtype), w8a8 (fp8 weights and fp8 activations),
    w4a16 (int4 weights in groups of ``group`` columns). activations (w8a8 only): per-token scales computed at
    run time ("dynamic") or one scale per layer calibrated offline ("static")."""
    name: str
    weight_format: str
    group: int = 0
    activations: Optional[str] = None

    def __post_init__(self):
        if self.name not in SCHEMES:
            raise ValueError(f"quantization scheme must be one of {SCHEMES}, got {self.name!r}")
        if self.weight_format not in WEIGHT_FORMATS[self.name]:
            raise ValueError(f"{self.name} stores {' or '.join(WEIGHT_FORMATS[self.name])} weights, "
                             f"got {self.weight_format!r}")
        if (self.name == "w8a8") != (self.activations in ACTIVATIONS) or \
                (self.name != "w8a8" and self.activations is not None):
            raise ValueError(f"activations must be one of {ACTIVATIONS} for w8a8 and unset otherwise, "
                             f"got {self.activations!r} for {self.name}")
        if (self.weight_format == "int4") != (self.group > 0) or \
                (self.group and (self.group < 32 or self.group & (self.group - 1))):
            raise ValueError(f"int4 needs a power-of-two group >= 32 (per-channel 8-bit: group 0), got {self.group}")

    @classmethod
    def make(cls, name: str, weight_format: Optional[str] = None, group: int = 128,
             activations: str = "dynamic") -> "QuantScheme":
        """The scheme with this name and defaults for what is not given (w8a16: int8 weights)."""
        fmt = weight_format or WEIGHT_FORMATS.get(name, ("",))[0]
        return cls(name, fmt, group if fmt == "int4" else 0, activations if name == "w8a8" else None)

    @property
    def tag(self) -> str:
        """Short label for profile keys and logs, e.g. 'w8a16-int8', 'w8a8-fp8-dynamic', 'w4a16-int4-g128'."""
        parts = [self.name, self.weight_format] + ([f"g{self.group}"] if self.group else []) + \
            ([self.activations] if self.activations else [])
        return "-".join(parts)

    def to_json(self) -> dict:
        return asdict(self)

    def fits(self, in_features: int) -> bool:
        """Whether a weight with this K can be stored (int4 groups must tile K)."""
        return not self.group or in_features % self.group == 0


class QuantizedWeight(nn.Module):
    """A linear layer's weight [N, K] (``shape``) stored quantized: buffers ``q`` (int8 / float8_e4m3fn
    [N, K], or packed int4 uint8 [N, K/2]), ``scale`` (float32 [N], or [N, K/group] for int4) and, for static
    W8A8 activations, ``act_scale`` (float32 [1])."""

    def __init__(self, scheme: QuantScheme, out_features: int, in_features: int, device=None):
        super().__init__()
        if not scheme.fits(in_features):
            raise ValueError(f"{scheme.tag}: K={in_features} is not a multiple of the group {scheme.group}")
        self.scheme = scheme
        self.shape = torch.Size((out_features, in_features))
        n, k, f32 = out_features, in_features, torch.float32
        if scheme.weight_format == "int4":
            self.register_buffer("q", torch.empty((n, k // 2), dtype=torch.uint8, device=device))
            self.register_buffer("scale", torch.empty((n, k // scheme.group), dtype=f32, device=device))
        else:
            dt = torch.int8 if scheme.weight_format == "int8" else torch.float8_e4m3fn
            self.register_buffer("q", torch.empty((n, k), dtype=dt, device=device))
            self.register_buffer("scale", torch.empty((n,), dtype=f32, device=device))
        if scheme.activations == "static":
            self.register_buffer("act_scale", torch.ones((1,), dtype=f32, device=device))
        else:
            self.register_buffer("act_scale", None)
        # The weight dequantized to the model dtype, held only where the measured plan runs the bf16 path at some
        # shape (``plan_dense``); never saved (not persistent), so a checkpoint stays the quantized tensors alone.
        self.register_buffer("dense", None, persistent=False)

    def extra_repr(self) -> str:
        return f"{self.scheme.tag}, shape={tuple(self.shape)}"

    @property
    def act_quant(self) -> Optional[str]:
        return self.scheme.activations

    @property
    def group(self) -> int:
        return self.scheme.group

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The weight it stands for, [N, K] in ``dtype``."""
        return dequantize(self.q, self.scale, self.group).to(dtype)

    @property
    def shape_tag(self) -> tuple:
        """(scheme tag, 'NxK'): what a profile key says of this weight (``qshape_key``'s weight and scheme)."""
        return self.scheme.tag, f"{self.shape[0]}x{self.shape[1]}"

    @torch.no_grad()
    def quantize_(self, weight: Tensor) -> "QuantizedWeight":
        """Fill from a float weight [N, K]: symmetric round-to-nearest, scale = amax / qmax per row (8-bit) or
        per row and group (int4); a zero row gets scale 1."""
        if tuple(weight.shape) != tuple(self.shape):
            raise ValueError(f"weight {tuple(weight.shape)} does not match {tuple(self.shape)}")
        w = weight.detach().to(device=self.q.device, dtype=torch.float32)
        fmt = self.scheme.weight_format
        if fmt == "int4":
            g = w.view(w.shape[0], -1, self.group)
            s = g.abs().amax(-1) / 7.0
            s = torch.where(s > 0, s, torch.ones_like(s))
            q = torch.round(g / s[..., None]).clamp(-7, 7).to(torch.int8).view(w.shape)
            self.q.copy_(pack_int4(q, self.group))
        else:
            qmax = 127.0 if fmt == "int8" else FP8_MAX
            s = w.abs().amax(-1) / qmax
            s = torch.where(s > 0, s, torch.ones_like(s))
            v = (w / s[:, None]).clamp(-qmax, qmax)
            self.q.copy_(torch.round(v).to(torch.int8) if fmt == "int8" else v.to(torch.float8_e4m3fn))
        self.scale.copy_(s)
        return self

    @classmethod
    def from_float(cls, weight: Tensor, scheme: QuantScheme) -> "QuantizedWeight":
        return cls(scheme, weight.shape[0], weight.shape[1], weight.device).quantize_(weight)

    @classmethod
    def from_tensors(cls, scheme: QuantScheme, q: Tensor, scale: Tensor, act_scale: Optional[Tensor] = None
                     ) -> "QuantizedWeight":
        """The weight whose stored tensors are these (a loaded checkpoint's); shapes checked against the scheme."""
        k = q.shape[1] * (2 if scheme.weight_format == "int4" else 1)
        w = cls(scheme, q.shape[0], k, q.device)
        w.load_state_dict({"q": q, "scale": scale, **({"act_scale": act_scale} if act_scale is not None else {})})
        return w

    @classmethod
    def cat(cls, parts) -> "QuantizedWeight":
        """Row-wise concatenation (fused q/k/v or gate/up projections): with per-output-channel or per-row-group
        scales this is exactly the quantized concatenation of the float weights."""
        scheme = parts[0].scheme
        if any(p.scheme != scheme or p.shape[1] != parts[0].shape[1] for p in parts):
            raise ValueError("only weights of one scheme and one input width can be fused")
        return cls.from_tensors(scheme, torch.cat([p.q for p in parts]), torch.cat([p.scale for p in parts]),
                                parts[0].act_scale)


# ----------------------------------------------------------------------------- static activation scales
_CALIBRATION: ContextVar[Optional[Dict["QuantizedWeight", float]]] = ContextVar("phyai_ros_calibration", default=None)


@contextmanager
def calibrating():
    """While active, weights with static activation scales quantize their inputs dynamically and record the
    largest |x| they saw (the reference op, layers/quant_dispatch.py ``torch_qlinear``, does both). Yields the
    {weight: amax} record; ``apply_calibration`` turns it into the scales."""
    seen: Dict[QuantizedWeight, float] = {}
    token = _CALIBRATION.set(seen)
    try:
        yield seen
    finally:
        _CALIBRATION.reset(token)


def observe(weight: "QuantizedWeight", x: Tensor) -> bool:
    """Record x's amax for a static-activation weight while calibrating; True when it did (then the caller
    quantizes x dynamically)."""
    seen = _CALIBRATION.get()
    if seen is None or weight.act_quant != "static":
        return False
    amax = float(x.detach().abs().amax())
    seen[weight] = max(seen.get(weight, 0.0), amax)
    return True


@torch.no_grad()
def apply_calibration(seen: Dict["QuantizedWeight", float], margin: float = 1.0) -> int:
    """act_scale = margin * amax / 448 for every observed weight; returns how many were set."""
    for w, amax in seen.items():
        w.act_scale.fill_(max(margin * amax / FP8_MAX, 1e-12))
    return len(seen)


# ----------------------------------------------------------------------------- the measured plan
def dense_shapes(table: dict) -> set:
    """The (scheme tag, 'NxK') of every quantized weight shape for which a device's profile table ({op: {key:
    name}}) chose the "dense" candidate at some call: the weights that must hold their dequantized copy."""
    out = set()
    for keys in table.values():
        for key, name in keys.items():
            parts = key.split("|")
            if name == "dense" and len(parts) == 3:   # a quantized op's key: dims|dtype|scheme tag
                out.add((parts[2], parts[0].rpartition(",")[2]))
    return out


@torch.no_grad()
def plan_dense(weights, shapes: Optional[set], dtype: torch.dtype) -> int:
    """Give each quantized weight of ``weights`` its dequantized copy in ``dtype`` where its ``shape_tag`` is in
    ``shapes`` (every one for None: before an autotune, which measures the dense path against the quantized
    kernels), and drop the copy elsewhere. Returns how many hold one."""
    held = 0
    for w in weights:
        if shapes is None or w.shape_tag in shapes:
            if w.dense is None or w.dense.dtype != dtype:
                w.dense = w.dequantize(dtype)
            held += 1
        else:
            w.dense = None
    return held


def quantized_in(obj) -> list:
    """The distinct QuantizedWeight of a module tree or of a name -> weight mapping (a family's weights)."""
    items = obj.modules() if isinstance(obj, nn.Module) else obj.values()
    seen = {}
    for w in items:
        if isinstance(w, QuantizedWeight):
            seen.setdefault(id(w), w)
    return list(seen.values())


def qshape_key(x: Tensor, weight: "QuantizedWeight", *more: Tensor) -> str:
    """'1x50x1024,2560x1024|bfloat16|w8a16-int8': x's (and ``more``'s) shapes, the weight's, the scheme."""
    dims, dtype = shape_key(x, *more).split("|")
    n, k = weight.shape
    return f"{dims},{n}x{k}|{dtype}|{weight.scheme.tag}"
