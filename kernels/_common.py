"""Shared helpers for the fused Triton kernels in ``phyai_ros.kernels``.

Triton is optional: a robot image may ship without it.  Every kernel module
imports ``triton`` through this file, so ``import phyai_ros.kernels.<name>``
never fails; call ``available()`` before using a fused op and fall back to the
module's ``*_ref`` torch function otherwise.

``TRITON_INTERPRET=1`` (set before triton is first imported) runs the kernels
on CPU tensors through Triton's interpreter; that is how CI tests them.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

try:  # pragma: no cover - depends on the image
    import triton
    import triton.language as tl

    HAVE_TRITON = True
    _IMPORT_ERROR: Optional[BaseException] = None
except Exception as _e:  # ImportError, or a broken install (missing libcuda, ...)
    triton = None
    tl = None
    HAVE_TRITON = False
    _IMPORT_ERROR = _e

__all__ = [
    "triton", "tl", "HAVE_TRITON", "available", "interpret_mode", "require_triton",
    "check_tensors", "rows_view", "next_power_of_2", "num_sms",
]


def interpret_mode() -> bool:
    """True when Triton runs kernels through its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "off")


def available() -> bool:
    """True when the fused kernels can run here: triton imports and either a CUDA
    device is present or the interpreter is on (``TRITON_INTERPRET=1``)."""
    if not HAVE_TRITON:
        return False
    if interpret_mode():
        return True
    return torch.cuda.is_available()


def require_triton() -> None:
    if not HAVE_TRITON:
        raise RuntimeError(f"triton is not importable here ({_IMPORT_ERROR!r}); "
                           "use the *_ref torch function instead")


def check_tensors(*named: tuple) -> None:
    """Check (name, tensor) pairs: one device, contiguous last dim, float dtype.

    Under the interpreter the tensors must be CPU tensors; otherwise CUDA ones.
    """
    require_triton()
    dev = None
    for name, t in named:
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"{name}: dtype {t.dtype} not supported (float32/float16/bfloat16)")
        if t.dim() == 0 or (t.shape[-1] > 1 and t.stride(-1) != 1):
            raise ValueError(f"{name} must have a contiguous last dimension "
                             f"(shape {tuple(t.shape)}, strides {t.stride()})")
        if dev is None:
            dev = t.device
        elif t.device != dev:
            raise ValueError(f"{name} is on {t.device}, expected {dev}")
    if dev is not None:
        if interpret_mode():
            if dev.type != "cpu":
                raise ValueError("TRITON_INTERPRET is set: pass CPU tensors")
        elif dev.type != "cuda":
            raise ValueError(f"fused kernels need CUDA tensors, got {dev}")


def rows_view(t: torch.Tensor, name: str) -> torch.Tensor:
    """[..., W] -> [rows, W] without copying (raises if a copy would be needed).
    2-D inputs keep their row stride, so column slices (e.g. a chunk of a
    modulation tensor) are accepted as they are."""
    if t.dim() == 2:
        return t
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError as e:
        raise ValueError(f"{name}: leading dims of shape {tuple(t.shape)} / strides "
                         f"{t.stride()} cannot be flattened without a copy") from e


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


_SM_CACHE: dict = {}


def num_sms(device: torch.device) -> int:
    """Multiprocessor count (a small stand-in under the interpreter)."""
    if device.type != "cuda":
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_CACHE:
        _SM_CACHE[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_CACHE[idx]
