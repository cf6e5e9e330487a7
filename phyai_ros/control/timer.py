"""Action timer logic: which action to emit at a tick.

Pure bookkeeping, no locks and no waiting (the loop calls it under its short lock; the
worker only ever swaps a pointer).  Rules:

* The slot of a tick is the nearest grid slot of the current chunk; an action is emitted
  only for a slot strictly later than the last one emitted, so the past is never replayed.
  A tick whose slot was already served (timer jitter, small clock step back) repeats the
  previous emission (kind ``duplicate``) and is counted.
* A newly adopted chunk starts at its slot for the tick time (or the slot after the last
  emitted one); the actions before it are in the past and are skipped.  That index is the
  number of actions consumed while it was computed (the RTC delay sample).
* A tick that lands more than one slot after the last one served (the timer callback
  ran late, e.g. under CPU pressure) serves its own slot; the slots in between are
  *missed slots* (``Emission.skipped``), never served late.
* All chunks share one grid: the first trigger fixes its origin (kept until a clock
  reset), so every chunk's ``t0`` and every command stamp is ``origin + k*dt``, even when
  early chunks expire before any is adopted.
* Past the end of the chunk (a *run-out*; each such tick is a deadline-policy tick):
  ``hold_last`` repeats the chunk's last action; ``stop`` emits nothing (``None``);
  ``extrapolate_tail`` emits ``a[H-1] + j*(a[H-1] - a[H-2])`` for the j-th slot past the
  end, with j capped at ``extrapolate_max_ticks`` (then it holds the capped value; a
  linear guess must not run away), falling back to hold for H = 1.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .chunk import ActionChunk

DEADLINE_POLICIES = ("hold_last", "stop", "extrapolate_tail")


@dataclass(frozen=True)
class Emission:
    """One tick's output.  ``action`` float32 [D] read-only, or None (``stop``).
    kind: 'chunk' | 'duplicate' | 'hold_last' | 'extrapolate_tail' | 'stop'.
    ``index`` is the slot index in the chunk (>= H on run-out slots); ``skipped`` the
    missed slots between the previous emission and this one."""

    t_ns: int
    slot_ns: int
    action: Optional[np.ndarray]
    chunk_seq: int
    index: int
    kind: str
    skipped: int = 0

    @property
    def is_miss(self) -> bool:
        return self.kind in DEADLINE_POLICIES


@dataclass(frozen=True)
class Adoption:
    """Result of offering a new chunk to the timer."""

    accepted: bool  # False: every action already in the past (expired)
    first_index: int  # consumed actions = RTC delay sample
    cycle_env_ns: Optional[int] = None  # previous chunk's reign: time served by its actions
    cycle_control_ns: Optional[int] = None  # previous chunk's reign: total (incl. miss slots)


class DeliveryStats:
    """Command delivery delay (tick time - slot time) over the last ``window`` served slots:
    how late the action timer publishes; negative up to dt/2 (nearest-slot rounding)."""

    def __init__(self, window: int = 5000):
        self._delays: deque = deque(maxlen=int(window))
        self.max_ns: Optional[int] = None  # over the whole run

    def add(self, delay_ns: int) -> None:
        self._delays.append(int(delay_ns))
        self.max_ns = delay_ns if self.max_ns is None else max(self.max_ns, int(delay_ns))

    def summary(self) -> dict:
        """p50 / p99 over the window and the run's max, seconds (NaN before any slot)."""
        if not self._delays:
            return {"p50": float("nan"), "p99": float("nan"), "max": float("nan"), "n": 0}
        d = np.array(self._delays, dtype=np.float64) / 1e9
        p50, p99 = np.percentile(d, [50.0, 99.0])
        return {"p50": float(p50), "p99": float(p99), "max": self.max_ns / 1e9, "n": len(d)}


