"""Time-stamped action chunks and their timeline.

Action ``i`` of a chunk is meant for ``t0 + i*dt`` (int ns, stamp clock).  Every chunk
after the first is placed on the grid of the chunk it replaces, so all chunks share one
tick grid and "the action whose time it is" is a nearest-slot lookup that tolerates timer
jitter up to dt/2.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from .margin import LatencyRecord


@dataclass(frozen=True)
class ActionChunk:
    """One delivered chunk.

    seq: increasing per delivered chunk (failed inferences take no number).
    t0_ns: time of action 0; dt_ns: action period.
    actions: float32 [H, D], read-only.
    d: frozen prefix length requested from the policy (0 without RTC).
    n_prefix: length of the previous chunk's remainder Y handed to the policy.
    prefix_error: max |actions[:d] - Y[:d]| as returned by the policy, before the loop
        enforced the frozen prefix (None when d == 0).
    """

    seq: int
    t0_ns: int
    dt_ns: int
    actions: np.ndarray
    d: int
    n_prefix: int
    rtc_mode: str
    observation_stamp_ns: int
    latency: LatencyRecord
    model_id: str = ""
    prefix_error: Optional[float] = None
    epoch: int = 0

    @property
    def horizon(self) -> int:
        return int(self.actions.shape[0])

    @property
    def action_dim(self) -> int:
        return int(self.actions.shape[1])

    @property
    def end_ns(self) -> int:
        """First time this chunk cannot serve: t0 + H*dt."""
        return self.t0_ns + self.horizon * self.dt_ns

    def time_of(self, i: int) -> int:
        return self.t0_ns + int(i) * self.dt_ns

    def index_at(self, t_ns: int) -> int:
        """Nearest slot index for time t (may be < 0 or >= H)."""
        return slot_index(self.t0_ns, self.dt_ns, t_ns)

    def remaining_after(self, i: int) -> int:
        """Actions not yet executed once index i has been executed."""
        return max(0, self.horizon - int(i) - 1)


def slot_index(t0_ns: int, dt_ns: int, t_ns: int) -> int:
    """Nearest grid slot (round half up), integer arithmetic."""
    return (int(t_ns) - int(t0_ns) + dt_ns // 2) // dt_ns


__all__ = ["ActionChunk", "slot_index"]
