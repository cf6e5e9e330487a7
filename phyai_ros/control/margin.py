"""Latency decomposition and control-margin statistics.

Definitions (all instants on the stamp clock, int ns; reported durations in seconds):

* anchor sensor = the sensor whose stamp is the snapshot stamp (the oldest one used).
* ``L_observe``  = anchor receive time - anchor sensor stamp.
* ``L_transfer`` = snapshot taken - anchor receive time (time the data waited in the
  buffer for the RTC trigger; in-process hand-over to the worker is by reference, so no
  separate copy segment exists).
* ``L_queue``    = inference start (worker begins the policy call) - snapshot taken.
* ``L_inference``= policy return - inference start.
* ``L_actuate``  = chunk handed to the action timer - policy return (validation, prefix
  enforcement, stitching).
* Clocks: instants are on the stamp clock (ROS time; sim time in a replay), so budgets,
  deadlines and stamps agree with the action timer.  ``L_observe`` and ``L_transfer``
  start at a sensor stamp / receive time and are stamp-clock differences.  The compute
  segments ``L_queue``, ``L_inference``, ``L_actuate`` are measured on the monotonic clock
  (a sim clock moves in steps of its /clock period) and expressed in the stamp clock's
  time base: multiplied by the stamp clock's rate (``ClockRate``: 1 in real time, the
  replay rate under sim time, estimated over seconds of ticks), so a 5x replay shows a 5x
  latency and no segment is a multiple of the /clock period.
* ``cover_end`` = ``t0 + H*dt`` of the chunk being executed when the snapshot was taken:
  the first tick that chunk can no longer serve.
* ``B_ctrl = cover_end - anchor stamp``: the time the current chunk still covers, measured
  from the observation the new chunk is computed from.  Then with
  ``L_critical = sum of the five`` (= ready - anchor stamp in real time; within one /clock
  period of it under sim time) the margin ``M_ctrl = B_ctrl - (L_inference + L_noninf)
  = cover_end - ready``, so ``M_ctrl >= 0`` iff the new chunk is with the timer before the
  old one runs out, i.e. iff that chunk causes no deadline miss (ticks on the dt grid).
* Startup chunks (nothing executing at the trigger: B undefined) and cold-start
  inferences are reported but kept out of the statistics window, unless they expired.
* An *expired* chunk (every action already in the past on delivery, never executed) is a
  deadline miss and always a window sample; a startup chunk that expires has its own end
  ``t0 + H*dt`` as ``cover_end`` (it was of no use after that), so its ``M_ctrl < 0`` too.
  Vocabulary (deadline miss, expired, late, run-out, stale, missed slot): docs/design.md.

Statistics over a sliding window of the last ``window`` margins:

* ``p50/p95/p99`` are *guaranteed* margins: the margin met by 50/95/99 % of chunks, i.e.
  the 50th/5th/1st percentiles of M (the low tail is the dangerous one; with a fixed B
  this equals ``B - latency p95`` etc.).
* ``p_nonneg = k/n`` with ``k = #(M >= 0)``; ``p_nonneg_lower`` = one-sided Wilson score
  lower bound at ``confidence`` (closed form, behaves at k = n where Wald fails; no scipy).
* Status: ERROR if the last ``error_consecutive_misses`` chunks all missed, or (n >=
  ``min_samples``) ``p_nonneg < error_p_threshold``; else OK if n >= ``min_samples`` and
  ``p_nonneg_lower >= 1 - eps``; else WARN (target not demonstrated: too few samples or
  too many misses).  Since all-hits gives the bound ``n/(n+z^2)``, the window must hold at
  least ``required_samples(eps, confidence)`` chunks or OK is unreachable (checked in the
  loop config).

Control-time roofline, per chunk cycle (chunk k-1's reign, ended by adopting chunk k):
``L_env = ticks that emitted chunk k-1 actions * dt`` (time the environment ran on the
chunk), ``L_control = all ticks of the cycle * dt = L_env + exposed inference time``
(deadline-miss ticks, i.e. the robot waiting on inference), ``L_inference`` = chunk k's
inference segment (the inference overlapped with that cycle).  Reported over the window as
ratios of sums: ``X = sum L_env / sum L_inference``, ``Y = sum L_env / sum L_control``,
``Y_seq = X/(1+X)`` (fully sequential), ``Y_roof = min(X, 1)`` (perfect overlap): ``control.roofline``.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import NormalDist
from typing import Optional, Tuple

import numpy as np

from .roofline import roofline_x, y_roof, y_sequential

OK, WARN, ERROR = 0, 1, 2


@dataclass(frozen=True)
class ServerTiming:
    """What a remote policy's server reports for one call (its monotonic durations, ns): the time the request
    waited in its batch queue and the batch's inference.  The rest of the call is serialization + network."""

    queue_ns: int
    inference_ns: int


