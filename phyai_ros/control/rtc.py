"""Real-time chunking, scheduling side (Black, Galliker, Levine 2025, arXiv 2506.07339).

The loop decides *when* the next inference starts and *what* the policy must respect;
the guidance math itself lives in the adapter's solver.

* Delay d (ticks) = a high quantile of the delays actually observed, where one sample is
  the number of previous-chunk actions consumed between the new chunk's action 0 and the
  tick that first used the new chunk (tick-quantised, includes queue and actuate, so it is
  the latency measure that matters; it is "clamped to what was actually consumed" by
  construction).  Cold-start inferences are not added (a first call that compiles/captures
  graphs would inflate d for the whole window).
* Trigger: start the next inference when the current chunk's remaining (not yet executed)
  actions <= d_est + s_overlap (DESIGN §2: ``s`` actions remain beyond the expected delay).
* At the trigger, the new chunk's action 0 is the next tick slot; Y = the previous chunk's
  actions from that slot on (its not-yet-executed remainder, aligned to the new chunk's
  time), n = len(Y).  The first d = min(d_est, n) new actions are frozen to Y.
* ``RtcRequest.s`` is the paper's execution horizon, ``H - n``, so the adapter can use the
  paper's soft mask as written: W_i = 1 for i < d; c_i = (H-s-i)/(H-s-d+1) and
  W_i = c_i (e^c_i - 1)/(e - 1) (``exp``) or W_i = c_i (``linear``) for d <= i < H-s;
  W_i = 0 for i >= H-s (beyond Y).  Note: this ``s`` differs from the loop's trigger slack
  ``ControlConfig.rtc_overlap`` (= DESIGN's s); n ~= d_est + rtc_overlap at the trigger.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Optional

import numpy as np

RTC_MODES = ("guided", "trained", "off")
SCHEDULES = ("exp", "linear")


class DelayEstimator:
    """High quantile of consumed-action delays (ticks) over a sliding window."""

    def __init__(self, quantile: float = 0.95, window: int = 50, initial: int = 3, max_ticks: Optional[int] = None):
        if not 0.0 < quantile <= 1.0:
            raise ValueError("quantile must be in (0, 1]")
        self.quantile = float(quantile)
        self.initial = int(initial)
        self.max_ticks = max_ticks
        self._samples: deque = deque(maxlen=int(window))

    def add(self, consumed_ticks: int, cold: bool = False) -> bool:
        """Record one delay sample; cold-start samples are ignored (returns False)."""
        if cold:
            return False
        v = max(0, int(consumed_ticks))
        if self.max_ticks is not None:
            v = min(v, int(self.max_ticks))
        self._samples.append(v)
        return True

    @property
    def samples(self) -> tuple:
        return tuple(self._samples)

    def estimate(self) -> int:
        """d_est in ticks: the ``quantile`` sample (method 'higher': a delay actually seen);
        ``initial`` until a warm sample exists."""
        if not self._samples:
            d = self.initial
        else:
            d = int(np.quantile(np.fromiter(self._samples, dtype=np.int64), self.quantile, method="higher"))
        if self.max_ticks is not None:
            d = min(d, int(self.max_ticks))
        return max(0, d)

    def clear(self) -> None:
        self._samples.clear()


def should_trigger(remaining: int, d_est: int, overlap: int) -> bool:
    """Start the next inference when remaining actions <= d_est + overlap."""
    return remaining <= d_est + overlap


def soft_mask(horizon: int, d: int, s: int, schedule: str = "exp") -> np.ndarray:
    """The paper's soft guidance weights W [H] (float32) for frozen d, execution horizon s."""
    H = int(horizon)
    d = max(0, min(int(d), H))
    s = max(0, min(int(s), H))
    w = np.zeros(H, dtype=np.float64)
    w[:d] = 1.0
    end = H - s
    if end > d:
        i = np.arange(d, end, dtype=np.float64)
        c = (end - i) / (end - d + 1)
        if schedule == "exp":
            w[d:end] = c * np.expm1(c) / (math.e - 1.0)
        elif schedule == "linear":
            w[d:end] = c
        else:
            raise ValueError(f"unknown schedule {schedule!r}")
    return w.astype(np.float32)


@dataclass(frozen=True)
class RtcRequest:
    """What the policy gets besides the observation (``None`` when RTC is off or when
    nothing of the previous chunk is left).

    mode: 'guided' (inpaint toward Y with the soft mask) or 'trained' (feed prefix[:d] as
        clean action tokens).
    prefix: Y, float32 [n, D], read-only: previous chunk's actions for times
        t0_ns + j*dt_ns, j < n.
    d: frozen count (<= n); s: paper's execution horizon = horizon - n.
    """

    mode: str
    schedule: str
    prefix: np.ndarray
    d: int
    s: int
    horizon: int
    t0_ns: int
    dt_ns: int

    @property
    def n(self) -> int:
        return int(self.prefix.shape[0])

    @property
    def frozen(self) -> np.ndarray:
        return self.prefix[: self.d]

    def soft_mask(self) -> np.ndarray:
        return soft_mask(self.horizon, self.d, self.s, self.schedule)

    def padded_prefix(self) -> np.ndarray:
        """Y zero-padded to [H, D] (rows >= n have weight 0 in the mask)."""
        out = np.zeros((self.horizon, self.prefix.shape[1]), dtype=np.float32)
        out[: self.n] = self.prefix
        return out


def make_request(remainder: np.ndarray, d_est: int, *, mode: str, schedule: str, horizon: int,
                 t0_ns: int, dt_ns: int) -> Optional[RtcRequest]:
    """Build the request from the previous chunk's remainder Y (already aligned to t0)."""
    if mode == "off" or remainder is None or len(remainder) == 0:
        return None
    y = np.array(remainder[:horizon], dtype=np.float32)
    y.flags.writeable = False
    n = int(y.shape[0])
    return RtcRequest(mode=mode, schedule=schedule, prefix=y, d=min(max(0, int(d_est)), n), s=horizon - n,
                      horizon=int(horizon), t0_ns=int(t0_ns), dt_ns=int(dt_ns))


__all__ = ["RTC_MODES", "SCHEDULES", "DelayEstimator", "should_trigger", "soft_mask", "RtcRequest", "make_request"]
