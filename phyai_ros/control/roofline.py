"""The control-time roofline's bounds (docs/design.md §3), in one home for the node's margin monitor and the
replay report, so the two cannot disagree.

Per chunk cycle ``X = L_env / L_inference`` and ``Y = L_env / L_control``.  With no overlap of inference and
execution the loop spends ``L_env + L_inference`` per cycle, so ``Y_seq = X/(1+X)``; with perfect overlap it
waits only where inference is longer than the execution it hides behind, so ``Y_roof = min(X, 1)``.  A measured
Y lies between the two.  X is a ratio of sums over cycles: ``inf`` when inference took no time (a stepped replay),
NaN when undefined; the bounds follow (Y_seq -> 1 as X -> inf).
"""
from __future__ import annotations

import math


def roofline_x(env: float, inference: float) -> float:
    """``X = sum L_env / sum L_inference`` over some chunk cycles: ``inf`` when inference took no time but the
    environment ran (a stepped replay), NaN when neither did (nothing to place)."""
    if inference > 0:
        return env / inference
    return math.inf if env > 0 else math.nan


def y_sequential(x: float) -> float:
    """``Y_seq = X/(1+X)``: the share of control time spent acting when inference and execution never overlap."""
    if math.isfinite(x):
        return x / (1 + x)
    return 1.0 if x == math.inf else math.nan


def y_roof(x: float) -> float:
    """``Y_roof = min(X, 1)``: the share with inference perfectly hidden behind execution."""
    return math.nan if math.isnan(x) else min(x, 1.0)


__all__ = ["roofline_x", "y_sequential", "y_roof"]