@dataclass(frozen=True)
class LatencyRecord:
    """Instants (int ns, stamp clock) of one chunk's critical path; durations in seconds."""

    stamp_ns: int
    recv_ns: int
    snapshot_ns: int
    ready_ns: int
    cover_end_ns: Optional[int]
    queue_ns: int = 0       # compute segments: monotonic, in the stamp clock's time base
    inference_ns: int = 0
    actuate_ns: int = 0
    remaining_at_trigger: int = 0
    inference_wall_ns: int = 0  # monotonic inference time, unscaled
    cold: bool = False
    wire_ns: int = 0        # remote policy: serialization + network of the call (both ways), inside queue_ns


    @classmethod
    def measured(cls, *, stamp_ns: int, recv_ns: int, snapshot_ns: int, ready_ns: int,
                 cover_end_ns: Optional[int], mono_ns: Tuple[int, int, int, int], rate: float = 1.0,
                 server: Optional["ServerTiming"] = None, **kw) -> "LatencyRecord":
        """From stamp-clock instants, the monotonic instants (snapshot, start, end, ready) and
        the stamp clock's rate relative to the monotonic clock.  ``server``: a remote policy's own
        timings, which split its call into inference (the server's) and queue: the server's batch queue plus the
        call's wire time (serialization + network, both ways). The wire goes to queue, not transfer, because it
        happens after the snapshot: observe + transfer stay "snapshot taken - anchor stamp", as on board."""
        m_snap, m_start, m_end, m_ready = mono_ns
        call = m_end - m_start
        s_queue = min(max(server.queue_ns, 0), call) if server is not None else 0
        s_inf = min(max(server.inference_ns, 0), call - s_queue) if server is not None else call
        wire = call - s_queue - s_inf
        return cls(stamp_ns=stamp_ns, recv_ns=recv_ns, snapshot_ns=snapshot_ns, ready_ns=ready_ns,
                   cover_end_ns=cover_end_ns, queue_ns=int(round((m_start - m_snap + s_queue + wire) * rate)),
                   inference_ns=int(round(s_inf * rate)), wire_ns=int(round(wire * rate)),
                   actuate_ns=int(round((m_ready - m_end) * rate)), inference_wall_ns=s_inf, **kw)

    @property
    def startup(self) -> bool:
        return self.cover_end_ns is None

    @property
    def observe(self) -> float:
        return (self.recv_ns - self.stamp_ns) / 1e9

    @property
    def transfer(self) -> float:
        return (self.snapshot_ns - self.recv_ns) / 1e9

    @property
    def queue(self) -> float:
        return self.queue_ns / 1e9

    @property
    def inference(self) -> float:
        return self.inference_ns / 1e9

    @property
    def actuate(self) -> float:
        return self.actuate_ns / 1e9

    @property
    def critical(self) -> float:
        return (self.snapshot_ns - self.stamp_ns + self.queue_ns + self.inference_ns + self.actuate_ns) / 1e9

    @property
    def noninf(self) -> float:
        return self.critical - self.inference

    @property
    def B_ctrl(self) -> float:
        return math.nan if self.cover_end_ns is None else (self.cover_end_ns - self.stamp_ns) / 1e9

    @property
    def margin(self) -> float:
        return math.nan if self.cover_end_ns is None else self.B_ctrl - self.critical


