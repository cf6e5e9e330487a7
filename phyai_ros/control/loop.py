"""The ROS-free control loop: intake -> RTC-scheduled inference on a worker -> action timer.

The node calls ``on_image``/``on_state``/``on_joint_state``/``on_instruction`` from its
subscriptions and ``tick()`` from a timer at 1/dt.  ``tick`` never waits for inference: it
takes one short lock (microseconds of bookkeeping), adopts a chunk the worker may have
left, emits an action, and when the RTC trigger fires takes an observation snapshot and
submits a job without blocking.  The worker runs the policy outside any lock and only
swaps a pointer to hand the chunk over.  Bad input, stale data, policy exceptions, bad
chunks, clock jumps and callback exceptions are counted and reported, never raised.

Threads: ``on_chunk`` and inference-related events run on the worker thread (the thread
calling ``ManualExecutor.run_pending`` in tests); ``on_margin`` and tick-related events run
on the thread calling ``tick``; input-related events on the thread calling ``on_*``.
"""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .chunk import ActionChunk
from .clock import Clock, ClockRate, MonotonicClock, s_to_ns
from .margin import ERROR, WARN, LatencyRecord, MarginMonitor, MarginReport, required_samples
from .observation import (MAX_IMAGE_PIXELS, MAX_INSTRUCTION_CHARS, FrameLimits, JointStateMapper,
                          ObservationBuffer, ObservationError, ObservationSnapshot, StaleObservation)
from .rtc import (RTC_MODES, SCHEDULES, DelayEstimator, RtcRequest, check_action_magnitudes, make_request,
                  should_trigger)
from .timer import DEADLINE_POLICIES, ActionTimer, DeliveryStats, Emission
from .worker import Executor, InferenceWorker

Policy = Callable[[ObservationSnapshot, Optional[RtcRequest]], np.ndarray]

# What the compute segments (L_queue, L_inference, L_actuate) are measured on (docs/design.md §2): the monotonic
# clock, converted to stamp time at the measured clock rate (the robot, real-time replays), or the stamp clock
# itself (a stepped replay, which holds /clock while the node computes: they are zero in simulated time, and the
# run does not depend on this machine's speed).
COMPUTE_CLOCKS = ("monotonic", "stamp")

# The words are defined once, in docs/design.md ("Vocabulary"); counters, /diagnostics,
# ControlMargin and the replay report use them with exactly that meaning.
COUNTERS = (
    "ticks", "ticks_without_chunk", "duplicate_ticks", "missed_slots", "deadline_misses", "run_outs",
    "deadline_policy_ticks", "inferences_started", "chunks",
    "stale_snapshots", "inference_errors", "bad_chunks", "late_chunks", "expired_chunks",
    "discarded_after_reset", "clock_jumps", "out_of_order", "future_stamp", "bad_image", "bad_state",
    "missing_joint", "unknown_camera", "bad_input", "callback_errors", "worker_busy", "worker_crashes",
    "truncated_instructions",
)


