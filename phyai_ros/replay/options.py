"""What a replay is asked to do (``ReplayOptions``): the mode and its pacing, the waits, the output bag.

Checked once at construction, so the player, the CLI and ``phyai_ros.testing`` share one set of rules."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

MODES = ("realtime", "stepped")


@dataclass
class ReplayOptions:
    mode: str = "realtime"          # 'realtime' | 'stepped'
    rate: float = 1.0               # realtime speed factor
    clock_hz: float = 200.0         # realtime: /clock rate between messages and grid instants
    preroll: float = 0.2            # replay-clock seconds before the first message
    tail: float = 1.0               # replay-clock seconds after the last message
    settle: float = 0.01            # stepped: wall seconds between publishing inputs and the tick
    step_timeout: float = 10.0      # stepped: wall seconds to wait for the node's report of a tick
    inference_timeout: float = 60.0 # stepped: wall seconds to wait for an in-flight chunk
    startup_timeout: float = 60.0   # wall seconds for the node to follow /clock
    race_window: Optional[float] = None  # accounting: publish->receive uncertainty (s); None: by mode
    out_storage: str = "mcap"
    record_inputs: bool = False     # also copy the played inputs into the output bag

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError("rate must be > 0")
        if self.out_storage not in ("mcap", "sqlite3"):
            raise ValueError("out_storage must be 'mcap' or 'sqlite3'")


__all__ = ["MODES", "ReplayOptions"]