@dataclass(frozen=True)
class MarginReport:
    """One report per chunk offered to the timer (made on the tick that adopts it, or finds it
    expired): the one Python type for the node's ``phyai_ros/ControlMargin`` and what the replay
    tools read back; the fields up to ``roofline_y`` are the message's, by the same names
    (``messages.margin_to_msg`` / ``msg_to_margin`` copy them by name).

    Names of docs/design.md §3: ``budget`` = B_ctrl, ``latency_observe .. latency_actuate`` =
    L_observe .. L_actuate, ``margin`` = M_ctrl, ``margin_p50/p95/p99`` = the margins met by 50/95/99 %
    of the window (its 50th/5th/1st percentiles), ``window_size`` = n, ``p_nonnegative`` = P(M_ctrl >= 0)
    = k/n, ``p_nonnegative_lower`` = its one-sided Wilson lower bound at ``confidence``, ``target`` =
    1 - eps, ``roofline_x`` / ``roofline_y`` / ``roofline_y_seq`` / ``roofline_y_roof`` = X, Y, Y_seq,
    Y_roof (window ratios of sums), ``cycle_env`` / ``cycle_control`` = L_env, L_control of the cycle this
    chunk just ended.

    Times in seconds (float), ``stamp_ns`` int ns (tick time).  NaN where undefined (startup chunk,
    empty window).  ``budget .. margin`` are this chunk's; ``margin_p*``, ``p_nonnegative*``,
    ``window_size``, ``level`` are over the window.  ``expired``: the chunk was never executed.
    Not on the wire (defaults on a received report): ``roofline_y_seq``, ``roofline_y_roof``,
    ``cycle_env``, ``cycle_control``, ``consumed`` (actions of the chunk already in the past when
    adopted) and ``in_window`` (False for startup/cold chunks that did not expire; None if unknown)."""

    stamp_ns: int
    chunk_seq: int
    expired: bool
    budget: float
    latency_observe: float
    latency_transfer: float
    latency_queue: float
    latency_inference: float
    latency_actuate: float
    margin: float
    margin_p50: float
    margin_p95: float
    margin_p99: float
    window_size: int
    p_nonnegative: float
    p_nonnegative_lower: float
    confidence: float
    target: float
    level: int
    message: str
    roofline_x: float
    roofline_y: float
    roofline_y_seq: float = math.nan
    roofline_y_roof: float = math.nan
    cycle_env: float = math.nan
    cycle_control: float = math.nan
    consumed: int = 0
    in_window: Optional[bool] = None


def z_value(confidence: float) -> float:
    return NormalDist().inv_cdf(confidence)


def wilson_lower(k: int, n: int, confidence: float) -> float:
    """One-sided Wilson score lower bound on a binomial proportion (NaN for n = 0); never above k / n (at k = 0
    the bound is 0 exactly, which rounding would otherwise leave a hair above)."""
    if n <= 0:
        return math.nan
    z = z_value(confidence)
    p = k / n
    z2 = z * z
    centre = p + z2 / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return min(p, max(0.0, (centre - half) / (1 + z2 / n)))


def required_samples(eps: float, confidence: float) -> int:
    """Smallest n for which n hits out of n reach a Wilson lower bound >= 1 - eps."""
    z2 = z_value(confidence) ** 2
    return int(math.ceil(z2 * (1 - eps) / eps - 1e-9))


def bound_label(confidence: float) -> str:
    """How the lower bound is computed, for every text that shows it."""
    return f"{confidence:.0%} one-sided Wilson lower bound"


def margin_status(margins, *, eps: float, confidence: float, min_samples: int, error_p_threshold: float,
                  error_consecutive_misses: int) -> tuple:
    """(p_hat, lower, level, message) of a sequence of margin samples (oldest first), by the rules of the
    module doc: the node's status of its window, and the replay report's of a whole session, so the two
    cannot disagree."""
    m = np.asarray(margins, dtype=np.float64)
    n = len(m)
    k_miss = error_consecutive_misses
    if n == 0:
        return math.nan, math.nan, WARN, "no margin samples yet (only startup / cold-start chunks so far)"
    k = int(np.count_nonzero(m >= 0))
    p = k / n
    lo = wilson_lower(k, n, confidence)
    tgt = 1.0 - eps
    bound = f"P(M>=0) = {p:.3f}, lower {lo:.3f} ({bound_label(confidence)}) vs target {tgt:.3f}, n={n}"
    if k_miss > 0 and n >= k_miss and bool(np.all(m[-k_miss:] < 0)):
        return p, lo, ERROR, f"last {k_miss} chunks missed their deadline; {bound}"
    if n >= min_samples and p < error_p_threshold:
        return p, lo, ERROR, f"P(M>=0) below the error threshold {error_p_threshold:.3f}; {bound}"
    if n >= min_samples and lo >= tgt:
        return p, lo, OK, f"target demonstrated: {bound}"
    if n < min_samples:
        return p, lo, WARN, f"insufficient samples (n={n} < {min_samples}); {bound}"
    return p, lo, WARN, f"target not demonstrated: {bound}"