class ActionTimer:
    def __init__(self, dt_ns: int, policy: str = "hold_last", extrapolate_max_ticks: int = 5, history: int = 1000):
        if policy not in DEADLINE_POLICIES:
            raise ValueError(f"deadline policy must be one of {DEADLINE_POLICIES}, got {policy!r}")
        self.dt_ns = int(dt_ns)
        self.policy = policy
        self.extrapolate_max_ticks = int(extrapolate_max_ticks)
        self.history: deque = deque(maxlen=int(history))
        self.reset()

    def reset(self) -> None:
        self.current: Optional[ActionChunk] = None
        self.last: Optional[Emission] = None
        self.in_miss = False
        self._reign_start_ns: Optional[int] = None
        self.grid_origin_ns: Optional[int] = None

    def _now_slot(self, chunk: ActionChunk, now_ns: int) -> int:
        i = chunk.index_at(now_ns)
        if self.last is not None:
            # never before the slot after the last one served
            i = max(i, -(-(self.last.slot_ns + self.dt_ns - chunk.t0_ns) // chunk.dt_ns))
        return i

    def next_index(self, now_ns: Optional[int] = None) -> int:
        """Index in the current chunk of the first slot not yet served."""
        c = self.current
        if c is None:
            return 0
        if self.last is None:
            return 0 if now_ns is None else max(0, c.index_at(now_ns) + 1)
        return -(-(self.last.slot_ns + self.dt_ns - c.t0_ns) // c.dt_ns)

    def remaining(self) -> int:
        """Actions of the current chunk not yet executed (0 without a chunk)."""
        c = self.current
        if c is None:
            return 0
        return max(0, min(c.horizon, c.horizon - self.next_index()))

    def next_slot_ns(self, now_ns: int) -> int:
        """Time of the first slot not yet served: the new chunk's t0 at a trigger."""
        if self.current is not None:
            return self.current.time_of(self.next_index(now_ns))
        if self.last is not None:
            return self.last.slot_ns + self.dt_ns
        earliest = int(now_ns) + self.dt_ns
        if self.grid_origin_ns is None:
            self.grid_origin_ns = earliest
            return earliest
        k = -(-(earliest - self.grid_origin_ns) // self.dt_ns)  # first grid slot >= earliest
        return self.grid_origin_ns + k * self.dt_ns

    def adopt(self, chunk: ActionChunk, now_ns: int) -> Adoption:
        first = self._now_slot(chunk, now_ns)
        first = max(first, 0)
        if first >= chunk.horizon:
            return Adoption(False, first)
        env = ctl = None
        start = chunk.time_of(first)
        prev = self.current
        if prev is not None and self._reign_start_ns is not None:
            ctl = start - self._reign_start_ns
            env = max(0, min(start, prev.end_ns) - self._reign_start_ns)
        self.current = chunk
        self._reign_start_ns = start
        return Adoption(True, first, env, ctl)

    def emit(self, now_ns: int) -> Optional[Emission]:
        """The emission for this tick (None if there has never been a chunk or the chunk's
        first slot is still ahead)."""
        c = self.current
        if c is None:
            return None
        i = c.index_at(now_ns)
        slot = c.time_of(i)
        if self.last is not None and slot <= self.last.slot_ns:
            e = self.last
            e = Emission(int(now_ns), e.slot_ns, e.action, e.chunk_seq, e.index, "duplicate")
            self.history.append(e)
            return e
        if i < 0:
            return None
        skipped = 0 if self.last is None else max(0, (slot - self.last.slot_ns) // self.dt_ns - 1)
        if i < c.horizon:
            action, kind = c.actions[i], "chunk"
            self.in_miss = False
        else:
            self.in_miss = True
            a = c.actions
            kind = self.policy
            if kind == "hold_last":
                action = a[-1]
            elif kind == "stop":
                action = None
            else:
                if c.horizon < 2:
                    action = a[-1]
                else:
                    j = min(i - (c.horizon - 1), self.extrapolate_max_ticks)
                    action = (a[-1] + j * (a[-1] - a[-2])).astype(np.float32)
                    action.flags.writeable = False
        e = Emission(int(now_ns), slot, action, c.seq, i, kind, int(skipped))
        self.last = e
        self.history.append(e)
        return e


__all__ = ["DEADLINE_POLICIES", "Emission", "Adoption", "ActionTimer", "DeliveryStats"]
