"""Time-stamped action chunks and their timeline.

Action ``i`` of a chunk is meant for ``t0 + i*dt`` (int ns, stamp clock).  Every chunk
after the first is placed on the grid of the chunk it replaces, so all chunks share one
tick grid and "the action whose time it is" is a nearest-slot lookup that tolerates timer
jitter up to dt/2.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from .margin import LatencyRecord


@dataclass(frozen=True)
class ActionChunk:
    """One action chunk: the one Python type for what the loop delivers, the node publishes as
    ``phyai_ros/ActionChunk`` and the replay tools read back (``messages.chunk_to_msg`` /
    ``msg_to_chunk`` map it field by field).

    seq: increasing per delivered chunk (failed inferences take no number).
    t0_ns: time of action 0 (the message's header stamp); dt_ns: action period.
    actions: float32 [H, D], read-only.
    d: frozen prefix length requested from the policy (0 without RTC; the message's ``frozen_prefix``).
    observation_stamp_ns: the snapshot's stamp, the oldest sensor stamp used.
    action_names, frame_id: what the node adds for the message (empty in the loop).
    inference_latency: seconds; taken from ``latency`` when not given.

    Loop-only bookkeeping (not on the wire, defaults on a received chunk):
    latency: the chunk's latency record; n_prefix: length of the previous chunk's remainder Y handed to
    the policy; rtc_mode; prefix_error: max |actions[:d] - Y[:d]| as returned by the policy, before the
    loop enforced the frozen prefix (None when d == 0); epoch: the loop's clock segment.
    """

    seq: int
    t0_ns: int
    dt_ns: int
    actions: np.ndarray
    d: int
    observation_stamp_ns: int
    model_id: str = ""
    action_names: Tuple[str, ...] = ()
    frame_id: str = ""
    inference_latency: Optional[float] = None
    latency: Optional[LatencyRecord] = None
    n_prefix: int = 0
    rtc_mode: str = "off"
    prefix_error: Optional[float] = None
    epoch: int = 0

    def __post_init__(self) -> None:
        if self.inference_latency is None:
            object.__setattr__(self, "inference_latency",
                               self.latency.inference if self.latency is not None else 0.0)

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


def slot_index(t0_ns: int, dt_ns: int, t_ns: int) -> int:
    """Nearest grid slot (round half up), integer arithmetic."""
    return (int(t_ns) - int(t0_ns) + dt_ns // 2) // dt_ns


__all__ = ["ActionChunk", "slot_index"]
