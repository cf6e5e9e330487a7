"""Shared helpers for the fused Triton kernels in ``phyai_ros.kernels``.

Triton is optional: a robot image may ship without it.  Every kernel module
imports ``triton`` through this file, so ``import phyai_ros.kernels.<name>``
never fails; call ``available()`` before using a fused op and fall back to the
module's ``*_ref`` torch function otherwise.

``TRITON_INTERPRET=1`` (set before triton is first imported) runs the kernels
on CPU tensors through Triton's interpreter; that is how CI tests them.

Programmatic dependent launch (PDL, sm_90 and newer: Hopper, Blackwell / Thor): the expert loop is a
chain of few-microsecond kernels, and without PDL each one is scheduled only after the previous one has
drained. Every kernel here takes a ``PDL`` constexpr; launched with ``**pdl(device)`` it starts while its
producer still runs, does what does not depend on it (index math, an L2 prefetch of its weights), then
``wait_for_producer`` blocks until the producer has finished and its writes are visible, and lets the next
kernel start in turn. ``PHYAI_PDL=0`` turns it off (plain stream order).

``PHYAI_PDL_TRIGGER=late`` (an A/B option; on the H200 it gained nothing, 2026-12-02, docs/benchmarks.md): the
GEMM and attention kernels let the next kernel in only after their main loop (``release_dependents``), so its
programs do not sit waiting on the multiprocessors, holding registers and shared memory, through this kernel's
whole main loop; kernels without a main loop still let it in at once. Either way the next kernel's
``wait_for_producer`` waits for this one's completion: the trigger's place changes scheduling, never values.
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

try:  # grid dependency control (Triton >= 3.4)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAVE_GDC = True
except Exception:
    HAVE_GDC = False

__all__ = [
    "triton", "tl", "HAVE_TRITON", "available", "interpret_mode", "require_triton",
    "check_tensors", "rows_view", "next_power_of_2", "cdiv", "num_sms", "pdl", "pdl_enabled",
    "wait_for_producer", "release_dependents", "late_trigger", "prefetch_l2", "LOG2E",
]

# log2(e): the attention kernels' softmax runs on exp2, so the host folds it into the logits' scale. (Inside a
# jit body the literal is spelt out: a kernel reads no Python global but a constexpr.)
LOG2E = 1.4426950408889634


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


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of two ints, for the host's launch plans."""
    return -(-a // b)


_SM_CACHE: dict = {}


def num_sms(device: torch.device) -> int:
    """Multiprocessor count (a small stand-in under the interpreter)."""
    if device.type != "cuda":
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_CACHE:
        _SM_CACHE[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_CACHE[idx]


_PDL_CACHE: dict = {}


def pdl_enabled(device: torch.device) -> bool:
    """Programmatic dependent launch is used here: a CUDA device of compute capability >= 9.0, Triton's
    grid dependency control, not the interpreter, and ``PHYAI_PDL`` not set to 0."""
    if not (HAVE_TRITON and HAVE_GDC) or device.type != "cuda" or interpret_mode():
        return False
    if os.environ.get("PHYAI_PDL", "1").strip().lower() in ("0", "false", "off", "no"):
        return False
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _PDL_CACHE:
        _PDL_CACHE[idx] = torch.cuda.get_device_capability(idx) >= (9, 0)
    return _PDL_CACHE[idx]


def late_trigger() -> bool:
    """``PHYAI_PDL_TRIGGER=late``: the main-loop kernels release their dependents after the loop (module doc)."""
    return os.environ.get("PHYAI_PDL_TRIGGER", "early").strip().lower() == "late"


def pdl(device: torch.device) -> dict:
    """Launch keywords for a kernel with a ``PDL`` constexpr: the flag (True, or 2 for the late trigger) and, when
    on, Triton's launch_pdl. Both or neither: a kernel launched early must call ``wait_for_producer`` before
    touching its inputs."""
    if not pdl_enabled(device):
        return {"PDL": False}
    return {"PDL": 2 if late_trigger() else True, "launch_pdl": True}


if HAVE_TRITON:

    @triton.jit
    def wait_for_producer(PDL: tl.constexpr, LATE: tl.constexpr = False):
        """Block until the previous kernel in the stream has finished (its writes visible), then let the
        next kernel be scheduled, unless this kernel does that later (``LATE``: it calls ``release_dependents``
        after its main loop) and the late trigger is on (PDL == 2). Call before the first load of anything a
        previous kernel wrote."""
        if PDL:
            gdc_wait()
            if not (LATE and PDL == 2):
                gdc_launch_dependents()

    @triton.jit
    def release_dependents(PDL: tl.constexpr):
        """The late trigger (PDL == 2): let the next kernel be scheduled now, after this kernel's main loop (its
        prologue, a weight prefetch, overlaps this kernel's epilogue rather than the whole loop)."""
        if PDL == 2:
            gdc_launch_dependents()

    @triton.jit
    def prefetch_l2(ptrs, PDL: tl.constexpr):
        """Ask L2 for the lines at ``ptrs`` (any shape; one prefetch per element, give one element per
        128-byte line, addresses inside the tensor). Only with PDL, before ``wait_for_producer``: weights
        stream in while the producer still runs."""
        if PDL:
            tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs.to(tl.int64)],
                                      dtype=tl.int32, is_pure=False, pack=1)
else:  # device functions exist only where Triton imports
    wait_for_producer = release_dependents = prefetch_l2 = None
