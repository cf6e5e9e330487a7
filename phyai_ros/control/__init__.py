"""ROS-free control loop: observation snapshots, RTC chunk scheduling, action timer,
deadline-miss policy and control-margin statistics.  Imports numpy only (never rclpy or
torch); the policy is an injected callable, the clock an injected object."""
from .chunk import ActionChunk, slot_index
from .clock import CallableClock, Clock, ClockRate, FakeClock, MonotonicClock, ns_to_s, s_to_ns, stamp_to_ns
from .loop import COUNTERS, ControlConfig, ControlLoop, Policy
from .margin import ERROR, OK, WARN, LatencyRecord, MarginMonitor, MarginReport, required_samples, wilson_lower
from .observation import (BadImageError, BadStateError, FutureStampError, JointStateMapper, MissingJointError,
                          ObservationBuffer, ObservationError, ObservationSnapshot, OutOfOrderStampError,
                          StaleObservation, UnknownCameraError)
from .rtc import RTC_MODES, DelayEstimator, RtcRequest, make_request, should_trigger
from .timer import ActionTimer, Emission
from .worker import InferenceWorker, ManualExecutor

__all__ = [
    "ActionChunk", "slot_index", "CallableClock", "Clock", "ClockRate", "FakeClock", "MonotonicClock", "ns_to_s", "s_to_ns",
    "stamp_to_ns", "COUNTERS", "ControlConfig", "ControlLoop", "Policy", "ERROR", "OK", "WARN", "LatencyRecord",
    "MarginMonitor", "MarginReport", "required_samples", "wilson_lower", "BadImageError", "BadStateError",
    "FutureStampError", "JointStateMapper", "MissingJointError", "ObservationBuffer", "ObservationError",
    "ObservationSnapshot", "OutOfOrderStampError", "StaleObservation", "UnknownCameraError", "DelayEstimator",
    "RTC_MODES", "RtcRequest", "make_request", "should_trigger", "ActionTimer", "Emission", "InferenceWorker",
    "ManualExecutor",
]