class MarginMonitor:
    def __init__(self, window: int = 200, eps: float = 0.05, confidence: float = 0.9,
                 min_samples: int = 20, error_p_threshold: float = 0.8, error_consecutive_misses: int = 3):
        self.window = int(window)
        self.eps = float(eps)
        self.confidence = float(confidence)
        self.min_samples = int(min_samples)
        self.error_p_threshold = float(error_p_threshold)
        self.error_consecutive_misses = int(error_consecutive_misses)
        self._margins: deque = deque(maxlen=self.window)
        self._cycles: deque = deque(maxlen=self.window)  # (L_env_ns, L_control_ns, L_inf_ns)
        self._last_cycle = (math.nan, math.nan)

    @property
    def target(self) -> float:
        return 1.0 - self.eps

    def add_cycle(self, env_ns: int, control_ns: int, inference_ns: int) -> None:
        self._cycles.append((int(env_ns), int(control_ns), int(inference_ns)))
        self._last_cycle = (env_ns / 1e9, control_ns / 1e9)

    def margins(self) -> np.ndarray:
        return np.array(self._margins, dtype=np.float64)

    def bound_label(self) -> str:
        """How the lower bound is computed, for every text that shows it."""
        return bound_label(self.confidence)

    def status(self) -> tuple:
        """(p_hat, lower, level, message) for the current window."""
        return margin_status(self.margins(), eps=self.eps, confidence=self.confidence, min_samples=self.min_samples,
                             error_p_threshold=self.error_p_threshold,
                             error_consecutive_misses=self.error_consecutive_misses)

    def add_chunk(self, rec: LatencyRecord, *, seq: int, consumed: int, now_ns: int,
                  expired: bool = False) -> MarginReport:
        """Add one chunk offered to the timer.  An expired chunk must carry a ``cover_end_ns``
        (see the module doc) and always counts."""
        if expired and rec.startup:
            raise ValueError("an expired chunk needs a cover_end (its deadline)")
        in_window = expired or (not rec.startup and not rec.cold)
        if in_window:
            self._margins.append(rec.margin)
        m = self.margins()
        if len(m):
            p50, p95, p99 = (float(v) for v in np.percentile(m, [50.0, 5.0, 1.0]))
        else:
            p50 = p95 = p99 = math.nan
        p, lo, level, msg = self.status()
        if self._cycles:
            env, ctl, inf = (sum(c[i] for c in self._cycles) for i in range(3))
            X = roofline_x(env, inf)
            Y = env / ctl if ctl > 0 else math.nan
        else:
            X = Y = math.nan
        return MarginReport(
            stamp_ns=int(now_ns), chunk_seq=int(seq), expired=bool(expired), budget=rec.B_ctrl,
            latency_observe=rec.observe, latency_transfer=rec.transfer, latency_queue=rec.queue,
            latency_inference=rec.inference, latency_actuate=rec.actuate, margin=rec.margin,
            margin_p50=p50, margin_p95=p95, margin_p99=p99, window_size=len(m), p_nonnegative=p,
            p_nonnegative_lower=lo, confidence=self.confidence, target=self.target, level=level, message=msg,
            roofline_x=X, roofline_y=Y,
            roofline_y_seq=y_sequential(X), roofline_y_roof=y_roof(X),
            cycle_env=self._last_cycle[0], cycle_control=self._last_cycle[1], consumed=int(consumed),
            in_window=in_window)


__all__ = ["OK", "WARN", "ERROR", "LatencyRecord", "MarginReport", "MarginMonitor", "margin_status", "bound_label",
           "wilson_lower", "required_samples", "z_value"]
