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
  actions <= d_est + overlap (``ControlConfig.rtc_overlap`` actions beyond the expected delay).
* At the trigger, the new chunk's action 0 is the next tick slot; Y = the previous chunk's
  actions from that slot on (its not-yet-executed remainder, aligned to the new chunk's
  time), n = len(Y).  The first d = min(d_est, n) new actions are frozen to Y.
* What the policy makes of Y is the model's business (design.md §3): the pi family's
  solver turns it into guidance weights (``models.rtc_weights.rtc_prefix_weights``: 1 for i < d, a
  ramp over d <= i < n, 0 beyond Y; n is LeRobot's "execution horizon") or clean prefix
  tokens; GR00T N1.7 seeds its loop with it (native RTC).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Optional

import numpy as np

# The loop's RTC modes (``rtc.mode``). Each model family supports some of them (its adapter's
# ``rtc_modes``; the policy bridge checks the pair): "guided" inference-time guidance and
# "trained" prefix-conditioned sampling (pi0, pi0.5), "native" GR00T N1.7's own RTC; "off" everywhere.
RTC_MODES = ("guided", "trained", "native", "off")
SCHEDULES = ("exp", "linear")
# The largest action magnitude an RTC prefix (and a chunk the loop adopts) may hold, in robot units, as
# control.observation's MAX_ABS_STATE bounds the state: no joint is commanded beyond it, and a finite 1e38 prefix
# makes the guided solver's chunk non-finite (float32 overflow in its residual).
MAX_ABS_ACTION = 1e6


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


@dataclass(frozen=True)
class RtcRequest:
    """What the policy gets besides the observation, in robot units (``None`` when RTC is off or
    when nothing of the previous chunk is left): the one RTC type between loop and policy bridge.

    mode: one of RTC_MODES but 'off' (what the model does with Y; see RTC_MODES).
    schedule: the guidance ramp over d <= i < n (guided mode).
    prefix: Y, float32 [n, D] robot units, read-only: the previous chunk's actions for times
        t0_ns + j*dt_ns, j < n.
    d: frozen count (<= n): the new chunk's first d actions must equal Y's.
    """

    mode: str
    schedule: str
    prefix: np.ndarray
    d: int
    horizon: int
    t0_ns: int
    dt_ns: int

    @property
    def n(self) -> int:
        """len(Y): beyond it the new chunk is free (LeRobot's "execution horizon")."""
        return int(self.prefix.shape[0])

    @property
    def frozen(self) -> np.ndarray:
        return self.prefix[: self.d]


def check_action_magnitudes(actions, what: str = "RTC prefix") -> None:
    """ValueError (naming ``what``) unless every value is finite and within +-MAX_ABS_ACTION: the bound every RTC
    prefix meets before a model computes with it (the adapters' contract, the server's wire) and every chunk meets
    before the loop adopts it."""
    a = np.asarray(actions, dtype=np.float64)
    bad = ~np.isfinite(a)
    if bad.any():
        raise ValueError(f"{what} contains NaN or inf ({int(bad.sum())} of {a.size} values)")
    huge = np.abs(a) > MAX_ABS_ACTION
    if huge.any():
        raise ValueError(f"{what} holds {int(huge.sum())} of {a.size} values beyond +-{MAX_ABS_ACTION:g} "
                         f"(MAX_ABS_ACTION, not a physical action), the largest {float(np.abs(a).max()):g}")


def make_request(remainder: np.ndarray, d_est: int, *, mode: str, schedule: str, horizon: int,
                 t0_ns: int = 0, dt_ns: int = 0) -> Optional[RtcRequest]:
    """Build the request from the previous chunk's remainder Y (already aligned to t0; offline callers
    without a clock leave t0_ns / dt_ns at 0)."""
    if mode == "off" or remainder is None or len(remainder) == 0:
        return None
    y = np.array(remainder[:horizon], dtype=np.float32)
    y.flags.writeable = False
    n = int(y.shape[0])
    return RtcRequest(mode=mode, schedule=schedule, prefix=y, d=min(max(0, int(d_est)), n), horizon=int(horizon),
                      t0_ns=int(t0_ns), dt_ns=int(dt_ns))


__all__ = ["RTC_MODES", "SCHEDULES", "MAX_ABS_ACTION", "DelayEstimator", "should_trigger", "RtcRequest",
           "check_action_magnitudes", "make_request"]
