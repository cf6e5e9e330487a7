"""What every op family (norms, activations, linears, attention, post_norm, expert_stack, the quantized and
Gated-DeltaNet ops) registers its candidates with, and which selector its public functions call.

Triton is optional (setup.py's 'gpu' extra). ``kernels/common.py`` is the one place that tries to import it; every
kernel module imports without it (its ``@triton.jit`` bodies exist only where Triton imported), so the op families
import their kernel modules at the top like any other module and offer the Triton candidates only where
``triton_ok()`` says so. No other module guards an import of Triton or of a kernel.
"""
from __future__ import annotations

from typing import Iterable

from phyai_ros.kernels import common as triton_common
from phyai_ros.layers import flashinfer_backend
from phyai_ros.layers.selector import SELECTOR, Candidate, OperatorSelector, active_selector

CUDA = ("cuda",)


def triton_ok() -> bool:
    """Whether the Triton candidates can be offered here (Triton imported; the selector checks the device)."""
    return triton_common.HAVE_TRITON


def current_selector() -> OperatorSelector:
    """The running policy's selector, else the module default (scripts, tests)."""
    return active_selector() or SELECTOR


def register(op: str, candidates: Iterable[Candidate]) -> None:
    """Register ``op``'s candidates in preference order, the reference last; an optional backend's candidates for
    the op (flashinfer, profiled-only) go in just before the reference, so only a device profile that measured
    them faster picks them, and where the package is missing nothing changes."""
    for c in candidates:
        SELECTOR.register(op, c)
    cands = SELECTOR.candidates[op]
    for name, c in flashinfer_backend.candidates():
        if name == op:
            cands.insert(len(cands) - 1, c)