@dataclass
class ControlConfig:
    """Times in seconds (converted to int ns inside).  See module docs of rtc/timer/margin."""

    dt: float
    horizon: int
    action_dim: int
    cameras: Sequence[str] = ()            # required camera slots
    optional_cameras: Sequence[str] = ()   # maskable slots (missing/stale -> image None, mask False)
    state_dim: Optional[int] = None        # None: no state (or len(state_joint_names))
    state_joint_names: Optional[Sequence[str]] = None  # policy state order for on_joint_state
    image_hw: Optional[Sequence[int]] = None  # expected (H, W) of decoded frames; None: any
    image_input_size: Optional[int] = None  # the policy's square image input: frames too elongated for it are bad
    max_image_pixels: int = MAX_IMAGE_PIXELS  # larger frames are bad (observation.py: the intake limits)
    max_instruction_chars: int = MAX_INSTRUCTION_CHARS  # a longer instruction is refused (bad_input)
    max_observation_age: float = 0.2       # camera (and, by default, state) older than this -> stale
    max_state_age: Optional[float] = None  # None: max_observation_age
    default_instruction: str = ""
    require_instruction: bool = False      # True: no inference until a non-empty instruction is set
    rtc_mode: str = "guided"               # one of rtc.RTC_MODES (the model must support it)
    rtc_schedule: str = "exp"              # exp | linear (guidance ramp, computed by the adapter)
    rtc_overlap: int = 5                   # trigger when remaining <= d_est + rtc_overlap (design.md §3)
    delay_quantile: float = 0.95
    delay_window: int = 50
    initial_delay_ticks: int = 3           # d_est until a warm delay sample exists
    cold_start_inferences: int = 1         # first N inferences: no delay sample, no margin sample
    enforce_frozen_prefix: bool = True     # overwrite the returned chunk's first d actions with Y[:d]
    deadline_policy: str = "hold_last"     # hold_last | stop | extrapolate_tail
    extrapolate_max_ticks: int = 5
    clock_jump_tolerance: float = 0.1      # now < last now - this => clock jump back (bag loop)
    future_stamp_tolerance: float = 0.5    # reject stamps further than this ahead of now
    margin_window: int = 200
    eps: float = 0.05                      # target P(M_ctrl >= 0) >= 1 - eps
    confidence: float = 0.9                # one-sided Wilson lower bound level
    min_samples: int = 20
    error_p_threshold: float = 0.8
    error_consecutive_misses: int = 3
    history_size: int = 1000
    model_id: str = ""
    compute_clock: str = "monotonic"       # one of COMPUTE_CLOCKS

    def __post_init__(self):
        if self.state_joint_names is not None:
            self.state_joint_names = tuple(self.state_joint_names)
            if self.state_dim is None:
                self.state_dim = len(self.state_joint_names)
            elif self.state_dim != len(self.state_joint_names):
                raise ValueError("state_dim != len(state_joint_names)")
        self.cameras = tuple(self.cameras)
        self.optional_cameras = tuple(self.optional_cameras)
        checks = [
            (self.dt > 0, "dt must be > 0"),
            (self.horizon >= 1, "horizon must be >= 1"),
            (self.action_dim >= 1, "action_dim must be >= 1"),
            (self.rtc_mode in RTC_MODES, f"rtc_mode must be one of {RTC_MODES}"),
            (self.rtc_schedule in SCHEDULES, f"rtc_schedule must be one of {SCHEDULES}"),
            (self.deadline_policy in DEADLINE_POLICIES, f"deadline_policy must be one of {DEADLINE_POLICIES}"),
            (self.compute_clock in COMPUTE_CLOCKS, f"compute_clock must be one of {COMPUTE_CLOCKS}"),
            (0 <= self.rtc_overlap < self.horizon, "rtc_overlap must be in [0, horizon)"),
            (0.0 < self.delay_quantile <= 1.0, "delay_quantile must be in (0, 1]"),
            (self.initial_delay_ticks >= 0 and self.extrapolate_max_ticks >= 0 and self.cold_start_inferences >= 0,
             "initial_delay_ticks, extrapolate_max_ticks, cold_start_inferences must be >= 0"),
            (self.max_observation_age > 0, "max_observation_age must be > 0"),
            (0.0 < self.eps < 1.0, "eps must be in (0, 1)"),
            (0.5 <= self.confidence < 1.0, "confidence must be in [0.5, 1)"),
            (self.margin_window >= 1 and self.delay_window >= 1, "windows must be >= 1"),
            (self.cameras or self.optional_cameras or self.state_dim, "no observation source configured"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)
        need = max(required_samples(self.eps, self.confidence), self.min_samples)
        if self.margin_window < need:
            raise ValueError(f"margin_window={self.margin_window} can never demonstrate P(M>=0) >= {1 - self.eps} "
                             f"at confidence {self.confidence}: needs >= {need} samples")

    @property
    def dt_ns(self) -> int:
        return s_to_ns(self.dt)


class _InferenceJob:
    """One inference: snapshot + RTC request in, chunk out.  Instants on the stamp clock; the compute instants
    (snapshot, start, end) on the loop's compute clock."""

    def __init__(self, loop: "ControlLoop", snapshot: ObservationSnapshot, rtc: Optional[RtcRequest], t0_ns: int,
                 cover_end_ns: Optional[int], remaining: int, epoch: int, cold: bool):
        self.loop, self.snapshot, self.rtc, self.t0_ns = loop, snapshot, rtc, t0_ns
        self.cover_end_ns, self.remaining, self.epoch, self.cold = cover_end_ns, remaining, epoch, cold
        self.result = self.error = self.server = None
        self.snapshot_mono_ns = loop.compute_now()
        self.start_mono_ns = self.end_mono_ns = 0

    def infer(self) -> None:
        self.start_mono_ns = self.loop.compute_now()
        try:
            self.result = self.loop.policy(self.snapshot, self.rtc)
            self.server = getattr(self.result, "server_timing", None)   # a remote policy's split (ServerTiming)
        except Exception as e:  # noqa: BLE001 - a policy failure must not kill the loop
            self.error = e
        self.end_mono_ns = self.loop.compute_now()

    def deliver(self) -> None:
        try:
            self.loop._deliver(self)
        finally:
            self.loop._job_finished()

    def run(self) -> None:
        self.infer()
        self.deliver()


class ControlLoop:
    def __init__(self, config: ControlConfig, policy: Policy, clock: Optional[Clock] = None,
                 executor: Optional[Executor] = None,
                 on_chunk: Optional[Callable[[ActionChunk], None]] = None,
                 on_margin: Optional[Callable[[MarginReport], None]] = None,
                 on_event: Optional[Callable[[str, str], None]] = None):
        self.config = cfg = config
        self.policy = policy
        self.clock = clock if clock is not None else MonotonicClock()
        self.on_chunk, self.on_margin, self.on_event = on_chunk, on_margin, on_event
        # The compute clock (``ControlConfig.compute_clock``), resolved once: ``compute_now()`` is now on it, int ns;
        # on the stamp clock the compute segments need no rate conversion.
        self._compute_on_stamp = cfg.compute_clock == "stamp"
        self.compute_now: Callable[[], int] = self.clock.now if self._compute_on_stamp else self.clock.monotonic
        self.dt_ns = cfg.dt_ns
        self._lock = threading.RLock()
        self._counters: Dict[str, int] = {k: 0 for k in COUNTERS}
        self.buffer = ObservationBuffer(
            cfg.cameras, cfg.optional_cameras, state_dim=cfg.state_dim, max_age_ns=s_to_ns(cfg.max_observation_age),
            frame=FrameLimits(max_pixels=cfg.max_image_pixels, input_size=cfg.image_input_size,
                              expected_hw=tuple(cfg.image_hw) if cfg.image_hw is not None else None),
            future_tolerance_ns=s_to_ns(cfg.future_stamp_tolerance), default_instruction=cfg.default_instruction,
            max_state_age_ns=None if cfg.max_state_age is None else s_to_ns(cfg.max_state_age),
            require_instruction=cfg.require_instruction, max_instruction_chars=cfg.max_instruction_chars)
        self.joint_mapper = JointStateMapper(cfg.state_joint_names) if cfg.state_joint_names else None
        self.timer = ActionTimer(self.dt_ns, cfg.deadline_policy, cfg.extrapolate_max_ticks, cfg.history_size)
        self.delay = DelayEstimator(cfg.delay_quantile, cfg.delay_window, cfg.initial_delay_ticks,
                                    max_ticks=cfg.horizon)
        self.margin = MarginMonitor(cfg.margin_window, cfg.eps, cfg.confidence, cfg.min_samples,
                                    cfg.error_p_threshold, cfg.error_consecutive_misses)
        self._owns_executor = executor is None
        self.executor = executor if executor is not None else InferenceWorker(on_crash=self._worker_crashed)
        self._pending: Optional[ActionChunk] = None
        self._in_flight = False
        self._epoch = 0
        self._next_seq = 0
        self._last_now: Optional[int] = None
        self.last_report: Optional[MarginReport] = None
        self.clock_rate = ClockRate()
        self.delivery = DeliveryStats(cfg.margin_window * cfg.horizon)  # command delivery delay, recent slots
        self._started_ns: Optional[int] = None  # first tick: control starts when the action timer runs
        self._untimed_since: Optional[int] = None   # monotonic ns a health check first found no tick yet
        self._last_tick_mono: Optional[int] = None   # monotonic ns of the last tick: a stalled stamp clock shows here
        self._last_adopted_ns: Optional[int] = None  # stamp time of the last chunk adoption
        self._last_plan_ns: Optional[int] = None     # stamp time of the last command taken from a chunk

    # ----------------------------------------------------------------- public API
    def counters(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._counters)

    @property
    def history(self) -> List[Emission]:
        with self._lock:
            return list(self.timer.history)

    @property
    def inference_in_flight(self) -> bool:
        return self._in_flight

    def delay_estimate(self) -> int:
        with self._lock:
            return self.delay.estimate()

    def on_image(self, slot: str, image, stamp_ns: int) -> bool:
        return self._intake(lambda now: self.buffer.put_image(slot, image, int(stamp_ns), now))

    def on_state(self, state, stamp_ns: int) -> bool:
        """State vector already in policy order."""
        return self._intake(lambda now: self.buffer.put_state(state, int(stamp_ns), now))

    def on_joint_state(self, names: Sequence[str], positions: Sequence[float], stamp_ns: int) -> bool:
        """sensor_msgs/JointState fields; mapped with ``config.state_joint_names``."""
        def put(now):
            if self.joint_mapper is None:
                raise ObservationError("state_joint_names not configured")
            self.buffer.put_state(self.joint_mapper.map(names, positions), int(stamp_ns), now)
        return self._intake(put)

    def on_instruction(self, text: str) -> bool:
        return self._intake(lambda now: self.buffer.set_instruction(text))

    def report_bad_input(self, kind: str, detail: str = "") -> None:
        """For failures the node detects itself (e.g. image decode): counted under ``kind``
        if it is a known counter, else under ``bad_input``."""
        cbs: list = []
        with self._lock:
            self._count(kind if kind in self._counters else "bad_input", cbs, kind, detail)
        self._fire(cbs)

    def tick(self) -> Optional[Emission]:
        """Call at 1/dt.  Returns the emission (``.action`` float32 [D]) or None when there
        is nothing to publish (no chunk yet, or ``stop`` on a deadline miss)."""
        now = self.clock.now()
        cbs: list = []
        with self._lock:
            self._last_tick_mono = self.clock.monotonic()
            self._counters["ticks"] += 1
            self._check_clock(now, cbs)
            self.clock_rate.add(now, self.clock.monotonic())
            if self._started_ns is None:
                self._started_ns = now
            if self._pending is not None:
                chunk, self._pending = self._pending, None
                self._adopt(chunk, now, cbs)
            was_run_out = self.timer.in_miss
            em = self.timer.emit(now)
            if em is None:
                self._counters["ticks_without_chunk"] += 1
            elif em.kind == "duplicate":
                self._counters["duplicate_ticks"] += 1
            else:
                self.delivery.add(em.t_ns - em.slot_ns)
                if em.kind == "chunk":
                    self._last_plan_ns = now
                if em.skipped:
                    self._counters["missed_slots"] += em.skipped
                    cbs.append((self.on_event, ("missed_slot", f"{em.skipped} command slot(s) skipped: the action "
                                                               f"timer ran {(em.t_ns - em.slot_ns) / 1e6:.1f} ms "
                                                               f"after slot {em.index}")))
                if em.is_miss:
                    self._counters["deadline_policy_ticks"] += 1
                    if not was_run_out:
                        self._count("run_outs", cbs, "run_out", f"chunk {em.chunk_seq} ran out of actions; "
                                                                f"deadline policy {em.kind}")
            if em is None or em.kind != "duplicate":
                self._maybe_trigger(now, cbs)
        self._fire(cbs)
        return em if em is not None and em.action is not None else None

    def pause(self) -> Optional[np.ndarray]:
        """Stop acting (the node is deactivated): the chunk timeline is dropped (a chunk pending or in flight is
        discarded on delivery), observations and statistics are kept, and control starts anew at the next tick.
        Returns the action the deadline policy leaves the robot at: the last one commanded (hold_last and
        extrapolate_tail: extrapolating without new chunks is not safe), or None (stop: command nothing)."""
        with self._lock:
            last = self.timer.last
            held = None if self.config.deadline_policy == "stop" or last is None or last.action is None \
                else np.array(last.action, dtype=np.float32)
            self._drop_timeline(None)
            return held

    def close(self, timeout: float = 1.0) -> None:
        if self._owns_executor:
            self.executor.close(timeout)

    # ----------------------------------------------------------------- internals
    def _count(self, key: str, cbs: list, event: Optional[str] = None, detail: str = "") -> None:
        self._counters[key] = self._counters.get(key, 0) + 1
        if event is not None:
            cbs.append((self.on_event, (event, detail)))

    def _fire(self, cbs: list) -> None:
        for fn, args in cbs:
            if fn is None:
                continue
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - a bad callback must not kill the loop
                with self._lock:
                    self._counters["callback_errors"] += 1

    def _intake(self, put) -> bool:
        now = self.clock.now()
        cbs: list = []
        ok = False
        with self._lock:
            self._check_clock(now, cbs)
            try:
                put(now)
                ok = True
            except ObservationError as e:
                self._count(e.kind, cbs, e.kind, str(e))
            except Exception as e:  # noqa: BLE001 - malformed input of any sort
                self._count("bad_input", cbs, "bad_input", f"{type(e).__name__}: {e}")
        self._fire(cbs)
        return ok

    def _check_clock(self, now: int, cbs: list) -> None:
        last = self._last_now
        if last is not None and now < last - s_to_ns(self.config.clock_jump_tolerance):
            self.buffer.reset()
            self._drop_timeline(now)
            self._count("clock_jumps", cbs, "clock_jump", f"stamp clock jumped back {(last - now) / 1e9:.3f} s; "
                        "observations and chunk timeline reset")
            self._last_now = now
        elif last is None or now > last:
            self._last_now = now

    def _drop_timeline(self, started_ns: Optional[int]) -> None:
        """Drop the chunk timeline (the caller holds the lock): the timer's chunks, a pending one and, by the new
        epoch, one in flight (discarded on delivery); control counts as started at ``started_ns`` (None: at the
        next tick)."""
        self.timer.reset()
        self._pending = None
        self._epoch += 1
        self._started_ns, self._last_adopted_ns, self._last_plan_ns = started_ns, None, None
        self.clock_rate.reset()

    def _maybe_trigger(self, now: int, cbs: list) -> None:
        if self._in_flight or self._pending is not None:
            return
        cfg = self.config
        timer = self.timer
        cur = timer.current
        d_est = self.delay.estimate()
        remaining = timer.remaining()
        if cur is not None and not should_trigger(remaining, d_est, cfg.rtc_overlap):
            return
        snap = self.buffer.snapshot(now)
        if isinstance(snap, StaleObservation):
            self._count("stale_snapshots", cbs, "stale_observation", str(snap))
            return
        rtc = None
        if cur is not None:
            nxt = timer.next_index(now)
            t0 = cur.time_of(nxt)
            if cfg.rtc_mode != "off" and nxt < cur.horizon:
                rtc = make_request(cur.actions[max(nxt, 0):], d_est, mode=cfg.rtc_mode, schedule=cfg.rtc_schedule,
                                   horizon=cfg.horizon, t0_ns=t0, dt_ns=self.dt_ns)
        else:
            t0 = timer.next_slot_ns(now)
        cold = self._counters["inferences_started"] < cfg.cold_start_inferences
        job = _InferenceJob(self, snap, rtc, t0, cur.end_ns if cur is not None else None, remaining,
                            self._epoch, cold)
        self._in_flight = True
        if self.executor.submit(job):
            self._counters["inferences_started"] += 1
        else:
            self._in_flight = False
            self._count("worker_busy", cbs, "worker_busy", "executor refused the job")

    def _deliver(self, job: _InferenceJob) -> None:
        cfg = self.config
        cbs: list = []
        chunk = None
        if job.error is not None:
            with self._lock:
                self._count("inference_errors", cbs, "inference_error",
                            f"{type(job.error).__name__}: {job.error}")
            self._fire(cbs)
            return
        try:
            actions = np.array(job.result, dtype=np.float32)  # owned copy
            if actions.shape != (cfg.horizon, cfg.action_dim):
                raise ValueError(f"chunk shape {list(actions.shape)} != [{cfg.horizon}, {cfg.action_dim}]")
            check_action_magnitudes(actions, "chunk")   # non-finite, or beyond MAX_ABS_ACTION: never commanded
        except Exception as e:  # noqa: BLE001
            with self._lock:
                self._count("bad_chunks", cbs, "bad_chunk", f"{type(e).__name__}: {e}")
            self._fire(cbs)
            return
        rtc = job.rtc
        d = rtc.d if rtc is not None else 0
        prefix_error = None
        if d > 0:
            prefix_error = float(np.max(np.abs(actions[:d] - rtc.prefix[:d])))
            if cfg.enforce_frozen_prefix:
                actions[:d] = rtc.prefix[:d]
        actions.flags.writeable = False
        with self._lock:
            if job.epoch != self._epoch:
                self._count("discarded_after_reset", cbs, "discarded_after_reset",
                            "chunk computed before a clock jump was dropped")
            else:
                snap = job.snapshot
                rec = LatencyRecord.measured(
                    stamp_ns=snap.stamp_ns, recv_ns=snap.anchor_recv_ns, snapshot_ns=snap.taken_ns,
                    ready_ns=self.clock.now(), cover_end_ns=job.cover_end_ns,
                    mono_ns=(job.snapshot_mono_ns, job.start_mono_ns, job.end_mono_ns, self.compute_now()),
                    rate=1.0 if self._compute_on_stamp else self.clock_rate.rate(), server=job.server,
                    remaining_at_trigger=job.remaining,
                    cold=job.cold)
                chunk = ActionChunk(
                    seq=self._next_seq, t0_ns=job.t0_ns, dt_ns=self.dt_ns, actions=actions, d=d,
                    n_prefix=rtc.n if rtc is not None else 0, rtc_mode=rtc.mode if rtc is not None else "off",
                    observation_stamp_ns=snap.stamp_ns, latency=rec, model_id=cfg.model_id,
                    prefix_error=prefix_error, epoch=job.epoch)
                self._next_seq += 1
                self._pending = chunk
                self._counters["chunks"] += 1
                cbs.append((self.on_chunk, (chunk,)))
        self._fire(cbs)

    def _job_finished(self) -> None:
        with self._lock:
            self._in_flight = False

    def _worker_crashed(self, e: BaseException) -> None:
        cbs: list = []
        with self._lock:
            self._in_flight = False
            self._count("worker_crashes", cbs, "worker_crash", f"{type(e).__name__}: {e}")
        self._fire(cbs)

    def _adopt(self, chunk: ActionChunk, now: int, cbs: list) -> None:
        ad = self.timer.adopt(chunk, now)
        consumed = min(ad.first_index, chunk.horizon)
        rec = chunk.latency
        if ad.accepted:
            self._last_adopted_ns = now
            self.delay.add(consumed, cold=rec.cold)
            if chunk.n_prefix > 0 and consumed > chunk.d:
                self._count("late_chunks", cbs, "late_chunk",
                            f"chunk {chunk.seq}: {consumed} actions consumed > frozen prefix {chunk.d}")
        else:
            # Never executed: its deadline was at the latest its own last action.
            last_action_ns = chunk.time_of(chunk.horizon - 1)
            if rec.startup or rec.cover_end_ns > last_action_ns:
                rec = dataclasses.replace(rec, cover_end_ns=last_action_ns)
            self._count("expired_chunks", cbs, "expired_chunk",
                        f"chunk {chunk.seq} arrived {(rec.ready_ns - rec.cover_end_ns) / 1e9:.3f} s after its "
                        f"deadline, every action already in the past; not executed")
        if ad.cycle_control_ns is not None:
            self.margin.add_cycle(ad.cycle_env_ns, ad.cycle_control_ns, rec.inference_ns)
        report = self.margin.add_chunk(rec, seq=chunk.seq, consumed=consumed, now_ns=now, expired=not ad.accepted)
        if report.in_window and report.margin < 0:
            self._count("deadline_misses", cbs, "deadline_miss" if ad.accepted else None,
                        f"chunk {chunk.seq}: M_ctrl = {report.margin * 1e3:.1f} ms")
        self.last_report = report
        cbs.append((self.on_margin, (report,)))

    def timer_stalled(self) -> bool:
        """Has the action timer stopped running (``health`` says ERROR for it)? What a watchdog on the monotonic
        clock asks: when the stamp clock stands still, every timer on it stops, the diagnostics' included."""
        with self._lock:
            horizon_ns = self.config.horizon * self.dt_ns
            if self._started_ns is None:   # counted from the first check that saw no tick, as health() counts
                mono = self.clock.monotonic()
                if self._untimed_since is None:
                    self._untimed_since = mono
                return mono - self._untimed_since > horizon_ns
            return self._stalled_ns(horizon_ns) is not None

    def _stalled_ns(self, horizon_ns: int) -> Optional[int]:
        """Monotonic ns since the last tick when longer than the horizon in wall time (the horizon divided by the
        clock rate, never less than the horizon: a replay at rate r ticks every dt/r), with no inference in flight
        (a stepped replay holds /clock while the node infers); else None. The caller holds the lock."""
        if self._last_tick_mono is None or self._in_flight:
            return None
        silent = self.clock.monotonic() - self._last_tick_mono
        rate = self.clock_rate.rate()
        limit = horizon_ns / rate if 0 < rate < 1 else horizon_ns
        return silent if silent > limit else None

    def health(self) -> Tuple[int, str]:
        """(level, message) of the control margin as a watchdog sees it now: the last
        report's status, overridden by ERROR when no chunk has been adopted for longer than
        the horizon H*dt (from the first tick of the action timer on), whatever the reason,
        which the message gives.  Never 'no data yet': silence is the worst case."""
        now = self.clock.now()
        with self._lock:
            report = self.last_report
            horizon_ns = self.config.horizon * self.dt_ns
            if self._started_ns is None:
                # No tick yet: counted on the monotonic clock from the first check that saw it, since stamp time may
                # not advance at all (use_sim_time with nothing on /clock).
                mono = self.clock.monotonic()
                if self._untimed_since is None:
                    self._untimed_since = mono
                waited_ns = mono - self._untimed_since
                if waited_ns > horizon_ns:
                    return ERROR, (f"the action timer has not run for {waited_ns / 1e9:.2f} s (> horizon "
                                   f"{horizon_ns / 1e9:.2f} s): no clock (under use_sim_time, is /clock "
                                   "published?) or a stalled executor; nothing is commanded")
                return WARN, f"the action timer has not run yet ({waited_ns / 1e9:.2f} s of {horizon_ns / 1e9:.2f} s)"
            self._untimed_since = None
            stalled = self._stalled_ns(horizon_ns)
            if stalled is not None:
                return ERROR, (f"the action timer has not run for {stalled / 1e9:.2f} s of monotonic time (> horizon "
                               f"{horizon_ns / 1e9:.2f} s): the stamp clock stands still (under use_sim_time, is "
                               "/clock still published?) or the executor stalled; nothing is commanded")
            since = self._last_adopted_ns if self._last_adopted_ns is not None else self._started_ns
            silent_ns = now - since
            if silent_ns > horizon_ns:
                what = ("no chunk adopted" if self._last_adopted_ns is not None else "no chunk adopted since start")
                plan = ("never" if self._last_plan_ns is None else f"{(now - self._last_plan_ns) / 1e9:.2f} s ago")
                snap = self.buffer.snapshot(now)
                why = (f"inputs not usable ({snap})" if isinstance(snap, StaleObservation)
                       else "inputs fresh: inference is not delivering in time")
                return ERROR, (f"{what} for {silent_ns / 1e9:.2f} s (> horizon {horizon_ns / 1e9:.2f} s); "
                               f"last command from a chunk {plan}; {why}; "
                               f"deadline misses {self._counters['deadline_misses']}, "
                               f"expired chunks {self._counters['expired_chunks']}, "
                               f"missed slots {self._counters['missed_slots']} (executor stalls)")
            if report is None:
                return WARN, f"waiting for the first chunk ({silent_ns / 1e9:.2f} s of {horizon_ns / 1e9:.2f} s)"
            return report.level, report.message


__all__ = ["ControlConfig", "ControlLoop", "Policy", "COUNTERS", "COMPUTE_CLOCKS"]
